// Encode/decode kernels vs the CPU codec: packed bytes identical to
// RowCodec::Encode (norms within 1 ulp) for every format family, at awkward
// sizes (odd token counts, partial blocks, d = 64/96/128/256, a QR
// rotation), with unreferenced slots poisoned (0xFF) and left untouched.
// The specialised d = 128 encode is checked with its quantisation tables and
// with the boundary search they replace, with its shared-memory transposes
// and the shuffles they replace, at both register budgets, also on rows of
// NaN, ±inf, zeros, denormals and huge values; its dispatch is checked
// without a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/page_codec.h"
#include "codec/test_util.h"
#include "gpu/codec_tables.h"
#include "gpu/kernels.h"
#include "gpu/quant_lut.h"
#include "gpu/test_support.h"

namespace tqkv::gpu {
namespace {

using ::tqkv::gpu::testing_util::ToDevice;
using ::tqkv::gpu::testing_util::ToHost;
using ::tqkv::testing_util::RandomRows;

struct Case {
  std::string format;
  int dim;
  DType dtype;
  bool qr = false;
  int heads = 3;  // 3: neither a multiple nor a divisor of 8 (no lane-row kernels)
};

std::string Name(const Case& c) {
  return c.format + "_d" + std::to_string(c.dim) + "_" + std::string(DTypeName(c.dtype)) + (c.qr ? "_qr" : "") +
         (c.heads != 3 ? "_h" + std::to_string(c.heads) : "");
}

std::vector<uint8_t> Convert(const std::vector<float>& x, DType t) {
  std::vector<uint8_t> out(x.size() * DTypeSize(t));
  FromFloat(t, x.data(), out.data(), x.size());
  return out;
}

uint32_t Ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return static_cast<uint32_t>(std::abs(static_cast<int64_t>(ia) - ib));
}

// Compares a GPU row with the CPU row: index/sign bytes exactly, norms
// within 1 ulp. Returns a description of the first difference, or "".
std::string CompareRow(const RowLayout& layout, const uint8_t* gpu, const uint8_t* cpu) {
  if (layout.spec.kind == ComponentSpec::Kind::kDense)
    return std::memcmp(gpu, cpu, layout.row_bytes) == 0 ? "" : "dense bytes differ";
  for (size_t gi = 0; gi < layout.groups.size(); ++gi) {
    const GroupLayout& g = layout.groups[gi];
    for (size_t b = 0; b < g.index_bytes; ++b)
      if (gpu[g.index_offset + b] != cpu[g.index_offset + b])
        return "group " + std::to_string(gi) + " index byte " + std::to_string(b) + " gpu " +
               std::to_string(gpu[g.index_offset + b]) + " cpu " + std::to_string(cpu[g.index_offset + b]);
    for (size_t b = 0; b < g.sign_bytes; ++b)
      if (gpu[g.sign_offset + b] != cpu[g.sign_offset + b]) return "group " + std::to_string(gi) + " sign byte differs";
    auto norm = [&](const uint8_t* r, size_t off) {
      if (g.fp16_norms) {
        uint16_t h;
        std::memcpy(&h, r + off, 2);
        return HalfToFloat(h);
      }
      float f;
      std::memcpy(&f, r + off, 4);
      return f;
    };
    // fp16 norms: 1 ulp of fp16 is at most 2^13 fp32 ulps.
    const uint32_t tol = g.fp16_norms ? (1u << 13) : 1u;
    if (Ulps(norm(gpu, g.norm_offset), norm(cpu, g.norm_offset)) > tol)
      return "group " + std::to_string(gi) + " norm " + std::to_string(norm(gpu, g.norm_offset)) + " vs " +
             std::to_string(norm(cpu, g.norm_offset));
    if (g.qjl && Ulps(norm(gpu, g.residual_offset), norm(cpu, g.residual_offset)) > tol)
      return "group " + std::to_string(gi) + " residual norm differs";
  }
  return "";
}

class CodecKernels : public ::testing::TestWithParam<Case> {};

TEST_P(CodecKernels, EncodeMatchesCpuAndDecodeRoundTrips) {
  TQ_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const int heads = c.heads, bs = 16, num_blocks = 5, dim = c.dim;
  const int64_t tokens = 37;  // odd; with gaps: blocks partly used
  auto fmt = *ParseFormat(c.format);
  RecipeMetadata meta;
  if (fmt.needs_metadata()) meta = ::tqkv::testing_util::MakeMetadata(c.format.substr(0, 12), dim, 1, heads);
  CodecOptions opts{.format = c.format, .seed = 1234};
  if (c.qr) opts.rotation = RotationKind::kQr;
  auto codec_or = ModelCodec::Create({1, heads, heads, dim, bs}, opts, fmt.needs_metadata() ? &meta : nullptr);
  ASSERT_TRUE(codec_or.ok()) << codec_or.status();
  const ModelCodec& codec = **codec_or;
  auto tables_or = DeviceCodecTables::Upload(codec);
  ASSERT_TRUE(tables_or.ok()) << tables_or.status();
  const DeviceCodecTables& tables = **tables_or;

  // Inputs: outliers, a zero row and a row of large values.
  std::vector<float> k = RandomRows(tokens * heads, dim, 11, 4), v = RandomRows(tokens * heads, dim, 12);
  for (int j = 0; j < dim; ++j) {
    k[5 * dim + j] = 0.0f;  // token 1 head 2: zero vector
    v[7 * dim + j] *= 300.0f;
  }
  std::vector<int64_t> slots(tokens);
  for (int64_t t = 0; t < tokens; ++t) slots[t] = (t * 7 + 3) % (num_blocks * bs);  // scattered
  slots[4] = -1;                                                                     // skipped
  PageGeometry kg = codec.k_geometry(0), vg = codec.v_geometry(0);
  kg.num_blocks = vg.num_blocks = num_blocks;
  std::vector<uint8_t> kp_cpu(kg.total_bytes(), 0xFF), vp_cpu(vg.total_bytes(), 0xFF);
  // The CPU reference sees the same rounded inputs.
  std::vector<uint8_t> kin = Convert(k, c.dtype), vin = Convert(v, c.dtype);
  ASSERT_TRUE(EncodeToPages(codec.layer(0), {kin.data(), c.dtype, tokens, heads, dim},
                            {vin.data(), c.dtype, tokens, heads, dim}, slots.data(), {kp_cpu.data(), kg},
                            {vp_cpu.data(), vg}, nullptr)
                  .ok());

  DeviceBuffer dk = ToDevice(kin), dv = ToDevice(vin), ds = ToDevice(slots);
  DeviceBuffer kp = ToDevice(std::vector<uint8_t>(kg.total_bytes(), 0xFF));
  DeviceBuffer vp = ToDevice(std::vector<uint8_t>(vg.total_bytes(), 0xFF));
  DeviceBuffer flag = *DeviceBuffer::Allocate(8);
  EncodeLaunch a;
  a.k = dk.get();
  a.v = dv.get();
  a.dtype = static_cast<int32_t>(c.dtype);
  a.tokens = tokens;
  a.heads = heads;
  a.dim = dim;
  a.slots = ds.as<int64_t>();
  a.k_pages = {kp.as<uint8_t>(), static_cast<int64_t>(kg.page_bytes()), bs, kg.num_slots()};
  a.v_pages = {vp.as<uint8_t>(), static_cast<int64_t>(vg.page_bytes()), bs, vg.num_slots()};
  a.k_comp = tables.device(0, Component::kKey);
  a.v_comp = tables.device(0, Component::kValue);
  a.max_group_channels = tables.max_group_channels(0);
  a.bad_slot = flag.as<unsigned long long>();
  a.host_k = &tables.host(0, 0, Component::kKey);
  a.host_v = &tables.host(0, 0, Component::kValue);
  // The specialised encode: plain mse k2v2, k3v3, k4v4, k8v8, k4v2, k2v4 at
  // d = 128, Hadamard rotation, any input dtype.
  const bool fast = (c.format == "k2v2" || c.format == "k3v3" || c.format == "k4v4" || c.format == "k8v8" ||
                     c.format == "k4v2" || c.format == "k2v4") &&
                    dim == 128 && !c.qr;
  EXPECT_EQ(EncodeUsesFastPath(a), fast);
  // 3-, 4- and 8-bit rows quantise through the codebooks' tables.
  EXPECT_EQ(EncodeUsesQuantLut(a), fast && c.format != "k2v2");
  ASSERT_EQ(LaunchEncode(a, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(ToHost<unsigned long long>(flag, 1)[0], kNoBadSlot);
  std::vector<uint8_t> kp_gpu = ToHost<uint8_t>(kp, kg.total_bytes()), vp_gpu = ToHost<uint8_t>(vp, vg.total_bytes());
  // Two lanes per row from 16-bit input to 2-, 3- and 4-bit rows where a
  // block can take whole tokens (heads a multiple or a divisor of 8;
  // served), else the 8-lane kernel.
  EXPECT_EQ(EncodeUsesLaneRows(a), fast && c.dtype != DType::kF32 && c.format != "k8v8" &&
                                       (heads % 8 == 0 || 8 % heads == 0));
  // Every other variant of the specialised encode writes the same bytes:
  // the boundary search instead of the tables, the 2-blocks-per-SM register
  // budget, and the 8-lane kernel from 16-bit input with, from fp16 input
  // (the only one with variants), shuffles instead of the shared-memory
  // transposes and the 3-blocks-per-SM register budget.
  const bool lane_served = EncodeUsesLaneRows(a);
  for (bool lane : {true, false})
    for (bool lut : {true, false})
      for (bool xpose : {true, false})
        for (int blocks : {2, 3}) {
          const bool served = lane == lane_served && xpose == kEncodeTransposeDefault &&
                              blocks == ServedEncodeBlocksPerSm(static_cast<int32_t>(c.dtype));
          if (!fast || (lut && served) || (!lut && !EncodeUsesQuantLut(a)) || (lane && !lane_served) ||
              (lane && xpose != kEncodeTransposeDefault) ||
              (!lane && c.dtype != DType::kF16 && xpose != kEncodeTransposeDefault) ||
              (!lane && c.dtype != DType::kF16 && blocks != ServedEncodeBlocksPerSm(static_cast<int32_t>(c.dtype))))
            continue;
          const std::string variant = std::string(lane ? "lane rows, " : "8 lanes, ") + (lut ? "tables" : "search") +
                                      (xpose ? ", transpose, " : ", shuffle, ") + std::to_string(blocks) +
                                      " blocks/SM";
          DeviceBuffer kps = ToDevice(std::vector<uint8_t>(kg.total_bytes(), 0xFF));
          DeviceBuffer vps = ToDevice(std::vector<uint8_t>(vg.total_bytes(), 0xFF));
          EncodeLaunch s = a;
          s.encode_lane_rows = lane;
          s.allow_quant_lut = lut;
          s.encode_transpose = xpose;
          s.encode_blocks_per_sm = blocks;
          s.k_pages.base = kps.as<uint8_t>();
          s.v_pages.base = vps.as<uint8_t>();
          EXPECT_TRUE(EncodeUsesFastPath(s)) << variant;
          EXPECT_EQ(EncodeUsesLaneRows(s), lane) << variant;
          EXPECT_EQ(EncodeUsesQuantLut(s), lut && EncodeUsesQuantLut(a)) << variant;
          ASSERT_EQ(LaunchEncode(s, nullptr), cudaSuccess) << variant;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << variant;
          EXPECT_EQ(ToHost<uint8_t>(kps, kg.total_bytes()), kp_gpu) << "K: " << variant << " differs from the default";
          EXPECT_EQ(ToHost<uint8_t>(vps, vg.total_bytes()), vp_gpu) << "V: " << variant << " differs from the default";
        }
  int failures = 0;
  for (int comp = 0; comp < 2; ++comp) {
    const PageGeometry& g = comp == 0 ? kg : vg;
    const auto& cpu = comp == 0 ? kp_cpu : vp_cpu;
    const auto& gpu = comp == 0 ? kp_gpu : vp_gpu;
    const RowLayout& layout = comp == 0 ? codec.layer(0).k(0).layout() : codec.layer(0).v(0).layout();
    for (int64_t slot = 0; slot < g.num_slots(); ++slot)
      for (int h = 0; h < heads; ++h) {
        const size_t off = g.offset(slot, h);
        const std::string diff = CompareRow(layout, gpu.data() + off, cpu.data() + off);
        if (!diff.empty() && failures++ < 5)
          ADD_FAILURE() << (comp ? "V" : "K") << " slot " << slot << " head " << h << ": " << diff;
        // Untouched (poisoned) rows stay poisoned.
        bool poisoned = true;
        for (size_t b = 0; b < g.row_bytes; ++b) poisoned = poisoned && cpu[off + b] == 0xFF;
        if (poisoned && std::memcmp(gpu.data() + off, cpu.data() + off, g.row_bytes) != 0 && failures++ < 5)
          ADD_FAILURE() << "poisoned row written at slot " << slot;
      }
  }
  EXPECT_EQ(failures, 0);

  // Out-of-range slot: error reported, nothing written.
  std::vector<int64_t> bad = slots;
  bad[tokens - 1] = kg.num_slots();
  DeviceBuffer dbad = ToDevice(bad);
  DeviceBuffer kp2 = ToDevice(std::vector<uint8_t>(kg.total_bytes(), 0xFF));
  DeviceBuffer vp2 = ToDevice(std::vector<uint8_t>(vg.total_bytes(), 0xFF));
  EncodeLaunch b = a;
  b.slots = dbad.as<int64_t>();
  b.k_pages.base = kp2.as<uint8_t>();
  b.v_pages.base = vp2.as<uint8_t>();
  ASSERT_EQ(LaunchEncode(b, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(ToHost<unsigned long long>(flag, 1)[0], static_cast<unsigned long long>(tokens - 1));
  EXPECT_EQ(ToHost<uint8_t>(kp2, kg.total_bytes()), std::vector<uint8_t>(kg.total_bytes(), 0xFF));

  // Decode the CPU pages on the GPU (fp32 out) vs RowCodec::Decode.
  DeviceBuffer kc = ToDevice(kp_cpu), vc = ToDevice(vp_cpu);
  DeviceBuffer ko = *DeviceBuffer::Allocate(tokens * heads * dim * 4), vo = *DeviceBuffer::Allocate(tokens * heads * dim * 4);
  DecodeLaunch d;
  d.k = ko.get();
  d.v = vo.get();
  d.dtype = kGpuF32;
  d.tokens = tokens;
  d.heads = heads;
  d.dim = dim;
  d.slots = ds.as<int64_t>();
  d.k_pages = {kc.as<uint8_t>(), static_cast<int64_t>(kg.page_bytes()), bs, kg.num_slots()};
  d.v_pages = {vc.as<uint8_t>(), static_cast<int64_t>(vg.page_bytes()), bs, vg.num_slots()};
  d.k_comp = a.k_comp;
  d.v_comp = a.v_comp;
  d.max_group_channels = a.max_group_channels;
  d.bad_slot = a.bad_slot;
  d.host_k = a.host_k;
  d.host_v = a.host_v;
  // The specialised decode (two lanes per row) where the specialised encode
  // runs and the heads are a multiple or a divisor of 8: the same values as
  // the generic kernel, fp32, fp16 and bf16 out.
  EXPECT_EQ(DecodeUsesFastPath(d), fast && (heads % 8 == 0 || 8 % heads == 0));
  ASSERT_EQ(LaunchDecode(d, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> kout = ToHost<float>(ko, tokens * heads * dim), vout = ToHost<float>(vo, tokens * heads * dim);
  if (DecodeUsesFastPath(d)) {
    DecodeLaunch gd = d;
    gd.allow_fast_path = false;
    for (int32_t dt : {kGpuF32, kGpuF16, kGpuBF16}) {
      const size_t bytes = tokens * heads * dim * (dt == kGpuF32 ? 4 : 2);
      DeviceBuffer fk = *DeviceBuffer::Allocate(bytes), fv = *DeviceBuffer::Allocate(bytes);
      DeviceBuffer gk = *DeviceBuffer::Allocate(bytes), gv = *DeviceBuffer::Allocate(bytes);
      DecodeLaunch f = d;
      f.dtype = gd.dtype = dt;
      f.k = fk.get(), f.v = fv.get(), gd.k = gk.get(), gd.v = gv.get();
      ASSERT_EQ(LaunchDecode(f, nullptr), cudaSuccess);
      ASSERT_EQ(LaunchDecode(gd, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(ToHost<uint8_t>(fk, bytes), ToHost<uint8_t>(gk, bytes)) << "K, dtype " << dt;
      EXPECT_EQ(ToHost<uint8_t>(fv, bytes), ToHost<uint8_t>(gv, bytes)) << "V, dtype " << dt;
    }
  }
  double worst = 0;
  double energy = 0;
  std::vector<float> ref(dim);
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int comp = 0; comp < 2; ++comp) {
        const float* got = (comp ? vout.data() : kout.data()) + (t * heads + h) * dim;
        if (slots[t] < 0) {
          for (int j = 0; j < dim; ++j) ASSERT_EQ(got[j], 0.0f);
          continue;
        }
        const PageGeometry& g = comp ? vg : kg;
        const RowCodec& rc = comp ? codec.layer(0).v(h) : codec.layer(0).k(h);
        rc.Decode((comp ? vp_cpu : kp_cpu).data() + g.offset(slots[t], h), ref.data());
        double num = 0, den = 0;
        for (int j = 0; j < dim; ++j) {
          num += (double(got[j]) - ref[j]) * (double(got[j]) - ref[j]);
          den += double(ref[j]) * ref[j];
        }
        energy += den;
        if (den > 0) worst = std::max(worst, std::sqrt(num / den));
      }
  EXPECT_LT(worst, 1e-4) << "decode differs from RowCodec::Decode";
  EXPECT_GT(energy, 0.0);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const char* f : {"k2v2", "k3v3", "k4v4", "k5v5", "k8v8", "k4v2", "k2v5", "turboquant25", "turboquant35",
                        "turboquant25_noqjl", "turboquant35_noqjl", "fp16"})
    for (int d : {64, 96, 128, 256}) cases.push_back({f, d, DType::kF16});
  cases.push_back({"k4v4", 128, DType::kBF16});
  cases.push_back({"k3v5", 96, DType::kF32});
  cases.push_back({"turboquant35", 128, DType::kF32});
  cases.push_back({"k4v2", 128, DType::kF16, true});
  cases.push_back({"k3v4", 80, DType::kF16, true});
  cases.push_back({"k4v4", 80, DType::kF16});  // block Hadamard 64 + 16
  // Specialised encode: bf16 / fp32 inputs, 3- and 8-bit rows, asymmetric.
  cases.push_back({"k3v3", 128, DType::kBF16});
  cases.push_back({"k8v8", 128, DType::kF32});
  cases.push_back({"k4v2", 128, DType::kF32});
  cases.push_back({"k2v2", 128, DType::kBF16});
  cases.push_back({"k2v4", 128, DType::kF32});
  cases.push_back({"k8v4", 128, DType::kF16});  // not a served pair: generic kernel
  // Heads a multiple or a divisor of 8: the lane-row encode (16-bit input to
  // 2-, 3-, 4-bit rows) and decode (every served pair).
  for (const char* f : {"k4v4", "k4v2", "k3v3", "k2v2", "k2v4", "k8v8"}) cases.push_back({f, 128, DType::kF16, false, 8});
  cases.push_back({"k4v2", 128, DType::kBF16, false, 8});
  cases.push_back({"k4v4", 128, DType::kF32, false, 8});
  cases.push_back({"k4v4", 128, DType::kF16, false, 16});
  cases.push_back({"k3v3", 128, DType::kBF16, false, 4});
  cases.push_back({"k2v2", 128, DType::kF16, false, 2});
  cases.push_back({"k4v4", 128, DType::kF16, false, 1});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, CodecKernels, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return Name(i.param); });

// The lane-row encode at every batch size it plans differently (a put
// frame's 16 tokens a block; a few passes per warp; the full 32-pass loop
// with a partial last block): the CPU codec's bytes, row for row.
TEST(LaneRowEncode, EveryBatchSizeMatchesCpu) {
  TQ_SKIP_WITHOUT_GPU();
  const int heads = 8, bs = 16, dim = 128;
  auto codec = *ModelCodec::Create({1, heads, 4 * heads, dim, bs}, {.format = "k4v4", .seed = 21}, nullptr);
  auto tables = *DeviceCodecTables::Upload(*codec);
  for (const int64_t tokens : {int64_t{16}, int64_t{64}, int64_t{4097}, int64_t{32 * 4096 + 37}}) {
    SCOPED_TRACE(tokens);
    const int64_t num_blocks = (tokens + bs - 1) / bs;
    const std::vector<uint8_t> kin = Convert(RandomRows(tokens * heads, dim, 31, 2), DType::kF16);
    const std::vector<uint8_t> vin = Convert(RandomRows(tokens * heads, dim, 32), DType::kF16);
    std::vector<int64_t> slots(tokens);
    for (int64_t t = 0; t < tokens; ++t) slots[t] = t;
    PageGeometry kg = codec->k_geometry(0), vg = codec->v_geometry(0);
    kg.num_blocks = vg.num_blocks = num_blocks;
    std::vector<uint8_t> kp_cpu(kg.total_bytes(), 0xFF), vp_cpu(vg.total_bytes(), 0xFF);
    ASSERT_TRUE(EncodeToPages(codec->layer(0), {kin.data(), DType::kF16, tokens, heads, dim},
                              {vin.data(), DType::kF16, tokens, heads, dim}, slots.data(), {kp_cpu.data(), kg},
                              {vp_cpu.data(), vg}, nullptr)
                    .ok());
    DeviceBuffer dk = ToDevice(kin), dv = ToDevice(vin), ds = ToDevice(slots), flag = *DeviceBuffer::Allocate(8);
    DeviceBuffer kp = ToDevice(std::vector<uint8_t>(kg.total_bytes(), 0xFF));
    DeviceBuffer vp = ToDevice(std::vector<uint8_t>(vg.total_bytes(), 0xFF));
    EncodeLaunch a;
    a.k = dk.get();
    a.v = dv.get();
    a.dtype = static_cast<int32_t>(DType::kF16);
    a.tokens = tokens;
    SetLayerPages(*codec, *tables, 0, kp.as<uint8_t>(), vp.as<uint8_t>(), num_blocks, ds.as<int64_t>(),
                  flag.as<unsigned long long>(), &a);
    a.host_k = &tables->host(0, 0, Component::kKey);
    a.host_v = &tables->host(0, 0, Component::kValue);
    ASSERT_TRUE(EncodeUsesLaneRows(a));
    ASSERT_EQ(LaunchEncode(a, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(ToHost<uint8_t>(kp, kg.total_bytes()) == kp_cpu) << "K pages differ from the CPU codec";
    EXPECT_TRUE(ToHost<uint8_t>(vp, vg.total_bytes()) == vp_cpu) << "V pages differ from the CPU codec";
  }
}

// The specialised encode on special rows (fp32 and fp16 input, d = 128):
// indices identical to the CPU codec and norms bit-identical (or both NaN),
// through the tables and through the boundary search, and from fp16 through
// the transposes and the shuffles at both register budgets.
class FastEncodeSpecialRows : public ::testing::TestWithParam<std::string> {};

TEST_P(FastEncodeSpecialRows, MatchCpu) {
  TQ_SKIP_WITHOUT_GPU();
  const int heads = 2, bs = 16, dim = 128, num_blocks = 3;
  const int64_t tokens = 40;
  auto codec = *ModelCodec::Create({1, heads, heads, dim, bs}, {.format = GetParam(), .seed = 77}, nullptr);
  auto tables = *DeviceCodecTables::Upload(*codec);
  std::vector<float> k = RandomRows(tokens * heads, dim, 5, 3), v = RandomRows(tokens * heads, dim, 6);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  auto row = [&](std::vector<float>& x, int r) { return x.data() + static_cast<size_t>(r) * dim; };
  for (std::vector<float>* x : {&k, &v}) {
    std::fill_n(row(*x, 0), dim, 0.0f);                                  // zero row
    row(*x, 1)[7] = nan;                                                 // one NaN
    row(*x, 2)[100] = -nan;
    row(*x, 3)[0] = inf;                                                 // ±inf
    row(*x, 4)[127] = -inf;
    for (int j = 0; j < dim; ++j) row(*x, 5)[j] *= 1e30f;               // squares overflow: inv = 0
    for (int j = 0; j < dim; ++j) row(*x, 6)[j] *= 1e-40f;              // denormal inputs
    for (int j = 0; j < dim; ++j) row(*x, 7)[j] = j == 3 ? 1e4f : 1e-4f; // one outlier
    for (int j = 0; j < dim; ++j) row(*x, 8)[j] = (j % 2 ? -1.0f : 1.0f) * 1e-20f;
    for (int r = 9; r < tokens * heads; ++r) {                           // scales 1e-30 .. 1e30
      const float scale = std::pow(10.0f, static_cast<float>(r % 13) * 5.0f - 30.0f);
      for (int j = 0; j < dim; ++j) row(*x, r)[j] *= scale;
    }
  }
  std::vector<int64_t> slots(tokens);
  for (int64_t t = 0; t < tokens; ++t) slots[t] = t;
  PageGeometry kg = codec->k_geometry(0), vg = codec->v_geometry(0);
  kg.num_blocks = vg.num_blocks = num_blocks;
  DeviceBuffer ds = ToDevice(slots), flag = *DeviceBuffer::Allocate(8);
  // fp32 input; fp16 and bf16 input (fp16: infinities, denormals and zeros
  // where fp32 had huge and tiny values) also through every kernel variant.
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::vector<uint8_t> kin = Convert(k, dt), vin = Convert(v, dt);
    std::vector<uint8_t> kp_cpu(kg.total_bytes(), 0xFF), vp_cpu(vg.total_bytes(), 0xFF);
    ASSERT_TRUE(EncodeToPages(codec->layer(0), {kin.data(), dt, tokens, heads, dim}, {vin.data(), dt, tokens, heads, dim},
                              slots.data(), {kp_cpu.data(), kg}, {vp_cpu.data(), vg}, nullptr)
                    .ok());
    DeviceBuffer dk = ToDevice(kin), dv = ToDevice(vin);
    for (bool lane : {true, false})
      for (bool lut : {true, false})
        for (bool xpose : {true, false})
          for (int blocks : {2, 3}) {
            // One row per lane from 16-bit input (its budgets 2 and 3); the
            // 8-lane kernel's variants from fp16, its served one otherwise.
            if (lane ? (dt == DType::kF32 || GetParam() == "k8v8" || xpose != kEncodeTransposeDefault)
                     : (dt != DType::kF16 &&
                        (xpose != kEncodeTransposeDefault || blocks != ServedEncodeBlocksPerSm(static_cast<int32_t>(dt)))))
              continue;
            const std::string variant = std::string(DTypeName(dt)) + (lane ? " lane rows," : " 8 lanes,") +
                                        (lut ? " tables" : " search") + (xpose ? ", transpose, " : ", shuffle, ") +
                                        std::to_string(blocks) + " blocks/SM";
            DeviceBuffer kp = ToDevice(std::vector<uint8_t>(kg.total_bytes(), 0xFF));
            DeviceBuffer vp = ToDevice(std::vector<uint8_t>(vg.total_bytes(), 0xFF));
            EncodeLaunch a;
            a.k = dk.get();
            a.v = dv.get();
            a.dtype = static_cast<int32_t>(dt);
            a.tokens = tokens;
            SetLayerPages(*codec, *tables, 0, kp.as<uint8_t>(), vp.as<uint8_t>(), num_blocks, ds.as<int64_t>(),
                          flag.as<unsigned long long>(), &a);
            a.host_k = &tables->host(0, 0, Component::kKey);
            a.host_v = &tables->host(0, 0, Component::kValue);
            a.encode_lane_rows = lane;
            a.allow_quant_lut = lut;
            a.encode_transpose = xpose;
            a.encode_blocks_per_sm = blocks;
            ASSERT_TRUE(EncodeUsesFastPath(a)) << variant;
            EXPECT_EQ(EncodeUsesLaneRows(a), lane) << variant;
            EXPECT_EQ(EncodeUsesQuantLut(a), lut && GetParam() != "k2v2") << variant;
            ASSERT_EQ(LaunchEncode(a, nullptr), cudaSuccess) << variant;
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << variant;
            int failures = 0;
            for (int comp = 0; comp < 2; ++comp) {
              const PageGeometry& g = comp ? vg : kg;
              const std::vector<uint8_t> gpu = ToHost<uint8_t>(comp ? vp : kp, g.total_bytes());
              const std::vector<uint8_t>& cpu = comp ? vp_cpu : kp_cpu;
              const size_t index_bytes = g.row_bytes - 4;  // fp32 norm after the indices
              for (int64_t t = 0; t < tokens; ++t)
                for (int h = 0; h < heads; ++h) {
                  const size_t off = g.offset(slots[t], h);
                  float ng, nc;
                  std::memcpy(&ng, gpu.data() + off + index_bytes, 4);
                  std::memcpy(&nc, cpu.data() + off + index_bytes, 4);
                  const bool same_norm = std::memcmp(&ng, &nc, 4) == 0 || (std::isnan(ng) && std::isnan(nc));
                  if ((std::memcmp(gpu.data() + off, cpu.data() + off, index_bytes) != 0 || !same_norm) && failures++ < 5)
                    ADD_FAILURE() << variant << (comp ? " V" : " K") << " row " << t * heads + h
                                  << " differs from the CPU codec (norm " << ng << " vs " << nc << ")";
                }
            }
            EXPECT_EQ(failures, 0) << variant;
          }
  }
}

INSTANTIATE_TEST_SUITE_P(D128, FastEncodeSpecialRows, ::testing::Values("k2v2", "k3v3", "k4v4", "k8v8", "k4v2"));

// Dispatch (host only, runs without a GPU): tables for every 3-, 4- and
// 8-bit component select the table kernels; a missing or oversized table,
// or allow_quant_lut = false, falls back to the boundary search.
TEST(FastEncodeDispatch, TablesOrSearch) {
  const uint32_t dummy = 0;  // table pointers are only tested for null here
  auto describe = [&](const std::string& format, bool with_tables) {
    auto codec = *ModelCodec::Create({1, 2, 2, 128, 16}, {.format = format}, nullptr);
    std::vector<GpuComponent> comps;
    for (int c = 0; c < 2; ++c)
      for (int h = 0; h < 2; ++h) {
        GpuComponent gc = DescribeComponent(c == 0 ? codec->layer(0).k(h) : codec->layer(0).v(h));
        const GpuGroup& g = gc.groups[0];
        auto lut = with_tables && LutMaxCells(g.mse_bits) > 0
                       ? BuildQuantLut((*GetCodebook(128, g.mse_bits))->boundaries_f.data(), g.num_boundaries,
                                       LutMaxCells(g.mse_bits))
                       : std::nullopt;
        if (lut.has_value()) {
          gc.groups[0].lut_cells = lut->cells;
          gc.groups[0].lut = &dummy;
        }
        comps.push_back(gc);
      }
    return comps;
  };
  auto launch = [](const std::vector<GpuComponent>& comps) {
    EncodeLaunch a;
    a.dtype = kGpuF16;
    a.tokens = 1;
    a.heads = 2;
    a.dim = 128;
    a.host_k = comps.data();
    a.host_v = comps.data() + 2;
    return a;
  };
  for (const char* format : {"k3v3", "k4v4", "k8v8", "k4v2", "k2v4"}) {
    std::vector<GpuComponent> comps = describe(format, true);
    EncodeLaunch a = launch(comps);
    EXPECT_TRUE(EncodeUsesFastPath(a)) << format;
    EXPECT_TRUE(EncodeUsesQuantLut(a)) << format;
    a.allow_quant_lut = false;
    EXPECT_TRUE(EncodeUsesFastPath(a)) << format;
    EXPECT_FALSE(EncodeUsesQuantLut(a)) << format;
    // The last head of a component with tables (V for k2v4).
    const int j = LutMaxCells(comps[1].groups[0].mse_bits) > 0 ? 1 : 3;
    // No table for it (BuildQuantLut found none): search.
    std::vector<GpuComponent> missing = comps;
    missing[j].groups[0].lut_cells = 0;
    missing[j].groups[0].lut = nullptr;
    EXPECT_FALSE(EncodeUsesQuantLut(launch(missing))) << format;
    EXPECT_TRUE(EncodeUsesFastPath(launch(missing))) << format;
    // More cells than the kernel's shared-memory table holds: search.
    std::vector<GpuComponent> big = comps;
    big[j].groups[0].lut_cells = LutMaxCells(big[j].groups[0].mse_bits) * 2;
    EXPECT_FALSE(EncodeUsesQuantLut(launch(big))) << format;
    // Descriptors without tables (DescribeComponent alone): search.
    EXPECT_FALSE(EncodeUsesQuantLut(launch(describe(format, false)))) << format;
  }
  // 2-bit rows always compare against their three boundaries.
  std::vector<GpuComponent> k2v2 = describe("k2v2", true);
  EXPECT_TRUE(EncodeUsesFastPath(launch(k2v2)));
  EXPECT_FALSE(EncodeUsesQuantLut(launch(k2v2)));
}

// Which launches take the two-lanes-per-row kernels (host only, runs
// without a GPU): encode from fp16 / bf16 to 2-, 3- and 4-bit rows, decode
// of every specialised format to fp16 / bf16 / fp32; heads a multiple or a
// divisor of 8; 16-byte aligned dense buffers.
TEST(FastEncodeDispatch, LaneRows) {
  auto describe = [](const std::string& format, int heads) {
    auto codec = *ModelCodec::Create({1, heads, heads, 128, 16}, {.format = format}, nullptr);
    std::vector<GpuComponent> comps;
    for (int c = 0; c < 2; ++c)
      for (int h = 0; h < heads; ++h)
        comps.push_back(DescribeComponent(c == 0 ? codec->layer(0).k(h) : codec->layer(0).v(h)));
    return comps;
  };
  void* const aligned = reinterpret_cast<void*>(uintptr_t{1} << 20);
  void* const off8 = reinterpret_cast<void*>((uintptr_t{1} << 20) + 8);
  for (const char* format : {"k2v2", "k3v3", "k4v4", "k8v8", "k4v2", "k2v4"})
    for (int heads : {1, 2, 3, 4, 8, 12, 16}) {
      const std::vector<GpuComponent> comps = describe(format, heads);
      const bool fits = heads % 8 == 0 || 8 % heads == 0;
      const std::string what = std::string(format) + ", " + std::to_string(heads) + " heads";
      auto fill = [&](auto& l) {  // the fields EncodeLaunch and DecodeLaunch share
        l.k = l.v = aligned;
        l.dtype = kGpuF16;
        l.tokens = 1;
        l.heads = heads;
        l.dim = 128;
        l.host_k = comps.data();
        l.host_v = comps.data() + heads;
      };
      EncodeLaunch e;
      fill(e);
      ASSERT_TRUE(EncodeUsesFastPath(e)) << what;
      EXPECT_EQ(EncodeUsesLaneRows(e), fits && std::string(format) != "k8v8") << what;
      EncodeLaunch o = e;
      o.dtype = kGpuBF16;
      EXPECT_EQ(EncodeUsesLaneRows(o), EncodeUsesLaneRows(e)) << what << ", bf16";
      o.dtype = kGpuF32;
      EXPECT_FALSE(EncodeUsesLaneRows(o)) << what << ", fp32";
      o = e;
      o.v = off8;  // 8-byte aligned: the 8-lane kernel still takes it
      EXPECT_TRUE(EncodeUsesFastPath(o)) << what;
      EXPECT_FALSE(EncodeUsesLaneRows(o)) << what << ", 8-byte aligned input";
      o = e;
      o.encode_lane_rows = false;
      EXPECT_FALSE(EncodeUsesLaneRows(o)) << what;

      DecodeLaunch d;
      fill(d);
      EXPECT_EQ(DecodeUsesFastPath(d), fits) << what;
      for (int32_t dt : {kGpuBF16, kGpuF32}) {
        DecodeLaunch x = d;
        x.dtype = dt;
        EXPECT_EQ(DecodeUsesFastPath(x), fits) << what << ", dtype " << dt;
      }
      DecodeLaunch x = d;
      x.k = off8;
      EXPECT_FALSE(DecodeUsesFastPath(x)) << what << ", 8-byte aligned output";
      x = d;
      x.allow_fast_path = false;
      EXPECT_FALSE(DecodeUsesFastPath(x)) << what;
      x = d;
      x.host_v = nullptr;  // no host descriptors: the generic kernel
      EXPECT_FALSE(DecodeUsesFastPath(x)) << what;
    }
  // Formats without the specialised kernels decode generically.
  for (const char* format : {"k5v5", "k3v4", "fp16"}) {
    const std::vector<GpuComponent> comps = describe(format, 8);
    DecodeLaunch d;
    d.dtype = kGpuF16;
    d.heads = 8;
    d.dim = 128;
    d.host_k = comps.data();
    d.host_v = comps.data() + 8;
    EXPECT_FALSE(DecodeUsesFastPath(d)) << format;
  }
}

// Register budgets the specialised encode is not compiled for are refused
// before anything is enqueued (runs without a GPU).
TEST(FastEncodeDispatch, RejectsOtherBlocksPerSm) {
  unsigned long long flag = kNoBadSlot;  // host memory: never reached
  for (int blocks : {0, 1, 4}) {
    EncodeLaunch a;
    a.tokens = 1;
    a.heads = 1;
    a.bad_slot = &flag;
    a.encode_blocks_per_sm = blocks;
    EXPECT_EQ(LaunchEncode(a, nullptr), cudaErrorInvalidValue) << blocks;
  }
}

}  // namespace
}  // namespace tqkv::gpu
