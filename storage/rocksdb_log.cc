#include "storage/rocksdb_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

namespace tqkv::storage {

std::shared_ptr<RocksDbLog> RocksDbLog::Open(const std::string& path, uint64_t max_bytes) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::rename(path.c_str(), (path + ".old").c_str());
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  return std::shared_ptr<RocksDbLog>(new RocksDbLog(fd));
}

RocksDbLog::~RocksDbLog() {
  if (fd_ >= 0) ::close(fd_);
}

rocksdb::Status RocksDbLog::CloseImpl() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  return rocksdb::Status::OK();
}

void RocksDbLog::Logv(const char* format, va_list ap) {
  if (fd_ < 0) return;
  char line[4096];
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  ::gmtime_r(&ts.tv_sec, &tm);
  int n = std::snprintf(line, sizeof(line), "%04d/%02d/%02d-%02d:%02d:%02d.%06ld ",
                        tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                        tm.tm_sec, ts.tv_nsec / 1000);
  int m = std::vsnprintf(line + n, sizeof(line) - n - 1, format, ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : std::min<size_t>(m, sizeof(line) - n - 2));
  line[len++] = '\n';
  if (::write(fd_, line, len) != static_cast<ssize_t>(len)) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace tqkv::storage
