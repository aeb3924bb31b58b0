#include "codec/metadata.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace tqkv {
namespace {

using Json = nlohmann::json;

constexpr char kKeyField[] = "key_high_precision_indices";
constexpr char kValueField[] = "value_high_precision_indices";
constexpr char kNoQjlSuffix[] = "_noqjl";
constexpr char kLanguageModelPrefix[] = "language_model.";
constexpr char kAttnSuffix[] = ".attn";
constexpr int kGroupAlignment = 16;
constexpr int kKnownNamesInError = 5;

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

std::string Quote(const std::string& s) { return absl::StrCat("'", s, "'"); }

std::string LayerPrefix(const std::string& layer) {
  return absl::StrCat("layer ", Quote(layer), ": ");
}

// A short rendering of a JSON value for error messages.
std::string Show(const Json& j) {
  constexpr size_t kMax = 40;
  std::string s = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > kMax) s = absl::StrCat(s.substr(0, kMax), "...");
  return s;
}

// The value of a JSON integer, or nullopt for anything else (floats such as
// 128.0, strings, booleans). Unsigned values above INT64_MAX saturate; every
// caller range-checks the result.
std::optional<int64_t> AsInteger(const Json& j) {
  if (j.is_number_unsigned()) {
    uint64_t u = j.get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  return std::nullopt;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Round half to even of num / den for num >= 0, den > 0 (Python's round()).
int64_t DivRoundHalfEven(int64_t num, int64_t den) {
  int64_t q = num / den, r = num % den;
  if (2 * r > den || (2 * r == den && (q & 1))) ++q;
  return q;
}

absl::Status HeadSizeRangeError(int64_t head_size) {
  return Invalid(absl::StrCat("head_size must be a multiple of ", kGroupAlignment, " in [",
                              kGroupAlignment, ", ", kMaxMetadataHeadSize, "], got ",
                              head_size));
}

// version, recipe and head_size of an in-memory document.
absl::Status ValidateHeader(const RecipeMetadata& meta) {
  if (meta.version != kMetadataVersion) {
    return Invalid(absl::StrCat("unsupported metadata version ", meta.version,
                                " (this reader supports ", kMetadataVersion, ")"));
  }
  absl::StatusOr<std::string> base = CanonicalRecipe(meta.recipe);
  if (!base.ok()) return Invalid(absl::StrCat("recipe: ", base.status().message()));
  if (meta.head_size < kGroupAlignment || meta.head_size % kGroupAlignment != 0 ||
      meta.head_size > kMaxMetadataHeadSize) {
    return HeadSizeRangeError(meta.head_size);
  }
  absl::StatusOr<int> count = HighPrecisionChannelCount(meta.recipe, meta.head_size);
  if (!count.ok()) return Invalid(absl::StrCat("head_size: ", count.status().message()));
  return absl::OkStatus();
}

// One of a layer's two per-head index lists.
absl::Status ValidateIndexLists(const std::string& layer, const char* field,
                                const std::vector<std::vector<int>>& lists,
                                const RecipeMetadata& meta, int count) {
  if (lists.empty()) {
    return Invalid(absl::StrCat(LayerPrefix(layer), field, " has no kv heads"));
  }
  for (size_t h = 0; h < lists.size(); ++h) {
    const std::vector<int>& list = lists[h];
    std::string where = absl::StrCat(LayerPrefix(layer), field, "[", h, "]");
    for (size_t i = 0; i < list.size(); ++i) {
      int v = list[i];
      if (v < 0 || v >= meta.head_size) {
        return Invalid(absl::StrCat(where, "[", i, "] = ", v, " is out of range [0, ",
                                    meta.head_size, ")"));
      }
      if (i == 0) continue;
      if (v == list[i - 1]) {
        return Invalid(absl::StrCat(where, " has duplicate index ", v, " at position ", i));
      }
      if (v < list[i - 1]) {
        return Invalid(absl::StrCat(where, " is not sorted ascending at position ", i, " (",
                                    v, " after ", list[i - 1], ")"));
      }
    }
    if (static_cast<int>(list.size()) != count) {
      return Invalid(absl::StrCat(where, " has ", list.size(), " indices; recipe ", meta.recipe,
                                  " at head_size ", meta.head_size, " needs ", count));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLayer(const std::string& name, const LayerChannels& layer,
                           const RecipeMetadata& meta, int count) {
  TQ_RETURN_IF_ERROR(ValidateIndexLists(name, kKeyField, layer.key, meta, count));
  TQ_RETURN_IF_ERROR(ValidateIndexLists(name, kValueField, layer.value, meta, count));
  if (layer.key.size() != layer.value.size()) {
    return Invalid(absl::StrCat(LayerPrefix(name), kKeyField, " has ", layer.key.size(),
                                " kv heads but ", kValueField, " has ", layer.value.size()));
  }
  return absl::OkStatus();
}

absl::Status ValidateUniqueNormalizedNames(const RecipeMetadata& meta) {
  std::map<std::string, std::string> seen;  // normalised → file name
  for (const auto& [name, layer] : meta.layers) {
    auto [it, inserted] = seen.emplace(NormalizeLayerName(name), name);
    if (!inserted) {
      return Invalid(absl::StrCat("layers ", Quote(it->second), " and ", Quote(name),
                                  " name the same layer after alias normalisation (",
                                  Quote(it->first), ")"));
    }
  }
  return absl::OkStatus();
}

// ---- JSON → struct (type checks; semantic checks are ValidateMetadata's) ----

absl::StatusOr<std::vector<std::vector<int>>> ParseIndexLists(const std::string& layer,
                                                              const Json& obj,
                                                              const char* field,
                                                              int head_size) {
  auto it = obj.find(field);
  if (it == obj.end()) return Invalid(absl::StrCat(LayerPrefix(layer), "missing ", field));
  if (!it->is_array()) {
    return Invalid(absl::StrCat(LayerPrefix(layer), field,
                                " must be a list of lists (one per kv head), got ", Show(*it)));
  }
  std::vector<std::vector<int>> lists;
  lists.reserve(it->size());
  for (size_t h = 0; h < it->size(); ++h) {
    const Json& head = (*it)[h];
    std::string where = absl::StrCat(LayerPrefix(layer), field, "[", h, "]");
    if (!head.is_array()) {
      return Invalid(absl::StrCat(where, " must be a list of integers, got ", Show(head)));
    }
    std::vector<int>& list = lists.emplace_back();
    list.reserve(head.size());
    for (size_t i = 0; i < head.size(); ++i) {
      std::optional<int64_t> v = AsInteger(head[i]);
      if (!v) {
        return Invalid(absl::StrCat(where, "[", i, "] is not an integer (got ", Show(head[i]),
                                    ")"));
      }
      if (*v < 0 || *v >= head_size) {
        return Invalid(
            absl::StrCat(where, "[", i, "] = ", Show(head[i]), " is out of range [0, ", head_size,
                         ")"));
      }
      list.push_back(static_cast<int>(*v));
    }
  }
  return lists;
}

// An optional string field: absent → `fallback`; null allowed when `nullable`.
absl::StatusOr<std::string> OptionalString(const Json& obj, const char* field,
                                           const std::string& where, std::string fallback,
                                           bool nullable) {
  auto it = obj.find(field);
  if (it == obj.end() || (nullable && it->is_null())) return fallback;
  if (!it->is_string()) {
    return Invalid(absl::StrCat(where, field, " must be a string", nullable ? " or null" : "",
                                ", got ", Show(*it)));
  }
  return it->get<std::string>();
}

absl::StatusOr<int64_t> OptionalCount(const Json& obj, const char* field,
                                      const std::string& where) {
  auto it = obj.find(field);
  if (it == obj.end()) return 0;
  std::optional<int64_t> v = AsInteger(*it);
  if (!v || *v < 0) {
    return Invalid(absl::StrCat(where, field, " must be a non-negative integer, got ",
                                Show(*it)));
  }
  return *v;
}

absl::StatusOr<std::optional<CalibrationInfo>> ParseCalibration(const Json& root) {
  auto it = root.find("calibration");
  if (it == root.end() || it->is_null()) return std::optional<CalibrationInfo>();
  if (!it->is_object()) {
    return Invalid(absl::StrCat("calibration must be an object or null, got ", Show(*it)));
  }
  const Json& c = *it;
  const std::string where = "calibration.";
  CalibrationInfo info;
  TQ_ASSIGN_OR_RETURN(info.method, OptionalString(c, "method", where, "", false));
  TQ_ASSIGN_OR_RETURN(info.objective, OptionalString(c, "objective", where, "", false));
  TQ_ASSIGN_OR_RETURN(info.num_prompts, OptionalCount(c, "num_prompts", where));
  TQ_ASSIGN_OR_RETURN(info.max_seq_len, OptionalCount(c, "max_seq_len", where));
  TQ_ASSIGN_OR_RETURN(info.batch_size, OptionalCount(c, "batch_size", where));
  TQ_ASSIGN_OR_RETURN(info.num_observed_tokens, OptionalCount(c, "num_observed_tokens", where));
  TQ_ASSIGN_OR_RETURN(info.dtype, OptionalString(c, "dtype", where, "", false));
  TQ_ASSIGN_OR_RETURN(info.device, OptionalString(c, "device", where, "", false));
  TQ_ASSIGN_OR_RETURN(info.prompts_sha256, OptionalString(c, "prompts_sha256", where, "", false));
  return std::optional<CalibrationInfo>(std::move(info));
}

// The deepest nesting of arrays and objects in `text` (brackets inside
// strings do not count), read without building anything.
int JsonNestingDepth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Parses `text`, rejecting duplicate object keys (nlohmann keeps the last one
// silently, which would drop a layer) and nesting deeper than
// kMaxMetadataDepth (the document needs 4 levels; a deeper one would only
// cost stack in the recursive printing and destruction of the tree).
// nlohmann reports syntax errors by exception; they are caught here and
// never leave this function.
absl::StatusOr<Json> ParseJsonText(const std::string& text) {
  if (const int depth = JsonNestingDepth(text); depth > kMaxMetadataDepth)
    return Invalid(absl::StrCat("malformed metadata JSON: arrays and objects nest ", depth,
                                " levels deep; at most ", kMaxMetadataDepth, " are allowed"));
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text, callback, /*allow_exceptions=*/true);
  } catch (const Json::exception& e) {
    return Invalid(absl::StrCat("malformed metadata JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return Invalid(absl::StrCat("malformed metadata JSON: duplicate key ", Quote(duplicate),
                                " in one object"));
  }
  return root;
}

}  // namespace

absl::StatusOr<std::string> CanonicalRecipe(const std::string& recipe) {
  std::string base = recipe;
  if (EndsWith(base, kNoQjlSuffix)) base.resize(base.size() - std::strlen(kNoQjlSuffix));
  if (base == "turboquant25" || base == "turboquant35") return base;
  return Invalid(absl::StrCat("unknown recipe ", Quote(recipe),
                              "; known: turboquant25, turboquant35, turboquant25_noqjl, "
                              "turboquant35_noqjl"));
}

absl::StatusOr<int> HighPrecisionChannelCount(const std::string& recipe, int head_size) {
  TQ_ASSIGN_OR_RETURN(std::string base, CanonicalRecipe(recipe));
  if (head_size <= 0 || head_size % kGroupAlignment != 0) {
    return Invalid(absl::StrCat("head_size must be a positive multiple of ", kGroupAlignment,
                                ", got ", head_size));
  }
  // ratio = 1/4 or 1/2, so head_size·ratio/16 = (head_size/16) / ratio_den.
  const int64_t ratio_den = base == "turboquant25" ? 4 : 2;
  const int64_t count =
      DivRoundHalfEven(head_size / kGroupAlignment, ratio_den) * kGroupAlignment;
  if (count <= 0 || count >= head_size) {
    return Invalid(absl::StrCat("recipe ", recipe, " has no high-precision group at head_size ",
                                head_size, " (it would hold ", count, " channels)"));
  }
  return static_cast<int>(count);
}

absl::Status ValidateMetadata(const RecipeMetadata& meta) {
  TQ_RETURN_IF_ERROR(ValidateHeader(meta));
  if (meta.layers.empty()) return Invalid("layers is empty: at least one layer is required");
  TQ_ASSIGN_OR_RETURN(int count, HighPrecisionChannelCount(meta.recipe, meta.head_size));
  for (const auto& [name, layer] : meta.layers) {
    TQ_RETURN_IF_ERROR(ValidateLayer(name, layer, meta, count));
  }
  return ValidateUniqueNormalizedNames(meta);
}

absl::StatusOr<RecipeMetadata> ParseMetadataJson(const std::string& json) {
  TQ_ASSIGN_OR_RETURN(Json root, ParseJsonText(json));
  if (!root.is_object()) {
    return Invalid(absl::StrCat("metadata root must be a JSON object, got ", Show(root)));
  }
  RecipeMetadata meta;

  auto version = root.find("version");
  if (version == root.end()) return Invalid("missing required field 'version'");
  std::optional<int64_t> v = AsInteger(*version);
  if (!v) return Invalid(absl::StrCat("version must be an integer, got ", Show(*version)));
  if (*v != kMetadataVersion) {
    return Invalid(absl::StrCat("unsupported metadata version ", *v, " (this reader supports ",
                                kMetadataVersion, ")"));
  }
  meta.version = kMetadataVersion;

  auto recipe = root.find("recipe");
  if (recipe == root.end()) return Invalid("missing required field 'recipe'");
  if (!recipe->is_string()) {
    return Invalid(absl::StrCat("recipe must be a string, got ", Show(*recipe)));
  }
  meta.recipe = recipe->get<std::string>();

  auto head_size = root.find("head_size");
  if (head_size == root.end()) return Invalid("missing required field 'head_size'");
  std::optional<int64_t> hs = AsInteger(*head_size);
  if (!hs) return Invalid(absl::StrCat("head_size must be an integer, got ", Show(*head_size)));
  if (*hs < 0 || *hs > kMaxMetadataHeadSize) return HeadSizeRangeError(*hs);
  meta.head_size = static_cast<int>(*hs);

  TQ_RETURN_IF_ERROR(ValidateHeader(meta));
  TQ_ASSIGN_OR_RETURN(meta.model_name, OptionalString(root, "model_name", "", "", true));
  TQ_ASSIGN_OR_RETURN(meta.transform_version,
                      OptionalString(root, "transform_version", "", kDefaultTransformVersion,
                                     false));
  TQ_ASSIGN_OR_RETURN(meta.codebook_version,
                      OptionalString(root, "codebook_version", "", kDefaultCodebookVersion,
                                     false));

  auto layers = root.find("layers");
  if (layers == root.end()) return Invalid("missing required field 'layers'");
  if (!layers->is_object()) {
    return Invalid(absl::StrCat("layers must be an object mapping layer name to channels, got ",
                                Show(*layers)));
  }
  if (layers->empty()) return Invalid("layers is empty: at least one layer is required");
  TQ_ASSIGN_OR_RETURN(int count, HighPrecisionChannelCount(meta.recipe, meta.head_size));
  for (const auto& [name, entry] : layers->items()) {
    if (!entry.is_object()) {
      return Invalid(absl::StrCat("layer ", Quote(name), " must be an object with ", kKeyField,
                                  " and ", kValueField, ", got ", Show(entry)));
    }
    LayerChannels layer;
    TQ_ASSIGN_OR_RETURN(layer.key, ParseIndexLists(name, entry, kKeyField, meta.head_size));
    TQ_ASSIGN_OR_RETURN(layer.value, ParseIndexLists(name, entry, kValueField, meta.head_size));
    TQ_RETURN_IF_ERROR(ValidateLayer(name, layer, meta, count));
    meta.layers.emplace(name, std::move(layer));
  }
  TQ_ASSIGN_OR_RETURN(meta.calibration, ParseCalibration(root));
  TQ_RETURN_IF_ERROR(ValidateMetadata(meta));
  return meta;
}

absl::StatusOr<RecipeMetadata> LoadMetadataFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open metadata file ", path));
  }
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int read_errno = errno;
  std::fclose(f);
  if (failed) {
    return absl::ErrnoToStatus(read_errno, absl::StrCat("cannot read metadata file ", path));
  }
  absl::StatusOr<RecipeMetadata> meta = ParseMetadataJson(text);
  if (!meta.ok()) {
    return absl::Status(meta.status().code(), absl::StrCat(path, ": ", meta.status().message()));
  }
  return meta;
}

std::string SerializeMetadataJson(const RecipeMetadata& meta) {
  Json layers = Json::object();
  for (const auto& [name, layer] : meta.layers) {
    layers[name] = {{kKeyField, layer.key}, {kValueField, layer.value}};
  }
  Json root = {
      {"version", meta.version},
      {"recipe", meta.recipe},
      {"head_size", meta.head_size},
      {"model_name", meta.model_name},
      {"transform_version", meta.transform_version},
      {"codebook_version", meta.codebook_version},
      {"layers", std::move(layers)},
  };
  if (meta.calibration) {
    const CalibrationInfo& c = *meta.calibration;
    root["calibration"] = {
        {"method", c.method},
        {"objective", c.objective},
        {"num_prompts", c.num_prompts},
        {"max_seq_len", c.max_seq_len},
        {"batch_size", c.batch_size},
        {"num_observed_tokens", c.num_observed_tokens},
        {"dtype", c.dtype},
        {"device", c.device},
        {"prompts_sha256", c.prompts_sha256},
    };
  }
  // error_handler_t::replace: invalid UTF-8 in a hand-built string becomes
  // U+FFFD instead of an exception.
  return root.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

absl::Status SaveMetadataFile(const RecipeMetadata& meta, const std::string& path) {
  TQ_RETURN_IF_ERROR(ValidateMetadata(meta));
  const std::string text = SerializeMetadataJson(meta);
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", tmp));
  }
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  int saved_errno = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    saved_errno = errno;
  }
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    saved_errno = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(saved_errno, absl::StrCat("cannot write metadata file ", path));
  }
  return absl::OkStatus();
}

absl::Status ValidateForModel(const RecipeMetadata& meta, const std::string& recipe,
                              int head_size, int num_kv_heads) {
  TQ_RETURN_IF_ERROR(ValidateMetadata(meta));
  TQ_ASSIGN_OR_RETURN(std::string model_base, CanonicalRecipe(recipe));
  if (num_kv_heads < 1) {
    return Invalid(absl::StrCat("num_kv_heads must be positive, got ", num_kv_heads));
  }
  TQ_ASSIGN_OR_RETURN(std::string meta_base, CanonicalRecipe(meta.recipe));
  if (meta_base != model_base) {
    return absl::FailedPreconditionError(
        absl::StrCat("metadata recipe ", Quote(meta.recipe), " does not match the model's recipe ",
                     Quote(recipe)));
  }
  if (meta.head_size != head_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("metadata head_size ", meta.head_size,
                     " does not match the model's head size ", head_size));
  }
  for (const auto& [name, layer] : meta.layers) {
    if (layer.num_kv_heads() != num_kv_heads) {
      return absl::FailedPreconditionError(absl::StrCat(
          LayerPrefix(name), "metadata has ", layer.num_kv_heads(), " kv heads, the model has ",
          num_kv_heads, " per rank (slice with SliceForTensorParallel under tensor parallelism)"));
    }
  }
  return absl::OkStatus();
}

std::string NormalizeLayerName(const std::string& name) {
  std::string out = name;
  if (StartsWith(out, kLanguageModelPrefix)) out.erase(0, std::strlen(kLanguageModelPrefix));
  if (EndsWith(out, kAttnSuffix)) out.resize(out.size() - std::strlen(kAttnSuffix));
  return out;
}

absl::StatusOr<const LayerChannels*> FindLayer(const RecipeMetadata& meta,
                                               const std::string& name) {
  std::vector<std::string> candidates;
  auto add = [&](std::string c) {
    for (const std::string& seen : candidates) {
      if (seen == c) return;
    }
    candidates.push_back(std::move(c));
  };
  add(name);
  if (EndsWith(name, kAttnSuffix)) add(name.substr(0, name.size() - std::strlen(kAttnSuffix)));
  if (StartsWith(name, kLanguageModelPrefix)) {
    std::string stripped = name.substr(std::strlen(kLanguageModelPrefix));
    add(stripped);
    if (EndsWith(stripped, kAttnSuffix)) {
      add(stripped.substr(0, stripped.size() - std::strlen(kAttnSuffix)));
    }
  }
  for (const std::string& c : candidates) {
    auto it = meta.layers.find(c);
    if (it != meta.layers.end()) return &it->second;
  }
  const std::string normalized = NormalizeLayerName(name);
  for (const auto& [key, layer] : meta.layers) {
    if (NormalizeLayerName(key) == normalized) return &layer;
  }

  std::vector<std::string> quoted;
  for (const std::string& c : candidates) quoted.push_back(Quote(c));
  std::vector<std::string> known;
  for (const auto& [key, layer] : meta.layers) {
    if (static_cast<int>(known.size()) == kKnownNamesInError) break;
    known.push_back(Quote(key));
  }
  std::string more = meta.layers.size() > known.size()
                         ? absl::StrCat(", ... (", meta.layers.size(), " in all)")
                         : std::string();
  return absl::NotFoundError(absl::StrCat(
      "layer ", Quote(name), " is not in the metadata (tried ", absl::StrJoin(quoted, ", "),
      "); known layers: ", known.empty() ? std::string("none") : absl::StrJoin(known, ", "),
      more));
}

absl::StatusOr<const LayerChannels*> LayerByIndex(const RecipeMetadata& meta, int layer) {
  if (layer < 0) {
    return absl::NotFoundError(absl::StrCat("layer index ", layer, " is negative"));
  }
  const std::string target = absl::StrCat("model.layers.", layer, ".self_attn");
  auto it = meta.layers.find(target);
  if (it != meta.layers.end()) return &it->second;
  for (const auto& [key, channels] : meta.layers) {
    if (NormalizeLayerName(key) == target) return &channels;
  }
  return absl::NotFoundError(absl::StrCat("no metadata layer for index ", layer, " (",
                                          Quote(target), " after alias normalisation)"));
}

absl::StatusOr<RecipeMetadata> SliceForTensorParallel(const RecipeMetadata& meta, int tp_rank,
                                                      int tp_size) {
  if (tp_size < 1) return Invalid(absl::StrCat("tp_size must be positive, got ", tp_size));
  if (tp_rank < 0 || tp_rank >= tp_size) {
    return Invalid(absl::StrCat("tp_rank ", tp_rank, " is outside [0, ", tp_size, ")"));
  }
  TQ_RETURN_IF_ERROR(ValidateMetadata(meta));
  RecipeMetadata out = meta;
  for (auto& [name, layer] : out.layers) {
    const int total = layer.num_kv_heads();
    int first, count;
    if (tp_size <= total) {
      if (total % tp_size != 0) {
        return Invalid(absl::StrCat(LayerPrefix(name), total, " kv heads do not split evenly over ",
                                    tp_size, " tensor-parallel ranks"));
      }
      count = total / tp_size;
      first = tp_rank * count;
    } else {
      if (tp_size % total != 0) {
        return Invalid(absl::StrCat(LayerPrefix(name), total,
                                    " kv heads cannot be replicated evenly over ", tp_size,
                                    " tensor-parallel ranks"));
      }
      count = 1;
      first = static_cast<int>(static_cast<int64_t>(tp_rank) * total / tp_size);
    }
    auto slice = [&](const std::vector<std::vector<int>>& all) {
      return std::vector<std::vector<int>>(all.begin() + first, all.begin() + first + count);
    };
    layer.key = slice(layer.key);
    layer.value = slice(layer.value);
  }
  return out;
}

}  // namespace tqkv
