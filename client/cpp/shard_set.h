// The members of a sharded tqkv deployment, as the sharded client sees them:
// how a list or a DNS name becomes shards, and each shard's connection and
// health.
#ifndef TQKV_CLIENT_CPP_SHARD_SET_H_
#define TQKV_CLIENT_CPP_SHARD_SET_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"

namespace tqkv::client {

// One server of the set. Its address is its identity for routing: two
// specs with the same address are the same shard.
struct ShardSpec {
  std::string address;  // HOST:PORT
  double weight = 1.0;  // share of keys relative to the others; > 0
};

// Parses "HOST:PORT[=WEIGHT],HOST:PORT[=WEIGHT],..." (e.g.
// "tqkv-0.tqkv:50051,tqkv-1.tqkv:50051=2"). INVALID_ARGUMENT for an empty
// list or entry, an entry without a port, a weight that is not a positive
// number, or an address listed twice.
absl::StatusOr<std::vector<ShardSpec>> ParseShardList(absl::string_view list);

// Resolves HOST:PORT with getaddrinfo into one spec (weight 1) per distinct
// address, "IP:PORT" ("[IP6]:PORT"), sorted: a Kubernetes headless
// Service's name gives one shard per ready pod. INVALID_ARGUMENT for a
// malformed target; NOT_FOUND when the name does not exist or has no
// addresses; UNAVAILABLE when the resolver fails transiently (retry later).
absl::StatusOr<std::vector<ShardSpec>> ResolveShards(absl::string_view host_port);

// Same code as `s`, message "shard NAME: <s's message>"; OK stays OK.
absl::Status ShardError(absl::string_view shard, const absl::Status& s);

// Whether a call's failure means the shard is unreachable (UNAVAILABLE or
// DEADLINE_EXCEEDED): its keys are treated as misses.
bool IsShardDown(const absl::Status& s);

// One member: a lazily built client connection and a health window.
// Thread-safe.
class Shard {
 public:
  // `options` is the per-shard template; its target becomes `address`.
  Shard(std::string address, ClientOptions options);
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& name() const { return name_; }

  // The client to call at time `now`. UNAVAILABLE ("shard NAME is down:
  // <last error>") while a down window started by Report is open; after it,
  // a new connection (a fresh channel, so a restarted server is reached at
  // once instead of after gRPC's reconnect backoff). Errors of
  // Client::Connect (bad TLS files) are returned as they are.
  absl::StatusOr<std::shared_ptr<Client>> Acquire(absl::Time now);
  // Records a call's outcome: a failure for which IsShardDown holds opens a
  // down window [now, now + down_for), drops the connection and forgets
  // which models were registered (a restarted server may have lost them).
  void Report(const absl::Status& s, absl::Time now, absl::Duration down_for);

  // Whether RegisterModel of `model_id` succeeded on this shard since it
  // was last seen down.
  bool HasModel(uint64_t model_id);
  void AddModel(uint64_t model_id);

 private:
  const std::string name_;
  const ClientOptions options_;
  absl::Mutex mu_;
  std::shared_ptr<Client> client_ ABSL_GUARDED_BY(mu_);
  absl::Time down_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> models_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tqkv::client

#endif  // TQKV_CLIENT_CPP_SHARD_SET_H_
