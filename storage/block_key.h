// Block identity and the value types every storage component shares: the
// block key, the tier enum and the per-block byte accounting.
//
// Key encoding (used for RocksDB keys; documented contract, never change
// without bumping SpillStore's format version):
//
//   EncodeBlockKey(k) = varint32(len(tenant)) | tenant
//                     | big-endian uint64 model_id
//                     | block_hash                      (1..64 bytes, to the end)
//
// The tenant is length-prefixed so that no tenant's keys are a prefix of
// another's; the model id is big-endian so that one model's blocks form one
// contiguous key range (EncodeModelPrefix) and models sort numerically.
#ifndef TQKV_STORAGE_BLOCK_KEY_H_
#define TQKV_STORAGE_BLOCK_KEY_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tqkv::storage {

// Limits enforced by ValidateBlockKey.
inline constexpr size_t kMaxTenantBytes = 256;
inline constexpr size_t kMinBlockHashBytes = 1;
inline constexpr size_t kMaxBlockHashBytes = 64;

// Where a block is resident. kGpu is reserved for the GPU tier that will sit
// above host memory; BlockStore never reports it today. A block may be
// resident in more than one tier at once (for example a block promoted from
// disk keeps its disk copy); "the" tier of a block is the fastest one.
enum class Tier : uint8_t { kGpu = 0, kHost = 1, kDisk = 2 };
inline constexpr int kNumTiers = 3;

// "gpu", "host" or "disk" (stable: used as a metric label).
const char* TierName(Tier tier);

// Byte counts that the codec layer computes for one block. Storage treats
// them as opaque numbers: it stores them with the block and sums them in
// statistics. total_bytes is the payload size and must equal the size given
// to BlockStore::BeginPut.
struct BlockAccounting {
  uint64_t dense_equivalent_bytes = 0;  // what the block would take in fp16
  uint64_t packed_k_bytes = 0;          // packed K pages
  uint64_t packed_v_bytes = 0;          // packed V pages
  uint64_t norms_metadata_bytes = 0;    // norms, scales and other side data
  uint64_t dense_window_bytes = 0;      // rows kept uncompressed
  uint64_t total_bytes = 0;             // payload size

  BlockAccounting& operator+=(const BlockAccounting& o);
  BlockAccounting& operator-=(const BlockAccounting& o);
  friend bool operator==(const BlockAccounting&, const BlockAccounting&) = default;
};

// Identifies one block. Value type; cheap enough to copy (short strings).
struct BlockKey {
  std::string tenant;  // 0..kMaxTenantBytes bytes, any content
  uint64_t model_id = 0;
  std::string block_hash;  // kMinBlockHashBytes..kMaxBlockHashBytes bytes

  friend bool operator==(const BlockKey&, const BlockKey&) = default;

  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine(std::move(h), k.tenant, k.model_id, k.block_hash);
  }
};

// OK, or INVALID_ARGUMENT naming the violated limit.
absl::Status ValidateBlockKey(const BlockKey& key);
absl::Status ValidateBlockHash(absl::string_view hash);
absl::Status ValidateTenant(absl::string_view tenant);

// The encoding described at the top of this file. REQUIRES: key is valid.
std::string EncodeBlockKey(const BlockKey& key);
// The prefix shared by every block key of (tenant, model_id).
std::string EncodeModelPrefix(absl::string_view tenant, uint64_t model_id);
// Inverse of EncodeBlockKey; INVALID_ARGUMENT on malformed input or if the
// decoded key fails ValidateBlockKey.
absl::StatusOr<BlockKey> DecodeBlockKey(absl::string_view encoded);

// Printable form for error messages: tenant/model/hex(hash).
std::string DebugString(const BlockKey& key);

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_BLOCK_KEY_H_
