// ShardedClient: one tqkv client over many servers. Each request goes to
// the shard that owns its routing key under weighted rendezvous hashing
// (client/cpp/rendezvous.h); batched requests are split by shard, sent in
// parallel and merged back in request order.
//
// Routing key. A block's routing key is the first block hash of its prefix
// chain, so a chain, every prefix of it and the sequences built on it live
// on one shard: Lookup, GetBlocks, CreateSequence, Append and Attend of one
// chain are single-shard calls, and a Lookup's leading-hit count means what
// it means on one server. The price: a hot prefix (a system prompt every
// request shares) is served by one shard, and so is every chain that
// extends it. Where the request alone does not show a block's chain, the
// caller passes routing keys (see each method); a block routed under a
// different key than it was put under reads as a miss, never as other bytes.
//
// Shards that are down. A call that fails on a shard with UNAVAILABLE or
// DEADLINE_EXCEEDED (after the per-shard client's retries) marks it down
// for Options::down_interval: calls meanwhile do not wait for it. Lookup
// answers a down shard's chains as misses (0 hits); a call that asked for
// blocks or sequences there fails with UNAVAILABLE naming the shard. Every
// error a shard returns keeps its code and reads "shard HOST:PORT: ...".
//
// Membership. A fixed list (Options::servers, SetServers) or a DNS name
// (Options::dns; a Kubernetes headless Service) resolved with getaddrinfo
// at Connect and again every Options::resolve_interval, by the first call
// after it is due. A shard's identity is its address: use stable names
// (StatefulSet pods: tqkv-0.tqkv-headless:50051) where pod IPs change on
// restart. Adding or removing one of N equal shards moves about 1/N of the
// chains; moved chains read as misses until put again.
//
// Models are registered on every shard (the same request, hence the same
// model id and fingerprint); a shard that was down or joined later gets the
// registration before its first call for that model.
//
// Thread safety: a ShardedClient may be shared by threads.
#ifndef TQKV_CLIENT_CPP_SHARDED_CLIENT_H_
#define TQKV_CLIENT_CPP_SHARDED_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/rendezvous.h"
#include "client/cpp/shard_set.h"
#include "proto/tqkv/v1/tqkv.grpc.pb.h"

namespace tqkv::client {

struct ShardedClientOptions {
  // The shards. Exactly one of `servers` and `dns` is set.
  std::vector<ShardSpec> servers;
  // HOST:PORT resolved to one shard per address (ResolveShards). Default: "".
  std::string dns;
  // How often `dns` is resolved again. Default: 30 s.
  absl::Duration resolve_interval = absl::Seconds(30);
  // Every shard's client options (deadline, retries, token, TLS); `target`
  // is ignored. Default: ClientOptions's defaults.
  ClientOptions shard;
  // How long a shard that failed with UNAVAILABLE or DEADLINE_EXCEEDED is
  // skipped. Default: 2 s.
  absl::Duration down_interval = absl::Seconds(2);
  // The clock for down windows and re-resolution. Default: absl::Now.
  std::function<absl::Time()> clock;
};

// A fan-out call's result on one shard.
template <typename T>
struct ShardResult {
  std::string shard;
  absl::StatusOr<T> result;
};

class ShardedClient {
 public:
  // INVALID_ARGUMENT unless exactly one of servers/dns is set, for an empty
  // or duplicate server list, or a weight <= 0; ResolveShards' errors for
  // `dns`. Connections are made lazily.
  static absl::StatusOr<std::unique_ptr<ShardedClient>> Connect(ShardedClientOptions options);

  // Replaces the members (kept shards keep their connections).
  // INVALID_ARGUMENT as Connect. With `dns`, the next resolution replaces
  // them again.
  absl::Status SetServers(const std::vector<ShardSpec>& servers);
  // The members' addresses, in membership order.
  std::vector<std::string> Shards();
  // The address of the shard owning `routing_key`.
  std::string ShardFor(absl::string_view routing_key);

  // On every shard. Returns a reachable shard's response (all answer with
  // the same model id). FAILED_PRECONDITION when shards return different
  // fingerprints (mixed server versions); a shard's error other than being
  // down, naming it; UNAVAILABLE when no shard is reachable. Shards that
  // are down get the registration when next used.
  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(const v1::RegisterModelRequest& req);

  // Routing keys of a batched call's blocks: none (PutBlocks: from the
  // blocks' parents, below; other calls: the request's blocks are one
  // chain from its first hash, its key), one (every block's), or one per
  // block. INVALID_ARGUMENT for any other count.
  //
  // PutBlocks without keys: a block without a parent starts a chain (its
  // hash is the key); a block whose parent is an earlier block of the call
  // has that block's key; any other block is INVALID_ARGUMENT (its chain
  // started in an earlier call: pass keys). Each shard's stream commits on
  // its own (two-phase per shard): on a shard's failure the blocks of the
  // others may be committed; the error names the shard and counts them.
  absl::StatusOr<v1::PutBlocksResponse> PutBlocks(const v1::PutHeader& header,
                                                  const std::vector<v1::PutBlock>& blocks,
                                                  const std::vector<std::string>& routing_keys = {});
  // One shard: the owner of `routing_key` (empty: req.block_hashes(0)).
  // A down shard answers 0 hits.
  absl::StatusOr<v1::LookupResponse> Lookup(const v1::LookupRequest& req, absl::string_view routing_key = {});
  // The blocks of every shard, in request order (a packed read's format
  // comes with the first block). UNAVAILABLE naming a down shard.
  absl::StatusOr<std::vector<v1::GetBlocksResponse>> GetBlocks(const v1::GetBlocksRequest& req,
                                                               const std::vector<std::string>& routing_keys = {});
  // Split as GetBlocks; the counts are summed over shards.
  absl::StatusOr<v1::PinResponse> Pin(const v1::PinRequest& req, const std::vector<std::string>& routing_keys = {});
  absl::StatusOr<v1::UnpinResponse> Unpin(const v1::UnpinRequest& req,
                                          const std::vector<std::string>& routing_keys = {});
  absl::StatusOr<v1::DeleteResponse> Delete(const v1::DeleteRequest& req,
                                            const std::vector<std::string>& routing_keys = {});

  // On the owner of `routing_key` (empty: block_hashes(0); a sequence of
  // tail tokens only: the tail's bytes). The returned sequence_id is
  // "SHARD/ID", which Append, Attend and DropSequence route by.
  absl::StatusOr<v1::CreateSequenceResponse> CreateSequence(const v1::CreateSequenceRequest& req,
                                                            absl::string_view routing_key = {});
  absl::StatusOr<v1::AppendResponse> Append(const v1::AppendRequest& req);
  // Items are split by their sequences' shards and outputs merged in item
  // order; an item's new tokens are atomic with its shard's other items
  // only. kernel_micros and device_micros are summed over shards,
  // service_micros is the largest. NOT_FOUND for a sequence id not made by
  // a ShardedClient or whose shard is no longer a member.
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& req);
  absl::StatusOr<v1::DropSequenceResponse> DropSequence(const v1::DropSequenceRequest& req);

  // Fan-out to every member, in membership order.
  std::vector<ShardResult<v1::StatsResponse>> Stats(const v1::StatsRequest& req);
  std::vector<ShardResult<v1::EvictResponse>> Evict(const v1::EvictRequest& req);
  std::vector<ShardResult<bool>> Health();

 private:
  struct Members {
    std::vector<std::shared_ptr<Shard>> shards;
    std::vector<RendezvousShard> ring;  // the same order
  };
  // A batched call's share on one shard: the request indices it carries.
  struct Group {
    std::shared_ptr<Shard> shard;
    std::vector<int> items;
  };
  struct Registration {
    v1::RegisterModelRequest request;
    std::string fingerprint;
  };

  explicit ShardedClient(ShardedClientOptions options) : options_(std::move(options)) {}
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }
  // The members, after re-resolving `dns` when due.
  std::shared_ptr<const Members> Current();
  absl::Status Install(const std::vector<ShardSpec>& servers);
  std::shared_ptr<Shard> Owner(const Members& m, absl::string_view key) const;
  std::shared_ptr<Shard> ByName(const Members& m, absl::string_view name) const;
  // Items grouped by their keys' owners, groups in order of first item.
  std::vector<Group> Split(const Members& m, const std::vector<absl::string_view>& keys) const;
  // The client of `shard`, with `model_id` registered there (0: none needed).
  absl::StatusOr<std::shared_ptr<Client>> Prepare(Shard& shard, uint64_t model_id);
  // Runs call(client) on `shard` after Prepare, reports its outcome, and
  // names the shard in an error.
  absl::Status OnShard(Shard& shard, uint64_t model_id, const std::function<absl::Status(Client&)>& call);
  // A batched call: call(client, items) on each owner of `keys` with the
  // indices of its items, concurrently; the first failure in group order.
  absl::Status SplitCall(uint64_t model_id, const std::vector<absl::string_view>& keys,
                         const std::function<absl::Status(Client&, const std::vector<int>&)>& call);
  // fn(i) for i in [0, n), concurrently when n > 1.
  static void Parallel(size_t n, const std::function<void(size_t)>& fn);

  const ShardedClientOptions options_;
  absl::Mutex resolve_mu_;  // held while resolving `dns`; acquired before mu_
  absl::Time next_resolve_ ABSL_GUARDED_BY(resolve_mu_);
  absl::Mutex mu_;
  std::shared_ptr<const Members> members_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Registration> models_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tqkv::client

#endif  // TQKV_CLIENT_CPP_SHARDED_CLIENT_H_
