// The attention plan on the host (no GPU): every plan picks a kernel from
// the served table that can run the launch, the preferred one at the
// benchmark shapes, forced kernels are refused where they do not apply,
// and bad shapes get precise errors.
#include "gpu/attention_plan.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/model_codec.h"
#include "codec/test_util.h"
#include "gpu/codec_tables.h"
#include "gpu/format_tiles.h"

namespace tqkv::gpu {
namespace {

constexpr AttentionDevice kH200 = {.num_sms = 132, .tensor_maps = true, .tensor_core_smem = true};

// A decode launch of `format` (host fields only, as the plan reads them).
// Codebook pointers are the CPU tables' addresses: equal where the codecs
// share a codebook, as the uploaded tables are.
AttentionLaunch Launch(const std::string& format, int dim, int q_heads, int kv_heads, int64_t batch, int64_t ctx,
                       bool tail = false) {
  auto fmt = ParseFormat(format);
  EXPECT_TRUE(fmt.ok()) << format;
  RecipeMetadata meta;
  if (fmt->needs_metadata()) meta = ::tqkv::testing_util::MakeMetadata(format.substr(0, 12), dim, 1, kv_heads);
  auto codec = ModelCodec::Create({1, kv_heads, q_heads, dim, 16}, {.format = format, .seed = 3},
                                  fmt->needs_metadata() ? &meta : nullptr);
  EXPECT_TRUE(codec.ok()) << codec.status();
  const LayerCodec& layer = (*codec)->layer(0);
  auto describe = [](const RowCodec& rc) {
    GpuComponent c = DescribeComponent(rc);
    for (size_t g = 0; g < rc.groups().size() && g < 2; ++g)
      if (rc.groups()[g].codebook != nullptr) c.groups[g].centroids = rc.groups()[g].codebook->centroids_f.data();
    return c;
  };
  AttentionLaunch a;
  a.host_k = describe(layer.k(0));
  a.host_v = describe(layer.v(0));
  a.uniform_codebooks = true;
  a.k_base = a.v_base = reinterpret_cast<const uint8_t*>(uintptr_t{1} << 20);
  a.block_stride = 16 * kv_heads * std::max(layer.k_row_bytes(), layer.v_row_bytes());
  a.block_stride = (a.block_stride + 15) / 16 * 16;
  a.block_size = 16;
  a.q_heads = q_heads;
  a.kv_heads = kv_heads;
  a.dim = dim;
  a.num_queries = batch;
  a.max_context = ctx;
  a.has_tail = tail;
  return a;
}

bool InServedTable(AttnKernel k, const AttentionLaunch& a) {
  for (const ServedKernel& s : ServedAttentionKernels()) {
    if (s.kernel != k) continue;
    if (s.k_bits == 0 || (s.k_bits == a.host_k.groups[0].mse_bits && s.v_bits == a.host_v.groups[0].mse_bits))
      return true;
  }
  return false;
}

std::string KernelOf(const AttentionLaunch& a, const AttentionDevice& dev = kH200) {
  AttentionPlan p;
  const cudaError_t e = PlanAttention(a, dev, &p);
  return e == cudaSuccess ? AttnKernelName(p.kernel) : std::string("error ") + std::to_string(e);
}

TEST(AttentionPlan, EveryPlanPicksAnEligibleServedKernel) {
  const AttentionDevice devices[] = {kH200,
                                     {.num_sms = 132, .tensor_maps = false, .tensor_core_smem = true},
                                     {.num_sms = 78, .tensor_maps = true, .tensor_core_smem = false}};
  struct Heads {
    int q, kv;
  };
  int planned = 0;
  for (const char* format : {"k2v2", "k2v4", "k4v2", "k4v4", "k3v3", "k5v5", "k8v8", "k4v3", "k8v4", "turboquant25",
                             "turboquant35_noqjl", "fp16"}) {
    for (int dim : {64, 96, 128, 256}) {
      for (Heads h : {Heads{32, 8}, Heads{8, 8}, Heads{16, 16}, Heads{12, 4}, Heads{24, 12}, Heads{32, 2}}) {
        for (int64_t batch : {1, 64}) {
          for (bool tail : {false, true}) {
            const AttentionLaunch a = Launch(format, dim, h.q, h.kv, batch, batch == 1 ? 131072 : 4096, tail);
            for (const AttentionDevice& dev : devices) {
              SCOPED_TRACE(std::string(format) + " d" + std::to_string(dim) + " q" + std::to_string(h.q) + " kv" +
                           std::to_string(h.kv) + " batch " + std::to_string(batch) + (tail ? " tail" : "") +
                           " sms " + std::to_string(dev.num_sms));
              const std::vector<AttnKernel> eligible = EligibleAttentionKernels(a, dev);
              ASSERT_FALSE(eligible.empty());
              EXPECT_EQ(eligible.back(), AttnKernel::kGeneric);
              AttentionPlan p;
              ASSERT_EQ(PlanAttention(a, dev, &p), cudaSuccess);
              EXPECT_TRUE(InServedTable(p.kernel, a)) << AttnKernelName(p.kernel);
              EXPECT_NE(std::find(eligible.begin(), eligible.end(), p.kernel), eligible.end());
              // The first eligible kernel, but row sets only with enough work.
              const bool rowsets_skipped = eligible[0] == AttnKernel::kRowSets && p.kernel == eligible[1];
              EXPECT_TRUE(p.kernel == eligible[0] || rowsets_skipped) << AttnKernelName(p.kernel);
              EXPECT_GE(p.dims.splits, 1);
              EXPECT_LE(p.dims.splits, 1025);
              EXPECT_EQ(p.dims.tail_split >= 0,
                        tail && !p.fast_merge &&
                            (p.kernel == AttnKernel::kFormats || p.kernel == AttnKernel::kFormatTiles));
              // The fused merge: the specialised kernels, and the format tiles at d = 128 with one V group.
              const bool one_v_group = a.host_v.num_groups == 1;
              EXPECT_EQ(p.fast_merge, IsSpecialised(p.kernel) ||
                                          (p.kernel == AttnKernel::kFormatTiles && dim == 128 && one_v_group));
              EXPECT_EQ(p.dims.format_tiles >= 0, p.kernel == AttnKernel::kFormatTiles);
              if (p.kernel == AttnKernel::kFormats) {
                // Value-state channels per lane: the smallest instantiated width that holds sv.
                const int cpl = p.dims.formats_cpl;
                EXPECT_TRUE(cpl == 2 || cpl == 3 || cpl == 4 || cpl == 8 || cpl == 16) << cpl;
                EXPECT_LE(p.dims.sv, 32 * cpl);
                EXPECT_GT(p.dims.sv, 32 * (cpl == 2 ? 0 : cpl == 3 ? 2 : cpl == 4 ? 3 : cpl / 2));
              }
              EXPECT_EQ(p.dims.group, h.q / h.kv);
              EXPECT_EQ(p.workspace_bytes,
                        p.states_bytes + sizeof(float) * batch * h.q * p.dims.splits * (2 + p.dims.sv + dim));
              // Every eligible kernel plans when forced.
              for (AttnKernel k : eligible) {
                AttentionPlan forced;
                EXPECT_EQ(PlanAttention(a, dev, &forced, {.kernel = k}), cudaSuccess) << AttnKernelName(k);
                EXPECT_EQ(forced.kernel, k);
              }
              ++planned;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(planned, 12 * 4 * 6 * 2 * 2 * 3);
}

TEST(AttentionPlan, PrefersTheMeasuredKernelAtTheBenchmarkShapes) {
  // k4v4 and k4v2, 8 kv heads: row sets with >= 64K tokens of (query,
  // 8-head group) context, the staged kernels below it.
  EXPECT_EQ(KernelOf(Launch("k4v4", 128, 32, 8, 64, 4096)), "rowsets");
  EXPECT_EQ(KernelOf(Launch("k4v4", 128, 32, 8, 1, 131072)), "rowsets");
  EXPECT_EQ(KernelOf(Launch("k4v4", 128, 32, 8, 1, 32768)), "staged_tma");
  EXPECT_EQ(KernelOf(Launch("k4v2", 128, 32, 8, 16, 16384)), "rowsets");
  EXPECT_EQ(KernelOf(Launch("k4v2", 128, 32, 8, 1, 32768)), "staged_holes_k");
  EXPECT_EQ(KernelOf(Launch("k4v4", 128, 16, 4, 64, 4096)), "staged_tma");  // row sets need 8 kv heads
  EXPECT_EQ(KernelOf(Launch("k2v2", 128, 32, 8, 64, 4096)), "rowsets");
  EXPECT_EQ(KernelOf(Launch("k2v2", 128, 32, 8, 1, 16384)), "rowsets");
  EXPECT_EQ(KernelOf(Launch("k2v2", 128, 32, 8, 1, 8192)), "tiles");
  EXPECT_EQ(KernelOf(Launch("k2v4", 128, 32, 8, 64, 4096)), "tiles");
  EXPECT_EQ(KernelOf(Launch("k4v4", 128, 16, 2, 64, 4096)), "cuda_core");  // kv heads % 4 != 0
  EXPECT_EQ(KernelOf(Launch("k4v4", 128, 32, 2, 64, 4096)), "formats");    // GQA 16
  EXPECT_EQ(KernelOf(Launch("k4v4", 128, 32, 8, 64, 4096, true)), "rowsets");  // tails: the fused merge
  EXPECT_EQ(KernelOf(Launch("k3v3", 128, 32, 8, 64, 4096)), "format_tiles");
  EXPECT_EQ(KernelOf(Launch("k4v4", 64, 32, 8, 64, 4096)), "format_tiles");
  EXPECT_EQ(KernelOf(Launch("turboquant35", 128, 32, 8, 1, 4096)), "format_tiles");
  EXPECT_EQ(KernelOf(Launch("k4v3", 64, 32, 8, 64, 4096)), "formats");  // not compiled at d = 64
  EXPECT_EQ(KernelOf(Launch("fp16", 128, 32, 8, 1, 4096)), "generic");
  // The row-set and staged kernels rotate their own queries (Hadamard K
  // rotations); the others read prepared query states.
  for (const char* format : {"k4v4", "k4v2", "k2v2", "k3v3"}) {
    for (int64_t batch : {1, 64}) {
      const AttentionLaunch a = Launch(format, 128, 32, 8, batch, 4096);
      AttentionPlan p;
      ASSERT_EQ(PlanAttention(a, kH200, &p), cudaSuccess);
      const bool folds = p.kernel <= AttnKernel::kStagedHolesK;
      EXPECT_EQ(p.fold_query, folds) << format << " " << AttnKernelName(p.kernel);
    }
  }
  // Devices without TMA tensor maps, or whose shared window the tensor-core
  // kernels do not address.
  const AttentionDevice no_tma = {.num_sms = 132, .tensor_maps = false, .tensor_core_smem = true};
  EXPECT_EQ(KernelOf(Launch("k4v4", 128, 32, 8, 64, 4096), no_tma), "staged_holes");
  EXPECT_EQ(KernelOf(Launch("k4v2", 128, 32, 8, 64, 4096), no_tma), "staged_holes_k");
  const AttentionDevice no_window = {.num_sms = 132, .tensor_maps = true, .tensor_core_smem = false};
  EXPECT_EQ(KernelOf(Launch("k4v4", 128, 32, 8, 64, 4096), no_window), "cuda_core");
  // Pages the tensor-core kernels cannot stream: 4-byte aligned only.
  AttentionLaunch misaligned = Launch("k4v4", 128, 32, 8, 64, 4096);
  misaligned.k_base += 4;
  EXPECT_EQ(KernelOf(misaligned), "cuda_core");
  // Different K and V codebooks: the tiles kernel (its own tables).
  AttentionLaunch two_codebooks = Launch("k4v4", 128, 32, 8, 64, 4096);
  two_codebooks.uniform_codebooks = false;
  EXPECT_EQ(KernelOf(two_codebooks), "tiles");
}

// Every format the format-tiles kernel is compiled for, at its head dim
// and GQA groups 1-8 (odd ones too), plans it; groups over 8, misaligned
// pages and blocks under 16 tokens do not.
TEST(AttentionPlan, FormatTilesServeEveryCompiledFormat) {
  auto name_of = [](const TileFormat& f) -> std::string {
    if (f.parts == 1) return "k" + std::to_string(f.part[0].bits);
    const bool qjl = f.parts == 4;
    const int high_bits = f.part[0].bits + (qjl ? 1 : 0);
    return std::string(high_bits == 3 ? "turboquant25" : "turboquant35") + (qjl ? "" : "_noqjl");
  };
  int served = 0;
  for (int i = 0; i < kNumFormatTiles; ++i) {
    const FormatTilesEntry& e = kFormatTiles[i];
    const std::string k = name_of(e.k), v = name_of(e.v);
    const std::string format = e.k.parts == 1 ? k + "v" + std::to_string(e.v.part[0].bits) : k;
    SCOPED_TRACE(format + " d" + std::to_string(e.k.dim));
    EXPECT_GE(FormatTilesResident(i), 1);
    for (int q : {8, 24, 32, 64}) {
      const AttentionLaunch a = Launch(format, e.k.dim, q, 8, 4, 4096);
      EXPECT_EQ(FormatTilesIndex(a), q / 8 <= 8 ? i : -1) << q;
      if (q == 24) {
        AttentionPlan p;
        ASSERT_EQ(PlanAttention(a, kH200, &p, {.kernel = AttnKernel::kFormatTiles}), cudaSuccess);
        EXPECT_EQ(p.dims.format_tiles, i);
        ++served;
      }
    }
  }
  EXPECT_EQ(served, kNumFormatTiles);
  AttentionLaunch a = Launch("k3v3", 128, 32, 8, 4, 4096);
  ASSERT_GE(FormatTilesIndex(a), 0);
  a.block_size = 8;
  EXPECT_EQ(FormatTilesIndex(a), -1);
  a = Launch("k3v3", 128, 32, 8, 4, 4096);
  a.v_base += 2;
  EXPECT_EQ(FormatTilesIndex(a), -1);
  EXPECT_EQ(FormatTilesIndex(Launch("fp16", 128, 32, 8, 4, 4096)), -1);
  EXPECT_EQ(KernelOf(Launch("k3v3", 128, 32, 8, 4, 4096), {.num_sms = 132, .tensor_core_smem = false}), "formats");
}

TEST(AttentionPlan, RefusesKernelsThatCannotRunTheLaunchAndBadShapes) {
  AttentionPlan p;
  EXPECT_EQ(PlanAttention(Launch("k2v4", 128, 32, 8, 4, 4096), kH200, &p, {.kernel = AttnKernel::kRowSets}),
            cudaErrorNotSupported);
  EXPECT_EQ(PlanAttention(Launch("k3v3", 128, 32, 8, 4, 4096), kH200, &p, {.kernel = AttnKernel::kCudaCore}),
            cudaErrorNotSupported);
  EXPECT_EQ(PlanAttention(Launch("fp16", 128, 32, 8, 4, 4096), kH200, &p, {.kernel = AttnKernel::kFormats}),
            cudaErrorNotSupported);
  EXPECT_EQ(PlanAttention(Launch("k4v4", 128, 32, 8, 4, 4096), {.num_sms = 132}, &p,
                          {.kernel = AttnKernel::kStagedTma}),
            cudaErrorNotSupported);
  EXPECT_EQ(PlanAttention(Launch("k4v4", 128, 32, 8, 4, 4096), kH200, &p, {.kernel = AttnKernel::kGeneric}),
            cudaSuccess);
  EXPECT_EQ(p.kernel, AttnKernel::kGeneric);
  AttentionLaunch bad = Launch("k4v4", 128, 32, 8, 4, 4096);
  bad.q_heads = 30;  // not a multiple of kv_heads
  EXPECT_EQ(PlanAttention(bad, kH200, &p), cudaErrorInvalidValue);
  bad.q_heads = 32;
  bad.kv_heads = 0;
  EXPECT_EQ(PlanAttention(bad, kH200, &p), cudaErrorInvalidValue);
  EXPECT_EQ(PlanAttention(Launch("k4v4", 128, 32, 8, 4, 4096), kH200, &p, {.splits = -1}), cudaErrorInvalidValue);
  // Forced split counts: as asked, at most 1024.
  ASSERT_EQ(PlanAttention(Launch("k4v4", 128, 32, 8, 4, 4096), kH200, &p, {.splits = 7}), cudaSuccess);
  EXPECT_EQ(p.dims.splits, 7);
  ASSERT_EQ(PlanAttention(Launch("k4v4", 128, 32, 8, 4, 1 << 20), kH200, &p, {.splits = 5000}), cudaSuccess);
  EXPECT_EQ(p.dims.splits, 1024);
}

TEST(AttentionPlan, ServedTableNamesEveryKernelAndItsOccupancy) {
  std::vector<bool> seen(kNumAttnKernels, false);
  for (const ServedKernel& s : ServedAttentionKernels()) {
    seen[static_cast<int>(s.kernel)] = true;
    const char* name = AttnKernelName(s.kernel);
    ASSERT_NE(name, nullptr);
    EXPECT_EQ(AttnKernelByName(name), s.kernel);
    if (s.kernel <= AttnKernel::kTiles) {
      for (int g : {1, 2, 4, 8}) {
        const KernelOccupancy o = TensorCoreOccupancy(s.kernel, s.k_bits, s.v_bits, g);
        EXPECT_GE(o.blocks_per_sm, 1) << name << " k" << s.k_bits << "v" << s.v_bits << " g" << g;
        EXPECT_GE(o.warps_per_kv_head, 1) << name;
      }
    }
  }
  for (int k = 0; k < kNumAttnKernels; ++k) EXPECT_TRUE(seen[k]) << AttnKernelName(static_cast<AttnKernel>(k));
  EXPECT_FALSE(AttnKernelByName("mma").has_value());
  EXPECT_EQ(AttnKernelName(static_cast<AttnKernel>(kNumAttnKernels)), nullptr);
  // A combination the table does not list has no occupancy.
  EXPECT_EQ(TensorCoreOccupancy(AttnKernel::kTiles, 4, 2, 4).blocks_per_sm, 0);
  EXPECT_EQ(TensorCoreOccupancy(AttnKernel::kRowSets, 2, 4, 4).blocks_per_sm, 0);
}

}  // namespace
}  // namespace tqkv::gpu
