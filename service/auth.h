// Caller identity: bearer tokens mapped to tenants.
//
// Token file: one entry per line, `token tenant [admin]`, separated by
// whitespace; blank lines and lines starting with '#' are ignored. A token
// may appear once. Without a token file auth is off: every caller is
// tenant "default" with admin rights.
//
// Callers send `authorization: Bearer <token>` metadata.
//
// Thread safety: immutable after construction; every method is const.
#ifndef TQKV_SERVICE_AUTH_H_
#define TQKV_SERVICE_AUTH_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tqkv::service {

struct Identity {
  std::string tenant;
  bool admin = false;
};

inline constexpr char kDefaultTenant[] = "default";

class Authenticator {
 public:
  // Auth off.
  Authenticator() = default;
  // INVALID_ARGUMENT naming the line for a malformed file (bad field
  // count, third field not "admin", duplicate token, invalid tenant);
  // NOT_FOUND if it cannot be read.
  static absl::StatusOr<Authenticator> FromFile(const std::string& path);
  static absl::StatusOr<Authenticator> FromString(const std::string& contents);

  bool enabled() const { return enabled_; }
  // `authorization` is the metadata value (empty if absent).
  // UNAUTHENTICATED when auth is on and the value is missing, not
  // "Bearer <token>", or names an unknown token.
  absl::StatusOr<Identity> Authenticate(const std::string& authorization) const;

 private:
  bool enabled_ = false;
  absl::flat_hash_map<std::string, Identity> tokens_;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_AUTH_H_
