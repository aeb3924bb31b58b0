// Test harness: runs the real tqkv-server binary as a child process on
// port 0 with a temporary data directory, reads the bound addresses from
// its stdout, and stops it gracefully (SIGTERM) or hard (SIGKILL).
#ifndef TQKV_TESTS_SERVER_PROCESS_H_
#define TQKV_TESTS_SERVER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tqkv::testing {

class ServerProcess {
 public:
  // Starts `tqkv-server --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0
  // --data_dir <data_dir> --threads=1 --backend=<TestBackend()> <flags...>` and waits (up to 30 s) for both
  // "listening on" lines. UNAVAILABLE if the process exits first.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const std::string& data_dir,
                                                              const std::vector<std::string>& flags);
  // SIGKILLs the process if it is still running.
  ~ServerProcess();

  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  // Empty when the data plane is off.
  const std::string& data_address() const { return data_address_; }
  pid_t pid() const { return pid_; }

  // SIGTERM and wait; returns the exit code (or -signal).
  int Stop();
  // SIGKILL and wait.
  void Kill();

 private:
  int Wait();
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string address_, metrics_address_, data_address_;
};

// Path of the tqkv-server binary in the test's runfiles.
std::string ServerBinary();
// The --backend the tests run the server with: $TQKV_TEST_BACKEND, or cpu.
std::string TestBackend();
// A fresh empty directory under $TEST_TMPDIR.
std::string MakeTempDir(const std::string& prefix);
// Body of GET http://address/path (HTTP/1.0), or an error.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path);
// Runs `promtool check metrics` on `text`; returns its combined output and
// sets *ok to whether it exited 0.
std::string PromtoolCheck(const std::string& text, bool* ok);

}  // namespace tqkv::testing

#endif  // TQKV_TESTS_SERVER_PROCESS_H_
