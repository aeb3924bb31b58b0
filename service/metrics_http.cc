#include "service/metrics_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <prometheus/text_serializer.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "service/net_address.h"

namespace tqkv::service {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxRequestBytes = 16 << 10;

std::string ErrnoText(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// Waits until `fd` has `events` or the deadline passes (false).
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, static_cast<int>(left.count()));
    if (rc > 0) return (p.revents & (events | POLLHUP | POLLERR)) != 0;
    if (rc < 0 && errno != EINTR) return false;
  }
}

// One connection's byte stream, plain or TLS, with a deadline on each step.
class Stream {
 public:
  Stream(int fd, std::unique_ptr<TlsSession> tls, Clock::time_point deadline)
      : fd_(fd), tls_(std::move(tls)), deadline_(deadline) {}

  // TLS: completes the handshake; false when it fails or times out.
  bool Handshake() {
    if (!tls_) return true;
    for (;;) {
      const TlsIo io = tls_->Handshake();
      if (io == TlsIo::kDone) return true;
      if (!Wait(io)) return false;
    }
  }
  // Up to n bytes; 0 at end of stream, error or deadline.
  size_t Read(char* p, size_t n) {
    for (;;) {
      if (tls_) {
        TlsIo io;
        const size_t got = tls_->Read(p, n, &io);
        if (got > 0) return got;
        if (!Wait(io)) return 0;
        continue;
      }
      const ssize_t got = recv(fd_, p, n, 0);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno == EINTR) continue;
      if (errno != EAGAIN || !WaitFor(fd_, POLLIN, deadline_)) return 0;
    }
  }
  bool WriteAll(const std::string& s) {
    size_t at = 0;
    while (at < s.size()) {
      if (tls_) {
        TlsIo io;
        const size_t put = tls_->Write(s.data() + at, s.size() - at, &io);
        if (put > 0) {
          at += put;
        } else if (!Wait(io)) {
          return false;
        }
        continue;
      }
      const ssize_t put = send(fd_, s.data() + at, s.size() - at, MSG_NOSIGNAL);
      if (put > 0) {
        at += static_cast<size_t>(put);
      } else if (put < 0 && errno == EINTR) {
        continue;
      } else if (put < 0 && errno == EAGAIN) {
        if (!WaitFor(fd_, POLLOUT, deadline_)) return false;
      } else {
        return false;
      }
    }
    if (tls_) tls_->Shutdown();
    return true;
  }
  const PeerCertificate* peer() const { return tls_ ? &tls_->peer() : nullptr; }
  std::string tls_error() const { return tls_ ? tls_->error() : std::string(); }

 private:
  bool Wait(TlsIo io) {
    if (io == TlsIo::kWantRead) return WaitFor(fd_, POLLIN, deadline_);
    if (io == TlsIo::kWantWrite) return WaitFor(fd_, POLLOUT, deadline_);
    return false;
  }
  const int fd_;
  std::unique_ptr<TlsSession> tls_;
  const Clock::time_point deadline_;
};

std::string Reply(int code, const char* reason, const std::string& body,
                  const std::string& content_type = "text/plain; charset=utf-8",
                  const std::string& extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                      "Connection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricsHttpOptions& options,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables, LineLog* log) {
  if (options.max_connections < 1)
    return absl::InvalidArgumentError("metrics max_connections must be at least 1");
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer(options, log));
  if (options.tls.enabled()) {
    TQ_RETURN_IF_ERROR(CheckServerTls(options.tls));
    // No log: the data plane reloads the same files and logs their reloads.
    TQ_ASSIGN_OR_RETURN(s->tls_, DataPlaneTlsContext::Create(options.tls, nullptr));
  }
  int port = 0;
  TQ_ASSIGN_OR_RETURN(s->listen_fd_, ListenTcp(options.listen, "metrics", 64, &port));
  TQ_ASSIGN_OR_RETURN(auto hp, SplitHostPort(options.listen));
  s->address_ = absl::StrCat(hp.first, ":", port);
  s->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->wake_fd_ < 0) return absl::InternalError(ErrnoText("eventfd"));
  {
    absl::MutexLock l(&s->mu_);
    s->collectables_ = std::move(collectables);
  }
  s->acceptor_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  Shutdown();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void MetricsHttpServer::Add(std::shared_ptr<prometheus::Collectable> c) {
  absl::MutexLock l(&mu_);
  collectables_.push_back(std::move(c));
}

void MetricsHttpServer::Shutdown() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);  // wakes their polls
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> workers;
  {
    absl::MutexLock l(&mu_);
    workers.swap(workers_);
  }
  for (std::thread& t : workers) t.join();
  absl::MutexLock l(&mu_);
  collectables_.clear();
}

void MetricsHttpServer::AcceptLoop() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    absl::MutexLock l(&mu_);
    // Join the workers that are done (their threads have returned or are returning).
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (std::find(finished_.begin(), finished_.end(), it->get_id()) != finished_.end()) {
        std::erase(finished_, it->get_id());
        it->join();
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
    if (stopping_ || static_cast<int>(open_fds_.size()) >= options_.max_connections) {
      close(fd);
      continue;
    }
    open_fds_.insert(fd);
    workers_.emplace_back([this, fd, peer = PeerName(from)] { Serve(fd, peer); });
  }
}

void MetricsHttpServer::Serve(int fd, std::string peer) {
  const Clock::time_point deadline = Clock::now() + absl::ToChronoNanoseconds(options_.io_timeout);
  std::unique_ptr<TlsSession> session;
  bool ok = true;
  if (tls_) {
    absl::StatusOr<std::unique_ptr<TlsSession>> s = TlsSession::Accept(tls_->Current(), fd);
    ok = s.ok();
    if (ok) session = std::move(*s);
  }
  if (ok) {
    Stream stream(fd, std::move(session), deadline);
    if (!stream.Handshake()) {
      if (log_) log_->WriteLimited(absl::StrCat("tqkv-server: metrics TLS handshake from ", peer,
                                                " failed: ", stream.tls_error()));
    } else {
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos && request.size() <= kMaxRequestBytes) {
        const size_t n = stream.Read(buf, sizeof buf);
        if (n == 0) break;
        request.append(buf, n);
      }
      std::string reply;
      if (request.size() > kMaxRequestBytes) {
        reply = Reply(431, "Request Header Fields Too Large", "request headers too large\n");
      } else if (request.find("\r\n\r\n") != std::string::npos) {
        reply = Respond(request, stream.peer(), peer);
      }
      if (!reply.empty()) stream.WriteAll(reply);
    }
  }
  absl::MutexLock l(&mu_);
  open_fds_.erase(fd);
  close(fd);
  finished_.push_back(std::this_thread::get_id());
}

std::string MetricsHttpServer::Respond(const std::string& request, const PeerCertificate* peer,
                                       const std::string& who) {
  const absl::string_view head = absl::string_view(request).substr(0, request.find("\r\n\r\n"));
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  std::vector<absl::string_view> first = absl::StrSplit(lines[0], ' ', absl::SkipEmpty());
  if (first.size() != 3 || !absl::StartsWith(first[2], "HTTP/1."))
    return Reply(400, "Bad Request", "bad request line\n");
  if (first[0] != "GET") return Reply(405, "Method Not Allowed", "only GET\n", "text/plain", "Allow: GET\r\n");
  const absl::string_view path = first[1].substr(0, first[1].find('?'));
  if (path != "/metrics") return Reply(404, "Not Found", "only /metrics is served here\n");

  if (options_.auth != nullptr && options_.auth->enabled()) {
    std::string authorization;
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == absl::string_view::npos) continue;
      if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(lines[i].substr(0, colon)), "authorization"))
        authorization = std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
    absl::StatusOr<Identity> id = options_.auth->AuthorizeScrape(authorization, peer);
    if (!id.ok()) {
      if (log_)
        log_->WriteLimited(absl::StrCat("tqkv-server: metrics scrape from ", who, " refused: ",
                                        id.status().message()));
      const std::string body = absl::StrCat(id.status().message(), "\n");
      if (id.status().code() == absl::StatusCode::kPermissionDenied)
        return Reply(403, "Forbidden", body);
      return Reply(401, "Unauthorized", body, "text/plain; charset=utf-8",
                   "WWW-Authenticate: Bearer realm=\"tqkv metrics\"\r\n");
    }
  }
  return Reply(200, "OK", Exposition(), "text/plain; version=0.0.4; charset=utf-8");
}

std::string MetricsHttpServer::Exposition() {
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables;
  {
    absl::MutexLock l(&mu_);
    collectables = collectables_;
  }
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : collectables) {
    std::vector<prometheus::MetricFamily> f = c->Collect();
    families.insert(families.end(), std::make_move_iterator(f.begin()),
                    std::make_move_iterator(f.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace tqkv::service
