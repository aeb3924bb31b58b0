// Non-owning views of dense K/V tensors and packed page regions.
#ifndef TQKV_CODEC_TENSOR_H_
#define TQKV_CODEC_TENSOR_H_

#include <cstddef>
#include <cstdint>

#include "codec/dtype.h"
#include "codec/format.h"

namespace tqkv {

// Row-major [tokens, heads, dim] elements of `dtype`.
struct DenseView {
  const void* data = nullptr;
  DType dtype = DType::kF16;
  int64_t tokens = 0;
  int heads = 0;
  int dim = 0;

  size_t row_elems() const { return static_cast<size_t>(dim); }
  size_t bytes() const { return static_cast<size_t>(tokens) * heads * dim * DTypeSize(dtype); }
  const uint8_t* row(int64_t t, int h) const {
    return static_cast<const uint8_t*>(data) +
           (static_cast<size_t>(t) * heads + h) * dim * DTypeSize(dtype);
  }
};

struct MutableDenseView {
  void* data = nullptr;
  DType dtype = DType::kF16;
  int64_t tokens = 0;
  int heads = 0;
  int dim = 0;

  size_t bytes() const { return static_cast<size_t>(tokens) * heads * dim * DTypeSize(dtype); }
  uint8_t* row(int64_t t, int h) const {
    return static_cast<uint8_t*>(data) + (static_cast<size_t>(t) * heads + h) * dim * DTypeSize(dtype);
  }
  DenseView view() const { return {data, dtype, tokens, heads, dim}; }
};

// One page region (K or V of one layer) addressed by flat slot.
struct PagesView {
  uint8_t* data = nullptr;
  PageGeometry geometry;
};

}  // namespace tqkv

#endif  // TQKV_CODEC_TENSOR_H_
