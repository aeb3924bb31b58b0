// What the H200's memory system gives the decode kernel, without the
// kernel: (1) how long a block's first loads take at kernel start, after an
// L2-evicting read (as gpu_attention_bench.py times calls); (2) the rate at
// which one block per SM can stream the row-set kernel's tiles (K and V
// rows of 8 kv heads × 16 tokens at 68 bytes = 8,704 bytes each, one page
// per tile) through 8 shared-memory stages with cp.async.bulk and no
// compute, pages in random order (as the benchmark places them) or in page
// order. bench/RESULTS.md ("Memory probe") quotes both.
// Run on the GPU machine: memory_probe (from the GPU bundle).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "bench/profiling/probe_util.cuh"
#include "gpu/kernels/attention_staged.cuh"  // MbarInit, MbarArriveExpectTx, MbarWait

namespace {

using tqkv::probe::BulkLoad;
using tqkv::probe::Check;
using tqkv::probe::Evict;
using tqkv::probe::g_sink;

__device__ __forceinline__ uint64_t Now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
// A stamp taken once v has arrived: v feeds an add whose result is kept.
__device__ __forceinline__ uint64_t NowAfter(int v) {
  uint64_t t;
  int d;
  asm volatile("add.s32 %1, %2, 1;\n\tmov.u64 %0, %%globaltimer;" : "=l"(t), "=r"(d) : "r"(v) : "memory");
  if (d == 0x7fffffff) g_sink = d;
  return t;
}

// Kernel parameters of the decode kernel's size (its AttentionLaunch is
// ~1 KB), read at an offset past the first lines.
struct ProbeParams {
  int pad[200];
  const int* small;  // 64 KiB, like a block table
  const int* arena;  // 2 GiB, like the page arena
  const int* other;  // 64 MiB, touched by nothing else
  int* out;          // 5 latencies (ns) per block
};

// Thread 0 of each block: a parameter, then a dependent chain of loads:
// the small buffer, a random 4 KiB of the arena, another sector of that
// 4 KiB, the other buffer.
__global__ void ColdLoads(const __grid_constant__ ProbeParams p, unsigned iter) {
  if (threadIdx.x != 0) return;
  const uint64_t t0 = Now();
  const int q = p.pad[150] + static_cast<int>(iter);
  const uint64_t t1 = NowAfter(q);
  const int v = __ldcg(p.small + ((blockIdx.x * 64 + q) & 16383));
  const uint64_t t2 = NowAfter(v);
  const int64_t page = static_cast<unsigned>(v * 2654435761u + blockIdx.x * 97u + iter * 131u) % 524288u;
  const int w = __ldcg(p.arena + page * 1024 + (v & 7));
  const uint64_t t3 = NowAfter(w);
  const int x = __ldcg(p.arena + page * 1024 + 512 + (w & 7));
  const uint64_t t4 = NowAfter(x);
  const int y = __ldcg(p.other + ((blockIdx.x * 4096 + x) & ((1 << 24) - 1)));
  const uint64_t t5 = NowAfter(y);
  int* o = p.out + blockIdx.x * 5;
  o[0] = static_cast<int>(t1 - t0), o[1] = static_cast<int>(t2 - t1), o[2] = static_cast<int>(t3 - t2);
  o[3] = static_cast<int>(t4 - t3), o[4] = static_cast<int>(t5 - t4);
}

constexpr int kTile = 8704, kStages = 8;

// Block b streams pages [b·per, (b + 1)·per) of `order`: the K and V tile of
// each into stage j mod 8 (one mbarrier per stage), thread 0 refilling a
// stage once the block has touched it.
__global__ void __launch_bounds__(256) StreamPages(const uint8_t* k, const uint8_t* v, const int* order,
                                                   int npages) {
  extern __shared__ __align__(128) uint8_t sm[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const uint32_t bars = base + kStages * 2 * kTile;
  const int per = (npages + gridDim.x - 1) / gridDim.x;
  const int p0 = blockIdx.x * per, n = max(0, min(npages, p0 + per) - p0);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) tqkv::gpu::MbarInit(bars + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int j) {
    const uint32_t s = j % kStages, bar = bars + 8 * s, dst = base + s * 2 * kTile;
    const size_t page = static_cast<size_t>(order[p0 + j]);
    tqkv::gpu::MbarArriveExpectTx(bar, 2 * kTile);
    BulkLoad(dst, k + page * kTile, kTile, bar);
    BulkLoad(dst + kTile, v + page * kTile, kTile, bar);
  };
  if (threadIdx.x == 0)
    for (int j = 0; j < min(n, kStages); ++j) issue(j);
  int acc = 0;
  for (int j = 0; j < n; ++j) {
    tqkv::gpu::MbarWait(bars + 8 * (j % kStages), (j / kStages) & 1);
    acc ^= sm[(j % kStages) * 2 * kTile + threadIdx.x * 64];
    __syncthreads();
    if (threadIdx.x == 0 && j + kStages < n) issue(j + kStages);
  }
  if (acc == 0x7fffffff) g_sink = acc;
}

int Median(std::vector<int>& v, double f) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(f * (v.size() - 1))];
}

int RunColdLoads(int4* evict, size_t evict_bytes) {
  constexpr int kBlocks = 132, kIters = 40;
  int *arena = nullptr, *small = nullptr, *other = nullptr, *out = nullptr;
  if (!Check(cudaMalloc(&arena, size_t{2} << 30), "arena") || !Check(cudaMalloc(&small, 65536 * 4), "small") ||
      !Check(cudaMalloc(&other, size_t{64} << 20), "other") || !Check(cudaMalloc(&out, kBlocks * 5 * 4), "out"))
    return 1;
  cudaMemset(arena, 2, size_t{2} << 30);
  cudaMemset(small, 3, 65536 * 4);
  cudaMemset(other, 4, size_t{64} << 20);
  ProbeParams p{};
  p.pad[150] = 5, p.small = small, p.arena = arena, p.other = other, p.out = out;
  std::printf("cold loads at kernel start, thread 0 of %d blocks, %d calls; p50 / p90 in us:\n", kBlocks, kIters);
  std::printf("  %-28s %13s %13s %13s %13s %13s\n", "", "parameter", "64 KiB buf", "2 GiB arena", "same 4 KiB",
              "64 MiB buf");
  for (int evicted = 1; evicted >= 0; --evicted) {
    std::vector<std::vector<int>> lat(5);
    for (int it = 0; it < kIters; ++it) {
      if (evicted) Evict<<<132 * 4, 512>>>(evict, evict_bytes / 16);
      else ColdLoads<<<kBlocks, 32>>>(p, it);  // the same loads once before: L2 holds them
      ColdLoads<<<kBlocks, 32>>>(p, it);
      if (!Check(cudaDeviceSynchronize(), "cold loads")) return 1;
      std::vector<int> h(kBlocks * 5);
      cudaMemcpy(h.data(), out, h.size() * 4, cudaMemcpyDeviceToHost);
      for (int b = 0; b < kBlocks; ++b)
        for (int c = 0; c < 5; ++c) lat[c].push_back(h[b * 5 + c]);
    }
    std::printf("  %-28s", evicted ? "after a 256 MiB read" : "repeated (L2 warm)");
    for (auto& l : lat) std::printf("   %4.2f / %4.2f", Median(l, 0.5) / 1e3, Median(l, 0.9) / 1e3);
    std::printf("\n");
  }
  cudaFree(arena), cudaFree(small), cudaFree(other), cudaFree(out);
  return 0;
}

int RunStream() {
  const int smem = kStages * 2 * kTile + 8 * kStages;
  if (!Check(cudaFuncSetAttribute(StreamPages, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem"))
    return 1;
  cudaEvent_t start, stop;
  cudaEventCreate(&start), cudaEventCreate(&stop);
  std::printf("page streams, cp.async.bulk into 8 stages per block, no compute (median of 30 calls):\n");
  // 32 × 32K (65,536 pages of each 8-head group) and 64 × 4K (16,384).
  for (const int pages : {65536, 16384}) {
    const size_t bytes = static_cast<size_t>(pages) * kTile;
    uint8_t *k = nullptr, *v = nullptr;
    int* order = nullptr;
    if (!Check(cudaMalloc(&k, bytes), "k") || !Check(cudaMalloc(&v, bytes), "v") ||
        !Check(cudaMalloc(&order, pages * 4), "order"))
      return 1;
    cudaMemset(k, 1, bytes), cudaMemset(v, 2, bytes);
    std::vector<int> in_order(pages), random(pages);
    for (int i = 0; i < pages; ++i) in_order[i] = i;
    random = in_order;
    std::shuffle(random.begin(), random.end(), std::mt19937(7));
    for (const int blocks : {128, 132}) {
      for (const bool shuffled : {true, false}) {
        cudaMemcpy(order, (shuffled ? random : in_order).data(), pages * 4, cudaMemcpyHostToDevice);
        std::vector<int> us;
        for (int it = 0; it < 30; ++it) {
          cudaEventRecord(start);
          StreamPages<<<blocks, 256, smem>>>(k, v, order, pages);
          cudaEventRecord(stop);
          if (!Check(cudaEventSynchronize(stop), "stream")) return 1;
          float ms = 0;
          cudaEventElapsedTime(&ms, start, stop);
          us.push_back(static_cast<int>(ms * 1e3f));
        }
        const int t = Median(us, 0.5);
        std::printf("  %6d pages (%4zu MB), %3d blocks, %-12s %4d us  %.2f TB/s\n", pages, 2 * bytes >> 20, blocks,
                    shuffled ? "random order" : "page order", t, 2.0 * bytes / (t * 1e-6) / 1e12);
      }
    }
    cudaFree(k), cudaFree(v), cudaFree(order);
  }
  return 0;
}

}  // namespace

int main() {
  if (!tqkv::probe::HaveDevice()) return 0;
  const size_t evict_bytes = size_t{256} << 20;
  int4* evict = nullptr;
  if (!Check(cudaMalloc(&evict, evict_bytes), "evict buffer")) return 1;
  cudaMemset(evict, 1, evict_bytes);
  const int rc = RunColdLoads(evict, evict_bytes) || RunStream();
  cudaFree(evict);
  return rc;
}
