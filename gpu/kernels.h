// Launchers of the TurboQuant CUDA kernels. All pointers are DEVICE memory
// unless a field says otherwise; every launcher enqueues work on `stream`,
// returns the launch's cudaError_t (cudaGetLastError after the launch) and
// never allocates: callers size workspaces with the *WorkspaceBytes
// functions and pass them in.
//
// Page addressing (both K and V regions): row (slot, head) of a component
// lives at base + (slot / block_size) · block_stride
//                 + ((slot % block_size) · kv_heads + head) · row_bytes,
// which covers contiguous pages (block_stride = page bytes) and the block
// arena (block_stride = arena slot bytes, base = arena + layer offset).
#ifndef TQKV_GPU_KERNELS_H_
#define TQKV_GPU_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/gpu_codec.h"

namespace tqkv::gpu {

inline constexpr unsigned long long kNoBadSlot = ~0ull;
struct AttentionPlan;
// The served variant of the specialised encode (EncodeLaunch below), as
// measured on the H200 (bench/RESULTS.md): warp shuffles for the FWHT's
// cross-lane stages (the shared-memory transposes issue 5% fewer
// instructions but ran 2-8% slower) and registers budgeted for 3 blocks of
// 256 threads per SM (7-12% faster than 2, no spills from 16-bit input).
// fp32 input keeps 2: at 3 it spills 16-88 bytes.
inline constexpr bool kEncodeTransposeDefault = false;
inline constexpr int32_t kEncodeBlocksPerSmDefault = 3;
inline constexpr int32_t kEncodeBlocksPerSmF32 = 2;
// The blocks-per-SM budget served for an input dtype (kGpuF16/BF16/F32).
constexpr int32_t ServedEncodeBlocksPerSm(int32_t dtype) {
  return dtype == kGpuF32 ? kEncodeBlocksPerSmF32 : kEncodeBlocksPerSmDefault;
}

struct PageRegion {
  uint8_t* base = nullptr;
  int64_t block_stride = 0;  // bytes between consecutive blocks
  int32_t block_size = 16;
  int64_t num_slots = 0;     // slots >= num_slots are errors
};

// Encode dense K/V [tokens, heads, dim] (dtype GpuDType) into packed rows at
// flat `slots` (negative: skipped). k_comp/v_comp: [heads] descriptors.
// `bad_slot` (one unsigned long long of device memory) receives kNoBadSlot,
// or the position of the first out-of-range slot, in which case NOTHING is
// written. The caller reads it back after synchronising.
struct EncodeLaunch {
  const void* k = nullptr;
  const void* v = nullptr;
  int32_t dtype = kGpuF16;
  int64_t tokens = 0;
  int32_t heads = 0;
  int32_t dim = 0;
  const int64_t* slots = nullptr;
  PageRegion k_pages, v_pages;
  const GpuComponent* k_comp = nullptr;
  const GpuComponent* v_comp = nullptr;
  int32_t max_group_channels = 0;  // max over both components (host value)
  unsigned long long* bad_slot = nullptr;
  // Optional host copies of k_comp / v_comp ([heads] each). With them,
  // fp16/bf16/fp32 input at d = 128 whose components are 2-, 3-, 4- or
  // 8-bit mse rows (one RHT group, fp32 norm after the indices; K/V bits
  // 2/2, 3/3, 4/4, 8/8, 4/2 or 2/4) takes the specialised kernel.
  const GpuComponent* host_k = nullptr;
  const GpuComponent* host_v = nullptr;
  bool allow_fast_path = true;
  // The specialised kernel quantises 3-, 4- and 8-bit rows through the
  // codebooks' uniform-cell tables (GpuGroup::lut) when every component has
  // one; false (benchmarks, tests) or a missing table: it searches the
  // boundaries instead. Same bytes either way.
  bool allow_quant_lut = true;
  // Variants of the specialised kernel (benchmarks, tests; same bytes).
  // encode_transpose: its FWHT stages h = 4, 8, 16 and the norm's butterfly
  // exchange values through per-warp shared-memory transposes (true) or
  // warp shuffles (false). encode_blocks_per_sm: the blocks of 256 threads
  // per SM its registers are budgeted for, 2 (<= 128 registers) or 3
  // (<= 80); any other value makes LaunchEncode return
  // cudaErrorInvalidValue. fp16 input runs the variant asked for; bf16 and
  // fp32 input always run the served one (ServedEncodeBlocksPerSm; the
  // only ones instantiated).
  bool encode_transpose = kEncodeTransposeDefault;
  int32_t encode_blocks_per_sm = kEncodeBlocksPerSmDefault;
  // fp16 / bf16 input (16-byte aligned) to the specialised kernel's 2-, 3-
  // and 4-bit formats with heads a multiple or a divisor of 8: two lanes per
  // row (gpu/kernels/encode_rows.cuh; encode_blocks_per_sm 3 gives it two
  // input buffers per warp, 2 three; encode_transpose does not apply),
  // else the 8-lane kernel. Same bytes either way.
  bool encode_lane_rows = true;
};
// True when LaunchEncode(a) uses the specialised d = 128 kernel.
bool EncodeUsesFastPath(const EncodeLaunch& a);
// True when it does with two lanes per row (EncodeLaunch::encode_lane_rows).
bool EncodeUsesLaneRows(const EncodeLaunch& a);
// True when it does and quantises through the tables (never for k2v2,
// whose rows always compare against the three boundaries).
bool EncodeUsesQuantLut(const EncodeLaunch& a);
cudaError_t LaunchEncode(const EncodeLaunch& a, cudaStream_t stream);

// Decode the rows at `slots` into dense K/V [n, heads, dim] of `dtype`
// (negative slot: zero rows). Same bad-slot contract as encode (outputs
// untouched on a bad slot).
struct DecodeLaunch {
  void* k = nullptr;
  void* v = nullptr;
  int32_t dtype = kGpuF16;
  int64_t tokens = 0;
  int32_t heads = 0;
  int32_t dim = 0;
  const int64_t* slots = nullptr;
  PageRegion k_pages, v_pages;
  const GpuComponent* k_comp = nullptr;
  const GpuComponent* v_comp = nullptr;
  int32_t max_group_channels = 0;
  unsigned long long* bad_slot = nullptr;
  // Optional host copies of k_comp / v_comp ([heads] each). With them, the
  // formats of the specialised encode (2-, 3-, 4- or 8-bit mse rows at
  // d = 128) decode with two lanes per row (gpu/kernels/decode_rows.cuh)
  // where the heads are a multiple or a divisor of 8 and the outputs are
  // 16-byte aligned; same values as the generic kernel.
  const GpuComponent* host_k = nullptr;
  const GpuComponent* host_v = nullptr;
  bool allow_fast_path = true;
};
// True when LaunchDecode(a) uses the specialised d = 128 kernel.
bool DecodeUsesFastPath(const DecodeLaunch& a);
cudaError_t LaunchDecode(const DecodeLaunch& a, cudaStream_t stream);

// Paged attention over packed K/V (decode: one query per sequence; prefill /
// chunked prefill: many queries with causal positions). Query i belongs to
// sequence query_seq[i], sits at positions[i] and attends tokens
// 0..positions[i]: tokens < packed_tokens[s] come from the pages listed in
// block_table[s, :] (arena/page slot indices; or seq_tables[s]), later ones from the dense
// tail rows tail_k/v[tail_offset[s] + (t − packed), kv_head, :].
// q: [nq, q_heads, dim] fp32; out: [nq, q_heads, dim] fp32.
struct AttentionLaunch {
  const GpuComponent* k_comp = nullptr;  // [kv_heads]
  const GpuComponent* v_comp = nullptr;
  GpuComponent host_k, host_v;           // host copies of head 0's descriptors
  const uint8_t* k_base = nullptr;
  const uint8_t* v_base = nullptr;
  int64_t block_stride = 0;
  int32_t block_size = 16;
  const int32_t* block_table = nullptr;  // [num_seqs, max_blocks]
  int32_t max_blocks = 0;
  // Optional: sequence s's table at seq_tables[s] (a device array of device
  // pointers) instead of block_table + s·max_blocks, so that tables can stay
  // on the device between calls. Kernels may read entries up to max_blocks
  // past each table's start (and use only the sequence's own): the memory
  // there must be readable.
  const int32_t* const* seq_tables = nullptr;
  const int64_t* packed_tokens = nullptr;  // [num_seqs]
  const void* tail_k = nullptr;            // [T, kv_heads, dim] of tail_dtype
  const void* tail_v = nullptr;
  int32_t tail_dtype = kGpuF16;
  const int64_t* tail_offset = nullptr;    // [num_seqs]; null when no tails
  bool has_tail = false;                   // any query reaches a tail token
  const int32_t* query_seq = nullptr;      // [nq]; null: query i belongs to sequence i (decode,
                                           // one query per sequence; spares the kernels a dependent load)
  const int64_t* positions = nullptr;      // [nq]
  int64_t num_queries = 0;
  const float* q = nullptr;
  float* out = nullptr;
  int32_t q_heads = 0, kv_heads = 0, dim = 0;
  float scale = 0;            // softmax scale (1/sqrt(dim) when 0)
  int64_t max_context = 0;    // max over queries of positions + 1 (host value)
  // Every kv head uses one K codebook and one V codebook (the same device
  // tables; DeviceCodecTables::uniform_codebooks): lets the tensor-core
  // kernels stream several kv heads per block with one dequantisation table.
  bool uniform_codebooks = false;
  // Every kv head's K rotation is one Hadamard group with host_k's block
  // structure and no channel map (DeviceCodecTables::k_head_signs): head
  // h's forward signs s1 at k_signs[2·h·dim], s2 at k_signs[(2h + 1)·dim].
  // Lets a kernel that rotates its own queries load the signs straight from
  // the launch's parameters instead of through the head's descriptor (one
  // memory latency before the first tile instead of two). Null: through
  // k_comp.
  const float* k_signs = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
// Runs `plan` (PlanAttention in gpu/attention_plan.h, made for this
// launch's host fields) with a.workspace of at least plan.workspace_bytes.
// Returns cudaErrorInvalidValue for a smaller workspace or a plan of other
// shapes, cudaErrorNotSupported for a plan no served kernel runs.
cudaError_t LaunchAttention(const AttentionLaunch& a, const AttentionPlan& plan, cudaStream_t stream);

// The profiling hook these kernels were built with (gpu/kernels/
// profile_hooks.cuh: --define=tqkv_profile=HOOK), or null in every build
// that may serve: a hook makes outputs wrong.
const char* ProfileHookName();

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_H_
