// RocksDB's info log for the disk tier, written so that it cannot take the
// process down: RocksDB's own file logger asserts (Debian builds RocksDB
// with assertions) when it writes again after a failed write, which is
// exactly what happens when the disk fills up and RocksDB logs the error.
// This one writes each line with write(2) and drops what the disk refuses.
//
// Thread-safe (one write per line on an O_APPEND descriptor).
#ifndef TQKV_STORAGE_ROCKSDB_LOG_H_
#define TQKV_STORAGE_ROCKSDB_LOG_H_

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <memory>
#include <string>

#include "rocksdb/env.h"

namespace tqkv::storage {

class RocksDbLog final : public rocksdb::Logger {
 public:
  // Appends to `path` (created 0600 if missing); a file over
  // max_bytes at open is renamed to `path`.old first. Logs nothing
  // (but never fails) when the file cannot be opened.
  static std::shared_ptr<RocksDbLog> Open(const std::string& path,
                                          uint64_t max_bytes = uint64_t{64} << 20);
  ~RocksDbLog() override;

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override;
  // Lines the disk refused (full disk, I/O error) since open.
  uint64_t dropped_lines() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  explicit RocksDbLog(int fd) : fd_(fd) {}
  rocksdb::Status CloseImpl() override;

  int fd_;  // -1: not open
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_ROCKSDB_LOG_H_
