#include "service/net_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
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
  return p.starts_with("ipv4:127.") || p.starts_with("ipv6:[::1]:") || p.starts_with("ipv6:[::ffff:127.");
}

}  // namespace tqkv::service
