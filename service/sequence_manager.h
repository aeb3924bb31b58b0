// SequenceManager: server-side decode state for fused attention over
// stored blocks.
//
// A sequence is a model, an ordered list of stored blocks (the caller's
// prefix, held as BlockData so their bytes stay valid whatever the store
// does with them), and per layer a dense fp32 tail of recent tokens. When a
// layer's tail reaches block_size tokens they are encoded through the
// ComputeBackend into layer l of a sequence-owned block (the same byte
// layout as a stored block), which fills layer by layer
// (BlockRef::complete = false): layer l's bytes never change once final.
// Tails carry an id whose rows only grow (AttendSequence::tail_id) and the
// sequence a key (AttendSequence::sequence_key), so a caching backend
// copies only what is new.
//
// Sequences expire after `ttl` without use (each call that names one is a
// use); an expired sequence is NOT_FOUND. Sequences live in memory only:
// they do not survive a restart.
//
// Thread safety: thread-safe. mu_ guards the id map; each sequence has its
// own mutex (taken after mu_ is released, never both at once). Attend
// locks its sequences (in address order) for the whole call, the backend's
// included, and reads their blocks and tails in place.
#ifndef TQKV_SERVICE_SEQUENCE_MANAGER_H_
#define TQKV_SERVICE_SEQUENCE_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "codec/backend.h"
#include "proto/tqkv/v1/tqkv.pb.h"
#include "service/convert.h"
#include "service/model_registry.h"
#include "service/tenant_budget.h"
#include "storage/block_store.h"
#include "storage/clock.h"

namespace tqkv::service {

// The tensors of an Append or Attend that travel beside its request (the
// data plane's raw payloads, proto "Data plane"): the request's tensors
// with empty data take their bytes from `in`, back to back in request
// order (Attend: per item q, then k and v), and must use all of it. An
// Attend writes its outputs to `out`, back to back in item order
// (`out_bytes` in all); the response's output tensors then carry their
// dtype and shape only.
struct RawTensors {
  TensorPayload in;
  // Where Attend's outputs go when they fit (memory shared with the
  // client); else they are allocated in `out`.
  absl::Span<uint8_t> out_into;
  std::unique_ptr<uint8_t[]> out;
  size_t out_bytes = 0;
};

struct SequenceOptions {
  // Idle expiry when CreateSequence asks for 0. Default: 5 minutes.
  absl::Duration default_ttl = absl::Minutes(5);
  // Longest idle expiry a caller may ask for (longer requests are capped).
  // Default: 1 hour.
  absl::Duration max_ttl = absl::Hours(1);
  // Most live sequences (all tenants); Create beyond it is
  // RESOURCE_EXHAUSTED. Default: 4096.
  size_t max_sequences = 4096;
  // Most live sequences of one tenant, so that one tenant cannot take
  // every sequence. Default: 1024.
  size_t max_sequences_per_tenant = 1024;
  // Host bytes that sequences hold beyond the stored blocks they share
  // (OwnedBytes), all tenants and one tenant: a Create or an append that
  // would pass either is RESOURCE_EXHAUSTED and changes nothing. Charged
  // before the memory is allocated, given back when it is freed.
  // Defaults: 4 GiB and 2 GiB.
  uint64_t max_bytes = uint64_t{4} << 30;
  uint64_t max_bytes_per_tenant = uint64_t{2} << 30;
  // Most queries in one Attend call (all items). Default: 4096.
  int64_t max_queries = 4096;
};

class SequenceManager {
 public:
  // `backend` and `clock` are not owned and must outlive the manager.
  SequenceManager(const SequenceOptions& options, ComputeBackend* backend, storage::Clock* clock);
  ~SequenceManager();
  SequenceManager(const SequenceManager&) = delete;
  SequenceManager& operator=(const SequenceManager&) = delete;

  // Creates a sequence over `blocks` (already fetched, in order) with an
  // optional dense tail [num_layers, tokens, kv_heads, head_dim] (tail_k
  // and tail_v both set or both absent). INVALID_ARGUMENT for bad tensors;
  // RESOURCE_EXHAUSTED at max_sequences (or the tenant's
  // max_sequences_per_tenant).
  absl::StatusOr<v1::CreateSequenceResponse> Create(
      const std::string& tenant, std::shared_ptr<const RegisteredModel> model,
      std::vector<storage::BlockData> blocks, const v1::CreateSequenceRequest& req);

  // Appends [tokens, kv_heads, head_dim] K/V to one layer. NOT_FOUND for an
  // unknown/expired sequence (or another tenant's); INVALID_ARGUMENT for a
  // bad layer or tensors; RESOURCE_EXHAUSTED when the sequence would pass
  // max_bytes(_per_tenant). On error the sequence is unchanged.
  // With `raw`, its tensors may travel beside the request (RawTensors).
  absl::StatusOr<v1::AppendResponse> Append(const std::string& tenant, const v1::AppendRequest& req,
                                            RawTensors* raw = nullptr);

  // Attention of every item's queries over its sequence at one layer, in
  // one backend call. All items must use one model. An item with new
  // tokens (k, v) appends them first, as Append would; the appends and the
  // attention happen together or not at all (on any error every sequence
  // is unchanged), and those sequences stay locked for the whole call.
  // Outputs are in each q's dtype. NOT_FOUND / INVALID_ARGUMENT as above
  // (also for a sequence given new tokens twice in one call); backend
  // errors pass. With `raw`, tensors may travel beside the request and the
  // outputs do (RawTensors).
  absl::StatusOr<v1::AttendResponse> Attend(const std::string& tenant, const v1::AttendRequest& req,
                                            RawTensors* raw = nullptr);

  // NOT_FOUND for an unknown sequence.
  absl::Status Drop(const std::string& tenant, const std::string& sequence_id);

  // Removes sequences idle past their ttl; returns how many.
  size_t ExpireIdle();
  // Live sequences of one model.
  size_t CountOfModel(const std::string& tenant, uint64_t model_id) const;
  // Removes the sequences of one model (being unregistered); returns how
  // many. Calls on them in flight finish on the bytes they hold.
  size_t DropModel(const std::string& tenant, uint64_t model_id);
  size_t size() const;
  // Host bytes held by sequences beyond the stored blocks they share:
  // packed blocks they own (filled by Append) and their dense tails' rooms
  // (per layer, block_size fp32 rows of K and of V, resident from the
  // sequence's creation). All tenants, or one.
  uint64_t OwnedBytes() const { return bytes_.used(); }
  uint64_t OwnedBytes(const std::string& tenant) const { return bytes_.used(tenant); }

 private:
  struct BackendId;
  struct OwnedBlock;
  struct Tail;
  struct Sequence;
  struct LayerUndo;
  // A fresh id for a tail or a sequence key (Forget()s it when destroyed).
  std::unique_ptr<BackendId> NewId();
  // The live sequence `id` of `tenant` (refreshing its idle timer), or
  // NOT_FOUND.
  absl::StatusOr<std::shared_ptr<Sequence>> Use(const std::string& tenant, const std::string& id);
  struct StagedAppend;
  // Appending dense rows to layer `layer` of `seq` in three steps, so that
  // one call's appends pack their full blocks in one backend batch:
  // StageAppend prepares (the blocks the rows fill, charged to the
  // sequence's tenant, their encodes) and changes nothing (RESOURCE_EXHAUSTED
  // when the new blocks do not fit the budget); EncodeStaged runs the encodes of appends to one
  // layer (on error nothing is committed); CommitAppend applies one and
  // cannot fail; `undo` (optional) receives what Restore needs to take it
  // back. REQUIRES: seq.mu held from the stage to the commit.
  absl::StatusOr<StagedAppend> StageAppend(Sequence& seq, int layer, const DenseView& k, const DenseView& v);
  absl::Status EncodeStaged(const ModelCodec& codec, int layer, std::span<StagedAppend> staged);
  void CommitAppend(StagedAppend& staged, LayerUndo* undo);
  // The three steps for one append. REQUIRES: seq.mu held.
  absl::Status AppendLocked(Sequence& seq, int layer, const DenseView& k, const DenseView& v);
  // Puts back what a CommitAppend replaced. REQUIRES: the sequence's mu
  // held since that append, and no later append to that layer.
  void Restore(LayerUndo& undo);

  const SequenceOptions options_;
  ComputeBackend* const backend_;
  storage::Clock* const clock_;
  mutable absl::Mutex mu_;
  // Live sequences and their bytes: each sequence holds a reservation of
  // both, given back when it is destroyed. Declared before sequences_,
  // so that they outlive it.
  TenantBudget count_;
  TenantBudget bytes_;
  absl::flat_hash_map<std::string, std::shared_ptr<Sequence>> sequences_ ABSL_GUARDED_BY(mu_);
  // Removes the sequences `doomed` picks; returns how many.
  size_t EraseIf(const std::function<bool(const Sequence&)>& doomed);
  // Erases sequences_'s entry `it`; returns the sequence.
  std::shared_ptr<Sequence> EraseLocked(
      absl::flat_hash_map<std::string, std::shared_ptr<Sequence>>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ids of owned blocks, tails and sequence keys: 1, 2, ... (stored
  // blocks' ids have the top bit set, see sequence_manager.cc).
  std::atomic<uint64_t> next_owned_id_{1};
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_SEQUENCE_MANAGER_H_
