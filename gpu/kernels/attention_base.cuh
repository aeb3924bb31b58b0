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

// A launch with dense tails: the fused merge (FastMergeKernel, launched
// as this grid's programmatic dependent) attends them before it waits for
// the split records, so a decode kernel of several resident blocks per SM
// lets it launch as soon as every block of its own grid has started: the
// merge's blocks then take only SM room the decode grid no longer needs,
// and the tails' loads leave the critical path. Measured on the H200
// (bench/RESULTS.md, "Partial last blocks"): the register-buffered tiles
// (k2v2) 1.17 → 1.09-1.11× the aligned call at 1 × 32K; the row sets
// (k4v4, k4v2), one SM's registers a block, lost 2-3 µs with it: they
// trigger once their tiles are done.
__device__ __forceinline__ void LaunchTailMergeEarly(const AttentionLaunch& a) {
  if (a.has_tail) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_BASE_CUH_
