// A RocksDB file system whose writable files refuse appends with ENOSPC
// while `full` is set: a full disk injected under the real RocksDB and
// segment files (the files, their I/O and the error handling are real).
#ifndef TQKV_STORAGE_FULL_DISK_FS_H_
#define TQKV_STORAGE_FULL_DISK_FS_H_

#include <atomic>
#include <memory>
#include <string>

#include "rocksdb/file_system.h"

namespace tqkv::storage {

class FullWhenSet final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FullWhenSet(std::unique_ptr<rocksdb::FSWritableFile> f, const std::atomic<bool>* full)
      : FSWritableFileOwnerWrapper(std::move(f)), full_(full) {}
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           rocksdb::IODebugContext* d) override {
    if (*full_) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    return target()->Append(data, o, d);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           const rocksdb::DataVerificationInfo& v, rocksdb::IODebugContext* d) override {
    if (*full_) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    return target()->Append(data, o, v, d);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t off, const rocksdb::IOOptions& o,
                                     rocksdb::IODebugContext* d) override {
    if (*full_) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    return target()->PositionedAppend(data, off, o, d);
  }

 private:
  const std::atomic<bool>* full_;
};

class FullDiskFs final : public rocksdb::FileSystemWrapper {
 public:
  FullDiskFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "FullDiskFs"; }
  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* out,
                                    rocksdb::IODebugContext* d) override {
    std::unique_ptr<rocksdb::FSWritableFile> f;
    rocksdb::IOStatus s = target()->NewWritableFile(name, o, &f, d);
    if (s.ok()) *out = std::make_unique<FullWhenSet>(std::move(f), &full);
    return s;
  }
  std::atomic<bool> full{false};
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_FULL_DISK_FS_H_
