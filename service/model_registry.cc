#include "service/model_registry.h"

#include <xxhash.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/strings/str_cat.h"
#include "codec/rotation.h"
#include "base/status_macros.h"
#include "service/convert.h"

namespace tqkv::service {
namespace {

// Bump when the codec's byte layout changes in a way the other fingerprint
// inputs do not capture: every registration then gets a new fingerprint.
constexpr char kCodecVersion[] = "tqkv-codec-1";
constexpr char kRecordMagic[] = "tqkv-model-v1\n";

std::string CanonicalDescription(const v1::RegisterModelRequest& req, const ModelCodec& codec,
                                 const std::optional<RecipeMetadata>& metadata) {
  const ModelShape& s = codec.shape();
  const CodecOptions& o = codec.options();
  std::string d = absl::StrCat(kCodecVersion, "|layers=", s.num_layers, "|kv=", s.num_kv_heads,
                               "|q=", s.num_q_heads, "|d=", s.head_dim, "|bs=", s.block_size,
                               "|dtype=", static_cast<int>(req.layout().dtype()));
  for (int l = 0; l < s.num_layers; ++l)
    absl::StrAppend(&d, "|L", l, "=", codec.layer(l).format().name, ":",
                    codec.layer(l).k_row_bytes(), ":", codec.layer(l).v_row_bytes());
  absl::StrAppend(&d, "|rotation=",
                  RotationKindName(o.rotation.value_or(DefaultRotationKind(s.head_dim))),
                  "|seed=", o.seed, "|hash_scheme=", req.block_hash_scheme().size(), ":",
                  req.block_hash_scheme());
  const std::string meta = metadata ? SerializeMetadataJson(*metadata) : std::string();
  absl::StrAppend(&d, "|metadata=", meta.size(), ":", meta);
  return d;
}

std::string Fingerprint(const std::string& description) {
  XXH128_hash_t h = XXH3_128bits(description.data(), description.size());
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

std::string EncodeRecord(const RegisteredModel& m) {
  return absl::StrCat(kRecordMagic, m.fingerprint, "\n", m.request.SerializeAsString());
}

}  // namespace

storage::BlockAccounting RegisteredModel::RangeAccounting(int first, int last) const {
  if (first == 0 && last == shape().num_layers) return accounting;
  // Split the whole-block accounting proportionally to the layer bytes;
  // exact for uniform formats, and total_bytes is always exact.
  storage::BlockAccounting a;
  const uint64_t bytes = codec->layer_range_bytes(first, last);
  const double f = static_cast<double>(bytes) / static_cast<double>(accounting.total_bytes);
  a.dense_equivalent_bytes = static_cast<uint64_t>(accounting.dense_equivalent_bytes * f + 0.5);
  a.packed_k_bytes = static_cast<uint64_t>(accounting.packed_k_bytes * f + 0.5);
  a.packed_v_bytes = static_cast<uint64_t>(accounting.packed_v_bytes * f + 0.5);
  a.norms_metadata_bytes = static_cast<uint64_t>(accounting.norms_metadata_bytes * f + 0.5);
  a.dense_window_bytes = static_cast<uint64_t>(accounting.dense_window_bytes * f + 0.5);
  a.total_bytes = bytes;
  return a;
}

uint64_t ModelIdFor(const std::string& tenant, const std::string& model_name) {
  std::string key = absl::StrCat(tenant.size(), ":", tenant, "|", model_name);
  uint64_t id = XXH64(key.data(), key.size(), /*seed=*/0x74716b76) & 0x7fffffffffffffffULL;
  return id == 0 ? 1 : id;
}

absl::StatusOr<std::unique_ptr<RegisteredModel>> BuildModel(const std::string& tenant,
                                                            const v1::RegisterModelRequest& req,
                                                            uint64_t max_codec_build_work) {
  if (req.model_name().empty() || req.model_name().size() > 256)
    return absl::InvalidArgumentError("model_name must be 1..256 bytes");
  TQ_RETURN_IF_ERROR(storage::ValidateTenant(tenant));
  if (!req.has_layout()) return absl::InvalidArgumentError("layout is required");
  TQ_ASSIGN_OR_RETURN(ModelShape shape, ShapeFromLayout(req.layout()));
  std::optional<RecipeMetadata> metadata;
  TQ_ASSIGN_OR_RETURN(CodecOptions options, OptionsFromCodecConfig(req.codec(), &metadata));
  options.max_build_work = max_codec_build_work;
  absl::StatusOr<std::unique_ptr<ModelCodec>> codec =
      ModelCodec::Create(shape, options, metadata ? &*metadata : nullptr);
  if (!codec.ok()) {  // every codec refusal here is a property of the request
    if (absl::IsResourceExhausted(codec.status()))  // over the codec memory limit
      return absl::ResourceExhaustedError(absl::StrCat("codec: ", codec.status().message()));
    return absl::InvalidArgumentError(absl::StrCat("codec: ", codec.status().message()));
  }

  auto m = std::make_unique<RegisteredModel>();
  m->tenant = tenant;
  m->name = req.model_name();
  m->model_id = ModelIdFor(tenant, req.model_name());
  m->request = req;
  m->fingerprint = Fingerprint(CanonicalDescription(req, **codec, metadata));
  m->format = DescribeFormat(**codec);
  const BlockBytes& b = (*codec)->block_accounting();
  m->accounting = {.dense_equivalent_bytes = b.dense_equivalent,
                   .packed_k_bytes = b.packed_k,
                   .packed_v_bytes = b.packed_v,
                   .norms_metadata_bytes = b.norms,
                   .dense_window_bytes = b.dense_rows,
                   .total_bytes = b.total};
  m->codec = std::move(*codec);
  return m;
}

absl::StatusOr<std::vector<std::string>> ModelRegistry::Load() {
  TQ_ASSIGN_OR_RETURN(std::vector<storage::ModelRecord> records, store_->ListModelRecords());
  std::vector<std::string> warnings;
  absl::MutexLock l(&mu_);
  for (const storage::ModelRecord& r : records) {
    const std::string where = absl::StrCat("model record ", r.tenant, "/", r.model_id, ": ");
    const size_t magic = sizeof(kRecordMagic) - 1;
    const size_t nl = r.record.find('\n', magic);
    v1::RegisterModelRequest req;
    if (!absl::StartsWith(r.record, kRecordMagic) || nl == std::string::npos ||
        !req.ParseFromString(r.record.substr(nl + 1))) {
      warnings.push_back(where + "unreadable; skipped");
      continue;
    }
    const std::string stored_fp = r.record.substr(magic, nl - magic);
    absl::StatusOr<std::unique_ptr<RegisteredModel>> m = BuildModel(r.tenant, req, /*max_codec_build_work=*/0);
    if (!m.ok()) {
      warnings.push_back(absl::StrCat(where, "no longer valid (", m.status().message(), "); skipped"));
      continue;
    }
    if ((*m)->fingerprint != stored_fp || (*m)->model_id != r.model_id) {
      warnings.push_back(absl::StrCat(where, "fingerprint changed from ", stored_fp, " to ",
                                      (*m)->fingerprint, " (codec upgrade?); skipped"));
      continue;
    }
    models_[{r.tenant, r.model_id}] = std::move(*m);
  }
  return warnings;
}

absl::StatusOr<ModelRegistry::RegisterResult> ModelRegistry::Register(
    const std::string& tenant, const v1::RegisterModelRequest& req) {
  {
    // The same request again (a worker re-registering at start-up): no
    // codec to build.
    absl::MutexLock l(&mu_);
    auto it = models_.find({tenant, ModelIdFor(tenant, req.model_name())});
    if (it != models_.end() && it->second->request.SerializeAsString() == req.SerializeAsString())
      return RegisterResult{it->second, false};
  }
  TQ_ASSIGN_OR_RETURN(std::unique_ptr<RegisteredModel> built, BuildModel(tenant, req, options_.max_codec_build_work));
  absl::MutexLock reg(&register_mu_);
  {
    absl::MutexLock l(&mu_);
    ++codec_builds_;
    auto it = models_.find({tenant, built->model_id});
    if (it != models_.end()) {
      const RegisteredModel& have = *it->second;
      if (have.name != built->name)
        return absl::InternalError(absl::StrCat("model id ", built->model_id, " of '", built->name,
                                                "' collides with model '", have.name, "'"));
      if (have.fingerprint != built->fingerprint)
        return absl::AlreadyExistsError(absl::StrCat(
            "model '", built->name, "' is registered with layout fingerprint ", have.fingerprint,
            "; this request resolves to ", built->fingerprint,
            " (choose a new model_name for a new layout)"));
      return RegisterResult{it->second, false};
    }
    int have = 0;
    for (auto m = models_.lower_bound({tenant, 0}); m != models_.end() && m->first.first == tenant; ++m) ++have;
    if (have >= options_.max_models_per_tenant)
      return absl::ResourceExhaustedError(absl::StrCat("tenant '", tenant, "' has ", have,
                                                       " models, the most one tenant may register"));
  }
  TQ_RETURN_IF_ERROR(DropLeftovers(tenant, built->model_id));
  TQ_RETURN_IF_ERROR(store_->PutModelRecord(tenant, built->model_id, EncodeRecord(*built)));
  std::shared_ptr<const RegisteredModel> m = std::move(built);
  absl::MutexLock l(&mu_);
  models_[{tenant, m->model_id}] = m;
  return RegisterResult{m, true};
}

absl::Status ModelRegistry::DropLeftovers(const std::string& tenant, uint64_t model_id) {
  // Every block on disk must be indexed to know that none is left.
  TQ_RETURN_IF_ERROR(store_->AwaitIndexLoaded());
  if (store_->ResidencyOf(tenant, model_id).blocks == 0) return absl::OkStatus();
  return DropModelBlocks(store_, tenant, model_id).status();
}

absl::Status ModelRegistry::Unregister(const std::string& tenant, uint64_t model_id,
                                       const std::function<absl::Status(const RegisteredModel&)>& retire) {
  absl::MutexLock reg(&register_mu_);
  TQ_ASSIGN_OR_RETURN(std::shared_ptr<const RegisteredModel> m, Find(tenant, model_id));
  absl::MutexLock gate(&m->commit_mu);
  TQ_RETURN_IF_ERROR(retire(*m));
  TQ_RETURN_IF_ERROR(store_->DeleteModelRecord(tenant, model_id));
  m->unregistered = true;
  absl::MutexLock l(&mu_);
  models_.erase({tenant, model_id});
  return absl::OkStatus();
}

absl::StatusOr<storage::EvictResult> DropModelBlocks(storage::BlockStore* store, const std::string& tenant,
                                                     uint64_t model_id) {
  storage::EvictSpec spec;
  spec.scope = storage::ModelScope{tenant, model_id};
  spec.drop = true;
  spec.include_pinned = true;
  storage::EvictResult total;
  // Blocks in the middle of a spill or a commit are skipped by a drop; they
  // settle within milliseconds.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  for (;;) {
    TQ_ASSIGN_OR_RETURN(storage::EvictResult r, store->Evict(spec));
    total.blocks += r.blocks;
    total.bytes += r.bytes;
    if (store->ResidencyOf(tenant, model_id).blocks == 0) return total;
    if (absl::Now() > give_up)
      return absl::UnavailableError(absl::StrCat("blocks of model ", model_id,
                                                 " stayed busy for 30 s; try again"));
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::StatusOr<std::shared_ptr<const RegisteredModel>> ModelRegistry::Find(
    const std::string& tenant, uint64_t model_id) const {
  absl::MutexLock l(&mu_);
  auto it = models_.find({tenant, model_id});
  if (it == models_.end())
    return absl::NotFoundError(absl::StrCat("model ", model_id, " is not registered"));
  return it->second;
}

absl::StatusOr<std::shared_ptr<const RegisteredModel>> ModelRegistry::Resolve(
    const std::string& tenant, const v1::ModelRef& ref) const {
  if (ref.model_id() == 0) return absl::InvalidArgumentError("model.model_id is required");
  TQ_ASSIGN_OR_RETURN(std::shared_ptr<const RegisteredModel> m, Find(tenant, ref.model_id()));
  if (ref.layout_fingerprint() != m->fingerprint)
    return absl::FailedPreconditionError(absl::StrCat(
        "layout fingerprint mismatch for model '", m->name, "': request has '",
        ref.layout_fingerprint(), "', registered is '", m->fingerprint, "'"));
  return m;
}

uint64_t ModelRegistry::codec_builds() const {
  absl::MutexLock l(&mu_);
  return codec_builds_;
}

std::vector<std::shared_ptr<const RegisteredModel>> ModelRegistry::List(
    const std::string* tenant) const {
  std::vector<std::shared_ptr<const RegisteredModel>> out;
  absl::MutexLock l(&mu_);
  for (const auto& [key, m] : models_)
    if (tenant == nullptr || key.first == *tenant) out.push_back(m);
  return out;
}


}  // namespace tqkv::service
