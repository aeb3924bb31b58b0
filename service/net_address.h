// HOST:PORT parsing shared by the gRPC, data-plane and metrics listeners.
#ifndef TQKV_SERVICE_NET_ADDRESS_H_
#define TQKV_SERVICE_NET_ADDRESS_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace tqkv::service {

// Splits "host:port" / "[v6]:port" into (host as written, brackets kept;
// port). INVALID_ARGUMENT if malformed or the port is outside 0..65535.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_NET_ADDRESS_H_
