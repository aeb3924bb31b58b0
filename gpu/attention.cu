// Launchers of the attention kernels: the device probe, the kernels' facts
// the plan reads (gpu/attention_plan.h), and the launch of a plan — one
// switch per kernel over the configurations the served table lists, each
// ending in cudaErrorNotSupported.
#include <cudaTypedefs.h>

#include <algorithm>

#include "gpu/attention_plan.h"
#include "gpu/format_tiles.h"
#include "gpu/kernels.h"
#include "gpu/kernels/attention.cuh"
#include "gpu/kernels/attention_fast.cuh"
#include "gpu/kernels/attention_formats.cuh"
#include "gpu/kernels/attention_merge.cuh"
#include "gpu/kernels/attention_mma.cuh"
#include "gpu/kernels/attention_rowset.cuh"
#include "gpu/kernels/attention_staged.cuh"
#include "gpu/kernels/profile_hooks.cuh"
#include "gpu/launch_util.h"

namespace tqkv::gpu {
namespace {

using K = AttnKernel;

// The served configurations. Tiles: the bit pair's dequantisation modes
// and blocks/SM budget (KM, MB of MmaDecodeKernel). Staged: stages per
// warp, blocks/SM, stage layout, warps, TMA. Row sets: 8 stages, two tile
// parities of 8 warps, two tiles a step (K2/V2 with 12 stages: 7% slower).
template <int KB, int VB>
struct TilesCfg;
template <>
struct TilesCfg<4, 4> {
  static constexpr int kKm = kMmaLut256 | kMmaTokM, kMb = 3;
};
template <>
struct TilesCfg<2, 4> {
  static constexpr int kKm = 0, kMb = 3;
};
template <>
struct TilesCfg<2, 2> {
  static constexpr int kKm = kMmaKReg | kMmaTokM, kMb = 4;
};
struct StagedCfg {
  int stages, blocks_per_sm, layout, warps;
  bool tma;
};
constexpr StagedCfg kStagedTmaCfg = {2, 4, kStagesDense, 4, true};
constexpr StagedCfg kStagedHolesCfg = {2, 3, kStagesHoles, 4, false};
constexpr StagedCfg kStagedHolesKCfg = {2, 2, kStagesHolesK, 8, false};
constexpr int kRowSetStages = 8, kRowSetParities = 2, kRowSetTiles = 2;

// Where a kernel without static shared memory finds its dynamic shared
// memory in the shared window (the tensor-core kernels' table lookups take
// it as an immediate, kMmaSmemWindowBase).
__global__ void SmemWindowProbeKernel(uint32_t* out) {
  extern __shared__ uint32_t probe_smem[];
  *out = static_cast<uint32_t>(__cvta_generic_to_shared(probe_smem));
}

// The driver's cuTensorMapEncodeTiled, or null where it has none.
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// The bit pairs the row sets are instantiated for (RowSetLayout).
template <int KB, int VB>
constexpr bool kRowSetBits = KB == 4 || (KB == 2 && VB == 2);

template <int KB, int VB, int G>
KernelOccupancy OccupancyWith(K kernel) {
  if constexpr (kRowSetBits<KB, VB>) {
    if (kernel == K::kRowSets) {
      using L = RowSetLayout<VB, kRowSetStages, G, kRowSetParities, KB>;
      return {ResidentBlocks(L::kBytes, kRowSetBlocksPerSm<kRowSetParities>), kRowSetParities, kRowSetHeads};
    }
  }
  if constexpr (KB == 4) {
    switch (kernel) {
      case K::kStagedTma:
        if constexpr (VB == 4) {
          constexpr StagedCfg c = kStagedTmaCfg;
          return {ResidentBlocks(StagedSmemBytes<4, true, c.layout, c.warps, c.stages, G>(), c.blocks_per_sm),
                  c.warps, 1};
        }
        break;
      case K::kStagedHoles:
        if constexpr (VB == 4) {
          constexpr StagedCfg c = kStagedHolesCfg;
          return {ResidentBlocks(StagedSmemBytes<4, true, c.layout, c.warps, c.stages, G>(), c.blocks_per_sm),
                  c.warps, 1};
        }
        break;
      case K::kStagedHolesK:
        if constexpr (VB == 2) {
          constexpr StagedCfg c = kStagedHolesKCfg;
          return {ResidentBlocks(StagedSmemBytes<2, false, c.layout, c.warps, c.stages, G>(), c.blocks_per_sm), c.warps,
                  1};
        }
        break;
      default: break;
    }
  }
  if constexpr (!(KB == 4 && VB == 2)) {
    if (kernel == K::kTiles) {
      using C = TilesCfg<KB, VB>;
      return {ResidentBlocks(MmaSmemBytes<KB, VB, G, C::kKm>(), C::kMb), kMmaWarps, 1};
    }
  }
  return {};
}

template <int KB, int VB>
KernelOccupancy OccupancyG(K kernel, int group) {
  switch (group) {
    case 1: return OccupancyWith<KB, VB, 1>(kernel);
    case 2: return OccupancyWith<KB, VB, 2>(kernel);
    case 4: return OccupancyWith<KB, VB, 4>(kernel);
    case 8: return OccupancyWith<KB, VB, 8>(kernel);
    default: return {};
  }
}


// The tensor maps of the TMA tile loads (StagedTensorMaps): per component,
// dims = bytes (elem = 1) or 4-byte words (elem = 4) of a token's rows of
// all kv heads, tokens of a page, pages; box = kbox / vbox bytes × 16
// tokens × 1 page (StagedDecodeKernel: one head's span, uint8;
// RowSetDecodeKernel: 8 heads' rows + 16 bytes, uint32). The page
// dimension spans every int32 page index (2^31), so no block-table entry
// can fall outside the map (TMA would zero-fill it silently).
cudaError_t TileMaps(const AttentionLaunch& a, int elem, uint32_t kbox, uint32_t vbox, StagedTensorMaps* m) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  // The maps depend only on the page arena's geometry, which a server keeps
  // for its lifetime: the last few per thread are reused (two encodes are
  // host time on every call otherwise).
  struct Cached {
    const uint8_t* k_base;
    const uint8_t* v_base;
    int64_t block_stride;
    int32_t block_size, kv_heads, k_row, v_row, elem;
    uint32_t kbox, vbox;
    bool operator==(const Cached&) const = default;
  };
  const Cached key = {a.k_base, a.v_base, a.block_stride, a.block_size, a.kv_heads, a.host_k.row_bytes,
                      a.host_v.row_bytes, elem, kbox, vbox};
  constexpr int kCacheSlots = 4;
  thread_local Cached keys[kCacheSlots] = {};
  thread_local StagedTensorMaps maps[kCacheSlots];
  thread_local int next_slot = 0;
  for (int i = 0; i < kCacheSlots; ++i) {
    if (keys[i] == key && key.k_base != nullptr) {
      *m = maps[i];
      return cudaSuccess;
    }
  }
  auto one = [&](CUtensorMap* map, const uint8_t* base, int row_bytes, uint32_t box_bytes) {
    const cuuint64_t step = static_cast<cuuint64_t>(a.kv_heads) * row_bytes;
    const cuuint64_t dims[3] = {step / elem, static_cast<cuuint64_t>(a.block_size), cuuint64_t{1} << 31};
    const cuuint64_t strides[2] = {step, static_cast<cuuint64_t>(a.block_stride)};
    const cuuint32_t box[3] = {box_bytes / elem, 16, 1};
    const cuuint32_t es[3] = {1, 1, 1};
    return encode(map, elem == 4 ? CU_TENSOR_MAP_DATA_TYPE_UINT32 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 3,
                  const_cast<uint8_t*>(base), dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  if (one(&m->k, a.k_base, a.host_k.row_bytes, kbox) != CUDA_SUCCESS ||
      one(&m->v, a.v_base, a.host_v.row_bytes, vbox) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  keys[next_slot] = key;
  maps[next_slot] = *m;
  next_slot = (next_slot + 1) % kCacheSlots;
  return cudaSuccess;
}

// The launch of a plan's decode kernel: grid over (query, kv head) × splits.
struct Decode {
  const AttentionLaunch& a;
  const AttentionPlan& p;
  const float* states;  // null: the kernel rotates its queries itself (AttentionPlan::fold_query)
  float* recs;
  cudaStream_t stream;
  const AttnDims& d() const { return p.dims; }
  dim3 Grid(int kv_heads_per_block = 1) const {
    return dim3(static_cast<unsigned>(a.num_queries * (a.kv_heads / kv_heads_per_block)), p.dims.splits);
  }
};

template <int KB, int VB, int G>
cudaError_t TilesWith(const Decode& x) {
  using C = TilesCfg<KB, VB>;
  constexpr size_t smem = MmaSmemBytes<KB, VB, G, C::kKm>();
  auto* kernel = MmaDecodeKernel<KB, VB, G, kMmaTilesPerStep, C::kKm, C::kMb>;
  if (smem > 48 * 1024) {
    cudaError_t e = AllowDynamicSmem(reinterpret_cast<const void*>(kernel), smem);
    if (e != cudaSuccess) return e;
  }
  kernel<<<x.Grid(), 32 * kMmaWarps, smem, x.stream>>>(x.a, x.d(), x.states, x.recs);
  return cudaGetLastError();
}

template <int VB, int G, StagedCfg C>
cudaError_t StagedWith(const Decode& x) {
  constexpr bool kShared = VB == 4;  // 4-bit V shares K's table
  constexpr size_t smem = StagedSmemBytes<VB, kShared, C.layout, C.warps, C.stages, G>();
  auto* kernel = StagedDecodeKernel<VB, G, C.stages, C.blocks_per_sm, kShared, C.layout, C.warps, C.tma>;
  cudaError_t e = AllowDynamicSmem(reinterpret_cast<const void*>(kernel), smem);
  if (e != cudaSuccess) return e;
  StagedTensorMaps maps = {};
  if constexpr (C.tma) {
    using L = StagedLayout<VB, kShared, C.layout, C.warps, C.stages>;
    e = TileMaps(x.a, 1, L::kKSpan, L::kVSpan, &maps);
    if (e != cudaSuccess) return e;
  }
  kernel<<<x.Grid(), 32 * C.warps, smem, x.stream>>>(x.a, x.d(), x.states, x.recs, maps);
  return cudaGetLastError();
}

template <int KB, int VB, int G>
cudaError_t RowSetWith(const Decode& x) {
  using L = RowSetLayout<VB, kRowSetStages, G, kRowSetParities, KB>;
  auto* kernel = RowSetDecodeKernel<VB, G, kRowSetStages, kRowSetParities, kRowSetTiles, KB>;
  cudaError_t e = AllowDynamicSmem(reinterpret_cast<const void*>(kernel), L::kBytes);
  if (e != cudaSuccess) return e;
  StagedTensorMaps maps = {};
  e = TileMaps(x.a, 4, L::kKTok, L::kVTok, &maps);
  if (e != cudaSuccess) return e;
  kernel<<<x.Grid(kRowSetHeads), 32 * kRowSetHeads * kRowSetParities, L::kBytes, x.stream>>>(x.a, x.d(), x.states,
                                                                                            x.recs, maps);
  return cudaGetLastError();
}

template <int KB, int VB, int G>
cudaError_t FastWith(const Decode& x) {
  FastDecodeKernel<KB, VB, G><<<x.Grid(), 32 * kAttnWarps, 0, x.stream>>>(x.a, x.d(), x.states, x.recs);
  return cudaGetLastError();
}

// A specialised kernel at the launch's GQA group.
template <int KB, int VB, int G>
cudaError_t SpecialisedWith(const Decode& x) {
  switch (x.p.kernel) {
    case K::kRowSets:
      if constexpr (kRowSetBits<KB, VB>) return RowSetWith<KB, VB, G>(x);
      break;
    case K::kStagedTma:
      if constexpr (KB == 4 && VB == 4) return StagedWith<4, G, kStagedTmaCfg>(x);
      break;
    case K::kStagedHoles:
      if constexpr (KB == 4 && VB == 4) return StagedWith<4, G, kStagedHolesCfg>(x);
      break;
    case K::kStagedHolesK:
      if constexpr (KB == 4 && VB == 2) return StagedWith<2, G, kStagedHolesKCfg>(x);
      break;
    case K::kTiles:
      if constexpr (!(KB == 4 && VB == 2)) return TilesWith<KB, VB, G>(x);
      break;
    case K::kCudaCore: return FastWith<KB, VB, G>(x);
    default: break;
  }
  return cudaErrorNotSupported;
}

template <int KB, int VB>
cudaError_t SpecialisedG(const Decode& x) {
  switch (x.d().group) {
    case 1: return SpecialisedWith<KB, VB, 1>(x);
    case 2: return SpecialisedWith<KB, VB, 2>(x);
    case 4: return SpecialisedWith<KB, VB, 4>(x);
    case 8: return SpecialisedWith<KB, VB, 8>(x);
    default: return cudaErrorNotSupported;
  }
}

cudaError_t LaunchSpecialised(const Decode& x) {
  switch (x.a.host_k.groups[0].mse_bits * 10 + x.a.host_v.groups[0].mse_bits) {
    case 44: return SpecialisedG<4, 4>(x);
    case 42: return SpecialisedG<4, 2>(x);
    case 24: return SpecialisedG<2, 4>(x);
    case 22: return SpecialisedG<2, 2>(x);
    default: return cudaErrorNotSupported;
  }
}

size_t GenericSmemBytes(const AttentionLaunch& a, const AttnDims& d) {
  return (kMaxHeadsPerBlock * (d.sk + a.dim) + kAttnWarps * kMaxHeadsPerBlock * (d.sv + a.dim) +
          kAttnWarps * kMaxHeadsPerBlock * 2) *
         sizeof(float);
}

// The generic kernel over every split of `d` (or, with d.tail_split >= 0,
// over the dense tails as that one split).
cudaError_t LaunchGeneric(const AttentionLaunch& a, const AttnDims& d, const float* states, float* recs,
                          cudaStream_t stream) {
  const size_t smem = GenericSmemBytes(a, d);
  if (smem > 48 * 1024) {
    cudaError_t e = AllowDynamicSmem(reinterpret_cast<const void*>(GenericAttentionKernel), smem);
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(a.num_queries * a.kv_heads * d.head_chunks), d.tail_split >= 0 ? 1 : d.splits);
  GenericAttentionKernel<<<grid, 32 * kAttnWarps, smem, stream>>>(a, d, states, recs);
  return cudaGetLastError();
}

template <int GC, int CPL>
cudaError_t FormatsWith(const Decode& x) {
  const AttnDims& d = x.d();
  const size_t smem = FormatsKernelSmemBytes(x.a, d.sk, d.sv, GC);
  cudaError_t e = AllowDynamicSmem(reinterpret_cast<const void*>(FormatDecodeKernel<GC, CPL>), smem);
  if (e != cudaSuccess) return e;
  const int packed_splits = d.tail_split >= 0 ? d.tail_split : d.splits;
  const dim3 grid(static_cast<unsigned>(x.a.num_queries * x.a.kv_heads * d.head_chunks), packed_splits);
  FormatDecodeKernel<GC, CPL><<<grid, 32 * kAttnWarps, smem, x.stream>>>(x.a, d, x.states, x.recs);
  return cudaGetLastError();
}

// The dense tails' split (AttnDims::tail_split) of a kernel that reads
// packed tokens only: the generic kernel with its own q-head chunks.
cudaError_t LaunchTailSplit(const Decode& x) {
  if (x.d().tail_split < 0) return cudaSuccess;
  AttnDims tail = x.d();
  tail.head_chunks = GenericHeadChunks(tail.group);
  return LaunchGeneric(x.a, tail, x.states, x.recs, x.stream);
}

// Dispatch on (value channels per lane, q heads per block) as planned;
// every pair the plan can choose is listed.
cudaError_t LaunchFormats(const Decode& x) {
  switch (x.d().formats_cpl * 100 + x.d().formats_heads) {
    case 201: return FormatsWith<1, 2>(x);
    case 202: return FormatsWith<2, 2>(x);
    case 204: return FormatsWith<4, 2>(x);
    case 208: return FormatsWith<8, 2>(x);
    case 301: return FormatsWith<1, 3>(x);
    case 302: return FormatsWith<2, 3>(x);
    case 304: return FormatsWith<4, 3>(x);
    case 308: return FormatsWith<8, 3>(x);
    case 401: return FormatsWith<1, 4>(x);
    case 402: return FormatsWith<2, 4>(x);
    case 404: return FormatsWith<4, 4>(x);
    case 408: return FormatsWith<8, 4>(x);
    case 801: return FormatsWith<1, 8>(x);
    case 802: return FormatsWith<2, 8>(x);
    case 804: return FormatsWith<4, 8>(x);
    case 1601: return FormatsWith<1, 16>(x);
    case 1602: return FormatsWith<2, 16>(x);
    default: return cudaErrorNotSupported;
  }
}

template <int VPL>
cudaError_t PrepareWith(const AttentionLaunch& a, const AttnDims& d, float* states, cudaStream_t st) {
  const int64_t warps = a.num_queries * a.q_heads;
  PrepareQueryKernel<VPL><<<static_cast<unsigned>((warps + kAttnWarps - 1) / kAttnWarps), 32 * kAttnWarps, 0, st>>>(
      a, d, states);
  return cudaGetLastError();
}

template <int VPL>
cudaError_t MergeWith(const AttentionLaunch& a, const AttnDims& d, const float* recs, cudaStream_t st) {
  const int64_t warps = a.num_queries * a.q_heads;
  const size_t smem = kAttnWarps * (d.sv + a.dim + VPL * 32 + d.splits) * sizeof(float);
  if (smem > 48 * 1024) {
    cudaError_t e = AllowDynamicSmem(reinterpret_cast<const void*>(MergeKernel<VPL>), smem);
    if (e != cudaSuccess) return e;
  }
  MergeKernel<VPL><<<static_cast<unsigned>((warps + kAttnWarps - 1) / kAttnWarps), 32 * kAttnWarps, smem, st>>>(
      a, d, recs, a.has_tail);
  return cudaGetLastError();
}

// Dispatch on values per lane (ceil(group channels / 32)).
template <template <int> class F, typename... Args>
cudaError_t ByVpl(const GpuComponent& c, Args&&... args) {
  switch ((std::max(c.max_group_channels, 1) + 31) / 32) {
    case 1: return F<1>::Run(args...);
    case 2: return F<2>::Run(args...);
    case 3: return F<3>::Run(args...);
    case 4: return F<4>::Run(args...);
    case 5:
    case 6: return F<6>::Run(args...);
    case 7:
    case 8: return F<8>::Run(args...);
    default: return cudaErrorNotSupported;  // groups wider than kMaxGroupChannels
  }
}
template <int V>
struct PrepareF {
  static cudaError_t Run(const AttentionLaunch& a, const AttnDims& d, float* s, cudaStream_t st) {
    return PrepareWith<V>(a, d, s, st);
  }
};
template <int V>
struct MergeF {
  static cudaError_t Run(const AttentionLaunch& a, const AttnDims& d, const float* r, cudaStream_t st) {
    return MergeWith<V>(a, d, r, st);
  }
};

// The fused merge as a programmatic dependent launch: its blocks launch and
// load their rotation factors while the decode kernel finishes.
cudaError_t LaunchFastMerge(const AttentionLaunch& a, const AttnDims& d, const float* recs, cudaStream_t stream) {
  const int warps = MergeWarps(d.splits);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(a.num_queries * a.q_heads));
  cfg.blockDim = dim3(32 * warps);
  cfg.dynamicSmemBytes = MergeSmemBytes(warps);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return a.has_tail ? cudaLaunchKernelEx(&cfg, FastMergeKernel<true>, a, d, recs)
                    : cudaLaunchKernelEx(&cfg, FastMergeKernel<false>, a, d, recs);
}

}  // namespace

cudaError_t ProbeAttentionDevice(int device, AttentionDevice* dev) {
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&dev->num_sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  dev->tensor_maps = TensorMapEncoder() != nullptr;
  uint32_t* d = nullptr;
  uint32_t base = 0;
  if ((e = cudaMalloc(&d, sizeof(uint32_t))) != cudaSuccess) return e;
  SmemWindowProbeKernel<<<1, 1, 16>>>(d);
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(&base, d, sizeof(base), cudaMemcpyDeviceToHost);
  const cudaError_t freed = cudaFree(d);
  if (e == cudaSuccess) e = freed;
  dev->tensor_core_smem = e == cudaSuccess && base == kMmaSmemWindowBase;
  return e;
}

KernelOccupancy TensorCoreOccupancy(AttnKernel kernel, int k_bits, int v_bits, int group) {
  switch (k_bits * 10 + v_bits) {
    case 44: return OccupancyG<4, 4>(kernel, group);
    case 42: return OccupancyG<4, 2>(kernel, group);
    case 24: return OccupancyG<2, 4>(kernel, group);
    case 22: return OccupancyG<2, 2>(kernel, group);
    default: return {};
  }
}

size_t FormatsKernelSmemBytes(const AttentionLaunch& a, int sk, int sv, int heads) {
  return FormatSmem::Of(a.host_k, a.host_v, sk, sv, heads).total * sizeof(float);
}

int GenericHeadChunks(int group) { return (group + kMaxHeadsPerBlock - 1) / kMaxHeadsPerBlock; }

const char* ProfileHookName() { return profile::kHookName; }

cudaError_t LaunchAttention(const AttentionLaunch& a, const AttentionPlan& plan, cudaStream_t stream) {
  if (a.num_queries == 0) return cudaSuccess;
  if (a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0 || a.dim <= 0 || plan.dims.group != a.q_heads / a.kv_heads)
    return cudaErrorInvalidValue;
  if (a.workspace_bytes < plan.workspace_bytes) return cudaErrorInvalidValue;
  AttentionLaunch l = a;
  if (l.scale == 0.0f) l.scale = 1.0f / sqrtf(static_cast<float>(a.dim));
  const AttnDims& d = plan.dims;
  float* states = static_cast<float*>(l.workspace);
  float* recs = reinterpret_cast<float*>(static_cast<char*>(l.workspace) + plan.states_bytes);
  cudaError_t e = plan.fold_query ? cudaSuccess : ByVpl<PrepareF>(l.host_k, l, d, states, stream);
  if (e != cudaSuccess) return e;
  const Decode x{l, plan, plan.fold_query ? nullptr : states, recs, stream};
  switch (plan.kernel) {
    case K::kRowSets:
    case K::kStagedTma:
    case K::kStagedHoles:
    case K::kStagedHolesK:
    case K::kTiles:
    case K::kCudaCore: e = LaunchSpecialised(x); break;
    case K::kFormatTiles:
      e = LaunchFormatTiles(l, d, states, recs, stream);
      if (e == cudaSuccess) e = LaunchTailSplit(x);
      break;
    case K::kFormats:
      e = LaunchFormats(x);
      if (e == cudaSuccess) e = LaunchTailSplit(x);
      break;
    case K::kGeneric: e = LaunchGeneric(l, d, states, recs, stream); break;
    default: e = cudaErrorNotSupported;
  }
  if (e != cudaSuccess) return e;
  if (profile::kRowsetCut >= 2 && plan.kernel == K::kRowSets) return e;
  return plan.fast_merge ? LaunchFastMerge(l, d, recs, stream) : ByVpl<MergeF>(l.host_v, l, d, recs, stream);
}

}  // namespace tqkv::gpu
