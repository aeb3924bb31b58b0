// The floor under a fused paged decode call: the bytes the call must read,
// streamed with no arithmetic, at the five shapes of the decode goal (32 q
// heads, 8 kv heads, d = 128, 16-token pages), timed the way
// gpu_attention_bench.py times the real call (device time: the stream is
// held by a spin kernel while every call is queued, each after a 256 MiB
// read that evicts L2; median of 50). For each shape and format:
//   stream:        one block per (sequence, split), 128 blocks (the served
//                  row-set plan), each streaming its pages' K and V tiles
//                  (8 heads × 16 tokens of packed rows, pages in random
//                  order as the benchmark places them) through 8 stages
//                  with cp.async.bulk;
//   stream+merge:  the same, each block then writing its split records
//                  (32 q heads × 130 floats, as the served kernel does) and
//                  a merge kernel launched as a programmatic dependent that
//                  combines them (no rotation): the served call's
//                  two-kernel structure without its arithmetic;
//   tensor:        the stream alone with the row-set kernel's tile loads:
//                  a TMA tensor load per tile and component, 16 token rows
//                  of 8 heads into a shared stride 16 bytes longer than
//                  the row set (the bank-conflict-free layout of its K
//                  rows; formerly of its V rows too): the
//                  padding out of bounds (zero-filled, as served), or read
//                  from the next token (the map's rows as long as the box,
//                  overlapping); and without padding (dense, as TQ4's V
//                  rows are served now);
//   in order:      the stream with each sequence's pages contiguous and in
//                  order (as SDPA's K/V are), to tell the cost of random
//                  page placement from that of the tile size;
//   fp16:          SDPA's bytes (fp16 K and V, contiguous per sequence)
//                  streamed the same way, 32 KiB tiles through 3 stages,
//                  and (random) with its pages in random order.
// bench/RESULTS.md sets these against the goals (the "in order" column:
// page order).
// Run on the GPU machine: decode_floor (from the GPU bundle).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "bench/profiling/probe_util.cuh"
#include "gpu/kernels/attention_staged.cuh"  // MbarInit, MbarArriveExpectTx, MbarWait, TmaLoad3d

namespace {

using tqkv::probe::BulkLoad;
using tqkv::probe::Check;
using tqkv::probe::Evict;
using tqkv::probe::g_sink;

constexpr int kKvHeads = 8, kQHeads = 32, kDim = 128, kPageTokens = 16, kRecord = kDim + 2;
constexpr int kBlocks = 128;  // the served row-set plan at every goal shape
constexpr int kIters = 50;

// Holds the stream for `cycles` SM clocks (the host queues meanwhile).
__global__ void Spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

struct StreamArgs {
  const uint8_t* k;     // K tiles, ktile bytes per page
  const uint8_t* v;     // V tiles, vtile bytes per page
  const int* table;     // [sequences][pages_per_seq] page ids
  int pages_per_seq;
  int splits;           // blocks per sequence
  uint32_t ktile, vtile;
  float* records;       // [sequences][kQHeads][splits][kRecord], or null
  bool tensor;          // tiles by the tensor maps (boxes of kbox / vbox bytes)
  uint32_t kbox, vbox;
  bool overlap;         // the maps' rows as long as the box (reading into the next token)
};

// Bytes of one stage: a K and a V tile (tensor boxes, or bulk tiles).
__host__ __device__ inline uint32_t StageBytes(const StreamArgs& a) {
  return a.tensor ? a.kbox + a.vbox : a.ktile + a.vtile;
}

// The served kernel's maps (gpu/attention.cu TileMaps): uint32 elements,
// dims (row-set words, 16 tokens, pages), box (row-set words + 4, 16, 1).
struct FloorMaps {
  CUtensorMap k, v;
};

// Block b = (sequence, split) streams its split's pages through S stages of
// ktile + vtile bytes (one mbarrier per stage; thread 0 refills a stage once
// every thread has touched it), then writes its records if asked.
template <int S>
__global__ void __launch_bounds__(256) FloorStream(StreamArgs a, const __grid_constant__ FloorMaps maps) {
  extern __shared__ __align__(128) uint8_t sm[];
  const uint32_t kpart = a.tensor ? a.kbox : a.ktile, stride = StageBytes(a);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const uint32_t bars = base + S * stride;
  const int seq = blockIdx.x / a.splits, split = blockIdx.x % a.splits;
  const int per = a.pages_per_seq / a.splits;
  const int* pages = a.table + static_cast<int64_t>(seq) * a.pages_per_seq + split * per;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) tqkv::gpu::MbarInit(bars + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int j) {
    const uint32_t s = j % S, bar = bars + 8 * s, dst = base + s * stride;
    const size_t page = static_cast<size_t>(pages[j]);
    tqkv::gpu::MbarArriveExpectTx(bar, stride);
    if (a.tensor) {
      tqkv::gpu::TmaLoad3d(dst, &maps.k, 0, 0, static_cast<int>(page), bar);
      tqkv::gpu::TmaLoad3d(dst + kpart, &maps.v, 0, 0, static_cast<int>(page), bar);
      return;
    }
    BulkLoad(dst, a.k + page * a.ktile, a.ktile, bar);
    BulkLoad(dst + a.ktile, a.v + page * a.vtile, a.vtile, bar);
  };
  if (threadIdx.x == 0)
    for (int j = 0; j < min(per, S); ++j) issue(j);
  int acc = 0;
  for (int j = 0; j < per; ++j) {
    tqkv::gpu::MbarWait(bars + 8 * (j % S), (j / S) & 1);
    acc ^= sm[(j % S) * stride + threadIdx.x * 32];
    __syncthreads();
    if (threadIdx.x == 0 && j + S < per) issue(j + S);
  }
  if (a.records == nullptr) {
    if (acc == 0x7fffffff) g_sink = acc;
    return;
  }
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // 32 heads × 130 floats: (m, l) and 128 unnormalised outputs per head.
  for (int e = threadIdx.x; e < kQHeads * kRecord; e += blockDim.x) {
    const int h = e / kRecord, c = e % kRecord;
    a.records[((static_cast<int64_t>(seq) * kQHeads + h) * a.splits + split) * kRecord + c] =
        c == 0 ? static_cast<float>(acc & 7) : c == 1 ? 1.0f : static_cast<float>((acc >> (c & 7)) & 1);
  }
}

// One block per (sequence, q head): the log-sum-exp merge of the splits'
// records (launched as a programmatic dependent). blockDim.x / 128 groups
// (<= 4) of 128 threads, a thread per channel, take a share of the splits
// each, with their loads 8 deep, and combine through shared memory.
constexpr int kMergeGroups = 4, kMaxSplits = 1024;
__global__ void __launch_bounds__(kMergeGroups * kDim) FloorMerge(const float* records, int splits, float* out) {
  __shared__ float w[kMaxSplits], part[kMergeGroups][kDim], red[kMergeGroups * kDim / 32];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int tid = threadIdx.x, c = tid % kDim, grp = tid / kDim, groups = blockDim.x / kDim;
  const float* r = records + static_cast<int64_t>(blockIdx.x) * splits * kRecord;
  auto block_reduce = [&](float v, bool max) {
    for (int o = 16; o > 0; o /= 2) {
      const float x = __shfl_xor_sync(0xffffffffu, v, o);
      v = max ? fmaxf(v, x) : v + x;
    }
    if (tid % 32 == 0) red[tid / 32] = v;
    __syncthreads();
    v = red[0];
    for (int k = 1; k < groups * kDim / 32; ++k) v = max ? fmaxf(v, red[k]) : v + red[k];
    __syncthreads();
    return v;
  };
  float m = -INFINITY;
  for (int s = tid; s < splits; s += blockDim.x) m = fmaxf(m, r[s * kRecord]);
  m = block_reduce(m, true);
  float l = 0.0f;
  for (int s = tid; s < splits; s += blockDim.x) {
    w[s] = __expf(r[s * kRecord] - m);
    l = fmaf(w[s], r[s * kRecord + 1], l);
  }
  l = block_reduce(l, false);  // (its barriers also publish w)
  float o = 0.0f;
#pragma unroll 8
  for (int s = grp; s < splits; s += groups) o = fmaf(w[s], r[s * kRecord + 2 + c], o);
  part[grp][c] = o;
  __syncthreads();
  if (grp == 0) {
    for (int k = 1; k < groups; ++k) o += part[k][c];
    out[static_cast<int64_t>(blockIdx.x) * kDim + c] = o / l;
  }
}

template <int S>
size_t SmemOf(const StreamArgs& a) {
  return S * static_cast<size_t>(StageBytes(a)) + 8 * S;
}

// The tensor maps of the served kernel over the floor's K and V arenas
// (page stride = the tile), or false where the driver has no encoder.
bool MakeMaps(const StreamArgs& a, FloorMaps* m) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return false;
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  auto one = [&](CUtensorMap* map, const uint8_t* base, uint32_t tile, uint32_t box) {
    const cuuint64_t row = tile / kPageTokens;
    const cuuint64_t dims[3] = {(a.overlap ? box / kPageTokens : row) / 4, kPageTokens, cuuint64_t{1} << 31};
    const cuuint64_t strides[2] = {row, tile};
    const cuuint32_t boxes[3] = {box / kPageTokens / 4, kPageTokens, 1};
    const cuuint32_t es[3] = {1, 1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, const_cast<uint8_t*>(base), dims, strides, boxes, es,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  return one(&m->k, a.k, a.ktile, a.kbox) && one(&m->v, a.v, a.vtile, a.vbox);
}

// Launches one call: the stream, and with records the merge as a
// programmatic dependent.
template <int S>
cudaError_t LaunchCall(const StreamArgs& a, const FloorMaps& maps, int sequences, float* out) {
  FloorStream<S><<<sequences * a.splits, 256, SmemOf<S>(a)>>>(a, maps);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || a.records == nullptr) return e;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(sequences * kQHeads));
  cfg.blockDim = dim3(std::clamp(a.splits / 16, 1, kMergeGroups) * kDim);  // a group per 16 splits
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, FloorMerge, static_cast<const float*>(a.records), a.splits, out);
}

// Median device time (µs) of kIters calls, as gpu_attention_bench.py's
// timed_device measures: queued behind a spin, each after an L2 eviction.
template <int S>
double TimeCalls(const StreamArgs& a, int sequences, float* out, const int4* evict, size_t evict_n) {
  FloorMaps maps{};
  if (a.tensor && !MakeMaps(a, &maps)) {
    std::fprintf(stderr, "no tensor-map encoder\n");
    return -1;
  }
  if (!Check(cudaFuncSetAttribute(FloorStream<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(SmemOf<S>(a))),
             "smem"))
    return -1;
  for (int w = 0; w < 3; ++w) {
    Evict<<<132 * 4, 512>>>(evict, evict_n);
    if (!Check(LaunchCall<S>(a, maps, sequences, out), "warm-up")) return -1;
  }
  if (!Check(cudaDeviceSynchronize(), "warm-up")) return -1;
  std::vector<cudaEvent_t> ev(2 * kIters);
  for (auto& e : ev) cudaEventCreate(&e);
  cudaEvent_t held;
  cudaEventCreate(&held);
  Spin<<<1, 1>>>(200'000'000);  // ~0.1 s
  cudaEventRecord(held);
  for (int i = 0; i < kIters; ++i) {
    Evict<<<132 * 4, 512>>>(evict, evict_n);
    cudaEventRecord(ev[2 * i]);
    LaunchCall<S>(a, maps, sequences, out);
    cudaEventRecord(ev[2 * i + 1]);
  }
  const bool in_time = cudaEventQuery(held) == cudaErrorNotReady;
  if (!Check(cudaDeviceSynchronize(), "calls")) return -1;
  std::vector<float> us(kIters);
  for (int i = 0; i < kIters; ++i) {
    cudaEventElapsedTime(&us[i], ev[2 * i], ev[2 * i + 1]);
    us[i] *= 1e3f;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaEventDestroy(held);
  if (!in_time) {
    std::fprintf(stderr, "the spin ended before the calls were queued\n");
    return -1;
  }
  std::sort(us.begin(), us.end());
  return us[kIters / 2];
}

}  // namespace

int main() {
  if (!tqkv::probe::HaveDevice()) return 0;
  struct Shape {
    int batch, context;
  };
  const Shape shapes[] = {{64, 4096}, {16, 16384}, {32, 32768}, {4, 65536}, {1, 131072}};
  const size_t max_pages = 32u * 32768u / kPageTokens;
  const size_t packed_tile = kKvHeads * kPageTokens * 68, fp16_tile = kKvHeads * kPageTokens * kDim * 2;
  const size_t evict_bytes = size_t{256} << 20;
  uint8_t *k = nullptr, *v = nullptr;
  int4* evict = nullptr;
  int* table = nullptr;
  float *records = nullptr, *out = nullptr;
  if (!Check(cudaMalloc(&k, max_pages * fp16_tile), "k") || !Check(cudaMalloc(&v, max_pages * fp16_tile), "v") ||
      !Check(cudaMalloc(&evict, evict_bytes), "evict") || !Check(cudaMalloc(&table, max_pages * 4), "table") ||
      !Check(cudaMalloc(&records, size_t{kQHeads} * kBlocks * kRecord * 4), "records") ||
      !Check(cudaMalloc(&out, size_t{64} * kQHeads * kDim * 4), "out"))
    return 1;
  cudaMemset(k, 1, max_pages * fp16_tile), cudaMemset(v, 2, max_pages * fp16_tile);
  cudaMemset(evict, 3, evict_bytes);
  std::printf("decode floor: device time, L2 evicted before each call, median of %d; %d blocks\n", kIters, kBlocks);
  std::printf("  %-10s %-6s %9s %9s %8s %10s %10s %10s %10s %10s\n", "shape", "format", "MB", "stream us", "TB/s",
              "+merge us", "tensor us", "(overlap)", "(no pad)", "in order");
  std::mt19937 rng(7);
  int rc = 0;
  for (const Shape& sh : shapes) {
    const int pps = sh.context / kPageTokens, pages = sh.batch * pps;
    std::vector<int> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::vector<int> random = order;
    std::shuffle(random.begin(), random.end(), rng);
    char name[32];
    std::snprintf(name, sizeof(name), "%dx%dK", sh.batch, sh.context / 1024);
    StreamArgs a{k, v, table, pps, kBlocks / sh.batch, 0, 0, nullptr, false, 0, 0, false};
    cudaMemcpy(table, random.data(), pages * 4, cudaMemcpyHostToDevice);
    for (const int vrow : {68, 36}) {
      a.ktile = static_cast<uint32_t>(packed_tile);
      a.vtile = static_cast<uint32_t>(kKvHeads * kPageTokens * vrow);
      const double mb = static_cast<double>(pages) * (a.ktile + a.vtile) / 1e6;
      a.records = nullptr;
      const double t = TimeCalls<8>(a, sh.batch, out, evict, evict_bytes / 16);
      a.records = records;
      const double tm = TimeCalls<8>(a, sh.batch, out, evict, evict_bytes / 16);
      a.records = nullptr;
      a.tensor = true;
      a.kbox = a.ktile + kPageTokens * 16, a.vbox = a.vtile + kPageTokens * 16;
      const double tt = TimeCalls<8>(a, sh.batch, out, evict, evict_bytes / 16);
      a.overlap = true;
      const double to = TimeCalls<8>(a, sh.batch, out, evict, evict_bytes / 16);
      a.overlap = false;
      a.kbox = a.ktile, a.vbox = a.vtile;
      const double tn = TimeCalls<8>(a, sh.batch, out, evict, evict_bytes / 16);
      a.tensor = false;
      cudaMemcpy(table, order.data(), pages * 4, cudaMemcpyHostToDevice);
      const double ti = TimeCalls<8>(a, sh.batch, out, evict, evict_bytes / 16);
      cudaMemcpy(table, random.data(), pages * 4, cudaMemcpyHostToDevice);
      if (t < 0 || tm < 0 || tt < 0 || to < 0 || tn < 0 || ti < 0) rc = 1;
      std::printf("  %-10s %-6s %9.1f %9.1f %8.2f %10.1f %10.1f %10.1f %10.1f %10.1f\n", name,
                  vrow == 68 ? "TQ4" : "K4/V2", mb, t, mb / t, tm, tt, to, tn, ti);
    }
    // SDPA's bytes: fp16 K and V, each sequence's pages contiguous.
    cudaMemcpy(table, order.data(), pages * 4, cudaMemcpyHostToDevice);
    a.ktile = a.vtile = static_cast<uint32_t>(fp16_tile);
    a.records = nullptr;
    const double mb = static_cast<double>(pages) * 2 * fp16_tile / 1e6;
    const double t = TimeCalls<3>(a, sh.batch, out, evict, evict_bytes / 16);
    cudaMemcpy(table, random.data(), pages * 4, cudaMemcpyHostToDevice);
    const double tr = TimeCalls<3>(a, sh.batch, out, evict, evict_bytes / 16);
    if (t < 0 || tr < 0) rc = 1;
    std::printf("  %-10s %-6s %9.1f %9.1f %8.2f %10s %10s %10s %10s %10s\n", name, "fp16", mb, t, mb / t, "-", "-",
                "-", "-", "-");
    std::printf("  %-10s %-6s %9.1f %9.1f %8.2f %10s %10s %10s %10s %10s\n", name, "(rand)", mb, tr, mb / tr, "-",
                "-", "-", "-", "-");
    std::fflush(stdout);
  }
  cudaFree(k), cudaFree(v), cudaFree(evict), cudaFree(table), cudaFree(records), cudaFree(out);
  return rc;
}
