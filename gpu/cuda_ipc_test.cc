// CudaBackend on another process's GPU memory (CUDA IPC): a second process
// (cuda_ipc_exporter) owns a K/V cache; EncodeDeviceBlocks of its slots
// equals the CPU encode of the same rows byte for byte, DecodeDeviceBlocks
// writes exactly the slots' bytes DecodeBlocks produces, and bad layouts,
// out-of-bounds slots and bad handles are refused.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/cpu_backend.h"
#include "codec/dtype.h"
#include "codec/test_util.h"
#include "gpu/cuda_backend.h"
#include "gpu/test_support.h"

extern char** environ;

namespace tqkv::gpu {
namespace {

// The exporter binary: next to this test (the GPU bundle) or in its runfiles.
std::string ExporterPath() {
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  if (std::filesystem::exists(self.parent_path() / "cuda_ipc_exporter"))
    return self.parent_path() / "cuda_ipc_exporter";
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir != nullptr ? srcdir : ".") + "/tqkv/gpu/cuda_ipc_exporter";
}

// A worker process holding `bytes` in one cudaMalloc allocation.
class Exporter {
 public:
  explicit Exporter(const std::vector<uint8_t>& bytes) : n_(bytes.size()) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    const std::string path = ExporterPath();
    char* argv[] = {const_cast<char*>(path.c_str()), nullptr};
    const int rc = posix_spawn(&pid_, path.c_str(), &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
    if (rc != 0) {
      pid_ = -1;
      return;
    }
    const uint64_t n = n_;
    if (!Write(&n, sizeof n) || !Write(bytes.data(), n_)) return;
    handle_.resize(kIpcHandleBytes);
    if (!Read(handle_.data(), handle_.size())) handle_.clear();
  }
  ~Exporter() {
    if (to_ >= 0) {
      (void)Write("q", 1);
      close(to_);
    }
    if (from_ >= 0) close(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  // The allocation's handle; empty when the process failed.
  const std::string& handle() const { return handle_; }
  // What the allocation holds now.
  std::vector<uint8_t> ReadBack() {
    std::vector<uint8_t> b(n_);
    if (!Write("r", 1) || !Read(b.data(), n_)) b.clear();
    return b;
  }

 private:
  bool Write(const void* p, size_t n) {
    for (const char* c = static_cast<const char*>(p); n > 0;) {
      const ssize_t w = write(to_, c, n);
      if (w <= 0) return false;
      c += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  bool Read(void* p, size_t n) {
    for (char* c = static_cast<char*>(p); n > 0;) {
      const ssize_t r = read(from_, c, n);
      if (r <= 0) return false;
      c += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  size_t n_;
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string handle_;
};

constexpr int kLayers = 3, kHeads = 2, kQHeads = 8, kDim = 128, kBlock = 16, kSlots = 6;
constexpr uint64_t kLead = 512;  // bytes before the first layer (offsets are not zero)

enum class Layout { kPaged, kPagedHnd, kContiguous };

// A cache of kSlots blocks per layer for K and for V, layer by layer
// (K then V), after kLead bytes, in `layout` and `dt`.
struct Cache {
  Layout layout;
  DType dt;
  DeviceKvRef ref;  // ipc_handles filled by the test
  uint64_t layer_bytes = 0;
  uint64_t total = 0;

  Cache(Layout l, DType d, int first, int last) : layout(l), dt(d) {
    const uint64_t es = DTypeSize(d), head = kDim * es;
    layer_bytes = uint64_t{kSlots} * kBlock * kHeads * head;
    ref.dtype = d;
    if (l == Layout::kPagedHnd) {
      ref.token_stride = head;
      ref.head_stride = kBlock * head;
    } else {
      ref.head_stride = head;
      ref.token_stride = kHeads * head;
    }
    ref.block_stride = uint64_t{kBlock} * kHeads * head;
    for (int i = first; i < last; ++i)
      ref.layers.push_back({0, kLead + 2 * i * layer_bytes, 0, kLead + (2 * i + 1) * layer_bytes});
    total = kLead + 2 * kLayers * layer_bytes;
  }
  // Byte offset of (layer i of the range's entry, K or V, slot, token, head).
  uint64_t At(size_t i, int c, uint64_t slot, int t, int h) const {
    const DeviceKvRef::Layer& l = ref.layers[i];
    return (c == 0 ? l.k_offset : l.v_offset) + slot * ref.block_stride + t * ref.token_stride + h * ref.head_stride;
  }
  // The rows of one block as [tokens, heads, dim] in dt.
  std::vector<uint8_t> Rows(const std::vector<uint8_t>& mem, size_t i, int c, uint64_t slot, int tokens) const {
    const size_t head = kDim * DTypeSize(dt);
    std::vector<uint8_t> rows(tokens * kHeads * head);
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < kHeads; ++h)
        std::memcpy(rows.data() + (t * kHeads + h) * head, mem.data() + At(i, c, slot, t, h), head);
    return rows;
  }
};

std::vector<uint8_t> RandomMemory(uint64_t bytes, DType dt, uint64_t seed) {
  const size_t es = DTypeSize(dt);
  std::vector<float> f = ::tqkv::testing_util::RandomRows(static_cast<int64_t>(bytes / es / kDim) + 1, kDim, seed);
  std::vector<uint8_t> mem(bytes);
  FromFloat(dt, f.data(), mem.data(), bytes / es);
  return mem;
}

std::unique_ptr<ModelCodec> Codec(const char* format) {
  auto fmt = *ParseFormat(format);
  RecipeMetadata meta;
  if (fmt.needs_metadata())
    meta = ::tqkv::testing_util::MakeMetadata(std::string(format).substr(0, 12), kDim, kLayers, kHeads);
  return *ModelCodec::Create({kLayers, kHeads, kQHeads, kDim, kBlock}, {.format = format, .seed = 5},
                             fmt.needs_metadata() ? &meta : nullptr);
}

TEST(CudaIpc, EncodeDeviceBlocksEqualsTheCpuEncodeOfTheSameRows) {
  TQ_SKIP_WITHOUT_GPU();
  struct Case {
    const char* format;
    Layout layout;
    DType dt;
    int first, last;
  };
  const Case cases[] = {
      {"k4v4", Layout::kPaged, DType::kF16, 0, kLayers},   {"k4v4", Layout::kPagedHnd, DType::kF16, 0, kLayers},
      {"k4v4", Layout::kContiguous, DType::kBF16, 1, 3},  {"k3v2", Layout::kPaged, DType::kF32, 0, kLayers},
      {"turboquant35", Layout::kPaged, DType::kF16, 0, 2}, {"fp16", Layout::kPagedHnd, DType::kBF16, 0, kLayers},
  };
  const std::vector<uint64_t> slots = {3, 0, 5, 2};
  const std::vector<int> tokens = {16, 9, 16, 1};
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.format) + " layout " + std::to_string(static_cast<int>(k.layout)) + " dtype " +
                 std::string(DTypeName(k.dt)));
    auto codec = Codec(k.format);
    Cache cache(k.layout, k.dt, k.first, k.last);
    const std::vector<uint8_t> mem = RandomMemory(cache.total, k.dt, 7);
    Exporter worker(mem);
    ASSERT_FALSE(worker.handle().empty()) << "the exporter did not start: " << ExporterPath();
    cache.ref.ipc_handles = {worker.handle()};
    auto gpu = CreateCudaBackend({.arena_bytes = size_t{64} << 20});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    CpuBackend cpu({.threads = 0});
    const size_t bytes = codec->layer_range_bytes(k.first, k.last);
    std::vector<std::vector<uint8_t>> got(slots.size(), std::vector<uint8_t>(bytes, 0x5A));
    std::vector<DeviceEncodeItem> items;
    for (size_t b = 0; b < slots.size(); ++b) items.push_back({slots[b], tokens[b], got[b].data()});
    ASSERT_TRUE((*gpu)->EncodeDeviceBlocks(*codec, k.first, k.last, cache.ref, items).ok());
    // A backend whose outputs lie in its pinned host arena copies the pages
    // straight into them (back to back: one copy); with one output outside
    // it, the chunk goes through the host staging.
    auto pinned = CreateCudaBackend({.arena_bytes = size_t{64} << 20});
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    testing_util::HostRegion region = testing_util::PinnedRegion(**pinned, slots.size() * bytes);
    ASSERT_NE(region, nullptr);
    std::vector<uint8_t> outside(bytes, 0x5A);
    for (bool all_pinned : {true, false}) {
      std::memset(region.get(), 0x5A, slots.size() * bytes);
      std::vector<DeviceEncodeItem> in_arena;
      for (size_t b = 0; b < slots.size(); ++b)
        in_arena.push_back({slots[b], tokens[b], !all_pinned && b == 2 ? outside.data() : region.get() + b * bytes});
      ASSERT_TRUE((*pinned)->EncodeDeviceBlocks(*codec, k.first, k.last, cache.ref, in_arena).ok());
      for (size_t b = 0; b < slots.size(); ++b)
        EXPECT_EQ(std::vector<uint8_t>(in_arena[b].out, in_arena[b].out + bytes), got[b])
            << "block " << b << (all_pinned ? ", every output pinned" : ", one output outside the arena");
    }
    for (size_t b = 0; b < slots.size(); ++b) {
      std::vector<std::vector<uint8_t>> rows;
      std::vector<DenseView> kv[2];
      for (int i = 0; i < k.last - k.first; ++i)
        for (int c = 0; c < 2; ++c) {
          rows.push_back(cache.Rows(mem, i, c, slots[b], tokens[b]));
          kv[c].push_back({nullptr, k.dt, tokens[b], kHeads, kDim});
        }
      for (size_t i = 0; i < kv[0].size(); ++i) {
        kv[0][i].data = rows[2 * i].data();
        kv[1][i].data = rows[2 * i + 1].data();
      }
      std::vector<uint8_t> want(bytes, 0);
      ASSERT_TRUE(cpu.EncodeBlock(*codec, k.first, k.last, kv[0], kv[1], want.data()).ok());
      EXPECT_EQ(got[b], want) << "block " << b << " (slot " << slots[b] << ", " << tokens[b] << " tokens)";
    }
  }
}

TEST(CudaIpc, DecodeDeviceBlocksWritesExactlyTheSlots) {
  TQ_SKIP_WITHOUT_GPU();
  for (Layout layout : {Layout::kPaged, Layout::kPagedHnd}) {
    for (DType dt : {DType::kF16, DType::kF32}) {
      SCOPED_TRACE("layout " + std::to_string(static_cast<int>(layout)) + " " + std::string(DTypeName(dt)));
      auto codec = Codec("k4v4");
      const int first = layout == Layout::kPaged ? 0 : 1, last = kLayers;
      Cache cache(layout, dt, first, last);
      const std::vector<uint8_t> before(cache.total, 0x5A);
      Exporter worker(before);
      ASSERT_FALSE(worker.handle().empty()) << "the exporter did not start: " << ExporterPath();
      cache.ref.ipc_handles = {worker.handle()};
      auto gpu = CreateCudaBackend({.arena_bytes = size_t{64} << 20});
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      // Two packed blocks (encoded from random rows), decoded into slots 4 and 1.
      const std::vector<uint8_t> mem = RandomMemory(cache.total, DType::kF16, 11);
      Cache src(Layout::kPaged, DType::kF16, first, last);
      src.ref.ipc_handles = {};
      const size_t bytes = codec->layer_range_bytes(first, last);
      std::vector<std::vector<uint8_t>> packed(2, std::vector<uint8_t>(bytes));
      CpuBackend cpu({.threads = 0});
      for (int b = 0; b < 2; ++b) {
        std::vector<std::vector<uint8_t>> rows;
        std::vector<DenseView> kv[2];
        for (int i = 0; i < last - first; ++i)
          for (int c = 0; c < 2; ++c) rows.push_back(src.Rows(mem, i, c, b, kBlock));
        for (int i = 0; i < last - first; ++i)
          for (int c = 0; c < 2; ++c) kv[c].push_back({rows[2 * i + c].data(), DType::kF16, kBlock, kHeads, kDim});
        ASSERT_TRUE(cpu.EncodeBlock(*codec, first, last, kv[0], kv[1], packed[b].data()).ok());
      }
      const std::vector<uint64_t> slots = {4, 1};
      std::vector<DeviceDecodeItem> items = {{packed[0].data(), slots[0]}, {packed[1].data(), slots[1]}};
      ASSERT_TRUE((*gpu)->DecodeDeviceBlocks(*codec, first, last, items, cache.ref).ok());
      const std::vector<uint8_t> after = worker.ReadBack();
      ASSERT_EQ(after.size(), before.size());
      // What DecodeBlocks (host outputs) gives, placed where the slots are.
      std::vector<uint8_t> want = before;
      const size_t head = kDim * DTypeSize(dt), layer = size_t{kBlock} * kHeads * head;
      for (int b = 0; b < 2; ++b) {
        std::vector<uint8_t> out(2 * (last - first) * layer);
        ComputeBackend::DecodeItem d{packed[b].data(), {}, {}};
        for (int i = 0; i < last - first; ++i) {
          d.k.push_back({out.data() + 2 * i * layer, dt, kBlock, kHeads, kDim});
          d.v.push_back({out.data() + (2 * i + 1) * layer, dt, kBlock, kHeads, kDim});
        }
        ASSERT_TRUE((*gpu)->DecodeBlocks(*codec, first, last, std::span(&d, 1)).ok());
        for (int i = 0; i < last - first; ++i)
          for (int c = 0; c < 2; ++c)
            for (int t = 0; t < kBlock; ++t)
              for (int h = 0; h < kHeads; ++h)
                std::memcpy(want.data() + cache.At(i, c, slots[b], t, h),
                            out.data() + (2 * i + c) * layer + (t * kHeads + h) * head, head);
      }
      EXPECT_TRUE(after == want) << "the decoded slots differ from DecodeBlocks, or other bytes changed";
    }
  }
}

TEST(CudaIpc, RefusesBytesOutsideTheAllocationBadLayoutsAndBadHandles) {
  TQ_SKIP_WITHOUT_GPU();
  auto codec = Codec("k4v4");
  Cache cache(Layout::kPaged, DType::kF16, 0, kLayers);
  Exporter worker(std::vector<uint8_t>(cache.total, 0));
  ASSERT_FALSE(worker.handle().empty());
  cache.ref.ipc_handles = {worker.handle()};
  auto gpu = CreateCudaBackend({.arena_bytes = size_t{64} << 20});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<uint8_t> out(codec->block_bytes());
  // The last layer's V ends at the allocation's end: slot kSlots is past it.
  std::vector<DeviceEncodeItem> past = {{kSlots, kBlock, out.data()}};
  absl::Status s = (*gpu)->EncodeDeviceBlocks(*codec, 0, kLayers, cache.ref, past);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("allocation"), std::string::npos) << s;
  std::vector<DeviceDecodeItem> past_out = {{out.data(), kSlots}};
  EXPECT_EQ((*gpu)->DecodeDeviceBlocks(*codec, 0, kLayers, past_out, cache.ref).code(),
            absl::StatusCode::kInvalidArgument);
  // The last slot's tokens in range pass; one token short of a full block
  // at the edge still passes (bounds follow the tokens read).
  std::vector<DeviceEncodeItem> edge = {{kSlots - 1, kBlock, out.data()}};
  EXPECT_TRUE((*gpu)->EncodeDeviceBlocks(*codec, 0, kLayers, cache.ref, edge).ok());
  // Rows that overlap, a zero token count, a short handle, a handle of no allocation.
  DeviceKvRef overlap = cache.ref;
  overlap.token_stride = kDim * 2;  // heads apart but tokens on top of them
  EXPECT_EQ((*gpu)->EncodeDeviceBlocks(*codec, 0, kLayers, overlap, edge).code(), absl::StatusCode::kInvalidArgument);
  std::vector<DeviceEncodeItem> empty = {{0, 0, out.data()}};
  EXPECT_EQ((*gpu)->EncodeDeviceBlocks(*codec, 0, kLayers, cache.ref, empty).code(),
            absl::StatusCode::kInvalidArgument);
  DeviceKvRef short_handle = cache.ref;
  short_handle.ipc_handles = {"short"};
  EXPECT_EQ((*gpu)->EncodeDeviceBlocks(*codec, 0, kLayers, short_handle, edge).code(),
            absl::StatusCode::kInvalidArgument);
  DeviceKvRef garbage = cache.ref;
  garbage.ipc_handles = {std::string(kIpcHandleBytes, '\x07')};
  s = (*gpu)->EncodeDeviceBlocks(*codec, 0, kLayers, garbage, edge);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // The backend still works after the refusals.
  EXPECT_TRUE((*gpu)->EncodeDeviceBlocks(*codec, 0, kLayers, cache.ref, edge).ok());
}

}  // namespace
}  // namespace tqkv::gpu
