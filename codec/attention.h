// Attention over dense and packed K/V.
//
// * Reference (fp64): dense float K/V, double accumulation everywhere — the
//   ground truth for every other path and for the GPU kernels.
// * Packed (CPU serving path): keys scored on packed rows with the query
//   rotated once (RowCodec::Score), values accumulated in the rotated space and
//   mapped back once (RowCodec::Accumulate/FinishValue). A sequence is a list
//   of packed pages (one per block, this layer's K or V page) plus an
//   optional dense tail of recent tokens.
//
// Shapes: q [num_queries, q_heads, d]; K/V [tokens, kv_heads, d]; GQA maps q
// head h to kv head h / (q_heads / kv_heads). Query i sits at absolute
// position positions[i] and attends keys 0..positions[i] (causal); decode is
// one query at position tokens − 1.
#ifndef TQKV_CODEC_ATTENTION_H_
#define TQKV_CODEC_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "codec/model_codec.h"
#include "codec/tensor.h"
#include "codec/thread_pool.h"

namespace tqkv {

struct AttentionShape {
  int q_heads = 0;
  int kv_heads = 0;
  int dim = 0;
  double scale = 0;  // 0 means 1/sqrt(dim)
  double effective_scale() const;
};

// fp64 reference. k, v: [tokens, kv_heads, d] float; q: [nq, q_heads, d]
// float; out: [nq, q_heads, d] double. REQUIRES positions[i] < tokens.
void ReferenceAttention(const AttentionShape& s, const float* q, int64_t nq,
                        const int64_t* positions, const float* k, const float* v, int64_t tokens,
                        double* out);

// A stored sequence for one layer.
struct PackedSequence {
  std::vector<const uint8_t*> k_pages;  // per block: [block_size, kv_heads, k_row_bytes]
  std::vector<const uint8_t*> v_pages;
  int64_t packed_tokens = 0;  // <= k_pages.size() * block_size
  DenseView tail_k, tail_v;   // dense tokens after the packed ones (tokens may be 0)
  int64_t total_tokens() const { return packed_tokens + tail_k.tokens; }
};

// Decodes every token of `seq` into dense float K/V [total, kv_heads, d] —
// the inputs of ReferenceAttention over "the same dequantized K/V".
void DequantizeSequence(const LayerCodec& layer, int block_size, const PackedSequence& seq,
                        std::vector<float>* k, std::vector<float>* v);

// Attention on packed rows (CPU serving path). out: [nq, q_heads, d] float.
// INVALID_ARGUMENT on inconsistent shapes or a position outside the sequence.
absl::Status AttendPacked(const LayerCodec& layer, int block_size, const AttentionShape& s,
                          const PackedSequence& seq, const float* q, int64_t nq,
                          const int64_t* positions, float* out, ThreadPool* pool);

}  // namespace tqkv

#endif  // TQKV_CODEC_ATTENTION_H_
