// AtRestCipher: encryption at rest of the disk tier's payloads, AES-256-GCM
// (OpenSSL) with a key per tenant derived by HKDF-SHA256 from a master key.
//
// Key file: one key a line, `ID HEX`: ID a decimal key id in 1..4294967295,
// HEX 64 hex digits (32 random bytes, e.g. `openssl rand -hex 32`); blank
// lines and lines starting with '#' are ignored. The highest id is the
// current key: it seals every record written from now on; the others only
// open records sealed earlier. Rotation: add a line with a higher id and
// restart; keep the old lines while records sealed with them may remain
// (a record is re-sealed with the current key when it is written again).
// The file must deny group and others any access.
//
// Tenant key: HKDF-SHA256(ikm = master key, salt = "tqkv at-rest v1",
// info = "tenant:" + tenant), 32 bytes. Key check of a master key: the first
// 8 bytes of HKDF(ikm = master key, salt as above, info = "key check"), so
// a record names the key it needs without revealing anything of it.
//
// Sealed record, little-endian:
//   u8  envelope version (1)   u8 reserved (0)   u16 reserved (0)
//   u32 key id                 u64 key check
//   12 bytes nonce (random)    ciphertext (as long as the plaintext)
//   16 bytes GCM tag
// The additional authenticated data is the 24-byte header followed by the
// caller's `aad` (the block's encoded key), so a record moved under another
// key, or edited, fails to open.
//
// Thread safety: immutable after creation except a derived-key cache under
// its own mutex; every method may run concurrently.
#ifndef TQKV_STORAGE_AT_REST_CIPHER_H_
#define TQKV_STORAGE_AT_REST_CIPHER_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "storage/host_pool.h"

namespace tqkv::storage {

class AtRestCipher {
 public:
  using Key = std::array<uint8_t, 32>;
  // Bytes a sealed record adds to its plaintext (header, nonce, tag).
  static constexpr size_t kOverheadBytes = 24 + 12 + 16;

  // Reads the key file. NOT_FOUND if it cannot be read; FAILED_PRECONDITION
  // naming the file and its mode when group or others have any permission
  // on it; INVALID_ARGUMENT naming the line for a malformed line, a
  // duplicate id, or a file without keys.
  static absl::StatusOr<std::unique_ptr<AtRestCipher>> FromFile(const std::string& path);
  // The keys of a key file's contents (no permission check).
  static absl::StatusOr<std::unique_ptr<AtRestCipher>> FromString(absl::string_view contents);

  uint32_t current_key_id() const { return current_; }

  // `plaintext` sealed with the current key of `tenant`, bound to `aad`.
  // INTERNAL when OpenSSL fails (no randomness, out of memory).
  absl::StatusOr<std::string> Seal(absl::string_view tenant, absl::string_view aad,
                                   absl::string_view plaintext) const;

  // The plaintext of a sealed record in a new buffer. FAILED_PRECONDITION
  // when the key it names is not in the key file, or the file's key of that
  // id is another key (its key check differs): the record may be intact,
  // the key file must be fixed. DATA_LOSS when the record is truncated, has
  // an unknown envelope version, or fails authentication (edited, or moved
  // under another tenant or block key). Never returns unauthenticated bytes.
  // The plaintext is allocated as HostBuffer::Allocate(size, arena) does.
  absl::StatusOr<std::unique_ptr<HostBuffer>> Open(absl::string_view tenant, absl::string_view aad,
                                                   absl::string_view sealed, HostArena* arena = nullptr) const;

 private:
  struct Master {
    Key key;
    uint64_t check = 0;
  };
  AtRestCipher() = default;
  // The tenant key of master key `id` (derived once, then cached).
  absl::StatusOr<Key> TenantKey(uint32_t id, absl::string_view tenant) const;

  std::map<uint32_t, Master> masters_;
  uint32_t current_ = 0;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, Key> derived_ ABSL_GUARDED_BY(mu_);  // "id/tenant"
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_AT_REST_CIPHER_H_
