// CudaBackend vs CpuBackend: identical encoded blocks, matching decode, and
// attention through the device arena (hits, misses, LRU eviction, Forget).
#include "gpu/cuda_backend.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "codec/cpu_backend.h"
#include "codec/dtype.h"
#include "codec/quality.h"
#include "codec/test_util.h"
#include "gpu/convert.h"
#include "gpu/gpu_codec.h"
#include "gpu/test_support.h"

namespace tqkv::gpu {
namespace {

using ::tqkv::testing_util::RandomRows;
using ::tqkv::testing_util::ToHalf;

TEST(CudaBackend, UnavailableWithoutDevice) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a device is present";
  auto b = CreateCudaBackend({});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable) << b.status();
}

// A model of `format` whose last layer is kept dense (recipes get generated
// channel metadata).
std::unique_ptr<ModelCodec> TestCodec(const char* format, const ModelShape& shape) {
  auto fmt = *ParseFormat(format);
  RecipeMetadata meta;
  if (fmt.needs_metadata())
    meta = ::tqkv::testing_util::MakeMetadata(std::string(format).substr(0, 12), shape.head_dim, shape.num_layers,
                                              shape.num_kv_heads);
  return *ModelCodec::Create(shape, {.format = format, .dense_last_layers = 1, .seed = 3},
                             fmt.needs_metadata() ? &meta : nullptr);
}

// Bytes of a device arena holding `slots` blocks of `codec` (slots are
// rounded up to 256 bytes, as DeviceBlockCache::EnsureSlotBytes does).
size_t ArenaOfSlots(const ModelCodec& codec, size_t slots) {
  return slots * ((codec.block_bytes() + 255) / 256 * 256);
}

// A batch of blocks (full and partial, whole model and a layer range, one
// batch with mixed input dtypes) encodes to the CPU backend's bytes.
TEST(CudaBackend, EncodeBlocksMatchesCpuEncodeOfEachBlock) {
  TQ_SKIP_WITHOUT_GPU();
  for (const char* format : {"k4v4", "k3v2", "turboquant35", "fp16"}) {
    SCOPED_TRACE(format);
    const int layers = 3, H = 2, QH = 8, dim = 128, bs = 16;
    auto codec = TestCodec(format, {layers, H, QH, dim, bs});
    CpuBackend cpu({.threads = 0});
    auto gpu_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*codec, 4)});
    ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
    ComputeBackend& gpu = **gpu_or;
    const std::vector<int> tokens = {16, 16, 9, 16, 1, 16, 15};
    // A backend whose outputs lie in its pinned host arena downloads the
    // pages straight into them.
    auto pinned_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*codec, 4)});
    ASSERT_TRUE(pinned_or.ok()) << pinned_or.status();
    testing_util::HostRegion region =
        testing_util::PinnedRegion(**pinned_or, tokens.size() * codec->layer_range_bytes(0, layers));
    ASSERT_NE(region, nullptr);
    struct Range {
      int first, last;
      bool mixed;  // block 3's input is fp32 (the batch falls back to one block at a time)
    };
    for (const Range r : {Range{0, layers, false}, Range{1, 3, false}, Range{0, layers, true}}) {
      SCOPED_TRACE("layers [" + std::to_string(r.first) + ", " + std::to_string(r.last) + ")" +
                   (r.mixed ? " mixed dtypes" : ""));
      const size_t bytes = codec->layer_range_bytes(r.first, r.last);
      std::deque<std::vector<uint16_t>> halves;
      std::deque<std::vector<float>> floats;
      std::vector<ComputeBackend::EncodeItem> items(tokens.size());
      std::vector<std::vector<uint8_t>> got(tokens.size(), std::vector<uint8_t>(bytes, 0x5A));
      for (size_t b = 0; b < tokens.size(); ++b) {
        const int t = tokens[b];
        for (int l = r.first; l < r.last; ++l) {
          for (int c = 0; c < 2; ++c) {
            std::vector<float> rows = RandomRows(t * H, dim, 100 * b + 10 * l + c, c == 0 ? 2 : 0);
            DenseView view;
            if (r.mixed && b == 3) {
              floats.push_back(std::move(rows));
              view = {floats.back().data(), DType::kF32, t, H, dim};
            } else {
              halves.push_back(ToHalf(rows));
              view = {halves.back().data(), DType::kF16, t, H, dim};
            }
            (c == 0 ? items[b].k : items[b].v).push_back(view);
          }
        }
        items[b].out = got[b].data();
      }
      absl::Status s = gpu.EncodeBlocks(*codec, r.first, r.last, items);
      ASSERT_TRUE(s.ok()) << s;
      for (size_t b = 0; b < tokens.size(); ++b) {
        std::vector<uint8_t> want(bytes, 0x11);
        ASSERT_TRUE(cpu.EncodeBlock(*codec, r.first, r.last, items[b].k, items[b].v, want.data()).ok());
        EXPECT_EQ(got[b], want) << "block " << b << " (" << tokens[b] << " tokens)";
      }
      std::memset(region.get(), 0x5A, tokens.size() * bytes);
      std::vector<ComputeBackend::EncodeItem> in_arena = items;
      for (size_t b = 0; b < tokens.size(); ++b) in_arena[b].out = region.get() + b * bytes;
      ASSERT_TRUE((*pinned_or)->EncodeBlocks(*codec, r.first, r.last, in_arena).ok());
      for (size_t b = 0; b < tokens.size(); ++b)
        EXPECT_EQ(std::vector<uint8_t>(in_arena[b].out, in_arena[b].out + bytes), got[b]) << "pinned, block " << b;
      // The batch decodes back like the CPU backend: fp16 outputs for every
      // block (decoded to fp16 on the device), then fp16 and fp32 mixed.
      for (bool mixed_out : {false, true}) {
        const size_t layer_elems = size_t{bs} * H * dim, nl = r.last - r.first;
        std::vector<std::vector<float>> out32(tokens.size()), want32(tokens.size());
        std::vector<std::vector<uint16_t>> out16(tokens.size()), want16(tokens.size());
        std::vector<ComputeBackend::DecodeItem> dec(tokens.size());
        for (size_t b = 0; b < tokens.size(); ++b) {
          const bool f32 = mixed_out && b % 2 == 1;
          out32[b].assign(2 * nl * layer_elems, NAN);
          out16[b].assign(2 * nl * layer_elems, 0xFFFF);
          dec[b].payload = got[b].data();
          for (size_t i = 0; i < 2 * nl; ++i) {
            MutableDenseView view = f32 ? MutableDenseView{out32[b].data() + i * layer_elems, DType::kF32, bs, H, dim}
                                        : MutableDenseView{out16[b].data() + i * layer_elems, DType::kF16, bs, H, dim};
            (i < nl ? dec[b].k : dec[b].v).push_back(view);
          }
        }
        s = gpu.DecodeBlocks(*codec, r.first, r.last, dec);
        ASSERT_TRUE(s.ok()) << s;
        for (size_t b = 0; b < tokens.size(); ++b) {
          const bool f32 = mixed_out && b % 2 == 1;
          std::vector<float> want(2 * nl * layer_elems), have(2 * nl * layer_elems);
          std::vector<MutableDenseView> wk, wv;
          for (size_t i = 0; i < 2 * nl; ++i)
            (i < nl ? wk : wv).push_back({want.data() + i * layer_elems, DType::kF32, bs, H, dim});
          ASSERT_TRUE(cpu.DecodeBlock(*codec, r.first, r.last, got[b].data(), wk, wv).ok());
          if (f32) {
            have = out32[b];
          } else {
            ToFloat(DType::kF16, out16[b].data(), have.data(), have.size());
          }
          EXPECT_LT(RelativeMse(want.data(), have.data(), want.size()), f32 ? 1e-8 : 1e-6)
              << "block " << b << (f32 ? " fp32" : " fp16") << (mixed_out ? ", mixed outputs" : "");
        }
      }
    }
  }
}

// Bulk calls from several threads at once (as the server's work threads
// make them), of different sizes: every encode is the CPU backend's bytes
// and every decode its values.
TEST(CudaBackend, ConcurrentBulkCallsMatchTheCpuBackend) {
  TQ_SKIP_WITHOUT_GPU();
  const int layers = 3, H = 8, dim = 128, bs = 16;
  auto codec = TestCodec("k4v4", {layers, H, 4 * H, dim, bs});
  CpuBackend cpu({.threads = 0});
  auto gpu_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*codec, 4)});
  ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
  ComputeBackend& gpu = **gpu_or;
  const size_t bytes = codec->block_bytes(), layer_elems = size_t{bs} * H * dim;
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0}, failures{0};
  for (int th = 0; th < 5; ++th) {
    threads.emplace_back([&, th] {
      for (int round = 0; round < 6; ++round) {
        const int n = 1 + (th + round) % 5;
        std::deque<std::vector<uint16_t>> halves;
        std::vector<ComputeBackend::EncodeItem> items(n);
        std::vector<std::vector<uint8_t>> got(n, std::vector<uint8_t>(bytes, 0x5A));
        for (int b = 0; b < n; ++b) {
          const int t = b == 0 ? 1 + round : bs;
          for (int l = 0; l < layers; ++l)
            for (int c = 0; c < 2; ++c) {
              halves.push_back(ToHalf(RandomRows(t * H, dim, 1000 * th + 100 * round + 10 * b + 2 * l + c)));
              (c == 0 ? items[b].k : items[b].v).push_back({halves.back().data(), DType::kF16, t, H, dim});
            }
          items[b].out = got[b].data();
        }
        if (!gpu.EncodeBlocks(*codec, 0, layers, items).ok()) {
          failures++;
          continue;
        }
        std::vector<ComputeBackend::DecodeItem> dec(n);
        std::vector<std::vector<uint16_t>> out(n, std::vector<uint16_t>(2 * layers * layer_elems, 0xFFFF));
        for (int b = 0; b < n; ++b) {
          std::vector<uint8_t> want(bytes, 0x11);
          if (!cpu.EncodeBlock(*codec, 0, layers, items[b].k, items[b].v, want.data()).ok() || got[b] != want)
            mismatches++;
          dec[b].payload = got[b].data();
          for (int i = 0; i < 2 * layers; ++i)
            (i < layers ? dec[b].k : dec[b].v).push_back({out[b].data() + i * layer_elems, DType::kF16, bs, H, dim});
        }
        if (!gpu.DecodeBlocks(*codec, 0, layers, dec).ok()) {
          failures++;
          continue;
        }
        for (int b = 0; b < n; ++b) {
          std::vector<float> want(2 * layers * layer_elems), have(want.size());
          std::vector<MutableDenseView> wk, wv;
          for (int i = 0; i < 2 * layers; ++i)
            (i < layers ? wk : wv).push_back({want.data() + i * layer_elems, DType::kF32, bs, H, dim});
          if (!cpu.DecodeBlock(*codec, 0, layers, got[b].data(), wk, wv).ok()) mismatches++;
          ToFloat(DType::kF16, out[b].data(), have.data(), have.size());
          if (RelativeMse(want.data(), have.data(), want.size()) > 1e-6) mismatches++;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(CudaBackend, MatchesCpuBackend) {
  TQ_SKIP_WITHOUT_GPU();
  for (const char* format : {"k4v4", "k3v2", "turboquant35", "fp16"}) {
    SCOPED_TRACE(format);
    const int layers = 3, H = 2, QH = 8, dim = 128, bs = 16;
    auto codec = TestCodec(format, {layers, H, QH, dim, bs});
    CpuBackend cpu({.threads = 0});
    // Arena of 4 slots: a 5-block batch cannot fit.
    auto gpu_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*codec, 4)});
    ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
    ComputeBackend& gpu = **gpu_or;
    const int blocks = 5;
    std::vector<std::vector<uint8_t>> payloads(blocks, std::vector<uint8_t>(codec->block_bytes()));
    for (int b = 0; b < blocks; ++b) {
      const int tokens = b == blocks - 1 ? 9 : bs;  // partial last block
      std::vector<std::vector<uint16_t>> hk, hv;
      std::vector<DenseView> k, v;
      for (int l = 0; l < layers; ++l) {
        hk.push_back(ToHalf(RandomRows(tokens * H, dim, 10 * b + l, 2)));
        hv.push_back(ToHalf(RandomRows(tokens * H, dim, 10 * b + l + 500)));
      }
      for (int l = 0; l < layers; ++l) {
        k.push_back({hk[l].data(), DType::kF16, tokens, H, dim});
        v.push_back({hv[l].data(), DType::kF16, tokens, H, dim});
      }
      std::vector<uint8_t> want(codec->block_bytes(), 0x11);
      ASSERT_TRUE(cpu.EncodeBlock(*codec, 0, layers, k, v, want.data()).ok());
      absl::Status s = gpu.EncodeBlock(*codec, 0, layers, k, v, payloads[b].data());
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(payloads[b], want) << "block " << b;
      // Decode layers [0, 2) on both.
      std::vector<float> gk(2 * bs * H * dim), gv(gk.size()), ck(gk.size()), cv(gk.size());
      std::vector<MutableDenseView> gkv, gvv, ckv, cvv;
      for (int l = 0; l < 2; ++l) {
        gkv.push_back({gk.data() + l * bs * H * dim, DType::kF32, bs, H, dim});
        gvv.push_back({gv.data() + l * bs * H * dim, DType::kF32, bs, H, dim});
        ckv.push_back({ck.data() + l * bs * H * dim, DType::kF32, bs, H, dim});
        cvv.push_back({cv.data() + l * bs * H * dim, DType::kF32, bs, H, dim});
      }
      ASSERT_TRUE(gpu.DecodeBlock(*codec, 0, 2, payloads[b].data(), gkv, gvv).ok());
      ASSERT_TRUE(cpu.DecodeBlock(*codec, 0, 2, payloads[b].data(), ckv, cvv).ok());
      EXPECT_LT(RelativeMse(ck.data(), gk.data(), ck.size()), 1e-8);
      EXPECT_LT(RelativeMse(cv.data(), gv.data(), cv.size()), 1e-8);
    }
    // Two sequences of 2 blocks (+ a dense tail on one) per batch.
    std::vector<float> tail = RandomRows(3 * H, dim, 77);
    for (int layer = 0; layer < layers; ++layer) {
      AttendBatch batch;
      batch.layer = layer;
      batch.shape = {QH, H, dim, 0};
      AttendSequence s0, s1;
      const std::vector<BlockRef> r0 = {{1, payloads[0].data()}, {2, payloads[1].data()}};
      const std::vector<BlockRef> r1 = {{3, payloads[2].data()}, {5, payloads[4].data()}};
      s0.blocks = r0;
      s0.packed_tokens = 29;
      s1.blocks = r1;
      s1.packed_tokens = 25;
      s1.tail_k = {tail.data(), DType::kF32, 3, H, dim};
      s1.tail_v = {tail.data(), DType::kF32, 3, H, dim};
      batch.sequences = {s0, s1};
      batch.query_offsets = {0, 1, 3};
      batch.positions = {28, 20, 27};
      std::vector<float> q = RandomRows(3 * QH, dim, 1000 + layer);
      std::vector<float> got(q.size()), want(q.size());
      PointAtContiguousF32(batch, q.data(), got.data());
      absl::Status st = gpu.Attend(*codec, batch);
      ASSERT_TRUE(st.ok()) << st;
      PointAtContiguousF32(batch, q.data(), want.data());
      ASSERT_TRUE(cpu.Attend(*codec, batch).ok());
      std::vector<double> wd(want.begin(), want.end());
      EXPECT_LT(RelativeError(wd.data(), got.data(), got.size()), 2e-3) << "layer " << layer;
      // bf16 queries in, bf16 outputs out: the fp32 call on the same
      // (rounded) queries, rounded once.
      std::vector<uint16_t> q16(q.size()), out16(q.size()), want16(q.size());
      FromFloat(DType::kBF16, q.data(), q16.data(), q.size());
      ToFloat(DType::kBF16, q16.data(), q.data(), q.size());
      PointAtContiguousF32(batch, q.data(), got.data());
      ASSERT_TRUE(gpu.Attend(*codec, batch).ok());
      FromFloat(DType::kBF16, got.data(), want16.data(), got.size());
      const size_t row = static_cast<size_t>(QH) * dim;
      for (size_t i = 0; i < batch.sequences.size(); ++i) {
        batch.sequences[i].q = q16.data() + batch.query_offsets[i] * row;
        batch.sequences[i].out = out16.data() + batch.query_offsets[i] * row;
        batch.sequences[i].dtype = DType::kBF16;
      }
      ASSERT_TRUE(gpu.Attend(*codec, batch).ok());
      EXPECT_EQ(out16, want16) << "layer " << layer;
    }
    BackendStats st = gpu.Stats();
    EXPECT_EQ(st.device_blocks, 4u);
    EXPECT_EQ(st.uploads, 4u);  // cached across the three layers
    EXPECT_EQ(st.evictions, 0u);
    EXPECT_EQ(st.device_bytes_used, 4 * codec->block_bytes());
    gpu.Forget(5);
    EXPECT_EQ(gpu.Stats().device_blocks, 3u);
    auto run = [&](int first_id, int n) {
      AttendBatch big;
      big.layer = 0;
      big.shape = {QH, H, dim, 0};
      AttendSequence all;
      std::vector<BlockRef> refs;
      for (int b = 0; b < n; ++b) refs.push_back({uint64_t(first_id + b), payloads[b].data()});
      all.blocks = refs;
      all.packed_tokens = 16 * (n - 1) + 9;
      big.sequences = {all};
      big.query_offsets = {0, 1};
      big.positions = {all.packed_tokens - 1};
      std::vector<float> q(QH * dim, 0.1f), o(QH * dim);
      PointAtContiguousF32(big, q.data(), o.data());
      return gpu.Attend(*codec, big);
    };
    EXPECT_TRUE(run(10, 4).ok());  // one free slot + 3 LRU evictions
    st = gpu.Stats();
    EXPECT_EQ(st.uploads, 8u);
    EXPECT_EQ(st.evictions, 3u);
    EXPECT_EQ(run(20, 5).code(), absl::StatusCode::kResourceExhausted);
    // The failed call's blocks got slots their bytes never reached: none of
    // them stays resident, so the next call uploads them.
    EXPECT_EQ(gpu.Stats().device_blocks, 0u);
    const uint64_t uploads = gpu.Stats().uploads;
    EXPECT_TRUE(run(20, 4).ok());
    EXPECT_EQ(gpu.Stats().uploads, uploads + 4);
  }
}

// Two models whose blocks differ in size share the arena: the larger
// model's first call re-carves it (the smaller model's blocks are dropped
// and re-uploaded on their next use), and both keep matching the CPU.
TEST(CudaBackend, ModelsOfDifferentBlockSizesShareTheArena) {
  TQ_SKIP_WITHOUT_GPU();
  const int H = 2, QH = 8, dim = 128, bs = 16;
  auto small = *ModelCodec::Create({1, H, QH, dim, bs}, {.format = "k2v2"}, nullptr);
  auto big = *ModelCodec::Create({1, H, QH, dim, bs}, {.format = "k8v8"}, nullptr);
  ASSERT_LT(small->block_bytes(), big->block_bytes());
  CpuBackend cpu({.threads = 0});
  auto gpu_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*big, 4)});
  ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
  ComputeBackend& gpu = **gpu_or;
  auto payloads = [&](const ModelCodec& codec, uint64_t seed) {
    std::vector<std::vector<uint8_t>> p(2, std::vector<uint8_t>(codec.block_bytes()));
    for (int b = 0; b < 2; ++b) {
      std::vector<uint16_t> hk = ToHalf(RandomRows(bs * H, dim, seed + b)),
                            hv = ToHalf(RandomRows(bs * H, dim, seed + 10 + b));
      EXPECT_TRUE(cpu.EncodeBlock(codec, 0, 1, {{hk.data(), DType::kF16, bs, H, dim}},
                                  {{hv.data(), DType::kF16, bs, H, dim}}, p[b].data())
                      .ok());
    }
    return p;
  };
  const auto ps = payloads(*small, 100), pb = payloads(*big, 200);
  auto attend = [&](const ModelCodec& codec, const std::vector<std::vector<uint8_t>>& p, uint64_t first_id) {
    const std::vector<BlockRef> refs = {{first_id, p[0].data()}, {first_id + 1, p[1].data()}};
    AttendSequence s;
    s.blocks = refs;
    s.packed_tokens = 2 * bs;
    AttendBatch batch;
    batch.layer = 0;
    batch.shape = {QH, H, dim, 0};
    batch.sequences = {s};
    batch.query_offsets = {0, 1};
    batch.positions = {2 * bs - 1};
    std::vector<float> q = RandomRows(QH, dim, first_id), got(q.size()), want(q.size());
    PointAtContiguousF32(batch, q.data(), got.data());
    absl::Status st = gpu.Attend(codec, batch);
    ASSERT_TRUE(st.ok()) << st;
    PointAtContiguousF32(batch, q.data(), want.data());
    ASSERT_TRUE(cpu.Attend(codec, batch).ok());
    std::vector<double> wd(want.begin(), want.end());
    EXPECT_LT(RelativeError(wd.data(), got.data(), got.size()), 2e-3);
  };
  attend(*small, ps, 1);
  EXPECT_EQ(gpu.Stats().device_blocks, 2u);
  attend(*big, pb, 11);  // re-carves: the small model's two blocks are dropped
  BackendStats st = gpu.Stats();
  EXPECT_EQ(st.device_blocks, 2u);
  EXPECT_EQ(st.evictions, 2u);
  attend(*small, ps, 1);  // re-uploaded into the larger slots
  st = gpu.Stats();
  EXPECT_EQ(st.device_blocks, 4u);
  EXPECT_EQ(st.uploads, 6u);
  attend(*big, pb, 11);  // everything resident
  EXPECT_EQ(gpu.Stats().uploads, 6u);
}

// Remembered slot lists: a keyed sequence attended again reuses its slots
// while the arena is unchanged; when another sequence of the same batch evicts one
// of its blocks, it is re-acquired (re-uploaded) and results stay exact.
TEST(CudaBackend, ReusedSlotListsSurviveEvictionInTheSameBatch) {
  TQ_SKIP_WITHOUT_GPU();
  const int layers = 1, H = 2, QH = 4, dim = 128, bs = 16;
  auto codec = *ModelCodec::Create({layers, H, QH, dim, bs}, {.format = "k4v4"}, nullptr);
  CpuBackend cpu({.threads = 0});
  auto gpu_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*codec, 5)});
  ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
  ComputeBackend& gpu = **gpu_or;
  std::vector<std::vector<uint8_t>> payloads(6, std::vector<uint8_t>(codec->block_bytes()));
  for (int b = 0; b < 6; ++b) {
    std::vector<uint16_t> hk = ToHalf(RandomRows(bs * H, dim, 300 + b)),
                          hv = ToHalf(RandomRows(bs * H, dim, 400 + b));
    ASSERT_TRUE(cpu.EncodeBlock(*codec, 0, 1, {{hk.data(), DType::kF16, bs, H, dim}},
                                {{hv.data(), DType::kF16, bs, H, dim}}, payloads[b].data())
                    .ok());
  }
  std::deque<std::vector<BlockRef>> refs;  // the sequences' block lists, alive for the test
  auto seq = [&](std::vector<int> ids) {
    AttendSequence s;
    std::vector<BlockRef>& r = refs.emplace_back();
    for (int id : ids) r.push_back({uint64_t(id), payloads[id - 1].data()});
    s.blocks = r;
    s.sequence_key = 1000 + static_cast<uint64_t>(ids[0]);
    s.packed_tokens = bs * static_cast<int64_t>(ids.size());
    return s;
  };
  auto attend = [&](std::vector<AttendSequence> seqs, uint64_t seed) {
    AttendBatch batch;
    batch.layer = 0;
    batch.shape = {QH, H, dim, 0};
    batch.sequences = seqs;
    batch.query_offsets = {0};
    for (const AttendSequence& s : seqs) {
      batch.query_offsets.push_back(batch.query_offsets.back() + 1);
      batch.positions.push_back(s.packed_tokens - 1);
    }
    std::vector<float> q = RandomRows(seqs.size() * QH, dim, seed), got(q.size()), want(q.size());
    PointAtContiguousF32(batch, q.data(), got.data());
    absl::Status st = gpu.Attend(*codec, batch);
    EXPECT_TRUE(st.ok()) << st;
    PointAtContiguousF32(batch, q.data(), want.data());
    EXPECT_TRUE(cpu.Attend(*codec, batch).ok());
    std::vector<double> wd(want.begin(), want.end());
    EXPECT_LT(RelativeError(wd.data(), got.data(), got.size()), 2e-3);
  };
  attend({seq({1, 2})}, 1);  // A resident, its slots remembered
  attend({seq({5, 6})}, 2);  // B resident: 4 of 5 slots used
  attend({seq({1, 2})}, 3);  // A again: reused, no upload
  EXPECT_EQ(gpu.Stats().uploads, 4u);
  // A (reused, so not protected by this call's epoch) with C: C's 3 takes
  // the free slot and C's 4 evicts the LRU block, A's 1. The arena changed,
  // so A is re-acquired before the kernel runs: 1 and then 2 miss again and
  // evict the LRU blocks A's 2 and B's 5. Uploads 3, 4, 1, 2; evictions 3.
  attend({seq({1, 2}), seq({3, 4})}, 4);
  BackendStats st = gpu.Stats();
  EXPECT_EQ(st.uploads, 8u);
  EXPECT_EQ(st.evictions, 3u);
  attend({seq({1, 2}), seq({3, 4})}, 5);  // everything resident and reused
  EXPECT_EQ(gpu.Stats().uploads, 8u);
}

// The device conversions equal the host's: every fp16 and bf16 value to
// fp32, and fp32 values (ties, subnormals, overflow, infinities) back.
TEST(CudaBackend, DeviceConversionsEqualTheHosts) {
  TQ_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dt == DType::kF16 ? "fp16" : "bf16");
    const int32_t gdt = dt == DType::kF16 ? kGpuF16 : kGpuBF16;
    std::vector<uint16_t> all(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    std::vector<float> want(all.size()), got(all.size());
    ToFloat(dt, all.data(), want.data(), all.size());
    DeviceBuffer d16 = testing_util::ToDevice(all), d32 = *DeviceBuffer::Allocate(all.size() * sizeof(float));
    ASSERT_EQ(LaunchToFloat(d16.get(), gdt, d32.as<float>(), static_cast<int64_t>(all.size()), nullptr), cudaSuccess);
    got = testing_util::ToHost<float>(d32, all.size());
    for (size_t i = 0; i < all.size(); ++i)
      if (!std::isnan(want[i])) {
        ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << "value " << i;
      }
    std::vector<float> f = RandomRows(64, 1024, 3);
    for (size_t i = 0; i < f.size(); i += 7) f[i] *= std::ldexp(1.0f, static_cast<int>(i % 60) - 30);
    const float edges[] = {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, -6.0e-8f, 3.0e38f, INFINITY, -INFINITY, 1.0009765625f};
    std::copy(std::begin(edges), std::end(edges), f.begin());
    std::vector<uint16_t> host16(f.size()), dev16;
    FromFloat(dt, f.data(), host16.data(), f.size());
    DeviceBuffer df = testing_util::ToDevice(f), do16 = *DeviceBuffer::Allocate(f.size() * 2);
    ASSERT_EQ(LaunchFromFloat(df.as<float>(), gdt, do16.get(), static_cast<int64_t>(f.size()), nullptr), cudaSuccess);
    dev16 = testing_util::ToHost<uint16_t>(do16, f.size());
    EXPECT_EQ(dev16, host16);
  }
}

// A call with many fp16 or bf16 queries ships them and its outputs in
// their dtype and converts on the device: the outputs equal the fp32 call
// on the same queries, rounded once on the host, bit for bit; a call mixing
// dtypes converts on the host and gives the same values.
TEST(CudaBackend, LargeCallsShipQueriesAndOutputsInTheirDtype) {
  TQ_SKIP_WITHOUT_GPU();
  const int H = 8, QH = 32, dim = 128, bs = 16, nseq = 24;  // 24 × 4,096 query values: on the device
  auto codec = *ModelCodec::Create({1, H, QH, dim, bs}, {.format = "k4v4", .seed = 2}, nullptr);
  CpuBackend cpu({.threads = 0});
  auto gpu_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*codec, 8)});
  ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
  ComputeBackend& gpu = **gpu_or;
  std::vector<std::vector<uint8_t>> payloads(4, std::vector<uint8_t>(codec->block_bytes()));
  for (int b = 0; b < 4; ++b) {
    std::vector<float> k = RandomRows(bs * H, dim, 60 + b), v = RandomRows(bs * H, dim, 70 + b);
    ASSERT_TRUE(cpu.EncodeBlock(*codec, 0, 1, {{k.data(), DType::kF32, bs, H, dim}},
                                {{v.data(), DType::kF32, bs, H, dim}}, payloads[b].data())
                    .ok());
  }
  std::vector<std::vector<BlockRef>> refs(nseq);
  AttendBatch batch;
  batch.shape = {QH, H, dim, 0};
  batch.query_offsets = {0};
  for (int i = 0; i < nseq; ++i) {
    refs[i] = {{uint64_t(1 + i % 4), payloads[i % 4].data()}, {uint64_t(1 + (i + 1) % 4), payloads[(i + 1) % 4].data()}};
    AttendSequence s;
    s.blocks = refs[i];
    s.packed_tokens = 2 * bs - (i % 5);
    batch.sequences.push_back(s);
    batch.query_offsets.push_back(i + 1);
    batch.positions.push_back(s.packed_tokens - 1);
  }
  const size_t row = static_cast<size_t>(QH) * dim, n = nseq * row;
  for (DType dt : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dt == DType::kF16 ? "fp16" : "bf16");
    std::vector<uint16_t> q16(n), out16(n, 0xFFFF), want16(n);
    std::vector<float> q = RandomRows(nseq * QH, dim, 31), got(n);
    FromFloat(dt, q.data(), q16.data(), n);
    ToFloat(dt, q16.data(), q.data(), n);
    PointAtContiguousF32(batch, q.data(), got.data());
    ASSERT_TRUE(gpu.Attend(*codec, batch).ok());
    FromFloat(dt, got.data(), want16.data(), n);
    AttendBatch wire = batch;
    for (int i = 0; i < nseq; ++i) {
      wire.sequences[i].q = q16.data() + i * row;
      wire.sequences[i].out = out16.data() + i * row;
      wire.sequences[i].dtype = dt;
    }
    ASSERT_TRUE(gpu.Attend(*codec, wire).ok());
    EXPECT_EQ(out16, want16);
    // One sequence in fp32: every conversion on the host, same values.
    std::vector<uint16_t> mixed16(n, 0xFFFF);
    std::vector<float> got0(row);
    for (int i = 0; i < nseq; ++i) wire.sequences[i].out = mixed16.data() + i * row;
    wire.sequences[0].q = q.data();
    wire.sequences[0].out = got0.data();
    wire.sequences[0].dtype = DType::kF32;
    ASSERT_TRUE(gpu.Attend(*codec, wire).ok());
    EXPECT_TRUE(std::equal(mixed16.begin() + row, mixed16.end(), want16.begin() + row));
    EXPECT_TRUE(std::equal(got0.begin(), got0.end(), got.begin()));
  }
}

// Keyed sequences keep their block tables on the device (gpu/seq_tables.h):
// a table that grows past its chunk moves to a larger one, a list whose end
// is taken back and refilled with other blocks is rebuilt, a shorter list
// keeps its prefix, a batch mixes kept and unkeyed tables, and a table
// arena too small for every table stages the rest with their call, and a
// block upload ring of one block a half streams each call's uploads. Every
// call is bit-identical to a backend given no keys (every table staged)
// and matches the CPU backend.
TEST(CudaBackend, KeptBlockTablesGrowShrinkAndFallBack) {
  TQ_SKIP_WITHOUT_GPU();
  const int layers = 1, H = 2, QH = 4, dim = 128, bs = 16;
  auto codec = *ModelCodec::Create({layers, H, QH, dim, bs}, {.format = "k4v4", .seed = 9}, nullptr);
  CpuBackend cpu({.threads = 0});
  const size_t arena = ArenaOfSlots(*codec, 2048);
  auto kept_or = CreateCudaBackend({.arena_bytes = arena});
  auto small_or = CreateCudaBackend({.arena_bytes = arena, .table_arena_bytes = 1024});  // one 256-block chunk
  auto plain_or = CreateCudaBackend({.arena_bytes = arena});
  auto ring_or = CreateCudaBackend({.arena_bytes = arena, .upload_staging_bytes = 3 * codec->block_bytes()});
  auto pinned_or = CreateCudaBackend({.arena_bytes = arena});
  ASSERT_TRUE(ring_or.ok()) << ring_or.status();
  ASSERT_TRUE(pinned_or.ok()) << pinned_or.status();
  ASSERT_TRUE(kept_or.ok()) << kept_or.status();
  ASSERT_TRUE(small_or.ok()) << small_or.status();
  ASSERT_TRUE(plain_or.ok()) << plain_or.status();
  // The payloads lie in host memory that `pinned_or` pins (as a server's
  // host arena): it copies them by DMA, the others through their staging.
  const size_t bb = codec->block_bytes();
  testing_util::HostRegion region = testing_util::PinnedRegion(**pinned_or, 8 * bb);
  ASSERT_NE(region, nullptr);
  EXPECT_EQ((*pinned_or)->UseHostArena(region.get(), 8 * bb).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<uint8_t*> payloads(8);
  for (int b = 0; b < 8; ++b) payloads[b] = region.get() + b * bb;
  for (int b = 0; b < 8; ++b) {
    std::vector<float> k = RandomRows(bs * H, dim, 40 + b), v = RandomRows(bs * H, dim, 80 + b);
    ASSERT_TRUE(cpu.EncodeBlock(*codec, 0, 1, {{k.data(), DType::kF32, bs, H, dim}},
                                {{v.data(), DType::kF32, bs, H, dim}}, payloads[b])
                    .ok());
  }
  // Block j of a list: id `base + j`, one of the 8 payloads.
  std::deque<std::vector<BlockRef>> lists;
  auto blocks = [&](uint64_t base, int n) {
    std::vector<BlockRef>& r = lists.emplace_back();
    for (int j = 0; j < n; ++j) r.push_back({base + j, payloads[(base + j * 5) % 8]});
    return absl::MakeConstSpan(r);
  };
  struct Item {
    std::span<const BlockRef> blocks;
    uint64_t key;
  };
  int call = 0;
  auto attend = [&](std::vector<Item> items) {
    SCOPED_TRACE(::testing::Message() << "call " << call);
    AttendBatch keyed, bare;
    keyed.layer = bare.layer = 0;
    keyed.shape = bare.shape = {QH, H, dim, 0};
    keyed.query_offsets = bare.query_offsets = {0};
    for (const Item& it : items) {
      AttendSequence s;
      s.blocks = it.blocks;
      s.packed_tokens = bs * static_cast<int64_t>(it.blocks.size());
      bare.sequences.push_back(s);
      s.sequence_key = it.key;
      keyed.sequences.push_back(s);
      keyed.query_offsets.push_back(keyed.query_offsets.back() + 1);
      keyed.positions.push_back(s.packed_tokens - 1 - (call % 7));
    }
    bare.query_offsets = keyed.query_offsets;
    bare.positions = keyed.positions;
    std::vector<float> q = RandomRows(items.size() * QH, dim, 500 + call++);
    std::vector<float> kept(q.size()), small(q.size()), ring(q.size()), pinned(q.size()), plain(q.size()),
        want(q.size());
    PointAtContiguousF32(keyed, q.data(), kept.data());
    ASSERT_TRUE((*kept_or)->Attend(*codec, keyed).ok());
    PointAtContiguousF32(keyed, q.data(), small.data());
    ASSERT_TRUE((*small_or)->Attend(*codec, keyed).ok());
    PointAtContiguousF32(keyed, q.data(), ring.data());
    ASSERT_TRUE((*ring_or)->Attend(*codec, keyed).ok());
    PointAtContiguousF32(keyed, q.data(), pinned.data());
    ASSERT_TRUE((*pinned_or)->Attend(*codec, keyed).ok());
    PointAtContiguousF32(bare, q.data(), plain.data());
    ASSERT_TRUE((*plain_or)->Attend(*codec, bare).ok());
    PointAtContiguousF32(bare, q.data(), want.data());
    ASSERT_TRUE(cpu.Attend(*codec, bare).ok());
    EXPECT_EQ(kept, plain);
    EXPECT_EQ(small, plain);
    EXPECT_EQ(ring, plain);
    EXPECT_EQ(pinned, plain);
    std::vector<double> wd(want.begin(), want.end());
    EXPECT_LT(RelativeError(wd.data(), kept.data(), kept.size()), 2e-3);
  };
  const uint64_t A = 1, B = 2, C = 3;
  std::span<const BlockRef> a = blocks(10000, 700);
  attend({{a.first(100), A}});  // one sequence: its device table is the launch's block table
  attend({{a.first(101), A}});
  attend({{a.first(300), A}});  // past its 256-block chunk: a 512 one
  attend({{a.first(700), A}});  // and a 1024 one
  std::span<const BlockRef> b = blocks(20000, 40);
  std::span<const BlockRef> b2 = blocks(20000, 39);  // same prefix ...
  std::vector<BlockRef>& b3 = lists.emplace_back(b2.begin(), b2.end());
  b3.push_back({29999, payloads[3]});  // ... and another block at its end
  std::span<const BlockRef> c = blocks(30000, 5);
  attend({{a.first(700), A}, {b, B}, {c, 0}});  // kept, new and unkeyed tables in one batch
  attend({{b2, B}, {a.first(650), A}});         // shorter lists keep their prefixes
  attend({{absl::MakeConstSpan(b3), B}, {a.first(700), A}, {c, 0}});  // a refilled end is rebuilt
  attend({{c, C}, {c, 0}, {absl::MakeConstSpan(b3), B}});
  (*kept_or)->Forget(A);
  attend({{a.first(20), A}});  // a forgotten key starts over
}

// Packs (AttendBatch::packs): a tail that fills is encoded in the Attend
// that first attends its block, straight into the block's arena slot (slots
// that held other blocks' bytes before). The pack's `out` gets exactly the
// CPU encode's bytes, and the attention is bit-identical to a backend
// given those bytes without packs, for a format on the specialised encode,
// one on the generic encode and a recipe (the model's last layer dense).
TEST(CudaBackend, PacksEncodeIntoTheBlocksTheyAttend) {
  TQ_SKIP_WITHOUT_GPU();
  for (const char* format : {"k4v4", "k3v2", "turboquant35"}) {
    SCOPED_TRACE(format);
    const int layers = 2, H = 8, QH = 32, dim = 128, bs = 16;
    auto codec = TestCodec(format, {layers, H, QH, dim, bs});
    CpuBackend cpu({.threads = 0});
    auto packed_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*codec, 32)});
    auto plain_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*codec, 32)});
    ASSERT_TRUE(packed_or.ok()) << packed_or.status();
    ASSERT_TRUE(plain_or.ok()) << plain_or.status();
    ComputeBackend& packed = **packed_or;
    ComputeBackend& plain = **plain_or;
    // Other blocks' bytes left in every slot first.
    {
      std::vector<std::vector<uint8_t>> junk(32, std::vector<uint8_t>(codec->block_bytes()));
      std::vector<BlockRef> refs;
      for (int j = 0; j < 32; ++j) {
        for (size_t i = 0; i < junk[j].size(); ++i) junk[j][i] = static_cast<uint8_t>(i * 7 + j);
        refs.push_back({uint64_t(900000 + j), junk[j].data()});
      }
      AttendSequence js;
      js.blocks = refs;
      js.packed_tokens = 32 * bs;
      AttendBatch jb;
      jb.shape = {QH, H, dim, 0};
      jb.sequences = {js};
      jb.query_offsets = {0, 1};
      jb.positions = {0};
      std::vector<float> q(QH * dim, 0.5f), out(q.size());
      PointAtContiguousF32(jb, q.data(), out.data());
      ASSERT_TRUE(packed.Attend(*codec, jb).ok());
      for (const BlockRef& r : refs) packed.Forget(r.id);
    }
    const size_t row = static_cast<size_t>(H) * dim;
    struct Seq {
      std::vector<std::unique_ptr<std::vector<uint8_t>>> blocks, cpu_blocks;  // packed here / by the CPU
      std::vector<BlockRef> refs, cpu_refs;
      std::vector<int64_t> filled;
      std::vector<std::vector<float>> tail_k, tail_v;
      uint64_t key = 0;
    };
    uint64_t next_id = 1;
    std::vector<Seq> seqs(2);
    for (int i = 0; i < 2; ++i) {
      Seq& q = seqs[i];
      q.key = next_id++;
      auto& bytes = q.blocks.emplace_back(std::make_unique<std::vector<uint8_t>>(codec->block_bytes()));
      std::vector<DenseView> kd, vd;
      std::vector<std::vector<float>> k(layers), v(layers);
      for (int l = 0; l < layers; ++l) {
        k[l] = RandomRows(bs * H, dim, 100 * i + l);
        v[l] = RandomRows(bs * H, dim, 5000 + 100 * i + l);
        kd.push_back({k[l].data(), DType::kF32, bs, H, dim});
        vd.push_back({v[l].data(), DType::kF32, bs, H, dim});
      }
      ASSERT_TRUE(cpu.EncodeBlock(*codec, 0, layers, kd, vd, bytes->data()).ok());
      q.cpu_blocks.emplace_back(std::make_unique<std::vector<uint8_t>>(*bytes));
      const uint64_t id = next_id++ | (uint64_t{1} << 63);
      q.refs.push_back({id, bytes->data()});
      q.cpu_refs.push_back({id, q.cpu_blocks.back()->data()});
      q.filled.assign(layers, 0);
      q.tail_k.resize(layers);
      q.tail_v.resize(layers);
      for (int l = 0; l < layers; ++l) {
        const int t0 = i == 0 ? 14 : 9;
        q.tail_k[l] = RandomRows(t0 * H, dim, 900 + 10 * i + l);
        q.tail_v[l] = RandomRows(t0 * H, dim, 950 + 10 * i + l);
      }
    }
    int packs_seen = 0;
    for (int step = 0; step < 10; ++step) {
      for (int l = 0; l < layers; ++l) {
        AttendBatch batch, bare;
        batch.layer = bare.layer = l;
        batch.shape = bare.shape = {QH, H, dim, 0};
        batch.query_offsets = bare.query_offsets = {0, 1, 2};
        std::vector<std::vector<float>> pack_rows;  // alive for the call
        for (Seq& q : seqs) {
          std::vector<float> k = RandomRows(H, dim, 7000 + step * 10 + l), v = RandomRows(H, dim, 8000 + step * 10 + l);
          q.tail_k[l].insert(q.tail_k[l].end(), k.begin(), k.end());
          q.tail_v[l].insert(q.tail_v[l].end(), v.begin(), v.end());
          if (q.tail_k[l].size() == bs * row) {  // layer l of the next filling block, packed by this call
            const size_t j = static_cast<size_t>(1 + q.filled[l]);
            if (j == q.blocks.size()) {
              q.blocks.push_back(std::make_unique<std::vector<uint8_t>>(codec->block_bytes(), 0));
              q.cpu_blocks.push_back(std::make_unique<std::vector<uint8_t>>(codec->block_bytes(), 0));
              const uint64_t id = next_id++;
              q.refs.push_back({id, q.blocks.back()->data(), /*complete=*/false});
              q.cpu_refs.push_back({id + 500000, q.cpu_blocks.back()->data(), /*complete=*/false});
            }
            pack_rows.push_back(std::move(q.tail_k[l]));
            pack_rows.push_back(std::move(q.tail_v[l]));
            const DenseView pk{pack_rows[pack_rows.size() - 2].data(), DType::kF32, bs, H, dim};
            const DenseView pv{pack_rows.back().data(), DType::kF32, bs, H, dim};
            batch.packs.push_back({pk, pv, q.blocks[j]->data() + codec->layer_offset(l), q.refs[j].id});
            ASSERT_TRUE(cpu.EncodeBlock(*codec, l, l + 1, {pk}, {pv}, q.cpu_blocks[j]->data() + codec->layer_offset(l)).ok());
            ++q.filled[l];
            q.tail_k[l].clear();
            q.tail_v[l].clear();
            ++packs_seen;
          }
          const int64_t nblocks = 1 + q.filled[l];
          const int64_t tail = static_cast<int64_t>(q.tail_k[l].size() / row);
          AttendSequence as;
          as.blocks = absl::MakeConstSpan(q.refs.data(), nblocks);
          as.packed_tokens = nblocks * bs;
          as.tail_k = {q.tail_k[l].data(), DType::kF32, tail, H, dim};
          as.tail_v = {q.tail_v[l].data(), DType::kF32, tail, H, dim};
          as.sequence_key = q.key;
          batch.sequences.push_back(as);
          as.blocks = absl::MakeConstSpan(q.cpu_refs.data(), nblocks);
          bare.sequences.push_back(as);
          batch.positions.push_back(as.packed_tokens + tail - 1);
        }
        bare.positions = batch.positions;
        std::vector<float> qv = RandomRows(2 * QH, dim, 9000 + step * 10 + l), got(qv.size()), base(qv.size());
        PointAtContiguousF32(batch, qv.data(), got.data());
        ASSERT_TRUE(packed.Attend(*codec, batch).ok()) << "step " << step << " layer " << l;
        PointAtContiguousF32(bare, qv.data(), base.data());
        ASSERT_TRUE(plain.Attend(*codec, bare).ok());
        EXPECT_EQ(got, base) << "step " << step << " layer " << l;
        for (const Seq& q : seqs)
          for (size_t j = 0; j < q.blocks.size(); ++j)
            ASSERT_EQ(*q.blocks[j], *q.cpu_blocks[j]) << "block " << j << " step " << step << " layer " << l;
      }
    }
    EXPECT_GE(packs_seen, 4);
  }
}

// A decode loop as the sequence manager drives it: each call appends one
// token to each sequence's tail (rows grow under one tail id, so only the
// new row is copied), a full tail packs into layer l of a block being
// filled (BlockRef::complete false: copied layer by layer) and restarts
// under a new id, and sequences keep their slots by key. Every call
// matches the CPU backend, and is bit-identical to a second CUDA backend
// given no ids (tails staged per call, every block acquired).
TEST(CudaBackend, DecodeLoopWithTailIdsAndFillingBlocks) {
  TQ_SKIP_WITHOUT_GPU();
  const int layers = 2, H = 8, QH = 32, dim = 128, bs = 16;
  auto codec = *ModelCodec::Create({layers, H, QH, dim, bs}, {.format = "k4v4", .seed = 5}, nullptr);
  CpuBackend cpu({.threads = 0});
  auto with_ids_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*codec, 64)});
  auto plain_or = CreateCudaBackend({.arena_bytes = ArenaOfSlots(*codec, 64)});
  ASSERT_TRUE(with_ids_or.ok()) << with_ids_or.status();
  ASSERT_TRUE(plain_or.ok()) << plain_or.status();
  ComputeBackend& with_ids = **with_ids_or;
  ComputeBackend& plain = **plain_or;
  const size_t row = static_cast<size_t>(H) * dim;
  struct Seq {
    std::vector<std::unique_ptr<std::vector<uint8_t>>> blocks;  // stored, then filling ones
    std::vector<BlockRef> refs;
    std::vector<int64_t> filled;                     // per layer: filling blocks holding it
    std::vector<std::vector<float>> tail_k, tail_v;  // per layer
    std::vector<uint64_t> tail_id;                   // per layer
    int64_t stored = 0;
    uint64_t key = 0;
  };
  uint64_t next_id = 1;
  std::vector<Seq> seqs(2);
  for (int i = 0; i < 2; ++i) {
    Seq& q = seqs[i];
    q.key = next_id++;
    q.stored = i == 0 ? 3 : 1;
    for (int b = 0; b < q.stored; ++b) {
      auto& bytes = q.blocks.emplace_back(std::make_unique<std::vector<uint8_t>>(codec->block_bytes()));
      std::vector<DenseView> kd, vd;
      std::vector<std::vector<float>> k(layers), v(layers);
      for (int l = 0; l < layers; ++l) {
        k[l] = RandomRows(bs * H, dim, 100 * i + 10 * b + l);
        v[l] = RandomRows(bs * H, dim, 5000 + 100 * i + 10 * b + l);
        kd.push_back({k[l].data(), DType::kF32, bs, H, dim});
        vd.push_back({v[l].data(), DType::kF32, bs, H, dim});
      }
      ASSERT_TRUE(cpu.EncodeBlock(*codec, 0, layers, kd, vd, bytes->data()).ok());
      q.refs.push_back({next_id++ | (uint64_t{1} << 63), bytes->data()});
    }
    q.filled.assign(layers, 0);
    q.tail_k.resize(layers);
    q.tail_v.resize(layers);
    for (int l = 0; l < layers; ++l) q.tail_id.push_back(next_id++);
    for (int l = 0; l < layers; ++l) {  // different offsets inside the block
      const int t0 = i == 0 ? 13 : 2;
      q.tail_k[l] = RandomRows(t0 * H, dim, 900 + 10 * i + l);
      q.tail_v[l] = RandomRows(t0 * H, dim, 950 + 10 * i + l);
    }
  }
  for (int step = 0; step < 20; ++step) {
    for (int l = 0; l < layers; ++l) {
      AttendBatch batch, bare;
      batch.layer = bare.layer = l;
      batch.shape = bare.shape = {QH, H, dim, 0};
      batch.query_offsets = bare.query_offsets = {0, 1, 2};
      for (Seq& q : seqs) {
        std::vector<float> k = RandomRows(H, dim, 7000 + step * 10 + l), v = RandomRows(H, dim, 8000 + step * 10 + l);
        q.tail_k[l].insert(q.tail_k[l].end(), k.begin(), k.end());
        q.tail_v[l].insert(q.tail_v[l].end(), v.begin(), v.end());
        if (q.tail_k[l].size() == bs * row) {  // pack into layer l of the next filling block
          const size_t j = static_cast<size_t>(q.stored + q.filled[l]);
          if (j == q.blocks.size()) {
            q.blocks.push_back(std::make_unique<std::vector<uint8_t>>(codec->block_bytes(), 0));
            q.refs.push_back({next_id++, q.blocks.back()->data(), /*complete=*/false});
          }
          ASSERT_TRUE(cpu.EncodeBlock(*codec, l, l + 1, {{q.tail_k[l].data(), DType::kF32, bs, H, dim}},
                                      {{q.tail_v[l].data(), DType::kF32, bs, H, dim}},
                                      q.blocks[j]->data() + codec->layer_offset(l))
                          .ok());
          ++q.filled[l];
          q.tail_k[l].clear();
          q.tail_v[l].clear();
          with_ids.Forget(q.tail_id[l]);
          q.tail_id[l] = next_id++;
        }
        const int64_t nblocks = q.stored + q.filled[l];
        const int64_t tail = static_cast<int64_t>(q.tail_k[l].size() / row);
        AttendSequence as;
        as.blocks = absl::MakeConstSpan(q.refs.data(), nblocks);
        as.packed_tokens = nblocks * bs;
        as.tail_k = {q.tail_k[l].data(), DType::kF32, tail, H, dim};
        as.tail_v = {q.tail_v[l].data(), DType::kF32, tail, H, dim};
        AttendSequence bs_seq = as;
        as.tail_id = q.tail_id[l];
        as.sequence_key = q.key;
        batch.sequences.push_back(as);
        bare.sequences.push_back(bs_seq);
        batch.positions.push_back(as.packed_tokens + tail - 1);
      }
      bare.positions = batch.positions;
      std::vector<float> qv = RandomRows(2 * QH, dim, 9000 + step * 10 + l), got(qv.size()), base(qv.size()),
                         want(qv.size());
      PointAtContiguousF32(batch, qv.data(), got.data());
      ASSERT_TRUE(with_ids.Attend(*codec, batch).ok()) << "step " << step << " layer " << l;
      PointAtContiguousF32(bare, qv.data(), base.data());
      ASSERT_TRUE(plain.Attend(*codec, bare).ok());
      PointAtContiguousF32(batch, qv.data(), want.data());
      ASSERT_TRUE(cpu.Attend(*codec, batch).ok());
      std::vector<double> wd(want.begin(), want.end());
      EXPECT_LT(RelativeError(wd.data(), got.data(), got.size()), 2e-3) << "step " << step << " layer " << l;
      EXPECT_EQ(got, base) << "step " << step << " layer " << l;
    }
  }
  // Each stored block crossed the bus once, each filling block once (then
  // layer by layer), each tail row once.
  EXPECT_EQ(with_ids.Stats().uploads, 4u + 3u);
}

}  // namespace
}  // namespace tqkv::gpu
