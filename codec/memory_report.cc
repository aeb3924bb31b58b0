#include "codec/memory_report.h"

#include "absl/strings/str_format.h"

namespace tqkv {

double MemoryReport::ratio() const {
  uint64_t t = total_bytes();
  return t == 0 ? 0.0 : static_cast<double>(dense_baseline_bytes) / static_cast<double>(t);
}

MemoryReport& MemoryReport::operator+=(const MemoryReport& o) {
  dense_baseline_bytes += o.dense_baseline_bytes;
  packed_k_bytes += o.packed_k_bytes;
  packed_v_bytes += o.packed_v_bytes;
  norms_metadata_bytes += o.norms_metadata_bytes;
  dense_window_bytes += o.dense_window_bytes;
  return *this;
}

std::string MemoryReport::ToString() const {
  return absl::StrFormat(
      "path=\"%s\" baseline=\"%s\" dense=%u packed_k=%u packed_v=%u norms_metadata=%u "
      "dense_window=%u total=%u ratio=%.3fx",
      path, baseline, dense_baseline_bytes, packed_k_bytes, packed_v_bytes, norms_metadata_bytes,
      dense_window_bytes, total_bytes(), ratio());
}

MemoryReport ReportForBlocks(const ModelCodec& codec, uint64_t blocks, uint64_t dense_tokens) {
  const BlockBytes& b = codec.block_accounting();
  const ModelShape& s = codec.shape();
  MemoryReport r;
  r.path = absl::StrFormat("packed pages, %s", codec.options().format);
  const uint64_t token_dense = uint64_t(s.num_layers) * s.num_kv_heads * s.head_dim * 2 * 2;
  r.dense_baseline_bytes = blocks * b.dense_equivalent + dense_tokens * token_dense;
  r.packed_k_bytes = blocks * b.packed_k;
  r.packed_v_bytes = blocks * b.packed_v;
  r.norms_metadata_bytes = blocks * b.norms;
  r.dense_window_bytes = blocks * b.dense_rows + dense_tokens * token_dense;
  return r;
}

}  // namespace tqkv
