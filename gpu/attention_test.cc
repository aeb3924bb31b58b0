// Fused paged attention kernels vs fp64 ReferenceAttention over the same
// dequantized K/V: every served kernel that can run a case (the plan's
// choice first), GQA, forced and planned split-K, partial last blocks,
// dense tails, recipes, and causal prefill. Pages not referenced by the
// block table are NaN-poisoned (0xFF).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/attention.h"
#include "codec/dtype.h"
#include "codec/page_codec.h"
#include "codec/quality.h"
#include "codec/test_util.h"
#include "gpu/attention_plan.h"
#include "gpu/codec_tables.h"
#include "gpu/kernels.h"
#include "gpu/test_support.h"

namespace tqkv::gpu {
namespace {

using ::tqkv::gpu::testing_util::ToDevice;
using ::tqkv::gpu::testing_util::ToHost;
using ::tqkv::testing_util::RandomRows;

struct Case {
  std::string format;
  int dim;
  int q_heads, kv_heads;
  std::vector<int64_t> packed;  // per sequence
  std::vector<int64_t> tail;    // per sequence (dense fp16 tail tokens)
  int queries_per_seq = 1;      // > 1: causal prefill over the last positions
  int splits = 0;
  bool expect_fast = false;  // the plan picks a specialised kernel
  bool qr = false;  // QR rotation (the staged kernel then reads prepared queries)
  int tail_dtype = kGpuF16;  // the tail rows as the launch reads them (kGpuF32: the fp16 values widened)
  bool expect_formats = false;  // the plan picks the format-tiles or the formats kernel
};

std::string Name(const Case& c) {
  std::string n = c.format + "_d" + std::to_string(c.dim) + "_g" + std::to_string(c.q_heads / c.kv_heads) + "_n" +
                  std::to_string(c.packed.size()) + "_q" + std::to_string(c.queries_per_seq) + "_s" +
                  std::to_string(c.splits);
  bool tail = false;
  for (int64_t t : c.tail) tail = tail || t > 0;
  if (c.qr) n += "_qr";
  if (c.tail_dtype == kGpuF32) n += "_f32";
  return tail ? n + "_tail" : n;
}

class AttentionKernels : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionKernels, MatchesFp64ReferenceOverDequantizedKv) {
  TQ_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const int H = c.kv_heads, QH = c.q_heads, dim = c.dim, bs = 16;
  auto fmt = *ParseFormat(c.format);
  RecipeMetadata meta;
  if (fmt.needs_metadata()) meta = ::tqkv::testing_util::MakeMetadata(c.format.substr(0, 12), dim, 1, H);
  auto codec_or = ModelCodec::Create({1, H, QH, dim, bs}, {.format = c.format,
                                      .rotation = c.qr ? std::optional(RotationKind::kQr) : std::nullopt,
                                      .seed = 99},
                                     fmt.needs_metadata() ? &meta : nullptr);
  ASSERT_TRUE(codec_or.ok()) << codec_or.status();
  const ModelCodec& codec = **codec_or;
  const LayerCodec& layer = codec.layer(0);
  auto tables = *DeviceCodecTables::Upload(codec);

  const int nseq = static_cast<int>(c.packed.size());
  std::vector<int> nblocks(nseq);
  int total_blocks = 0, max_blocks = 1;
  for (int s = 0; s < nseq; ++s) {
    nblocks[s] = static_cast<int>((c.packed[s] + bs - 1) / bs);
    total_blocks += nblocks[s];
    max_blocks = std::max(max_blocks, nblocks[s]);
  }
  // Physical pages: referenced ones scattered among poisoned spares.
  const int phys = 2 * total_blocks + 3;
  std::vector<int> perm(phys);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  PageGeometry kg = codec.k_geometry(0), vg = codec.v_geometry(0);
  kg.num_blocks = vg.num_blocks = phys;
  std::vector<uint8_t> kp(kg.total_bytes(), 0xFF), vp(vg.total_bytes(), 0xFF);
  std::vector<int32_t> table(nseq * max_blocks, perm.back());  // padding points at a poisoned page
  std::vector<std::vector<float>> tails_k(nseq), tails_v(nseq);
  std::vector<uint16_t> tk_all, tv_all;
  std::vector<int64_t> tail_offset(nseq);
  std::vector<double> ref_all;
  std::vector<int32_t> qseq;
  std::vector<int64_t> positions;
  std::vector<float> q_all;
  int used = 0;
  std::vector<std::vector<float>> dk(nseq), dv(nseq);
  for (int s = 0; s < nseq; ++s) {
    const int64_t n = c.packed[s];
    std::vector<float> k = RandomRows(n * H, dim, 100 + s, 3), v = RandomRows(n * H, dim, 200 + s);
    std::vector<int64_t> slots(n);
    for (int b = 0; b < nblocks[s]; ++b) table[s * max_blocks + b] = perm[used++];
    for (int64_t t = 0; t < n; ++t) slots[t] = int64_t(table[s * max_blocks + t / bs]) * bs + t % bs;
    if (n > 0) {
      ASSERT_TRUE(EncodeToPages(layer, {k.data(), DType::kF32, n, H, dim}, {v.data(), DType::kF32, n, H, dim},
                                slots.data(), {kp.data(), kg}, {vp.data(), vg}, nullptr)
                      .ok());
    }
    const int64_t tail = c.tail.empty() ? 0 : c.tail[s];
    std::vector<uint16_t> tk = ::tqkv::testing_util::ToHalf(RandomRows(tail * H, dim, 300 + s));
    std::vector<uint16_t> tv = ::tqkv::testing_util::ToHalf(RandomRows(tail * H, dim, 400 + s));
    tail_offset[s] = static_cast<int64_t>(tk_all.size() / (H * dim));
    tk_all.insert(tk_all.end(), tk.begin(), tk.end());
    tv_all.insert(tv_all.end(), tv.begin(), tv.end());
    PackedSequence seq;
    for (int b = 0; b < nblocks[s]; ++b) {
      seq.k_pages.push_back(kp.data() + size_t(table[s * max_blocks + b]) * kg.page_bytes());
      seq.v_pages.push_back(vp.data() + size_t(table[s * max_blocks + b]) * vg.page_bytes());
    }
    seq.packed_tokens = n;
    seq.tail_k = {tk.data(), DType::kF16, tail, H, dim};
    seq.tail_v = {tv.data(), DType::kF16, tail, H, dim};
    DequantizeSequence(layer, bs, seq, &dk[s], &dv[s]);
    const int64_t total = n + tail;
    const int nq = static_cast<int>(std::min<int64_t>(c.queries_per_seq, total));
    std::vector<float> q = RandomRows(nq * QH, dim, 500 + s);
    for (float& x : q) x *= 0.25f;
    std::vector<int64_t> pos(nq);
    for (int i = 0; i < nq; ++i) pos[i] = total - nq + i;
    std::vector<double> ref(nq * QH * dim);
    ReferenceAttention({QH, H, dim, 0}, q.data(), nq, pos.data(), dk[s].data(), dv[s].data(), total, ref.data());
    ref_all.insert(ref_all.end(), ref.begin(), ref.end());
    q_all.insert(q_all.end(), q.begin(), q.end());
    for (int i = 0; i < nq; ++i) {
      qseq.push_back(s);
      positions.push_back(pos[i]);
    }
  }
  const int64_t nq = static_cast<int64_t>(positions.size());
  DeviceBuffer dkp = ToDevice(kp), dvp = ToDevice(vp), dt = ToDevice(table), dpk = ToDevice(c.packed);
  auto widen = [](const std::vector<uint16_t>& h) {
    std::vector<float> f(h.size());
    ToFloat(DType::kF16, h.data(), f.data(), h.size());
    return f;
  };
  const bool f32_tail = c.tail_dtype == kGpuF32;
  DeviceBuffer dtk = f32_tail ? ToDevice(widen(tk_all)) : ToDevice(tk_all);
  DeviceBuffer dtv = f32_tail ? ToDevice(widen(tv_all)) : ToDevice(tv_all);
  DeviceBuffer dto = ToDevice(tail_offset);
  DeviceBuffer dqs = ToDevice(qseq), dpos = ToDevice(positions), dq = ToDevice(q_all);
  DeviceBuffer dout = ToDevice(std::vector<float>(nq * QH * dim, NAN));
  AttentionLaunch a;
  a.k_comp = tables->device(0, Component::kKey);
  a.v_comp = tables->device(0, Component::kValue);
  a.host_k = tables->host(0, 0, Component::kKey);
  a.host_v = tables->host(0, 0, Component::kValue);
  a.uniform_codebooks = tables->uniform_codebooks(0);
  // The K rotation signs laid out per head (AttentionLaunch::k_signs): every
  // one-group Hadamard format has them, QR rotations, recipes (two groups)
  // and dense layers not; they are the descriptors' signs.
  const float* k_signs = tables->k_head_signs(0);
  EXPECT_EQ(k_signs != nullptr, !c.qr && !fmt.needs_metadata() && c.format != "fp16");
  if (k_signs != nullptr) {
    for (int h = 0; h < H; ++h) {
      const GpuGroup& g = tables->host(0, h, Component::kKey).groups[0];
      std::vector<float> got(2 * dim), want(2 * dim);
      ASSERT_EQ(cudaMemcpy(got.data(), k_signs + 2 * h * dim, 2 * dim * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(want.data(), g.s1, dim * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(want.data() + dim, g.s2, dim * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, want) << "kv head " << h;
    }
  }
  a.k_base = dkp.as<uint8_t>();
  a.v_base = dvp.as<uint8_t>();
  a.block_stride = 0;  // K and V regions have different page sizes: use per-region strides below
  a.block_size = bs;
  a.block_table = dt.as<int32_t>();
  a.max_blocks = max_blocks;
  a.packed_tokens = dpk.as<int64_t>();
  a.tail_k = dtk.get();
  a.tail_v = dtv.get();
  a.tail_dtype = c.tail_dtype;
  a.tail_offset = dto.as<int64_t>();
  a.has_tail = false;
  for (int64_t i = 0; i < nq; ++i) a.has_tail = a.has_tail || positions[i] >= c.packed[qseq[i]];
  // One query per sequence in order (decode): query_seq left null, the
  // launch's shorthand for it; prefill cases pass the array.
  a.query_seq = c.queries_per_seq == 1 ? nullptr : dqs.as<int32_t>();
  a.positions = dpos.as<int64_t>();
  a.num_queries = nq;
  a.q = dq.as<float>();
  a.out = dout.as<float>();
  a.q_heads = QH;
  a.kv_heads = H;
  a.dim = dim;
  a.max_context = *std::max_element(positions.begin(), positions.end()) + 1;
  // One stride for both regions: lay V pages at the same stride as K by
  // using the larger page size (re-upload with padding).
  const size_t stride = std::max(kg.page_bytes(), vg.page_bytes());
  std::vector<uint8_t> kpad(stride * phys, 0xFF), vpad(stride * phys, 0xFF);
  for (int p = 0; p < phys; ++p) {
    std::memcpy(kpad.data() + p * stride, kp.data() + p * kg.page_bytes(), kg.page_bytes());
    std::memcpy(vpad.data() + p * stride, vp.data() + p * vg.page_bytes(), vg.page_bytes());
  }
  DeviceBuffer dkpad = ToDevice(kpad), dvpad = ToDevice(vpad);
  a.k_base = dkpad.as<uint8_t>();
  a.v_base = dvpad.as<uint8_t>();
  a.block_stride = static_cast<int64_t>(stride);
  // The same tables as separate per-sequence tables (AttentionLaunch::
  // seq_tables) in reverse order, max_blocks readable entries after each;
  // the launch's block_table then points every block at a poisoned page.
  std::vector<int32_t> moved((nseq + 1) * max_blocks, perm.back()), poisoned(table.size(), perm.back());
  for (int s = 0; s < nseq; ++s)
    std::copy(table.begin() + s * max_blocks, table.begin() + (s + 1) * max_blocks,
              moved.begin() + (nseq - 1 - s) * max_blocks);
  DeviceBuffer dmoved = ToDevice(moved), dpoisoned = ToDevice(poisoned);
  std::vector<const int32_t*> seq_ptrs(nseq);
  for (int s = 0; s < nseq; ++s) seq_ptrs[s] = dmoved.as<int32_t>() + (nseq - 1 - s) * max_blocks;
  DeviceBuffer dseq_ptrs = ToDevice(seq_ptrs);
  AttentionDevice dev;
  ASSERT_EQ(ProbeAttentionDevice(0, &dev), cudaSuccess);
  AttentionPlan served;
  ASSERT_EQ(PlanAttention(a, dev, &served, {.splits = c.splits}), cudaSuccess);
  EXPECT_EQ(IsSpecialised(served.kernel), c.expect_fast) << AttnKernelName(served.kernel);
  const bool formats = served.kernel == AttnKernel::kFormats || served.kernel == AttnKernel::kFormatTiles;
  EXPECT_EQ(formats, c.expect_formats) << AttnKernelName(served.kernel);
  // Every served kernel that can run the launch, the plan's choice first;
  // the kernels that rotate their own queries run once more with the K
  // signs through the descriptors (k_signs null).
  // Each runs again with per-sequence tables.
  struct Run {
    AttnKernel kernel;
    bool signs;
    bool seq_tables = false;
  };
  std::vector<Run> runs;
  for (AttnKernel k : EligibleAttentionKernels(a, dev)) {
    runs.push_back({k, true});
    runs.push_back({k, true, true});
    if (k_signs != nullptr && (k == AttnKernel::kRowSets || k == AttnKernel::kStagedTma)) runs.push_back({k, false});
  }
  ASSERT_FALSE(runs.empty());
  for (const Run& run : runs) {
    SCOPED_TRACE(std::string(AttnKernelName(run.kernel)) + (run.signs ? "" : " (signs through the descriptors)") +
                 (run.seq_tables ? " (per-sequence tables)" : ""));
    a.k_signs = run.signs ? k_signs : nullptr;
    a.block_table = run.seq_tables ? dpoisoned.as<int32_t>() : dt.as<int32_t>();
    a.seq_tables = run.seq_tables ? dseq_ptrs.as<const int32_t*>() : nullptr;
    AttentionPlan plan;
    ASSERT_EQ(PlanAttention(a, dev, &plan, {.splits = c.splits, .kernel = run.kernel}), cudaSuccess);
    DeviceBuffer ws = *DeviceBuffer::Allocate(plan.workspace_bytes);
    a.workspace = ws.get();
    a.workspace_bytes = ws.bytes();
    ASSERT_EQ(cudaMemset(dout.get(), 0xFF, nq * QH * dim * sizeof(float)), cudaSuccess);
    ASSERT_EQ(LaunchAttention(a, plan, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> out = ToHost<float>(dout, nq * QH * dim);
    // Per query relative error, and non-triviality.
    for (int64_t i = 0; i < nq; ++i) {
      const double* r = ref_all.data() + i * QH * dim;
      const float* o = out.data() + i * QH * dim;
      const double err = RelativeError(r, o, QH * dim);
      EXPECT_LT(err, 2e-3) << "query " << i << " (seq " << qseq[i] << ", position " << positions[i] << ")"
                           << " out[0] " << o[0] << " ref[0] " << r[0];
      double norm = 0;
      for (int j = 0; j < QH * dim; ++j) norm += double(o[j]) * o[j];
      EXPECT_GT(norm, 1e-6) << "trivial output for query " << i;
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> c;
  // Fast path (TQ4, K4/V2, K2/V4, K2/V2) at d=128, GQA 4 and 8, planned and forced splits.
  c.push_back({"k4v4", 128, 32, 8, {1, 37, 300, 1000}, {}, 1, 0, true});
  c.push_back({"k4v2", 128, 32, 8, {16, 45, 513}, {}, 1, 7, true});
  c.push_back({"k2v4", 128, 16, 2, {77, 3}, {}, 1, 0, true});
  c.push_back({"k2v2", 128, 4, 4, {129}, {}, 1, 3, true});
  c.push_back({"k4v4", 128, 8, 1, {2000}, {}, 1, 0, true});
  // Tensor-core kernel (kv_heads % 4 == 0): G = 2 and 8, long contexts with
  // planned splits, prefill.
  c.push_back({"k2v4", 128, 8, 4, {77, 300, 16}, {}, 1, 0, true});
  c.push_back({"k4v4", 128, 64, 8, {1500}, {}, 1, 5, true});
  c.push_back({"k4v4", 128, 32, 8, {6000, 17}, {}, 1, 0, true});
  c.push_back({"k4v2", 128, 16, 4, {9000}, {}, 1, 0, true});
  c.push_back({"k4v2", 128, 16, 4, {100, 33}, {}, 20, 0, true});
  // The specialised kernels at awkward sizes: odd batches, partial
  // last blocks, GQA 2 / 4 / 8, all four bit pairs.
  c.push_back({"k4v4", 128, 8, 4, {1, 17, 255}, {}, 1, 0, true});
  c.push_back({"k4v2", 128, 32, 4, {301, 2, 49}, {}, 1, 3, true});
  c.push_back({"k2v2", 128, 16, 4, {1100, 15, 33}, {}, 1, 0, true});
  c.push_back({"k2v4", 128, 64, 8, {513}, {}, 1, 0, true});
  // G = 1 with 4-bit keys (7 of the tiles' 8 query columns are padding),
  // partial last blocks, forced splits.
  c.push_back({"k4v4", 128, 4, 4, {37, 1000, 16}, {}, 1, 3, true});
  // 3 quads of kv heads, odd lengths, G = 8 2-bit.
  c.push_back({"k4v2", 128, 24, 12, {200, 31, 1}, {}, 1, 0, true});
  c.push_back({"k2v2", 128, 64, 8, {5000, 47}, {}, 1, 0, true});
  c.push_back({"k4v4", 128, 16, 4, {16, 4111}, {}, 1, 9, true});
  // Row sets: two groups of 8 kv heads (the last group's tensor box runs
  // past the token's rows), prefill over row sets.
  c.push_back({"k4v2", 128, 32, 16, {260, 1, 47}, {}, 1, 5, true});
  c.push_back({"k4v4", 128, 16, 16, {33, 518}, {}, 1, 3, true});
  c.push_back({"k4v4", 128, 32, 8, {90, 40}, {}, 19, 0, true});
  // Row sets over 12 splits (the short sequence's later splits empty) and
  // 20 splits.
  c.push_back({"k4v4", 128, 32, 8, {3000, 77}, {}, 1, 12, true});
  c.push_back({"k4v2", 128, 32, 8, {5000, 300}, {}, 1, 20, true});
  // 200 forced splits: the split merge's warps take 12-13 splits each, in
  // two rounds of kMergeSplitsPerRound; most of the short sequence's
  // splits are empty.
  c.push_back({"k4v4", 128, 32, 8, {6000, 17}, {}, 1, 200, true});
  // QR rotation: the staged kernel takes PrepareQueryKernel's queries
  // instead of rotating its own (block Hadamard only).
  c.push_back({"k4v4", 128, 32, 8, {700, 45}, {}, 1, 0, true, true});
  c.push_back({"k4v2", 128, 16, 4, {333}, {}, 1, 0, true, true});
  // Dense tails on the fast path (the fast merge attends them): every tail
  // length 0..15 in mixed batches of different lengths (a sequence of tail
  // tokens only), GQA 1 / 2 / 4 / 8, the CUDA-core kernel (kv_heads % 4 != 0),
  // fp32 tail rows (as the server stages them), a QR rotation and prefill.
  const std::vector<int64_t> mixed = {4096, 0, 16, 33, 160, 1000, 2048, 17, 512, 64, 4000, 1, 256, 3000, 80, 700};
  const std::vector<int64_t> tails = {1, 7, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12, 13, 14, 15};
  c.push_back({"k4v4", 128, 32, 8, mixed, tails, 1, 0, true});
  c.push_back({"k4v2", 128, 16, 4, mixed, tails, 1, 0, true});
  c.push_back({"k2v2", 128, 8, 8, {300, 16, 45, 1024}, {15, 3, 0, 9}, 1, 0, true});
  c.push_back({"k2v2", 128, 32, 8, mixed, tails, 1, 0, true});
  c.push_back({"k2v2", 128, 16, 8, {4111, 700}, {2, 0}, 1, 9, true});
  c.push_back({"k2v2", 128, 32, 8, {700, 45}, {3, 12}, 1, 0, true, true});
  c.push_back({"k2v2", 128, 32, 8, {100, 48}, {12, 3}, 23, 0, true});
  c.push_back({"k2v4", 128, 16, 8, {77, 512}, {14, 1}, 1, 0, true});
  c.push_back({"k4v4", 128, 64, 8, {9008}, {15}, 1, 0, true, false, kGpuF32});
  c.push_back({"k4v2", 128, 32, 8, {4096, 48}, {11, 6}, 1, 0, true, false, kGpuF32});
  c.push_back({"k4v2", 128, 8, 2, {48, 160}, {5, 15}, 1, 0, true});
  c.push_back({"k4v4", 128, 32, 8, {700, 45}, {9, 3}, 1, 0, true, true});
  c.push_back({"k4v4", 128, 32, 8, {100, 48}, {12, 3}, 23, 0, true});
  c.push_back({"k4v4", 128, 32, 8, {40, 7}, {5, 0}, 1, 0, true});
  // The formats kernel (and the generic one): other bits, dims, recipes,
  // tails, G = 3 / 12 / 16. Dense layers take the generic kernel only.
  auto formats = [&](Case f) {
    f.expect_formats = true;
    c.push_back(f);
  };
  formats({"k3v5", 96, 12, 4, {33, 100}, {}, 1, 0, false});
  formats({"k8v3", 64, 12, 1, {19}, {2}, 1, 2, false});
  formats({"k4v2", 256, 8, 2, {70}, {}, 1, 0, false});
  formats({"turboquant25", 128, 8, 2, {37, 90}, {3, 0}, 1, 0, false});
  formats({"turboquant35", 128, 8, 2, {64}, {}, 1, 2, false});
  formats({"turboquant25_noqjl", 64, 4, 2, {50}, {}, 1, 0, false});
  formats({"turboquant35_noqjl", 96, 6, 2, {41}, {1}, 1, 0, false});
  c.push_back({"fp16", 128, 8, 4, {30}, {4}, 1, 0, false});
  // Every mse width and asymmetric pairs at d = 128 over GQA 1..16, head
  // dims 64 / 96 / 256 with 2- and 4-bit rows, every tail length 0..15 in
  // mixed batches, a QR rotation, forced splits, fp32 tail rows.
  formats({"k3v3", 128, 32, 8, mixed, tails, 1, 0, false});
  formats({"k5v5", 128, 32, 2, {1000, 17, 300}, {3, 15, 0}, 1, 0, false});
  formats({"k8v8", 128, 8, 8, {513, 64}, {1, 9}, 1, 0, false});
  formats({"k3v2", 128, 4, 4, {2048}, {}, 1, 0, false});
  formats({"k5v3", 128, 8, 4, {129, 33}, {2, 0}, 1, 5, false});
  formats({"k8v4", 128, 16, 8, {260, 16, 1}, {}, 1, 0, false});
  formats({"k2v8", 128, 24, 12, {100}, {7}, 1, 0, false});
  formats({"k4v5", 128, 16, 1, {777}, {}, 1, 0, false});
  formats({"k4v4", 64, 32, 8, mixed, tails, 1, 0, false});
  formats({"k2v2", 96, 16, 8, {300, 47}, {4, 12}, 1, 0, false});
  formats({"k4v4", 256, 32, 8, {1000, 16, 77}, {0, 5, 15}, 1, 0, false});
  formats({"k4v2", 256, 16, 1, {600}, {13}, 1, 0, false});
  formats({"k3v3", 128, 16, 8, {700, 45}, {9, 3}, 1, 0, false, true});
  formats({"k5v5", 64, 4, 2, {2000, 9}, {6, 0}, 1, 0, false, false, kGpuF32});
  formats({"turboquant35", 128, 32, 8, {4000, 300, 16}, {1, 0, 14}, 1, 0, false});
  formats({"turboquant25", 256, 8, 4, {200}, {8}, 1, 0, false});
  formats({"turboquant35_noqjl", 128, 16, 1, {900, 31}, {10, 2}, 1, 0, false});
  formats({"turboquant25_noqjl", 128, 32, 8, {40, 1500}, {0, 11}, 1, 7, false});
  // Prefill / chunked prefill: many causal queries.
  c.push_back({"k4v4", 128, 8, 2, {100, 45}, {}, 23, 0, true});
  c.push_back({"k4v2", 128, 8, 2, {64}, {20}, 30, 0, true});
  formats({"turboquant35", 128, 4, 2, {48}, {}, 17, 3, false});
  formats({"k3v3", 96, 12, 4, {80, 30}, {5, 12}, 9, 0, false});
  return c;
}

INSTANTIATE_TEST_SUITE_P(All, AttentionKernels, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return Name(i.param); });

}  // namespace
}  // namespace tqkv::gpu
