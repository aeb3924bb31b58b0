// TLS on the gRPC listener: the server's certificate and key, and for
// mutual TLS the CA bundle client certificates must chain to.
//
// The files are checked once at start (parsed with OpenSSL; the key must
// match the certificate) and then watched: gRPC re-reads them every
// reload_interval and new handshakes use what it read last, so a renewed
// certificate, key or CA takes effect without a restart (replace the files
// atomically, e.g. by rename; a pair that does not parse or match is not
// taken and the previous one stays in use).
//
// With a client CA every client must present a certificate that chains to
// it and is within its validity period; otherwise the handshake fails and
// the client sees UNAVAILABLE (gRPC reports every handshake failure so).
#ifndef TQKV_SERVICE_TLS_H_
#define TQKV_SERVICE_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/auth.h"

namespace tqkv::service {

struct ServerTlsOptions {
  // PEM certificate chain served to clients; empty: no TLS. Default: empty.
  std::string cert_file;
  // PEM private key of cert_file; required with it. Default: empty.
  std::string key_file;
  // PEM CA bundle; set: clients must present a certificate it verifies
  // (mTLS). Requires cert_file. Default: empty.
  std::string client_ca_file;
  // How often the files are re-read. Default: 60 s.
  absl::Duration reload_interval = absl::Seconds(60);

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
  bool mutual() const { return !client_ca_file.empty(); }
};

// Checks the files. INVALID_ARGUMENT for a missing pairing (key without
// certificate, CA without certificate, interval under 1 s), a file that
// does not parse, or a key that does not match the certificate; NOT_FOUND
// for a file that cannot be read. Each message names the file.
absl::Status CheckServerTls(const ServerTlsOptions& options);

// Credentials for grpc::ServerBuilder::AddListeningPort: TLS with the
// watched files, or insecure when !options.enabled(). Errors: as
// CheckServerTls.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const ServerTlsOptions& options);

// The verified client certificate of a call on a mutual-TLS listener (URI
// SANs and CN as gRPC reports them); empty when the caller presented none.
PeerCertificate PeerCertificateOf(const grpc::ServerContextBase& ctx);

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_TLS_H_
