// What a dense put costs in the CUDA backend alone: CudaBackend::EncodeBlocks
// and DecodeBlocks of n blocks of a 32-layer, 8-kv-head, d = 128 model
// (block 16, k4v4, fp16), as the service calls them for a frame of n dense
// blocks, timed per call (median of `iters`), against a pinned-memory
// round trip of the same bytes (H2D of the input, D2H of the output) in the
// same run. Rows: n = 1, 4, 16, 32, and layer ranges of 1 and 32 layers (a
// cost per layer shows as the difference). Usage: encode_probe [iters=50]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "codec/backend.h"
#include "codec/model_codec.h"
#include "gpu/cuda_backend.h"

namespace tqkv {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double TimeMs(int iters, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return Median(t);
}

int Run(int iters) {
  const ModelShape shape{32, 8, 32, 128, 16};
  auto codec_or = ModelCodec::Create(shape, {.format = "k4v4"}, nullptr);
  if (!codec_or.ok()) return std::fprintf(stderr, "%s\n", codec_or.status().ToString().c_str()), 1;
  const ModelCodec& codec = **codec_or;
  auto backend_or = gpu::CreateCudaBackend({});
  if (!backend_or.ok()) return std::fprintf(stderr, "%s\n", backend_or.status().ToString().c_str()), 1;
  ComputeBackend& backend = **backend_or;
  const size_t row = size_t{8} * 128, layer_elems = 16 * row;
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint16_t> half(0x3000, 0x3c00);  // fp16 in [0.125, 1]
  std::printf("n blocks  layers  fp16 in MB  encode ms  GB/s   decode ms  GB/s   pinned H2D+D2H ms\n");
  for (const int n : {1, 4, 16, 32}) {
    for (const int layers : {1, 32}) {
      std::vector<std::vector<uint16_t>> k(n), v(n);
      std::vector<std::vector<uint8_t>> out(n);
      std::vector<std::vector<uint16_t>> dk(n), dv(n);
      std::vector<ComputeBackend::EncodeItem> items(n);
      std::vector<ComputeBackend::DecodeItem> ditems(n);
      const size_t packed = codec.layer_range_bytes(0, layers);
      for (int b = 0; b < n; ++b) {
        k[b].resize(layers * layer_elems);
        v[b].resize(layers * layer_elems);
        for (auto& x : k[b]) x = half(rng);
        for (auto& x : v[b]) x = half(rng);
        dk[b].resize(layers * layer_elems);
        dv[b].resize(layers * layer_elems);
        out[b].resize(packed);
        items[b].out = out[b].data();
        ditems[b].payload = out[b].data();
        for (int l = 0; l < layers; ++l) {
          items[b].k.push_back({k[b].data() + l * layer_elems, DType::kF16, 16, 8, 128});
          items[b].v.push_back({v[b].data() + l * layer_elems, DType::kF16, 16, 8, 128});
          ditems[b].k.push_back({dk[b].data() + l * layer_elems, DType::kF16, 16, 8, 128});
          ditems[b].v.push_back({dv[b].data() + l * layer_elems, DType::kF16, 16, 8, 128});
        }
      }
      const double in_bytes = 2.0 * n * layers * layer_elems * 2;
      const double enc = TimeMs(iters, [&] {
        if (absl::Status s = backend.EncodeBlocks(codec, 0, layers, items); !s.ok()) std::abort();
      });
      const double dec = TimeMs(iters, [&] {
        if (absl::Status s = backend.DecodeBlocks(codec, 0, layers, ditems); !s.ok()) std::abort();
      });
      void *h = nullptr, *d = nullptr;
      cudaMallocHost(&h, static_cast<size_t>(in_bytes));
      cudaMalloc(&d, static_cast<size_t>(in_bytes));
      const double copy = TimeMs(iters, [&] {
        cudaMemcpy(d, h, static_cast<size_t>(in_bytes), cudaMemcpyHostToDevice);
        cudaMemcpy(h, d, packed * n, cudaMemcpyDeviceToHost);
      });
      cudaFreeHost(h);
      cudaFree(d);
      std::printf("%8d  %6d  %10.1f  %9.3f  %5.2f  %9.3f  %5.2f  %9.3f\n", n, layers, in_bytes / 1e6, enc,
                  in_bytes / enc / 1e6, dec, in_bytes / dec / 1e6, copy);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tqkv

int main(int argc, char** argv) { return tqkv::Run(argc > 1 ? std::atoi(argv[1]) : 50); }
