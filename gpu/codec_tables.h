// DeviceCodecTables: device copies of one ModelCodec's rotation signs, QR
// matrices, codebooks, QJL matrices and channel maps, plus the GpuComponent
// descriptors that point at them (one per layer, kv head and K|V). Built
// once per model from the tables the CPU computed (RowCodec::groups()),
// with one quantisation table per codebook the specialised encode can use
// (gpu/quant_lut.h; GpuGroup::lut).
//
// Thread safety: immutable after Upload; safe to share.
#ifndef TQKV_GPU_CODEC_TABLES_H_
#define TQKV_GPU_CODEC_TABLES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/model_codec.h"
#include "gpu/cuda_util.h"
#include "gpu/gpu_codec.h"

namespace tqkv::gpu {

// Fills a descriptor from a RowCodec; table pointers are left null and
// lut_cells 0 (tests and Upload patch them).
GpuComponent DescribeComponent(const RowCodec& codec);

class DeviceCodecTables {
 public:
  // Uploads every table with synchronous copies. RESOURCE_EXHAUSTED /
  // UNAVAILABLE from CUDA; UNIMPLEMENTED for groups wider than
  // kMaxGroupChannels channels.
  static absl::StatusOr<std::unique_ptr<DeviceCodecTables>> Upload(const ModelCodec& codec);

  // Device array [kv_heads] of layer l's descriptors for component c.
  const GpuComponent* device(int layer, Component c) const {
    return components_.as<GpuComponent>() + (static_cast<size_t>(layer) * 2 + static_cast<int>(c)) * heads_;
  }
  // Host copy (device pointers inside) of one descriptor.
  const GpuComponent& host(int layer, int head, Component c) const {
    return host_[(static_cast<size_t>(layer) * 2 + static_cast<int>(c)) * heads_ + head];
  }
  // Layer l's K rotation signs, [kv_heads][s1, s2][dim], when every kv
  // head's K component is one Hadamard group over all dim channels with no
  // channel map and head 0's block structure (AttentionLaunch::k_signs);
  // else null.
  const float* k_head_signs(int layer) const {
    return k_signs_[layer] == SIZE_MAX ? nullptr : floats_.as<float>() + k_signs_[layer];
  }
  // Widest channel group of layer l over K and V (kernel dispatch).
  int max_group_channels(int layer) const { return max_group_[layer]; }
  // Every kv head of layer l has one channel group and the same K codebook
  // (and the same V codebook) table: AttentionLaunch::uniform_codebooks.
  bool uniform_codebooks(int layer) const {
    for (int c = 0; c < 2; ++c)
      for (int h = 0; h < heads_; ++h) {
        const GpuComponent& x = host_[(static_cast<size_t>(layer) * 2 + c) * heads_ + h];
        const GpuComponent& x0 = host_[(static_cast<size_t>(layer) * 2 + c) * heads_];
        if (x.num_groups != 1 || x0.num_groups != 1 || x.groups[0].centroids != x0.groups[0].centroids)
          return false;
      }
    return true;
  }

 private:
  DeviceCodecTables() = default;
  int heads_ = 0;
  DeviceBuffer floats_, ints_, components_;
  std::vector<GpuComponent> host_;
  std::vector<int> max_group_;
  std::vector<size_t> k_signs_;  // per layer: offset into floats_, or SIZE_MAX
};

// Sets the fields EncodeLaunch and DecodeLaunch share for layer `l`: K and
// V page regions of `num_blocks` pages each at k_pages / v_pages, the flat
// slot list, the layer's device codec tables (and their host copies, which
// select the specialised kernels) and the bad-slot flag.
template <typename Launch>
void SetLayerPages(const ModelCodec& codec, const DeviceCodecTables& tables, int l, uint8_t* k_pages,
                   uint8_t* v_pages, int64_t num_blocks, const int64_t* slots,
                   unsigned long long* bad_slot, Launch* a) {
  const ModelShape& s = codec.shape();
  a->heads = s.num_kv_heads;
  a->dim = s.head_dim;
  a->slots = slots;
  a->k_pages = {k_pages, static_cast<int64_t>(codec.k_page_bytes(l)), s.block_size,
                num_blocks * s.block_size};
  a->v_pages = {v_pages, static_cast<int64_t>(codec.v_page_bytes(l)), s.block_size,
                num_blocks * s.block_size};
  a->k_comp = tables.device(l, Component::kKey);
  a->v_comp = tables.device(l, Component::kValue);
  a->max_group_channels = tables.max_group_channels(l);
  a->bad_slot = bad_slot;
  a->host_k = &tables.host(l, 0, Component::kKey);
  a->host_v = &tables.host(l, 0, Component::kValue);
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_CODEC_TABLES_H_
