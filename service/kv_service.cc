#include "service/kv_service.h"

#include <algorithm>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/convert.h"

namespace tqkv::service {
namespace {

absl::StatusOr<std::pair<int, int>> LayerRange(const RegisteredModel& m, uint32_t first,
                                               uint32_t last) {
  const int layers = m.shape().num_layers;
  const int64_t end = last == 0 ? layers : static_cast<int64_t>(last);
  if (first >= end || end > layers)
    return absl::InvalidArgumentError(absl::StrCat("layer range [", first, ", ", end,
                                                   ") is not inside [0, ", layers, ")"));
  return std::make_pair(static_cast<int>(first), static_cast<int>(end));
}

}  // namespace

KvService::KvService(const KvServiceOptions& options, storage::BlockStore* store,
                     ModelRegistry* registry, ComputeBackend* backend, storage::Clock* clock)
    : options_(options),
      store_(store),
      registry_(registry),
      backend_(backend),
      clock_(clock),
      staging_(options.staging),
      sequences_(options.sequences, backend, clock),
      put_streams_(options.put_streams, clock) {}

absl::StatusOr<v1::RegisterModelResponse> KvService::RegisterModel(
    const Identity& id, const v1::RegisterModelRequest& req) {
  TQ_ASSIGN_OR_RETURN(ModelRegistry::RegisterResult r, registry_->Register(id.tenant, req));
  v1::RegisterModelResponse resp;
  resp.set_model_id(r.model->model_id);
  resp.set_layout_fingerprint(r.model->fingerprint);
  resp.set_created(r.created);
  *resp.mutable_format() = r.model->format;
  return resp;
}

absl::StatusOr<std::unique_ptr<PutSession>> KvService::NewPutSession(const Identity& id) {
  PutContext ctx{store_, registry_, backend_, &staging_, clock_, options_.max_blocks_per_stream};
  return put_streams_.Open(ctx, id);
}

absl::StatusOr<v1::LookupResponse> KvService::Lookup(const Identity& id,
                                                     const v1::LookupRequest& req) {
  TQ_ASSIGN_OR_RETURN(auto model, registry_->Resolve(id.tenant, req.model()));
  TQ_RETURN_IF_ERROR(
      CheckHashList(req.block_hashes(), options_.max_hashes_per_request, "block_hashes"));
  std::vector<std::string> chain(req.block_hashes().begin(), req.block_hashes().end());
  TQ_ASSIGN_OR_RETURN(storage::LookupResult r,
                      store_->Lookup(id.tenant, model->model_id, chain));
  v1::LookupResponse resp;
  resp.set_hits(static_cast<uint32_t>(r.hits));
  for (storage::Tier t : r.tiers) resp.add_tiers(ToProtoTier(t));
  return resp;
}

absl::StatusOr<std::vector<storage::BlockData>> KvService::FetchAll(
    const std::string& tenant, const RegisteredModel& model,
    const google::protobuf::RepeatedPtrField<std::string>& hashes) {
  std::vector<storage::BlockData> out;
  out.reserve(hashes.size());
  for (const std::string& h : hashes) {
    absl::StatusOr<storage::BlockData> d = store_->Get({tenant, model.model_id, h});
    if (!d.ok()) {
      if (d.status().code() == absl::StatusCode::kNotFound)
        return absl::NotFoundError(absl::StrCat("block ", Hex(h), " is not stored"));
      return absl::Status(d.status().code(),
                          absl::StrCat("block ", Hex(h), ": ", d.status().message()));
    }
    if (d->payload->size() != model.codec->block_bytes())
      return absl::DataLossError(absl::StrCat("block ", Hex(h), " has ", d->payload->size(),
                                              " bytes; the model's blocks have ",
                                              model.codec->block_bytes()));
    out.push_back(std::move(*d));
  }
  return out;
}

absl::StatusOr<GetPlan> KvService::PrepareGet(const Identity& id,
                                              const v1::GetBlocksRequest& req) {
  GetPlan plan;
  TQ_ASSIGN_OR_RETURN(plan.model, registry_->Resolve(id.tenant, req.model()));
  TQ_RETURN_IF_ERROR(
      CheckHashList(req.block_hashes(), options_.max_hashes_per_request, "block_hashes"));
  TQ_ASSIGN_OR_RETURN(auto range, LayerRange(*plan.model, req.first_layer(), req.last_layer()));
  plan.first = range.first;
  plan.last = range.second;
  plan.dense = req.dense();
  if (plan.dense && req.dense_dtype() != v1::DTYPE_UNSPECIFIED) {
    TQ_ASSIGN_OR_RETURN(plan.dense_dtype, FromProtoDType(req.dense_dtype(), "dense_dtype"));
  }
  if (req.has_device_out()) {
    if (req.device_slots_size() != req.block_hashes_size())
      return absl::InvalidArgumentError(absl::StrCat("device_slots has ", req.device_slots_size(),
                                                     " entries for ", req.block_hashes_size(), " block_hashes"));
    plan.device = true;
    plan.dense = false;
    plan.device_slots.assign(req.device_slots().begin(), req.device_slots().end());
  } else if (req.device_slots_size() > 0) {
    return absl::InvalidArgumentError("device_slots without device_out");
  }
  plan.hashes.assign(req.block_hashes().begin(), req.block_hashes().end());
  TQ_ASSIGN_OR_RETURN(plan.blocks, FetchAll(id.tenant, *plan.model, req.block_hashes()));
  return plan;
}

KvService::Span KvService::PackedBytes(const GetPlan& plan, size_t i) {
  const ModelCodec& codec = *plan.model->codec;
  return {plan.blocks[i].payload->data() + codec.layer_offset(plan.first),
          codec.layer_range_bytes(plan.first, plan.last)};
}

absl::StatusOr<v1::GetBlocksResponse> KvService::RenderGet(const GetPlan& plan, size_t i) {
  const storage::BlockData& b = plan.blocks[i];
  const ModelCodec& codec = *plan.model->codec;
  const uint8_t* p = PackedBytes(plan, i).data;
  v1::GetBlocksResponse r;
  r.set_block_hash(plan.hashes[i]);
  r.set_tier(ToProtoTier(b.tier));
  if (!plan.dense) {
    r.set_payload(reinterpret_cast<const char*>(p), PackedBytes(plan, i).size);
    if (i == 0) *r.mutable_format() = plan.model->format;
    return r;
  }
  const ModelShape& s = codec.shape();
  for (v1::Tensor* t : {r.mutable_k(), r.mutable_v()}) {
    t->set_dtype(ToProtoDType(plan.dense_dtype));
    for (int64_t d : {int64_t{plan.last - plan.first}, int64_t{s.block_size}, int64_t{s.num_kv_heads},
                      int64_t{s.head_dim}})
      t->add_shape(d);
    t->mutable_data()->resize(DenseTensorBytes(plan));
  }
  TQ_RETURN_IF_ERROR(DecodeDense(plan, i, reinterpret_cast<uint8_t*>(r.mutable_k()->mutable_data()->data()),
                                 reinterpret_cast<uint8_t*>(r.mutable_v()->mutable_data()->data())));
  return r;
}

size_t KvService::DenseTensorBytes(const GetPlan& plan) {
  const ModelShape& s = plan.model->codec->shape();
  return static_cast<size_t>(plan.last - plan.first) * s.block_size * s.num_kv_heads * s.head_dim *
         DTypeSize(plan.dense_dtype);
}

namespace {

// Block i of a dense plan as a decode item writing K to k, V to v.
ComputeBackend::DecodeItem DenseItem(const GetPlan& plan, size_t i, uint8_t* k, uint8_t* v) {
  const ModelShape& s = plan.model->codec->shape();
  const size_t layer_bytes = KvService::DenseTensorBytes(plan) / (plan.last - plan.first);
  ComputeBackend::DecodeItem item;
  item.payload = KvService::PackedBytes(plan, i).data;
  for (int l = 0; l < plan.last - plan.first; ++l) {
    item.k.push_back({k + l * layer_bytes, plan.dense_dtype, s.block_size, s.num_kv_heads, s.head_dim});
    item.v.push_back({v + l * layer_bytes, plan.dense_dtype, s.block_size, s.num_kv_heads, s.head_dim});
  }
  return item;
}

}  // namespace

absl::Status KvService::DecodeDense(const GetPlan& plan, size_t i, uint8_t* k, uint8_t* v) {
  const ComputeBackend::DecodeItem item = DenseItem(plan, i, k, v);
  return backend_->DecodeBlock(*plan.model->codec, plan.first, plan.last, item.payload, item.k, item.v);
}

absl::Status KvService::DecodeDenseBlocks(const GetPlan& plan, uint8_t* out) {
  constexpr size_t kBatchOutputBytes = size_t{64} << 20;
  const size_t t = DenseTensorBytes(plan);
  const size_t per_batch = std::max<size_t>(1, kBatchOutputBytes / (2 * t));
  for (size_t b0 = 0; b0 < plan.blocks.size(); b0 += per_batch) {
    std::vector<ComputeBackend::DecodeItem> items;
    for (size_t i = b0; i < std::min(plan.blocks.size(), b0 + per_batch); ++i)
      items.push_back(DenseItem(plan, i, out + 2 * t * i, out + 2 * t * i + t));
    TQ_RETURN_IF_ERROR(backend_->DecodeBlocks(*plan.model->codec, plan.first, plan.last, items));
  }
  return absl::OkStatus();
}

absl::Status KvService::DecodeDeviceBlocks(const GetPlan& plan, const DeviceKvRef& out) {
  std::vector<DeviceDecodeItem> items;
  for (size_t i = 0; i < plan.blocks.size(); ++i) items.push_back({PackedBytes(plan, i).data, plan.device_slots[i]});
  return backend_->DecodeDeviceBlocks(*plan.model->codec, plan.first, plan.last, items, out);
}

absl::StatusOr<v1::PinResponse> KvService::Pin(const Identity& id, const v1::PinRequest& req) {
  TQ_ASSIGN_OR_RETURN(auto model, registry_->Resolve(id.tenant, req.model()));
  TQ_RETURN_IF_ERROR(
      CheckHashList(req.block_hashes(), options_.max_hashes_per_request, "block_hashes"));
  const absl::Duration ttl = req.ttl_ms() == 0
                                 ? options_.default_pin_ttl
                                 : std::min(absl::Milliseconds(req.ttl_ms()), options_.max_pin_ttl);
  std::vector<storage::BlockKey> keys;
  keys.reserve(req.block_hashes_size());
  for (const std::string& h : req.block_hashes()) keys.push_back({id.tenant, model->model_id, h});
  size_t missing = 0;
  absl::Status s = store_->PinAll(keys, ttl, &missing);
  if (s.code() == absl::StatusCode::kNotFound)
    return absl::NotFoundError(
        absl::StrCat("block ", Hex(req.block_hashes(static_cast<int>(missing))), " is not stored; nothing pinned"));
  TQ_RETURN_IF_ERROR(s);
  v1::PinResponse resp;
  resp.set_pinned(static_cast<uint32_t>(keys.size()));
  return resp;
}

namespace {

// Applies `op` to the key of every hash of a request and counts the blocks
// it succeeded on; a hash whose status is in `skip` is passed over
// uncounted, any other error ends the call.
absl::StatusOr<uint32_t> ForEachBlock(
    const std::string& tenant, uint64_t model_id,
    const google::protobuf::RepeatedPtrField<std::string>& hashes,
    const std::function<absl::Status(const storage::BlockKey&)>& op,
    std::initializer_list<absl::StatusCode> skip) {
  uint32_t done = 0;
  for (const std::string& h : hashes) {
    absl::Status s = op({tenant, model_id, h});
    if (s.ok()) {
      ++done;
    } else if (std::find(skip.begin(), skip.end(), s.code()) == skip.end()) {
      return s;
    }
  }
  return done;
}

}  // namespace

absl::StatusOr<v1::UnpinResponse> KvService::Unpin(const Identity& id,
                                                   const v1::UnpinRequest& req) {
  TQ_ASSIGN_OR_RETURN(auto model, registry_->Resolve(id.tenant, req.model()));
  TQ_RETURN_IF_ERROR(
      CheckHashList(req.block_hashes(), options_.max_hashes_per_request, "block_hashes"));
  TQ_ASSIGN_OR_RETURN(
      uint32_t n, ForEachBlock(id.tenant, model->model_id, req.block_hashes(),
                               [&](const storage::BlockKey& k) { return store_->Unpin(k); },
                               {absl::StatusCode::kNotFound, absl::StatusCode::kFailedPrecondition}));
  v1::UnpinResponse resp;
  resp.set_unpinned(n);
  return resp;
}

absl::StatusOr<v1::DeleteResponse> KvService::Delete(const Identity& id,
                                                     const v1::DeleteRequest& req) {
  TQ_ASSIGN_OR_RETURN(auto model, registry_->Resolve(id.tenant, req.model()));
  TQ_RETURN_IF_ERROR(
      CheckHashList(req.block_hashes(), options_.max_hashes_per_request, "block_hashes"));
  TQ_ASSIGN_OR_RETURN(
      uint32_t n, ForEachBlock(id.tenant, model->model_id, req.block_hashes(),
                               [&](const storage::BlockKey& k) { return store_->Delete(k); },
                               {absl::StatusCode::kNotFound}));
  v1::DeleteResponse resp;
  resp.set_deleted(n);
  return resp;
}

absl::StatusOr<v1::CreateSequenceResponse> KvService::CreateSequence(
    const Identity& id, const v1::CreateSequenceRequest& req) {
  TQ_ASSIGN_OR_RETURN(auto model, registry_->Resolve(id.tenant, req.model()));
  TQ_RETURN_IF_ERROR(
      CheckHashList(req.block_hashes(), options_.max_hashes_per_request, "block_hashes"));
  TQ_ASSIGN_OR_RETURN(std::vector<storage::BlockData> blocks,
                      FetchAll(id.tenant, *model, req.block_hashes()));
  return sequences_.Create(id.tenant, std::move(model), std::move(blocks), req);
}

absl::StatusOr<v1::AppendResponse> KvService::Append(const Identity& id, const v1::AppendRequest& req,
                                                     RawTensors* raw) {
  return sequences_.Append(id.tenant, req, raw);
}

absl::StatusOr<v1::AttendResponse> KvService::Attend(const Identity& id, const v1::AttendRequest& req,
                                                     RawTensors* raw) {
  return sequences_.Attend(id.tenant, req, raw);
}

absl::StatusOr<v1::DropSequenceResponse> KvService::DropSequence(
    const Identity& id, const v1::DropSequenceRequest& req) {
  TQ_RETURN_IF_ERROR(sequences_.Drop(id.tenant, req.sequence_id()));
  return v1::DropSequenceResponse();
}

absl::StatusOr<v1::StatsResponse> KvService::Stats(const Identity& id,
                                                   const v1::StatsRequest& req) {
  std::vector<std::shared_ptr<const RegisteredModel>> models;
  if (req.model_id() != 0) {
    TQ_ASSIGN_OR_RETURN(auto m, registry_->Find(id.tenant, req.model_id()));
    models.push_back(std::move(m));
  } else {
    models = registry_->List(&id.tenant);
  }
  const storage::StoreStats stats = store_->Stats();
  v1::StatsResponse resp;
  resp.set_tenant(id.tenant);
  resp.set_backend(backend_->name());
  resp.set_data_plane_address(data_plane_address_);
  for (const auto& m : models) {
    v1::ModelStats* ms = resp.add_models();
    ms->set_model_id(m->model_id);
    ms->set_model_name(m->name);
    uint64_t dense = 0, bytes = 0;
    for (const storage::TierUsage& u : stats.usage) {
      if (u.tenant != id.tenant || u.model_id != m->model_id) continue;
      v1::TierBytes* t = ms->add_tiers();
      t->set_tier(ToProtoTier(u.tier));
      t->set_blocks(u.blocks);
      t->set_bytes(u.payload_bytes);
      t->set_dense_equivalent_bytes(u.accounting.dense_equivalent_bytes);
      t->set_packed_k_bytes(u.accounting.packed_k_bytes);
      t->set_packed_v_bytes(u.accounting.packed_v_bytes);
      t->set_norms_metadata_bytes(u.accounting.norms_metadata_bytes);
      t->set_dense_window_bytes(u.accounting.dense_window_bytes);
      dense += u.accounting.dense_equivalent_bytes;
      bytes += u.payload_bytes;
    }
    ms->set_compression_ratio(bytes ? static_cast<double>(dense) / bytes : 0.0);
    for (const storage::ModelResidency& r : stats.residency) {
      if (r.tenant != id.tenant || r.model_id != m->model_id) continue;
      ms->set_blocks(r.blocks);
      ms->set_bytes(r.payload_bytes);
    }
  }
  return resp;
}

absl::StatusOr<v1::ListModelsResponse> KvService::ListModels(const Identity& id,
                                                             const v1::ListModelsRequest&) {
  v1::ListModelsResponse resp;
  for (const std::shared_ptr<const RegisteredModel>& m : registry_->List(&id.tenant)) {
    v1::ModelInfo* info = resp.add_models();
    info->set_model_id(m->model_id);
    info->set_model_name(m->name);
    info->set_layout_fingerprint(m->fingerprint);
    *info->mutable_registration() = m->request;
    *info->mutable_format() = m->format;
    const storage::ModelResidency r = store_->ResidencyOf(id.tenant, m->model_id);
    info->set_blocks(r.blocks);
    info->set_bytes(r.payload_bytes);
    info->set_sequences(static_cast<uint32_t>(sequences_.CountOfModel(id.tenant, m->model_id)));
  }
  return resp;
}

absl::StatusOr<v1::UnregisterModelResponse> KvService::UnregisterModel(
    const Identity& id, const v1::UnregisterModelRequest& req) {
  if (!id.admin) return absl::PermissionDeniedError("UnregisterModel needs an admin token");
  if (req.model_id() == 0) return absl::InvalidArgumentError("model_id is required");
  v1::UnregisterModelResponse resp;
  TQ_RETURN_IF_ERROR(registry_->Unregister(id.tenant, req.model_id(), [&](const RegisteredModel& m) -> absl::Status {
    // The refusal counts every stored block, so the disk index must be whole.
    TQ_RETURN_IF_ERROR(store_->AwaitIndexLoaded());
    const uint64_t blocks = store_->ResidencyOf(id.tenant, m.model_id).blocks;
    const size_t sequences = sequences_.CountOfModel(id.tenant, m.model_id);
    const size_t staged = staging_.CountOfModel(id.tenant, m.model_id);
    if (!req.force() && (blocks != 0 || sequences != 0 || staged != 0))
      return absl::FailedPreconditionError(absl::StrCat(
          "model '", m.name, "' (", m.model_id, ") has ", blocks, " stored blocks, ", sequences,
          " live sequences and ", staged,
          " staged blocks; delete them first or unregister with force"));
    resp.set_sequences(static_cast<uint32_t>(sequences_.DropModel(id.tenant, m.model_id)));
    resp.set_staged(static_cast<uint32_t>(staging_.DropModel(id.tenant, m.model_id)));
    TQ_ASSIGN_OR_RETURN(storage::EvictResult dropped, DropModelBlocks(store_, id.tenant, m.model_id));
    resp.set_blocks(dropped.blocks);
    resp.set_bytes(dropped.bytes);
    return absl::OkStatus();
  }));
  return resp;
}

absl::StatusOr<v1::EvictResponse> KvService::Evict(const Identity& id,
                                                   const v1::EvictRequest& req) {
  if (!id.admin) return absl::PermissionDeniedError("Evict needs an admin token");
  std::vector<std::shared_ptr<const RegisteredModel>> models;
  if (req.model_id() != 0) {
    TQ_ASSIGN_OR_RETURN(auto m, registry_->Find(id.tenant, req.model_id()));
    models.push_back(std::move(m));
  } else {
    models = registry_->List(&id.tenant);
  }
  v1::EvictResponse resp;
  uint64_t budget = req.max_bytes();
  for (const auto& m : models) {
    storage::EvictSpec spec;
    spec.scope = storage::ModelScope{id.tenant, m->model_id};
    spec.max_bytes = budget;
    spec.drop = req.drop();
    TQ_ASSIGN_OR_RETURN(storage::EvictResult r, store_->Evict(spec));
    resp.set_blocks(resp.blocks() + static_cast<uint32_t>(r.blocks));
    resp.set_bytes(resp.bytes() + r.bytes);
    if (req.max_bytes() != 0) {
      if (r.bytes >= budget) break;
      budget -= r.bytes;
    }
  }
  return resp;
}

void KvService::Maintain() {
  sequences_.ExpireIdle();
  staging_.Expire(clock_->Now());
  put_streams_.ExpireOld();
}

}  // namespace tqkv::service
