// Byte counts as people write them, for flags and messages:
//
//   ABSL_FLAG(tqkv::ByteSize, host_budget_bytes, tqkv::ByteSize{1ull << 30}, "...");
//   --host_budget_bytes=64GiB   --host_budget_bytes=512MiB   --host_budget_bytes=1073741824
//
// A value is a non-negative number, optionally with a fraction, and a unit:
// none or B (bytes); KiB MiB GiB TiB PiB (powers of 1024; also Ki Mi Gi Ti
// Pi, Kubernetes' spelling); kB KB MB GB TB PB (powers of 1000; also k K M
// G T P). Units are spelled exactly as listed; a value must come to a whole
// number of bytes below 2^64 ("1.5KiB" is 1536; "0.1KiB" is refused).
#ifndef TQKV_BASE_BYTE_SIZE_H_
#define TQKV_BASE_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tqkv {

struct ByteSize {
  uint64_t bytes = 0;
  friend bool operator==(ByteSize, ByteSize) = default;
};

// Parses `text` as above; on failure returns false with a message in *error.
bool ParseByteSize(absl::string_view text, uint64_t* bytes, std::string* error);

// The largest binary unit that divides `bytes` exactly ("64GiB", "1536",
// "0"): parses back to the same value.
std::string ExactByteSize(uint64_t bytes);

// For people reading logs and stats: three significant digits and a binary
// unit ("1.50 GiB", "640 KiB", "17 B").
std::string HumanBytes(uint64_t bytes);

// Abseil flag support.
bool AbslParseFlag(absl::string_view text, ByteSize* out, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

}  // namespace tqkv

#endif  // TQKV_BASE_BYTE_SIZE_H_
