// Helpers shared by storage tests: temporary directories, test payloads.
#ifndef TQKV_STORAGE_TEST_UTIL_H_
#define TQKV_STORAGE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "storage/block_key.h"

namespace tqkv::storage {

// Deterministic bytes derived from the key, a size and a salt: two blocks
// share a payload only if all three match.
inline std::string TestPayload(const BlockKey& key, size_t size, uint32_t salt = 0) {
  uint64_t x = 0x9e3779b97f4a7c15ULL ^ key.model_id ^ (uint64_t{salt} << 32) ^ size;
  for (char c : key.tenant + "|" + key.block_hash) x = (x ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    out[i] = static_cast<char>((x * 0x2545F4914F6CDD1DULL) >> 56);
  }
  return out;
}

// Accounting whose fields are distinct functions of the size.
inline BlockAccounting TestAccounting(uint64_t size) {
  return {.dense_equivalent_bytes = 4 * size,
          .packed_k_bytes = size / 2,
          .packed_v_bytes = size / 3,
          .norms_metadata_bytes = 7,
          .dense_window_bytes = size / 8,
          .total_bytes = size};
}

// Creates a unique empty directory under $TEST_TMPDIR (or /tmp) and removes
// it, recursively, on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/tqkv_storage_XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_TEST_UTIL_H_
