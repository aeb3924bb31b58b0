// How one CudaBackend::Attend lays out what crosses the bus: the staging
// layout (one pinned host buffer mirrored by one device buffer, so a call
// makes a single host-to-device copy), the dtype its queries and outputs
// travel in, and the layers it encodes before attending (AttendBatch::packs).
// Host code only; the backend issues the copies and launches.
#ifndef TQKV_GPU_CALL_STAGING_H_
#define TQKV_GPU_CALL_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/backend.h"
#include "codec/dtype.h"
#include "codec/model_codec.h"

namespace tqkv::gpu {

// Offsets of arrays laid out back to back, each 256-byte aligned.
class Staging {
 public:
  static size_t Align(size_t n) { return (n + 255) / 256 * 256; }
  // Reserves `bytes`; returns their offset.
  size_t Add(size_t bytes) {
    const size_t off = size_;
    size_ += Align(bytes);
    return off;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

// How a call's queries and outputs cross the bus: in their wire dtype (fp16
// or bf16, the same for every sequence with queries) and converted on the
// device when the call has at least kMinElems query values (two more
// launches, half the bytes, no host conversion); else as fp32 converted on
// the host.
struct WireIo {
  static constexpr size_t kMinElems = size_t{1} << 16;  // 16 queries of 32 heads × 128
  bool on_device = false;
  DType dtype = DType::kF32;
  // The GpuDType (gpu/gpu_codec.h) of `dtype` when on_device.
  int32_t gpu_dtype() const;
};
// `elems`: the call's query values.
WireIo ChooseWireIo(const AttendBatch& b, size_t elems);

// A call's packs (AttendBatch::packs): their rows staged in the call's
// upload (one dtype, fp32 where they differ) with each row's token slot in
// the arena (slot · block_size + row), for one encode launch straight into
// the blocks' arena slots; each slot's layer comes back through the
// staging's output part and is copied to the pack's `out`.
struct PackPlan {
  size_t n = 0;
  int layer = 0;
  std::vector<int32_t> slots;  // per pack: its block's arena slot
  DType dtype = DType::kF32;
  size_t row_elems = 0, rows = 0;  // per pack: block_size rows of row_elems
  size_t layer_bytes = 0;
  size_t k_off = 0, v_off = 0, slots_off = 0, flag_off = 0, out_off = 0;

  // Reserves the uploaded arrays (rows, token slots, the encode's flag).
  void AddInputs(Staging& st);
  // Reserves the downloaded layers.
  void AddOutputs(Staging& st);
  // Writes the uploaded arrays into the host staging `h`.
  void Stage(const AttendBatch& b, uint8_t* h) const;
  // Copies the downloaded layers from `h` to the packs' outputs.
  void Deliver(const AttendBatch& b, const uint8_t* h) const;
};
// `slots`: each pack's block's arena slot, in order.
PackPlan PlanPacks(const ModelCodec& codec, const AttendBatch& b, std::vector<int32_t> slots);

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_CALL_STAGING_H_
