#include "codec/cpu_backend.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "codec/page_codec.h"
#include "base/status_macros.h"

namespace tqkv {
namespace {

int DefaultThreads(int requested) {
  if (requested >= 0) return requested;
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  return hw > 1 ? hw - 1 : 0;
}

}  // namespace

CpuBackend::CpuBackend(const Options& options)
    : pool_(std::make_unique<ThreadPool>(DefaultThreads(options.threads))) {}

absl::Status CpuBackend::EncodeBlock(const ModelCodec& codec, int first, int last,
                                     const std::vector<DenseView>& k,
                                     const std::vector<DenseView>& v, uint8_t* out) {
  TQ_RETURN_IF_ERROR(ValidateEncodeArgs(codec, first, last, k, v));
  const ModelShape& s = codec.shape();
  const size_t base = codec.layer_offset(first);
  std::vector<int64_t> slots(s.block_size);
  for (int t = 0; t < s.block_size; ++t) slots[t] = t;
  for (int l = first; l < last; ++l) {
    uint8_t* kp = out + codec.layer_offset(l) - base;
    uint8_t* vp = kp + codec.k_page_bytes(l);
    const DenseView& kd = k[l - first];
    const DenseView& vd = v[l - first];
    // Rows past `tokens` (a partial block) are zero.
    if (kd.tokens < s.block_size) {
      std::memset(kp, 0, codec.k_page_bytes(l) + codec.v_page_bytes(l));
    }
    TQ_RETURN_IF_ERROR(EncodeToPages(codec.layer(l), kd, vd, slots.data(),
                                     {kp, codec.k_geometry(l)}, {vp, codec.v_geometry(l)},
                                     pool_.get()));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DecodeBlock(const ModelCodec& codec, int first, int last,
                                     const uint8_t* payload,
                                     const std::vector<MutableDenseView>& k,
                                     const std::vector<MutableDenseView>& v) {
  TQ_RETURN_IF_ERROR(ValidateDecodeArgs(codec, first, last, k, v));
  const ModelShape& s = codec.shape();
  const size_t base = codec.layer_offset(first);
  std::vector<int64_t> slots(s.block_size);
  for (int t = 0; t < s.block_size; ++t) slots[t] = t;
  for (int l = first; l < last; ++l) {
    uint8_t* kp = const_cast<uint8_t*>(payload) + codec.layer_offset(l) - base;
    uint8_t* vp = kp + codec.k_page_bytes(l);
    TQ_RETURN_IF_ERROR(DecodeFromPages(codec.layer(l), {kp, codec.k_geometry(l)},
                                       {vp, codec.v_geometry(l)}, slots.data(), s.block_size,
                                       k[l - first], v[l - first], pool_.get()));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Attend(const ModelCodec& codec, const AttendBatch& b) {
  TQ_RETURN_IF_ERROR(ValidateAttendBatch(codec, b));
  const int l = b.layer;
  // Packs first: their blocks' payloads are what the sequences attend.
  for (const PackItem& p : b.packs) TQ_RETURN_IF_ERROR(EncodeBlock(codec, l, l + 1, {p.k}, {p.v}, p.out));
  const size_t d = codec.shape().head_dim;
  for (size_t i = 0; i < b.sequences.size(); ++i) {
    const AttendSequence& in = b.sequences[i];
    PackedSequence seq;
    for (const BlockRef& r : in.blocks) {
      seq.k_pages.push_back(r.payload + codec.layer_offset(l));
      seq.v_pages.push_back(r.payload + codec.layer_offset(l) + codec.k_page_bytes(l));
    }
    seq.packed_tokens = in.packed_tokens;
    seq.tail_k = in.tail_k;
    seq.tail_v = in.tail_v;
    const int64_t q0 = b.query_offsets[i], nq = b.query_offsets[i + 1] - q0;
    const size_t n = static_cast<size_t>(nq) * b.shape.q_heads * d;
    if (n == 0) continue;
    // fp32 queries and outputs are used in place; others convert.
    const bool f32 = in.dtype == DType::kF32;
    std::vector<float> q32(f32 ? 0 : n), out32(f32 ? 0 : n);
    if (!f32) ToFloat(in.dtype, in.q, q32.data(), n);
    float* out = f32 ? static_cast<float*>(in.out) : out32.data();
    TQ_RETURN_IF_ERROR(AttendPacked(codec.layer(l), codec.shape().block_size, b.shape, seq,
                                    f32 ? static_cast<const float*>(in.q) : q32.data(), nq,
                                    b.positions.data() + q0, out, pool_.get()));
    if (!f32) FromFloat(in.dtype, out32.data(), in.out, n);
  }
  return absl::OkStatus();
}

}  // namespace tqkv
