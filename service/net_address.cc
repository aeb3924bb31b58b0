#include "service/net_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tqkv::service {

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not HOST:PORT (port 0..65535)"));
  return std::make_pair(address.substr(0, colon), port);
}

absl::StatusOr<int> ListenTcp(const std::string& address, const char* what, int backlog, int* port) {
  auto errno_text = [](const char* call) { return absl::StrCat(call, ": ", std::strerror(errno)); };
  TQ_ASSIGN_OR_RETURN(auto hp, SplitHostPort(address));
  std::string host = hp.first;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(hp.second);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    return absl::InvalidArgumentError(absl::StrCat(what, " address '", address, "': ", gai_strerror(rc)));
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = errno_text("socket");
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, backlog) != 0) {
      last_error = errno_text("bind/listen");
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot serve ", what, " on ", address, ": ", last_error));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    const std::string error = errno_text("getsockname");
    close(fd);
    return absl::InternalError(absl::StrCat("cannot serve ", what, " on ", address, ": ", error));
  }
  *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

absl::StatusOr<int> ListenUnix(const std::string& path, const char* what, int backlog, unsigned mode) {
  auto fail = [&](absl::StatusCode code, const std::string& why) {
    return absl::Status(code, absl::StrCat("cannot serve ", what, " on unix:", path, ": ", why));
  };
  auto errno_text = [](const char* call) { return absl::StrCat(call, ": ", std::strerror(errno)); };
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    return fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat("a socket path is 1..", sizeof addr.sun_path - 1, " bytes, not ", path.size()));
  std::memcpy(addr.sun_path, path.data(), path.size());
  const auto* sa = reinterpret_cast<const sockaddr*>(&addr);
  struct stat st{};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return fail(absl::StatusCode::kAlreadyExists, "a file that is not a socket is there");
    // A socket file: in use if something accepts on it (a full backlog
    // included: the probe does not block), else left by a process that
    // ended without removing it.
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (probe < 0) return fail(absl::StatusCode::kUnavailable, errno_text("socket"));
    const bool live = connect(probe, sa, sizeof addr) == 0 || (errno != ECONNREFUSED && errno != ENOENT);
    close(probe);
    if (live) return fail(absl::StatusCode::kAlreadyExists, "another process listens on it");
    if (unlink(path.c_str()) != 0 && errno != ENOENT)
      return fail(absl::StatusCode::kUnavailable, errno_text("unlink"));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(absl::StatusCode::kUnavailable, errno_text("socket"));
  // Connections wait for listen(): the mode is set before any is accepted.
  if (bind(fd, sa, sizeof addr) != 0) {
    const std::string error = errno_text("bind");
    close(fd);
    return fail(absl::StatusCode::kUnavailable, error);
  }
  if (chmod(path.c_str(), mode) != 0 || listen(fd, backlog) != 0) {
    const std::string error = errno_text("chmod/listen");
    close(fd);
    unlink(path.c_str());
    return fail(absl::StatusCode::kUnavailable, error);
  }
  return fd;
}

std::string UnixPeerName(const std::string& path) { return absl::StrCat("unix:", path); }

bool IsUnixPeer(std::string_view peer_name) { return peer_name.starts_with("unix:"); }

std::string PeerName(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    return absl::StrCat("ipv4:", host, ":", ntohs(v4->sin_port));
  }
  if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    return absl::StrCat("ipv6:[", host, "]:", ntohs(v6->sin6_port));
  }
  return "unknown";
}

bool IsLoopbackPeer(std::string_view p) {
  return p.starts_with("ipv4:127.") || p.starts_with("ipv6:[::1]:") || p.starts_with("ipv6:[::ffff:127.") ||
         IsUnixPeer(p);
}

}  // namespace tqkv::service
