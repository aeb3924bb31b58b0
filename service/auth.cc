#include "service/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "storage/block_key.h"

namespace tqkv::service {
namespace {

constexpr absl::string_view kUriPrefix = "x509-uri:";
constexpr absl::string_view kCnPrefix = "x509-cn:";

std::string Digest(absl::string_view token) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d);
  return std::string(reinterpret_cast<const char*>(d), sizeof d);
}

}  // namespace

absl::StatusOr<AuthTable> AuthTable::Parse(const std::string& contents) {
  AuthTable t;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_no;
    std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty() || absl::StartsWith(f[0], "#")) continue;
    if (f.size() < 2 || f.size() > 3 || (f.size() == 3 && f[2] != "admin" && f[2] != "metrics"))
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": expected `credential tenant [admin|metrics]`"));
    if (!storage::ValidateTenant(f[1]).ok() || f[1].empty())
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": invalid tenant"));
    Identity id{f[1], f.size() == 3 && f[2] == "admin", f.size() == 3 && f[2] == "metrics"};
    bool inserted;
    if (absl::StartsWith(f[0], "x509-")) {
      if (!(absl::StartsWith(f[0], kUriPrefix) && f[0].size() > kUriPrefix.size()) &&
          !(absl::StartsWith(f[0], kCnPrefix) && f[0].size() > kCnPrefix.size()))
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_no, ": expected x509-uri:URI or x509-cn:NAME"));
      inserted = t.certs_.emplace(f[0], std::move(id)).second;
    } else {
      inserted = t.tokens_.emplace(Digest(f[0]), std::move(id)).second;
    }
    if (!inserted)
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": duplicate credential"));
  }
  return t;
}

const Identity* AuthTable::FindToken(const std::string& token) const {
  const std::string d = Digest(token);
  auto it = tokens_.find(d);
  // The map compared digests, not tokens; the explicit constant-time check
  // keeps the match independent of how the map compares keys.
  if (it == tokens_.end() || CRYPTO_memcmp(it->first.data(), d.data(), d.size()) != 0)
    return nullptr;
  return &it->second;
}

const Identity* AuthTable::FindCertificate(const PeerCertificate& peer) const {
  for (const std::string& uri : peer.uris)
    if (auto it = certs_.find(absl::StrCat(kUriPrefix, uri)); it != certs_.end()) return &it->second;
  if (peer.common_name.empty()) return nullptr;
  auto it = certs_.find(absl::StrCat(kCnPrefix, peer.common_name));
  return it == certs_.end() ? nullptr : &it->second;
}

absl::StatusOr<AuthTable> Authenticator::ReadFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::NotFoundError(
        absl::StrCat("cannot read auth tokens file ", path, ": ", std::strerror(errno)));
  struct stat st {};
  std::string contents;
  absl::Status status;
  if (fstat(fd, &st) != 0) {
    status = absl::NotFoundError(absl::StrCat("cannot stat auth tokens file ", path, ": ",
                                              std::strerror(errno)));
  } else if ((st.st_mode & 077) != 0) {
    status = absl::FailedPreconditionError(absl::StrFormat(
        "auth tokens file %s has mode %04o: group and others must have no access (chmod 600 %s)",
        path, st.st_mode & 07777, path));
  } else {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) contents.append(buf, static_cast<size_t>(n));
    if (n < 0)
      status = absl::NotFoundError(
          absl::StrCat("cannot read auth tokens file ", path, ": ", std::strerror(errno)));
  }
  close(fd);
  if (!status.ok()) return status;
  absl::StatusOr<AuthTable> t = AuthTable::Parse(contents);
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  return t;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromFile(const std::string& path) {
  auto a = std::make_unique<Authenticator>();
  a->path_ = path;
  const FileStamp stamp = a->Stamp();
  absl::StatusOr<AuthTable> t = ReadFile(path);
  if (!t.ok()) return t.status();
  a->enabled_ = true;
  absl::MutexLock l(&a->mu_);
  a->table_ = std::make_shared<const AuthTable>(*std::move(t));
  a->stamp_ = stamp;
  return a;
}

Authenticator::FileStamp Authenticator::Stamp() const {
  struct stat st {};
  if (path_.empty() || stat(path_.c_str(), &st) != 0) return {};
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
          st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec, st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec};
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromString(const std::string& contents) {
  absl::StatusOr<AuthTable> t = AuthTable::Parse(contents);
  if (!t.ok()) return t.status();
  auto a = std::make_unique<Authenticator>();
  a->enabled_ = true;
  a->table_ = std::make_shared<const AuthTable>(*std::move(t));
  return a;
}

std::shared_ptr<const AuthTable> Authenticator::table() const {
  absl::ReaderMutexLock l(&mu_);
  return table_;
}

bool Authenticator::uses_certificates() const {
  std::shared_ptr<const AuthTable> t = table();
  return t != nullptr && t->certificates() > 0;
}

absl::StatusOr<std::string> Authenticator::Reload() {
  if (path_.empty()) return absl::FailedPreconditionError("no auth tokens file to reload");
  const FileStamp stamp = Stamp();  // before the read: a change during it is seen next time
  absl::StatusOr<AuthTable> t = ReadFile(path_);
  absl::MutexLock l(&mu_);
  stamp_ = stamp;
  if (!t.ok()) return t.status();
  std::string summary =
      absl::StrCat(t->tokens(), " tokens, ", t->certificates(), " certificate identities");
  table_ = std::make_shared<const AuthTable>(*std::move(t));
  return summary;
}

std::optional<absl::StatusOr<std::string>> Authenticator::ReloadIfChanged() {
  if (path_.empty()) return std::nullopt;
  const FileStamp now = Stamp();  // the stat outside the lock Authenticate takes
  {
    absl::MutexLock l(&mu_);
    if (now == stamp_) return std::nullopt;
  }
  return Reload();
}

absl::StatusOr<Identity> Authenticator::Authenticate(const std::string& authorization,
                                                     const PeerCertificate* peer) const {
  absl::StatusOr<Identity> id = Identify(authorization, peer);
  if (id.ok() && id->scrape_only)
    return absl::PermissionDeniedError("a metrics credential may only read /metrics");
  return id;
}

absl::StatusOr<Identity> Authenticator::AuthorizeScrape(const std::string& authorization,
                                                        const PeerCertificate* peer) const {
  absl::StatusOr<Identity> id = Identify(authorization, peer);
  if (id.ok() && !id->admin && !id->scrape_only)
    return absl::PermissionDeniedError(
        "/metrics needs an admin credential or a `metrics` one from the auth file");
  return id;
}

absl::StatusOr<Identity> Authenticator::Identify(const std::string& authorization,
                                                 const PeerCertificate* peer) const {
  if (!enabled_) return Identity{kDefaultTenant, true};
  std::shared_ptr<const AuthTable> t = table();
  const Identity* by_cert = peer != nullptr ? t->FindCertificate(*peer) : nullptr;
  if (authorization.empty()) {
    if (by_cert != nullptr) return *by_cert;
    return absl::UnauthenticatedError(
        "missing `authorization: Bearer <token>` metadata (and no mapped client certificate)");
  }
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(authorization, kBearer))
    return absl::UnauthenticatedError("authorization metadata must be `Bearer <token>`");
  const Identity* by_token = t->FindToken(authorization.substr(kBearer.size()));
  if (by_token == nullptr) return absl::UnauthenticatedError("unknown token");
  if (by_cert != nullptr && by_cert->tenant != by_token->tenant)
    return absl::UnauthenticatedError("the token and the client certificate name different tenants");
  return *by_token;
}

}  // namespace tqkv::service
