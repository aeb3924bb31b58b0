// Fuzz target: recipe metadata JSON (codec/metadata.h), the bytes a client
// sends as CodecConfig.recipe_metadata_json. A document either fails with
// INVALID_ARGUMENT or parses into metadata that is valid and survives a
// round trip through SerializeMetadataJson; tensor-parallel slicing of a
// parsed document never crashes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "codec/metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tqkv::RecipeMetadata> meta = tqkv::ParseMetadataJson(json);
  if (!meta.ok()) {
    if (meta.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (!tqkv::ValidateMetadata(*meta).ok()) std::abort();
  absl::StatusOr<tqkv::RecipeMetadata> again =
      tqkv::ParseMetadataJson(tqkv::SerializeMetadataJson(*meta));
  if (!again.ok() || !(*again == *meta)) std::abort();
  for (int tp : {1, 2, 3, 4}) {
    for (int rank = 0; rank < tp; ++rank) {
      (void)tqkv::SliceForTensorParallel(*meta, rank, tp);
    }
  }
  (void)tqkv::LayerByIndex(*meta, 0);
  (void)tqkv::FindLayer(*meta, "language_model.model.layers.0.self_attn.attn");
  return 0;
}
