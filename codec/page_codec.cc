#include "codec/page_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tqkv {
namespace {

absl::Status CheckDense(const LayerCodec& layer, int64_t tokens, int heads, int dim,
                        const char* what) {
  if (heads != layer.num_kv_heads())
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", heads, " kv heads, the model has ", layer.num_kv_heads()));
  if (dim != layer.k(0).dim())
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has head dim ", dim, ", the model has ", layer.k(0).dim()));
  if (tokens < 0) return absl::InvalidArgumentError(absl::StrCat(what, " has negative tokens"));
  return absl::OkStatus();
}

absl::Status CheckPages(const PagesView& p, size_t row_bytes, const char* what) {
  if (p.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " pages are null"));
  if (p.geometry.row_bytes != row_bytes)
    return absl::InvalidArgumentError(absl::StrCat(what, " page rows are ", p.geometry.row_bytes,
                                                   " bytes, the format needs ", row_bytes));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSlots(const int64_t* slots, int64_t n, const PageGeometry& g) {
  const int64_t limit = g.num_slots();
  for (int64_t i = 0; i < n; ++i)
    if (slots[i] >= limit)
      return absl::InvalidArgumentError(absl::StrCat("slot ", slots[i], " at position ", i,
                                                     " is outside the ", limit, " allocated slots"));
  return absl::OkStatus();
}

absl::Status EncodeToPages(const LayerCodec& layer, const DenseView& k, const DenseView& v,
                           const int64_t* slots, PagesView k_pages, PagesView v_pages,
                           ThreadPool* pool) {
  TQ_RETURN_IF_ERROR(CheckDense(layer, k.tokens, k.heads, k.dim, "K"));
  TQ_RETURN_IF_ERROR(CheckDense(layer, v.tokens, v.heads, v.dim, "V"));
  if (k.tokens != v.tokens)
    return absl::InvalidArgumentError(
        absl::StrCat("K has ", k.tokens, " tokens but V has ", v.tokens));
  TQ_RETURN_IF_ERROR(CheckPages(k_pages, layer.k_row_bytes(), "K"));
  TQ_RETURN_IF_ERROR(CheckPages(v_pages, layer.v_row_bytes(), "V"));
  TQ_RETURN_IF_ERROR(CheckSlots(slots, k.tokens, k_pages.geometry));
  TQ_RETURN_IF_ERROR(CheckSlots(slots, k.tokens, v_pages.geometry));
  const int heads = k.heads, dim = k.dim;
  auto work = [&](int64_t begin, int64_t end) {
    float x[1024];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / heads;
      const int h = static_cast<int>(i % heads);
      if (slots[t] < 0) continue;
      ToFloat(k.dtype, k.row(t, h), x, dim);
      layer.k(h).Encode(x, k_pages.data + k_pages.geometry.offset(slots[t], h));
      ToFloat(v.dtype, v.row(t, h), x, dim);
      layer.v(h).Encode(x, v_pages.data + v_pages.geometry.offset(slots[t], h));
    }
  };
  const int64_t rows = k.tokens * heads;
  if (pool) {
    pool->ParallelFor(rows, 256, work);
  } else {
    work(0, rows);
  }
  return absl::OkStatus();
}

absl::Status DecodeFromPages(const LayerCodec& layer, const PagesView& k_pages,
                             const PagesView& v_pages, const int64_t* slots, int64_t n,
                             MutableDenseView k_out, MutableDenseView v_out, ThreadPool* pool) {
  TQ_RETURN_IF_ERROR(CheckDense(layer, k_out.tokens, k_out.heads, k_out.dim, "K output"));
  TQ_RETURN_IF_ERROR(CheckDense(layer, v_out.tokens, v_out.heads, v_out.dim, "V output"));
  if (k_out.tokens != n || v_out.tokens != n)
    return absl::InvalidArgumentError("output tensors must have one token per slot");
  TQ_RETURN_IF_ERROR(CheckPages(k_pages, layer.k_row_bytes(), "K"));
  TQ_RETURN_IF_ERROR(CheckPages(v_pages, layer.v_row_bytes(), "V"));
  TQ_RETURN_IF_ERROR(CheckSlots(slots, n, k_pages.geometry));
  TQ_RETURN_IF_ERROR(CheckSlots(slots, n, v_pages.geometry));
  const int heads = k_out.heads, dim = k_out.dim;
  auto work = [&](int64_t begin, int64_t end) {
    float x[1024];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / heads;
      const int h = static_cast<int>(i % heads);
      if (slots[t] < 0) {
        std::memset(k_out.row(t, h), 0, dim * DTypeSize(k_out.dtype));
        std::memset(v_out.row(t, h), 0, dim * DTypeSize(v_out.dtype));
        continue;
      }
      layer.k(h).Decode(k_pages.data + k_pages.geometry.offset(slots[t], h), x);
      FromFloat(k_out.dtype, x, k_out.row(t, h), dim);
      layer.v(h).Decode(v_pages.data + v_pages.geometry.offset(slots[t], h), x);
      FromFloat(v_out.dtype, x, v_out.row(t, h), dim);
    }
  };
  const int64_t rows = n * heads;
  if (pool) {
    pool->ParallelFor(rows, 256, work);
  } else {
    work(0, rows);
  }
  return absl::OkStatus();
}

}  // namespace tqkv
