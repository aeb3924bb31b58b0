// The served table and the per-call plan (gpu/attention_plan.h). The
// preferences are the H200 measurements of bench/RESULTS.md.
#include "gpu/attention_plan.h"

#include <algorithm>
#include <cstring>

#include "gpu/format_tiles.h"

namespace tqkv::gpu {
namespace {

using K = AttnKernel;

// Preferred first. Row sets win where a call has at least RowSetMinWork
// tokens of (query, 8-head group) context; with less, their block
// prologue loses to the smaller staged blocks (K2/V2: to the
// register-buffered tiles, 28 vs 25 µs at 1 × 8K, 30 vs 31 at 1 × 16K, 30
// vs 37 at 1 × 32K, 80-82 vs 124-125 at the batch shapes). TMA-staged
// beats the holes layouts at every benchmark shape; the staged kernels beat the
// register-buffered tiles by 3-14%. The format tiles beat the formats
// kernel by 1.7-3.2× wherever both run and lose to the register-buffered
// tiles for k2v2 (148 vs 124 µs at 64 × 4K).
constexpr ServedKernel kServed[] = {
    {K::kRowSets, 4, 4},      {K::kRowSets, 4, 2},  {K::kRowSets, 2, 2},   {K::kStagedTma, 4, 4},
    {K::kStagedHoles, 4, 4},  {K::kStagedHolesK, 4, 2},
    {K::kTiles, 4, 4},        {K::kTiles, 2, 4},    {K::kTiles, 2, 2},
    {K::kCudaCore, 4, 4},     {K::kCudaCore, 4, 2}, {K::kCudaCore, 2, 4},  {K::kCudaCore, 2, 2},
    {K::kFormatTiles, 0, 0},  {K::kFormats, 0, 0},  {K::kGeneric, 0, 0},
};

constexpr const char* kNames[kNumAttnKernels] = {"rowsets",   "staged_tma",   "staged_holes", "staged_holes_k",
                                                 "tiles",     "cuda_core",    "format_tiles", "formats",
                                                 "generic"};

constexpr int64_t kMinSplitTokens = 256;
int64_t RowSetMinWork(int k_bits) { return k_bits == 2 ? 16384 : 65536; }
constexpr int kMaxSplits = 1024;            // the merge kernels take at most this many
constexpr size_t kFormatsMaxSmem = 160 * 1024;

int StateSize(const GpuComponent& c, int dim) { return c.kind == kGpuDense ? dim : c.state_size; }

// The fused merge's V layout: one group of <= 128 state channels at offset
// 0 (it applies Πᵀ with one warp's strided registers).
bool FastMergeFits(const GpuComponent& v) {
  return v.num_groups == 1 && v.groups[0].channels <= 128 && v.groups[0].state_offset == 0 && v.state_size <= 128;
}

int Bits(const GpuComponent& c) { return c.groups[0].mse_bits; }

// The specialised formats: mse K/V of 2 or 4 bits at d = 128, GQA group
// 1, 2, 4 or 8, 4-byte aligned rows. A dense tail needs the fused merge,
// which attends it.
bool Specialised(const AttentionLaunch& a) {
  const GpuComponent& k = a.host_k;
  const GpuComponent& v = a.host_v;
  if (a.dim != 128 || (a.has_tail && !FastMergeFits(v))) return false;
  if (k.kind != kGpuMse || v.kind != kGpuMse || k.groups[0].qjl || v.groups[0].qjl) return false;
  const int kb = Bits(k), vb = Bits(v);
  if ((kb != 2 && kb != 4) || (vb != 2 && vb != 4)) return false;
  const int g = a.q_heads / a.kv_heads;
  if (g != 1 && g != 2 && g != 4 && g != 8) return false;
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3) == 0; };
  return aligned(a.k_base) && aligned(a.v_base) && a.block_stride % 4 == 0 && k.row_bytes % 4 == 0 &&
         v.row_bytes % 4 == 0;
}

// The tensor-core kernels: the specialised formats with fp32 norms right
// after the indices, kv_heads % 4 == 0 (one row misalignment per kv head),
// 16-byte aligned pages of a power-of-two number of whole 16-token tiles.
bool TensorCore(const AttentionLaunch& a, const AttentionDevice& dev) {
  if (!Specialised(a) || !dev.tensor_core_smem) return false;
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
         aligned16(a.v_base);
}

// K and V share one codebook table (4-bit V reuses the K table).
bool OneCodebook(const AttentionLaunch& a) {
  return Bits(a.host_k) == Bits(a.host_v) && a.uniform_codebooks &&
         a.host_k.groups[0].centroids == a.host_v.groups[0].centroids;
}

// Value-state channels per lane of the formats kernel; 0: wider than it
// is instantiated for.
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

// The formats kernel's q heads per block, or 0 where it cannot read the
// launch's layout (dense layers, more than two groups, indices over 8
// bits, value states over 512 floats, or too much shared memory).
int FormatsBlockHeads(const AttentionLaunch& a) {
  for (const GpuComponent* c : {&a.host_k, &a.host_v}) {
    if (c->kind == kGpuDense || c->num_groups < 1 || c->num_groups > 2) return 0;
    for (int gi = 0; gi < c->num_groups; ++gi)
      if (c->groups[gi].mse_bits < 1 || c->groups[gi].mse_bits > 8) return 0;
  }
  const int sv = StateSize(a.host_v, a.dim), sk = StateSize(a.host_k, a.dim);
  const int cpl = FormatsCpl(sv);
  if (cpl == 0) return 0;
  const int gc = FormatsHeads(a.q_heads / a.kv_heads, cpl);
  return FormatsKernelSmemBytes(a, sk, sv, gc) <= kFormatsMaxSmem ? gc : 0;
}

// The generic kernel and both merges hold a codebook group's values in at
// most 8 per lane.
bool GenericFits(const AttentionLaunch& a) {
  for (const GpuComponent* c : {&a.host_k, &a.host_v})
    if ((std::max(c->max_group_channels, 1) + 31) / 32 > 8) return false;
  return true;
}

bool Eligible(K kernel, const AttentionLaunch& a, const AttentionDevice& dev) {
  const int kb = Bits(a.host_k), vb = Bits(a.host_v);
  const bool k4 = kb == 4 && (vb == 2 || OneCodebook(a));
  switch (kernel) {
    case K::kRowSets:
      return TensorCore(a, dev) && (k4 || (kb == 2 && vb == 2)) && dev.tensor_maps && a.kv_heads % 8 == 0 &&
             a.uniform_codebooks;
    case K::kStagedTma: return TensorCore(a, dev) && kb == 4 && vb == 4 && OneCodebook(a) && dev.tensor_maps;
    case K::kStagedHoles: return TensorCore(a, dev) && kb == 4 && vb == 4 && OneCodebook(a);
    case K::kStagedHolesK: return TensorCore(a, dev) && kb == 4 && vb == 2;
    case K::kTiles: return TensorCore(a, dev) && !(kb == 4 && vb == 2);
    case K::kCudaCore: return Specialised(a);
    case K::kFormatTiles: return dev.tensor_core_smem && GenericFits(a) && FormatTilesIndex(a) >= 0;
    case K::kFormats: return GenericFits(a) && FormatsBlockHeads(a) > 0;
    case K::kGeneric: return GenericFits(a);
  }
  return false;
}

// The kernels whose splits follow the waves-and-overhead cost model, and
// their occupancy.
bool TensorCoreKernel(K k) { return k <= K::kTiles || k == K::kFormatTiles; }
// format_tiles: the launch's entry of kFormatTiles (AttnDims::format_tiles).
KernelOccupancy OccupancyOf(K kernel, const AttentionLaunch& a, int format_tiles) {
  if (kernel == K::kFormatTiles) return {FormatTilesResident(format_tiles), kTileWarps, 1};
  return TensorCoreOccupancy(kernel, Bits(a.host_k), Bits(a.host_v), a.q_heads / a.kv_heads);
}

// Context splits over the packed tokens.
int PackedSplits(const AttentionLaunch& a, const AttentionDevice& dev, K kernel, int head_chunks, int format_tiles,
                 int forced) {
  if (forced > 0) return std::min(forced, kMaxSplits);
  const int64_t ctx = std::max<int64_t>(a.max_context, 1);
  const int64_t sms = std::max(dev.num_sms, 1);
  if (TensorCoreKernel(kernel)) {
    // Fewest waves of resident blocks × tokens per block, plus a per-block
    // overhead (tables, merge) worth ~kBlockOverheadTokens tokens at 4 warps.
    constexpr double kBlockOverheadTokens = 192.0 / 4;
    const KernelOccupancy occ = OccupancyOf(kernel, a, format_tiles);
    const int64_t blocks = std::max<int64_t>(1, a.num_queries * a.kv_heads / occ.kv_heads_per_block);
    const int64_t resident = sms * std::max(occ.blocks_per_sm, 1);
    const int64_t max_splits = std::clamp<int64_t>((ctx + kMinSplitTokens - 1) / kMinSplitTokens, 1, kMaxSplits);
    // A split count s is usable when no smaller count gives the same chunk
    // (chunks are whole 128-token steps); a block's time is its chunk over
    // its warps, plus the overhead.
    auto chunk_of = [&](int64_t s) { return ((ctx + s - 1) / s + 127) / 128 * 128; };
    auto usable = [&](int64_t s) { return (ctx + chunk_of(s) - 1) / chunk_of(s) == s; };
    auto cost_of = [&](int64_t s) {
      const int64_t waves = (blocks * s + resident - 1) / resident;
      return static_cast<double>(waves) *
             (static_cast<double>(chunk_of(s)) / occ.warps_per_kv_head + kBlockOverheadTokens);
    };
    // Among the usable counts with the same number of waves the largest has
    // the smallest chunk, so only that one per wave count can be best (the
    // first of equal costs wins, as in a scan over every count).
    int64_t best = 1;
    double best_cost = cost_of(1);
    for (int64_t lo = 2; lo <= max_splits;) {
      const int64_t waves = (blocks * lo + resident - 1) / resident;
      const int64_t hi = std::min(max_splits, waves * resident / blocks);  // the last count with these waves
      int64_t s = hi;
      while (s >= lo && !usable(s)) --s;
      if (s >= lo && cost_of(s) < best_cost) {
        best = s;
        best_cost = cost_of(s);
      }
      lo = hi + 1;
    }
    return static_cast<int>(best);
  }
  // About 8 blocks per SM, no split under kMinSplitTokens tokens.
  const int64_t blocks = std::max<int64_t>(1, a.num_queries * a.kv_heads * head_chunks);
  const int64_t by_ctx = std::max<int64_t>(1, (ctx + kMinSplitTokens - 1) / kMinSplitTokens);
  return static_cast<int>(std::clamp<int64_t>((sms * 8 + blocks - 1) / blocks, 1, std::min<int64_t>(by_ctx, kMaxSplits)));
}

// The descriptor's groups are the parts of `f`, in order, at the same
// state offsets; norms where the kernel reads them (fp32 at 4-byte, fp16
// at 2-byte offsets).
bool HasTileFormat(const GpuComponent& c, const TileFormat& f, int dim) {
  if (c.kind == kGpuDense || dim != f.dim || c.row_bytes != f.row_bytes || c.state_size != f.state) return false;
  int p = 0;
  for (int gi = 0; gi < c.num_groups; ++gi) {
    const GpuGroup& g = c.groups[gi];
    const int align = f.fp16_norms ? 2 : 4;
    if ((g.fp16_norms != 0) != f.fp16_norms || g.norm_offset % align != 0) return false;
    auto part_is = [&](bool sign, int state, int bits) {
      if (p >= f.parts) return false;
      const TilePart& t = f.part[p++];
      return t.sign == sign && t.group == gi && t.channels == g.channels && t.state == state && t.bits == bits;
    };
    if (!part_is(false, g.state_offset, g.mse_bits)) return false;
    if (g.qjl && (!part_is(true, g.state_offset + g.channels, 1) || g.residual_offset % align != 0)) return false;
  }
  return p == f.parts;
}

}  // namespace

int FormatTilesIndex(const AttentionLaunch& a) {
  if (a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0 || a.q_heads / a.kv_heads > kTileMaxGroup) return -1;
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3) == 0; };
  const bool pow2 = a.block_size >= 16 && (a.block_size & (a.block_size - 1)) == 0;
  if (!pow2 || a.block_stride % 4 != 0 || !aligned(a.k_base) || !aligned(a.v_base)) return -1;
  for (int i = 0; i < kNumFormatTiles; ++i)
    if (HasTileFormat(a.host_k, kFormatTiles[i].k, a.dim) && HasTileFormat(a.host_v, kFormatTiles[i].v, a.dim))
      return i;
  return -1;
}

int FormatTilesResident(int index) {
  if (index < 0 || index >= kNumFormatTiles) return 0;
  const FormatTilesEntry& e = kFormatTiles[index];
  return ResidentBlocks(FormatTilesLayout::Of(e.k, e.v).bytes, FormatTilesBlocksPerSm(e));
}

const char* AttnKernelName(AttnKernel k) {
  const int i = static_cast<int>(k);
  return i >= 0 && i < kNumAttnKernels ? kNames[i] : nullptr;
}

std::optional<AttnKernel> AttnKernelByName(const char* name) {
  for (int i = 0; i < kNumAttnKernels; ++i)
    if (name != nullptr && std::strcmp(name, kNames[i]) == 0) return static_cast<AttnKernel>(i);
  return std::nullopt;
}

std::span<const ServedKernel> ServedAttentionKernels() { return kServed; }

std::vector<AttnKernel> EligibleAttentionKernels(const AttentionLaunch& a, const AttentionDevice& dev) {
  std::vector<AttnKernel> out;
  if (a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0 || a.dim <= 0) return out;
  for (const ServedKernel& s : kServed) {
    const bool bits = s.k_bits == 0 || (s.k_bits == Bits(a.host_k) && s.v_bits == Bits(a.host_v));
    const bool listed = std::find(out.begin(), out.end(), s.kernel) != out.end();
    if (bits && !listed && Eligible(s.kernel, a, dev)) out.push_back(s.kernel);
  }
  return out;
}

cudaError_t PlanAttention(const AttentionLaunch& a, const AttentionDevice& dev, AttentionPlan* plan,
                          const PlanOverrides& overrides) {
  if (a.kv_heads <= 0 || a.q_heads <= 0 || a.q_heads % a.kv_heads != 0 || a.dim <= 0 || overrides.splits < 0)
    return cudaErrorInvalidValue;
  const std::vector<AttnKernel> eligible = EligibleAttentionKernels(a, dev);
  if (eligible.empty()) return cudaErrorNotSupported;
  AttentionPlan p;
  if (overrides.kernel.has_value()) {
    if (std::find(eligible.begin(), eligible.end(), *overrides.kernel) == eligible.end())
      return cudaErrorNotSupported;
    p.kernel = *overrides.kernel;
  } else {
    p.kernel = eligible[0];
    const int64_t work = a.num_queries * (a.kv_heads / 8) * a.max_context;
    if (p.kernel == K::kRowSets && work < RowSetMinWork(Bits(a.host_k))) p.kernel = eligible[1];
  }
  AttnDims& d = p.dims;
  d.sk = StateSize(a.host_k, a.dim);
  d.sv = StateSize(a.host_v, a.dim);
  d.record = 2 + d.sv + a.dim;
  d.group = a.q_heads / a.kv_heads;
  if (p.kernel == K::kFormats) {
    d.formats_heads = FormatsBlockHeads(a);
    d.formats_cpl = FormatsCpl(d.sv);
  }
  if (p.kernel == K::kFormatTiles) d.format_tiles = FormatTilesIndex(a);
  d.head_chunks = IsSpecialised(p.kernel) || p.kernel == K::kFormatTiles ? 1
                  : p.kernel == K::kFormats ? (d.group + d.formats_heads - 1) / d.formats_heads
                                            : GenericHeadChunks(d.group);
  d.splits = PackedSplits(a, dev, p.kernel, d.head_chunks, d.format_tiles, overrides.splits);
  const int64_t ctx = std::max<int64_t>(a.max_context, 1);
  d.chunk = ((ctx + d.splits - 1) / d.splits + 127) / 128 * 128;
  // The fused merge takes the specialised kernels' records and, at d = 128
  // with one V group, the format tiles' (it attends the dense tail itself
  // and spreads a long sequence's splits over several warps; the generic
  // merge takes one warp per query head: 67 µs of a 1 × 32K k3v3 call's
  // 115 on the H200). Other kernels attend tails in a split of their own.
  p.fast_merge = FastMergeFits(a.host_v) &&
                 (IsSpecialised(p.kernel) || (p.kernel == K::kFormatTiles && a.dim == 128));
  if (a.has_tail && !p.fast_merge && (p.kernel == K::kFormats || p.kernel == K::kFormatTiles))
    d.tail_split = d.splits++;
  const bool staged = p.kernel == K::kRowSets || p.kernel == K::kStagedTma || p.kernel == K::kStagedHoles ||
                      p.kernel == K::kStagedHolesK;
  p.fold_query = staged && a.host_k.groups[0].rotation == kGpuHadamard;
  p.states_bytes = (static_cast<size_t>(a.num_queries) * a.q_heads * d.sk * sizeof(float) + 255) / 256 * 256;
  p.workspace_bytes =
      p.states_bytes + static_cast<size_t>(a.num_queries) * a.q_heads * d.splits * d.record * sizeof(float);
  *plan = p;
  return cudaSuccess;
}

}  // namespace tqkv::gpu
