// GPU encode/decode throughput vs the device copy ceiling, and prefill
// (many causal queries) attention time, measured in one process with CUDA
// events (median of 50 runs, random data, buffers well past L2).
// Encode GB/s counts fp16 bytes read + packed bytes written; decode counts
// packed bytes read + fp16 bytes written.
// Run: gpu_codec_bench [iters]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "codec/model_codec.h"
#include "gpu/attention_plan.h"
#include "gpu/codec_tables.h"
#include "gpu/cuda_util.h"
#include "gpu/kernels.h"

namespace tqkv::gpu {
namespace {

float MedianMs(const std::function<void()>& fn, int iters) {
  auto start = *CudaEvent::Create(), stop = *CudaEvent::Create();
  for (int i = 0; i < 3; ++i) fn();
  cudaDeviceSynchronize();
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(start.get());
    fn();
    cudaEventRecord(stop.get());
    cudaEventSynchronize(stop.get());
    t.push_back(CudaEvent::ElapsedMs(start, stop));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int Run(int iters) {
  if (CudaDeviceCount() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const size_t copy_bytes = size_t{2} << 30;
  DeviceBuffer a = *DeviceBuffer::Allocate(copy_bytes), b = *DeviceBuffer::Allocate(copy_bytes);
  cudaMemset(a.get(), 1, copy_bytes);
  const float copy_ms = MedianMs([&] { cudaMemcpyAsync(b.get(), a.get(), copy_bytes, cudaMemcpyDeviceToDevice); }, iters);
  const double ceiling = 2.0 * copy_bytes / (copy_ms * 1e-3);
  std::printf("copy ceiling (cudaMemcpy D2D, read+write): %.2f TB/s\n", ceiling / 1e12);
  a.Reset();
  b.Reset();

  const int H = 8, D = 128, BS = 16;
  const int64_t tokens = 512 * 1024;  // 1 GiB of fp16 K + 1 GiB of V
  std::vector<uint16_t> host(static_cast<size_t>(tokens) * H * D);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& x : host) {
    _Float16 h = static_cast<_Float16>(nd(rng));
    std::memcpy(&x, &h, 2);
  }
  DeviceBuffer k = *DeviceBuffer::Allocate(host.size() * 2), v = *DeviceBuffer::Allocate(host.size() * 2);
  cudaMemcpy(k.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(v.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  std::vector<int64_t> slots(tokens);
  std::iota(slots.begin(), slots.end(), 0);
  DeviceBuffer ds = *DeviceBuffer::Allocate(tokens * 8);
  cudaMemcpy(ds.get(), slots.data(), tokens * 8, cudaMemcpyHostToDevice);
  DeviceBuffer flag = *DeviceBuffer::Allocate(8);
  for (const char* format : {"k4v4", "k4v2", "k3v3", "k2v2", "k8v8", "fp16"}) {
    auto codec = *ModelCodec::Create({1, H, 4 * H, D, BS}, {.format = format}, nullptr);
    auto tables = *DeviceCodecTables::Upload(*codec);
    const int64_t blocks = tokens / BS;
    DeviceBuffer kp = *DeviceBuffer::Allocate(blocks * codec->k_page_bytes(0));
    DeviceBuffer vp = *DeviceBuffer::Allocate(blocks * codec->v_page_bytes(0));
    EncodeLaunch e;
    e.k = k.get();
    e.v = v.get();
    e.dtype = kGpuF16;
    e.tokens = tokens;
    SetLayerPages(*codec, *tables, 0, kp.as<uint8_t>(), vp.as<uint8_t>(), blocks, ds.as<int64_t>(),
                  flag.as<unsigned long long>(), &e);
    e.host_k = &tables->host(0, 0, Component::kKey);
    e.host_v = &tables->host(0, 0, Component::kValue);
    const float enc_ms = MedianMs([&] { LaunchEncode(e, nullptr); }, iters);
    // fp32 input (same values) through the same dispatch: 2x the input bytes.
    if (std::string(format) == "k4v4" || std::string(format) == "k3v3") {
      std::vector<float> hf(host.size());
      for (size_t i = 0; i < host.size(); ++i) {
        _Float16 hv;
        std::memcpy(&hv, &host[i], 2);
        hf[i] = static_cast<float>(hv);
      }
      DeviceBuffer kf = *DeviceBuffer::Allocate(hf.size() * 4), vf = *DeviceBuffer::Allocate(hf.size() * 4);
      cudaMemcpy(kf.get(), hf.data(), hf.size() * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(vf.get(), hf.data(), hf.size() * 4, cudaMemcpyHostToDevice);
      EncodeLaunch ef = e;
      ef.k = kf.get();
      ef.v = vf.get();
      ef.dtype = kGpuF32;
      const float f32_ms = MedianMs([&] { LaunchEncode(ef, nullptr); }, iters);
      const double bytes = 2.0 * hf.size() * 4 +
                           static_cast<double>(tokens / BS) * (codec->k_page_bytes(0) + codec->v_page_bytes(0));
      std::printf("%-5s encode from fp32 input: %.3f ms %.2f TB/s (%s kernel) [%s]\n", format, f32_ms,
                  bytes / (f32_ms * 1e-3) / 1e12, EncodeUsesFastPath(ef) ? "fast d128" : "generic",
                  cudaGetErrorName(cudaGetLastError()));
    }
    const bool enc_fast = EncodeUsesFastPath(e);
    // The same launches with every slot skipped (negative): reads and
    // compute without the packed rows' stores, same run.
    if (enc_fast && std::string(format) == "k4v4") {
      DeviceBuffer none = *DeviceBuffer::Allocate(tokens * 8);
      cudaMemset(none.get(), 0xFF, tokens * 8);
      EncodeLaunch n = e;
      n.slots = none.as<int64_t>();
      const float lane_none = MedianMs([&] { LaunchEncode(n, nullptr); }, iters);
      n.encode_lane_rows = false;
      const float eight_none = MedianMs([&] { LaunchEncode(n, nullptr); }, iters);
      std::printf("%-5s encode without stores (every slot skipped): lane rows %.3f ms, 8 lanes %.3f ms\n", format,
                  lane_none, eight_none);
    }
    float enc_generic_ms = enc_ms;
    if (enc_fast) {
      EncodeLaunch g = e;
      g.allow_fast_path = false;
      enc_generic_ms = MedianMs([&] { LaunchEncode(g, nullptr); }, std::max(5, iters / 5));
    }
    // The specialised kernel quantising by boundary search instead of the
    // uniform-cell tables (EncodeLaunch::allow_quant_lut), same run.
    if (EncodeUsesQuantLut(e)) {
      EncodeLaunch s = e;
      s.allow_quant_lut = false;
      const float search_ms = MedianMs([&] { LaunchEncode(s, nullptr); }, iters);
      std::printf("%-5s encode quantiser: tables %.3f ms, boundary search %.3f ms (search / tables = %.2f)\n",
                  format, enc_ms, search_ms, search_ms / enc_ms);
    }
    // The specialised kernel's variants, same run: two lanes per row
    // (EncodeLaunch::encode_lane_rows) with two or three input buffers per
    // warp (encode_blocks_per_sm 3 / 2), and the 8-lane kernel (the FWHT's cross-lane stages and the norm's
    // butterfly through shared-memory transposes or shuffles, registers for
    // 2 or 3 blocks of 256 threads per SM).
    if (enc_fast) {
      float lane_ms[2] = {0, 0};  // [3 blocks/SM]
      for (int b = 0; b < 2 && EncodeUsesLaneRows(e); ++b) {
        EncodeLaunch s = e;
        s.encode_blocks_per_sm = 2 + b;
        lane_ms[b] = MedianMs([&] { LaunchEncode(s, nullptr); }, iters);
      }
      float ms[2][2];  // [transpose][3 blocks/SM]
      for (int x = 0; x < 2; ++x)
        for (int b = 0; b < 2; ++b) {
          EncodeLaunch s = e;
          s.encode_lane_rows = false;
          s.encode_transpose = x == 1;
          s.encode_blocks_per_sm = 2 + b;
          ms[x][b] = MedianMs([&] { LaunchEncode(s, nullptr); }, iters);
        }
      char lane[128] = "lane rows n/a (8-bit rows)";
      if (EncodeUsesLaneRows(e))
        std::snprintf(lane, sizeof(lane), "lane rows %.3f ms (2 buffers), %.3f ms (3); served 8-lane / lane rows = %.2f",
                      lane_ms[1], lane_ms[0], ms[0][1] / lane_ms[1]);
      std::printf(
          "%-5s encode kernels: %s; 8 lanes: 2 blocks/SM: transpose %.3f ms, shuffle %.3f ms; 3 blocks/SM: "
          "transpose %.3f ms, shuffle %.3f ms [%s]\n",
          format, lane, ms[1][0], ms[0][0], ms[1][1], ms[0][1], cudaGetErrorName(cudaGetLastError()));
    }
    const double packed = static_cast<double>(blocks) * (codec->k_page_bytes(0) + codec->v_page_bytes(0));
    const double dense = 2.0 * host.size() * 2;
    DecodeLaunch d;
    d.k = k.get();
    d.v = v.get();
    d.dtype = kGpuF16;
    d.tokens = tokens;
    d.heads = H;
    d.dim = D;
    d.slots = e.slots;
    d.k_pages = e.k_pages;
    d.v_pages = e.v_pages;
    d.k_comp = e.k_comp;
    d.v_comp = e.v_comp;
    d.max_group_channels = e.max_group_channels;
    d.bad_slot = e.bad_slot;
    d.host_k = e.host_k;
    d.host_v = e.host_v;
    const float dec_ms = MedianMs([&] { LaunchDecode(d, nullptr); }, iters);
    float dec_generic_ms = dec_ms;
    if (DecodeUsesFastPath(d)) {
      DecodeLaunch g = d;
      g.allow_fast_path = false;
      dec_generic_ms = MedianMs([&] { LaunchDecode(g, nullptr); }, std::max(5, iters / 5));
    }
    const cudaError_t err = cudaGetLastError();
    std::printf(
        "%-5s encode %.3f ms %.2f TB/s (%.2f of copy ceiling; goal >= 3.0 TB/s; %s kernel, generic %.3f ms)  "
        "decode %.3f ms %.2f TB/s (%s kernel, generic %.3f ms)  [%s]\n",
        format, enc_ms, (dense + packed) / (enc_ms * 1e-3) / 1e12, (dense + packed) / (enc_ms * 1e-3) / ceiling,
        enc_fast ? (EncodeUsesLaneRows(e) ? "lane rows" : "fast d128") : "generic", enc_generic_ms, dec_ms,
        (dense + packed) / (dec_ms * 1e-3) / 1e12, DecodeUsesFastPath(d) ? "fast d128" : "generic", dec_generic_ms,
        cudaGetErrorName(err));
    // Re-encode the original data (decode overwrote k/v).
    cudaMemcpy(k.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(v.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice);
    LaunchEncode(e, nullptr);
    // Prefill: one 8K-token sequence, its last 1024 tokens as causal queries.
    if (std::string(format) == "k4v4" || std::string(format) == "k4v2") {
      const int64_t ctx = 8192, nq = 1024;
      std::vector<int32_t> table(ctx / BS);
      std::iota(table.begin(), table.end(), 0);
      std::vector<int64_t> packed_t = {ctx}, pos(nq);
      std::vector<int32_t> qseq(nq, 0);
      for (int64_t i = 0; i < nq; ++i) pos[i] = ctx - nq + i;
      std::vector<float> q(nq * 4 * H * D);
      for (auto& x : q) x = nd(rng) * 0.3f;
      auto up = [](const auto& vec) {
        DeviceBuffer buf = *DeviceBuffer::Allocate(vec.size() * sizeof(vec[0]));
        cudaMemcpy(buf.get(), vec.data(), vec.size() * sizeof(vec[0]), cudaMemcpyHostToDevice);
        return buf;
      };
      DeviceBuffer dt = up(table), dp = up(packed_t), dpos = up(pos), dq = up(qseq), dqq = up(q);
      DeviceBuffer out = *DeviceBuffer::Allocate(q.size() * 4);
      AttentionLaunch at;
      at.k_comp = e.k_comp;
      at.v_comp = e.v_comp;
      at.host_k = tables->host(0, 0, Component::kKey);
      at.host_v = tables->host(0, 0, Component::kValue);
      at.uniform_codebooks = tables->uniform_codebooks(0);
      // K and V regions have different page sizes: give V its own base with
      // the K stride by using the larger of the two (V pages are smaller, so
      // pages overlap harmlessly only if strides match: use per-region copy).
      DeviceBuffer vp2 = *DeviceBuffer::Allocate(blocks * codec->k_page_bytes(0));
      cudaMemcpy2D(vp2.get(), codec->k_page_bytes(0), vp.get(), codec->v_page_bytes(0), codec->v_page_bytes(0),
                   ctx / BS, cudaMemcpyDeviceToDevice);
      at.k_base = kp.as<uint8_t>();
      at.v_base = vp2.as<uint8_t>();
      at.block_stride = static_cast<int64_t>(codec->k_page_bytes(0));
      at.block_size = BS;
      at.block_table = dt.as<int32_t>();
      at.max_blocks = static_cast<int32_t>(table.size());
      at.packed_tokens = dp.as<int64_t>();
      at.query_seq = dq.as<int32_t>();
      at.positions = dpos.as<int64_t>();
      at.num_queries = nq;
      at.q = dqq.as<float>();
      at.out = out.as<float>();
      at.q_heads = 4 * H;
      at.kv_heads = H;
      at.dim = D;
      at.max_context = ctx;
      AttentionDevice dev;
      if (ProbeAttentionDevice(0, &dev) != cudaSuccess) return 1;
      // The plan's kernel, then every other served kernel that can run the
      // prefill (the same pages and queries).
      for (AttnKernel kernel : EligibleAttentionKernels(at, dev)) {
        AttentionPlan plan;
        if (PlanAttention(at, dev, &plan, {.kernel = kernel}) != cudaSuccess) return 1;
        DeviceBuffer ws = *DeviceBuffer::Allocate(plan.workspace_bytes);
        at.workspace = ws.get();
        at.workspace_bytes = ws.bytes();
        const float pf_ms = MedianMs([&] { LaunchAttention(at, plan, nullptr); }, std::max(5, iters / 5));
        const double pairs = static_cast<double>(nq) * (ctx - nq / 2.0) * 4 * H;
        std::printf("      prefill 1 x %lld ctx, %lld causal queries (%s, %d splits): %.3f ms, %.1f G (query-head, key) "
                    "pairs/s [%s]\n",
                    static_cast<long long>(ctx), static_cast<long long>(nq), AttnKernelName(kernel), plan.dims.splits,
                    pf_ms, pairs / (pf_ms * 1e-3) / 1e9, cudaGetErrorName(cudaGetLastError()));
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tqkv::gpu

int main(int argc, char** argv) { return tqkv::gpu::Run(argc > 1 ? std::atoi(argv[1]) : 50); }
