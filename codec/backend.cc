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

}  // namespace tqkv
