// MemoryReport: byte accounting of a KV cache against a named baseline.
//
// Every report names its baseline (what the ratio divides: e.g. "fp16 dense
// K+V") and its path (which storage produced the bytes: e.g. "packed pages,
// k4v4"), as the design documents require.
#ifndef TQKV_CODEC_MEMORY_REPORT_H_
#define TQKV_CODEC_MEMORY_REPORT_H_

#include <cstdint>
#include <string>

#include "codec/model_codec.h"

namespace tqkv {

struct MemoryReport {
  std::string baseline = "fp16 dense K+V";
  std::string path;
  uint64_t dense_baseline_bytes = 0;  // what the baseline would store
  uint64_t packed_k_bytes = 0;        // K index/sign bytes
  uint64_t packed_v_bytes = 0;        // V index/sign bytes
  uint64_t norms_metadata_bytes = 0;  // norms, residual norms, per-block metadata
  uint64_t dense_window_bytes = 0;    // rows kept dense (recent window, dense layers)
  uint64_t total_bytes() const {
    return packed_k_bytes + packed_v_bytes + norms_metadata_bytes + dense_window_bytes;
  }
  // dense_baseline_bytes / total_bytes() (0 when empty).
  double ratio() const;
  MemoryReport& operator+=(const MemoryReport& o);
  // One line: "path=... baseline=... dense=... packed_k=... ... ratio=3.76x".
  std::string ToString() const;
};

// Report for `blocks` stored blocks of `codec` plus `dense_tokens` recent
// tokens per layer held dense (fp16 K and V).
MemoryReport ReportForBlocks(const ModelCodec& codec, uint64_t blocks, uint64_t dense_tokens);

}  // namespace tqkv

#endif  // TQKV_CODEC_MEMORY_REPORT_H_
