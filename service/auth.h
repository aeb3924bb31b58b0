// Caller identity: bearer tokens and client certificates mapped to tenants.
//
// Auth file: one entry per line, `CREDENTIAL TENANT [admin|metrics]`,
// separated by whitespace; blank lines and lines starting with '#' are
// ignored. `admin` adds admin rights to the tenant's; `metrics` makes a
// scrape-only credential: it may read /metrics and nothing else (TENANT
// then only names the scraper in logs). A CREDENTIAL is one of
//   x509-uri:URI   a verified client certificate whose URI SAN is URI
//   x509-cn:NAME   a verified client certificate whose subject CN is NAME
//   anything else  a bearer token (so a token may not start with "x509-")
// and may appear once. Certificates count only where the server verifies
// them (gRPC with --tls_client_ca_file). Without an auth file auth is off:
// every caller is tenant "default" with admin rights.
//
// Callers send `authorization: Bearer <token>` metadata. A caller that
// sends both a token and a mapped certificate must name one tenant with
// both; admin rights then come from the token.
//
// Tokens are looked up by their SHA-256 digest and the digests compared in
// constant time, so neither the lookup nor the comparison reveals how much
// of a guessed token matched. The file is refused when group or others may
// read or write it.
//
// Thread safety: Authenticate and Reload may run concurrently from any
// threads; Reload swaps the whole table at once (a call sees the old table
// or the new one, never a mix).
#ifndef TQKV_SERVICE_AUTH_H_
#define TQKV_SERVICE_AUTH_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tqkv::service {

struct Identity {
  std::string tenant;
  bool admin = false;
  // A `metrics` line: may read /metrics only (Authenticate refuses it).
  bool scrape_only = false;
};

// What the transport verified about the caller's client certificate.
struct PeerCertificate {
  std::vector<std::string> uris;  // URI subject alternative names
  std::string common_name;        // subject CN; empty if none
};

inline constexpr char kDefaultTenant[] = "default";

// One parsed auth file. Immutable.
class AuthTable {
 public:
  // INVALID_ARGUMENT naming the line for a malformed file (bad field
  // count, third field not "admin" or "metrics", duplicate credential, invalid tenant,
  // empty certificate name).
  static absl::StatusOr<AuthTable> Parse(const std::string& contents);

  size_t tokens() const { return tokens_.size(); }
  size_t certificates() const { return certs_.size(); }
  // The identity of `token` (the bytes after "Bearer "), or null.
  const Identity* FindToken(const std::string& token) const;
  // The identity of the first URI SAN of `peer` that is mapped, else of its
  // CN; null when neither is.
  const Identity* FindCertificate(const PeerCertificate& peer) const;

 private:
  absl::flat_hash_map<std::string, Identity> tokens_;  // SHA-256 digest -> identity
  absl::flat_hash_map<std::string, Identity> certs_;   // "x509-uri:.." / "x509-cn:.."
};

class Authenticator {
 public:
  // Auth off.
  Authenticator() = default;
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // Reads and parses `path`. NOT_FOUND if it cannot be read;
  // FAILED_PRECONDITION naming the file and its mode when group or others
  // have any permission on it; INVALID_ARGUMENT (prefixed with the path)
  // for a malformed file.
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromFile(const std::string& path);
  // Auth on with the entries of `contents` (no file: Reload fails).
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromString(const std::string& contents);

  bool enabled() const { return enabled_; }
  // True when the table maps any certificate (callers then pass the peer's
  // certificate to Authenticate).
  bool uses_certificates() const;
  // Re-reads the file given to FromFile and swaps the table in. On any
  // error (FromFile's codes; FAILED_PRECONDITION when there is no file)
  // the previous table stays in force. On success returns "N tokens, M
  // certificate identities".
  absl::StatusOr<std::string> Reload();
  // Reload, when the file changed on disk since it was last read or tried
  // (another inode, size, mtime or ctime: an edit, a chmod, an atomic
  // rename, a Kubernetes Secret update); nullopt when it did not (or there
  // is no file). A file that fails is not tried again until it changes.
  std::optional<absl::StatusOr<std::string>> ReloadIfChanged();

  // `authorization` is the metadata value (empty if absent); `peer` the
  // verified client certificate, or null. UNAUTHENTICATED when auth is on
  // and the caller is not identified: the value is not "Bearer <token>",
  // names an unknown token, names a tenant other than the certificate's,
  // or is absent and no certificate is mapped.
  // PERMISSION_DENIED for a scrape-only credential.
  absl::StatusOr<Identity> Authenticate(const std::string& authorization,
                                        const PeerCertificate* peer = nullptr) const;
  // Who may read /metrics: anyone when auth is off; otherwise an admin or
  // scrape-only credential. Arguments and UNAUTHENTICATED as Authenticate;
  // PERMISSION_DENIED for a tenant's credential without admin rights.
  absl::StatusOr<Identity> AuthorizeScrape(const std::string& authorization,
                                           const PeerCertificate* peer = nullptr) const;

 private:
  static absl::StatusOr<AuthTable> ReadFile(const std::string& path);
  // Authenticate without the scrape-only check.
  absl::StatusOr<Identity> Identify(const std::string& authorization,
                                    const PeerCertificate* peer) const;
  std::shared_ptr<const AuthTable> table() const;

  // What identifies a version of the file (stat of its path).
  struct FileStamp {
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0, ctime_ns = 0;
    bool operator==(const FileStamp&) const = default;
  };
  // The file's stamp now; a zero stamp when it cannot be stat'ed.
  FileStamp Stamp() const;

  bool enabled_ = false;
  std::string path_;  // empty: FromString
  mutable absl::Mutex mu_;
  std::shared_ptr<const AuthTable> table_ ABSL_GUARDED_BY(mu_);
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);  // of the last read or try
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_AUTH_H_
