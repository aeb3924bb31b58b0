// KvService: the tqkv.v1 KvStore and Admin semantics, independent of gRPC.
//
// Each method takes the caller's Identity (from the auth layer) and a
// request message and returns a response or an absl::Status; the gRPC
// adapter (grpc_service.h) only moves messages and maps statuses. Codes
// follow the proto's contract: INVALID_ARGUMENT for bad input with nothing
// changed, NOT_FOUND for unknown models/blocks/sequences (another tenant's
// are unknown too), FAILED_PRECONDITION for a fingerprint mismatch,
// ALREADY_EXISTS for conflicting registrations or bytes, RESOURCE_EXHAUSTED
// for budgets, DATA_LOSS for corrupt stored blocks.
//
// Thread safety: thread-safe; every method may be called concurrently.
#ifndef TQKV_SERVICE_KV_SERVICE_H_
#define TQKV_SERVICE_KV_SERVICE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "codec/backend.h"
#include "proto/tqkv/v1/tqkv.pb.h"
#include "service/auth.h"
#include "service/model_registry.h"
#include "service/put_session.h"
#include "service/put_streams.h"
#include "service/sequence_manager.h"
#include "service/staging_area.h"
#include "storage/block_store.h"
#include "storage/clock.h"

namespace tqkv::service {

struct KvServiceOptions {
  // Most block hashes in one Lookup/GetBlocks/Pin/Unpin/Delete/
  // CreateSequence request. Default: 65536.
  size_t max_hashes_per_request = 65536;
  // Pin lease when a request asks for ttl_ms 0. Default: 30 s.
  absl::Duration default_pin_ttl = absl::Seconds(30);
  // Longest pin lease granted; longer requests are capped to it (must not
  // exceed the store's max_pin_ttl). Default: 10 minutes.
  absl::Duration max_pin_ttl = absl::Minutes(10);
  // Most blocks in one PutBlocks stream. Default: 65536.
  size_t max_blocks_per_stream = 65536;
  StagingOptions staging;
  SequenceOptions sequences;
  PutStreamLimits put_streams;
};

// A prepared GetBlocks: every block fetched (so a missing block fails the
// call before any byte is sent); responses are rendered one at a time.
struct GetPlan {
  std::shared_ptr<const RegisteredModel> model;
  int first = 0, last = 0;
  bool dense = false;
  DType dense_dtype = DType::kF16;
  // A dense get into a same-host worker's GPU memory (GetBlocksRequest.
  // device_out, data plane only): block i to slot device_slots[i].
  bool device = false;
  std::vector<uint64_t> device_slots;
  std::vector<std::string> hashes;
  std::vector<storage::BlockData> blocks;
};

class KvService {
 public:
  // None owned; all must outlive the service.
  KvService(const KvServiceOptions& options, storage::BlockStore* store, ModelRegistry* registry,
            ComputeBackend* backend, storage::Clock* clock);

  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(const Identity& id,
                                                          const v1::RegisterModelRequest& req);
  // A new put stream (see put_session.h), or RESOURCE_EXHAUSTED at the
  // open-stream caps (put_streams.h).
  absl::StatusOr<std::unique_ptr<PutSession>> NewPutSession(const Identity& id);
  absl::StatusOr<v1::LookupResponse> Lookup(const Identity& id, const v1::LookupRequest& req);
  // Fetches every requested block. NOT_FOUND naming the first missing one.
  absl::StatusOr<GetPlan> PrepareGet(const Identity& id, const v1::GetBlocksRequest& req);
  // The packed bytes of block i of a plan (its layer range); valid while
  // plan.blocks[i].payload is held.
  struct Span {
    const uint8_t* data;
    size_t size;
  };
  static Span PackedBytes(const GetPlan& plan, size_t i);
  // Response i of a plan (i == 0 carries the FormatDescriptor for packed).
  absl::StatusOr<v1::GetBlocksResponse> RenderGet(const GetPlan& plan, size_t i);
  // Bytes of one dense K (or V) tensor of a dense plan: [layers of the
  // range, block_size, kv_heads, head_dim] of plan.dense_dtype.
  static size_t DenseTensorBytes(const GetPlan& plan);
  // Decodes block i of a dense plan into k and v (DenseTensorBytes each).
  absl::Status DecodeDense(const GetPlan& plan, size_t i, uint8_t* k, uint8_t* v);
  // Decodes every block of a dense plan into `out`: block i's K at
  // out + 2·i·DenseTensorBytes, its V right after; in backend batches.
  absl::Status DecodeDenseBlocks(const GetPlan& plan, uint8_t* out);
  // Decodes every block of a device plan into `out` (the request's
  // device_out, converted by the data plane): ComputeBackend::
  // DecodeDeviceBlocks' errors.
  absl::Status DecodeDeviceBlocks(const GetPlan& plan, const DeviceKvRef& out);
  // All-or-nothing: NOT_FOUND if any hash is not stored (pins taken by this
  // call are released again).
  absl::StatusOr<v1::PinResponse> Pin(const Identity& id, const v1::PinRequest& req);
  // Releases one pin per stored, pinned hash; others are skipped and not
  // counted.
  absl::StatusOr<v1::UnpinResponse> Unpin(const Identity& id, const v1::UnpinRequest& req);
  // Deletes each stored hash; absent ones are skipped and not counted.
  absl::StatusOr<v1::DeleteResponse> Delete(const Identity& id, const v1::DeleteRequest& req);
  absl::StatusOr<v1::CreateSequenceResponse> CreateSequence(const Identity& id,
                                                            const v1::CreateSequenceRequest& req);
  // `raw`: tensors beside the request (the data plane's raw payloads; see
  // SequenceManager's RawTensors).
  absl::StatusOr<v1::AppendResponse> Append(const Identity& id, const v1::AppendRequest& req,
                                            RawTensors* raw = nullptr);
  absl::StatusOr<v1::AttendResponse> Attend(const Identity& id, const v1::AttendRequest& req,
                                            RawTensors* raw = nullptr);
  absl::StatusOr<v1::DropSequenceResponse> DropSequence(const Identity& id,
                                                        const v1::DropSequenceRequest& req);
  absl::StatusOr<v1::StatsResponse> Stats(const Identity& id, const v1::StatsRequest& req);
  absl::StatusOr<v1::ListModelsResponse> ListModels(const Identity& id, const v1::ListModelsRequest& req);
  // Admin (PERMISSION_DENIED unless id.admin); the proto's contract
  // (ModelRegistry::Unregister does the fencing).
  absl::StatusOr<v1::UnregisterModelResponse> UnregisterModel(const Identity& id,
                                                              const v1::UnregisterModelRequest& req);
  // The data-plane address Stats reports. REQUIRES: called before the
  // service takes requests (not synchronised).
  void SetDataPlaneAddress(std::string address) { data_plane_address_ = std::move(address); }
  // Admin. PERMISSION_DENIED unless id.admin. model_id 0: every model of
  // the caller's tenant (max_bytes is shared across them).
  absl::StatusOr<v1::EvictResponse> Evict(const Identity& id, const v1::EvictRequest& req);

  // Periodic upkeep: expires idle sequences and stale staged parts.
  void Maintain();

  SequenceManager& sequences() { return sequences_; }
  StagingArea& staging() { return staging_; }
  ComputeBackend& backend() { return *backend_; }

 private:
  std::string data_plane_address_;
  absl::StatusOr<std::vector<storage::BlockData>> FetchAll(
      const std::string& tenant, const RegisteredModel& model,
      const google::protobuf::RepeatedPtrField<std::string>& hashes);

  const KvServiceOptions options_;
  storage::BlockStore* const store_;
  ModelRegistry* const registry_;
  ComputeBackend* const backend_;
  storage::Clock* const clock_;
  StagingArea staging_;
  SequenceManager sequences_;
  PutStreams put_streams_;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_KV_SERVICE_H_
