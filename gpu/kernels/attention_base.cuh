// What every paged-attention kernel shares: block geometry constants, a
// query's sequence, packed-row addressing and the q heads of a block. No
// kernels (the headers that define them are included by one translation
// unit each).
#ifndef TQKV_GPU_KERNELS_ATTENTION_BASE_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_BASE_CUH_

#include <math_constants.h>

#include "gpu/attention_plan.h"
#include "gpu/kernels.h"
#include "gpu/kernels/common.cuh"

namespace tqkv::gpu {

inline constexpr int kAttnWarps = 4;
inline constexpr int kMaxHeadsPerBlock = 8;  // generic kernel: q heads per block
inline constexpr float kLog2e = 1.4426950408889634f;

// Query qi's sequence (AttentionLaunch::query_seq; null: sequence qi).
__device__ __forceinline__ int SeqOf(const AttentionLaunch& a, int64_t qi) {
  return a.query_seq != nullptr ? a.query_seq[qi] : static_cast<int>(qi);
}

// Sequence seq's block table (AttentionLaunch::seq_tables or a row of
// block_table).
__device__ __forceinline__ const int32_t* BlockTable(const AttentionLaunch& a, int seq) {
  return a.seq_tables != nullptr ? a.seq_tables[seq] : a.block_table + static_cast<int64_t>(seq) * a.max_blocks;
}

__device__ __forceinline__ const uint8_t* PackedRow(const AttentionLaunch& a, const uint8_t* base,
                                                    int seq, int64_t t, int kvh, int row_bytes) {
  const int32_t page = BlockTable(a, seq)[t / a.block_size];
  return base + page * a.block_stride +
         ((t % a.block_size) * a.kv_heads + kvh) * static_cast<int64_t>(row_bytes);
}

// The q heads a block of a split-K kernel takes: block x is (query qi, kv
// head kvh, chunk of up to `per_block` of its q heads) — heads h0 .. h0 +
// count − 1.
struct BlockHeads {
  int64_t qi;
  int kvh, h0, count;
};
__device__ __forceinline__ BlockHeads HeadsOfBlock(const AttentionLaunch& a, const AttnDims& d, int per_block) {
  const int64_t bx = blockIdx.x;
  BlockHeads b;
  b.qi = bx / (a.kv_heads * d.head_chunks);
  const int rem = static_cast<int>(bx % (a.kv_heads * d.head_chunks));
  b.kvh = rem / d.head_chunks;
  b.h0 = b.kvh * d.group + (rem % d.head_chunks) * per_block;
  b.count = min(per_block, b.kvh * d.group + d.group - b.h0);
  return b;
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_BASE_CUH_
