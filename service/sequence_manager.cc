#include "service/sequence_manager.h"

#include <xxhash.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codec/status_macros.h"
#include "service/convert.h"

namespace tqkv::service {

struct SequenceManager::OwnedBlock {
  OwnedBlock(uint64_t id, std::unique_ptr<uint8_t[]> bytes, ComputeBackend* backend)
      : id(id), bytes(std::move(bytes)), backend(backend) {}
  ~OwnedBlock() { backend->Forget(id); }
  const uint64_t id;
  const std::unique_ptr<uint8_t[]> bytes;  // block_bytes()
  ComputeBackend* const backend;
};

struct SequenceManager::Sequence {
  std::string id, tenant;
  std::shared_ptr<const RegisteredModel> model;
  absl::Duration ttl;
  absl::Time last_used;  // guarded by SequenceManager::mu_

  absl::Mutex mu;
  // The stored blocks and their backend refs (ids and payload pointers).
  // Set once by CreateSequence and immutable after: Attend shares the
  // snapshot (one reference count) instead of copying 2,048 BlockData.
  std::shared_ptr<const std::vector<storage::BlockData>> stored ABSL_GUARDED_BY(mu);
  std::vector<BlockRef> stored_refs ABSL_GUARDED_BY(mu);
  // Owned blocks after the stored ones; owned_count[l] of them hold layer l.
  std::vector<std::shared_ptr<const OwnedBlock>> owned ABSL_GUARDED_BY(mu);
  std::vector<int64_t> owned_count ABSL_GUARDED_BY(mu);
  // Per layer fp32 [tokens < block_size, kv_heads, head_dim].
  std::vector<std::vector<float>> tail_k ABSL_GUARDED_BY(mu), tail_v ABSL_GUARDED_BY(mu);

  int64_t Tokens(int layer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const ModelShape& s = model->shape();
    const int64_t row = int64_t{s.num_kv_heads} * s.head_dim;
    return (static_cast<int64_t>(stored_refs.size()) + owned_count[layer]) * s.block_size +
           static_cast<int64_t>(tail_k[layer].size()) / row;
  }
};

namespace {

// Id of a stored block version: a hash of its key and checksum with the top
// bit set (owned blocks count up from 1). Identical bytes under one key get
// the same id, which is exactly what a caching backend may assume.
uint64_t StoredBlockId(const std::string& tenant, uint64_t model_id, const std::string& hash,
                       uint64_t checksum) {
  std::string k = absl::StrCat(tenant.size(), ":", tenant, "|", model_id, "|", hash, "|", checksum);
  return XXH64(k.data(), k.size(), 0x5eb1) | (uint64_t{1} << 63);
}

}  // namespace

SequenceManager::SequenceManager(const SequenceOptions& options, ComputeBackend* backend,
                                 storage::Clock* clock)
    : options_(options), backend_(backend), clock_(clock) {}

SequenceManager::~SequenceManager() = default;

absl::Status SequenceManager::AppendLocked(Sequence& seq, int layer, const DenseView& k,
                                           const DenseView& v) {
  const ModelCodec& codec = *seq.model->codec;
  const ModelShape& s = codec.shape();
  const size_t row = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
  std::vector<float> tk = seq.tail_k[layer], tv = seq.tail_v[layer];
  const size_t old = tk.size();
  tk.resize(old + k.tokens * row);
  tv.resize(old + v.tokens * row);
  ToFloat(k.dtype, k.data, tk.data() + old, k.tokens * row);
  ToFloat(v.dtype, v.data, tv.data() + old, v.tokens * row);
  std::vector<std::shared_ptr<const OwnedBlock>> owned = seq.owned;
  int64_t count = seq.owned_count[layer];
  size_t consumed = 0;  // tokens packed
  while (tk.size() / row - consumed >= static_cast<size_t>(s.block_size)) {
    const size_t j = static_cast<size_t>(count);
    auto buf = std::make_unique<uint8_t[]>(codec.block_bytes());
    if (j < owned.size()) {
      std::memcpy(buf.get(), owned[j]->bytes.get(), codec.block_bytes());
    } else {
      std::memset(buf.get(), 0, codec.block_bytes());
    }
    DenseView kd{tk.data() + consumed * row, DType::kF32, s.block_size, s.num_kv_heads, s.head_dim};
    DenseView vd{tv.data() + consumed * row, DType::kF32, s.block_size, s.num_kv_heads, s.head_dim};
    TQ_RETURN_IF_ERROR(backend_->EncodeBlock(codec, layer, layer + 1, {kd}, {vd},
                                             buf.get() + codec.layer_offset(layer)));
    auto block = std::make_shared<const OwnedBlock>(next_owned_id_.fetch_add(1), std::move(buf),
                                                    backend_);
    if (j < owned.size()) {
      owned[j] = std::move(block);
    } else {
      owned.push_back(std::move(block));
    }
    ++count;
    consumed += s.block_size;
  }
  tk.erase(tk.begin(), tk.begin() + consumed * row);
  tv.erase(tv.begin(), tv.begin() + consumed * row);
  seq.owned = std::move(owned);
  seq.owned_count[layer] = count;
  seq.tail_k[layer] = std::move(tk);
  seq.tail_v[layer] = std::move(tv);
  return absl::OkStatus();
}

absl::StatusOr<v1::CreateSequenceResponse> SequenceManager::Create(
    const std::string& tenant, std::shared_ptr<const RegisteredModel> model,
    std::vector<storage::BlockData> blocks, const v1::CreateSequenceRequest& req) {
  const ModelShape& s = model->shape();
  if (static_cast<size_t>(req.block_hashes_size()) != blocks.size())
    return absl::InternalError("CreateSequence: block count mismatch");
  std::optional<TensorView> tk, tv;
  if (req.has_tail_k() != req.has_tail_v())
    return absl::InvalidArgumentError("tail_k and tail_v must both be set or both be absent");
  if (req.has_tail_k()) {
    TQ_ASSIGN_OR_RETURN(tk, ViewTensor(req.tail_k(), "tail_k"));
    TQ_ASSIGN_OR_RETURN(tv, ViewTensor(req.tail_v(), "tail_v"));
    const std::vector<int64_t> want = {s.num_layers, -1, s.num_kv_heads, s.head_dim};
    TQ_RETURN_IF_ERROR(ExpectShape(*tk, want, "tail_k"));
    TQ_RETURN_IF_ERROR(ExpectShape(*tv, want, "tail_v"));
    if (tk->shape[1] != tv->shape[1])
      return absl::InvalidArgumentError("tail_k and tail_v have different token counts");
  }
  const int64_t partial_tokens = req.last_block_tokens();
  if (partial_tokens < 0 || partial_tokens >= s.block_size)
    return absl::InvalidArgumentError(absl::StrCat("last_block_tokens ", partial_tokens,
                                                   " outside [0, block_size ", s.block_size, ")"));
  if (partial_tokens > 0 && blocks.empty())
    return absl::InvalidArgumentError("last_block_tokens is set but no block_hashes are given");
  // Keeps the partial block's bytes alive while it is decoded below.
  std::optional<storage::BlockData> partial_block;
  const storage::BlockData* partial = nullptr;
  if (partial_tokens > 0) {
    partial_block = std::move(blocks.back());
    blocks.pop_back();
    partial = &*partial_block;
  }
  auto seq = std::make_shared<Sequence>();
  seq->tenant = tenant;
  seq->model = model;
  seq->ttl = req.ttl_ms() == 0 ? options_.default_ttl
                               : std::min(absl::Milliseconds(req.ttl_ms()), options_.max_ttl);
  {
    absl::MutexLock l(&seq->mu);
    for (size_t i = 0; i < blocks.size(); ++i)
      seq->stored_refs.push_back(
          {StoredBlockId(tenant, model->model_id, req.block_hashes(i), blocks[i].checksum),
           blocks[i].payload->data()});
    seq->stored = std::make_shared<const std::vector<storage::BlockData>>(std::move(blocks));
    seq->owned_count.assign(s.num_layers, 0);
    seq->tail_k.resize(s.num_layers);
    seq->tail_v.resize(s.num_layers);
    if (partial != nullptr) {
      // The partially filled last block: its valid tokens become the start
      // of the dense tail (every packed block stays full).
      const size_t layer_elems = static_cast<size_t>(s.block_size) * s.num_kv_heads * s.head_dim;
      std::vector<float> dk(layer_elems * s.num_layers), dv(dk.size());
      std::vector<MutableDenseView> kv, vv;
      for (int l = 0; l < s.num_layers; ++l) {
        kv.push_back({dk.data() + l * layer_elems, DType::kF32, s.block_size, s.num_kv_heads, s.head_dim});
        vv.push_back({dv.data() + l * layer_elems, DType::kF32, s.block_size, s.num_kv_heads, s.head_dim});
      }
      TQ_RETURN_IF_ERROR(
          backend_->DecodeBlock(*model->codec, 0, s.num_layers, partial->payload->data(), kv, vv));
      for (int l = 0; l < s.num_layers; ++l)
        TQ_RETURN_IF_ERROR(AppendLocked(
            *seq, l, {dk.data() + l * layer_elems, DType::kF32, partial_tokens, s.num_kv_heads, s.head_dim},
            {dv.data() + l * layer_elems, DType::kF32, partial_tokens, s.num_kv_heads, s.head_dim}));
    }
    if (tk && tk->shape[1] > 0) {
      for (int l = 0; l < s.num_layers; ++l)
        TQ_RETURN_IF_ERROR(AppendLocked(*seq, l, SliceView(*tk, l, 0, tk->shape[1]),
                                        SliceView(*tv, l, 0, tv->shape[1])));
    }
  }
  absl::BitGen gen;
  seq->id = absl::StrFormat("seq-%016x%016x", absl::Uniform<uint64_t>(gen),
                            absl::Uniform<uint64_t>(gen));
  v1::CreateSequenceResponse resp;
  {
    absl::MutexLock l(&seq->mu);
    resp.set_num_tokens(seq->Tokens(0));
  }
  resp.set_sequence_id(seq->id);
  ExpireIdle();
  absl::MutexLock l(&mu_);
  if (sequences_.size() >= options_.max_sequences)
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many live sequences (", options_.max_sequences, "); drop finished ones"));
  seq->last_used = clock_->Now();
  sequences_.emplace(seq->id, std::move(seq));
  return resp;
}

absl::StatusOr<std::shared_ptr<SequenceManager::Sequence>> SequenceManager::Use(
    const std::string& tenant, const std::string& id) {
  const absl::Time now = clock_->Now();
  absl::MutexLock l(&mu_);
  auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second->tenant != tenant)
    return absl::NotFoundError(absl::StrCat("sequence '", id, "' does not exist"));
  if (it->second->last_used + it->second->ttl < now) {
    sequences_.erase(it);
    return absl::NotFoundError(absl::StrCat("sequence '", id, "' expired"));
  }
  it->second->last_used = now;
  return it->second;
}

absl::StatusOr<v1::AppendResponse> SequenceManager::Append(const std::string& tenant,
                                                           const v1::AppendRequest& req) {
  TQ_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, Use(tenant, req.sequence_id()));
  const ModelShape& s = seq->model->shape();
  if (req.layer() >= static_cast<uint32_t>(s.num_layers))
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", req.layer(), " outside [0, ", s.num_layers, ")"));
  TQ_ASSIGN_OR_RETURN(TensorView k, ViewTensor(req.k(), "k"));
  TQ_ASSIGN_OR_RETURN(TensorView v, ViewTensor(req.v(), "v"));
  const std::vector<int64_t> want = {-1, s.num_kv_heads, s.head_dim};
  TQ_RETURN_IF_ERROR(ExpectShape(k, want, "k"));
  TQ_RETURN_IF_ERROR(ExpectShape(v, want, "v"));
  if (k.shape[0] != v.shape[0] || k.shape[0] < 1 || k.shape[0] > (int64_t{1} << 20))
    return absl::InvalidArgumentError(absl::StrCat(
        "k and v must carry the same number of tokens in [1, 2^20], got ", k.shape[0], " and ",
        v.shape[0]));
  const int layer = static_cast<int>(req.layer());
  absl::MutexLock l(&seq->mu);
  TQ_RETURN_IF_ERROR(
      AppendLocked(*seq, layer, SliceView(k, 0, 0, k.shape[0]), SliceView(v, 0, 0, v.shape[0])));
  v1::AppendResponse resp;
  resp.set_num_tokens(seq->Tokens(layer));
  return resp;
}

absl::StatusOr<v1::AttendResponse> SequenceManager::Attend(const std::string& tenant,
                                                           const v1::AttendRequest& req) {
  if (req.items_size() == 0) return absl::InvalidArgumentError("items is empty");
  std::vector<std::shared_ptr<Sequence>> seqs;
  for (const v1::AttendItem& item : req.items()) {
    TQ_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, Use(tenant, item.sequence_id()));
    if (!seqs.empty() && seq->model != seqs[0]->model)
      return absl::InvalidArgumentError(
          "every item of one Attend call must belong to sequences of the same model");
    seqs.push_back(std::move(seq));
  }
  const RegisteredModel& model = *seqs[0]->model;
  const ModelShape& s = model.shape();
  if (req.layer() >= static_cast<uint32_t>(s.num_layers))
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", req.layer(), " outside [0, ", s.num_layers, ")"));
  if (!(req.scale() >= 0) || std::isinf(req.scale()))
    return absl::InvalidArgumentError("scale must be finite and >= 0");
  const int layer = static_cast<int>(req.layer());
  const size_t qrow = static_cast<size_t>(s.num_q_heads) * s.head_dim;

  AttendBatch batch;
  batch.layer = layer;
  batch.shape = {s.num_q_heads, s.num_kv_heads, s.head_dim, req.scale()};
  batch.query_offsets.push_back(0);
  std::vector<float> q;
  std::vector<DType> qtypes;
  // Keep-alives for the snapshot: owned block versions and tail copies.
  std::vector<std::shared_ptr<const OwnedBlock>> holders;
  std::vector<std::shared_ptr<const std::vector<storage::BlockData>>> stored_holders;
  std::vector<std::unique_ptr<std::vector<float>>> tails;
  for (int i = 0; i < req.items_size(); ++i) {
    const v1::AttendItem& item = req.items(i);
    const std::string field = absl::StrCat("items[", i, "].q");
    TQ_ASSIGN_OR_RETURN(TensorView qt, ViewTensor(item.q(), field.c_str()));
    TQ_RETURN_IF_ERROR(ExpectShape(qt, {-1, s.num_q_heads, s.head_dim}, field.c_str()));
    const int64_t nq = qt.shape[0];
    if (nq < 1 || batch.query_offsets.back() + nq > options_.max_queries)
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": need at least one query and at most ", options_.max_queries, " per call"));
    Sequence& seq = *seqs[i];
    AttendSequence as;
    int64_t total = 0;
    {
      absl::MutexLock l(&seq.mu);
      as.blocks = seq.stored_refs;
      stored_holders.push_back(seq.stored);
      for (int64_t b = 0; b < seq.owned_count[layer]; ++b) {
        as.blocks.push_back({seq.owned[b]->id, seq.owned[b]->bytes.get()});
        holders.push_back(seq.owned[b]);
      }
      as.packed_tokens = static_cast<int64_t>(as.blocks.size()) * s.block_size;
      tails.push_back(std::make_unique<std::vector<float>>(seq.tail_k[layer]));
      tails.push_back(std::make_unique<std::vector<float>>(seq.tail_v[layer]));
      total = seq.Tokens(layer);
    }
    const int64_t tail_tokens = total - as.packed_tokens;
    as.tail_k = {tails[tails.size() - 2]->data(), DType::kF32, tail_tokens, s.num_kv_heads, s.head_dim};
    as.tail_v = {tails.back()->data(), DType::kF32, tail_tokens, s.num_kv_heads, s.head_dim};
    if (total == 0)
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence '", item.sequence_id(), "' has no tokens at layer ", layer));
    if (item.positions_size() != 0 && item.positions_size() != nq)
      return absl::InvalidArgumentError(absl::StrCat("items[", i, "]: ", item.positions_size(),
                                                     " positions for ", nq, " queries"));
    for (int64_t j = 0; j < nq; ++j) {
      const uint64_t p = item.positions_size() ? item.positions(j) : total - 1;
      if (p >= static_cast<uint64_t>(total))
        return absl::InvalidArgumentError(absl::StrCat("items[", i, "].positions[", j, "] = ", p,
                                                       " outside the sequence's ", total,
                                                       " tokens"));
      batch.positions.push_back(static_cast<int64_t>(p));
    }
    const size_t q0 = q.size();
    q.resize(q0 + nq * qrow);
    ToFloat(qt.dtype, qt.data, q.data() + q0, nq * qrow);
    qtypes.push_back(qt.dtype);
    batch.sequences.push_back(std::move(as));
    batch.query_offsets.push_back(batch.query_offsets.back() + nq);
  }
  std::vector<float> out(q.size());
  batch.q = q.data();
  batch.out = out.data();
  const auto t0 = std::chrono::steady_clock::now();
  TQ_RETURN_IF_ERROR(backend_->Attend(*model.codec, batch));
  const auto t1 = std::chrono::steady_clock::now();
  v1::AttendResponse resp;
  resp.set_kernel_micros(std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count());
  for (int i = 0; i < req.items_size(); ++i) {
    const int64_t q0 = batch.query_offsets[i], nq = batch.query_offsets[i + 1] - q0;
    v1::Tensor* t = resp.add_outputs();
    t->set_dtype(ToProtoDType(qtypes[i]));
    t->add_shape(nq);
    t->add_shape(s.num_q_heads);
    t->add_shape(s.head_dim);
    std::string* data = t->mutable_data();
    data->resize(nq * qrow * DTypeSize(qtypes[i]));
    FromFloat(qtypes[i], out.data() + q0 * qrow, data->data(), nq * qrow);
  }
  return resp;
}

absl::Status SequenceManager::Drop(const std::string& tenant, const std::string& sequence_id) {
  std::shared_ptr<Sequence> victim;  // destroyed outside mu_
  absl::MutexLock l(&mu_);
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end() || it->second->tenant != tenant)
    return absl::NotFoundError(absl::StrCat("sequence '", sequence_id, "' does not exist"));
  victim = std::move(it->second);
  sequences_.erase(it);
  return absl::OkStatus();
}

size_t SequenceManager::ExpireIdle() {
  const absl::Time now = clock_->Now();
  std::vector<std::shared_ptr<Sequence>> victims;  // destroyed outside mu_
  absl::MutexLock l(&mu_);
  for (auto it = sequences_.begin(); it != sequences_.end();) {
    if (it->second->last_used + it->second->ttl < now) {
      victims.push_back(std::move(it->second));
      sequences_.erase(it++);
    } else {
      ++it;
    }
  }
  return victims.size();
}

size_t SequenceManager::size() const {
  absl::MutexLock l(&mu_);
  return sequences_.size();
}

uint64_t SequenceManager::OwnedBytes() const {
  std::vector<std::shared_ptr<Sequence>> live;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, seq] : sequences_) live.push_back(seq);
  }
  uint64_t bytes = 0;
  for (const auto& seq : live) {
    absl::MutexLock l(&seq->mu);
    bytes += seq->owned.size() * seq->model->codec->block_bytes();
    for (const auto& t : seq->tail_k) bytes += t.size() * sizeof(float);
    for (const auto& t : seq->tail_v) bytes += t.size() * sizeof(float);
  }
  return bytes;
}

}  // namespace tqkv::service
