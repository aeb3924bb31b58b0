#include "tests/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tqkv::testing {

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return path;
  return absl::StrCat(srcdir, "/", ws ? ws : "tqkv", "/", path);
}

std::string ServerBinary() { return Runfile("service/tqkv-server"); }

std::string TestBackend() {
  const char* b = std::getenv("TQKV_TEST_BACKEND");
  return b != nullptr && *b != '\0' ? b : "cpu";
}

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(base ? base : "/tmp", "/", prefix, "XXXXXX");
  char* d = mkdtemp(tmpl.data());
  return d ? std::string(d) : std::string();
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return out;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::string& data_dir, const std::vector<std::string>& flags, const ServerLaunch& launch) {
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("pipe failed");
  std::vector<std::string> args = launch.wrapper;
  args.push_back(ServerBinary());
  if (!launch.default_addresses) {
    args.push_back("--listen=127.0.0.1:0");
    args.push_back("--metrics_listen=127.0.0.1:0");
  }
  for (const std::string& a : {"--data_dir=" + data_dir, std::string("--threads=1"),
                               "--backend=" + TestBackend()})
    args.push_back(a);
  args.insert(args.end(), flags.begin(), flags.end());
  int err_fd = -1;
  if (!launch.stderr_path.empty()) {
    err_fd = open(launch.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (err_fd < 0) return absl::InternalError("cannot create " + launch.stderr_path);
  }
  std::vector<char*> argv;  // built before fork: the child only execs
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    if (err_fd >= 0) dup2(err_fd, 2);
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  if (err_fd >= 0) close(err_fd);
  auto p = std::unique_ptr<ServerProcess>(new ServerProcess());
  p->pid_ = pid;
  p->stdout_fd_ = fds[0];
  std::string buf;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (p->address_.empty() || p->metrics_address_.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("server did not announce its ports");
    pollfd pfd{p->stdout_fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[512];
    ssize_t n = read(p->stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) {
      int code = p->Wait();
      return absl::UnavailableError(absl::StrCat("tqkv-server exited with ", code,
                                                 " before announcing its ports; stdout: ", buf));
    }
    buf.append(chunk, n);
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      constexpr char kMetrics[] = "tqkv-server metrics listening on ";
      constexpr char kGrpc[] = "tqkv-server listening on ";
      constexpr char kData[] = "tqkv-server data plane listening on ";
      if (absl::StartsWith(line, kMetrics)) p->metrics_address_ = line.substr(sizeof(kMetrics) - 1);
      else if (absl::StartsWith(line, kData)) p->data_address_ = line.substr(sizeof(kData) - 1);
      else if (absl::StartsWith(line, kGrpc)) p->address_ = line.substr(sizeof(kGrpc) - 1);
    }
  }
  return p;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) Kill();
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

int ServerProcess::Wait() {
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1000;
}

int ServerProcess::Stop() {
  if (pid_ <= 0) return -1000;
  kill(pid_, SIGTERM);
  return Wait();
}

void ServerProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

void ServerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  Wait();
}

absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port))
    return absl::InvalidArgumentError("bad address " + address);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return absl::UnavailableError("connect to " + address + " failed");
  }
  std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::UnavailableError("write failed");
  }
  std::string resp;
  char chunk[4096];
  ssize_t n;
  while ((n = read(fd, chunk, sizeof(chunk))) > 0) resp.append(chunk, n);
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  if (!absl::StartsWith(resp, "HTTP/1.") || body == std::string::npos)
    return absl::InternalError("bad HTTP response: " + resp.substr(0, 200));
  if (resp.find(" 200 ") == std::string::npos || resp.find(" 200 ") > body)
    return absl::InternalError(absl::StrCat("HTTP status not 200: ", resp.substr(0, resp.find("\r\n")),
                                            "; body: ", resp.substr(body + 4, 1000)));
  return resp.substr(body + 4);
}

int RunShell(const std::string& command, std::string* output) {
  output->clear();
  FILE* f = popen(command.c_str(), "r");
  if (f == nullptr) return -1;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) output->append(chunk, n);
  const int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string PromtoolCheck(const std::string& text, bool* ok) {
  const std::string file = MakeTempDir("promtool") + "/metrics.txt";
  std::ofstream(file) << text;
  std::string out;
  *ok = RunShell(absl::StrCat("promtool check metrics < ", file, " 2>&1"), &out) == 0;
  return out;
}

}  // namespace tqkv::testing
