// Launchers of the attention kernels: split planning, workspace layout,
// dispatch of the fast path (switch over K bits, V bits, GQA group), of the
// formats kernel (switch over value channels per lane and q heads per
// block) and of the generic kernel (switch over values per lane).
#include <cudaTypedefs.h>

#include <algorithm>

#include "gpu/kernels.h"
#include "gpu/kernels/attention.cuh"
#include "gpu/kernels/attention_fast.cuh"
#include "gpu/kernels/attention_formats.cuh"
#include "gpu/kernels/attention_merge.cuh"
#include "gpu/kernels/attention_mma.cuh"
#include "gpu/kernels/attention_rowset.cuh"
#include "gpu/kernels/attention_staged.cuh"
#include "gpu/launch_util.h"

namespace tqkv::gpu {

// Context splits over the packed tokens for blocks of `head_chunks` per
// (query, kv head) (a formats launch with tails adds one split for them;
// Dims).
int PlanPackedSplits(const AttentionLaunch& a, int head_chunks);

namespace {

constexpr int64_t kMinSplitTokens = 256;
// Shared stages per row-set block (the most that fit 2 blocks per SM next to
// 64 KiB of tables; with 128-byte table rows 3 stages ran 4-9% slower).
constexpr int kRowSetStages = 2;
constexpr int64_t kRowSetMinTokens = 65536;  // served row sets: (query, head group) × context at least

int StateSize(const GpuComponent& c, int dim) { return c.kind == kGpuDense ? dim : c.state_size; }
int Vpl(const GpuComponent& c) { return (std::max(c.max_group_channels, 1) + 31) / 32; }

// The fast merge's V layout: one group of <= 128 state channels at offset
// 0 (it applies Πᵀ with one warp's strided registers).
bool FastMergeFits(const GpuComponent& v) {
  return v.num_groups == 1 && v.groups[0].channels <= 128 && v.groups[0].state_offset == 0 && v.state_size <= 128;
}

// Launches with a dense tail take the fast path only where the fast merge
// runs, since that merge attends the tail (TailState).
bool FastEligible(const AttentionLaunch& a) {
  const GpuComponent& k = a.host_k;
  const GpuComponent& v = a.host_v;
  if (!a.allow_fast_path || a.dim != 128) return false;
  if (a.has_tail && !FastMergeFits(v)) return false;
  if (k.kind != kGpuMse || v.kind != kGpuMse || k.groups[0].qjl || v.groups[0].qjl) return false;
  const int kb = k.groups[0].mse_bits, vb = v.groups[0].mse_bits;
  if ((kb != 2 && kb != 4) || (vb != 2 && vb != 4)) return false;
  const int g = a.q_heads / a.kv_heads;
  if (g != 1 && g != 2 && g != 4 && g != 8) return false;
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3) == 0; };
  return aligned(a.k_base) && aligned(a.v_base) && a.block_stride % 4 == 0 && k.row_bytes % 4 == 0 &&
         v.row_bytes % 4 == 0;
}

// Value-state channels per lane of the formats kernel (lane l owns channels
// l·CPL .. l·CPL + CPL − 1); 0: the state is wider than it is instantiated
// for.
int FormatsCpl(int sv) {
  if (sv <= 64) return 2;
  if (sv <= 96) return 3;
  if (sv <= 128) return 4;
  if (sv <= 256) return 8;
  if (sv <= 512) return 16;
  return 0;
}

// Q heads per formats-kernel block: the GQA group rounded up to a power of
// two, at most 8 and at most 32 accumulators per lane.
int FormatsHeads(int group, int cpl) {
  int gc = 1;
  while (gc < group && gc < 8 && 2 * gc * cpl <= 32) gc *= 2;
  return gc;
}

constexpr size_t kFormatsMaxSmem = 160 * 1024;

// The formats kernel (attention_formats.cuh) serves packed mse or recipe
// K/V of up to 8 bits per index where no specialised kernel applies: its q
// heads per block (FormatsHeads), or 0 where it does not serve the launch.
int FormatsBlockHeads(const AttentionLaunch& a) {
  if (!a.allow_fast_path || FastEligible(a)) return 0;
  for (const GpuComponent* c : {&a.host_k, &a.host_v}) {
    if (c->kind == kGpuDense || c->num_groups < 1 || c->num_groups > 2) return 0;
    for (int gi = 0; gi < c->num_groups; ++gi)
      if (c->groups[gi].mse_bits < 1 || c->groups[gi].mse_bits > 8) return 0;
  }
  const int sv = StateSize(a.host_v, a.dim), sk = StateSize(a.host_k, a.dim);
  const int cpl = FormatsCpl(sv);
  if (cpl == 0) return 0;
  const int gc = FormatsHeads(a.q_heads / a.kv_heads, cpl);
  return FormatSmem::Of(a.host_k, a.host_v, sk, sv, gc).total * sizeof(float) <= kFormatsMaxSmem ? gc : 0;
}

// Blocks per (query, kv head) of the generic kernel.
int GenericHeadChunks(int group) { return (group + kMaxHeadsPerBlock - 1) / kMaxHeadsPerBlock; }

// Where a kernel without static shared memory finds its dynamic shared
// memory in the shared window (the tensor-core kernel's table lookups take
// it as an immediate, kMmaSmemWindowBase).
__global__ void SmemWindowProbeKernel(uint32_t* out) {
  extern __shared__ uint32_t probe_smem[];
  *out = static_cast<uint32_t>(__cvta_generic_to_shared(probe_smem));
}

// Measured once per process; 0 if the probe could not run.
uint32_t MmaSmemWindowBase() {
  static const uint32_t base = [] {
    uint32_t* d = nullptr;
    uint32_t h = 0;
    if (cudaMalloc(&d, sizeof(uint32_t)) != cudaSuccess) return (cudaGetLastError(), 0u);
    SmemWindowProbeKernel<<<1, 1, 16>>>(d);
    if (cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost) != cudaSuccess) h = 0;
    cudaFree(d);
    cudaGetLastError();
    return h;
  }();
  return base;
}

// The tensor-core kernel (attention_mma.cuh): the fast path's formats with
// fp32 norms right after the indices, rows at 4 mod 16 bytes with
// kv_heads % 4 == 0 (one misalignment per kv head), 16-byte aligned pages,
// pages of a power-of-two number of whole 16-token tiles, and dynamic
// shared memory where the kernel expects it.
bool MmaEligible(const AttentionLaunch& a) {
  if (!FastEligible(a) || !a.allow_mma_path) return false;
  for (const GpuComponent* c : {&a.host_k, &a.host_v}) {
    const GpuGroup& g = c->groups[0];
    const int b = g.mse_bits;
    if (c->num_groups != 1 || g.channels != 128 || g.fp16_norms || g.index_offset != 0 || g.norm_offset != 16 * b ||
        c->row_bytes != 16 * b + 4 || c->state_size != 128)
      return false;
  }
  auto aligned16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  const bool pow2 = (a.block_size & (a.block_size - 1)) == 0;
  return a.kv_heads % 4 == 0 && a.block_size % 16 == 0 && pow2 && a.block_stride % 16 == 0 && aligned16(a.k_base) &&
         aligned16(a.v_base) && MmaSmemWindowBase() == kMmaSmemWindowBase;
}

// The driver's cuTensorMapEncodeTiled (null where the driver has none: the
// TMA variant is then not chosen).
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

// Tensor-core kernel configuration by variant: MmaDecodeKernel's
// dequantisation mode flags (kMmaKReg, kMmaLut256, kMmaOneBuf, kMmaTokM)
// and the blocks/SM its registers are budgeted for, or a
// StagedDecodeKernel configuration. Entry 0 is unused: variant 0 (served)
// is chosen per launch from the H200 measurements (bench/RESULTS.md) in
// MmaCfgOf: k4v2, and k4v4 with one K/V codebook, take the staged kernel;
// the register-buffered kernel (MmaServedCfg) serves the rest: k4v4 with
// 256-byte table rows (2-4% faster), k2v2 K centroids in registers at 4
// blocks/SM (3-13% faster), k2v4 (unmeasured) 128-byte rows, all but k2v4
// with tokens-on-M scores (1-3% faster for 4-bit keys; 7-13% for k2v2 since
// the page stream). Variant 8 adds kMmaTokM to MmaServedCfg of any bit
// pair. Retired variants (measured slower and deleted; bench/RESULTS.md)
// run the served configuration: 2 (page streaming), 9-11 (one K/V table of
// 128-byte rows in the register-buffered kernel), 12 (4 stages per warp).
struct MmaCfg {
  int km, mb;
  int stages = 0;  // > 0: StagedDecodeKernel with this many stages per warp,
  int mode = kStagesDense;  // where they live (StagedLayout),
  int warps = kMmaWarps;    // and warps per block,
  bool tma = false;         // rows arrive as tensor loads (dense stages)
  bool rowset = false;      // RowSetDecodeKernel: 8 kv heads per block, `stages` per block,
                            // warps / 8 tile parities,
  int tiles = 1;            // and tiles per step
};
constexpr MmaCfg kMmaCfgs[] = {{0, 3},
                               {0, 3},
                               {0, 3},  // 2: retired
                               {kMmaKReg, 3},
                               {kMmaKReg, 4},
                               {kMmaLut256, 3},
                               {kMmaKReg | kMmaLut256, 3},
                               {kMmaKReg | kMmaOneBuf, 4},
                               {0, 3},  // 8: kMmaTokMVariant
                               {0, 3},  // 9-12: retired
                               {0, 3},
                               {0, 3},
                               {0, 3},
                               {kMmaTokM, 4, 2},
                               {kMmaTokM, 3, 2, kStagesHoles},
                               {kMmaTokM, 2, 2, kStagesHolesK, 8},
                               {kMmaTokM, 4, 2, kStagesDense, 4, true},
                               {kMmaTokM | kMmaLut256, 2, kRowSetStages, kStagesDense, 8, true, true},
                               {kMmaTokM | kMmaLut256, 1, 4, kStagesDense, 16, true, true},
                               {kMmaTokM | kMmaLut256, 1, 8, kStagesDense, 16, true, true},
                               {kMmaTokM | kMmaLut256, 1, 8, kStagesDense, 16, true, true, 2}};
constexpr int kNumMmaCfgs = sizeof(kMmaCfgs) / sizeof(kMmaCfgs[0]);
// Variant 8 ("tokm"): the served configuration of the bit pair with
// tokens-on-M scores (kMmaTokM).
constexpr int kMmaTokMVariant = 8;
constexpr bool MmaVariantRetired(int v) { return v == 2 || (v >= 9 && v <= 12); }

// Row sets need whole groups of kRowSetHeads kv heads that share one table
// (uniform codebooks).
bool RowSetsFit(const AttentionLaunch& a) { return a.kv_heads % kRowSetHeads == 0 && a.uniform_codebooks; }

// The served configuration of a bit pair.
constexpr MmaCfg MmaServedCfg(int kb, int vb) {
  switch (kb * 10 + vb) {
    case 44: return {kMmaLut256 | kMmaTokM, 3};
    case 42: return {kMmaTokM, 3};
    case 22: return {kMmaKReg | kMmaTokM, 4};
    default: return {0, 3};
  }
}

// The configuration this launch runs: register dequantisation of 4-bit
// keys only with symmetric codebooks; 256-byte rows only where a table of
// byte units is left.
MmaCfg MmaCfgOf(const AttentionLaunch& a) {
  const int kb = a.host_k.groups[0].mse_bits, vb = a.host_v.groups[0].mse_bits;
  const int v = MmaVariantRetired(a.mma_variant) ? 0 : a.mma_variant;
  const bool one_codebook = kb == vb && a.uniform_codebooks &&
                            a.host_k.groups[0].centroids == a.host_v.groups[0].centroids;
  MmaCfg c = v > 0 && v < kNumMmaCfgs && v != kMmaTokMVariant ? kMmaCfgs[v] : MmaServedCfg(kb, vb);
  // Served k4v2: the staged kernel with 8 warps per block and the K stages
  // in the 256-byte-row K table's holes (variant 15, 8-10% faster than 4
  // warps with 128-byte rows). k4v4 with one codebook: dense stages filled
  // by TMA tensor loads, 4 blocks/SM (variant 16: 0-10% faster than the
  // holes layouts 14 / 15 at every benchmark shape, 7% at 32 × 32K, in one
  // run; for k4v2 mixed, -4..+6%). All 3-14% faster than the
  // register-buffered kernels (bench/RESULTS.md).
  if (v <= 0 && kb == 4 && vb == 2) c = kMmaCfgs[15];
  if (v <= 0 && kb == 4 && vb == 4 && one_codebook) c = kMmaCfgs[TensorMapEncoder() != nullptr ? 16 : 14];
  // Row sets of 16 warps with 8 stages, two tiles per step (variant 20)
  // wherever they apply and the (query, head group) pairs hold >=
  // kRowSetMinTokens tokens of context in all. 16-warp row sets (19) were
  // 3-6% faster than the 8-warp row sets (17) for TQ4 and 5-11% for K4/V2
  // at the four batch shapes, 4-11% faster than 16 / 15 at 1 × 64K and
  // 1 × 128K, even at 2 × 32K; two tiles per step are 1-5% faster again
  // (K4/V2 at 32 × 32K: 0.269 vs 0.284 ms). With less work their ~9 µs
  // block prologue loses to the smaller blocks of 16 / 15 (1 × 32K: 0.037
  // vs 0.033 ms, 1 × 8K: 0.032 vs 0.023; bench/RESULTS.md).
  if (v <= 0 && kb == 4 && (vb == 2 || one_codebook) && RowSetsFit(a) &&
      a.num_queries * (a.kv_heads / kRowSetHeads) * a.max_context >= kRowSetMinTokens)
    c = kMmaCfgs[20];
  if (v == kMmaTokMVariant) c.km |= kMmaTokM;
  if (v > kMmaTokMVariant && v < kNumMmaCfgs && kb != 4) c = MmaServedCfg(kb, vb);  // 13-20: 4-bit keys
  // The staged kernel: 4-bit keys with 2-bit values or one K/V codebook;
  // stages in the table's holes only with one codebook.
  if (c.mode == kStagesHoles && !(kb == 4 && vb == 4 && one_codebook)) c = kMmaCfgs[13];
  if (c.stages > 0 && !(kb == 4 && (vb == 2 || one_codebook))) c = MmaServedCfg(kb, vb);
  if (c.rowset && !RowSetsFit(a)) c = kMmaCfgs[vb == 4 ? 16 : 15];
  if (c.tma && TensorMapEncoder() == nullptr) c = kMmaCfgs[13];
  if ((c.km & kMmaKReg) && kb == 4 && !a.symmetric_codebooks) c.km &= ~kMmaKReg;
  const bool k_bytes = kb == 4 && !(c.km & kMmaKReg);
  if ((c.km & kMmaLut256) && !k_bytes && vb != 4) c.km &= ~kMmaLut256;
  return c;
}

// Binds the configuration; F::template operator()<KM, MB>() is called with it.
template <typename F>
auto ByMmaCfg(const MmaCfg& c, F&& f) {
  switch (c.km * 10 + c.mb) {
    case kMmaKReg * 10 + 3: return f.template operator()<kMmaKReg, 3>();
    case kMmaKReg * 10 + 4: return f.template operator()<kMmaKReg, 4>();
    case kMmaLut256 * 10 + 3: return f.template operator()<kMmaLut256, 3>();
    case (kMmaKReg | kMmaLut256) * 10 + 3: return f.template operator()<kMmaKReg | kMmaLut256, 3>();
    case (kMmaKReg | kMmaOneBuf) * 10 + 4: return f.template operator()<kMmaKReg | kMmaOneBuf, 4>();
    case kMmaOneBuf * 10 + 4: return f.template operator()<kMmaOneBuf, 4>();
    case kMmaTokM * 10 + 3: return f.template operator()<kMmaTokM, 3>();
    case (kMmaTokM | kMmaLut256) * 10 + 3: return f.template operator()<kMmaTokM | kMmaLut256, 3>();
    case (kMmaTokM | kMmaKReg) * 10 + 4: return f.template operator()<kMmaTokM | kMmaKReg, 4>();
    default: return f.template operator()<0, 3>();
  }
}

// Resident blocks per SM of a configuration: its register budget, capped by
// shared memory (228 KiB per SM, 1 KiB reserved per block).
template <int KB, int VB, int G, int KM, int MB>
constexpr int MmaResidentWith() {
  const size_t per_block = MmaSmemBytes<KB, VB, G, KM>() + 1024;
  const int by_smem = static_cast<int>((228u * 1024u) / per_block);
  return by_smem < MB ? by_smem : MB;
}

// f.template operator()<KB, VB, G>() for the launch's bit pair and GQA
// group, for occupancy planning (a pair or group the kernels do not serve
// takes the last case; the launchers reject it).
template <typename F>
int ByBitsAndGroup(const AttentionLaunch& a, F&& f) {
  const int kb = a.host_k.groups[0].mse_bits, vb = a.host_v.groups[0].mse_bits, g = a.q_heads / a.kv_heads;
  auto by_g = [&]<int KB, int VB>() -> int {
    switch (g) {
      case 1: return f.template operator()<KB, VB, 1>();
      case 2: return f.template operator()<KB, VB, 2>();
      case 4: return f.template operator()<KB, VB, 4>();
      default: return f.template operator()<KB, VB, 8>();
    }
  };
  switch (kb * 10 + vb) {
    case 44: return by_g.template operator()<4, 4>();
    case 42: return by_g.template operator()<4, 2>();
    case 24: return by_g.template operator()<2, 4>();
    default: return by_g.template operator()<2, 2>();
  }
}

// Resident staged-kernel blocks per SM: its register budget, capped by
// shared memory.
template <int VB, int G, int S, int MB, int M, int NW>
constexpr int StagedResidentWith() {
  constexpr int mode = M == kStagesHoles && VB != 4 ? kStagesDense : M;
  const size_t per_block = StagedSmemBytes<VB, VB == 4, mode, NW, S, G>() + 1024;
  const int by_smem = static_cast<int>((228u * 1024u) / per_block);
  return by_smem < MB ? by_smem : MB;
}

// f.template operator()<S, MB, M, NW, T>() for a staged configuration (T:
// kTma).
template <typename F>
auto ByStagedCfg(const MmaCfg& c, F&& f) {
  if (c.mode == kStagesHoles) return f.template operator()<2, 3, kStagesHoles, 4, false>();
  if (c.mode == kStagesHolesK) return f.template operator()<2, 2, kStagesHolesK, 8, false>();
  return c.tma ? f.template operator()<2, 4, kStagesDense, 4, true>()
               : f.template operator()<2, 4, kStagesDense, 4, false>();
}

// Resident row-set blocks per SM: kRowSetBlocksPerSm<P> by registers,
// capped by shared memory.
template <int VB, int G, int S, int P>
constexpr int RowSetResidentWith() {
  const size_t per_block = RowSetLayout<VB, S, G, P>::kBytes + 1024;
  const int by_smem = static_cast<int>((228u * 1024u) / per_block);
  return by_smem < kRowSetBlocksPerSm<P> ? by_smem : kRowSetBlocksPerSm<P>;
}

// The row-set configurations: (stages, parities, tiles per step) of a
// rowset MmaCfg.
template <typename F>
auto ByRowSetCfg(const MmaCfg& c, F&& f) {
  if (c.warps == 2 * kRowSetHeads) {
    if (c.stages == 8) return c.tiles == 2 ? f.template operator()<8, 2, 2>() : f.template operator()<8, 2, 1>();
    return f.template operator()<4, 2, 1>();
  }
  return f.template operator()<kRowSetStages, 1, 1>();
}

int MmaResident(const AttentionLaunch& a) {
  const MmaCfg cfg = MmaCfgOf(a);
  if (cfg.rowset) {
    return ByRowSetCfg(cfg, [&]<int S, int P, int T>() {
      return ByBitsAndGroup(a, []<int KB, int VB, int G>() { return RowSetResidentWith<VB == 4 ? 4 : 2, G, S, P>(); });
    });
  }
  if (cfg.stages > 0) {
    return ByStagedCfg(cfg, [&]<int S, int MB, int M, int NW, bool T>() -> int {
      return ByBitsAndGroup(a, []<int KB, int VB, int G>() { return StagedResidentWith<VB, G, S, MB, M, NW>(); });
    });
  }
  return ByMmaCfg(cfg, [&]<int KM, int MB>() -> int {
    return ByBitsAndGroup(a, []<int KB, int VB, int G>() { return MmaResidentWith<KB, VB, G, KM, MB>(); });
  });
}

// The staged kernel rotates its block's queries itself (states == null)
// where the K rotation is a block Hadamard: no preparation launch.
bool StagedFoldsQuery(const AttentionLaunch& a) {
  return MmaEligible(a) && MmaCfgOf(a).stages > 0 && a.host_k.groups[0].rotation == kGpuHadamard;
}

// Merge kernel of the specialised paths: one group of <= 128 channels.
bool FastMergeEligible(const AttentionLaunch& a) { return FastEligible(a) && FastMergeFits(a.host_v); }

AttnDims Dims(const AttentionLaunch& a) {
  AttnDims d;
  d.sk = StateSize(a.host_k, a.dim);
  d.sv = StateSize(a.host_v, a.dim);
  d.record = 2 + d.sv + a.dim;
  d.group = a.q_heads / a.kv_heads;
  d.formats_heads = FormatsBlockHeads(a);
  d.head_chunks = FastEligible(a)       ? 1
                  : d.formats_heads > 0 ? (d.group + d.formats_heads - 1) / d.formats_heads
                                        : GenericHeadChunks(d.group);
  d.splits = PlanPackedSplits(a, d.head_chunks);
  const int64_t ctx = std::max<int64_t>(a.max_context, 1);
  d.chunk = (ctx + d.splits - 1) / d.splits;
  d.chunk = (d.chunk + 127) / 128 * 128;
  if (a.has_tail && d.formats_heads > 0) d.tail_split = d.splits++;
  return d;
}

size_t StatesBytes(const AttentionLaunch& a, const AttnDims& d) {
  return ((static_cast<size_t>(a.num_queries) * a.q_heads * d.sk * sizeof(float)) + 255) / 256 * 256;
}

// States, then the split records.
size_t WorkspaceBytes(const AttentionLaunch& a, const AttnDims& d) {
  return StatesBytes(a, d) + static_cast<size_t>(a.num_queries) * a.q_heads * d.splits * d.record * sizeof(float);
}

template <int KB, int VB, int G>
cudaError_t FastWith(const AttentionLaunch& a, const AttnDims& d, const float* states, float* recs,
                     cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.num_queries * a.kv_heads), d.splits);
  FastDecodeKernel<KB, VB, G><<<grid, 32 * kAttnWarps, 0, stream>>>(a, d, states, recs);
  return cudaGetLastError();
}

template <int KB, int VB>
cudaError_t FastG(const AttentionLaunch& a, const AttnDims& d, const float* s, float* r, cudaStream_t st) {
  switch (d.group) {
    case 1: return FastWith<KB, VB, 1>(a, d, s, r, st);
    case 2: return FastWith<KB, VB, 2>(a, d, s, r, st);
    case 4: return FastWith<KB, VB, 4>(a, d, s, r, st);
    case 8: return FastWith<KB, VB, 8>(a, d, s, r, st);
    default: return cudaErrorNotSupported;
  }
}

template <int KB, int VB, int G, int TPS, int KM, int MB>
cudaError_t MmaWithTps(const AttentionLaunch& a, const AttnDims& d, const float* states, float* recs,
                       cudaStream_t stream) {
  constexpr MmaCfg served = MmaServedCfg(KB, VB);
  // Tokens-on-M scores: only the bit pair's served configuration.
  constexpr bool tokm_served = KM == (served.km | kMmaTokM) && MB == served.mb;
  if constexpr ((KM & kMmaTokM) != 0 && !tokm_served) {
    return cudaErrorNotSupported;
  } else {
    constexpr size_t smem = MmaSmemBytes<KB, VB, G, KM>();
    if (smem > 48 * 1024) {
      cudaError_t e =
          AllowDynamicSmem(reinterpret_cast<const void*>(MmaDecodeKernel<KB, VB, G, TPS, KM, MB>), smem);
      if (e != cudaSuccess) return e;
    }
    const dim3 grid(static_cast<unsigned>(a.num_queries * a.kv_heads), d.splits);
    MmaDecodeKernel<KB, VB, G, TPS, KM, MB><<<grid, 32 * kMmaWarps, smem, stream>>>(a, d, states, recs);
    return cudaGetLastError();
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

template <int VB, int G, int S, int MB, int M, int NW, bool T>
cudaError_t StagedWith(const AttentionLaunch& a, const AttnDims& d, const float* states, float* recs,
                       cudaStream_t stream) {
  constexpr bool kShared = VB == 4;  // 4-bit V only with K's codebook (MmaCfgOf)
  if constexpr (M == kStagesHoles && !kShared) {
    return cudaErrorNotSupported;  // MmaCfgOf gives all-holes stages only to one K/V codebook
  } else {
    constexpr size_t smem = StagedSmemBytes<VB, kShared, M, NW, S, G>();
    cudaError_t e =
        AllowDynamicSmem(reinterpret_cast<const void*>(StagedDecodeKernel<VB, G, S, MB, kShared, M, NW, T>), smem);
    if (e != cudaSuccess) return e;
    const dim3 grid(static_cast<unsigned>(a.num_queries * a.kv_heads), d.splits);
    StagedTensorMaps maps = {};
    if constexpr (T) {
      using L = StagedLayout<VB, kShared, M, NW, S>;
      e = TileMaps(a, 1, L::kKSpan, L::kVSpan, &maps);
      if (e != cudaSuccess) return e;
    }
    StagedDecodeKernel<VB, G, S, MB, kShared, M, NW, T><<<grid, 32 * NW, smem, stream>>>(a, d, states, recs, maps);
    return cudaGetLastError();
  }
}

template <int VB, int G, int S, int P, int T>
cudaError_t RowSetWith(const AttentionLaunch& a, const AttnDims& d, const float* states, float* recs,
                       cudaStream_t stream) {
  using L = RowSetLayout<VB, S, G, P>;
  cudaError_t e = AllowDynamicSmem(reinterpret_cast<const void*>(RowSetDecodeKernel<VB, G, S, P, T>), L::kBytes);
  if (e != cudaSuccess) return e;
  StagedTensorMaps maps = {};
  e = TileMaps(a, 4, L::kKTok, L::kVTok, &maps);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(a.num_queries * (a.kv_heads / kRowSetHeads)), d.splits);
  RowSetDecodeKernel<VB, G, S, P, T><<<grid, 32 * kRowSetHeads * P, L::kBytes, stream>>>(a, d, states, recs, maps);
  return cudaGetLastError();
}

template <int KB, int VB, int G>
cudaError_t MmaWith(const AttentionLaunch& a, const AttnDims& d, const float* states, float* recs,
                    cudaStream_t stream) {
  const MmaCfg cfg = MmaCfgOf(a);
  if constexpr (KB == 4) {
    if (cfg.rowset) {
      return ByRowSetCfg(cfg, [&]<int S, int P, int T>() {
        return RowSetWith<VB, G, S, P, T>(a, d, states, recs, stream);
      });
    }
    if (cfg.stages > 0) {
      return ByStagedCfg(cfg, [&]<int S, int MB, int M, int NW, bool T>() -> cudaError_t {
        return StagedWith<VB, G, S, MB, M, NW, T>(a, d, states, recs, stream);
      });
    }
  }
  return ByMmaCfg(cfg, [&]<int KM, int MB>() -> cudaError_t {
    return MmaWithTps<KB, VB, G, kMmaTilesPerStep, KM, MB>(a, d, states, recs, stream);
  });
}

template <int KB, int VB>
cudaError_t MmaG(const AttentionLaunch& a, const AttnDims& d, const float* s, float* r, cudaStream_t st) {
  switch (d.group) {
    case 1: return MmaWith<KB, VB, 1>(a, d, s, r, st);
    case 2: return MmaWith<KB, VB, 2>(a, d, s, r, st);
    case 4: return MmaWith<KB, VB, 4>(a, d, s, r, st);
    case 8: return MmaWith<KB, VB, 8>(a, d, s, r, st);
    default: return cudaErrorNotSupported;
  }
}

cudaError_t LaunchMma(const AttentionLaunch& a, const AttnDims& d, const float* s, float* r, cudaStream_t st) {
  const int kb = a.host_k.groups[0].mse_bits, vb = a.host_v.groups[0].mse_bits;
  switch (kb * 10 + vb) {
    case 44: return MmaG<4, 4>(a, d, s, r, st);
    case 42: return MmaG<4, 2>(a, d, s, r, st);
    case 24: return MmaG<2, 4>(a, d, s, r, st);
    case 22: return MmaG<2, 2>(a, d, s, r, st);
    default: return cudaErrorNotSupported;
  }
}

cudaError_t LaunchFast(const AttentionLaunch& a, const AttnDims& d, const float* s, float* r,
                       cudaStream_t st) {
  const int kb = a.host_k.groups[0].mse_bits, vb = a.host_v.groups[0].mse_bits;
  switch (kb * 10 + vb) {
    case 44: return FastG<4, 4>(a, d, s, r, st);
    case 42: return FastG<4, 2>(a, d, s, r, st);
    case 24: return FastG<2, 4>(a, d, s, r, st);
    case 22: return FastG<2, 2>(a, d, s, r, st);
    default: return cudaErrorNotSupported;
  }
}

// The generic kernel over every split of `d` (or, with d.tail_split >= 0,
// over the dense tails as that one split).
cudaError_t LaunchGeneric(const AttentionLaunch& a, const AttnDims& d, const float* states, float* recs,
                          cudaStream_t stream) {
  const size_t smem = (kMaxHeadsPerBlock * (d.sk + a.dim) + kAttnWarps * kMaxHeadsPerBlock * (d.sv + a.dim) +
                       kAttnWarps * kMaxHeadsPerBlock * 2) *
                      sizeof(float);
  if (smem > 48 * 1024) {
    cudaError_t e = AllowDynamicSmem(reinterpret_cast<const void*>(GenericAttentionKernel), smem);
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(a.num_queries * a.kv_heads * d.head_chunks), d.tail_split >= 0 ? 1 : d.splits);
  GenericAttentionKernel<<<grid, 32 * kAttnWarps, smem, stream>>>(a, d, states, recs);
  return cudaGetLastError();
}

template <int GC, int CPL>
cudaError_t FormatsWith(const AttentionLaunch& a, const AttnDims& d, const float* states, float* recs,
                        cudaStream_t stream) {
  const size_t smem = FormatSmem::Of(a.host_k, a.host_v, d.sk, d.sv, GC).total * sizeof(float);
  cudaError_t e = AllowDynamicSmem(reinterpret_cast<const void*>(FormatDecodeKernel<GC, CPL>), smem);
  if (e != cudaSuccess) return e;
  const int packed_splits = d.tail_split >= 0 ? d.tail_split : d.splits;
  const dim3 grid(static_cast<unsigned>(a.num_queries * a.kv_heads * d.head_chunks), packed_splits);
  FormatDecodeKernel<GC, CPL><<<grid, 32 * kAttnWarps, smem, stream>>>(a, d, states, recs);
  e = cudaGetLastError();
  if (e != cudaSuccess || d.tail_split < 0) return e;
  AttnDims tail = d;  // the generic kernel's own q-head chunks
  tail.head_chunks = GenericHeadChunks(d.group);
  return LaunchGeneric(a, tail, states, recs, stream);
}

// Dispatch on (value channels per lane, q heads per block as planned);
// every pair FormatsHeads can return is listed.
cudaError_t LaunchFormats(const AttentionLaunch& a, const AttnDims& d, const float* s, float* r, cudaStream_t st) {
  switch (FormatsCpl(d.sv) * 100 + d.formats_heads) {
    case 201: return FormatsWith<1, 2>(a, d, s, r, st);
    case 202: return FormatsWith<2, 2>(a, d, s, r, st);
    case 204: return FormatsWith<4, 2>(a, d, s, r, st);
    case 208: return FormatsWith<8, 2>(a, d, s, r, st);
    case 301: return FormatsWith<1, 3>(a, d, s, r, st);
    case 302: return FormatsWith<2, 3>(a, d, s, r, st);
    case 304: return FormatsWith<4, 3>(a, d, s, r, st);
    case 308: return FormatsWith<8, 3>(a, d, s, r, st);
    case 401: return FormatsWith<1, 4>(a, d, s, r, st);
    case 402: return FormatsWith<2, 4>(a, d, s, r, st);
    case 404: return FormatsWith<4, 4>(a, d, s, r, st);
    case 408: return FormatsWith<8, 4>(a, d, s, r, st);
    case 801: return FormatsWith<1, 8>(a, d, s, r, st);
    case 802: return FormatsWith<2, 8>(a, d, s, r, st);
    case 804: return FormatsWith<4, 8>(a, d, s, r, st);
    case 1601: return FormatsWith<1, 16>(a, d, s, r, st);
    case 1602: return FormatsWith<2, 16>(a, d, s, r, st);
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
  const size_t smem = kAttnWarps * (d.sv + a.dim + VPL * 32) * sizeof(float);
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
cudaError_t ByVpl(int vpl, Args&&... args) {
  switch (vpl) {
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

}  // namespace

int PlanAttentionSplits(const AttentionLaunch& a) { return Dims(a).splits; }

int PlanPackedSplits(const AttentionLaunch& a, int head_chunks) {
  if (a.splits > 0) return std::min(a.splits, 1024);  // the merge kernels take <= 1024 splits
  if (MmaEligible(a)) {
    // Fewest waves of resident blocks × tokens per block, plus a per-block
    // overhead (tables, merge) worth ~kMmaBlockOverheadTokens tokens.
    constexpr int64_t kMmaBlockOverheadTokens = 192;  // at 4 warps per block
    const MmaCfg cfg = MmaCfgOf(a);
    // Warps per kv head of a block (row sets: one per kv head and tile parity).
    const int64_t warps = cfg.rowset ? cfg.warps / kRowSetHeads : cfg.stages > 0 ? cfg.warps : kMmaWarps;
    const int64_t heads_per_block = cfg.rowset ? kRowSetHeads : 1;
    const int64_t blocks = std::max<int64_t>(1, a.num_queries * a.kv_heads / heads_per_block);
    const int64_t resident = static_cast<int64_t>(std::max(a.num_sms, 1)) * MmaResident(a);
    const int64_t ctx = std::max<int64_t>(a.max_context, 1);
    const int64_t max_splits = std::clamp<int64_t>((ctx + kMinSplitTokens - 1) / kMinSplitTokens, 1, 1024);
    // A split count s is usable when no smaller count gives the same chunk
    // (chunks are whole 128-token steps); a block's time is its chunk over
    // its warps, plus the overhead.
    auto chunk_of = [&](int64_t s) { return ((ctx + s - 1) / s + 127) / 128 * 128; };
    auto usable = [&](int64_t s) {
      const int64_t chunk = chunk_of(s);
      return (ctx + chunk - 1) / chunk == s;
    };
    auto cost_of = [&](int64_t s) {
      const int64_t waves = (blocks * s + resident - 1) / resident;
      return static_cast<double>(waves) *
             (static_cast<double>(chunk_of(s)) / warps + kMmaBlockOverheadTokens / kMmaWarps);
    };
    // Among the usable counts with the same number of waves the largest has
    // the smallest chunk, so only that one per wave count can be best (the
    // first of equal costs wins, as in a scan over every s; a scan cost ~5
    // µs of host time per call at 512 candidates).
    int64_t best = 1;
    double best_cost = cost_of(1);
    for (int64_t lo = 2; lo <= max_splits;) {
      const int64_t waves = (blocks * lo + resident - 1) / resident;
      const int64_t hi = std::min(max_splits, waves * resident / blocks);  // the last count with these waves
      int64_t s = hi;
      while (s >= lo && !usable(s)) --s;
      if (s >= lo) {
        const double cost = cost_of(s);
        if (cost < best_cost) {
          best = s;
          best_cost = cost;
        }
      }
      lo = hi + 1;
    }
    return static_cast<int>(best);
  }
  const int64_t blocks = std::max<int64_t>(1, a.num_queries * a.kv_heads * head_chunks);
  const int64_t target = static_cast<int64_t>(std::max(a.num_sms, 1)) * 8;
  int64_t splits = (target + blocks - 1) / blocks;
  const int64_t by_ctx = std::max<int64_t>(1, (a.max_context + kMinSplitTokens - 1) / kMinSplitTokens);
  splits = std::clamp<int64_t>(splits, 1, by_ctx);
  return static_cast<int>(std::min<int64_t>(splits, 1024));
}

bool AttentionUsesFastPath(const AttentionLaunch& a) { return FastEligible(a); }

bool AttentionUsesFormatsKernel(const AttentionLaunch& a) { return FormatsBlockHeads(a) > 0; }

bool AttentionUsesRegisterDequant(const AttentionLaunch& a) {
  return MmaEligible(a) && (MmaCfgOf(a).km & kMmaKReg) != 0;
}

bool AttentionUsesRowSets(const AttentionLaunch& a) { return MmaEligible(a) && MmaCfgOf(a).rowset; }

bool SymmetricF16Codebook(const float* c, int n) {
  if (n < 2 || n % 2 != 0) return false;
  for (int k = 0; k < n / 2; ++k) {
    const __half lo = __float2half_rn(c[k]), hi = __float2half_rn(c[n - 1 - k]);
    const unsigned short bl = *reinterpret_cast<const unsigned short*>(&lo);
    const unsigned short bh = *reinterpret_cast<const unsigned short*>(&hi);
    if ((bh & 0x8000u) != 0 || bl != (bh | 0x8000u)) return false;
  }
  return true;
}

size_t AttentionWorkspaceBytes(const AttentionLaunch& a) { return WorkspaceBytes(a, Dims(a)); }

cudaError_t LaunchAttention(const AttentionLaunch& a, cudaStream_t stream) {
  if (a.num_queries == 0) return cudaSuccess;
  if (a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0 || a.dim <= 0) return cudaErrorInvalidValue;
  AttentionLaunch l = a;
  if (l.scale == 0.0f) l.scale = 1.0f / sqrtf(static_cast<float>(a.dim));
  const AttnDims d = Dims(l);  // planned once per call (split planning is host time on every call)
  if (a.workspace_bytes < WorkspaceBytes(l, d)) return cudaErrorInvalidValue;
  float* states = static_cast<float*>(l.workspace);
  float* recs = reinterpret_cast<float*>(static_cast<char*>(l.workspace) + StatesBytes(l, d));
  const bool fold = StagedFoldsQuery(l);
  cudaError_t e = fold ? cudaSuccess : ByVpl<PrepareF>(Vpl(l.host_k), l, d, states, stream);
  if (e != cudaSuccess) return e;
  if (MmaEligible(l)) {
    e = LaunchMma(l, d, fold ? nullptr : states, recs, stream);
  } else if (FastEligible(l)) {
    e = LaunchFast(l, d, states, recs, stream);
  } else if (d.formats_heads > 0) {
    e = LaunchFormats(l, d, states, recs, stream);
  } else {
    e = LaunchGeneric(l, d, states, recs, stream);
  }
  if (e != cudaSuccess) return e;
  if (FastMergeEligible(l)) {
    // A programmatic dependent launch: the merge's blocks launch and load
    // their rotation factors while the decode kernel finishes.
    const int warps = MergeWarps(d.splits);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(l.num_queries * l.q_heads));
    cfg.blockDim = dim3(32 * warps);
    cfg.dynamicSmemBytes = MergeSmemBytes(warps);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return l.has_tail ? cudaLaunchKernelEx(&cfg, FastMergeKernel<true>, l, d, static_cast<const float*>(recs))
                      : cudaLaunchKernelEx(&cfg, FastMergeKernel<false>, l, d, static_cast<const float*>(recs));
  }
  return ByVpl<MergeF>(Vpl(l.host_v), l, d, recs, stream);
}

}  // namespace tqkv::gpu
