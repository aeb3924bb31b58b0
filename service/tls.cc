#include "service/tls.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tqkv::service {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioDeleter>;
using Cert = std::unique_ptr<X509, X509Deleter>;

Bio MemBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM file (and that there is one).
absl::StatusOr<Cert> FirstCert(const std::string& path, const char* what) {
  absl::StatusOr<std::string> pem = ReadPem(path, what);
  if (!pem.ok()) return pem.status();
  Bio bio = MemBio(*pem);
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (cert == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " holds no PEM certificate"));
  return cert;
}

}  // namespace

absl::Status CheckServerTls(const ServerTlsOptions& o) {
  if (!o.enabled()) {
    if (o.mutual())
      return absl::InvalidArgumentError("--tls_client_ca_file needs --tls_cert_file and --tls_key_file");
    return absl::OkStatus();
  }
  if (o.cert_file.empty() || o.key_file.empty())
    return absl::InvalidArgumentError("--tls_cert_file and --tls_key_file go together");
  if (o.reload_interval < absl::Seconds(1))
    return absl::InvalidArgumentError("the TLS reload interval must be at least 1 s");
  absl::StatusOr<Cert> cert = FirstCert(o.cert_file, "TLS certificate file");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key_pem = ReadPem(o.key_file, "TLS key file");
  if (!key_pem.ok()) return key_pem.status();
  Bio bio = MemBio(*key_pem);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr)
    return absl::InvalidArgumentError(
        absl::StrCat("TLS key file ", o.key_file, " holds no unencrypted PEM private key"));
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("TLS key file ", o.key_file,
                                                   " does not match the certificate in ", o.cert_file));
  }
  if (o.mutual()) {
    absl::StatusOr<Cert> ca = FirstCert(o.client_ca_file, "TLS client CA file");
    if (!ca.ok()) return ca.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const ServerTlsOptions& o) {
  if (absl::Status s = CheckServerTls(o); !s.ok()) return s;
  if (!o.enabled()) return grpc::InsecureServerCredentials();
  const auto interval = static_cast<unsigned int>(absl::ToInt64Seconds(o.reload_interval));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.key_file, o.cert_file, o.client_ca_file, interval);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (o.mutual()) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

PeerCertificate PeerCertificateOf(const grpc::ServerContextBase& ctx) {
  PeerCertificate peer;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return peer;
  for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME))
    peer.uris.emplace_back(v.data(), v.size());
  for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    peer.common_name.assign(v.data(), v.size());
    break;
  }
  return peer;
}

}  // namespace tqkv::service
