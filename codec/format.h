// Cache formats: names, per-component row layouts, row bytes.
//
// Names (case-insensitive):
//   tq4, tq4_kv, k4v4          K and V at 4-bit TurboQuant_mse (the TQ4 path)
//   tq{b}, k{b}v{c}            b, c in {2, 3, 4, 5, 8}: asymmetric K/V bits
//   turboquant25, turboquant35 outlier-channel recipes with QJL (need metadata)
//   turboquant25_noqjl, turboquant35_noqjl
//                              the same channel split, QJL bit spent on MSE
//   fp16 (alias dense)         uncompressed rows (boundary layers, windows)
//
// Row layouts (one token, one kv head, one component; little endian):
//   mse:    [indices: ceil(d·b/8) LSB-first | fp32 ‖x‖]
//   recipe: per group, high-precision group first:
//           with QJL    [mse ceil(g·(b−1)/8) | signs ceil(g/8) | fp16 ‖x_g‖ | fp16 ‖r_g‖]
//           without QJL [mse ceil(g·b/8) | fp16 ‖x_g‖]
//           high group g = round(d·ratio/16)·16 channels (ratio .25 / .50),
//           bits (high, low) = (3, 2) for turboquant25, (4, 3) for turboquant35.
//   dense:  [fp16 × d]
// d = 128: mse 36/52/68/84 bytes for b = 2..5; turboquant25 44, turboquant35 64.
#ifndef TQKV_CODEC_FORMAT_H_
#define TQKV_CODEC_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tqkv {

enum class RecipeKind : uint8_t { kNone = 0, kTurboQuant25 = 1, kTurboQuant35 = 2 };

struct ComponentSpec {
  enum class Kind : uint8_t { kDense = 0, kMse = 1, kRecipe = 2 };
  Kind kind = Kind::kMse;
  int bits = 4;                       // kMse: bits per coordinate
  RecipeKind recipe = RecipeKind::kNone;  // kRecipe
  // kRecipe: spend one bit per group on QJL. kMse with qjl: TurboQuant_prod
  // (bits−1 mse + 1 sign bit, fp32 norm and fp32 residual norm); no cache
  // format name selects it, it serves the estimator's own tests and studies.
  bool qjl = false;

  bool operator==(const ComponentSpec&) const = default;
};

// One channel group of a row (an mse row is a single group of all channels).
struct GroupLayout {
  int channels = 0;     // g
  int bits = 0;         // total bits per channel in this group
  int mse_bits = 0;     // bits of the scalar codebook (bits − 1 with QJL)
  bool qjl = false;
  bool fp16_norms = false;  // recipes store fp16 norms, mse rows fp32
  size_t index_offset = 0, index_bytes = 0;
  size_t sign_offset = 0, sign_bytes = 0;
  size_t norm_offset = 0;      // fp32 or fp16 ‖x_g‖
  size_t residual_offset = 0;  // ‖r_g‖ (QJL only), fp16 or fp32 like the norm
  size_t bytes = 0;            // total bytes of this group
};

// Byte layout of a component's row at head dim d.
struct RowLayout {
  ComponentSpec spec;
  int dim = 0;  // d
  std::vector<GroupLayout> groups;  // empty for dense
  size_t row_bytes = 0;
};

// INVALID_ARGUMENT when the spec cannot encode dim d (d < 8; recipes need
// d % 16 == 0 and leave both groups non-empty).
absl::StatusOr<RowLayout> MakeRowLayout(const ComponentSpec& spec, int dim);

// Number of high-precision channels of a recipe at dim d: round(d·ratio/16)·16.
int RecipeHighChannels(RecipeKind recipe, int dim);
std::string RecipeName(RecipeKind r);

struct Format {
  std::string name;  // canonical name
  ComponentSpec k, v;
  // True for recipes: encoding needs per-layer channel metadata.
  bool needs_metadata() const {
    return k.kind == ComponentSpec::Kind::kRecipe || v.kind == ComponentSpec::Kind::kRecipe;
  }
  bool operator==(const Format&) const = default;
};

// Parses a cache dtype name (see top of file). INVALID_ARGUMENT with the list
// of accepted names for anything else.
absl::StatusOr<Format> ParseFormat(const std::string& name);

// Every canonical format name, for listings (`tqkv formats`).
std::vector<std::string> AllFormatNames();

// Geometry of one page region (K or V) of a layer:
// [num_blocks, block_size, num_kv_heads, row_stride] uint8, where
// row_stride = row_bytes rounded up to `row_align` (padding bytes are zero).
struct PageGeometry {
  int64_t num_blocks = 0;
  int block_size = 16;
  int num_kv_heads = 1;
  size_t row_bytes = 0;
  size_t row_align = 1;

  size_t row_stride() const { return (row_bytes + row_align - 1) / row_align * row_align; }
  size_t token_bytes() const { return row_stride() * num_kv_heads; }
  size_t page_bytes() const { return token_bytes() * block_size; }
  size_t total_bytes() const { return page_bytes() * num_blocks; }
  int64_t num_slots() const { return num_blocks * block_size; }
  // Byte offset of (slot, kv_head). REQUIRES: 0 <= slot < num_slots().
  size_t offset(int64_t slot, int head) const {
    return static_cast<size_t>(slot) * token_bytes() + static_cast<size_t>(head) * row_stride();
  }
};

}  // namespace tqkv

#endif  // TQKV_CODEC_FORMAT_H_
