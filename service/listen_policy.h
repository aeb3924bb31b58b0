// Which listeners may bind beyond loopback. A listener is "protected" when
// its callers must identify themselves (an auth file is loaded) or, on
// gRPC, talk TLS. An unprotected listener binds loopback only unless the
// operator passes --insecure_listen_any, and then the server warns.
#ifndef TQKV_SERVICE_LISTEN_POLICY_H_
#define TQKV_SERVICE_LISTEN_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tqkv::service {

// True when `host` (as SplitHostPort returns it: brackets kept) names
// loopback only: an IPv4 literal in 127.0.0.0/8, "::1" or "[::1]", or
// "localhost". Wildcards (0.0.0.0, [::]), other literals and other names
// are beyond loopback.
bool IsLoopbackHost(const std::string& host);

struct ListenerExposure {
  std::string flag;     // the flag that set it, e.g. "--data_listen"
  std::string address;  // HOST:PORT as configured
  bool is_protected = false;
};

// OK when every unprotected listener is on loopback (*warning cleared).
// Otherwise, without `insecure_listen_any`, INVALID_ARGUMENT naming each
// unprotected listener beyond loopback and the ways out; with it, OK and
// *warning is one line naming them. INVALID_ARGUMENT for a malformed
// address.
absl::Status CheckListeners(const std::vector<ListenerExposure>& listeners,
                            bool insecure_listen_any, std::string* warning);

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_LISTEN_POLICY_H_
