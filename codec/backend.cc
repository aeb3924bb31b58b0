#include "codec/backend.h"

#include "absl/strings/str_cat.h"

namespace tqkv {

namespace {

// Layers [first, last) inside the model, and one K and one V tensor each.
absl::Status ValidateLayers(const ModelCodec& codec, int first, int last, size_t nk, size_t nv) {
  const ModelShape& s = codec.shape();
  if (first < 0 || last > s.num_layers || first >= last)
    return absl::InvalidArgumentError(
        absl::StrCat("layer range [", first, ", ", last, ") outside [0, ", s.num_layers, ")"));
  if (nk != static_cast<size_t>(last - first) || nv != nk)
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", last - first, " K and V tensors, got ", nk, " and ", nv));
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateEncodeArgs(const ModelCodec& codec, int first, int last,
                                const std::vector<DenseView>& k, const std::vector<DenseView>& v) {
  if (absl::Status st = ValidateLayers(codec, first, last, k.size(), v.size()); !st.ok()) return st;
  const ModelShape& s = codec.shape();
  for (size_t i = 0; i < k.size(); ++i) {
    for (const DenseView* t : {&k[i], &v[i]}) {
      if (t->heads != s.num_kv_heads || t->dim != s.head_dim || t->tokens < 0 ||
          t->tokens > s.block_size || t->data == nullptr)
        return absl::InvalidArgumentError(absl::StrCat(
            t == &k[i] ? "K" : "V", " of layer ", first + i, " has shape [", t->tokens, ", ",
            t->heads, ", ", t->dim, "], expected [<=", s.block_size, ", ", s.num_kv_heads, ", ",
            s.head_dim, "]"));
    }
    if (k[i].tokens != v[i].tokens)
      return absl::InvalidArgumentError(
          absl::StrCat("K and V of layer ", first + i, " have different token counts"));
  }
  return absl::OkStatus();
}

void PointAtContiguousF32(AttendBatch& b, const float* q, float* out) {
  const size_t row = static_cast<size_t>(b.shape.q_heads) * b.shape.dim;
  for (size_t i = 0; i < b.sequences.size(); ++i) {
    AttendSequence& s = b.sequences[i];
    s.q = q + b.query_offsets[i] * row;
    s.out = out + b.query_offsets[i] * row;
    s.dtype = DType::kF32;
  }
}

absl::Status ValidateAttendBatch(const ModelCodec& codec, const AttendBatch& b) {
  const ModelShape& s = codec.shape();
  if (b.layer < 0 || b.layer >= s.num_layers)
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", b.layer, " outside [0, ", s.num_layers, ")"));
  if (b.shape.q_heads != s.num_q_heads || b.shape.kv_heads != s.num_kv_heads ||
      b.shape.dim != s.head_dim)
    return absl::InvalidArgumentError("attention shape does not match the model");
  if (b.query_offsets.size() != b.sequences.size() + 1 || b.query_offsets.front() != 0)
    return absl::InvalidArgumentError("query_offsets must have one entry per sequence plus one");
  for (size_t i = 0; i + 1 < b.query_offsets.size(); ++i)
    if (b.query_offsets[i + 1] < b.query_offsets[i])
      return absl::InvalidArgumentError("query_offsets must be non-decreasing");
  if (static_cast<int64_t>(b.positions.size()) != b.query_offsets.back())
    return absl::InvalidArgumentError("one position per query is required");
  for (const PackItem& p : b.packs) {
    if (p.out == nullptr) return absl::InvalidArgumentError("a pack has no output");
    if (absl::Status st = ValidateEncodeArgs(codec, b.layer, b.layer + 1, {p.k}, {p.v}); !st.ok()) return st;
    if (p.k.tokens != s.block_size)
      return absl::InvalidArgumentError(absl::StrCat("a pack has ", p.k.tokens, " rows, not block_size ", s.block_size));
  }
  for (size_t i = 0; i < b.sequences.size(); ++i) {
    const AttendSequence& seq = b.sequences[i];
    if (seq.packed_tokens < 0 ||
        seq.packed_tokens > static_cast<int64_t>(seq.blocks.size()) * s.block_size)
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", i, " has ", seq.packed_tokens, " packed tokens in ",
                       seq.blocks.size(), " blocks"));
    if (b.query_offsets[i + 1] > b.query_offsets[i] && (seq.q == nullptr || seq.out == nullptr))
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " has queries but no q or out buffer"));
    const int64_t total = seq.packed_tokens + seq.tail_k.tokens;
    for (int64_t q = b.query_offsets[i]; q < b.query_offsets[i + 1]; ++q)
      if (b.positions[q] < 0 || b.positions[q] >= total)
        return absl::InvalidArgumentError(absl::StrCat("query position ", b.positions[q],
                                                       " outside sequence ", i, " of ", total,
                                                       " tokens"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDecodeArgs(const ModelCodec& codec, int first, int last,
                                const std::vector<MutableDenseView>& k, const std::vector<MutableDenseView>& v) {
  if (absl::Status st = ValidateLayers(codec, first, last, k.size(), v.size()); !st.ok()) return st;
  const ModelShape& s = codec.shape();
  for (size_t i = 0; i < k.size(); ++i)
    for (const MutableDenseView* t : {&k[i], &v[i]})
      if (t->tokens != s.block_size || t->heads != s.num_kv_heads || t->dim != s.head_dim || t->data == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("decode output of layer ", first + i, " must be [",
                                                       s.block_size, ", ", s.num_kv_heads, ", ", s.head_dim, "]"));
  return absl::OkStatus();
}

absl::Status ValidateDeviceKv(const ModelCodec& codec, int first, int last, const DeviceKvRef& ref) {
  const size_t n = last > first ? static_cast<size_t>(last - first) : 0;
  if (absl::Status st = ValidateLayers(codec, first, last, n, n); !st.ok()) return st;
  if (ref.layers.size() != n)
    return absl::InvalidArgumentError(absl::StrCat("device.layers has ", ref.layers.size(), " entries; layers [",
                                                   first, ", ", last, ") take ", n));
  if (ref.ipc_handles.empty()) return absl::InvalidArgumentError("device.ipc_handles is empty");
  for (size_t i = 0; i < ref.ipc_handles.size(); ++i)
    if (ref.ipc_handles[i].size() != kIpcHandleBytes)
      return absl::InvalidArgumentError(absl::StrCat("device.ipc_handles[", i, "] has ", ref.ipc_handles[i].size(),
                                                     " bytes; a CUDA IPC handle has ", kIpcHandleBytes));
  const uint64_t es = DTypeSize(ref.dtype);
  for (size_t i = 0; i < ref.layers.size(); ++i) {
    const DeviceKvRef::Layer& l = ref.layers[i];
    if (l.k_buffer >= ref.ipc_handles.size() || l.v_buffer >= ref.ipc_handles.size())
      return absl::InvalidArgumentError(absl::StrCat("device.layers[", i, "] names a buffer past the ",
                                                     ref.ipc_handles.size(), " ipc_handles"));
    if (l.k_offset % es != 0 || l.v_offset % es != 0)
      return absl::InvalidArgumentError(absl::StrCat("device.layers[", i, "] offsets must be multiples of ", es,
                                                     " (the dtype's size)"));
  }
  const ModelShape& s = codec.shape();
  const uint64_t head = static_cast<uint64_t>(s.head_dim) * es, bs = ref.block_stride, ts = ref.token_stride,
                 hs = ref.head_stride, tokens = s.block_size, heads = s.num_kv_heads;
  if (bs % es != 0 || ts % es != 0 || hs % es != 0)
    return absl::InvalidArgumentError(absl::StrCat("device strides must be multiples of ", es, " (the dtype's size)"));
  constexpr uint64_t kMaxStride = uint64_t{1} << 44;
  if (bs >= kMaxStride || ts >= kMaxStride || hs >= kMaxStride)
    return absl::InvalidArgumentError("device strides must be under 2^44 bytes");
  // A block's heads must not overlap: tokens outside heads (NHD, vLLM's
  // paged layout) or heads outside tokens (HND), and blocks apart.
  const bool nhd = hs >= head && ts >= heads * hs;
  const bool hnd = ts >= head && hs >= tokens * ts;
  if (!nhd && !hnd)
    return absl::InvalidArgumentError(absl::StrCat(
        "device strides (token ", ts, ", head ", hs, ") overlap a block's rows: a head of ", head,
        " bytes needs head_stride >= ", head, " and token_stride >= kv_heads * head_stride, or the reverse"));
  const uint64_t span = (tokens - 1) * ts + (heads - 1) * hs + head;
  if (bs < span)
    return absl::InvalidArgumentError(
        absl::StrCat("device.block_stride ", bs, " is under a block's span of ", span, " bytes"));
  return absl::OkStatus();
}

absl::Status ComputeBackend::EncodeDeviceBlocks(const ModelCodec&, int, int, const DeviceKvRef&,
                                                std::span<const DeviceEncodeItem>) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the ", name(), " backend cannot read GPU memory of another process (CUDA IPC needs --backend cuda)"));
}

absl::Status ComputeBackend::DecodeDeviceBlocks(const ModelCodec&, int, int, std::span<const DeviceDecodeItem>,
                                                const DeviceKvRef&) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the ", name(), " backend cannot write GPU memory of another process (CUDA IPC needs --backend cuda)"));
}

}  // namespace tqkv
