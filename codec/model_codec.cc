#include "codec/model_codec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tqkv {
namespace {

// Norm bytes of a row layout (fp32/fp16 norms and residual norms).
size_t NormBytes(const RowLayout& l) {
  size_t n = 0;
  for (const GroupLayout& g : l.groups) {
    size_t w = g.fp16_norms ? 2 : 4;
    n += w + (g.qjl ? w : 0);
  }
  return n;
}

}  // namespace

absl::Status ValidateShape(const ModelShape& s) {
  if (s.num_layers <= 0 || s.num_layers > 1024)
    return absl::InvalidArgumentError(absl::StrCat("num_layers ", s.num_layers, " outside [1, 1024]"));
  if (s.num_kv_heads <= 0 || s.num_kv_heads > 1024)
    return absl::InvalidArgumentError(absl::StrCat("num_kv_heads ", s.num_kv_heads, " outside [1, 1024]"));
  if (s.num_q_heads <= 0 || s.num_q_heads % s.num_kv_heads != 0)
    return absl::InvalidArgumentError(absl::StrCat("num_q_heads ", s.num_q_heads,
                                                   " is not a positive multiple of num_kv_heads ",
                                                   s.num_kv_heads));
  if (s.head_dim < 8 || s.head_dim > 1024)
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", s.head_dim, " outside [8, 1024]"));
  if (s.block_size <= 0 || s.block_size > 4096)
    return absl::InvalidArgumentError(absl::StrCat("block_size ", s.block_size, " outside [1, 4096]"));
  return absl::OkStatus();
}

uint64_t BuildWork(const ModelShape& shape, const CodecOptions& options) {
  const uint64_t d = static_cast<uint64_t>(std::max(shape.head_dim, 0));
  const RotationKind rot = options.rotation.value_or(DefaultRotationKind(shape.head_dim));
  const uint64_t per_rotation = rot == RotationKind::kQr ? 4 * d * d * d / 3 + d * d : 4 * d;
  return static_cast<uint64_t>(std::max(shape.num_layers, 0)) * static_cast<uint64_t>(std::max(shape.num_kv_heads, 0)) *
         2 * per_rotation;
}

absl::StatusOr<std::unique_ptr<ModelCodec>> ModelCodec::Create(const ModelShape& shape,
                                                                const CodecOptions& options,
                                                                const RecipeMetadata* metadata) {
  TQ_RETURN_IF_ERROR(ValidateShape(shape));
  if (options.dense_first_layers < 0 || options.dense_last_layers < 0)
    return absl::InvalidArgumentError("dense_first_layers/dense_last_layers must be >= 0");
  for (const auto& [l, name] : options.layer_formats)
    if (l < 0 || l >= shape.num_layers)
      return absl::InvalidArgumentError(
          absl::StrCat("layer format override for layer ", l, " outside [0, ", shape.num_layers, ")"));
  if (const uint64_t work = BuildWork(shape, options); options.max_build_work != 0 && work > options.max_build_work)
    return absl::ResourceExhaustedError(absl::StrCat(
        "building the codec of this model would take about ", work, " multiply-adds (", shape.num_layers,
        " layers x ", shape.num_kv_heads, " kv heads x K and V, a rotation of d = ", shape.head_dim,
        " each); the limit is ", options.max_build_work,
        ": a head_dim that is a multiple of 16 (block_hadamard) or a power of two (rht) is cheap"));
  std::unique_ptr<ModelCodec> m(new ModelCodec());
  m->shape_ = shape;
  m->options_ = options;
  const RotationKind rot = options.rotation.value_or(DefaultRotationKind(shape.head_dim));
  TQ_ASSIGN_OR_RETURN(Format default_format, ParseFormat(options.format));
  Format dense = *ParseFormat("fp16");
  bool metadata_checked = false;
  m->layers_.resize(shape.num_layers);
  size_t offset = 0;
  uint64_t held = 0;  // estimated codec memory of the layers built so far
  for (int l = 0; l < shape.num_layers; ++l) {
    Format f = default_format;
    if (auto it = options.layer_formats.find(l); it != options.layer_formats.end()) {
      TQ_ASSIGN_OR_RETURN(f, ParseFormat(it->second));
    }
    if (l < options.dense_first_layers || l >= shape.num_layers - options.dense_last_layers) f = dense;
    const LayerChannels* channels = nullptr;
    if (f.needs_metadata()) {
      if (metadata == nullptr)
        return absl::FailedPreconditionError(absl::StrCat(
            "format ", f.name, " (layer ", l, ") needs recipe metadata JSON; none was given"));
      if (!metadata_checked) {
        TQ_RETURN_IF_ERROR(ValidateForModel(*metadata, f.name, shape.head_dim, shape.num_kv_heads));
        metadata_checked = true;
      }
      absl::StatusOr<const LayerChannels*> lc = LayerByIndex(*metadata, l);
      if (!lc.ok())
        return absl::FailedPreconditionError(
            absl::StrCat("recipe metadata has no entry for layer ", l, ": ", lc.status().message()));
      channels = *lc;
    }
    LayerCodec& lc = m->layers_[l];
    lc.format_ = f;
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      std::vector<int> kh, vh;
      if (channels) {
        kh = channels->key[h];
        vh = channels->value[h];
      }
      TQ_ASSIGN_OR_RETURN(auto kc, RowCodec::Create(f.k, shape.head_dim, rot,
                                                    CodecKey{options.seed, uint32_t(l), uint32_t(h),
                                                             Component::kKey},
                                                    f.k.kind == ComponentSpec::Kind::kRecipe ? kh : std::vector<int>{}));
      TQ_ASSIGN_OR_RETURN(auto vc, RowCodec::Create(f.v, shape.head_dim, rot,
                                                    CodecKey{options.seed, uint32_t(l), uint32_t(h),
                                                             Component::kValue},
                                                    f.v.kind == ComponentSpec::Kind::kRecipe ? vh : std::vector<int>{}));
      if (h == 0 && options.max_codec_bytes != 0) {
        // This layer's heads, and the layers after it, cost about what
        // this head does: stop before building what would not fit.
        held += static_cast<uint64_t>(shape.num_kv_heads) * (kc->HeapBytes() + vc->HeapBytes());
        const uint64_t projected = held + static_cast<uint64_t>(shape.num_layers - 1 - l) *
                                              shape.num_kv_heads * (kc->HeapBytes() + vc->HeapBytes());
        if (projected > options.max_codec_bytes)
          return absl::ResourceExhaustedError(absl::StrCat(
              "the codec of this model would hold about ", projected, " bytes (", shape.num_layers, " layers x ",
              shape.num_kv_heads, " kv heads x K and V, ", kc->HeapBytes() + vc->HeapBytes(),
              " bytes each at layer ", l, "); the limit is ", options.max_codec_bytes));
      }
      lc.k_.push_back(std::move(kc));
      lc.v_.push_back(std::move(vc));
    }
    const size_t rows = static_cast<size_t>(shape.block_size) * shape.num_kv_heads;
    m->layer_offsets_.push_back(offset);
    m->k_page_bytes_.push_back(rows * lc.k_row_bytes());
    m->v_page_bytes_.push_back(rows * lc.v_row_bytes());
    offset += m->k_page_bytes_.back() + m->v_page_bytes_.back();
    BlockBytes& a = m->accounting_;
    a.dense_equivalent += rows * 2 * 2 * shape.head_dim;
    if (f.k.kind == ComponentSpec::Kind::kDense) {
      a.dense_rows += rows * (lc.k_row_bytes() + lc.v_row_bytes());
    } else {
      size_t kn = NormBytes(lc.k(0).layout()), vn = NormBytes(lc.v(0).layout());
      a.norms += rows * (kn + vn);
      a.packed_k += rows * (lc.k_row_bytes() - kn);
      a.packed_v += rows * (lc.v_row_bytes() - vn);
    }
  }
  m->block_bytes_ = offset;
  m->accounting_.total = offset;
  return m;
}

size_t ModelCodec::layer_range_bytes(int first, int last) const {
  size_t end = last >= shape_.num_layers ? block_bytes_ : layer_offsets_[last];
  return end - layer_offsets_[first];
}

PageGeometry ModelCodec::k_geometry(int l) const {
  PageGeometry g;
  g.block_size = shape_.block_size;
  g.num_kv_heads = shape_.num_kv_heads;
  g.row_bytes = layers_[l].k_row_bytes();
  g.num_blocks = 1;
  return g;
}

PageGeometry ModelCodec::v_geometry(int l) const {
  PageGeometry g = k_geometry(l);
  g.row_bytes = layers_[l].v_row_bytes();
  return g;
}

}  // namespace tqkv
