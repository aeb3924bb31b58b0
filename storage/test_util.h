// Helpers shared by storage tests: a fresh temporary directory per test.
#ifndef TQKV_STORAGE_TEST_UTIL_H_
#define TQKV_STORAGE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tqkv::storage {

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
