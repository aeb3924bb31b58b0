#include "service/sequence_manager.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "service/convert.h"

namespace tqkv::service {

// An id a caching backend may hold copies under; Forget()s it when the
// last holder lets go.
struct SequenceManager::BackendId {
  BackendId(uint64_t id, ComputeBackend* backend) : id(id), backend(backend) {}
  ~BackendId() { backend->Forget(id); }
  BackendId(const BackendId&) = delete;
  BackendId& operator=(const BackendId&) = delete;
  const uint64_t id;
  ComputeBackend* const backend;
};

// A block the sequence fills layer by layer (BlockRef::complete = false):
// layer l's bytes are final once owned_count[l] covers it.
// Its bytes are not zeroed: a layer is read only once encoded into.
struct SequenceManager::OwnedBlock {
  OwnedBlock(uint64_t id, size_t bytes, ComputeBackend* backend)
      : id(id, backend), bytes(std::make_unique_for_overwrite<uint8_t[]>(bytes)) {}
  BackendId id;
  const std::unique_ptr<uint8_t[]> bytes;  // block_bytes()
};

// One layer's dense tail: room for block_size fp32 rows [kv_heads,
// head_dim] of K and of V, allocated and touched once when the sequence is
// created (so that no decode step pays the first touch of its pages) and
// reused after every pack, `rows` of them valid, and the id
// the rows are known by (a new one whenever rows change other than by
// growing). Rows past `rows` are scratch: an append fills them, and an
// encode reads them, before they become valid.
struct SequenceManager::Tail {
  Tail(const ModelShape& s, std::unique_ptr<BackendId> id)
      : k(std::make_unique<float[]>(Elems(s))), v(std::make_unique<float[]>(Elems(s))), id(std::move(id)) {}
  // Floats of one room (K or V), and the bytes of both.
  static size_t Elems(const ModelShape& s) { return static_cast<size_t>(s.block_size) * s.num_kv_heads * s.head_dim; }
  static uint64_t Bytes(const ModelShape& s) { return 2 * Elems(s) * sizeof(float); }
  std::unique_ptr<float[]> k, v;
  int64_t rows = 0;
  std::unique_ptr<BackendId> id;
};

struct SequenceManager::Sequence {
  // Its place among the live sequences and the bytes it holds (tail rooms,
  // owned blocks): given back when the last holder lets go, after the
  // memory below is freed.
  TenantBudget::Reservation slot;
  TenantBudget::Reservation bytes;  // changed under mu
  std::string id, tenant;
  std::shared_ptr<const RegisteredModel> model;
  absl::Duration ttl;
  absl::Time last_used;  // guarded by SequenceManager::mu_

  absl::Mutex mu;
  // The stored blocks, set once by CreateSequence.
  std::vector<storage::BlockData> stored ABSL_GUARDED_BY(mu);
  // Backend refs of the stored blocks, then of the owned ones: layer l
  // attends the first stored.size() + owned_count[l].
  std::vector<BlockRef> refs ABSL_GUARDED_BY(mu);
  // Owned blocks after the stored ones; owned_count[l] of them hold layer l.
  std::vector<std::unique_ptr<OwnedBlock>> owned ABSL_GUARDED_BY(mu);
  std::vector<int64_t> owned_count ABSL_GUARDED_BY(mu);
  // Per layer, the dense tail.
  std::vector<Tail> tails ABSL_GUARDED_BY(mu);
  std::unique_ptr<BackendId> key;  // AttendSequence::sequence_key

  int64_t Tokens(int layer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return (static_cast<int64_t>(stored.size()) + owned_count[layer]) * model->shape().block_size +
           tails[layer].rows;
  }
};

namespace {

// Id of a stored block version: a hash of its key and checksum with the top
// bit set (owned blocks, tails and sequence keys count up from 1).
// Identical bytes under one key get the same id, which is exactly what a
// caching backend may assume.
uint64_t StoredBlockId(const std::string& tenant, uint64_t model_id, const std::string& hash,
                       uint64_t checksum) {
  std::string k = absl::StrCat(tenant.size(), ":", tenant, "|", model_id, "|", hash, "|", checksum);
  return XXH64(k.data(), k.size(), 0x5eb1) | (uint64_t{1} << 63);
}

// The new tokens k, v of one layer ([tokens, kv_heads, head_dim], 1 to
// 2^20 tokens, the same count), or INVALID_ARGUMENT naming `where`.
absl::Status CheckNewTokens(const ModelShape& s, const TensorView& k, const TensorView& v, const std::string& where) {
  const std::vector<int64_t> want = {-1, s.num_kv_heads, s.head_dim};
  TQ_RETURN_IF_ERROR(ExpectShape(k, want, (where + "k").c_str()));
  TQ_RETURN_IF_ERROR(ExpectShape(v, want, (where + "v").c_str()));
  if (k.shape[0] != v.shape[0] || k.shape[0] < 1 || k.shape[0] > (int64_t{1} << 20))
    return absl::InvalidArgumentError(absl::StrCat(where, "k and ", where,
                                                   "v must carry the same number of tokens in [1, 2^20], got ",
                                                   k.shape[0], " and ", v.shape[0]));
  return absl::OkStatus();
}

}  // namespace

// What a CommitAppend changed in one layer of a sequence, to put it back.
struct SequenceManager::LayerUndo {
  Sequence* seq = nullptr;
  int layer = 0;
  int64_t tail_rows = 0;   // the tail's rows before
  bool packed = false;     // rows were packed into blocks (then:)
  // The rows before, where new rows were written over them (else they are
  // still in place).
  std::vector<float> saved_k, saved_v;
  std::unique_ptr<BackendId> tail_id;  // the tail's id before
  int64_t owned_count = 0;  // layer's owned blocks before
  size_t owned_size = 0;    // owned blocks before (later ones were created)
};

SequenceManager::SequenceManager(const SequenceOptions& options, ComputeBackend* backend,
                                 storage::Clock* clock)
    : options_(options),
      backend_(backend),
      clock_(clock),
      count_({.total = options.max_sequences,
              .per_tenant = options.max_sequences_per_tenant,
              .what = "live sequences",
              .total_flag = "--max_sequences",
              .per_tenant_flag = "--max_sequences_per_tenant"}),
      bytes_({.total = options.max_bytes,
              .per_tenant = options.max_bytes_per_tenant,
              .what = "bytes of decode sequences",
              .total_flag = "--max_sequence_bytes",
              .per_tenant_flag = "--max_sequence_bytes_per_tenant"}) {}

SequenceManager::~SequenceManager() = default;

std::unique_ptr<SequenceManager::BackendId> SequenceManager::NewId() {
  return std::make_unique<BackendId>(next_owned_id_.fetch_add(1), backend_);
}

void SequenceManager::Restore(LayerUndo& u) {
  Sequence& seq = *u.seq;
  Tail& tail = seq.tails[u.layer];
  tail.rows = u.tail_rows;
  if (!u.packed) {
    // Rows past the old length may have been copied under the tail's id.
    tail.id = NewId();
    return;
  }
  if (!u.saved_k.empty()) {
    std::memcpy(tail.k.get(), u.saved_k.data(), u.saved_k.size() * sizeof(float));
    std::memcpy(tail.v.get(), u.saved_v.data(), u.saved_v.size() * sizeof(float));
  }
  tail.id = std::move(u.tail_id);  // its rows are the old ones again
  // Blocks that got this layer may hold a cached copy of it: forget them.
  for (size_t j = static_cast<size_t>(u.owned_count); j < u.owned_size; ++j) backend_->Forget(seq.owned[j]->id.id);
  seq.bytes.Release((seq.owned.size() - u.owned_size) * seq.model->codec->block_bytes());
  seq.owned.resize(u.owned_size);
  seq.refs.resize(seq.stored.size() + u.owned_size);
  seq.owned_count[u.layer] = u.owned_count;
}

// An append of one layer's rows, staged. Where the rows fill the tail, the
// rows that complete it are written into its room (past its valid rows),
// the full tail and any further whole blocks of the new rows (read in
// place, in their own dtype) are encoded into owned blocks, and the
// commit keeps the rest as the new tail.
struct SequenceManager::StagedAppend {
  Sequence* seq = nullptr;
  int layer = 0;
  DenseView k, v;  // the new rows
  bool packs = false;
  int64_t packed_rows = 0;  // new rows that went into blocks (then:)
  std::vector<std::unique_ptr<OwnedBlock>> created;
  int64_t count = 0;  // the layer's owned blocks after
  TenantBudget::Reservation charge;  // the bytes of `created`
  std::vector<ComputeBackend::EncodeItem> encodes;
  std::vector<uint64_t> encode_blocks;  // the owned block of each encode (BackendId)
  // True when the commit writes the new tail over the room the tail's
  // encode reads (rows left after the last packed block): the encodes must
  // run before it.
  bool encode_before_commit() const { return packs && k.tokens > packed_rows; }
};

namespace {

// Rows [from, from + n) of a [tokens, heads, dim] view.
DenseView Rows(const DenseView& t, int64_t from, int64_t n) {
  return {t.row(from, 0), t.dtype, n, t.heads, t.dim};
}

}  // namespace

absl::StatusOr<SequenceManager::StagedAppend> SequenceManager::StageAppend(Sequence& seq, int layer,
                                                                         const DenseView& k, const DenseView& v) {
  const ModelCodec& codec = *seq.model->codec;
  const ModelShape& s = codec.shape();
  const size_t row = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
  StagedAppend a{.seq = &seq, .layer = layer, .k = k, .v = v};
  Tail& tail = seq.tails[layer];
  const int64_t old = tail.rows, n = k.tokens, bs = s.block_size;
  if (old + n < bs) return a;  // the rows grow in place at the commit
  const int64_t fill = bs - old;
  // Blocks the rows fill: the completed tail's, then whole ones; those
  // past the sequence's owned blocks are new, charged before they exist.
  const int64_t blocks = 1 + (n - fill) / bs;
  const size_t owned_size = seq.owned.size();
  const int64_t created = std::max<int64_t>(0, seq.owned_count[layer] + blocks - static_cast<int64_t>(owned_size));
  TQ_RETURN_IF_ERROR(bytes_.Charge(seq.tenant, static_cast<uint64_t>(created) * codec.block_bytes(), &a.charge));
  a.packs = true;
  ToFloat(k.dtype, k.data, tail.k.get() + old * row, fill * row);
  ToFloat(v.dtype, v.data, tail.v.get() + old * row, fill * row);
  a.packed_rows = fill + (n - fill) / bs * bs;
  a.count = seq.owned_count[layer];
  for (int64_t from = -old; from < a.packed_rows; from += bs) {  // `from`: the block's first new row
    const size_t j = static_cast<size_t>(a.count);
    if (j >= owned_size + a.created.size())
      a.created.push_back(std::make_unique<OwnedBlock>(next_owned_id_.fetch_add(1), codec.block_bytes(), backend_));
    OwnedBlock& block = j < owned_size ? *seq.owned[j] : *a.created[j - owned_size];
    // Layer `layer` of this block is not final (owned_count does not cover
    // it), so nothing reads the bytes the encode writes before the commit.
    ComputeBackend::EncodeItem& e = a.encodes.emplace_back();
    if (from < 0) {  // the tail, completed
      e.k = {{tail.k.get(), DType::kF32, bs, s.num_kv_heads, s.head_dim}};
      e.v = {{tail.v.get(), DType::kF32, bs, s.num_kv_heads, s.head_dim}};
    } else {
      e.k = {Rows(k, from, bs)};
      e.v = {Rows(v, from, bs)};
    }
    e.out = block.bytes.get() + codec.layer_offset(layer);
    a.encode_blocks.push_back(block.id.id);
    ++a.count;
  }
  return a;
}

absl::Status SequenceManager::EncodeStaged(const ModelCodec& codec, int layer, std::span<StagedAppend> staged) {
  std::vector<ComputeBackend::EncodeItem> items;
  for (StagedAppend& a : staged)
    for (ComputeBackend::EncodeItem& e : a.encodes) items.push_back(std::move(e));
  if (items.empty()) return absl::OkStatus();
  return backend_->EncodeBlocks(codec, layer, layer + 1, items);
}

void SequenceManager::CommitAppend(StagedAppend& a, LayerUndo* undo) {
  Sequence& seq = *a.seq;
  const ModelShape& s = seq.model->shape();
  const size_t row = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
  Tail& tail = seq.tails[a.layer];
  const int64_t old = tail.rows;
  if (!a.packs) {
    // The common decode step: the rows grow in place (same tail id).
    const size_t n = static_cast<size_t>(a.k.tokens) * row;
    ToFloat(a.k.dtype, a.k.data, tail.k.get() + old * row, n);
    ToFloat(a.v.dtype, a.v.data, tail.v.get() + old * row, n);
    tail.rows += a.k.tokens;
    if (undo != nullptr) *undo = {.seq = &seq, .layer = a.layer, .tail_rows = old};
    return;
  }
  const int64_t rest = a.k.tokens - a.packed_rows;  // rows after the last packed block: the new tail
  if (undo != nullptr) {
    *undo = {.seq = &seq, .layer = a.layer, .tail_rows = old, .packed = true, .tail_id = std::move(tail.id),
             .owned_count = seq.owned_count[a.layer], .owned_size = seq.owned.size()};
    if (rest > 0) {  // the new tail overwrites the old rows
      undo->saved_k.assign(tail.k.get(), tail.k.get() + old * row);
      undo->saved_v.assign(tail.v.get(), tail.v.get() + old * row);
    }
  }
  ToFloat(a.k.dtype, Rows(a.k, a.packed_rows, rest).data, tail.k.get(), rest * row);
  ToFloat(a.v.dtype, Rows(a.v, a.packed_rows, rest).data, tail.v.get(), rest * row);
  tail.rows = rest;
  tail.id = NewId();
  seq.bytes.Absorb(std::move(a.charge));
  for (auto& b : a.created) {
    seq.refs.push_back({b->id.id, b->bytes.get(), /*complete=*/false});
    seq.owned.push_back(std::move(b));
  }
  seq.owned_count[a.layer] = a.count;
}

absl::Status SequenceManager::AppendLocked(Sequence& seq, int layer, const DenseView& k, const DenseView& v) {
  TQ_ASSIGN_OR_RETURN(StagedAppend a, StageAppend(seq, layer, k, v));
  TQ_RETURN_IF_ERROR(EncodeStaged(*seq.model->codec, layer, std::span<StagedAppend>(&a, 1)));
  CommitAppend(a, nullptr);
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
  // The sequence's place and its tails' rooms are charged before anything
  // is allocated (expired sequences first give theirs back).
  ExpireIdle();
  TQ_RETURN_IF_ERROR(count_.Charge(tenant, 1, &seq->slot));
  TQ_RETURN_IF_ERROR(bytes_.Charge(tenant, s.num_layers * Tail::Bytes(s), &seq->bytes));
  seq->tenant = tenant;
  seq->model = model;
  seq->ttl = req.ttl_ms() == 0 ? options_.default_ttl
                               : std::min(absl::Milliseconds(req.ttl_ms()), options_.max_ttl);
  seq->key = NewId();
  {
    absl::MutexLock l(&seq->mu);
    for (size_t i = 0; i < blocks.size(); ++i)
      seq->refs.push_back(
          {StoredBlockId(tenant, model->model_id, req.block_hashes(i), blocks[i].checksum),
           blocks[i].payload->data()});
    seq->stored = std::move(blocks);
    seq->owned_count.assign(s.num_layers, 0);
    seq->tails.reserve(s.num_layers);
    for (int l = 0; l < s.num_layers; ++l) seq->tails.emplace_back(s, NewId());
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
  absl::MutexLock l(&mu_);
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
    EraseLocked(it);
    return absl::NotFoundError(absl::StrCat("sequence '", id, "' expired"));
  }
  it->second->last_used = now;
  return it->second;
}

absl::StatusOr<v1::AppendResponse> SequenceManager::Append(const std::string& tenant, const v1::AppendRequest& req,
                                                           RawTensors* raw) {
  TQ_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, Use(tenant, req.sequence_id()));
  const ModelShape& s = seq->model->shape();
  if (req.layer() >= static_cast<uint32_t>(s.num_layers))
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", req.layer(), " outside [0, ", s.num_layers, ")"));
  TensorPayload* in = raw != nullptr ? &raw->in : nullptr;
  TQ_ASSIGN_OR_RETURN(TensorView k, ViewTensor(req.k(), "k", in));
  TQ_ASSIGN_OR_RETURN(TensorView v, ViewTensor(req.v(), "v", in));
  if (in != nullptr) TQ_RETURN_IF_ERROR(in->Finish());
  TQ_RETURN_IF_ERROR(CheckNewTokens(s, k, v, ""));
  const int layer = static_cast<int>(req.layer());
  absl::MutexLock l(&seq->mu);
  TQ_RETURN_IF_ERROR(
      AppendLocked(*seq, layer, SliceView(k, 0, 0, k.shape[0]), SliceView(v, 0, 0, v.shape[0])));
  v1::AppendResponse resp;
  resp.set_num_tokens(seq->Tokens(layer));
  return resp;
}

absl::StatusOr<v1::AttendResponse> SequenceManager::Attend(const std::string& tenant, const v1::AttendRequest& req,
                                                           RawTensors* raw) {
  const auto start = std::chrono::steady_clock::now();
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

  // Every item's tensors are checked before anything changes.
  struct Item {
    TensorView q;
    std::optional<TensorView> k, v;  // new tokens
  };
  std::vector<Item> items(req.items_size());
  TensorPayload* in = raw != nullptr ? &raw->in : nullptr;
  int64_t total_queries = 0;
  size_t out_bytes = 0;
  std::vector<Sequence*> appending;
  for (int i = 0; i < req.items_size(); ++i) {
    const v1::AttendItem& item = req.items(i);
    const std::string field = absl::StrCat("items[", i, "].q");
    TQ_ASSIGN_OR_RETURN(items[i].q, ViewTensor(item.q(), field.c_str(), in));
    TQ_RETURN_IF_ERROR(ExpectShape(items[i].q, {-1, s.num_q_heads, s.head_dim}, field.c_str()));
    const int64_t nq = items[i].q.shape[0];
    if (nq < 1 || total_queries + nq > options_.max_queries)
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": need at least one query and at most ", options_.max_queries, " per call"));
    total_queries += nq;
    out_bytes += items[i].q.bytes;
    if (item.positions_size() != 0 && item.positions_size() != nq)
      return absl::InvalidArgumentError(absl::StrCat("items[", i, "]: ", item.positions_size(),
                                                     " positions for ", nq, " queries"));
    if (item.has_k() != item.has_v())
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "]: k and v must both be set or both be absent"));
    if (!item.has_k()) continue;
    const std::string where = absl::StrCat("items[", i, "].");
    TQ_ASSIGN_OR_RETURN(items[i].k, ViewTensor(item.k(), (where + "k").c_str(), in));
    TQ_ASSIGN_OR_RETURN(items[i].v, ViewTensor(item.v(), (where + "v").c_str(), in));
    TQ_RETURN_IF_ERROR(CheckNewTokens(s, *items[i].k, *items[i].v, where));
    if (std::find(appending.begin(), appending.end(), seqs[i].get()) != appending.end())
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "]: sequence '", item.sequence_id(), "' already gets new tokens in this call"));
    appending.push_back(seqs[i].get());
  }
  if (in != nullptr) TQ_RETURN_IF_ERROR(in->Finish());

  // Every sequence of the call stays locked until it has attended (or
  // undone its appends): nothing else sees an append half-way, and the
  // backend reads the sequences' blocks and tails in place. They are locked
  // in address order.
  std::vector<Sequence*> locked;
  for (const auto& seq : seqs) locked.push_back(seq.get());
  std::sort(locked.begin(), locked.end());
  locked.erase(std::unique(locked.begin(), locked.end()), locked.end());
  for (Sequence* seq : locked) seq->mu.Lock();
  std::vector<LayerUndo> undo;
  undo.reserve(appending.size());
  auto finish = [&](absl::Status st) {
    if (!st.ok())
      for (auto it = undo.rbegin(); it != undo.rend(); ++it) Restore(*it);
    for (Sequence* seq : locked) seq->mu.Unlock();
    return st;
  };
  // Every append first, their full blocks packed in one backend batch:
  // each item then attends over its sequence as the call leaves it.
  std::vector<StagedAppend> staged;
  staged.reserve(appending.size());
  for (int i = 0; i < req.items_size(); ++i) {
    const Item& it = items[i];
    if (!it.k) continue;
    absl::StatusOr<StagedAppend> a =
        StageAppend(*seqs[i], layer, SliceView(*it.k, 0, 0, it.k->shape[0]), SliceView(*it.v, 0, 0, it.v->shape[0]));
    if (!a.ok()) return finish(a.status());
    staged.push_back(std::move(*a));
  }
  // The filled layers are encoded by the backend's Attend, in the same
  // pass as the attention (a GPU encodes them into its copies of the
  // blocks), unless a commit overwrites rows an encode reads: then first.
  bool encode_first = false;
  for (const StagedAppend& a : staged) encode_first = encode_first || a.encode_before_commit();
  if (encode_first)
    if (absl::Status st = EncodeStaged(*model.codec, layer, staged); !st.ok()) return finish(st);
  std::vector<PackItem> packs;
  for (StagedAppend& a : staged) {
    for (size_t e = 0; !encode_first && e < a.encodes.size(); ++e)
      packs.push_back({a.encodes[e].k[0], a.encodes[e].v[0], a.encodes[e].out, a.encode_blocks[e]});
    CommitAppend(a, &undo.emplace_back());
  }
  staged.clear();

  // Queries are read from the request and outputs written into the
  // response (or the raw outputs) in their wire dtype: the backend converts.
  v1::AttendResponse resp;
  uint8_t* raw_out = nullptr;
  if (raw != nullptr && out_bytes <= raw->out_into.size()) {
    raw->out_bytes = out_bytes;
    raw_out = raw->out_into.data();
  } else if (raw != nullptr) {
    raw->out.reset(new uint8_t[out_bytes]);  // every byte is written: no zero fill
    raw->out_bytes = out_bytes;
    raw_out = raw->out.get();
  }
  AttendBatch batch;
  batch.layer = layer;
  batch.shape = {s.num_q_heads, s.num_kv_heads, s.head_dim, req.scale()};
  batch.query_offsets.push_back(0);
  batch.sequences.reserve(req.items_size());
  for (int i = 0; i < req.items_size(); ++i) {
    const v1::AttendItem& item = req.items(i);
    const Item& it = items[i];
    Sequence& seq = *seqs[i];
    const int64_t nq = it.q.shape[0];
    AttendSequence& as = batch.sequences.emplace_back();
    const size_t nblocks = seq.stored.size() + static_cast<size_t>(seq.owned_count[layer]);
    as.blocks = absl::MakeConstSpan(seq.refs.data(), nblocks);
    as.packed_tokens = static_cast<int64_t>(nblocks) * s.block_size;
    const int64_t total = seq.Tokens(layer);
    const int64_t tail_tokens = total - as.packed_tokens;
    as.tail_k = {seq.tails[layer].k.get(), DType::kF32, tail_tokens, s.num_kv_heads, s.head_dim};
    as.tail_v = {seq.tails[layer].v.get(), DType::kF32, tail_tokens, s.num_kv_heads, s.head_dim};
    as.tail_id = seq.tails[layer].id->id;
    as.sequence_key = seq.key->id;
    if (total == 0)
      return finish(absl::FailedPreconditionError(absl::StrCat(
          "sequence '", item.sequence_id(), "' has no tokens at layer ", layer)));
    for (int64_t j = 0; j < nq; ++j) {
      const uint64_t p = item.positions_size() ? item.positions(j) : total - 1;
      if (p >= static_cast<uint64_t>(total))
        return finish(absl::InvalidArgumentError(absl::StrCat("items[", i, "].positions[", j, "] = ", p,
                                                              " outside the sequence's ", total, " tokens")));
      batch.positions.push_back(static_cast<int64_t>(p));
    }
    v1::Tensor* t = resp.add_outputs();
    t->set_dtype(ToProtoDType(it.q.dtype));
    t->add_shape(nq);
    t->add_shape(s.num_q_heads);
    t->add_shape(s.head_dim);
    as.q = it.q.data;
    if (raw_out != nullptr) {
      as.out = raw_out;
      raw_out += it.q.bytes;
    } else {
      t->mutable_data()->resize(it.q.bytes);
      as.out = t->mutable_data()->data();
    }
    as.dtype = it.q.dtype;
    batch.query_offsets.push_back(batch.query_offsets.back() + nq);
  }
  batch.packs = std::move(packs);
  double device_micros = 0;
  batch.device_micros = &device_micros;
  const auto t0 = std::chrono::steady_clock::now();
  TQ_RETURN_IF_ERROR(finish(backend_->Attend(*model.codec, batch)));
  const auto t1 = std::chrono::steady_clock::now();
  resp.set_kernel_micros(std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count());
  resp.set_device_micros(static_cast<uint64_t>(device_micros + 0.5));
  resp.set_service_micros(std::chrono::duration_cast<std::chrono::microseconds>(t1 - start).count());
  return resp;
}

absl::Status SequenceManager::Drop(const std::string& tenant, const std::string& sequence_id) {
  std::shared_ptr<Sequence> victim;  // destroyed outside mu_
  absl::MutexLock l(&mu_);
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end() || it->second->tenant != tenant)
    return absl::NotFoundError(absl::StrCat("sequence '", sequence_id, "' does not exist"));
  victim = EraseLocked(it);
  return absl::OkStatus();
}

std::shared_ptr<SequenceManager::Sequence> SequenceManager::EraseLocked(
    absl::flat_hash_map<std::string, std::shared_ptr<Sequence>>::iterator it) {
  std::shared_ptr<Sequence> seq = std::move(it->second);
  sequences_.erase(it);
  return seq;
}

size_t SequenceManager::EraseIf(const std::function<bool(const Sequence&)>& doomed) {
  std::vector<std::shared_ptr<Sequence>> victims;  // destroyed outside mu_
  absl::MutexLock l(&mu_);
  for (auto it = sequences_.begin(); it != sequences_.end();) {
    if (doomed(*it->second)) {
      victims.push_back(EraseLocked(it++));
    } else {
      ++it;
    }
  }
  return victims.size();
}

size_t SequenceManager::ExpireIdle() {
  const absl::Time now = clock_->Now();
  // EraseIf holds mu_, which guards last_used.
  return EraseIf([now](const Sequence& s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s.last_used + s.ttl < now; });
}

size_t SequenceManager::DropModel(const std::string& tenant, uint64_t model_id) {
  return EraseIf([&](const Sequence& s) { return s.tenant == tenant && s.model->model_id == model_id; });
}

size_t SequenceManager::CountOfModel(const std::string& tenant, uint64_t model_id) const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [id, s] : sequences_) n += s->tenant == tenant && s->model->model_id == model_id;
  return n;
}

size_t SequenceManager::size() const {
  absl::MutexLock l(&mu_);
  return sequences_.size();
}

}  // namespace tqkv::service
