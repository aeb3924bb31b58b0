#include "service/auth.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "storage/block_key.h"

namespace tqkv::service {

absl::StatusOr<Authenticator> Authenticator::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read auth tokens file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<Authenticator> a = FromString(ss.str());
  if (!a.ok()) return absl::Status(a.status().code(), absl::StrCat(path, ": ", a.status().message()));
  return a;
}

absl::StatusOr<Authenticator> Authenticator::FromString(const std::string& contents) {
  Authenticator a;
  a.enabled_ = true;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_no;
    std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty() || absl::StartsWith(f[0], "#")) continue;
    if (f.size() < 2 || f.size() > 3 || (f.size() == 3 && f[2] != "admin"))
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": expected `token tenant [admin]`"));
    if (!storage::ValidateTenant(f[1]).ok() || f[1].empty())
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": invalid tenant"));
    if (!a.tokens_.emplace(f[0], Identity{f[1], f.size() == 3}).second)
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": duplicate token"));
  }
  return a;
}

absl::StatusOr<Identity> Authenticator::Authenticate(const std::string& authorization) const {
  if (!enabled_) return Identity{kDefaultTenant, true};
  constexpr absl::string_view kBearer = "Bearer ";
  if (authorization.empty())
    return absl::UnauthenticatedError("missing `authorization: Bearer <token>` metadata");
  if (!absl::StartsWith(authorization, kBearer))
    return absl::UnauthenticatedError("authorization metadata must be `Bearer <token>`");
  auto it = tokens_.find(authorization.substr(kBearer.size()));
  if (it == tokens_.end()) return absl::UnauthenticatedError("unknown token");
  return it->second;
}

}  // namespace tqkv::service
