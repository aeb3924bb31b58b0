// ModelRegistry: the registered models of every tenant, their codecs and
// layout fingerprints, persisted through BlockStore model records.
//
// Identity. A model is named by (tenant, model_name); its id is a
// deterministic 63-bit hash of that pair (never 0), so a client that
// re-registers after a restart, or on another replica, gets the same id.
//
// Fingerprint. A hash (32 hex digits) of everything that decides the stored
// bytes, after resolving defaults and aliases: layout (layers, kv/q heads,
// head dim, block size, dtype), each layer's canonical cache format and row
// bytes, dense boundary layers, rotation kind and seed, the recipe metadata
// (canonical JSON), the block hash scheme and the codec version. Two
// requests that resolve to the same bytes get the same fingerprint.
//
// Registration is idempotent: the same (tenant, name) with the same
// fingerprint returns created=false; a different fingerprint is refused
// with ALREADY_EXISTS and changes nothing.
//
// Ids are reused: a name unregistered and registered again gets its old id,
// so a new registration first drops any block the store still holds under
// that id (a record skipped at load, or an unregistration cut short by a
// crash): blocks of an earlier layout are never served under a new one.
//
// Thread safety: every method may be called concurrently. Returned
// RegisteredModel pointers are immutable and stay valid while held.
#ifndef TQKV_SERVICE_MODEL_REGISTRY_H_
#define TQKV_SERVICE_MODEL_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "codec/model_codec.h"
#include "proto/tqkv/v1/tqkv.pb.h"
#include "storage/block_key.h"
#include "storage/block_store.h"

namespace tqkv::service {

struct RegisteredModel {
  std::string tenant;
  uint64_t model_id = 0;
  std::string name;
  std::string fingerprint;  // hex
  v1::RegisterModelRequest request;  // as first registered
  std::unique_ptr<const ModelCodec> codec;
  v1::FormatDescriptor format;
  storage::BlockAccounting accounting;  // of one whole block

  // Commits of this model's blocks hold commit_mu shared and give up when
  // `unregistered`; ModelRegistry::Unregister holds it exclusively while it
  // removes the model, so no block of it lands after it is gone.
  mutable absl::Mutex commit_mu;
  mutable bool unregistered ABSL_GUARDED_BY(commit_mu) = false;

  const ModelShape& shape() const { return codec->shape(); }
  // Accounting of layers [first, last) of one block.
  storage::BlockAccounting RangeAccounting(int first, int last) const;
};

// The deterministic id of (tenant, model_name): nonzero, < 2^63.
uint64_t ModelIdFor(const std::string& tenant, const std::string& model_name);

// Builds (without registering) the model a request describes: validates the
// layout, codec config and metadata (INVALID_ARGUMENT naming the field) and
// computes the fingerprint.
// RESOURCE_EXHAUSTED when its codec would pass max_codec_build_work
// (CodecOptions::max_build_work; 0: no limit) or the codec memory limit.
absl::StatusOr<std::unique_ptr<RegisteredModel>> BuildModel(const std::string& tenant,
                                                            const v1::RegisterModelRequest& req,
                                                            uint64_t max_codec_build_work = CodecOptions{}.max_build_work);

// Removes every block of (tenant, model_id) from every tier, pinned ones
// included, waiting for blocks in the middle of a spill or commit to settle
// (UNAVAILABLE after 30 s). The caller keeps new ones from being committed
// meanwhile (the model's commit gate).
absl::StatusOr<storage::EvictResult> DropModelBlocks(storage::BlockStore* store, const std::string& tenant,
                                                     uint64_t model_id);

struct ModelRegistryOptions {
  // Models one tenant may register (records loaded at start-up count but
  // are never refused). Default: 256.
  int max_models_per_tenant = 256;
  // Most arithmetic one registration's codec may take to build
  // (CodecOptions::max_build_work); records loaded at start-up are built
  // whatever they cost. Default: CodecOptions' (2^33).
  uint64_t max_codec_build_work = CodecOptions{}.max_build_work;
};

class ModelRegistry {
 public:
  // `store` is not owned and must outlive the registry.
  explicit ModelRegistry(storage::BlockStore* store, ModelRegistryOptions options = {})
      : store_(store), options_(options) {}

  // Reads every model record from the store. A record that no longer
  // builds, or whose fingerprint changed (codec upgrade), is skipped and
  // reported in the returned warnings; its blocks stay unreachable.
  absl::StatusOr<std::vector<std::string>> Load();

  struct RegisterResult {
    std::shared_ptr<const RegisteredModel> model;
    bool created = false;
  };
  // INVALID_ARGUMENT for a bad request; ALREADY_EXISTS for a conflicting
  // registration of the same name; RESOURCE_EXHAUSTED for a new model of a
  // tenant that has max_models_per_tenant; INTERNAL for a model id
  // collision between two names; storage errors if the record cannot be
  // persisted (then nothing is registered). A request equal byte for byte
  // to the registered one returns it without building a codec.
  absl::StatusOr<RegisterResult> Register(const std::string& tenant,
                                          const v1::RegisterModelRequest& req);

  // Removes a registered model so that nothing of it outlives it. Under the
  // registration lock (a Register of the same name waits) and with the
  // model's commit gate closed (puts committing finish first; later ones
  // fail NOT_FOUND), `retire` removes what the model holds (blocks,
  // sequences, staged parts); then the record is deleted and the model
  // forgotten. An error from `retire` (a refusal before it changed
  // anything, or a failure part way) reopens the gate and keeps the model
  // registered. NOT_FOUND for an unknown model.
  absl::Status Unregister(const std::string& tenant, uint64_t model_id,
                          const std::function<absl::Status(const RegisteredModel&)>& retire);

  // The model `ref` names in `tenant`. INVALID_ARGUMENT for model_id 0;
  // NOT_FOUND for an unknown id (or another tenant's); FAILED_PRECONDITION
  // when ref.layout_fingerprint differs from the registered one.
  absl::StatusOr<std::shared_ptr<const RegisteredModel>> Resolve(const std::string& tenant,
                                                                 const v1::ModelRef& ref) const;
  // NOT_FOUND if absent.
  absl::StatusOr<std::shared_ptr<const RegisteredModel>> Find(const std::string& tenant,
                                                              uint64_t model_id) const;
  // Models of `tenant` ordered by id (every tenant's when `tenant` is null).
  std::vector<std::shared_ptr<const RegisteredModel>> List(const std::string* tenant) const;
  // Codecs built by Register (a codec of many layers and heads costs
  // seconds and up to CodecOptions::max_codec_bytes).
  uint64_t codec_builds() const;

 private:
  // Drops blocks the store holds under a model id about to be registered.
  absl::Status DropLeftovers(const std::string& tenant, uint64_t model_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(register_mu_);

  storage::BlockStore* const store_;
  const ModelRegistryOptions options_;
  // Lock order: register_mu_ (serialises Register's check-persist-insert)
  // before mu_ (guards the map; never held across storage calls).
  absl::Mutex register_mu_;
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<const RegisteredModel>> models_
      ABSL_GUARDED_BY(mu_);
  uint64_t codec_builds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_MODEL_REGISTRY_H_
