// TlsStream: the client side of TLS on a connected, blocking socket (the
// data-plane client's transport when the server has TLS).
//
// Thread safety: not thread-safe (one connection).
#ifndef TQKV_CLIENT_CPP_TLS_STREAM_H_
#define TQKV_CLIENT_CPP_TLS_STREAM_H_

#include <openssl/types.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tqkv::client {

struct ClientTlsOptions {
  // PEM CA bundle the server's certificate must chain to; "system": the
  // system's roots; empty: no TLS (plain TCP). Default: empty.
  std::string ca_file;
  // PEM client certificate and its key, sent to servers with mutual TLS;
  // both or neither. Default: empty (none).
  std::string cert_file;
  std::string key_file;
  // Name the server's certificate must carry (a DNS name or an IP address);
  // empty: the target's host. Default: empty.
  std::string server_name;

  bool enabled() const { return !ca_file.empty(); }
};

class TlsStream {
 public:
  // Handshakes over `fd` (connected, blocking, with the caller's send and
  // receive timeouts; not owned, must stay open while the stream lives),
  // checking the server's certificate against options.ca_file and the name
  // server_name (`host` when that is empty). Errors: INVALID_ARGUMENT for a
  // certificate without key (or the reverse) or files OpenSSL cannot load;
  // UNAVAILABLE with OpenSSL's reason when the handshake fails (untrusted
  // server, wrong name, a refused client certificate, a peer that does not
  // speak TLS); DEADLINE_EXCEEDED when it times out.
  static absl::StatusOr<std::unique_ptr<TlsStream>> Connect(int fd, const ClientTlsOptions& options,
                                                            const std::string& host);
  ~TlsStream();
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  // Writes up to n bytes; returns how many (> 0). UNAVAILABLE on a broken
  // connection, DEADLINE_EXCEEDED on a timeout.
  absl::StatusOr<size_t> Write(const char* p, size_t n);
  // Reads up to n bytes; returns how many (> 0), or 0 when the server closed
  // the connection. Errors as Write.
  absl::StatusOr<size_t> Read(char* p, size_t n);

 private:
  TlsStream(SSL_CTX* ctx, SSL* ssl) : ctx_(ctx), ssl_(ssl) {}
  absl::Status Failed(int rc, const char* op);

  SSL_CTX* ctx_;
  SSL* ssl_;
};

}  // namespace tqkv::client

#endif  // TQKV_CLIENT_CPP_TLS_STREAM_H_
