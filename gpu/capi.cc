// extern "C" entry points over the CUDA kernels for benchmarks driven from
// Python (ctypes): bench/gpu_attention_bench.py times them next to torch's
// scaled_dot_product_attention in one process. All data pointers are device
// pointers (e.g. torch tensors' data_ptr()); `stream` is a cudaStream_t
// (torch.cuda.current_stream().cuda_stream). Functions return 0 on success,
// else a cudaError_t value (or -1 for bad arguments); tqkv_gpu_last_error
// returns the message of the last failure in this thread.
#include <cstdint>
#include <memory>
#include <string>

#include "codec/model_codec.h"
#include "gpu/attention_plan.h"
#include "gpu/codec_tables.h"
#include "gpu/kernels.h"

namespace {

thread_local std::string g_error;

struct Handle {
  std::unique_ptr<tqkv::ModelCodec> codec;
  std::unique_ptr<tqkv::gpu::DeviceCodecTables> tables;
  tqkv::gpu::AttentionDevice device;
};

tqkv::gpu::AttentionLaunch MakeLaunch(const Handle* h) {
  tqkv::gpu::AttentionLaunch a;
  const tqkv::ModelShape& s = h->codec->shape();
  a.k_comp = h->tables->device(0, tqkv::Component::kKey);
  a.v_comp = h->tables->device(0, tqkv::Component::kValue);
  a.host_k = h->tables->host(0, 0, tqkv::Component::kKey);
  a.host_v = h->tables->host(0, 0, tqkv::Component::kValue);
  a.uniform_codebooks = h->tables->uniform_codebooks(0);
  a.k_signs = h->tables->k_head_signs(0);
  a.block_size = s.block_size;
  a.q_heads = s.num_q_heads;
  a.kv_heads = s.num_kv_heads;
  a.dim = s.head_dim;
  return a;
}

// The launch of a decode/prefill call as far as sizing and split planning
// need it (no data pointers; bases only aligned).
tqkv::gpu::AttentionLaunch PlanningLaunch(void* hp, int64_t num_queries, int64_t max_context,
                                          int64_t block_stride) {
  tqkv::gpu::AttentionLaunch a = MakeLaunch(static_cast<Handle*>(hp));
  a.num_queries = num_queries;
  a.max_context = max_context;
  a.block_stride = block_stride;
  a.k_base = a.v_base = reinterpret_cast<const uint8_t*>(256);  // alignment only
  return a;
}

// A forced split count (0: planned) and kernel (-1: the served choice,
// else an AttnKernel value).
tqkv::gpu::PlanOverrides Overrides(int splits, int kernel) {
  tqkv::gpu::PlanOverrides o;
  o.splits = splits;
  if (kernel >= 0) o.kernel = static_cast<tqkv::gpu::AttnKernel>(kernel);
  return o;
}

// The plan of `a` with those overrides; a failure is also kept as the
// last error (tqkv_gpu_last_error).
cudaError_t Plan(void* hp, const tqkv::gpu::AttentionLaunch& a, int splits, int kernel,
                 tqkv::gpu::AttentionPlan* plan) {
  if (kernel >= tqkv::gpu::kNumAttnKernels) return cudaErrorInvalidValue;
  const cudaError_t e =
      tqkv::gpu::PlanAttention(a, static_cast<Handle*>(hp)->device, plan, Overrides(splits, kernel));
  if (e != cudaSuccess) g_error = cudaGetErrorString(e);
  return e;
}

}  // namespace

extern "C" {

const char* tqkv_gpu_last_error() { return g_error.c_str(); }

// A one-layer model of `format` (mse formats and fp16; recipes need
// metadata and are not offered here). Null on failure.
void* tqkv_gpu_create(const char* format, int dim, int kv_heads, int q_heads, int block_size, uint64_t seed) {
  auto codec = tqkv::ModelCodec::Create({1, kv_heads, q_heads, dim, block_size},
                                        {.format = format, .seed = seed}, nullptr);
  if (!codec.ok()) {
    g_error = codec.status().ToString();
    return nullptr;
  }
  auto tables = tqkv::gpu::DeviceCodecTables::Upload(**codec);
  if (!tables.ok()) {
    g_error = tables.status().ToString();
    return nullptr;
  }
  auto h = std::make_unique<Handle>(std::move(*codec), std::move(*tables));
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = tqkv::gpu::ProbeAttentionDevice(dev, &h->device);
  if (e != cudaSuccess) {
    g_error = cudaGetErrorString(e);
    return nullptr;
  }
  return h.release();
}

void tqkv_gpu_destroy(void* h) { delete static_cast<Handle*>(h); }

// Row bytes of K (component 0) or V (1).
int64_t tqkv_gpu_row_bytes(void* hp, int component) {
  auto* h = static_cast<Handle*>(hp);
  return component == 0 ? h->codec->layer(0).k_row_bytes() : h->codec->layer(0).v_row_bytes();
}

// Encodes fp16/bf16/fp32 K/V [tokens, kv_heads, dim] into K and V page
// regions of num_blocks pages each (page bytes = block_size·kv_heads·row).
// `flag`: 8 bytes of device scratch.
int tqkv_gpu_encode(void* hp, const void* k, const void* v, int dtype, int64_t tokens, const int64_t* slots,
                    void* k_pages, void* v_pages, int64_t num_blocks, void* flag, void* stream) {
  auto* h = static_cast<Handle*>(hp);
  tqkv::gpu::EncodeLaunch a;
  a.k = k;
  a.v = v;
  a.dtype = dtype;
  a.tokens = tokens;
  tqkv::gpu::SetLayerPages(*h->codec, *h->tables, 0, static_cast<uint8_t*>(k_pages),
                           static_cast<uint8_t*>(v_pages), num_blocks, slots,
                           static_cast<unsigned long long*>(flag), &a);
  a.host_k = &h->tables->host(0, 0, tqkv::Component::kKey);
  a.host_v = &h->tables->host(0, 0, tqkv::Component::kValue);
  cudaError_t e = tqkv::gpu::LaunchEncode(a, static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) g_error = cudaGetErrorString(e);
  return static_cast<int>(e);
}

// The kernel of that name (AttnKernelName), or -1.
int tqkv_gpu_attention_kernel_id(const char* name) {
  const auto k = tqkv::gpu::AttnKernelByName(name);
  return k.has_value() ? static_cast<int>(*k) : -1;
}

// The name of kernel `id`, or null.
const char* tqkv_gpu_attention_kernel_name(int id) {
  return tqkv::gpu::AttnKernelName(static_cast<tqkv::gpu::AttnKernel>(id));
}

// Workspace bytes of a decode/prefill call with `splits` (0: planned) on
// `kernel` (-1: the served choice), with or without dense tails (the
// larger); 0 where that kernel cannot run it.
uint64_t tqkv_gpu_attention_workspace(void* hp, int64_t num_queries, int64_t max_context, int64_t block_stride,
                                      int splits, int kernel) {
  tqkv::gpu::AttentionPlan plan;
  auto a = PlanningLaunch(hp, num_queries, max_context, block_stride);
  if (Plan(hp, a, splits, kernel, &plan) != cudaSuccess) return 0;
  uint64_t bytes = plan.workspace_bytes;
  a.has_tail = true;
  if (tqkv::gpu::PlanAttention(a, static_cast<Handle*>(hp)->device, &plan, Overrides(splits, kernel)) == cudaSuccess)
    bytes = std::max<uint64_t>(bytes, plan.workspace_bytes);
  return bytes;
}

// Planned split count of a decode/prefill call on `kernel` (-1: the served
// choice), or -1 where that kernel cannot run it.
int tqkv_gpu_attention_splits(void* hp, int64_t num_queries, int64_t max_context, int64_t block_stride,
                              int kernel) {
  tqkv::gpu::AttentionPlan plan;
  const auto a = PlanningLaunch(hp, num_queries, max_context, block_stride);
  return Plan(hp, a, 0, kernel, &plan) == cudaSuccess ? plan.dims.splits : -1;
}

// The kernel the plan chooses for a decode/prefill call, or -1.
int tqkv_gpu_attention_kernel(void* hp, int64_t num_queries, int64_t max_context, int64_t block_stride) {
  tqkv::gpu::AttentionPlan plan;
  const auto a = PlanningLaunch(hp, num_queries, max_context, block_stride);
  return Plan(hp, a, 0, -1, &plan) == cudaSuccess ? static_cast<int>(plan.kernel) : -1;
}

// The served kernels that can run such a call, preferred first, into
// ids[0 .. max); returns how many there are.
int tqkv_gpu_attention_eligible(void* hp, int64_t num_queries, int64_t max_context, int64_t block_stride, int* ids,
                                int max) {
  const auto a = PlanningLaunch(hp, num_queries, max_context, block_stride);
  const auto eligible = tqkv::gpu::EligibleAttentionKernels(a, static_cast<Handle*>(hp)->device);
  for (size_t i = 0; i < eligible.size() && static_cast<int>(i) < max; ++i) ids[i] = static_cast<int>(eligible[i]);
  return static_cast<int>(eligible.size());
}

// Paged attention with dense tails: tokens at and past packed_tokens[s] of
// sequence s are rows tail_k/v[tail_offset[s] + i] ([rows, kv_heads, dim]
// of tail_dtype); has_tail: some query reaches them. Otherwise as
// tqkv_gpu_attention.
int tqkv_gpu_attention_tail(void* hp, const uint8_t* k_base, const uint8_t* v_base, int64_t block_stride,
                            const int32_t* block_table, int max_blocks, const int64_t* packed_tokens,
                            const int32_t* query_seq, const int64_t* positions, int64_t num_queries,
                            int64_t max_context, const float* q, float* out, void* workspace,
                            uint64_t workspace_bytes, int splits, int kernel, const void* tail_k,
                            const void* tail_v, int tail_dtype, const int64_t* tail_offset, int has_tail,
                            void* stream) {
  auto* h = static_cast<Handle*>(hp);
  tqkv::gpu::AttentionLaunch a = MakeLaunch(h);
  a.k_base = k_base;
  a.v_base = v_base;
  a.block_stride = block_stride;
  a.block_table = block_table;
  a.max_blocks = max_blocks;
  a.packed_tokens = packed_tokens;
  a.query_seq = query_seq;
  a.positions = positions;
  a.num_queries = num_queries;
  a.max_context = max_context;
  a.q = q;
  a.out = out;
  a.workspace = workspace;
  a.workspace_bytes = workspace_bytes;
  a.tail_k = tail_k;
  a.tail_v = tail_v;
  a.tail_dtype = tail_dtype;
  a.tail_offset = tail_offset;
  a.has_tail = has_tail != 0;
  tqkv::gpu::AttentionPlan plan;
  cudaError_t e = Plan(hp, a, splits, kernel, &plan);
  if (e != cudaSuccess) return static_cast<int>(e);
  e = tqkv::gpu::LaunchAttention(a, plan, static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) g_error = cudaGetErrorString(e);
  return static_cast<int>(e);
}

// Paged attention, no dense tail. K page p at k_base + p·block_stride, V
// page at v_base + p·block_stride. q/out fp32 [nq, q_heads, dim]. splits:
// 0 planned, else forced; kernel: -1 the served choice, else a kernel id
// (tqkv_gpu_attention_kernel_id), refused where it cannot run the call.
int tqkv_gpu_attention(void* hp, const uint8_t* k_base, const uint8_t* v_base, int64_t block_stride,
                       const int32_t* block_table, int max_blocks, const int64_t* packed_tokens,
                       const int32_t* query_seq, const int64_t* positions, int64_t num_queries,
                       int64_t max_context, const float* q, float* out, void* workspace, uint64_t workspace_bytes,
                       int splits, int kernel, void* stream) {
  return tqkv_gpu_attention_tail(hp, k_base, v_base, block_stride, block_table, max_blocks, packed_tokens, query_seq,
                                 positions, num_queries, max_context, q, out, workspace, workspace_bytes, splits,
                                 kernel, nullptr, nullptr, tqkv::gpu::kGpuF16, nullptr, 0, stream);
}

}  // extern "C"
