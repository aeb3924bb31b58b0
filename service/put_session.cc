#include "service/put_session.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/convert.h"
#include "service/put_streams.h"

namespace tqkv::service {
namespace {

constexpr char kHeaderFirst[] = "the first PutBlocks message must be the header";

}  // namespace

PutSession::~PutSession() {
  if (ctx_.streams != nullptr) ctx_.streams->Close(this);
}

absl::Status PutSession::CheckAge(absl::Time now) {
  if (error_.ok() && now >= ctx_.deadline)
    return Fail(absl::DeadlineExceededError(
        "the put stream stayed open past --put_stream_timeout_s; nothing of it was committed"));
  return error_;
}

bool PutSession::TryExpire(absl::Time now) {
  if (!mu_.TryLock()) return false;
  const bool expired = error_.ok() && !CheckAge(now).ok();
  mu_.Unlock();
  return expired;
}

absl::Status PutSession::Fail(const absl::Status& s) {
  if (!s.ok() && error_.ok()) {
    error_ = s;
    handles_.clear();  // releases every reservation
    parts_.clear();
    parts_charge_.Reset();
  }
  return s;
}

absl::Status PutSession::OnMessage(const v1::PutBlocksRequest& msg) {
  absl::MutexLock l(&mu_);
  if (!CheckAge(ctx_.clock->Now()).ok()) return error_;
  absl::Status s;
  switch (msg.item_case()) {
    case v1::PutBlocksRequest::kHeader:
      s = model_ ? absl::InvalidArgumentError("header sent twice in one PutBlocks stream")
                 : OnHeader(msg.header());
      break;
    case v1::PutBlocksRequest::kBlock:
      s = model_ ? OnBlock(msg.block()) : absl::InvalidArgumentError(kHeaderFirst);
      break;
    default:
      s = absl::InvalidArgumentError("empty PutBlocks message (neither header nor block)");
  }
  return Fail(s);
}

absl::Status PutSession::OnHeader(const v1::PutHeader& h) {
  TQ_ASSIGN_OR_RETURN(auto model, ctx_.registry->Resolve(id_.tenant, h.model()));
  const int layers = model->shape().num_layers;
  const int64_t last = h.last_layer() == 0 ? layers : static_cast<int64_t>(h.last_layer());
  if (h.first_layer() >= last || last > layers)
    return absl::InvalidArgumentError(absl::StrCat("layer range [", h.first_layer(), ", ", last,
                                                   ") is not inside [0, ", layers, ")"));
  if (h.durable() && !ctx_.store->disk_enabled())
    return absl::FailedPreconditionError("durable puts need a disk tier (server has none)");
  first_ = static_cast<int>(h.first_layer());
  last_ = static_cast<int>(last);
  whole_ = first_ == 0 && last_ == layers;
  packed_ = h.packed();
  durable_ = h.durable();
  model_ = std::move(model);
  return absl::OkStatus();
}

absl::StatusOr<PutSession::Input> PutSession::CheckInput(const v1::PutBlock& b, TensorPayload* payload,
                                                         bool device) {
  const size_t bytes = model_->codec->layer_range_bytes(first_, last_);
  Input in;
  if (device) {
    if (packed_) return absl::InvalidArgumentError("a device put frame needs a dense stream (header.packed false)");
    if (b.has_k() || b.has_v() || !b.payload().empty())
      return absl::InvalidArgumentError(
          absl::StrCat("block ", Hex(b.block_hash()), " of a device put frame carries k, v or payload"));
    const int block_size = model_->shape().block_size;
    in.device = true;
    in.slot = b.device_slot();
    in.tokens = b.device_tokens() == 0 ? block_size : static_cast<int64_t>(b.device_tokens());
    if (in.tokens > block_size)
      return absl::InvalidArgumentError(absl::StrCat("block ", Hex(b.block_hash()), " has device_tokens ",
                                                     in.tokens, "; blocks hold ", block_size));
    return in;
  }
  if (b.device_slot() != 0 || b.device_tokens() != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("block ", Hex(b.block_hash()), " names a device slot in a frame without `device`"));
  if (packed_) {
    if (b.has_k() || b.has_v())
      return absl::InvalidArgumentError("packed put: block carries dense k/v tensors");
    if (payload != nullptr && b.payload().empty()) {
      in.packed = payload->Take(bytes);
      if (in.packed == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("packed block ", Hex(b.block_hash()), " takes ", bytes,
                                                       " bytes, more than the frame's payload has left"));
      return in;
    }
    if (b.payload().size() != bytes)
      return absl::InvalidArgumentError(absl::StrCat("packed payload of block ", Hex(b.block_hash()),
                                                     " has ", b.payload().size(), " bytes; layers [",
                                                     first_, ", ", last_, ") take ", bytes));
    in.packed = reinterpret_cast<const uint8_t*>(b.payload().data());
    return in;
  }
  if (!b.payload().empty())
    return absl::InvalidArgumentError("dense put: block carries a packed payload");
  TQ_ASSIGN_OR_RETURN(in.k, ViewTensor(b.k(), "block.k", payload));
  TQ_ASSIGN_OR_RETURN(in.v, ViewTensor(b.v(), "block.v", payload));
  const ModelShape& s = model_->shape();
  const std::vector<int64_t> want = {last_ - first_, -1, s.num_kv_heads, s.head_dim};
  TQ_RETURN_IF_ERROR(ExpectShape(in.k, want, "block.k"));
  TQ_RETURN_IF_ERROR(ExpectShape(in.v, want, "block.v"));
  const int64_t tokens = in.k.shape[1];
  if (tokens < 1 || tokens > s.block_size || in.v.shape[1] != tokens)
    return absl::InvalidArgumentError(absl::StrCat("block.k/v carry ", tokens, " and ", in.v.shape[1],
                                                   " tokens; expected equal counts in [1, ",
                                                   s.block_size, "]"));
  return in;
}

absl::Status PutSession::Fill(const Input& in, uint8_t* out, std::vector<ComputeBackend::EncodeItem>* batch) {
  const ModelCodec& codec = *model_->codec;
  if (packed_) {
    std::memcpy(out, in.packed, codec.layer_range_bytes(first_, last_));
    return absl::OkStatus();
  }
  const int64_t tokens = in.k.shape[1];
  ComputeBackend::EncodeItem item;
  item.out = out;
  for (int i = 0; i < last_ - first_; ++i) {
    item.k.push_back(SliceView(in.k, i, 0, tokens));
    item.v.push_back(SliceView(in.v, i, 0, tokens));
  }
  if (batch != nullptr) {
    batch->push_back(std::move(item));
    return absl::OkStatus();
  }
  return ctx_.backend->EncodeBlock(codec, first_, last_, item.k, item.v, out);
}

absl::StatusOr<uint8_t*> PutSession::Admit(const v1::PutBlock& b, TensorPayload* payload, bool device,
                                           Input* in) {
  absl::Status hs = storage::ValidateBlockHash(b.block_hash());
  if (!hs.ok()) return absl::InvalidArgumentError(absl::StrCat("block_hash: ", hs.message()));
  if (!b.parent_hash().empty()) {
    absl::Status ps = storage::ValidateBlockHash(b.parent_hash());
    if (!ps.ok()) return absl::InvalidArgumentError(absl::StrCat("parent_hash: ", ps.message()));
  }
  if (!hashes_.insert(b.block_hash()).second)
    return absl::InvalidArgumentError(
        absl::StrCat("duplicate block hash ", Hex(b.block_hash()), " in one PutBlocks stream"));
  if (hashes_.size() > ctx_.max_blocks_per_stream)
    return absl::InvalidArgumentError(absl::StrCat("a PutBlocks stream may carry at most ",
                                                   ctx_.max_blocks_per_stream, " blocks"));
  // Check the input before reserving so a bad block evicts nothing.
  TQ_ASSIGN_OR_RETURN(*in, CheckInput(b, payload, device));
  const ModelCodec& codec = *model_->codec;
  const uint64_t bytes = codec.layer_range_bytes(first_, last_);
  const storage::BlockAccounting acc = model_->RangeAccounting(first_, last_);
  storage::BlockKey key{id_.tenant, model_->model_id, b.block_hash()};
  // The reservation's bytes stay where they are when handles_ / parts_
  // grow (a heap buffer each).
  uint8_t* out = nullptr;
  if (whole_) {
    TQ_ASSIGN_OR_RETURN(storage::PutHandle h,
                        ctx_.store->BeginPut(key, b.parent_hash(), acc, bytes, {.durable = durable_}));
    out = h.buffer().data();
    handles_.push_back(std::move(h));
  } else {
    TQ_RETURN_IF_ERROR(ctx_.staging->ChargeParts(id_.tenant, bytes, &parts_charge_));
    parts_.push_back({std::move(key), b.parent_hash(), first_, last_, std::string(bytes, '\0')});
    out = reinterpret_cast<uint8_t*>(parts_.back().bytes.data());
  }
  response_.set_packed_bytes(response_.packed_bytes() + bytes);
  response_.set_dense_equivalent_bytes(response_.dense_equivalent_bytes() +
                                       acc.dense_equivalent_bytes);
  return out;
}

absl::Status PutSession::OnBlock(const v1::PutBlock& b) {
  Input in;
  TQ_ASSIGN_OR_RETURN(uint8_t* out, Admit(b, nullptr, false, &in));
  return Fill(in, out, nullptr);
}

absl::Status PutSession::OnBlocks(const google::protobuf::RepeatedPtrField<v1::PutBlock>& blocks,
                                  TensorPayload* payload, const DeviceKvRef* device) {
  absl::MutexLock l(&mu_);
  absl::Status s = CheckAge(ctx_.clock->Now());
  if (s.ok() && !model_) s = absl::InvalidArgumentError(kHeaderFirst);
  // Dense blocks are encoded in batches of about kBatchInputBytes; a
  // device frame's blocks in one (the backend sizes its own steps).
  constexpr size_t kBatchInputBytes = size_t{64} << 20;
  std::vector<ComputeBackend::EncodeItem> batch;
  std::vector<DeviceEncodeItem> device_batch;
  size_t batch_bytes = 0;
  auto flush = [&] {
    absl::Status e = batch.empty() ? absl::OkStatus()
                                   : ctx_.backend->EncodeBlocks(*model_->codec, first_, last_, batch);
    batch.clear();
    batch_bytes = 0;
    return e;
  };
  for (const v1::PutBlock& b : blocks) {
    if (!s.ok()) break;
    Input in;
    absl::StatusOr<uint8_t*> out = Admit(b, payload, device != nullptr, &in);
    if (out.ok() && in.device) {
      device_batch.push_back({in.slot, in.tokens, *out});
      continue;
    }
    s = out.ok() ? Fill(in, *out, &batch) : out.status();
    batch_bytes += in.k.bytes + in.v.bytes;
    if (s.ok() && batch_bytes >= kBatchInputBytes) s = flush();
  }
  if (s.ok() && payload != nullptr) s = payload->Finish();
  if (s.ok()) s = flush();
  if (s.ok() && !device_batch.empty())
    s = ctx_.backend->EncodeDeviceBlocks(*model_->codec, first_, last_, *device, device_batch);
  return Fail(s);
}

absl::StatusOr<v1::PutBlocksResponse> PutSession::Finish() {
  absl::MutexLock l(&mu_);
  if (!CheckAge(ctx_.clock->Now()).ok()) return error_;
  if (!model_) return absl::InvalidArgumentError("PutBlocks stream ended without a header");
  // Blocks land only while their model is registered (ModelRegistry::Unregister).
  absl::ReaderMutexLock gate(&model_->commit_mu);
  if (model_->unregistered)
    return absl::NotFoundError(absl::StrCat("model ", model_->model_id, " was unregistered"));
  // The stream's blocks become visible together, or none does.
  auto commit_all = [&](std::vector<storage::PutHandle> handles) -> absl::Status {
    std::vector<std::string> hashes;
    for (const storage::PutHandle& h : handles) hashes.push_back(h.key().block_hash);
    size_t conflict = 0;
    absl::StatusOr<std::vector<storage::CommitOutcome>> r = ctx_.store->CommitAll(std::move(handles), &conflict);
    if (r.status().code() == absl::StatusCode::kAlreadyExists)
      return absl::AlreadyExistsError(
          absl::StrCat("block ", Hex(hashes[conflict]), " is already stored with different bytes"));
    if (!r.ok()) return r.status();
    for (storage::CommitOutcome o : *r) {
      if (o == storage::CommitOutcome::kCommitted) response_.set_committed(response_.committed() + 1);
      else response_.set_already_present(response_.already_present() + 1);
    }
    return absl::OkStatus();
  };
  if (!parts_.empty()) {
    uint32_t staged = 0;
    absl::Status s = ctx_.staging->Apply(
        *model_, std::move(parts_), ctx_.clock->Now(),
        [&](std::vector<StagingArea::Completed>& done) -> absl::Status {
          const storage::BlockAccounting acc = model_->accounting;
          // Whole-model blocks of this stream, then the completed ones, in
          // one commit while the staging area still holds its old state.
          std::vector<storage::PutHandle> hs = std::move(handles_);
          for (StagingArea::Completed& c : done) {
            TQ_ASSIGN_OR_RETURN(storage::PutHandle h,
                                ctx_.store->BeginPut(*c.key, std::string(c.parent_hash), acc, c.bytes,
                                                     {.durable = durable_}));
            c.CopyTo(h.buffer().data());
            hs.push_back(std::move(h));
          }
          return commit_all(std::move(hs));
        },
        &staged);
    parts_.clear();
    parts_charge_.Reset();
    handles_.clear();
    TQ_RETURN_IF_ERROR(s);
    response_.set_staged(staged);
  } else {
    TQ_RETURN_IF_ERROR(commit_all(std::move(handles_)));
    handles_.clear();
  }
  return response_;
}

}  // namespace tqkv::service
