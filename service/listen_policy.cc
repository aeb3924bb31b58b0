#include "service/listen_policy.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "service/net_address.h"

namespace tqkv::service {

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  std::string bare = host;
  if (bare.size() >= 2 && bare.front() == '[' && bare.back() == ']')
    bare = bare.substr(1, bare.size() - 2);
  in6_addr v6{};
  return inet_pton(AF_INET6, bare.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

absl::Status CheckListeners(const std::vector<ListenerExposure>& listeners,
                            bool insecure_listen_any, std::string* warning) {
  warning->clear();
  std::vector<std::string> exposed;
  for (const ListenerExposure& l : listeners) {
    absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(l.address);
    if (!hp.ok()) return hp.status();
    if (!l.is_protected && !IsLoopbackHost(hp->first))
      exposed.push_back(absl::StrCat(l.flag, "=", l.address));
  }
  if (exposed.empty()) return absl::OkStatus();
  const std::string list = absl::StrJoin(exposed, ", ");
  if (!insecure_listen_any)
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to listen beyond loopback without authentication (", list,
        "): anyone who reaches these ports could read and drop every tenant's blocks. "
        "Listen on 127.0.0.1, or set --auth_tokens_file (and TLS for gRPC), or pass "
        "--insecure_listen_any to accept the risk"));
  *warning = absl::StrCat("WARNING: --insecure_listen_any: listening beyond loopback without ",
                          "authentication on ", list,
                          "; any caller there is tenant \"default\" with admin rights");
  return absl::OkStatus();
}

}  // namespace tqkv::service
