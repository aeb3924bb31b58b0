// TLS on the data plane (OpenSSL): the server's context, built from the
// same files as gRPC's TLS (tls.h) and reloaded on the same interval, and
// one connection's session over a non-blocking socket, driven by the
// data plane's epoll loop.
//
// Reload: DataPlaneTlsContext::Current() re-reads the certificate, key and
// client CA files at most once per reload_interval; when their bytes
// changed and they form a valid set (the key matches the certificate), new
// connections get a new context; open connections keep theirs. A set that
// does not load is logged once and the previous context stays, as gRPC's
// file watcher does.
//
// Mutual TLS: with a client CA every client must present a certificate that
// chains to it and is within its validity period, or the handshake fails.
#ifndef TQKV_SERVICE_DATA_PLANE_TLS_H_
#define TQKV_SERVICE_DATA_PLANE_TLS_H_

#include <openssl/types.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "service/auth.h"
#include "service/rpc_scope.h"
#include "service/tls.h"

namespace tqkv::service {

// Thread-safe.
class DataPlaneTlsContext {
 public:
  // The context of `options` (REQUIRES: options.enabled()). `log` (may be
  // null, not owned, must outlive this) gets a line per reload. Errors:
  // CheckServerTls's; INTERNAL naming OpenSSL's reason when it refuses the
  // files.
  static absl::StatusOr<std::unique_ptr<DataPlaneTlsContext>> Create(const ServerTlsOptions& options,
                                                                     LineLog* log);
  ~DataPlaneTlsContext();
  DataPlaneTlsContext(const DataPlaneTlsContext&) = delete;
  DataPlaneTlsContext& operator=(const DataPlaneTlsContext&) = delete;

  // The context new connections use (reloaded as the file comment says).
  // Never null. Each connection holds its own reference.
  std::shared_ptr<SSL_CTX> Current();

 private:
  DataPlaneTlsContext(const ServerTlsOptions& options, LineLog* log) : options_(options), log_(log) {}
  // The three files' bytes, concatenated with their lengths.
  absl::StatusOr<std::string> ReadFiles() const;
  absl::StatusOr<std::shared_ptr<SSL_CTX>> Build() const;

  const ServerTlsOptions options_;
  LineLog* const log_;
  absl::Mutex mu_;
  std::shared_ptr<SSL_CTX> ctx_ ABSL_GUARDED_BY(mu_);
  std::string files_ ABSL_GUARDED_BY(mu_);         // what ctx_ (or the last failed try) was built from
  std::chrono::steady_clock::time_point next_check_ ABSL_GUARDED_BY(mu_);
};

// What a non-blocking TLS step needs next.
enum class TlsIo {
  kDone,       // completed (or moved bytes)
  kWantRead,   // call again when the socket is readable
  kWantWrite,  // call again when the socket is writable
  kClosed,     // the peer closed the connection
  kError,      // failed; TlsSession::error() says why
};

// One server-side connection. Not thread-safe (one loop owns it).
class TlsSession {
 public:
  // A session on `fd` (non-blocking, connected; not owned, must stay open
  // while the session lives). INTERNAL when OpenSSL cannot allocate one.
  static absl::StatusOr<std::unique_ptr<TlsSession>> Accept(std::shared_ptr<SSL_CTX> ctx, int fd);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Advances the handshake; kDone once established (then peer() is set).
  TlsIo Handshake();
  bool established() const { return established_; }

  // Reads up to n decrypted bytes into p. Returns the bytes read (> 0) with
  // kDone, or 0 with what blocks it (kWantRead/kWantWrite), kClosed or
  // kError.
  size_t Read(char* p, size_t n, TlsIo* io);
  // Writes up to n bytes of p (at least one record's worth unless n is
  // smaller); as Read. After kWantRead/kWantWrite the next call must pass
  // the same leading bytes (the buffer may move; n may grow).
  size_t Write(const char* p, size_t n, TlsIo* io);
  // Sends close_notify, best effort (never blocks).
  void Shutdown();

  // Why the last step failed: OpenSSL's reason ("wrong version number",
  // "certificate verify failed", "peer did not return a certificate").
  const std::string& error() const { return error_; }
  // The verified client certificate; empty when the client sent none (TLS
  // without a client CA).
  const PeerCertificate& peer() const { return peer_; }

 private:
  TlsSession(std::shared_ptr<SSL_CTX> ctx, SSL* ssl) : ctx_(std::move(ctx)), ssl_(ssl) {}
  TlsIo Result(int rc);

  std::shared_ptr<SSL_CTX> ctx_;
  SSL* ssl_;
  bool established_ = false;
  std::string error_;
  PeerCertificate peer_;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_DATA_PLANE_TLS_H_
