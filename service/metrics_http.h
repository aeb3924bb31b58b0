// MetricsHttpServer: the /metrics listener. A small HTTP/1.1 server (one
// request per connection) that answers GET /metrics with the Prometheus
// text exposition of its collectables, and nothing else (404).
//
// Security follows the server's: with TLS options it serves HTTPS only, with
// the gRPC listener's certificate, key and client CA (mutual TLS: the
// scraper presents a certificate the CA verifies), reloaded on the same
// interval (DataPlaneTlsContext). With an enabled Authenticator every scrape
// must carry `Authorization: Bearer <token>` of an admin or `metrics`
// credential, or (under mutual TLS) a client certificate mapped to one
// (Authenticator::AuthorizeScrape): 401 without a valid credential, 403 for a
// tenant's credential.
//
// Each connection is served on its own thread, at most max_connections at
// once (one more is closed unanswered); a request must arrive and its reply
// be sent within io_timeout.
//
// Thread safety: thread-safe. Shutdown stops the listener, cuts the
// connections in flight and joins every thread; the collectables are not
// read after it returns.
#ifndef TQKV_SERVICE_METRICS_HTTP_H_
#define TQKV_SERVICE_METRICS_HTTP_H_

#include <prometheus/collectable.h>

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/auth.h"
#include "service/data_plane_tls.h"
#include "service/rpc_scope.h"
#include "service/tls.h"

namespace tqkv::service {

struct MetricsHttpOptions {
  // HOST:PORT; port 0 picks a free port. Required.
  std::string listen;
  // TLS on the listener (HTTPS only); off when !tls.enabled(). Default: off.
  ServerTlsOptions tls;
  // Who may scrape; null or disabled: anyone who reaches the listener. Not
  // owned; must outlive the server. Default: null.
  const Authenticator* auth = nullptr;
  // A request must arrive, and its reply leave, within this long.
  // Default: 10 s.
  absl::Duration io_timeout = absl::Seconds(10);
  // Connections served at once. Default: 8.
  int max_connections = 8;
};

class MetricsHttpServer {
 public:
  // Binds and starts serving `collectables` (none may be null; each is
  // kept alive by the server). `log` (may be null; not owned, must outlive
  // the server) gets a line per refused scrape and failed TLS handshake
  // (rate-limited).
  // Errors: INVALID_ARGUMENT for a bad address; CheckServerTls's and
  // DataPlaneTlsContext::Create's; UNAVAILABLE when the address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const MetricsHttpOptions& options,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables, LineLog* log);
  ~MetricsHttpServer();  // Shutdown
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Adds a collectable to later scrapes (not null).
  void Add(std::shared_ptr<prometheus::Collectable> c);
  // "HOST:PORT" bound (the port resolved when 0 was asked for).
  const std::string& address() const { return address_; }
  // Idempotent.
  void Shutdown();

 private:
  MetricsHttpServer(const MetricsHttpOptions& options, LineLog* log) : options_(options), log_(log) {}
  void AcceptLoop();
  void Serve(int fd, std::string peer);
  // The reply to one request (status line, headers and body).
  std::string Respond(const std::string& request, const PeerCertificate* peer,
                      const std::string& who);
  std::string Exposition();

  const MetricsHttpOptions options_;
  LineLog* const log_;
  std::unique_ptr<DataPlaneTlsContext> tls_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Shutdown wakes the accept loop
  std::string address_;
  std::thread acceptor_;

  absl::Mutex mu_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_ ABSL_GUARDED_BY(mu_);
  std::set<int> open_fds_ ABSL_GUARDED_BY(mu_);  // connections being served
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> finished_ ABSL_GUARDED_BY(mu_);  // workers to join
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_METRICS_HTTP_H_
