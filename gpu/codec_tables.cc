#include "gpu/codec_tables.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu/quant_lut.h"

namespace tqkv::gpu {
namespace {

// Offsets into the float/int pools, patched into pointers after upload.
struct PendingGroup {
  size_t s1 = SIZE_MAX, s2 = SIZE_MAX, qr = SIZE_MAX, cent = SIZE_MAX, bound = SIZE_MAX,
         qjl = SIZE_MAX, map = SIZE_MAX, lut = SIZE_MAX;
};

// One codebook's tables: centroids + boundaries in the float pool, the
// quantisation table (if any) in the int pool.
struct SharedCodebook {
  size_t cent = SIZE_MAX, lut = SIZE_MAX;
  int lut_cells = 0;
  float lut_scale = 0, lut_offset = 0;
};

// Layer's K rotation signs of every head, [heads][s1, s2][dim], pushed
// when the heads share one layout (AttentionLaunch::k_signs): one Hadamard
// group over all dim channels, no channel map, head 0's blocks. Returns the
// offset, or SIZE_MAX.
template <typename Push>
size_t PushHeadSigns(const LayerCodec& layer, int heads, int dim, Push& push) {
  auto regular = [&](const RowCodec& rc) {
    if (rc.groups().size() != 1) return false;
    const RowCodec::Group& g = rc.groups()[0];
    return g.rotation.kind() != RotationKind::kQr && g.identity && g.layout.channels == dim &&
           g.rotation.blocks() == layer.k(0).groups()[0].rotation.blocks();
  };
  for (int h = 0; h < heads; ++h)
    if (!regular(layer.k(h))) return SIZE_MAX;
  std::vector<float> signs;
  signs.reserve(static_cast<size_t>(heads) * 2 * dim);
  for (int h = 0; h < heads; ++h) {
    const Rotation& r = layer.k(h).groups()[0].rotation;
    signs.insert(signs.end(), r.signs1().begin(), r.signs1().end());
    signs.insert(signs.end(), r.signs2().begin(), r.signs2().end());
  }
  return push(signs);
}

}  // namespace

GpuComponent DescribeComponent(const RowCodec& codec) {
  GpuComponent c;
  const RowLayout& layout = codec.layout();
  c.dim = codec.dim();
  c.row_bytes = static_cast<int32_t>(codec.row_bytes());
  c.state_size = codec.query_state_size();
  switch (layout.spec.kind) {
    case ComponentSpec::Kind::kDense: c.kind = kGpuDense; break;
    case ComponentSpec::Kind::kMse: c.kind = kGpuMse; break;
    case ComponentSpec::Kind::kRecipe: c.kind = kGpuRecipe; break;
  }
  if (c.kind == kGpuDense) {
    c.state_size = c.dim;
    return c;
  }
  c.num_groups = static_cast<int32_t>(codec.groups().size());
  int state = 0;
  for (int gi = 0; gi < c.num_groups; ++gi) {
    const RowCodec::Group& src = codec.groups()[gi];
    GpuGroup& g = c.groups[gi];
    g.channels = src.layout.channels;
    g.mse_bits = src.layout.mse_bits;
    g.qjl = src.layout.qjl ? 1 : 0;
    g.fp16_norms = src.layout.fp16_norms ? 1 : 0;
    g.index_offset = static_cast<int32_t>(src.layout.index_offset);
    g.sign_offset = static_cast<int32_t>(src.layout.sign_offset);
    g.norm_offset = static_cast<int32_t>(src.layout.norm_offset);
    g.residual_offset = static_cast<int32_t>(src.layout.residual_offset);
    if (src.rotation.kind() == RotationKind::kQr) {
      g.rotation = kGpuQr;
    } else {
      g.rotation = kGpuHadamard;
      const std::vector<int>& blocks = src.rotation.blocks();
      g.num_blocks = static_cast<int32_t>(blocks.size());
      for (size_t b = 0; b < blocks.size() && b < kMaxHadamardBlocks; ++b) {
        g.block_size[b] = blocks[b];
        // Exactly the CPU's expression (codec/rotation.cc).
        g.block_scale[b] = 1.0f / std::sqrt(static_cast<float>(blocks[b]));
      }
    }
    g.num_boundaries = static_cast<int32_t>(src.codebook->boundaries_f.size());
    g.qjl_scale = src.qjl_scale;
    g.state_offset = state;
    state += g.channels * (g.qjl ? 2 : 1);
    c.max_group_channels = std::max(c.max_group_channels, g.channels);
  }
  return c;
}

absl::StatusOr<std::unique_ptr<DeviceCodecTables>> DeviceCodecTables::Upload(const ModelCodec& codec) {
  const ModelShape& s = codec.shape();
  std::unique_ptr<DeviceCodecTables> t(new DeviceCodecTables());
  t->heads_ = s.num_kv_heads;
  std::vector<float> floats;
  std::vector<int32_t> ints;
  std::vector<PendingGroup> pending;
  std::map<const void*, SharedCodebook> shared;
  std::map<std::pair<int, int>, size_t> qjl_shared;  // (component, group): QjlSeed depends on nothing else
  auto push = [&floats](const std::vector<float>& v) {
    size_t off = floats.size();
    floats.insert(floats.end(), v.begin(), v.end());
    return off;
  };
  t->max_group_.assign(s.num_layers, 0);
  for (int l = 0; l < s.num_layers; ++l) {
    for (int c = 0; c < 2; ++c) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        const RowCodec& rc = c == 0 ? codec.layer(l).k(h) : codec.layer(l).v(h);
        GpuComponent gc = DescribeComponent(rc);
        if (gc.max_group_channels > kMaxGroupChannels)
          return absl::UnimplementedError(absl::StrCat("CUDA kernels support channel groups up to ",
                                                       kMaxGroupChannels, ", layer ", l, " has ",
                                                       gc.max_group_channels));
        t->max_group_[l] = std::max(t->max_group_[l], gc.max_group_channels);
        for (int gi = 0; gi < gc.num_groups; ++gi) {
          const RowCodec::Group& src = rc.groups()[gi];
          PendingGroup p;
          if (src.rotation.kind() == RotationKind::kQr) {
            p.qr = push(src.rotation.matrix());
          } else {
            p.s1 = push(src.rotation.signs1());
            p.s2 = push(src.rotation.signs2());
          }
          auto it = shared.find(src.codebook);
          if (it == shared.end()) {
            SharedCodebook sc;
            sc.cent = push(src.codebook->centroids_f);
            push(src.codebook->boundaries_f);
            // Built once per codebook; none (the encode searches) when the
            // specialised encode has no tables for these bits or none fits.
            const std::vector<float>& b = src.codebook->boundaries_f;
            const int cap = LutMaxCells(src.layout.mse_bits);
            std::optional<QuantLut> lut;
            if (cap > 0) lut = BuildQuantLut(b.data(), static_cast<int>(b.size()), cap);
            if (lut.has_value()) {
              sc.lut = ints.size();
              ints.insert(ints.end(), lut->words.begin(), lut->words.end());
              sc.lut_cells = lut->cells;
              sc.lut_scale = lut->scale;
              sc.lut_offset = lut->offset;
            }
            it = shared.emplace(src.codebook, sc).first;
          }
          const SharedCodebook& sc = it->second;
          p.cent = sc.cent;
          p.bound = sc.cent + src.codebook->centroids_f.size();
          p.lut = sc.lut;
          gc.groups[gi].lut_cells = sc.lut_cells;
          gc.groups[gi].lut_scale = sc.lut_scale;
          gc.groups[gi].lut_offset = sc.lut_offset;
          if (src.layout.qjl) {
            auto q = qjl_shared.find({c, gi});
            if (q == qjl_shared.end()) q = qjl_shared.emplace(std::make_pair(c, gi), push(src.qjl)).first;
            p.qjl = q->second;
          }
          if (!src.identity) {
            p.map = ints.size();
            ints.insert(ints.end(), src.channels.begin(), src.channels.end());
          }
          pending.push_back(p);
        }
        t->host_.push_back(gc);
      }
      if (c == 0) t->k_signs_.push_back(PushHeadSigns(codec.layer(l), s.num_kv_heads, s.head_dim, push));
    }
  }
  if (!floats.empty()) {
    absl::Status st = t->floats_.Reserve(floats.size() * sizeof(float));
    if (!st.ok()) return st;
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(t->floats_.get(), floats.data(), floats.size() * sizeof(float),
                                       cudaMemcpyHostToDevice), "upload codec tables");
  }
  if (!ints.empty()) {
    absl::Status st = t->ints_.Reserve(ints.size() * sizeof(int32_t));
    if (!st.ok()) return st;
    TQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(t->ints_.get(), ints.data(), ints.size() * sizeof(int32_t),
                                       cudaMemcpyHostToDevice), "upload channel maps");
  }
  const float* fb = t->floats_.as<float>();
  const int32_t* ib = t->ints_.as<int32_t>();
  auto fptr = [fb](size_t off) -> const float* { return off == SIZE_MAX ? nullptr : fb + off; };
  size_t pi = 0;
  for (GpuComponent& gc : t->host_) {
    for (int gi = 0; gi < gc.num_groups; ++gi, ++pi) {
      const PendingGroup& p = pending[pi];
      GpuGroup& g = gc.groups[gi];
      g.s1 = fptr(p.s1);
      g.s2 = fptr(p.s2);
      g.qr = fptr(p.qr);
      g.centroids = fptr(p.cent);
      g.boundaries = fptr(p.bound);
      g.qjl_matrix = fptr(p.qjl);
      g.channel_map = p.map == SIZE_MAX ? nullptr : ib + p.map;
      g.lut = p.lut == SIZE_MAX ? nullptr : reinterpret_cast<const uint32_t*>(ib + p.lut);
    }
  }
  absl::Status st = t->components_.Reserve(t->host_.size() * sizeof(GpuComponent));
  if (!st.ok()) return st;
  TQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(t->components_.get(), t->host_.data(),
                                     t->host_.size() * sizeof(GpuComponent), cudaMemcpyHostToDevice),
                          "upload codec descriptors");
  return t;
}

}  // namespace tqkv::gpu
