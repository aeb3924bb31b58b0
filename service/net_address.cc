#include "service/net_address.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

}  // namespace tqkv::service
