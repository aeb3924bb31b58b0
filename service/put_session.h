// PutSession: one PutBlocks stream, two-phase.
//
// The first message must be the header; each later one carries one block.
// A whole-model put reserves host memory for each block as it arrives
// (BlockStore::BeginPut) and fills the reservation (dense input is encoded
// through the ComputeBackend, packed input is size-checked and copied).
// Nothing is visible until Finish, which commits every block of the stream
// at once (BlockStore::CommitAll): every block becomes visible at the same
// instant, or (different bytes under an existing hash, a full disk, a disk
// error) none does and the error is returned; durable blocks go to disk in
// one batch, so after a crash a stream is there whole or not at all. A
// layer-range put builds its parts in session memory and hands them to the
// StagingArea at Finish; the blocks they complete commit together with the
// stream's whole blocks. Destroying a session
// without Finish (failed, cancelled or truncated stream) leaves nothing.
//
// Thread safety: a session is used by one thread at a time, besides
// TryExpire (PutStreams' sweep), which may run concurrently.
#ifndef TQKV_SERVICE_PUT_SESSION_H_
#define TQKV_SERVICE_PUT_SESSION_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "codec/backend.h"
#include "proto/tqkv/v1/tqkv.pb.h"
#include "service/auth.h"
#include "service/convert.h"
#include "service/model_registry.h"
#include "service/staging_area.h"
#include "storage/block_store.h"
#include "storage/clock.h"

namespace tqkv::service {

class PutStreams;

// The collaborators a session uses; none owned, all outlive the session.
struct PutContext {
  storage::BlockStore* store = nullptr;
  ModelRegistry* registry = nullptr;
  ComputeBackend* backend = nullptr;
  StagingArea* staging = nullptr;
  storage::Clock* clock = nullptr;
  // Most blocks one stream may carry. Default: 65536.
  size_t max_blocks_per_stream = 65536;
  // The registry of open streams the session leaves when destroyed (none:
  // not counted), and when the stream must be done (DEADLINE_EXCEEDED at
  // its next message after it). Set by PutStreams::Open.
  PutStreams* streams = nullptr;
  absl::Time deadline = absl::InfiniteFuture();
};

class PutSession {
 public:
  PutSession(const PutContext& ctx, Identity identity) : ctx_(ctx), id_(std::move(identity)) {}
  ~PutSession();
  PutSession(const PutSession&) = delete;
  PutSession& operator=(const PutSession&) = delete;

  // Consumes one stream message. After an error the session is dead: every
  // later call returns the same error and Finish commits nothing.
  // INVALID_ARGUMENT: header missing, repeated or bad (layer range), a
  //   block with a bad or duplicate hash, wrong tensor shapes/dtypes or
  //   payload size, dense and packed data mixed.
  // NOT_FOUND / FAILED_PRECONDITION: unknown model / fingerprint mismatch
  //   (or durable without a disk tier).
  // RESOURCE_EXHAUSTED: the host budget cannot hold the stream's blocks
  //   (or the staging budget its layer-range parts).
  absl::Status OnMessage(const v1::PutBlocksRequest& msg);
  // Consumes several blocks after the header (a data-plane frame): as
  // OnMessage of each, with the same errors, but dense blocks are encoded
  // in batches (ComputeBackend::EncodeBlocks). With `payload` (the frame's
  // raw payload), a block's empty k/v tensors or empty packed payload take
  // their bytes from it, in block order (k, then v; packed: the layer
  // range's bytes), and the blocks must use all of it. `blocks` and the
  // payload must stay valid until it returns.
  // With `device`, the blocks are dense K/V in a same-host worker's GPU
  // memory (PutBlock.device_slot / device_tokens), encoded by the backend
  // straight from it (ComputeBackend::EncodeDeviceBlocks; its errors, e.g.
  // FAILED_PRECONDITION where the backend cannot map the memory, fail the
  // stream).
  absl::Status OnBlocks(const google::protobuf::RepeatedPtrField<v1::PutBlock>& blocks,
                        TensorPayload* payload = nullptr, const DeviceKvRef* device = nullptr);

  // Commits the stream (see file comment). REQUIRES: called at most once.
  absl::StatusOr<v1::PutBlocksResponse> Finish();

  // Fails the stream with DEADLINE_EXCEEDED (releasing its reservations)
  // if it is past its deadline at `now`, still healthy and not in use by
  // another thread; true if it did.
  bool TryExpire(absl::Time now);

 private:
  // A block's checked input: its dense K/V ([layers, tokens, kv_heads,
  // head_dim]), its packed layer range, or its slot in a device source.
  struct Input {
    TensorView k, v;
    const uint8_t* packed = nullptr;
    bool device = false;
    uint64_t slot = 0;
    int64_t tokens = 0;
  };
  absl::Status OnHeader(const v1::PutHeader& h);
  absl::Status OnBlock(const v1::PutBlock& b);
  // Checks the block's data (taking raw bytes from `payload` when given);
  // INVALID_ARGUMENT as listed at OnMessage.
  absl::StatusOr<Input> CheckInput(const v1::PutBlock& b, TensorPayload* payload, bool device);
  // Checks the block (hash, then *in = its input) and reserves its bytes
  // (a store reservation or a staged part); returns where they go.
  absl::StatusOr<uint8_t*> Admit(const v1::PutBlock& b, TensorPayload* payload, bool device, Input* in);
  // Fills `out` (layer_range_bytes(first_, last_) bytes) from `in`. With
  // `batch`, a dense block is appended to it for a later EncodeBlocks
  // instead.
  absl::Status Fill(const Input& in, uint8_t* out, std::vector<ComputeBackend::EncodeItem>* batch);
  // Records `s` as the stream's error if it is the first one and releases
  // every reservation; returns `s`.
  absl::Status Fail(const absl::Status& s);
  // Fail(DEADLINE_EXCEEDED) once `now` is past the deadline; the stream's error.
  absl::Status CheckAge(absl::Time now);

  const PutContext ctx_;
  const Identity id_;
  absl::Mutex mu_;  // held by each call (TryExpire may come from another thread)
  absl::Status error_;
  std::shared_ptr<const RegisteredModel> model_;  // set by the header
  int first_ = 0, last_ = 0;
  bool packed_ = false, durable_ = false, whole_ = false;
  absl::flat_hash_set<std::string> hashes_;
  std::vector<storage::PutHandle> handles_;   // whole-model blocks
  std::vector<StagingArea::Part> parts_;      // layer-range blocks
  TenantBudget::Reservation parts_charge_;    // their bytes, in the staging budget
  v1::PutBlocksResponse response_;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_PUT_SESSION_H_
