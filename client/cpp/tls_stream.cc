#include "client/cpp/tls_stream.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/openssl_reason.h"

namespace tqkv::client {
namespace {

bool IsIpAddress(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsStream>> TlsStream::Connect(int fd, const ClientTlsOptions& o,
                                                              const std::string& host) {
  if (o.cert_file.empty() != o.key_file.empty())
    return absl::InvalidArgumentError("a TLS client certificate and its key go together");
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslReason("out of memory"));
  std::unique_ptr<TlsStream> s(new TlsStream(ctx, nullptr));  // frees ctx on every return
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
  SSL_CTX_set_read_ahead(ctx, 1);  // several records a read(2) for large replies
  const int loaded = o.ca_file == "system" ? SSL_CTX_set_default_verify_paths(ctx)
                                           : SSL_CTX_load_verify_locations(ctx, o.ca_file.c_str(), nullptr);
  if (loaded != 1)
    return absl::InvalidArgumentError(absl::StrCat("TLS CA file ", o.ca_file, ": ", OpenSslReason("not loaded")));
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!o.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, o.cert_file.c_str()) != 1)
      return absl::InvalidArgumentError(
          absl::StrCat("TLS certificate file ", o.cert_file, ": ", OpenSslReason("not loaded")));
    if (SSL_CTX_use_PrivateKey_file(ctx, o.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1)
      return absl::InvalidArgumentError(
          absl::StrCat("TLS key file ", o.key_file, ": ", OpenSslReason("does not match the certificate")));
  }
  s->ssl_ = SSL_new(ctx);
  if (s->ssl_ == nullptr || SSL_set_fd(s->ssl_, fd) != 1)
    return absl::InternalError("SSL_new: " + OpenSslReason("out of memory"));
  const std::string name = o.server_name.empty() ? host : o.server_name;
  if (IsIpAddress(name)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s->ssl_), name.c_str());
  } else {
    SSL_set_tlsext_host_name(s->ssl_, name.c_str());
    SSL_set1_host(s->ssl_, name.c_str());
  }
  const int rc = SSL_connect(s->ssl_);
  if (rc != 1) {
    absl::Status failed = s->Failed(rc, "TLS handshake");
    const long verify = SSL_get_verify_result(s->ssl_);
    if (absl::IsUnavailable(failed) && verify != X509_V_OK)
      return absl::UnavailableError(
          absl::StrCat(failed.message(), " (", X509_verify_cert_error_string(verify), ")"));
    return failed;
  }
  return s;
}

TlsStream::~TlsStream() {
  if (ssl_ != nullptr) {
    ERR_clear_error();
    SSL_free(ssl_);
  }
  SSL_CTX_free(ctx_);
}

absl::Status TlsStream::Failed(int rc, const char* op) {
  const int e = SSL_get_error(ssl_, rc);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)  // a blocking socket's timeout
    return absl::DeadlineExceededError(absl::StrCat("data plane ", op, " timed out"));
  if (e == SSL_ERROR_ZERO_RETURN) return absl::UnavailableError("data plane connection closed by the server");
  if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)
    return absl::UnavailableError(absl::StrCat("data plane ", op, ": ",
                                               errno != 0 ? std::strerror(errno) : "connection closed"));
  return absl::UnavailableError(absl::StrCat("data plane ", op, ": ", OpenSslReason("TLS error")));
}

absl::StatusOr<size_t> TlsStream::Write(const char* p, size_t n) {
  ERR_clear_error();
  size_t put = 0;
  errno = 0;
  const int rc = SSL_write_ex(ssl_, p, n, &put);
  if (rc != 1) return Failed(rc, "send");
  return put;
}

absl::StatusOr<size_t> TlsStream::Read(char* p, size_t n) {
  ERR_clear_error();
  size_t got = 0;
  errno = 0;
  const int rc = SSL_read_ex(ssl_, p, n, &got);
  if (rc == 1) return got;
  if (SSL_get_error(ssl_, rc) == SSL_ERROR_ZERO_RETURN) return size_t{0};
  return Failed(rc, "receive");
}

}  // namespace tqkv::client
