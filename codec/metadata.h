// Recipe metadata: which channels of each (layer, kv head, K|V) form the
// high-precision group of a TurboQuant recipe (reference §3 "Recipes", §4).
//
// On disk this is the `turboquant_kv.json` document of the vllm-turboquant
// layout:
//   { "version": 1, "recipe": "turboquant35", "head_size": 128,
//     "model_name": "...", "transform_version": "structured_hadamard_v1",
//     "codebook_version": "lloyd_beta_v1",
//     "layers": { "model.layers.0.self_attn": {
//         "key_high_precision_indices":   [[...sorted, one list per kv head...]],
//         "value_high_precision_indices": [[...]] } },
//     "calibration": { "method": ..., "num_observed_tokens": ..., ... } }
// Unknown fields (top level, per layer, in "calibration") are accepted and
// dropped, so newer writers stay readable; they do not survive a round trip.
//
// Every error names what is wrong and where, e.g.
//   layer 'model.layers.3.self_attn': key_high_precision_indices[1] is not
//   sorted ascending at position 5 (7 after 9)
// so that a bad file can be fixed without a debugger.
//
// All functions here are pure (no shared state) and thread-compatible.
#ifndef TQKV_CODEC_METADATA_H_
#define TQKV_CODEC_METADATA_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tqkv {

inline constexpr int kMetadataVersion = 1;
inline constexpr char kDefaultTransformVersion[] = "structured_hadamard_v1";
inline constexpr char kDefaultCodebookVersion[] = "lloyd_beta_v1";
// Largest head_size a metadata document may declare (bounds allocations).
inline constexpr int kMaxMetadataHeadSize = 65536;

// Maps a recipe name to the base recipe whose metadata it uses:
// "turboquant25" and "turboquant25_noqjl" → "turboquant25"; likewise for
// "turboquant35". INVALID_ARGUMENT (listing the known names) otherwise.
absl::StatusOr<std::string> CanonicalRecipe(const std::string& recipe);

// Number of high-precision channels per kv head for `recipe` at `head_size`:
// round(head_size · ratio / 16) · 16 with ratio 0.25 (turboquant25) or 0.50
// (turboquant35); 32 and 64 at head_size 128. Rounding is half to even, as in
// the Python reference that writes these files (the two roundings differ only
// at exact midpoints, e.g. head_size 80 for turboquant35 → 32, not 48).
// INVALID_ARGUMENT when the recipe is unknown, head_size is not a positive
// multiple of 16, or the count would be 0 or the whole head (e.g. head_size 16).
absl::StatusOr<int> HighPrecisionChannelCount(const std::string& recipe, int head_size);

// High-precision channel lists of one attention layer.
struct LayerChannels {
  // key[h] = ascending channel indices of kv head h; same for value.
  std::vector<std::vector<int>> key;
  std::vector<std::vector<int>> value;

  int num_kv_heads() const { return static_cast<int>(key.size()); }
  bool operator==(const LayerChannels&) const = default;
};

// Provenance of a calibrated document (all fields optional on disk: a missing
// string is "", a missing count is 0).
struct CalibrationInfo {
  std::string method;     // e.g. "activation_energy_v1"
  std::string objective;  // e.g. "sum_squared_activation"
  int64_t num_prompts = 0;
  int64_t max_seq_len = 0;
  int64_t batch_size = 0;
  int64_t num_observed_tokens = 0;
  std::string dtype;
  std::string device;
  std::string prompts_sha256;

  bool operator==(const CalibrationInfo&) const = default;
};

struct RecipeMetadata {
  int version = kMetadataVersion;
  // As written in the file: a base recipe or its _noqjl variant.
  std::string recipe;
  int head_size = 0;
  std::string model_name;  // "" when the file has null or no model_name
  // Not interpreted here: the codec checks them against what it implements.
  std::string transform_version = kDefaultTransformVersion;
  std::string codebook_version = kDefaultCodebookVersion;
  // Layer name as written in the file → its channels. Ordered, so output and
  // error order are deterministic.
  std::map<std::string, LayerChannels> layers;
  std::optional<CalibrationInfo> calibration;

  bool operator==(const RecipeMetadata&) const = default;
};

// Checks every structural rule on an in-memory document: version == 1; known
// recipe; head_size a multiple of 16 in [16, kMaxMetadataHeadSize] for which
// the recipe has a high group; at least one layer; per layer, key and value
// with the same nonzero number of kv heads, each list strictly ascending (no
// duplicates), within [0, head_size), of exactly HighPrecisionChannelCount
// entries; no two layer names equal after alias normalisation (see FindLayer).
// OK or INVALID_ARGUMENT naming the first violation (layer, field, kv head,
// position).
absl::Status ValidateMetadata(const RecipeMetadata& meta);

// Parses and validates (ValidateMetadata) a JSON document. Fields must have
// their JSON types: integers are JSON integers (128.5, 128.0 and "128" are
// rejected), strings are strings; model_name may be null; "calibration" may be
// absent or null. Duplicate keys in any object are rejected.
// On failure INVALID_ARGUMENT; malformed JSON reports the parser's line,
// column and byte offset; arrays and objects nested deeper than
// kMaxMetadataDepth are rejected before parsing.
inline constexpr int kMaxMetadataDepth = 32;
absl::StatusOr<RecipeMetadata> ParseMetadataJson(const std::string& json);

// Reads `path` and parses it as ParseMetadataJson does. NOT_FOUND (or the
// errno's code) when the file cannot be read; INVALID_ARGUMENT, prefixed with
// the path, when its content is rejected.
absl::StatusOr<RecipeMetadata> LoadMetadataFile(const std::string& path);

// JSON for `meta` (keys sorted, 2-space indent, trailing newline, like the
// Python writer). Does not validate. ParseMetadataJson(SerializeMetadataJson(m))
// == m for every valid m.
std::string SerializeMetadataJson(const RecipeMetadata& meta);

// Validates `meta` (INVALID_ARGUMENT, nothing written), then writes it to
// `path` through a temporary file in the same directory renamed over `path`,
// so readers never see a partial file. I/O failures map from errno.
absl::Status SaveMetadataFile(const RecipeMetadata& meta, const std::string& path);

// Run-time gate: `meta` (already valid) may serve a model running `recipe`
// with `head_size` and `num_kv_heads` kv heads per rank (pass the metadata
// returned by SliceForTensorParallel and the per-rank head count; or the full
// metadata and the total head count when TP is 1).
// OK; INVALID_ARGUMENT when `meta` is invalid or `recipe` is unknown;
// FAILED_PRECONDITION when the recipes differ (a _noqjl variant matches its
// base), the head sizes differ, or any layer's key or value head count differs
// from num_kv_heads.
absl::Status ValidateForModel(const RecipeMetadata& meta, const std::string& recipe,
                              int head_size, int num_kv_heads);

// Alias normalisation of a layer name: strips one leading "language_model."
// and then one trailing ".attn".
std::string NormalizeLayerName(const std::string& name);

// Finds the channels of layer `name`: first the exact key, then the name with
// a trailing ".attn" stripped, with a leading "language_model." stripped, and
// with both, each compared against metadata keys normalised the same way
// (so "model.layers.0.self_attn" finds a file key
// "language_model.model.layers.0.self_attn.attn" and vice versa).
// Never infers a missing layer: NOT_FOUND naming the layer, the aliases tried
// and a few known layer names.
// The pointer is owned by `meta` and valid while `meta` is alive and its
// `layers` map is not modified.
absl::StatusOr<const LayerChannels*> FindLayer(const RecipeMetadata& meta,
                                               const std::string& name);

// The layer whose normalised name is "model.layers.{layer}.self_attn".
// NOT_FOUND otherwise (also for a negative index). Pointer lifetime as FindLayer.
absl::StatusOr<const LayerChannels*> LayerByIndex(const RecipeMetadata& meta, int layer);

// The metadata seen by tensor-parallel rank `tp_rank` of `tp_size`: every
// layer keeps only this rank's kv heads, everything else is copied.
//  * tp_size <= H (H = a layer's kv heads): H % tp_size must be 0 and the rank
//    gets heads [tp_rank·H/tp_size, (tp_rank+1)·H/tp_size).
//  * tp_size > H: the heads are replicated (as vLLM does); tp_size % H must be
//    0 and the rank gets the single head tp_rank·H/tp_size.
// INVALID_ARGUMENT when tp_size < 1, tp_rank is outside [0, tp_size), a layer
// does not divide as above (naming the layer), or `meta` is invalid.
absl::StatusOr<RecipeMetadata> SliceForTensorParallel(const RecipeMetadata& meta,
                                                      int tp_rank, int tp_size);

}  // namespace tqkv

#endif  // TQKV_CODEC_METADATA_H_
