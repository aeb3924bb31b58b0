// The attention plan: which kernel a paged-attention call runs, over how
// many context splits and in how much workspace, chosen once per call from
// the served table (ServedAttentionKernels). Host code only; LaunchAttention
// (gpu/kernels.h) launches a plan and makes no choice of its own.
//
//   AttentionDevice dev;                        // once per device
//   ProbeAttentionDevice(device, &dev);
//   AttentionPlan plan;                         // per call
//   PlanAttention(launch, dev, &plan);
//   ... launch.workspace = a buffer of plan.workspace_bytes ...
//   LaunchAttention(launch, plan, stream);
#ifndef TQKV_GPU_ATTENTION_PLAN_H_
#define TQKV_GPU_ATTENTION_PLAN_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "gpu/kernels.h"

namespace tqkv::gpu {

// The decode kernels the server links (gpu/kernels/attention_*.cuh).
enum class AttnKernel : int8_t {
  kRowSets,       // a block per (query, 8 kv heads), 16 warps, 8 TMA stages, two tiles a step
  kStagedTma,     // a block per (query, kv head), 4 warps, dense stages filled by TMA tensor loads
  kStagedHoles,   // 4 warps, cp.async stages in the holes of a 256-byte-row K/V table
  kStagedHolesK,  // 8 warps, K stages in the holes of a 256-byte-row K table, V stages dense
  kTiles,         // register-buffered tensor-core tiles (attention_mma.cuh)
  kCudaCore,      // CUDA-core kernel of the specialised formats (attention_fast.cuh)
  kFormatTiles,   // tensor-core tiles of the formats compiled in gpu/format_tiles.h (attention_format_tiles.cuh)
  kFormats,       // every packed format, read at run time (attention_formats.cuh)
  kGeneric,       // every layout, fp16 layers and QJL included (attention.cuh)
};
inline constexpr int kNumAttnKernels = 9;
// "rowsets", "staged_tma", "staged_holes", "staged_holes_k", "tiles",
// "cuda_core", "format_tiles", "formats", "generic"; null for a value
// outside the enum.
const char* AttnKernelName(AttnKernel k);
// The kernel of that name, or nullopt.
std::optional<AttnKernel> AttnKernelByName(const char* name);
// The kernels that serve only the specialised formats (mse K/V of 2 or 4
// bits at d = 128, one codebook group): they share the fused merge.
constexpr bool IsSpecialised(AttnKernel k) { return k <= AttnKernel::kCudaCore; }

// One row of the served table: a kernel and the K/V index bits it is
// instantiated for (0: any, read at run time).
struct ServedKernel {
  AttnKernel kernel;
  int k_bits, v_bits;
};
// Every (kernel, bit pair) that LaunchAttention can run, in the order the
// plan prefers them; nothing else is instantiated.
std::span<const ServedKernel> ServedAttentionKernels();

// Facts of the device the plan depends on.
struct AttentionDevice {
  int num_sms = 0;
  // The driver encodes TMA tensor maps (cuTensorMapEncodeTiled): the
  // row-set and TMA-staged kernels need them.
  bool tensor_maps = false;
  // Dynamic shared memory starts where the tensor-core kernels' table
  // lookups address it (kMmaSmemWindowBase): the tensor-core kernels need it.
  bool tensor_core_smem = false;
};
// Fills *dev for CUDA device `device` (the current device afterwards): its
// SM count, the driver's TMA entry point, and one probe kernel that reads
// the shared-memory window. Returns the first CUDA error, else cudaSuccess.
// Allocates and synchronises: call at start-up, not per call.
cudaError_t ProbeAttentionDevice(int device, AttentionDevice* dev);

// Per-call geometry of the split-K kernels and their merge.
struct AttnDims {
  int sk = 0;       // query state floats
  int sv = 0;       // value state floats
  int record = 0;   // 2 + sv + dim
  int splits = 1;
  int64_t chunk = 0;  // tokens per split
  int group = 1;      // q heads per kv head
  int head_chunks = 1;
  // >= 0: GenericAttentionKernel attends only the dense tails, as this
  // split's record (the other splits' kernel takes packed tokens only).
  int tail_split = -1;
  int formats_heads = 0;  // the formats kernel's q heads per block
  int formats_cpl = 0;    // and value-state channels per lane
  int format_tiles = -1;  // the format-tiles kernel's entry of kFormatTiles (gpu/format_tiles.h)
};

struct AttentionPlan {
  AttnKernel kernel = AttnKernel::kGeneric;
  AttnDims dims;
  // The row-set and staged kernels rotate their queries themselves (a
  // Hadamard K rotation): no preparation launch.
  bool fold_query = false;
  // The fused merge (the specialised kernels and the format tiles at d =
  // 128, one V group of <= 128 channels; it attends the dense tail too)
  // instead of the generic merge.
  bool fast_merge = false;
  // Workspace: [queries, q heads, sk] query states in the first
  // states_bytes, then the split records (2 + sv + dim floats each).
  size_t states_bytes = 0;
  size_t workspace_bytes = 0;
};

// Choices a test or benchmark may force; the server plans with none.
struct PlanOverrides {
  int splits = 0;                    // > 0: this many context splits (at most 1024)
  std::optional<AttnKernel> kernel;  // this kernel instead of the preferred one
};

// Plans `a` (its host fields: shapes, descriptors, bases, max_context,
// has_tail; data pointers are not read). Returns cudaSuccess, or
// cudaErrorInvalidValue for inconsistent shapes, cudaErrorNotSupported when
// no served kernel reads the launch's layout (or the forced kernel does
// not). Deterministic in its inputs.
cudaError_t PlanAttention(const AttentionLaunch& a, const AttentionDevice& dev, AttentionPlan* plan,
                          const PlanOverrides& overrides = {});
// The served kernels that can run `a`, preferred first (the plan picks the
// first, except that row sets need enough work: RowSetMinWork).
std::vector<AttnKernel> EligibleAttentionKernels(const AttentionLaunch& a, const AttentionDevice& dev);

// Facts of the compiled kernels the plan reads, defined with them
// (attention.cu).
// Resident blocks per SM of a kernel budgeted for `mb` by its registers,
// capped by shared memory (228 KiB per SM, 1 KiB reserved per block).
constexpr int ResidentBlocks(size_t smem_per_block, int mb) {
  const int by_smem = static_cast<int>((228u * 1024u) / (smem_per_block + 1024));
  return by_smem < mb ? by_smem : mb;
}
struct KernelOccupancy {
  int blocks_per_sm = 0;       // register budget capped by shared memory; 0: not served
  int warps_per_kv_head = 0;   // warps that share one kv head's tiles
  int kv_heads_per_block = 1;
};
// A tensor-core kernel (kRowSets .. kTiles) at a served bit pair and GQA
// group 1, 2, 4 or 8.
KernelOccupancy TensorCoreOccupancy(AttnKernel kernel, int k_bits, int v_bits, int group);
// Dynamic shared memory of the formats kernel with `heads` q heads per block.
size_t FormatsKernelSmemBytes(const AttentionLaunch& a, int sk, int sv, int heads);
// Blocks per (query, kv head) of the generic kernel.
int GenericHeadChunks(int group);

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_ATTENTION_PLAN_H_
