// Row encode/decode between dense [tokens, kv_heads, d] tensors and packed
// pages addressed by flat slots (slot = block · block_size + offset).
//
// Slot semantics (reference §3): a negative slot is skipped; a slot at or
// beyond geometry.num_slots() is an error and NOTHING is written (all slots
// are checked before any row is encoded).
#ifndef TQKV_CODEC_PAGE_CODEC_H_
#define TQKV_CODEC_PAGE_CODEC_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "codec/model_codec.h"
#include "codec/tensor.h"
#include "codec/thread_pool.h"

namespace tqkv {

// Checks slots against a geometry: OK, or INVALID_ARGUMENT naming the first
// out-of-range slot and its position.
absl::Status CheckSlots(const int64_t* slots, int64_t n, const PageGeometry& g);

// Encodes k and v (same tokens/heads/dim; heads == layer.num_kv_heads(), dim
// == the codecs' dim) into k_pages / v_pages at `slots` (length k.tokens).
// `pool` may be null (single-threaded). INVALID_ARGUMENT on shape mismatch or
// a bad slot, with nothing written.
absl::Status EncodeToPages(const LayerCodec& layer, const DenseView& k, const DenseView& v,
                           const int64_t* slots, PagesView k_pages, PagesView v_pages,
                           ThreadPool* pool);

// Decodes the rows at `slots` into k_out / v_out ([slots, heads, dim] in their
// dtype; a negative slot leaves its output rows zero).
absl::Status DecodeFromPages(const LayerCodec& layer, const PagesView& k_pages,
                             const PagesView& v_pages, const int64_t* slots, int64_t n,
                             MutableDenseView k_out, MutableDenseView v_out, ThreadPool* pool);

}  // namespace tqkv

#endif  // TQKV_CODEC_PAGE_CODEC_H_
