#include "gpu/cuda_backend.h"

#include <algorithm>
#include <optional>
#include <cstring>
#include <map>
#include <unordered_map>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/parallel_for.h"
#include "base/status_macros.h"
#include "gpu/attention_plan.h"
#include "gpu/block_cache.h"
#include "gpu/call_staging.h"
#include "gpu/codec_tables.h"
#include "gpu/convert.h"
#include "gpu/cuda_util.h"
#include "gpu/host_pinning.h"
#include "gpu/ipc_memory.h"
#include "gpu/kernels.h"
#include "gpu/scatter.h"
#include "gpu/seq_tables.h"

namespace tqkv::gpu {
namespace {

// Calls whose staging and outputs each fit in kMappedIoBytes skip the bulk
// copies: kernels read and write the pinned staging through its device
// mapping (the scatter kernel reads it in chunks of kMappedChunkBytes, one
// block each, so the reads across the bus are in flight together).
constexpr size_t kMappedIoBytes = size_t{64} << 10;
constexpr size_t kMappedChunkBytes = size_t{4} << 10;
constexpr size_t kMaxSeqTables = 16384;  // keyed sequences' tables kept (beyond: dropped, rebuilt on demand)

// The dtype every K and V view of a batch has, or fp32 where they differ
// (EncodeItem or DecodeItem).
template <typename Item>
DType SharedDType(std::span<const Item> items) {
  DType dt = items[0].k[0].dtype;
  for (const Item& item : items)
    for (size_t i = 0; i < item.k.size(); ++i)
      if (item.k[i].dtype != dt || item.v[i].dtype != dt) dt = DType::kF32;
  return dt;
}

class CudaBackend : public ComputeBackend {
 public:
  CudaBackend(const CudaBackendOptions& o, CudaStream stream, CudaEvent attend_start, CudaEvent attend_stop,
              std::unique_ptr<DeviceBlockCache> cache, std::unique_ptr<DeviceBlockCache> tail_cache,
              std::unique_ptr<DeviceSeqTables> seq_tables, const AttentionDevice& device)
      : options_(o),
        stream_(std::move(stream)),
        attend_start_(std::move(attend_start)),
        attend_stop_(std::move(attend_stop)),
        cache_(std::move(cache)),
        device_(device),
        seq_tables_(std::move(seq_tables)),
        tail_cache_(std::move(tail_cache)) {}

  std::string name() const override { return "cuda"; }

  absl::Status EncodeBlock(const ModelCodec& codec, int first, int last, const std::vector<DenseView>& k,
                           const std::vector<DenseView>& v, uint8_t* out) override {
    const EncodeItem item{k, v, out};
    return EncodeBlocks(codec, first, last, std::span<const EncodeItem>(&item, 1));
  }

  // One upload of every block's dense rows (per layer, all blocks' tokens
  // back to back; fp32 for all when the inputs' dtypes differ), one encode
  // launch per layer over all blocks (slot b·block_size + t; rows past a
  // block's tokens stay zero), one download (per run of outputs in the
  // pinned host arena).
  absl::Status EncodeBlocks(const ModelCodec& codec, int first, int last,
                            std::span<const EncodeItem> items) override {
    if (items.empty()) return absl::OkStatus();
    for (const EncodeItem& item : items) TQ_RETURN_IF_ERROR(ValidateEncodeArgs(codec, first, last, item.k, item.v));
    const DType dt = SharedDType(items);
    absl::MutexLock lock(&mu_);
    // Copies queued before an error may still write the callers' buffers.
    absl::Cleanup drain = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { (void)cudaStreamSynchronize(stream_.get()); };
    TQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
    TQ_ASSIGN_OR_RETURN(const DeviceCodecTables* tables, Tables(codec));
    const ModelShape& s = codec.shape();
    const size_t out_bytes = codec.layer_range_bytes(first, last);
    const size_t n = items.size(), layers = static_cast<size_t>(last - first);
    const size_t row_elems = static_cast<size_t>(s.num_kv_heads) * s.head_dim, row = row_elems * DTypeSize(dt);
    std::vector<int64_t> tokens(layers, 0);  // rows of each layer over all blocks
    for (const EncodeItem& item : items)
      for (size_t i = 0; i < layers; ++i) tokens[i] += item.k[i].tokens;
    Staging st;
    std::vector<size_t> k_off, v_off, slots_off;
    for (size_t i = 0; i < layers; ++i) {
      k_off.push_back(st.Add(tokens[i] * row));
      v_off.push_back(st.Add(tokens[i] * row));
      slots_off.push_back(st.Add(sizeof(int64_t) * tokens[i]));
    }
    const size_t flag_off = st.Add(sizeof(unsigned long long));
    const size_t pages_off = st.Add(n * out_bytes);
    TQ_RETURN_IF_ERROR(host_.Reserve(std::max(pages_off, n * out_bytes)));
    TQ_RETURN_IF_ERROR(dev_.Reserve(st.size()));
    uint8_t* h = host_.as<uint8_t>();
    // Block b's rows of layer i start at row row0[i·n + b] of the layer's
    // staging; the gather (megabytes for a frame of dense blocks) runs on
    // up to 8 threads, one per MiB.
    std::vector<int64_t> row0(layers * n);
    for (size_t i = 0; i < layers; ++i) {
      int64_t at = 0;
      for (size_t b = 0; b < n; ++b) {
        row0[i * n + b] = at;
        at += items[b].k[i].tokens;
      }
    }
    ParallelFor(
        layers * n, pages_off,
        [&](size_t j) {
          const size_t i = j / n, b = j % n;
          const int64_t at = row0[j], t_b = items[b].k[i].tokens;
          for (int c = 0; c < 2; ++c) {
            const DenseView& t = c == 0 ? items[b].k[i] : items[b].v[i];
            uint8_t* dst = h + (c == 0 ? k_off[i] : v_off[i]) + at * row;
            if (t.dtype == dt) {
              std::memcpy(dst, t.data, t_b * row);
            } else {
              ToFloat(t.dtype, t.data, reinterpret_cast<float*>(dst), t_b * row_elems);
            }
          }
          int64_t* slots = reinterpret_cast<int64_t*>(h + slots_off[i]);
          for (int64_t tok = 0; tok < t_b; ++tok) slots[at + tok] = static_cast<int64_t>(b) * s.block_size + tok;
        },
        /*max_threads=*/8, /*min_bytes_per_thread=*/size_t{1} << 20);
    uint8_t* d = dev_.as<uint8_t>();
    cudaStream_t sm = stream_.get();
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, pages_off, cudaMemcpyHostToDevice, sm), "upload dense");
    TQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d + pages_off, 0, n * out_bytes, sm), "zero pages");
    for (int l = first; l < last; ++l) {
      const size_t i = l - first;
      if (tokens[i] == 0) continue;  // no rows: the layer's pages stay zero
      TQ_RETURN_IF_ERROR(EncodeLayer(codec, *tables, first, l, n, out_bytes, d + pages_off, d + k_off[i], d + v_off[i], dt,
                                     tokens[i], reinterpret_cast<const int64_t*>(d + slots_off[i]),
                                     reinterpret_cast<unsigned long long*>(d + flag_off)));
    }
    // Into the outputs: straight where they lie in the pinned host arena,
    // else through the staging.
    TQ_ASSIGN_OR_RETURN(const bool direct,
                        DownloadToPinned([&](size_t b) { return items[b].out; }, n, out_bytes, d + pages_off, sm));
    if (!direct)
      TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h, d + pages_off, n * out_bytes, cudaMemcpyDeviceToHost, sm),
                              "download pages");
    TQ_RETURN_IF_ERROR(stream_.Synchronize("encode"));
    if (!direct)
      ParallelFor(
          n, n * out_bytes, [&](size_t b) { std::memcpy(items[b].out, h + b * out_bytes, out_bytes); },
          /*max_threads=*/8, /*min_bytes_per_thread=*/size_t{1} << 20);
    return absl::OkStatus();
  }

  // Launches the encode of layer l of n blocks whose layer ranges [first,
  // ...) lie `stride` bytes apart from `pages`: `rows` dense rows of K and
  // V in `dt`, row r into slot slots[r] (block · block_size + token).
  absl::Status EncodeLayer(const ModelCodec& codec, const DeviceCodecTables& tables, int first, int l, size_t n,
                           size_t stride, uint8_t* pages, const uint8_t* k, const uint8_t* v, DType dt, int64_t rows,
                           const int64_t* slots, unsigned long long* flag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    EncodeLaunch a;
    uint8_t* kp = pages + codec.layer_offset(l) - codec.layer_offset(first);
    SetLayerPages(codec, tables, l, kp, kp + codec.k_page_bytes(l), static_cast<int64_t>(n), slots, flag, &a);
    a.k_pages.block_stride = a.v_pages.block_stride = static_cast<int64_t>(stride);
    a.k = k;
    a.v = v;
    a.dtype = static_cast<int32_t>(dt);
    a.tokens = rows;
    a.host_k = &tables.host(l, 0, Component::kKey);
    a.host_v = &tables.host(l, 0, Component::kValue);
    TQ_CUDA_RETURN_IF_ERROR(LaunchEncode(a, stream_.get()), absl::StrCat("encode layer ", l));
    return absl::OkStatus();
  }

  // Launches the decode of layer l of n blocks laid out as EncodeLayer's:
  // `rows` dense rows of K and V in `dt`, row r from slot slots[r].
  absl::Status DecodeLayer(const ModelCodec& codec, const DeviceCodecTables& tables, int first, int l, size_t n,
                           size_t stride, uint8_t* pages, uint8_t* k, uint8_t* v, DType dt, int64_t rows,
                           const int64_t* slots, unsigned long long* flag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    DecodeLaunch a;
    uint8_t* kp = pages + codec.layer_offset(l) - codec.layer_offset(first);
    SetLayerPages(codec, tables, l, kp, kp + codec.k_page_bytes(l), static_cast<int64_t>(n), slots, flag, &a);
    a.k_pages.block_stride = a.v_pages.block_stride = static_cast<int64_t>(stride);
    a.k = k;
    a.v = v;
    a.dtype = static_cast<int32_t>(dt);
    a.tokens = rows;
    TQ_CUDA_RETURN_IF_ERROR(LaunchDecode(a, stream_.get()), absl::StrCat("decode layer ", l));
    return absl::OkStatus();
  }

  absl::Status DecodeBlock(const ModelCodec& codec, int first, int last, const uint8_t* payload,
                           const std::vector<MutableDenseView>& k,
                           const std::vector<MutableDenseView>& v) override {
    const DecodeItem item{payload, k, v};
    return DecodeBlocks(codec, first, last, std::span<const DecodeItem>(&item, 1));
  }

  // One upload of every block's pages, one decode launch per layer over all
  // blocks (into the outputs' dtype when they share one, else fp32
  // converted on the host), one download.
  absl::Status DecodeBlocks(const ModelCodec& codec, int first, int last,
                            std::span<const DecodeItem> items) override {
    if (items.empty()) return absl::OkStatus();
    for (const DecodeItem& item : items) TQ_RETURN_IF_ERROR(ValidateDecodeArgs(codec, first, last, item.k, item.v));
    const DType dt = SharedDType(items);
    const ModelShape& s = codec.shape();
    absl::MutexLock lock(&mu_);
    TQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
    TQ_ASSIGN_OR_RETURN(const DeviceCodecTables* tables, Tables(codec));
    const size_t in_bytes = codec.layer_range_bytes(first, last);
    const size_t n = items.size(), layers = static_cast<size_t>(last - first);
    const size_t block_elems = static_cast<size_t>(s.block_size) * s.num_kv_heads * s.head_dim;
    const size_t block_out = block_elems * DTypeSize(dt);  // one block's K (or V) of one layer
    Staging st;
    const size_t pages_off = st.Add(n * in_bytes);
    const size_t slots_off = st.Add(sizeof(int64_t) * n * s.block_size);
    const size_t out_off = st.Add(2 * n * block_out * layers);  // per layer: K of every block, then V
    const size_t flag_off = st.Add(sizeof(unsigned long long));
    TQ_RETURN_IF_ERROR(host_.Reserve(st.size()));
    TQ_RETURN_IF_ERROR(dev_.Reserve(st.size()));
    uint8_t* h = host_.as<uint8_t>();
    uint8_t* d = dev_.as<uint8_t>();
    ParallelFor(
        n, n * in_bytes, [&](size_t b) { std::memcpy(h + pages_off + b * in_bytes, items[b].payload, in_bytes); },
        /*max_threads=*/8, /*min_bytes_per_thread=*/size_t{1} << 20);
    int64_t* slots = reinterpret_cast<int64_t*>(h + slots_off);
    for (size_t t = 0; t < n * s.block_size; ++t) slots[t] = static_cast<int64_t>(t);
    cudaStream_t sm = stream_.get();
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, out_off, cudaMemcpyHostToDevice, sm), "upload blocks");
    for (int l = first; l < last; ++l) {
      const size_t i = l - first;
      uint8_t* ko = d + out_off + 2 * i * n * block_out;
      TQ_RETURN_IF_ERROR(DecodeLayer(codec, *tables, first, l, n, in_bytes, d + pages_off, ko, ko + n * block_out, dt,
                                     static_cast<int64_t>(n) * s.block_size,
                                     reinterpret_cast<const int64_t*>(d + slots_off),
                                     reinterpret_cast<unsigned long long*>(d + flag_off)));
    }
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + out_off, d + out_off, 2 * n * block_out * layers,
                                            cudaMemcpyDeviceToHost, sm),
                            "download dense");
    TQ_RETURN_IF_ERROR(stream_.Synchronize("decode"));
    // Into the callers' buffers (megabytes for a frame of dense blocks, and
    // often first touched here) on up to 8 threads, one per MiB.
    ParallelFor(
        layers * n, 2 * n * block_out * layers,
        [&](size_t j) {
          const size_t i = j / n, b = j % n;
          const uint8_t* ko = h + out_off + 2 * i * n * block_out;
          for (int c = 0; c < 2; ++c) {
            const MutableDenseView& t = c == 0 ? items[b].k[i] : items[b].v[i];
            const uint8_t* src = ko + (c * n + b) * block_out;
            if (t.dtype == dt) {
              std::memcpy(t.data, src, block_out);
            } else {
              FromFloat(t.dtype, reinterpret_cast<const float*>(src), t.data, block_elems);
            }
          }
        },
        /*max_threads=*/8, /*min_bytes_per_thread=*/size_t{1} << 20);
    return absl::OkStatus();
  }

  // Per chunk of blocks: the rows' offsets up, then per layer a gather of
  // K and V from the worker's memory into staging and the encode launch,
  // then the chunk's pages down: straight into the outputs where they lie
  // in the pinned host arena, else into one of two host halves, whose
  // pages the host copies out while the device works on the next chunk
  // (in parallel for large chunks).
  absl::Status EncodeDeviceBlocks(const ModelCodec& codec, int first, int last, const DeviceKvRef& src,
                                  std::span<const DeviceEncodeItem> items) override {
    if (items.empty()) return absl::OkStatus();
    TQ_RETURN_IF_ERROR(ValidateDeviceKv(codec, first, last, src));
    const ModelShape& s = codec.shape();
    for (size_t b = 0; b < items.size(); ++b)
      if (items[b].tokens < 1 || items[b].tokens > s.block_size || items[b].out == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("device block ", b, " has ", items[b].tokens,
                                                       " tokens; expected [1, ", s.block_size, "]"));
    std::vector<DeviceSpan> spans;
    for (const DeviceEncodeItem& it : items) spans.push_back({it.slot, it.tokens});
    absl::MutexLock lock(&mu_);
    // Copies queued before an error may still touch the callers' buffers.
    absl::Cleanup drain = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { (void)cudaStreamSynchronize(stream_.get()); };
    TQ_ASSIGN_OR_RETURN(DeviceCall call, OpenDeviceCall(codec, first, last, src, spans));
    const DeviceCodecTables* tables = call.tables;
    const IpcMappings& maps = call.maps;
    const DeviceChunk& chunk = call.chunk;
    const size_t out_bytes = codec.layer_range_bytes(first, last);
    cudaStream_t sm = stream_.get();
    // Copies chunk `at`'s pages out of host half `half` once its download is done.
    auto copy_out = [&](size_t at, int half) -> absl::Status {
      TQ_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(chunk_done_[half].get()), "device encode");
      const uint8_t* pages = host_.as<uint8_t>() + half * chunk.host_bytes + chunk.pages_off;
      const size_t n = std::min(chunk.blocks, items.size() - at);
      ParallelFor(n, n * out_bytes, [&](size_t b) { std::memcpy(items[at + b].out, pages + b * out_bytes, out_bytes); });
      return absl::OkStatus();
    };
    int half = 0;
    std::optional<std::pair<size_t, int>> staged;  // a chunk (first item, half) whose pages wait in a host half
    for (size_t at = 0; at < items.size(); at += chunk.blocks, half ^= 1) {
      const size_t n = std::min(chunk.blocks, items.size() - at);
      // This half's last use (two chunks ago) must be over before it is refilled.
      if (at >= 2 * chunk.blocks)
        TQ_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(chunk_done_[half].get()), "device encode");
      uint8_t* h = host_.as<uint8_t>() + half * chunk.host_bytes;
      uint8_t* d = dev_.as<uint8_t>();
      bool aligned = true;
      const int64_t rows = FillRows(src, std::span(spans).subspan(at, n), s.block_size, h, chunk, &aligned);
      TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, chunk.k_off, cudaMemcpyHostToDevice, sm), "upload rows");
      TQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d + chunk.pages_off, 0, n * out_bytes, sm), "zero pages");
      for (int l = first; l < last; ++l) {
        TQ_RETURN_IF_ERROR(MoveLayerHeads(codec, src, maps, first, l, d, chunk, rows, aligned, /*to_staging=*/true));
        TQ_RETURN_IF_ERROR(EncodeLayer(codec, *tables, first, l, n, out_bytes, d + chunk.pages_off, d + chunk.k_off,
                                       d + chunk.v_off, src.dtype, rows,
                                       reinterpret_cast<const int64_t*>(d + chunk.slots_off),
                                       reinterpret_cast<unsigned long long*>(d + chunk.flag_off)));
      }
      TQ_ASSIGN_OR_RETURN(const bool direct, DownloadToPinned([&](size_t b) { return items[at + b].out; }, n,
                                                              out_bytes, d + chunk.pages_off, sm));
      if (!direct) {
        TQ_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(h + chunk.pages_off, d + chunk.pages_off, n * out_bytes, cudaMemcpyDeviceToHost, sm),
            "download pages");
      }
      TQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(chunk_done_[half].get(), sm), "record chunk");
      if (staged) TQ_RETURN_IF_ERROR(copy_out(staged->first, staged->second));
      staged.reset();
      if (!direct) staged.emplace(at, half);
    }
    if (staged) TQ_RETURN_IF_ERROR(copy_out(staged->first, staged->second));
    return stream_.Synchronize("device encode");
  }

  // Per chunk of blocks: the pages and row offsets up (filled into one of
  // two host halves while the device works on the previous chunk), then
  // per layer the decode launch into staging and a scatter of K and V into
  // the worker's memory; one synchronisation at the end.
  absl::Status DecodeDeviceBlocks(const ModelCodec& codec, int first, int last,
                                  std::span<const DeviceDecodeItem> items, const DeviceKvRef& dst) override {
    if (items.empty()) return absl::OkStatus();
    TQ_RETURN_IF_ERROR(ValidateDeviceKv(codec, first, last, dst));
    const ModelShape& s = codec.shape();
    for (size_t b = 0; b < items.size(); ++b)
      if (items[b].payload == nullptr) return absl::InvalidArgumentError(absl::StrCat("device block ", b, " has no payload"));
    std::vector<DeviceSpan> spans;
    for (const DeviceDecodeItem& it : items) spans.push_back({it.slot, s.block_size});
    absl::MutexLock lock(&mu_);
    // Copies queued before an error may still touch the callers' buffers.
    absl::Cleanup drain = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { (void)cudaStreamSynchronize(stream_.get()); };
    TQ_ASSIGN_OR_RETURN(DeviceCall call, OpenDeviceCall(codec, first, last, dst, spans));
    const DeviceCodecTables* tables = call.tables;
    const IpcMappings& maps = call.maps;
    const DeviceChunk& chunk = call.chunk;
    const size_t in_bytes = codec.layer_range_bytes(first, last);
    cudaStream_t sm = stream_.get();
    int half = 0;
    for (size_t at = 0; at < items.size(); at += chunk.blocks, half ^= 1) {
      const size_t n = std::min(chunk.blocks, items.size() - at);
      // This half's last uploads (two chunks ago) must be done before it is refilled.
      if (at >= 2 * chunk.blocks)
        TQ_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(chunk_done_[half].get()), "device decode");
      uint8_t* h = host_.as<uint8_t>() + half * chunk.host_bytes;
      uint8_t* d = dev_.as<uint8_t>();
      bool aligned = true;
      const int64_t rows = FillRows(dst, std::span(spans).subspan(at, n), s.block_size, h, chunk, &aligned);
      TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, chunk.k_off, cudaMemcpyHostToDevice, sm), "upload rows");
      // Payloads in the pinned host arena go up as they are; the others
      // through the host half.
      std::vector<size_t> via_half;
      for (size_t b = 0; b < n; ++b) {
        const uint8_t* p = items[at + b].payload;
        if (!Pinned(p, in_bytes)) {
          via_half.push_back(b);
          continue;
        }
        TQ_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(d + chunk.pages_off + b * in_bytes, p, in_bytes, cudaMemcpyHostToDevice, sm),
            "upload pages");
      }
      ParallelFor(via_half.size(), via_half.size() * in_bytes, [&](size_t j) {
        const size_t b = via_half[j];
        std::memcpy(h + chunk.pages_off + b * in_bytes, items[at + b].payload, in_bytes);
      });
      if (via_half.size() == n) {
        TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d + chunk.pages_off, h + chunk.pages_off, n * in_bytes,
                                                cudaMemcpyHostToDevice, sm),
                                "upload pages");
      } else {
        for (size_t b : via_half)
          TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d + chunk.pages_off + b * in_bytes, h + chunk.pages_off + b * in_bytes,
                                                  in_bytes, cudaMemcpyHostToDevice, sm),
                                  "upload pages");
      }
      TQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(chunk_done_[half].get(), sm), "record chunk");
      for (int l = first; l < last; ++l) {
        TQ_RETURN_IF_ERROR(DecodeLayer(codec, *tables, first, l, n, in_bytes, d + chunk.pages_off, d + chunk.k_off,
                                       d + chunk.v_off, dst.dtype, rows,
                                       reinterpret_cast<const int64_t*>(d + chunk.slots_off),
                                       reinterpret_cast<unsigned long long*>(d + chunk.flag_off)));
        TQ_RETURN_IF_ERROR(MoveLayerHeads(codec, dst, maps, first, l, d, chunk, rows, aligned, /*to_staging=*/false));
      }
    }
    return stream_.Synchronize("device decode");
  }

  absl::Status Attend(const ModelCodec& codec, const AttendBatch& b) override {
    TQ_RETURN_IF_ERROR(ValidateAttendBatch(codec, b));
    if (b.query_offsets.back() == 0) return EncodePacks(codec, b);
    absl::MutexLock lock(&mu_);
    absl::Status s = AttendLocked(codec, b);
    if (!s.ok()) ForgetAfterFailure(b);
    return s;
  }

  void Forget(uint64_t id) override {
    absl::MutexLock lock(&mu_);
    ForgetLocked(id);
  }

  absl::Status AttendLocked(const ModelCodec& codec, const AttendBatch& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    TQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
    TQ_ASSIGN_OR_RETURN(const DeviceCodecTables* tables, Tables(codec));
    TQ_RETURN_IF_ERROR(cache_->EnsureSlotBytes(codec.block_bytes()));
    const ModelShape& s = codec.shape();
    const int l = b.layer;
    const int64_t nq = b.query_offsets.back();
    const size_t nseq = b.sequences.size();
    ++epoch_;
    int32_t max_blocks = 1;
    for (const AttendSequence& q : b.sequences)
      max_blocks = std::max<int32_t>(max_blocks, static_cast<int32_t>(q.blocks.size()));
    CallTables tables_of;
    Uploads up;
    std::vector<int32_t> pack_slots;
    TQ_RETURN_IF_ERROR(BlockSlots(codec, b, max_blocks, &tables_of, &up, &pack_slots));
    PackPlan packs = PlanPacks(codec, b, std::move(pack_slots));
    const size_t row = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
    const size_t qrow = static_cast<size_t>(b.shape.q_heads) * s.head_dim;
    std::vector<int64_t> tail_offset(nseq, 0);
    const TailPlan tails = PlanTails(b, row, &tail_offset, &up);

    Staging st;
    const std::vector<int32_t>& table = tables_of.staged;
    const size_t table_off = st.Add(table.size() * sizeof(int32_t));
    const size_t ptrs_off = st.Add(tables_of.pointers ? nseq * sizeof(int32_t*) : 0);
    const size_t packed_off = st.Add(nseq * sizeof(int64_t));
    const size_t tailoff_off = st.Add(nseq * sizeof(int64_t));
    const size_t qseq_off = st.Add(nq * sizeof(int32_t));
    const size_t pos_off = st.Add(nq * sizeof(int64_t));
    // A large call whose queries share a 16-bit wire dtype ships them and
    // its outputs in it, converted on the device.
    const WireIo wire = ChooseWireIo(b, static_cast<size_t>(nq) * qrow);
    const size_t q_off = st.Add(nq * qrow * (wire.on_device ? DTypeSize(wire.dtype) : sizeof(float)));
    const size_t tk_off = st.Add(tails.staged_tokens * row * tails.elem_bytes);
    const size_t tv_off = st.Add(tails.staged_tokens * row * tails.elem_bytes);
    std::vector<size_t> piece_src(up.pieces.size());
    for (size_t i = 0; i < up.pieces.size(); ++i) piece_src[i] = st.Add(up.pieces[i].bytes);
    const size_t pieces_off = st.Add(up.pieces.size() * sizeof(ScatterPiece));
    packs.AddInputs(st);
    const size_t in_bytes = st.size();
    // A small call moves through the pinned staging's device mapping: the
    // scatter kernel reads the staging from host memory (no host-to-device
    // copy before it) and the outputs are written to host memory (no
    // download after them).
    const size_t out_bytes = nq * qrow * (wire.on_device ? DTypeSize(wire.dtype) : sizeof(float));
    const bool mapped = in_bytes <= kMappedIoBytes && out_bytes <= kMappedIoBytes;
    const size_t upload_chunks = mapped ? (in_bytes + kMappedChunkBytes - 1) / kMappedChunkBytes : 0;
    const size_t mapped_pieces_off = st.Add(mapped ? (upload_chunks + up.pieces.size()) * sizeof(ScatterPiece) : 0);
    const size_t out_off = st.Add(nq * qrow * sizeof(float));
    const size_t q32_off = st.Add(wire.on_device ? nq * qrow * sizeof(float) : 0);    // device only
    const size_t out16_off = st.Add(wire.on_device ? nq * qrow * DTypeSize(wire.dtype) : 0);
    packs.AddOutputs(st);
    TQ_RETURN_IF_ERROR(host_.Reserve(st.size()));
    uint8_t* h = host_.as<uint8_t>();
    packs.Stage(b, h);
    std::memcpy(h + table_off, table.data(), table.size() * sizeof(int32_t));
    auto* packed = reinterpret_cast<int64_t*>(h + packed_off);
    int64_t max_ctx = 1;
    bool has_tail = false;
    for (size_t i = 0; i < nseq; ++i) {
      const AttendSequence& q = b.sequences[i];
      packed[i] = q.packed_tokens;
      for (int64_t qi = b.query_offsets[i]; qi < b.query_offsets[i + 1]; ++qi) {
        reinterpret_cast<int32_t*>(h + qseq_off)[qi] = static_cast<int32_t>(i);
        max_ctx = std::max<int64_t>(max_ctx, b.positions[qi] + 1);
        has_tail = has_tail || b.positions[qi] >= q.packed_tokens;
      }
    }
    std::memcpy(h + tailoff_off, tail_offset.data(), nseq * sizeof(int64_t));
    if (!tails.cached) StageTails(b, row, tails, h + tk_off, h + tv_off);
    std::memcpy(h + pos_off, b.positions.data(), nq * sizeof(int64_t));
    // Queries convert from their wire dtype straight into the staging, or
    // are copied in it.
    for (size_t i = 0; i < nseq; ++i) {
      const int64_t q0 = b.query_offsets[i], n = b.query_offsets[i + 1] - q0;
      if (n == 0) continue;
      if (wire.on_device) {
        const size_t e = DTypeSize(wire.dtype);
        std::memcpy(h + q_off + q0 * qrow * e, b.sequences[i].q, n * qrow * e);
      } else {
        ToFloat(b.sequences[i].dtype, b.sequences[i].q, reinterpret_cast<float*>(h + q_off) + q0 * qrow, n * qrow);
      }
    }
    auto* pieces = reinterpret_cast<ScatterPiece*>(h + pieces_off);
    for (size_t i = 0; i < up.pieces.size(); ++i) {
      std::memcpy(h + piece_src[i], up.pieces[i].src, up.pieces[i].bytes);
      pieces[i] = {up.pieces[i].dst, piece_src[i], up.pieces[i].bytes};
    }

    AttentionLaunch a;
    a.k_comp = tables->device(l, Component::kKey);
    a.v_comp = tables->device(l, Component::kValue);
    a.host_k = tables->host(l, 0, Component::kKey);
    a.host_v = tables->host(l, 0, Component::kValue);
    a.uniform_codebooks = tables->uniform_codebooks(l);
    a.k_signs = tables->k_head_signs(l);
    a.k_base = cache_->base() + codec.layer_offset(l);
    a.v_base = a.k_base + codec.k_page_bytes(l);
    a.block_stride = static_cast<int64_t>(cache_->slot_bytes());
    a.block_size = s.block_size;
    a.max_blocks = max_blocks;
    a.tail_dtype = tails.dtype;
    a.has_tail = has_tail;
    a.num_queries = nq;
    a.q_heads = b.shape.q_heads;
    a.kv_heads = b.shape.kv_heads;
    a.dim = b.shape.dim;
    a.scale = static_cast<float>(b.shape.effective_scale());
    a.max_context = max_ctx;
    AttentionPlan plan;
    TQ_CUDA_RETURN_IF_ERROR(PlanAttention(a, device_, &plan), "attention plan");
    const size_t ws = plan.workspace_bytes;
    const size_t ws_off = Staging::Align(st.size());
    TQ_RETURN_IF_ERROR(dev_.Reserve(ws_off + ws));
    uint8_t* d = dev_.as<uint8_t>();
    a.block_table = reinterpret_cast<const int32_t*>(d + table_off);
    if (!tables_of.pointers && !tables_of.device.empty() && tables_of.device[0] != nullptr) {
      a.block_table = tables_of.device[0];  // one sequence, its table on the device
    } else if (tables_of.pointers) {
      auto* ptrs = reinterpret_cast<const int32_t**>(h + ptrs_off);
      for (size_t i = 0; i < nseq; ++i)
        ptrs[i] = tables_of.device[i] != nullptr
                      ? tables_of.device[i]
                      : reinterpret_cast<const int32_t*>(d + table_off) + tables_of.staged_row[i] * max_blocks;
      a.seq_tables = reinterpret_cast<const int32_t* const*>(d + ptrs_off);
    }
    a.packed_tokens = reinterpret_cast<const int64_t*>(d + packed_off);
    a.tail_offset = reinterpret_cast<const int64_t*>(d + tailoff_off);
    a.tail_k = tails.cached ? tail_cache_->base() : d + tk_off;
    a.tail_v = tails.cached ? tail_cache_->base() + tails.v_offset : d + tv_off;
    // One query per sequence, in order (decode): the kernels take query i
    // as sequence i without loading query_seq.
    bool one_per_seq = static_cast<size_t>(nq) == nseq;
    for (size_t i = 0; one_per_seq && i < nseq; ++i) one_per_seq = b.query_offsets[i] == static_cast<int64_t>(i);
    a.query_seq = one_per_seq ? nullptr : reinterpret_cast<const int32_t*>(d + qseq_off);
    a.positions = reinterpret_cast<const int64_t*>(d + pos_off);
    a.q = reinterpret_cast<const float*>(d + (wire.on_device ? q32_off : q_off));
    a.out = reinterpret_cast<float*>((mapped && !wire.on_device ? h : d) + out_off);
    a.workspace = d + ws_off;
    a.workspace_bytes = ws;
    cudaStream_t sm = stream_.get();
    TQ_RETURN_IF_ERROR(UploadBlocks(codec, up.blocks, sm));
    if (mapped) {
      // One launch: the staging's chunks to the device buffer, the pieces
      // to their destinations, all read from host memory.
      auto* all = reinterpret_cast<ScatterPiece*>(h + mapped_pieces_off);
      for (size_t c = 0; c < upload_chunks; ++c) {
        const size_t off = c * kMappedChunkBytes;
        all[c] = {d + off, off, Staging::Align(std::min(kMappedChunkBytes, in_bytes - off))};
      }
      std::memcpy(all + upload_chunks, pieces, up.pieces.size() * sizeof(ScatterPiece));
      TQ_CUDA_RETURN_IF_ERROR(
          LaunchScatter(all, static_cast<int>(upload_chunks + up.pieces.size()), h, sm),
          "upload batch, scatter layers and tail rows");
    } else {
      TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, in_bytes, cudaMemcpyHostToDevice, sm), "upload batch");
      TQ_CUDA_RETURN_IF_ERROR(LaunchScatter(reinterpret_cast<const ScatterPiece*>(d + pieces_off),
                                            static_cast<int>(up.pieces.size()), d, sm),
                              "scatter layers and tail rows");
    }
    if (wire.on_device)
      TQ_CUDA_RETURN_IF_ERROR(LaunchToFloat(d + q_off, wire.gpu_dtype(), reinterpret_cast<float*>(d + q32_off),
                                            nq * static_cast<int64_t>(qrow), sm),
                              "queries to fp32");
    TQ_RETURN_IF_ERROR(LaunchPacks(codec, *tables, packs, d, sm));
    TQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(attend_start_.get(), sm), "cudaEventRecord");
    TQ_CUDA_RETURN_IF_ERROR(LaunchAttention(a, plan, sm), "attention");
    TQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(attend_stop_.get(), sm), "cudaEventRecord");
    if (wire.on_device) {
      TQ_CUDA_RETURN_IF_ERROR(LaunchFromFloat(reinterpret_cast<const float*>(d + out_off), wire.gpu_dtype(),
                                              (mapped ? h : d) + out16_off, nq * static_cast<int64_t>(qrow), sm),
                              "outputs from fp32");
      if (!mapped)
        TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + out16_off, d + out16_off, out_bytes, cudaMemcpyDeviceToHost, sm),
                                "download outputs");
    } else if (!mapped) {
      TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + out_off, d + out_off, nq * qrow * sizeof(float),
                                              cudaMemcpyDeviceToHost, sm),
                              "download outputs");
    }
    TQ_RETURN_IF_ERROR(DownloadPacks(codec, packs, h, sm));
    TQ_RETURN_IF_ERROR(stream_.Synchronize("attention"));
    packs.Deliver(b, h);
    for (size_t i = 0; i < nseq; ++i) {
      const int64_t q0 = b.query_offsets[i], n = b.query_offsets[i + 1] - q0;
      if (n == 0) continue;
      if (wire.on_device) {
        const size_t e = DTypeSize(wire.dtype);
        std::memcpy(b.sequences[i].out, h + out16_off + q0 * qrow * e, n * qrow * e);
      } else {
        FromFloat(b.sequences[i].dtype, reinterpret_cast<const float*>(h + out_off) + q0 * qrow,
                  b.sequences[i].out, n * qrow);
      }
    }
    if (b.device_micros != nullptr)
      *b.device_micros = 1e3 * std::max(0.0f, CudaEvent::ElapsedMs(attend_start_, attend_stop_));
    return absl::OkStatus();
  }

  void ForgetLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    cache_->Forget(id);
    layers_.erase(id);
    tail_cache_->Forget(id);
    tail_rows_.erase(id);
    seq_tables_->Forget(id);
  }

  // A failed Attend may have queued copies that still read its payloads
  // (waited for here) and given blocks, tails and tables slots their bytes
  // never reached (dropped: the next call that needs them uploads them).
  void ForgetAfterFailure(const AttendBatch& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    (void)cudaStreamSynchronize(stream_.get());
    for (const AttendSequence& q : b.sequences) {
      for (const BlockRef& r : q.blocks) ForgetLocked(r.id);
      if (q.tail_id != 0) ForgetLocked(q.tail_id);
      if (q.sequence_key != 0) ForgetLocked(q.sequence_key);
    }
    for (const PackItem& p : b.packs) ForgetLocked(p.block_id);
  }

  BackendStats Stats() const override {
    absl::MutexLock lock(&mu_);
    BackendStats st;
    st.device_bytes_capacity = cache_->capacity_bytes();
    st.device_bytes_used = cache_->resident_bytes();
    st.device_blocks = cache_->resident_blocks();
    st.uploads = cache_->uploads();
    st.evictions = cache_->evictions();
    if (pinned_host_ != nullptr) {
      st.host_pinned_bytes = pinned_host_->pinned_bytes();
      st.host_pinning_error = pinned_host_->error();
    }
    return st;
  }

  absl::Status UseHostArena(uint8_t* base, size_t bytes) override {
    absl::MutexLock lock(&mu_);
    if (pinned_host_ != nullptr) return absl::FailedPreconditionError("the backend already uses a host arena");
    pinned_host_ = std::make_unique<PinnedHostRange>(options_.device, base, bytes);
    return absl::OkStatus();
  }

 private:
  // Staging of one chunk of a device call: the rows' offsets into the
  // worker's layout, their slots, one layer's dense K and V, the chunk's
  // pages (offsets and slots first, so one upload of [0, k_off) covers
  // them). The host holds two of it, host_bytes apart (a chunk's pages are
  // copied out while the next one is on the device).
  struct DeviceChunk {
    size_t blocks = 0;
    size_t offsets_off = 0, slots_off = 0, flag_off = 0, k_off = 0, v_off = 0, pages_off = 0;
    size_t host_bytes = 0;
  };
  // Sizes chunks to about kDeviceChunkBytes of staging and reserves it.
  absl::StatusOr<DeviceChunk> PlanDeviceChunk(const ModelCodec& codec, DType dt, size_t block_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    constexpr size_t kDeviceChunkBytes = size_t{256} << 20;
    const ModelShape& s = codec.shape();
    const size_t dense = static_cast<size_t>(s.block_size) * s.num_kv_heads * s.head_dim * DTypeSize(dt);
    const size_t per_block = block_bytes + 2 * dense + 2 * sizeof(int64_t) * s.block_size;
    DeviceChunk c;
    c.blocks = std::max<size_t>(1, kDeviceChunkBytes / per_block);
    Staging st;
    c.offsets_off = st.Add(sizeof(int64_t) * c.blocks * s.block_size);
    c.slots_off = st.Add(sizeof(int64_t) * c.blocks * s.block_size);
    c.flag_off = st.Add(sizeof(unsigned long long));
    c.k_off = st.Add(c.blocks * dense);
    c.v_off = st.Add(c.blocks * dense);
    c.pages_off = st.Add(c.blocks * block_bytes);
    c.host_bytes = st.size();
    TQ_RETURN_IF_ERROR(host_.Reserve(2 * st.size()));
    TQ_RETURN_IF_ERROR(dev_.Reserve(st.size()));
    TQ_RETURN_IF_ERROR(CreateMissing(chunk_done_));
    return c;
  }

  // Whether [p, p + n) is pinned host memory a copy may use directly.
  bool Pinned(const void* p, size_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pinned_host_ != nullptr && pinned_host_->Holds(p, n);
  }

  // Queues the copies of n pages of `bytes` each, back to back at `src` on
  // the device, to out(0) .. out(n - 1) when every one of those is pinned
  // host memory (one copy per run of outputs that follow each other in one
  // pinned piece) and returns true; returns false, queuing nothing,
  // otherwise.
  template <typename Out>
  absl::StatusOr<bool> DownloadToPinned(Out out, size_t n, size_t bytes, const uint8_t* src, cudaStream_t sm)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t b = 0; b < n; ++b)
      if (!Pinned(out(b), bytes)) return false;
    for (size_t b = 0, e; b < n; b = e) {
      for (e = b + 1; e < n && out(e) == out(e - 1) + bytes && Pinned(out(b), (e + 1 - b) * bytes); ++e) {
      }
      TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out(b), src + b * bytes, (e - b) * bytes, cudaMemcpyDeviceToHost, sm),
                              "download pages");
    }
    return true;
  }

  // Creates the events of a two-half ring not created yet.
  static absl::Status CreateMissing(CudaEvent (&events)[2]) {
    for (CudaEvent& e : events) {
      if (e.get() != nullptr) continue;
      TQ_ASSIGN_OR_RETURN(e, CudaEvent::Create());
    }
    return absl::OkStatus();
  }

  // Copies stored blocks (slot, host payload) into their arena slots on
  // `sm`: blocks in the pinned host arena straight from it, the others
  // through the two halves of a bounded pinned ring: a half is refilled
  // once its previous copies have left it, so a call that uploads a whole
  // context (a sequence's first Attend) pins no more than the ring and its
  // host copies overlap the transfers. The payloads must stay alive until
  // `sm` has passed the copies.
  absl::Status UploadBlocks(const ModelCodec& codec,
                            const std::vector<std::pair<int32_t, const uint8_t*>>& all_blocks, cudaStream_t sm)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t bb = codec.block_bytes();
    auto slot = [&](int32_t i) { return cache_->base() + static_cast<size_t>(i) * cache_->slot_bytes(); };
    std::vector<std::pair<int32_t, const uint8_t*>> blocks;
    for (const auto& [i, payload] : all_blocks) {
      if (!Pinned(payload, bb)) {
        blocks.push_back({i, payload});
        continue;
      }
      TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot(i), payload, bb, cudaMemcpyHostToDevice, sm), "upload block");
    }
    if (blocks.empty()) return absl::OkStatus();
    const size_t per_half = std::max<size_t>(1, options_.upload_staging_bytes / 2 / bb);
    const size_t half_bytes = per_half * bb;
    TQ_RETURN_IF_ERROR(upload_ring_.Reserve(2 * half_bytes));
    TQ_RETURN_IF_ERROR(CreateMissing(upload_done_));
    for (size_t at = 0, fill = 0; at < blocks.size(); at += per_half, ++fill) {
      const size_t n = std::min(per_half, blocks.size() - at), half = fill % 2;
      uint8_t* ring = upload_ring_.as<uint8_t>() + half * half_bytes;
      // (Also across calls: a failed call may have left copies in flight.)
      TQ_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(upload_done_[half].get()), "upload blocks");
      ParallelFor(n, n * bb, [&](size_t i) { std::memcpy(ring + i * bb, blocks[at + i].second, bb); },
                  /*max_threads=*/8, /*min_bytes_per_thread=*/size_t{4} << 20);
      for (size_t i = 0; i < n; ++i)
        TQ_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(slot(blocks[at + i].first), ring + i * bb, bb, cudaMemcpyHostToDevice, sm),
            "upload block");
      TQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(upload_done_[half].get(), sm), "record upload");
    }
    return absl::OkStatus();
  }

  // Where a device call reads or writes: a block slot and its tokens.
  struct DeviceSpan {
    uint64_t slot = 0;
    int64_t tokens = 0;
  };
  // What a device call works with: the codec's tables, the worker's
  // memory (open for the call) and the chunks' staging.
  struct DeviceCall {
    const DeviceCodecTables* tables = nullptr;
    IpcMappings maps;
    DeviceChunk chunk;
  };
  absl::StatusOr<DeviceCall> OpenDeviceCall(const ModelCodec& codec, int first, int last, const DeviceKvRef& ref,
                                            const std::vector<DeviceSpan>& spans) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    TQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
    DeviceCall call;
    TQ_ASSIGN_OR_RETURN(call.tables, Tables(codec));
    TQ_ASSIGN_OR_RETURN(call.maps, IpcMappings::Open(ref.ipc_handles));
    TQ_RETURN_IF_ERROR(CheckDeviceBounds(codec, ref, call.maps, spans));
    TQ_ASSIGN_OR_RETURN(call.chunk, PlanDeviceChunk(codec, ref.dtype, codec.layer_range_bytes(first, last)));
    return call;
  }
  // INVALID_ARGUMENT unless every byte of every span of every layer lies
  // inside its exported allocation.
  static absl::Status CheckDeviceBounds(const ModelCodec& codec, const DeviceKvRef& ref, const IpcMappings& maps,
                                        const std::vector<DeviceSpan>& spans) {
    const ModelShape& s = codec.shape();
    unsigned __int128 reach = 0;  // past the last byte of the furthest span, from slot 0
    for (const DeviceSpan& sp : spans) {
      if (sp.slot >= (uint64_t{1} << 40))
        return absl::InvalidArgumentError(absl::StrCat("device slot ", sp.slot, " is over 2^40"));
      const unsigned __int128 end = static_cast<unsigned __int128>(sp.slot) * ref.block_stride +
                                    static_cast<unsigned __int128>(sp.tokens - 1) * ref.token_stride +
                                    static_cast<unsigned __int128>(s.num_kv_heads - 1) * ref.head_stride +
                                    static_cast<uint64_t>(s.head_dim) * DTypeSize(ref.dtype);
      reach = std::max(reach, end);
    }
    for (size_t i = 0; i < ref.layers.size(); ++i) {
      const DeviceKvRef::Layer& l = ref.layers[i];
      for (int c = 0; c < 2; ++c) {
        const uint32_t buf = c == 0 ? l.k_buffer : l.v_buffer;
        const uint64_t off = c == 0 ? l.k_offset : l.v_offset;
        if (off + reach > maps.size(buf))
          return absl::InvalidArgumentError(absl::StrCat(
              "device layer ", i, (c == 0 ? " K" : " V"), " reaches byte ", static_cast<uint64_t>(off + reach),
              " of an allocation of ", maps.size(buf), " bytes (ipc_handles[", buf, "])"));
      }
    }
    return absl::OkStatus();
  }

  // Writes the rows of `spans` (block b's token t: row offset slot ·
  // block_stride + t · token_stride in the worker's layout, staging slot
  // b · block_size + t) into host staging `h`; returns the row count and
  // whether every offset is a multiple of 16.
  static int64_t FillRows(const DeviceKvRef& ref, std::span<const DeviceSpan> spans, int block_size, uint8_t* h,
                          const DeviceChunk& chunk, bool* aligned16) {
    int64_t* offsets = reinterpret_cast<int64_t*>(h + chunk.offsets_off);
    int64_t* slots = reinterpret_cast<int64_t*>(h + chunk.slots_off);
    int64_t rows = 0;
    for (size_t b = 0; b < spans.size(); ++b) {
      for (int64_t t = 0; t < spans[b].tokens; ++t, ++rows) {
        offsets[rows] = static_cast<int64_t>(spans[b].slot * ref.block_stride + t * ref.token_stride);
        slots[rows] = static_cast<int64_t>(b) * block_size + t;
        *aligned16 = *aligned16 && offsets[rows] % 16 == 0;
      }
    }
    return rows;
  }

  // Moves layer l (of the call's range from `first`) of K and V between
  // the worker's memory and the chunk's dense staging (`d` the device
  // staging): a gather into staging or a scatter out of it.
  absl::Status MoveLayerHeads(const ModelCodec& codec, const DeviceKvRef& ref, const IpcMappings& maps, int first,
                              int l, uint8_t* d, const DeviceChunk& chunk, int64_t rows, bool rows_aligned16,
                              bool to_staging) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const ModelShape& s = codec.shape();
    const DeviceKvRef::Layer& ly = ref.layers[l - first];
    for (int c = 0; c < 2; ++c) {
      StridedHeads h;
      h.strided = c == 0 ? maps.base(ly.k_buffer) + ly.k_offset : maps.base(ly.v_buffer) + ly.v_offset;
      h.row_offsets = reinterpret_cast<const int64_t*>(d + chunk.offsets_off);
      h.rows = rows;
      h.heads = s.num_kv_heads;
      h.head_stride = static_cast<int64_t>(ref.head_stride);
      h.head_bytes = static_cast<int>(s.head_dim * DTypeSize(ref.dtype));
      h.rows_aligned16 = rows_aligned16;
      TQ_CUDA_RETURN_IF_ERROR(
          LaunchStridedHeads(h, d + (c == 0 ? chunk.k_off : chunk.v_off), to_staging, stream_.get()),
          absl::StrCat(to_staging ? "gather" : "scatter", " layer ", l));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<const DeviceCodecTables*> Tables(const ModelCodec& codec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = tables_.find(&codec);
    if (it != tables_.end()) return it->second.get();
    TQ_ASSIGN_OR_RETURN(auto t, DeviceCodecTables::Upload(codec));
    const DeviceCodecTables* p = t.get();
    tables_[&codec] = std::move(t);
    return p;
  }

  // What a call copies to the device besides its staging: whole blocks
  // (arena slot, payload) and pieces (layers of blocks being filled, new
  // tail rows) that the scatter kernel places.
  struct Piece {
    uint8_t* dst;
    const uint8_t* src;
    size_t bytes;
  };
  struct Uploads {
    std::vector<std::pair<int32_t, const uint8_t*>> blocks;
    std::vector<Piece> pieces;
  };

  // Where each sequence's block table is for the kernels: its device copy
  // (keyed sequences, SeqTable), or a row of max_blocks entries of the
  // call's staged table.
  struct CallTables {
    std::vector<const int32_t*> device;  // per sequence; null: staged_row
    std::vector<int32_t> staged_row;     // per sequence; -1: device
    std::vector<int32_t> staged;         // [rows, max_blocks]
    // The kernels take per-sequence pointers (AttentionLaunch::seq_tables);
    // false: block_table is the staged table (every row staged, in order)
    // or the one sequence's device copy.
    bool pointers = false;
  };

  // Acquires every sequence's blocks and the packs' blocks (their slots in
  // *pack_slots) in the arena, fills `tables` and the uploads the call
  // needs. A keyed sequence's table (DeviceSeqTables) keeps
  // its slots, and their device copy, between calls while the arena's
  // generation is unchanged: only blocks past the kept prefix are acquired
  // and uploaded. If this call's own Acquires evict anything, the kept
  // prefixes are acquired again. Blocks being filled (BlockRef::complete
  // false) copy only this call's layer, once.
  absl::Status BlockSlots(const ModelCodec& codec, const AttendBatch& b, int32_t max_blocks, CallTables* tables,
                          Uploads* up, std::vector<int32_t>* pack_slots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int l = b.layer;
    const size_t nseq = b.sequences.size();
    const uint64_t gen0 = cache_->generation();
    // Layer l of a block being filled, copied once into its slot.
    auto ensure_layer = [&](const BlockRef& r, int32_t slot, bool miss) {
      std::vector<bool>& have = layers_[r.id];
      if (miss || have.empty()) have.assign(codec.shape().num_layers, false);
      if (have[l]) return;
      for (const PackItem& p : b.packs) {
        if (p.block_id != r.id) continue;
        have[l] = true;  // this call's pack encodes the layer into the slot
        return;
      }
      const size_t off = codec.layer_offset(l), bytes = codec.layer_range_bytes(l, l + 1);
      if (off % 16 == 0 && bytes % 16 == 0) {
        up->pieces.push_back({cache_->base() + static_cast<size_t>(slot) * cache_->slot_bytes() + off,
                              r.payload + off, bytes});
      } else {
        up->blocks.emplace_back(slot, r.payload);  // the scatter kernel's 16-byte words do not fit
      }
      have[l] = true;
    };
    std::vector<SeqTable> unkeyed;  // this call's tables of sequences without a key
    unkeyed.reserve(nseq);
    std::vector<SeqTable*> tab(nseq);
    auto acquire = [&](size_t i) -> absl::Status {
      const AttendSequence& q = b.sequences[i];
      SeqTable& t = *tab[i];
      for (size_t j = t.size(); j < q.blocks.size(); ++j) {
        const BlockRef& r = q.blocks[j];
        bool miss = false;
        TQ_ASSIGN_OR_RETURN(int32_t slot, cache_->Acquire(r.id, epoch_, codec.block_bytes(), &miss));
        t.Push(r, slot);
        if (!r.complete) ensure_layer(r, slot, miss);
        else if (miss) up->blocks.emplace_back(slot, r.payload);
      }
      return absl::OkStatus();
    };
    seq_tables_->Reserve(nseq);
    std::vector<size_t> kept(nseq, 0);
    for (size_t i = 0; i < nseq; ++i) {
      const AttendSequence& q = b.sequences[i];
      if (q.sequence_key == 0) {
        tab[i] = &unkeyed.emplace_back();
      } else {
        SeqTable& t = *(tab[i] = &seq_tables_->Get(q.sequence_key));
        const size_t keep = t.Keep(q.blocks, gen0);
        // Kept blocks being filled may lack this layer: acquired (so this
        // call's copies go to slots no later Acquire can take).
        size_t f = std::min(t.first_filling, keep);
        while (f < keep && q.blocks[f].complete) ++f;
        t.first_filling = f < keep ? f : SIZE_MAX;
        for (size_t j = f; j < keep; ++j) {
          const BlockRef& r = q.blocks[j];
          if (r.complete) continue;
          bool miss = false;
          TQ_ASSIGN_OR_RETURN(int32_t slot, cache_->Acquire(r.id, epoch_, codec.block_bytes(), &miss));
          if (slot != t.slots[j]) {  // cannot happen while the generation holds; kept exact regardless
            t.slots[j] = slot;
            t.uploaded = std::min(t.uploaded, j);
          }
          ensure_layer(r, slot, miss);
        }
        kept[i] = keep;
      }
      TQ_RETURN_IF_ERROR(acquire(i));
    }
    // The packs' blocks (listed by the call's sequences: acquired above),
    // their layer l written by the pack's encode, not uploaded.
    for (const PackItem& p : b.packs) {
      bool miss = false;
      TQ_ASSIGN_OR_RETURN(int32_t slot, cache_->Acquire(p.block_id, epoch_, codec.block_bytes(), &miss));
      std::vector<bool>& have = layers_[p.block_id];
      if (miss || have.empty()) have.assign(codec.shape().num_layers, false);
      have[l] = true;
      pack_slots->push_back(slot);
    }
    if (cache_->generation() != gen0) {
      for (size_t i = 0; i < nseq; ++i) {
        if (kept[i] == 0) continue;
        tab[i]->Clear();
        TQ_RETURN_IF_ERROR(acquire(i));
      }
    }
    // Device copies where the kernels can read them: at most the arena's
    // padding past any table's start.
    const bool on_device = static_cast<size_t>(max_blocks) <= seq_tables_->max_table_entries();
    tables->device.assign(nseq, nullptr);
    tables->staged_row.assign(nseq, -1);
    int32_t rows = 0;
    for (size_t i = 0; i < nseq; ++i) {
      SeqTable& t = *tab[i];
      if (b.sequences[i].sequence_key != 0) t.generation = cache_->generation();
      int32_t* dev = on_device && b.sequences[i].sequence_key != 0 ? seq_tables_->Device(t) : nullptr;
      if (dev != nullptr) {
        const size_t from = t.uploaded / 4 * 4;  // 16-byte pieces; slots are padded to them
        if (t.slots.size() > from)
          up->pieces.push_back({reinterpret_cast<uint8_t*>(dev + from),
                                reinterpret_cast<const uint8_t*>(t.slots.data() + from),
                                (t.slots.size() - from) * sizeof(int32_t)});
        t.uploaded = t.size();
        tables->device[i] = dev;
        continue;
      }
      tables->staged_row[i] = rows++;
      tables->staged.resize(static_cast<size_t>(rows) * max_blocks, 0);
      std::copy(t.slots.begin(), t.slots.begin() + static_cast<std::ptrdiff_t>(t.size()),
                tables->staged.end() - max_blocks);
    }
    bool in_order = true;
    for (size_t i = 0; in_order && i < nseq; ++i) in_order = tables->staged_row[i] == static_cast<int32_t>(i);
    tables->pointers = !in_order && !(nseq == 1 && tables->device[0] != nullptr);
    if (tables->staged.empty()) tables->staged.assign(1, 0);
    return absl::OkStatus();
  }

  absl::Status LaunchPacks(const ModelCodec& codec, const DeviceCodecTables& tables, const PackPlan& p,
                           uint8_t* d, cudaStream_t sm) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (p.n == 0) return absl::OkStatus();
    const int l = p.layer;
    EncodeLaunch a;
    uint8_t* kp = cache_->base() + codec.layer_offset(l);  // slot j's layer l at + j · slot_bytes
    SetLayerPages(codec, tables, l, kp, kp + codec.k_page_bytes(l), cache_->num_slots(),
                  reinterpret_cast<const int64_t*>(d + p.slots_off),
                  reinterpret_cast<unsigned long long*>(d + p.flag_off), &a);
    a.k_pages.block_stride = a.v_pages.block_stride = static_cast<int64_t>(cache_->slot_bytes());
    a.k = d + p.k_off;
    a.v = d + p.v_off;
    a.dtype = static_cast<int32_t>(p.dtype);
    a.tokens = static_cast<int64_t>(p.n * p.rows);
    TQ_CUDA_RETURN_IF_ERROR(LaunchEncode(a, sm), absl::StrCat("encode packs of layer ", l));
    return absl::OkStatus();
  }

  absl::Status DownloadPacks(const ModelCodec& codec, const PackPlan& p, uint8_t* h, cudaStream_t sm)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < p.n; ++i)
      TQ_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(h + p.out_off + i * p.layer_bytes,
                          cache_->base() + static_cast<size_t>(p.slots[i]) * cache_->slot_bytes() +
                              codec.layer_offset(p.layer),
                          p.layer_bytes, cudaMemcpyDeviceToHost, sm),
          "download packs");
    return absl::OkStatus();
  }

  // A call without queries: its packs alone.
  absl::Status EncodePacks(const ModelCodec& codec, const AttendBatch& b) {
    std::vector<EncodeItem> items;
    for (const PackItem& p : b.packs) items.push_back({{p.k}, {p.v}, p.out});
    return EncodeBlocks(codec, b.layer, b.layer + 1, items);
  }

  // Where a call's tails come from: the tail cache (every tail has an id,
  // fp32 rows of 16-byte multiples, at most a slot's rows), or staged in
  // this call (tail_dtype kGpuF16 when every tail is fp16, else fp32).
  struct TailPlan {
    bool cached = false;
    int64_t staged_tokens = 0;
    size_t elem_bytes = 4;
    int32_t dtype = kGpuF32;
    size_t v_offset = 0;  // cached: V rows' offset in a slot, bytes
  };
  TailPlan PlanTails(const AttendBatch& b, size_t row, std::vector<int64_t>* tail_offset, Uploads* up)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    TailPlan p;
    const size_t row_bytes = row * sizeof(float);
    const int64_t rows = kTailSlotRows;
    bool cacheable = row_bytes % 16 == 0 && tail_cache_->EnsureSlotBytes(2 * rows * row_bytes).ok() &&
                     tail_cache_->slot_bytes() % (2 * row_bytes) == 0;
    bool all_f16 = true;
    for (const AttendSequence& q : b.sequences) {
      if (q.tail_k.tokens == 0) continue;
      p.staged_tokens += q.tail_k.tokens;
      all_f16 = all_f16 && q.tail_k.dtype == DType::kF16 && q.tail_v.dtype == DType::kF16;
      cacheable = cacheable && q.tail_id != 0 && q.tail_k.dtype == DType::kF32 && q.tail_v.dtype == DType::kF32 &&
                  q.tail_k.tokens <= rows;
    }
    // The tail cache's slots: K rows, then V rows.
    const int64_t slot_rows = cacheable ? static_cast<int64_t>(tail_cache_->slot_bytes() / row_bytes) : 0;
    struct TailSlot {
      size_t seq;
      int32_t slot;
      bool miss;
    };
    std::vector<TailSlot> slots;
    for (size_t i = 0; cacheable && i < b.sequences.size(); ++i) {
      const AttendSequence& q = b.sequences[i];
      if (q.tail_k.tokens == 0) continue;
      bool miss = false;
      absl::StatusOr<int32_t> slot = tail_cache_->Acquire(q.tail_id, epoch_, 2 * rows * row_bytes, &miss);
      if (!slot.ok()) {
        cacheable = false;  // more tails than slots in one call: stage them
        break;
      }
      slots.push_back({i, *slot, miss});
    }
    if (!cacheable) {
      int64_t off = 0;
      for (size_t i = 0; i < b.sequences.size(); ++i) {
        (*tail_offset)[i] = off;
        off += b.sequences[i].tail_k.tokens;
      }
      p.dtype = all_f16 ? kGpuF16 : kGpuF32;
      p.elem_bytes = all_f16 ? 2 : 4;
      return p;
    }
    p.cached = true;
    p.staged_tokens = 0;
    p.v_offset = static_cast<size_t>(slot_rows / 2) * row_bytes;
    for (const TailSlot& t : slots) {
      const AttendSequence& q = b.sequences[t.seq];
      const int32_t slot = t.slot;
      (*tail_offset)[t.seq] = static_cast<int64_t>(slot) * slot_rows;
      int64_t& held = tail_rows_[q.tail_id];
      if (t.miss || held > q.tail_k.tokens) held = 0;
      const int64_t n = q.tail_k.tokens - held;
      if (n == 0) continue;
      uint8_t* base = tail_cache_->base() + static_cast<size_t>(slot) * tail_cache_->slot_bytes();
      const size_t from = static_cast<size_t>(held) * row_bytes, bytes = static_cast<size_t>(n) * row_bytes;
      up->pieces.push_back({base + from, static_cast<const uint8_t*>(q.tail_k.data) + from, bytes});
      up->pieces.push_back({base + p.v_offset + from, static_cast<const uint8_t*>(q.tail_v.data) + from, bytes});
      held = q.tail_k.tokens;
    }
    return p;
  }

  // The tails of an uncached call, back to back in `k` and `v`.
  static void StageTails(const AttendBatch& b, size_t row, const TailPlan& p, uint8_t* k, uint8_t* v) {
    size_t at = 0;
    for (const AttendSequence& q : b.sequences) {
      const size_t n = static_cast<size_t>(q.tail_k.tokens) * row;
      if (n == 0) continue;
      for (int c = 0; c < 2; ++c) {
        const DenseView& t = c == 0 ? q.tail_k : q.tail_v;
        uint8_t* dst = (c == 0 ? k : v) + at * p.elem_bytes;
        if (p.dtype == kGpuF16) std::memcpy(dst, t.data, n * 2);
        else ToFloat(t.dtype, t.data, reinterpret_cast<float*>(dst), n);
      }
      at += n;
    }
  }

  static constexpr int64_t kTailSlotRows = 16;   // tails longer than this are staged per call

  const CudaBackendOptions options_;
  mutable absl::Mutex mu_;
  CudaStream stream_ ABSL_GUARDED_BY(mu_);
  CudaEvent attend_start_ ABSL_GUARDED_BY(mu_), attend_stop_ ABSL_GUARDED_BY(mu_);  // around the kernels
  std::unique_ptr<DeviceBlockCache> cache_ ABSL_GUARDED_BY(mu_);
  const AttentionDevice device_;  // what the attention plan needs of the GPU
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const ModelCodec*, std::unique_ptr<DeviceCodecTables>> tables_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DeviceSeqTables> seq_tables_ ABSL_GUARDED_BY(mu_);             // by sequence key
  std::unordered_map<uint64_t, std::vector<bool>> layers_ ABSL_GUARDED_BY(mu_);   // filling blocks' copied layers
  std::unique_ptr<DeviceBlockCache> tail_cache_ ABSL_GUARDED_BY(mu_);             // tail rows by tail id
  std::unordered_map<uint64_t, int64_t> tail_rows_ ABSL_GUARDED_BY(mu_);          // rows a tail slot holds
  PinnedBuffer host_ ABSL_GUARDED_BY(mu_);
  CudaEvent chunk_done_[2] ABSL_GUARDED_BY(mu_);  // device calls: a chunk's pages are in host half i
  PinnedBuffer upload_ring_ ABSL_GUARDED_BY(mu_);  // UploadBlocks' two halves
  CudaEvent upload_done_[2] ABSL_GUARDED_BY(mu_);  // the copies out of half i
  DeviceBuffer dev_ ABSL_GUARDED_BY(mu_);  // staging + workspace, grows to the largest call
  std::unique_ptr<PinnedHostRange> pinned_host_ ABSL_GUARDED_BY(mu_);  // the host tier's arena (UseHostArena)
};

}  // namespace

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const CudaBackendOptions& options) {
  if (const char* hook = ProfileHookName(); hook != nullptr)
    return absl::FailedPreconditionError(absl::StrCat("these kernels were built with the profiling hook ", hook,
                                                      " (--define=tqkv_profile), whose outputs are wrong: rebuild "
                                                      "without it to serve"));
  const int n = CudaDeviceCount();
  if (n <= 0)
    return absl::UnavailableError("no CUDA device or driver available (cudaGetDeviceCount found none)");
  if (options.device < 0 || options.device >= n)
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", options.device, " outside [0, ", n, ")"));
  TQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device), "cudaSetDevice");
  AttentionDevice device;
  TQ_CUDA_RETURN_IF_ERROR(ProbeAttentionDevice(options.device, &device), "attention device probe");
  TQ_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  size_t arena = options.arena_bytes;
  if (arena == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    TQ_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    if (!(options.arena_fraction > 0 && options.arena_fraction < 1))
      return absl::InvalidArgumentError("arena_fraction must be in (0, 1)");
    arena = static_cast<size_t>(static_cast<double>(free_bytes) * options.arena_fraction);
  }
  TQ_ASSIGN_OR_RETURN(CudaEvent attend_start, CudaEvent::Create());
  TQ_ASSIGN_OR_RETURN(CudaEvent attend_stop, CudaEvent::Create());
  TQ_ASSIGN_OR_RETURN(auto cache, DeviceBlockCache::Create(arena));
  TQ_ASSIGN_OR_RETURN(auto tail_cache, DeviceBlockCache::Create(options.tail_arena_bytes));
  TQ_ASSIGN_OR_RETURN(auto seq_tables, DeviceSeqTables::Create(options.table_arena_bytes,
                                                               options.max_table_blocks, kMaxSeqTables));
  return std::unique_ptr<ComputeBackend>(new CudaBackend(options, std::move(stream), std::move(attend_start),
                                                         std::move(attend_stop), std::move(cache),
                                                         std::move(tail_cache), std::move(seq_tables), device));
}

}  // namespace tqkv::gpu
