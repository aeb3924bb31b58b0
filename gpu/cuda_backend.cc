#include "gpu/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "codec/cpu_backend.h"
#include "codec/status_macros.h"
#include "gpu/block_cache.h"
#include "gpu/codec_tables.h"
#include "gpu/cuda_util.h"
#include "gpu/kernels.h"

namespace tqkv::gpu {
namespace {

size_t Align(size_t n) { return (n + 255) / 256 * 256; }

// Lays out several host arrays in one pinned buffer and one device buffer so
// that a call needs a single host-to-device copy.
class Staging {
 public:
  size_t Add(size_t bytes) {
    size_t off = size_;
    size_ += Align(bytes);
    return off;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

class CudaBackend : public ComputeBackend {
 public:
  CudaBackend(const CudaBackendOptions& o, CudaStream stream, std::unique_ptr<DeviceBlockCache> cache,
              int sms)
      : options_(o), stream_(std::move(stream)), cache_(std::move(cache)), sms_(sms) {}

  std::string name() const override { return "cuda"; }

  absl::Status EncodeBlock(const ModelCodec& codec, int first, int last, const std::vector<DenseView>& k,
                           const std::vector<DenseView>& v, uint8_t* out) override {
    TQ_RETURN_IF_ERROR(ValidateEncodeArgs(codec, first, last, k, v));
    absl::MutexLock lock(&mu_);
    TQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
    TQ_ASSIGN_OR_RETURN(const DeviceCodecTables* tables, Tables(codec));
    const ModelShape& s = codec.shape();
    const size_t base = codec.layer_offset(first);
    const size_t out_bytes = codec.layer_range_bytes(first, last);
    Staging st;
    std::vector<size_t> k_off, v_off;
    std::vector<int32_t> dtypes;
    for (size_t i = 0; i < k.size(); ++i) {
      // K and V share one dtype per launch; mixed dtypes go through fp32.
      const bool same = k[i].dtype == v[i].dtype;
      const DType dt = same ? k[i].dtype : DType::kF32;
      dtypes.push_back(static_cast<int32_t>(dt));
      const size_t bytes = static_cast<size_t>(k[i].tokens) * s.num_kv_heads * s.head_dim * DTypeSize(dt);
      k_off.push_back(st.Add(bytes));
      v_off.push_back(st.Add(bytes));
    }
    const size_t slots_off = st.Add(sizeof(int64_t) * s.block_size);
    const size_t flag_off = st.Add(sizeof(unsigned long long));
    const size_t pages_off = st.Add(out_bytes);
    TQ_RETURN_IF_ERROR(host_.Reserve(std::max(st.size(), out_bytes)));
    TQ_RETURN_IF_ERROR(dev_.Reserve(st.size()));
    uint8_t* h = host_.as<uint8_t>();
    for (size_t i = 0; i < k.size(); ++i) {
      const size_t n = static_cast<size_t>(k[i].tokens) * s.num_kv_heads * s.head_dim;
      for (int c = 0; c < 2; ++c) {
        const DenseView& t = c == 0 ? k[i] : v[i];
        uint8_t* dst = h + (c == 0 ? k_off[i] : v_off[i]);
        if (static_cast<int32_t>(t.dtype) == dtypes[i]) {
          std::memcpy(dst, t.data, t.bytes());
        } else {
          std::vector<float> tmp(n);
          ToFloat(t.dtype, t.data, tmp.data(), n);
          std::memcpy(dst, tmp.data(), n * sizeof(float));
        }
      }
    }
    int64_t* slots = reinterpret_cast<int64_t*>(h + slots_off);
    for (int t = 0; t < s.block_size; ++t) slots[t] = t;
    uint8_t* d = dev_.as<uint8_t>();
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, pages_off, cudaMemcpyHostToDevice, stream_.get()), "upload dense");
    TQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d + pages_off, 0, out_bytes, stream_.get()), "zero pages");
    for (int l = first; l < last; ++l) {
      const size_t i = l - first;
      EncodeLaunch a;
      uint8_t* kp = d + pages_off + codec.layer_offset(l) - base;  // one block: K page, V page
      SetLayerPages(codec, *tables, l, kp, kp + codec.k_page_bytes(l), /*num_blocks=*/1,
                    reinterpret_cast<const int64_t*>(d + slots_off),
                    reinterpret_cast<unsigned long long*>(d + flag_off), &a);
      a.k = d + k_off[i];
      a.v = d + v_off[i];
      a.dtype = dtypes[i];
      a.tokens = k[i].tokens;
      a.host_k = &tables->host(l, 0, Component::kKey);
      a.host_v = &tables->host(l, 0, Component::kValue);
      TQ_CUDA_RETURN_IF_ERROR(LaunchEncode(a, stream_.get()), absl::StrCat("encode layer ", l));
    }
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h, d + pages_off, out_bytes, cudaMemcpyDeviceToHost, stream_.get()),
                            "download pages");
    TQ_RETURN_IF_ERROR(stream_.Synchronize("encode"));
    std::memcpy(out, h, out_bytes);
    return absl::OkStatus();
  }

  absl::Status DecodeBlock(const ModelCodec& codec, int first, int last, const uint8_t* payload,
                           const std::vector<MutableDenseView>& k,
                           const std::vector<MutableDenseView>& v) override {
    const ModelShape& s = codec.shape();
    if (first < 0 || last > s.num_layers || first >= last || k.size() != size_t(last - first) ||
        v.size() != k.size())
      return absl::InvalidArgumentError("bad layer range or output count");
    for (size_t i = 0; i < k.size(); ++i)
      for (const MutableDenseView* t : {&k[i], &v[i]})
        if (t->tokens != s.block_size || t->heads != s.num_kv_heads || t->dim != s.head_dim || !t->data)
          return absl::InvalidArgumentError(absl::StrCat("decode output of layer ", first + i,
                                                         " must be [", s.block_size, ", ", s.num_kv_heads,
                                                         ", ", s.head_dim, "]"));
    absl::MutexLock lock(&mu_);
    TQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
    TQ_ASSIGN_OR_RETURN(const DeviceCodecTables* tables, Tables(codec));
    const size_t base = codec.layer_offset(first);
    const size_t in_bytes = codec.layer_range_bytes(first, last);
    const size_t layer_elems = static_cast<size_t>(s.block_size) * s.num_kv_heads * s.head_dim;
    Staging st;
    const size_t pages_off = st.Add(in_bytes);
    const size_t slots_off = st.Add(sizeof(int64_t) * s.block_size);
    const size_t out_off = st.Add(2 * layer_elems * sizeof(float) * (last - first));
    const size_t flag_off = st.Add(sizeof(unsigned long long));
    TQ_RETURN_IF_ERROR(host_.Reserve(st.size()));
    TQ_RETURN_IF_ERROR(dev_.Reserve(st.size()));
    uint8_t* h = host_.as<uint8_t>();
    uint8_t* d = dev_.as<uint8_t>();
    std::memcpy(h + pages_off, payload, in_bytes);
    int64_t* slots = reinterpret_cast<int64_t*>(h + slots_off);
    for (int t = 0; t < s.block_size; ++t) slots[t] = t;
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, out_off, cudaMemcpyHostToDevice, stream_.get()), "upload block");
    for (int l = first; l < last; ++l) {
      const size_t i = l - first;
      DecodeLaunch a;
      uint8_t* kp = d + pages_off + codec.layer_offset(l) - base;  // one block: K page, V page
      SetLayerPages(codec, *tables, l, kp, kp + codec.k_page_bytes(l), /*num_blocks=*/1,
                    reinterpret_cast<const int64_t*>(d + slots_off),
                    reinterpret_cast<unsigned long long*>(d + flag_off), &a);
      float* ko = reinterpret_cast<float*>(d + out_off) + 2 * i * layer_elems;
      a.k = ko;
      a.v = ko + layer_elems;
      a.dtype = kGpuF32;
      a.tokens = s.block_size;
      TQ_CUDA_RETURN_IF_ERROR(LaunchDecode(a, stream_.get()), absl::StrCat("decode layer ", l));
    }
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + out_off, d + out_off, 2 * layer_elems * sizeof(float) * (last - first),
                                            cudaMemcpyDeviceToHost, stream_.get()),
                            "download dense");
    TQ_RETURN_IF_ERROR(stream_.Synchronize("decode"));
    for (size_t i = 0; i < k.size(); ++i) {
      const float* ko = reinterpret_cast<const float*>(h + out_off) + 2 * i * layer_elems;
      FromFloat(k[i].dtype, ko, k[i].data, layer_elems);
      FromFloat(v[i].dtype, ko + layer_elems, v[i].data, layer_elems);
    }
    return absl::OkStatus();
  }

  absl::Status Attend(const ModelCodec& codec, const AttendBatch& b) override {
    TQ_RETURN_IF_ERROR(ValidateAttendBatch(codec, b));
    absl::MutexLock lock(&mu_);
    TQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
    TQ_ASSIGN_OR_RETURN(const DeviceCodecTables* tables, Tables(codec));
    TQ_RETURN_IF_ERROR(cache_->EnsureSlotBytes(codec.block_bytes()));
    const ModelShape& s = codec.shape();
    const int l = b.layer;
    const int64_t nq = b.query_offsets.back();
    if (nq == 0) return absl::OkStatus();
    const size_t nseq = b.sequences.size();
    ++epoch_;
    // Residency: upload missing blocks straight from the caller's memory
    // through the pinned staging buffer.
    int32_t max_blocks = 1;
    int64_t tail_tokens = 0;
    bool all_f16 = true;
    for (const AttendSequence& q : b.sequences) {
      max_blocks = std::max<int32_t>(max_blocks, static_cast<int32_t>(q.blocks.size()));
      tail_tokens += q.tail_k.tokens;
      all_f16 = all_f16 && (q.tail_k.tokens == 0 || (q.tail_k.dtype == DType::kF16 && q.tail_v.dtype == DType::kF16));
    }
    std::vector<int32_t> table(nseq * max_blocks, 0);
    std::vector<std::pair<int32_t, const uint8_t*>> uploads;
    // A decode step attends the same blocks layer after layer: a sequence
    // whose block ids match a remembered slot list, taken while the arena's
    // generation is unchanged, reuses it instead of 1 Acquire per block. If
    // this call's own Acquires evict anything, reused lists are re-acquired.
    const uint64_t gen0 = cache_->generation();
    std::vector<size_t> reused;
    auto acquire = [&](size_t i) -> absl::Status {
      const AttendSequence& q = b.sequences[i];
      for (size_t j = 0; j < q.blocks.size(); ++j) {
        bool miss = false;
        TQ_ASSIGN_OR_RETURN(int32_t slot, cache_->Acquire(q.blocks[j].id, epoch_, codec.block_bytes(), &miss));
        table[i * max_blocks + j] = slot;
        if (miss) uploads.emplace_back(slot, q.blocks[j].payload);
      }
      return absl::OkStatus();
    };
    for (size_t i = 0; i < nseq; ++i) {
      const SlotList* known = FindSlotList(b.sequences[i], gen0);
      if (known != nullptr) {
        std::copy(known->slots.begin(), known->slots.end(), table.begin() + i * max_blocks);
        reused.push_back(i);
      } else {
        TQ_RETURN_IF_ERROR(acquire(i));
      }
    }
    if (cache_->generation() != gen0) {
      for (size_t i : reused) TQ_RETURN_IF_ERROR(acquire(i));
      reused.clear();
    }
    for (size_t i = 0; i < nseq; ++i)
      if (std::find(reused.begin(), reused.end(), i) == reused.end())
        RememberSlotList(b.sequences[i], &table[i * max_blocks]);
    const int tail_dtype = all_f16 ? kGpuF16 : kGpuF32;
    const size_t tail_elem = all_f16 ? 2 : 4;
    const size_t row = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
    const size_t qrow = static_cast<size_t>(b.shape.q_heads) * s.head_dim;
    Staging st;
    const size_t table_off = st.Add(table.size() * sizeof(int32_t));
    const size_t packed_off = st.Add(nseq * sizeof(int64_t));
    const size_t tailoff_off = st.Add(nseq * sizeof(int64_t));
    const size_t qseq_off = st.Add(nq * sizeof(int32_t));
    const size_t pos_off = st.Add(nq * sizeof(int64_t));
    const size_t q_off = st.Add(nq * qrow * sizeof(float));
    const size_t tk_off = st.Add(tail_tokens * row * tail_elem);
    const size_t tv_off = st.Add(tail_tokens * row * tail_elem);
    const size_t in_bytes = st.size();
    const size_t out_off = st.Add(nq * qrow * sizeof(float));
    const size_t up_off = st.Add(uploads.size() * codec.block_bytes());
    TQ_RETURN_IF_ERROR(host_.Reserve(st.size()));
    uint8_t* h = host_.as<uint8_t>();
    std::memcpy(h + table_off, table.data(), table.size() * sizeof(int32_t));
    auto* packed = reinterpret_cast<int64_t*>(h + packed_off);
    auto* tailoff = reinterpret_cast<int64_t*>(h + tailoff_off);
    int64_t toff = 0;
    int64_t max_ctx = 1;
    for (size_t i = 0; i < nseq; ++i) {
      const AttendSequence& q = b.sequences[i];
      packed[i] = q.packed_tokens;
      tailoff[i] = toff;
      const size_t n = static_cast<size_t>(q.tail_k.tokens) * row;
      for (int c = 0; c < 2; ++c) {
        const DenseView& t = c == 0 ? q.tail_k : q.tail_v;
        uint8_t* dst = h + (c == 0 ? tk_off : tv_off) + toff * row * tail_elem;
        if (n == 0) continue;
        if (all_f16) std::memcpy(dst, t.data, n * 2);
        else ToFloat(t.dtype, t.data, reinterpret_cast<float*>(dst), n);
      }
      toff += q.tail_k.tokens;
      for (int64_t qi = b.query_offsets[i]; qi < b.query_offsets[i + 1]; ++qi) {
        reinterpret_cast<int32_t*>(h + qseq_off)[qi] = static_cast<int32_t>(i);
        max_ctx = std::max<int64_t>(max_ctx, b.positions[qi] + 1);
      }
    }
    std::memcpy(h + pos_off, b.positions.data(), nq * sizeof(int64_t));
    std::memcpy(h + q_off, b.q, nq * qrow * sizeof(float));
    for (size_t u = 0; u < uploads.size(); ++u)
      std::memcpy(h + up_off + u * codec.block_bytes(), uploads[u].second, codec.block_bytes());
    bool has_tail = false;
    for (size_t i = 0; i < nseq; ++i)
      for (int64_t qi = b.query_offsets[i]; qi < b.query_offsets[i + 1]; ++qi)
        has_tail = has_tail || b.positions[qi] >= b.sequences[i].packed_tokens;

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
    a.tail_dtype = tail_dtype;
    a.has_tail = has_tail;
    a.num_queries = nq;
    a.q_heads = b.shape.q_heads;
    a.kv_heads = b.shape.kv_heads;
    a.dim = b.shape.dim;
    a.scale = static_cast<float>(b.shape.effective_scale());
    a.max_context = max_ctx;
    a.num_sms = sms_;
    a.allow_fast_path = options_.fast_path;
    const size_t ws = AttentionWorkspaceBytes(a);
    const size_t ws_off = Align(st.size());
    TQ_RETURN_IF_ERROR(dev_.Reserve(ws_off + ws));
    uint8_t* d = dev_.as<uint8_t>();
    a.block_table = reinterpret_cast<const int32_t*>(d + table_off);
    a.packed_tokens = reinterpret_cast<const int64_t*>(d + packed_off);
    a.tail_offset = reinterpret_cast<const int64_t*>(d + tailoff_off);
    a.tail_k = d + tk_off;
    a.tail_v = d + tv_off;
    // One query per sequence, in order (decode): the kernels take query i
    // as sequence i without loading query_seq.
    bool one_per_seq = static_cast<size_t>(nq) == nseq;
    for (size_t i = 0; one_per_seq && i < nseq; ++i) one_per_seq = b.query_offsets[i] == static_cast<int64_t>(i);
    a.query_seq = one_per_seq ? nullptr : reinterpret_cast<const int32_t*>(d + qseq_off);
    a.positions = reinterpret_cast<const int64_t*>(d + pos_off);
    a.q = reinterpret_cast<const float*>(d + q_off);
    a.out = reinterpret_cast<float*>(d + out_off);
    a.workspace = d + ws_off;
    a.workspace_bytes = ws;
    cudaStream_t sm = stream_.get();
    for (size_t u = 0; u < uploads.size(); ++u)
      TQ_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(cache_->base() + static_cast<size_t>(uploads[u].first) * cache_->slot_bytes(),
                          h + up_off + u * codec.block_bytes(), codec.block_bytes(), cudaMemcpyHostToDevice, sm),
          "upload block");
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, h, in_bytes, cudaMemcpyHostToDevice, sm), "upload batch");
    TQ_CUDA_RETURN_IF_ERROR(LaunchAttention(a, sm), "attention");
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + out_off, d + out_off, nq * qrow * sizeof(float),
                                            cudaMemcpyDeviceToHost, sm),
                            "download outputs");
    TQ_RETURN_IF_ERROR(stream_.Synchronize("attention"));
    std::memcpy(b.out, h + out_off, nq * qrow * sizeof(float));
    return absl::OkStatus();
  }

  void Forget(uint64_t id) override {
    absl::MutexLock lock(&mu_);
    cache_->Forget(id);
  }

  BackendStats Stats() const override {
    absl::MutexLock lock(&mu_);
    BackendStats st;
    st.device_bytes_capacity = cache_->capacity_bytes();
    st.device_bytes_used = cache_->resident_bytes();
    st.device_blocks = cache_->resident_blocks();
    st.uploads = cache_->uploads();
    st.evictions = cache_->evictions();
    return st;
  }

 private:
  absl::StatusOr<const DeviceCodecTables*> Tables(const ModelCodec& codec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = tables_.find(&codec);
    if (it != tables_.end()) return it->second.get();
    TQ_ASSIGN_OR_RETURN(auto t, DeviceCodecTables::Upload(codec));
    const DeviceCodecTables* p = t.get();
    tables_[&codec] = std::move(t);
    return p;
  }

  // The slots of one sequence's blocks, valid while the arena generation is
  // `generation` (see DeviceBlockCache::generation()).
  struct SlotList {
    std::vector<uint64_t> ids;
    std::vector<int32_t> slots;
    uint64_t generation = 0;
  };
  static uint64_t IdsKey(const AttendSequence& q) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ q.blocks.size();
    for (const BlockRef& r : q.blocks) h = (h ^ r.id) * 0x100000001b3ULL;
    return h;
  }
  const SlotList* FindSlotList(const AttendSequence& q, uint64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (q.blocks.empty()) return nullptr;
    auto it = slot_lists_.find(IdsKey(q));
    if (it == slot_lists_.end() || it->second.generation != generation ||
        it->second.ids.size() != q.blocks.size())
      return nullptr;
    for (size_t j = 0; j < q.blocks.size(); ++j)
      if (it->second.ids[j] != q.blocks[j].id) return nullptr;
    return &it->second;
  }
  void RememberSlotList(const AttendSequence& q, const int32_t* slots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (q.blocks.empty()) return;
    if (slot_lists_.size() >= 256) slot_lists_.clear();  // bounded; rebuilt on demand
    SlotList& l = slot_lists_[IdsKey(q)];
    l.ids.resize(q.blocks.size());
    for (size_t j = 0; j < q.blocks.size(); ++j) l.ids[j] = q.blocks[j].id;
    l.slots.assign(slots, slots + q.blocks.size());
    l.generation = cache_->generation();
  }

  const CudaBackendOptions options_;
  mutable absl::Mutex mu_;
  CudaStream stream_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DeviceBlockCache> cache_ ABSL_GUARDED_BY(mu_);
  const int sms_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const ModelCodec*, std::unique_ptr<DeviceCodecTables>> tables_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, SlotList> slot_lists_ ABSL_GUARDED_BY(mu_);
  PinnedBuffer host_ ABSL_GUARDED_BY(mu_);
  DeviceBuffer dev_ ABSL_GUARDED_BY(mu_);  // staging + workspace, grows to the largest call
};

}  // namespace

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const CudaBackendOptions& options) {
  const int n = CudaDeviceCount();
  if (n <= 0)
    return absl::UnavailableError("no CUDA device or driver available (cudaGetDeviceCount found none)");
  if (options.device < 0 || options.device >= n)
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", options.device, " outside [0, ", n, ")"));
  TQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device), "cudaSetDevice");
  int sms = 0;
  TQ_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, options.device),
                          "cudaDeviceGetAttribute");
  TQ_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  size_t arena = options.arena_bytes;
  if (arena == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    TQ_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    if (!(options.arena_fraction > 0 && options.arena_fraction < 1))
      return absl::InvalidArgumentError("arena_fraction must be in (0, 1)");
    arena = static_cast<size_t>(static_cast<double>(free_bytes) * options.arena_fraction);
  }
  TQ_ASSIGN_OR_RETURN(auto cache, DeviceBlockCache::Create(arena));
  return std::unique_ptr<ComputeBackend>(new CudaBackend(options, std::move(stream), std::move(cache), sms));
}

}  // namespace tqkv::gpu
