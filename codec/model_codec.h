// ModelCodec: the per-(layer, kv head, K|V) row codecs of one registered
// model, and the byte layout of a stored block.
//
// Block layout (the unit tqkv stores, spills and serves): for each layer l in
// order, a K page then a V page, each [block_size, num_kv_heads, row_bytes]
// (the reference's page layout with num_blocks = 1; row_bytes per layer and
// component). Layers kept dense store fp16 rows.
#ifndef TQKV_CODEC_MODEL_CODEC_H_
#define TQKV_CODEC_MODEL_CODEC_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/format.h"
#include "codec/metadata.h"
#include "codec/row_codec.h"

namespace tqkv {

struct ModelShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int num_q_heads = 0;  // multiple of num_kv_heads (GQA)
  int head_dim = 0;
  int block_size = 16;  // tokens per block
  bool operator==(const ModelShape&) const = default;
};

struct CodecOptions {
  // Cache format of every layer not overridden (see format.h). Default: k4v4.
  std::string format = "k4v4";
  // Per-layer format overrides (layer index → format name). Default: none.
  std::map<int, std::string> layer_formats;
  // First/last layers kept as fp16 (reference §5: boundary layers). Default 0.
  int dense_first_layers = 0;
  int dense_last_layers = 0;
  // Rotation for mse rows; default: DefaultRotationKind(head_dim).
  std::optional<RotationKind> rotation;
  // Model rotation seed (see seed.h). Default 0.
  uint64_t seed = 0;
  // Most memory the codec may hold (rotations and QJL matrices of every
  // layer, head and component), checked from the first head of each layer
  // before the rest is built: RESOURCE_EXHAUSTED beyond it. 0: no limit.
  // Default: 512 MiB.
  uint64_t max_codec_bytes = uint64_t{512} << 20;
  // Most arithmetic building the codec may take, estimated before anything
  // is built (BuildWork): RESOURCE_EXHAUSTED beyond it. 0: no limit.
  // Default: 2^33 multiply-adds (seconds of one core).
  uint64_t max_build_work = uint64_t{1} << 33;
};

// The multiply-adds of building the codec of `shape` with `options`: a QR
// rotation (an orthogonalised Gaussian matrix) costs about (4/3)·d³ for each
// layer, kv head and component; the Hadamard rotations' cost is linear in d.
uint64_t BuildWork(const ModelShape& shape, const CodecOptions& options);

// Codecs of one layer.
class LayerCodec {
 public:
  const Format& format() const { return format_; }
  const RowCodec& k(int head) const { return *k_[head]; }
  const RowCodec& v(int head) const { return *v_[head]; }
  int num_kv_heads() const { return static_cast<int>(k_.size()); }
  size_t k_row_bytes() const { return k_[0]->row_bytes(); }
  size_t v_row_bytes() const { return v_[0]->row_bytes(); }

 private:
  friend class ModelCodec;
  Format format_;
  std::vector<std::unique_ptr<RowCodec>> k_, v_;
};

// Bytes of one block by kind (dense baseline is fp16 K and V).
struct BlockBytes {
  uint64_t dense_equivalent = 0;  // fp16 K+V of all layers
  uint64_t packed_k = 0;          // index bytes of K rows (incl. QJL signs)
  uint64_t packed_v = 0;
  uint64_t norms = 0;             // norm and residual-norm bytes
  uint64_t dense_rows = 0;        // fp16 rows of layers kept dense
  uint64_t total = 0;             // == block_bytes()
};

// Thread safety: immutable after Create.
class ModelCodec {
 public:
  // INVALID_ARGUMENT for a bad shape or format; FAILED_PRECONDITION when a
  // recipe layer has no metadata (metadata is required iff a recipe is used,
  // and is validated against the shape).
  static absl::StatusOr<std::unique_ptr<ModelCodec>> Create(const ModelShape& shape,
                                                            const CodecOptions& options,
                                                            const RecipeMetadata* metadata);

  const ModelShape& shape() const { return shape_; }
  const CodecOptions& options() const { return options_; }
  const LayerCodec& layer(int l) const { return layers_[l]; }

  size_t block_bytes() const { return block_bytes_; }
  // Offset of layer l's K page in a block; its V page follows at
  // + k_page_bytes(l).
  size_t layer_offset(int l) const { return layer_offsets_[l]; }
  size_t k_page_bytes(int l) const { return k_page_bytes_[l]; }
  size_t v_page_bytes(int l) const { return v_page_bytes_[l]; }
  // Bytes of layers [first, last) of a block: a contiguous range.
  size_t layer_range_bytes(int first, int last) const;
  const BlockBytes& block_accounting() const { return accounting_; }
  // Geometry of layer l's K or V page region for `num_blocks` blocks stored
  // contiguously (used by kernels that address rows by flat slot).
  PageGeometry k_geometry(int l) const;
  PageGeometry v_geometry(int l) const;

 private:
  ModelCodec() = default;
  ModelShape shape_;
  CodecOptions options_;
  std::vector<LayerCodec> layers_;
  std::vector<size_t> layer_offsets_, k_page_bytes_, v_page_bytes_;
  size_t block_bytes_ = 0;
  BlockBytes accounting_;
};

// Validates a shape: positive sizes, q heads a multiple of kv heads, head dim
// in [8, 1024], block size in [1, 4096]. INVALID_ARGUMENT naming the field.
absl::Status ValidateShape(const ModelShape& shape);

}  // namespace tqkv

#endif  // TQKV_CODEC_MODEL_CODEC_H_
