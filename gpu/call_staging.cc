#include "gpu/call_staging.h"

#include <cstring>

#include "gpu/gpu_codec.h"

namespace tqkv::gpu {

int32_t WireIo::gpu_dtype() const { return dtype == DType::kBF16 ? kGpuBF16 : kGpuF16; }

WireIo ChooseWireIo(const AttendBatch& b, size_t elems) {
  WireIo w;
  bool first = true;
  for (size_t i = 0; i < b.sequences.size(); ++i) {
    if (b.query_offsets[i + 1] == b.query_offsets[i]) continue;
    if (first) {
      w.dtype = b.sequences[i].dtype;
      w.on_device = elems >= WireIo::kMinElems && w.dtype != DType::kF32;
      first = false;
    }
    w.on_device = w.on_device && b.sequences[i].dtype == w.dtype;
  }
  return w;
}

void PackPlan::AddInputs(Staging& st) {
  if (n == 0) return;
  k_off = st.Add(n * rows * row_elems * DTypeSize(dtype));
  v_off = st.Add(n * rows * row_elems * DTypeSize(dtype));
  slots_off = st.Add(n * rows * sizeof(int64_t));
  flag_off = st.Add(sizeof(unsigned long long));
}

void PackPlan::AddOutputs(Staging& st) {
  if (n > 0) out_off = st.Add(n * layer_bytes);
}

void PackPlan::Stage(const AttendBatch& b, uint8_t* h) const {
  const size_t bytes = rows * row_elems * DTypeSize(dtype);
  auto* tok = reinterpret_cast<int64_t*>(h + slots_off);
  for (size_t i = 0; i < n; ++i) {
    const PackItem& p = b.packs[i];
    for (int c = 0; c < 2; ++c) {
      const DenseView& t = c == 0 ? p.k : p.v;
      uint8_t* dst = h + (c == 0 ? k_off : v_off) + i * bytes;
      if (t.dtype == dtype) std::memcpy(dst, t.data, bytes);
      else ToFloat(t.dtype, t.data, reinterpret_cast<float*>(dst), rows * row_elems);
    }
    for (size_t r = 0; r < rows; ++r) tok[i * rows + r] = static_cast<int64_t>(slots[i]) * rows + r;
  }
  if (n > 0) std::memset(h + flag_off, 0, sizeof(unsigned long long));
}

void PackPlan::Deliver(const AttendBatch& b, const uint8_t* h) const {
  for (size_t i = 0; i < n; ++i) std::memcpy(b.packs[i].out, h + out_off + i * layer_bytes, layer_bytes);
}

PackPlan PlanPacks(const ModelCodec& codec, const AttendBatch& b, std::vector<int32_t> slots) {
  PackPlan p;
  p.n = b.packs.size();
  p.layer = b.layer;
  p.slots = std::move(slots);
  if (p.n == 0) return p;
  const ModelShape& s = codec.shape();
  p.dtype = b.packs[0].k.dtype;
  for (const PackItem& item : b.packs)
    if (item.k.dtype != p.dtype || item.v.dtype != p.dtype) p.dtype = DType::kF32;
  p.row_elems = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
  p.rows = static_cast<size_t>(s.block_size);
  p.layer_bytes = codec.layer_range_bytes(b.layer, b.layer + 1);
  return p;
}

}  // namespace tqkv::gpu
