#include "service/data_plane_tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/openssl_reason.h"

namespace tqkv::service {
namespace {

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

PeerCertificate PeerOf(SSL* ssl) {
  PeerCertificate peer;
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return peer;
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = n->d.uniformResourceIdentifier;
    peer.uris.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                           static_cast<size_t>(ASN1_STRING_length(uri)));
  }
  GENERAL_NAMES_free(names);
  const X509_NAME* subject = X509_get_subject_name(cert);
  const int at = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (at >= 0) {
    const ASN1_STRING* cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at));
    peer.common_name.assign(reinterpret_cast<const char*>(ASN1_STRING_get0_data(cn)),
                            static_cast<size_t>(ASN1_STRING_length(cn)));
  }
  X509_free(cert);
  return peer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlaneTlsContext>> DataPlaneTlsContext::Create(
    const ServerTlsOptions& options, LineLog* log) {
  if (absl::Status s = CheckServerTls(options); !s.ok()) return s;
  if (!options.enabled()) return absl::InvalidArgumentError("data plane TLS needs a certificate and key");
  std::unique_ptr<DataPlaneTlsContext> c(new DataPlaneTlsContext(options, log));
  absl::StatusOr<std::string> files = c->ReadFiles();
  if (!files.ok()) return files.status();
  absl::StatusOr<std::shared_ptr<SSL_CTX>> ctx = c->Build();
  if (!ctx.ok()) return ctx.status();
  absl::MutexLock l(&c->mu_);
  c->ctx_ = *std::move(ctx);
  c->files_ = *std::move(files);
  c->next_check_ = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(options.reload_interval);
  return c;
}

DataPlaneTlsContext::~DataPlaneTlsContext() = default;

absl::StatusOr<std::string> DataPlaneTlsContext::ReadFiles() const {
  std::string all;
  for (const std::string* path : {&options_.cert_file, &options_.key_file, &options_.client_ca_file}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> bytes = ReadAll(*path);
    if (!bytes.ok()) return bytes.status();
    absl::StrAppend(&all, bytes->size(), ":", *bytes);
  }
  return all;
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> DataPlaneTlsContext::Build() const {
  ERR_clear_error();
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslReason("out of memory"));
  SSL_CTX* c = ctx.get();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  // A client closing without close_notify ends its stream like a TCP close
  // (frames are length-prefixed: a cut frame is never served).
  SSL_CTX_set_options(c, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
  // Replies are written from the queue in pieces (TlsSession::Write).
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(c, options_.cert_file.c_str()) != 1)
    return absl::InternalError(
        absl::StrCat("TLS certificate file ", options_.cert_file, ": ", OpenSslReason("not loaded")));
  if (SSL_CTX_use_PrivateKey_file(c, options_.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(c) != 1)
    return absl::InternalError(absl::StrCat("TLS key file ", options_.key_file, ": ",
                                            OpenSslReason("does not match the certificate")));
  if (options_.mutual()) {
    if (SSL_CTX_load_verify_locations(c, options_.client_ca_file.c_str(), nullptr) != 1)
      return absl::InternalError(
          absl::StrCat("TLS client CA file ", options_.client_ca_file, ": ", OpenSslReason("not loaded")));
    SSL_CTX_set_client_CA_list(c, SSL_load_client_CA_file(options_.client_ca_file.c_str()));
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  ERR_clear_error();
  return ctx;
}

std::shared_ptr<SSL_CTX> DataPlaneTlsContext::Current() {
  absl::MutexLock l(&mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now < next_check_) return ctx_;
  next_check_ = now + absl::ToChronoNanoseconds(options_.reload_interval);
  absl::StatusOr<std::string> files = ReadFiles();
  if (files.ok() && *files == files_) return ctx_;
  absl::StatusOr<std::shared_ptr<SSL_CTX>> ctx =
      files.ok() ? Build() : absl::StatusOr<std::shared_ptr<SSL_CTX>>(files.status());
  if (files.ok()) files_ = *std::move(files);  // a failed set is reported once, not every interval
  if (!ctx.ok()) {
    if (log_ != nullptr)
      log_->Write(absl::StrCat("tqkv-server: data plane TLS reload failed, the previous certificate stays: ",
                               ctx.status().ToString()), LogLevel::kError);
    return ctx_;
  }
  ctx_ = *std::move(ctx);
  if (log_ != nullptr) log_->Write("tqkv-server: data plane TLS files reloaded");
  return ctx_;
}

absl::StatusOr<std::unique_ptr<TlsSession>> TlsSession::Accept(std::shared_ptr<SSL_CTX> ctx, int fd) {
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx.get());
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return absl::InternalError("SSL_new: " + OpenSslReason("out of memory"));
  }
  SSL_set_accept_state(ssl);
  return std::unique_ptr<TlsSession>(new TlsSession(std::move(ctx), ssl));
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

TlsIo TlsSession::Result(int rc) {
  switch (SSL_get_error(ssl_, rc)) {
    case SSL_ERROR_WANT_READ:
      return TlsIo::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return TlsIo::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      return TlsIo::kClosed;
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0) {
        error_ = errno != 0 ? std::strerror(errno) : "connection closed";
        return TlsIo::kClosed;
      }
      [[fallthrough]];
    default:
      error_ = OpenSslReason("TLS error");
      if (SSL_get_verify_result(ssl_) != X509_V_OK && !established_)
        absl::StrAppend(&error_, " (", X509_verify_cert_error_string(SSL_get_verify_result(ssl_)), ")");
      return TlsIo::kError;
  }
}

TlsIo TlsSession::Handshake() {
  if (established_) return TlsIo::kDone;
  ERR_clear_error();
  const int rc = SSL_do_handshake(ssl_);
  if (rc != 1) return Result(rc);
  established_ = true;
  peer_ = PeerOf(ssl_);
  return TlsIo::kDone;
}

size_t TlsSession::Read(char* p, size_t n, TlsIo* io) {
  ERR_clear_error();
  size_t got = 0;
  const int rc = SSL_read_ex(ssl_, p, n, &got);
  *io = rc == 1 ? TlsIo::kDone : Result(rc);
  return rc == 1 ? got : 0;
}

size_t TlsSession::Write(const char* p, size_t n, TlsIo* io) {
  ERR_clear_error();
  size_t put = 0;
  const int rc = SSL_write_ex(ssl_, p, n, &put);
  *io = rc == 1 ? TlsIo::kDone : Result(rc);
  return rc == 1 ? put : 0;
}

void TlsSession::Shutdown() {
  ERR_clear_error();
  if (established_) (void)SSL_shutdown(ssl_);
  ERR_clear_error();
}

}  // namespace tqkv::service
