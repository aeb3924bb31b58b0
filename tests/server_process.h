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

// How ServerProcess::Start runs the binary beyond its flags.
struct ServerLaunch {
  // Leave out --listen and --metrics_listen (the server's defaults apply).
  // Default: false.
  bool default_addresses = false;
  // argv words the server runs under (e.g. {"/usr/bin/unshare", "-rn"}: it
  // must exec the server in the same process). Default: none.
  std::vector<std::string> wrapper;
  // File the server's stderr goes to; empty: the test's stderr.
  std::string stderr_path;
};

class ServerProcess {
 public:
  // Starts `tqkv-server --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0
  // --data_dir <data_dir> --threads=1 --backend=<TestBackend()> <flags...>` and waits (up to 30 s) for both
  // "listening on" lines. UNAVAILABLE if the process exits first (the
  // message holds its exit code).
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const std::string& data_dir,
                                                              const std::vector<std::string>& flags,
                                                              const ServerLaunch& launch = {});
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
  // Sends `sig` (e.g. SIGHUP) and returns at once.
  void Signal(int sig);

 private:
  int Wait();
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string address_, metrics_address_, data_address_;
};

// A data file of the test (a path from the workspace root) in its runfiles.
std::string Runfile(const std::string& path);
// Path of the tqkv-server binary in the test's runfiles.
std::string ServerBinary();
// The --backend the tests run the server with: $TQKV_TEST_BACKEND, or cpu.
std::string TestBackend();
// A fresh empty directory under $TEST_TMPDIR.
std::string MakeTempDir(const std::string& prefix);
// Contents of `path` ("" if unreadable).
std::string ReadFileOrEmpty(const std::string& path);
// Body of GET http://address/path (HTTP/1.0), or an error (for a status
// other than 200, INTERNAL with the status line and the body's start).
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path);
// Runs `command` with sh; *output gets what it writes to stdout (add
// "2>&1" to the command for stderr too). Returns its exit code, -1 when it
// did not exit.
int RunShell(const std::string& command, std::string* output);
// Runs `promtool check metrics` on `text`; returns its combined output and
// sets *ok to whether it exited 0.
std::string PromtoolCheck(const std::string& text, bool* ok);

}  // namespace tqkv::testing

#endif  // TQKV_TESTS_SERVER_PROCESS_H_
