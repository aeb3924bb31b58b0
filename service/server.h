// Server: the composition root of tqkv-server. It builds the block store
// (RocksDB under data_dir), the model registry (reloaded from the store),
// the compute backend, the KvService, metrics and the gRPC server, and
// tears them down in order.
//
// Thread safety: Start and Shutdown are called from one thread; the
// accessors are const and may be called from any thread after Start.
#ifndef TQKV_SERVICE_SERVER_H_
#define TQKV_SERVICE_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "service/auth.h"
#include "service/backend_select.h"
#include "service/data_plane.h"
#include "service/data_plane_metrics.h"
#include "service/grpc_service.h"
#include "service/kv_service.h"
#include "service/metrics.h"
#include "service/metrics_http.h"
#include "service/model_registry.h"
#include "service/net_address.h"
#include "service/rpc_scope.h"
#include "service/tls.h"
#include "storage/at_rest_cipher.h"
#include "storage/block_store.h"
#include "storage/clock.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace tqkv::service {

struct ServerOptions {
  // gRPC address; port 0 picks a free port. Default: 127.0.0.1:50051.
  // Every listener binds loopback only unless its callers are
  // authenticated or insecure_listen_any is set (listen_policy.h).
  std::string listen = "127.0.0.1:50051";
  // Data-plane address (bulk packed reads over plain TCP, see
  // data_plane.h): HOST:PORT; "auto" = the gRPC host and port + 1 (port 0
  // when the gRPC port is 0); "off" or empty disables it. Default: auto.
  std::string data_listen = "auto";
  // Host the data-plane address in Stats names (with the bound port), e.g.
  // the pod's IP, so a client that reached this server through a Service
  // address finds this server's own data plane. IPv6 literals may be given
  // with or without brackets. Empty: the bound host (a wildcard host there
  // means "the host you reached this server on"). Default: empty.
  std::string data_advertise_host;
  // Allow listeners beyond loopback without authentication (no auth file;
  // for gRPC and metrics also no TLS). Start then writes one warning line
  // to `log`. Default: false (Start fails with INVALID_ARGUMENT).
  bool insecure_listen_any = false;
  // Serve gRPC server reflection (grpc.reflection.v1alpha). Default: false.
  bool grpc_reflection = false;
  // TLS (and mTLS) on the gRPC listener, the data plane and /metrics (same
  // files, same client CA). Default: off.
  ServerTlsOptions tls;
  // Data-plane event loops. Default: 2.
  int data_threads = 2;
  // Threads that run bulk backend work (puts, dense and device gets:
  // RpcEnv::backend_work), 0..64; 0: on the threads that serve the
  // network. Default: 2.
  int work_threads = 2;
  // Requests waiting for a work thread at most (>= 1); more are held back
  // unread until there is room. Default: 64.
  int work_queue = 64;
  // Data-plane connections idle this long are closed. Default: 10 minutes.
  absl::Duration data_idle_timeout = absl::Minutes(10);
  // Most data-plane connections served at once. Default: 4096.
  int data_max_connections = 4096;
  // Budget of bytes held for incomplete data-plane request frames, all
  // connections together (DataPlaneOptions::max_buffered_bytes); at least
  // 4 + max_message_bytes. Default: 1 GiB.
  uint64_t data_max_buffered_bytes = uint64_t{1} << 30;
  // A data-plane frame must arrive whole within this long of its length
  // prefix (DataPlaneOptions::frame_timeout). Default: 60 s.
  absl::Duration data_frame_timeout = absl::Seconds(60);
  // Largest data-plane frame before a connection has authenticated
  // (DataPlaneOptions::max_unauthenticated_frame_bytes). Default: 64 KiB.
  uint32_t data_max_unauthenticated_frame_bytes = 64u << 10;
  // Unwritten data-plane reply payloads, all connections and one tenant's
  // (DataPlaneOptions::max_reply_bytes(_per_tenant)). Defaults: 1 GiB, 512 MiB.
  uint64_t data_max_reply_bytes = uint64_t{1} << 30;
  uint64_t data_max_reply_bytes_per_tenant = uint64_t{512} << 20;
  // Serve CUDA IPC puts and gets to loopback data-plane connections
  // (DataPlaneOptions::cuda_ipc). Default: true.
  bool data_cuda_ipc = true;
  // The data plane also on a Unix-domain socket at this path, created with
  // this mode (DataPlaneOptions::socket_path / socket_mode; needs the data
  // plane on). Default: none, 0600.
  std::string data_socket;
  unsigned data_socket_mode = 0600;
  // Largest memory a client of that socket may share with the server
  // (DataPlaneOptions::max_shared_bytes; 0: none). Default: 1 GiB.
  uint64_t data_max_shared_bytes = uint64_t{1} << 30;
  // How long a data-plane loop polls after serving a request before it
  // sleeps (DataPlaneOptions::busy_poll). Default: 0.
  absl::Duration data_busy_poll = absl::ZeroDuration();
  // Prometheus /metrics address; port 0 picks a free port; empty disables.
  // It serves HTTPS when `tls` is on, and with an auth file only scrapes
  // that carry an admin or `metrics` credential (metrics_http.h).
  // Default: 127.0.0.1:9464.
  std::string metrics_listen = "127.0.0.1:9464";
  // With an auth file: whether a scrape needs an admin or `metrics`
  // credential. false serves /metrics to anyone who reaches the listener
  // (a scraper that cannot send a token, behind a network policy); it
  // then counts as unprotected for the listen policy, and tenant labels
  // stay off under kAuto. Default: true.
  bool metrics_auth = true;
  // Whether per-model series carry tenant and model labels (StoreCollector).
  // kAuto: only when auth is off (every caller is tenant "default"), so an
  // authenticated server's /metrics names no tenant. Default: kAuto.
  enum class TenantLabels { kAuto, kOn, kOff };
  TenantLabels metrics_tenant_labels = TenantLabels::kAuto;
  // Directory of the RocksDB disk tier (created if missing); empty: no disk
  // tier (host memory only, nothing survives a restart). Default: ./data.
  std::string data_dir = "./data";
  // Key file of encryption at rest (storage/at_rest_cipher.h: `ID HEX`
  // lines, mode 0600 or stricter): every payload the disk tier writes is
  // sealed with AES-256-GCM under its tenant's key; records in clear are
  // still read. Empty: off. Default: empty.
  std::string at_rest_key_file;
  // auto, cpu or cuda (see backend_select.h). Default: auto.
  std::string backend = "auto";
  // Host-memory budget for block payloads. Default: 1 GiB.
  uint64_t host_budget_bytes = uint64_t{1} << 30;
  // With the CUDA backend: put buffers come from one arena of
  // host_budget_bytes (storage/host_arena.h) that the backend pins in the
  // background, so blocks move between the host tier and the GPU by DMA.
  // The process then holds the whole budget from start-up.
  // Default: false.
  bool pin_host_tier = false;
  // Host bytes one tenant's blocks may hold (storage's
  // tenant_host_quota_bytes): a tenant at it evicts its own blocks, never
  // another tenant's; a put that cannot make room among its own is
  // RESOURCE_EXHAUSTED naming the tenant. 0: no per-tenant limit. Default: 0.
  uint64_t tenant_host_quota_bytes = 0;
  // Disk budget for spilled/durable payloads. Default: 64 GiB.
  uint64_t disk_budget_bytes = uint64_t{64} << 30;
  // Write-behind (BlockStoreOptions::write_behind_above_bytes) above this
  // fraction of host_budget_bytes held by blocks with no disk copy: the
  // oldest are copied to disk in the background, so eviction and shutdown
  // find them written. 0: off; at most 1. Default: 0 (on a 2-core
  // machine it cost puts, one in ten durable, 40% of their rate: a durable
  // put's WAL sync also writes the batch written behind).
  double write_behind_fraction = 0;
  // Free bytes the disk tier's file system keeps
  // (BlockStoreOptions::disk_min_free_bytes). Default: 1 GiB.
  uint64_t disk_min_free_bytes = uint64_t{1} << 30;
  // Serve while the disk tier's index loads (BlockStoreOptions::
  // load_index_in_background): every stored block answers from the start;
  // the log says when the index is complete. Default: true.
  bool disk_index_in_background = true;
  // Models one tenant may register. Default: 256.
  int max_models_per_tenant = 256;
  // Most arithmetic one registration's codec may take to build
  // (ModelRegistryOptions::max_codec_build_work). Default: 2^33.
  uint64_t max_codec_build_work = uint64_t{1} << 33;
  // Memory gRPC may use for its connections and calls (grpc::ResourceQuota);
  // 0: unbounded. Default: 1 GiB.
  uint64_t grpc_max_memory_bytes = uint64_t{1} << 30;
  // Largest gRPC message received or sent. Default: 64 MiB.
  int max_message_bytes = 64 << 20;
  // Auth file (auth.h: `credential tenant [admin|metrics]` lines, mode 0600 or
  // stricter); empty: auth off (tenant "default"). Default: empty.
  std::string auth_tokens_file;
  // CPU backend worker threads; -1: cores − 1. Default: -1.
  int threads = -1;
  // On graceful shutdown, move every host-resident block to disk (as far
  // as the disk budget allows) so a restart finds it. Default: true.
  bool spill_on_shutdown = true;
  // How long that spill may take, its WAL sync and the store's close
  // included (BlockStore::SpillForShutdown: batches of 64 MiB, paced to end
  // in time); what is left in host memory is lost with the process, counted
  // and logged. Durable blocks are on disk already. Default: 30 s (deploy/k8s's
  // overlays set it to their host budget and size the termination grace
  // period to cover it).
  absl::Duration shutdown_spill_deadline = absl::Seconds(30);
  // How long Shutdown waits for in-flight RPCs before cancelling them.
  // Default: 10 s.
  absl::Duration shutdown_grace = absl::Seconds(10);
  // How often idle sequences and stale staged parts are expired.
  // Default: 1 s.
  absl::Duration maintenance_interval = absl::Seconds(1);
  // Log failed RPCs (not NOT_FOUND) to `log`. Default: true.
  bool log_rpc_errors = true;
  // Where startup notes and RPC failures go. Not owned. Default: null (none).
  std::ostream* log = nullptr;
  KvServiceOptions service;
  // Time source for leases, sequences and staging. Not owned. Default: null
  // (real time).
  storage::Clock* clock = nullptr;
};

class Server {
 public:
  // Builds everything and starts serving. `cuda` is the CUDA backend
  // factory when linked (null otherwise). Errors: bad options
  // (INVALID_ARGUMENT, including an unauthenticated listener beyond
  // loopback without insecure_listen_any), the auth file's errors
  // (Authenticator::FromFile), backend selection errors, store open
  // errors, UNAVAILABLE when an address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                        const CudaBackendFactory& cuda);
  // Shuts down if still running.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // "HOST:PORT" actually bound (port resolved when 0 was asked for).
  const std::string& address() const { return address_; }
  // Data-plane "HOST:PORT"; empty when it is disabled.
  const std::string& data_address() const { return data_address_; }
  // The data plane's Unix-domain socket path; empty when there is none.
  const std::string& data_socket() const {
    static const std::string kNone;
    return data_plane_ != nullptr ? data_plane_->socket_path() : kNone;
  }
  // Empty when metrics are disabled.
  const std::string& metrics_address() const { return metrics_address_; }
  std::string backend_name() const { return backend_->name(); }

  // Re-reads the auth file (Authenticator::Reload) and logs the outcome;
  // on failure the previous tokens stay in force. Errors: Reload's;
  // FAILED_PRECONDITION when auth is off. Thread-safe. (The server also
  // re-reads the file by itself within a maintenance interval of a change.)
  absl::Status ReloadAuth();
  const std::string& backend_note() const { return backend_note_; }

  // Graceful: health turns NOT_SERVING, new calls are refused, in-flight
  // calls get up to shutdown_grace to finish, the data plane closes its
  // connections (reads in flight are cut; clients retry), then host blocks are spilled
  // (spill_on_shutdown), the WAL is synced and the store closed.
  // Idempotent. Returns the first error of the spill/sync steps.
  absl::Status Shutdown();

 private:
  explicit Server(const ServerOptions& options);
  void MaintenanceLoop();
  // BlockStore::CollectDiskGarbage, logged when it collects or fails.
  void CollectDiskGarbage();
  // Logs the end of the disk index load once it has ended.
  void ReportIndexLoaded();
  // Logs once the backend has pinned the host arena (or failed to).
  void ReportHostPinned();
  // Logs an auth reload's outcome; returns its status.
  absl::Status LogAuthReload(const absl::StatusOr<std::string>& r);

  const ServerOptions options_;
  std::unique_ptr<storage::Clock> owned_clock_;
  storage::Clock* clock_ = nullptr;
  std::unique_ptr<storage::AtRestCipher> at_rest_;  // used by store_: declared before it
  std::unique_ptr<storage::HostArena> host_arena_;  // used by store_ and backend_: declared before them
  std::unique_ptr<storage::BlockStore> store_;
  std::unique_ptr<ModelRegistry> registry_;
  std::unique_ptr<ComputeBackend> backend_;
  std::string backend_note_;
  std::unique_ptr<KvService> service_;
  std::unique_ptr<WorkQueue> backend_work_;  // used by the data plane: declared before it
  std::unique_ptr<Authenticator> auth_ = std::make_unique<Authenticator>();
  std::unique_ptr<LineLog> log_;
  std::shared_ptr<prometheus::Registry> prom_registry_;
  std::unique_ptr<RpcMetrics> rpc_metrics_;
  std::shared_ptr<StoreCollector> collector_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  RpcEnv env_;
  std::unique_ptr<KvStoreHandler> kv_handler_;
  std::unique_ptr<AdminHandler> admin_handler_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<DataPlaneServer> data_plane_;
  std::shared_ptr<DataPlaneCollector> data_plane_collector_;  // reads data_plane_
  std::string address_, metrics_address_, data_address_;
  absl::Notification stop_maintenance_;
  absl::Time disk_gc_after_ = absl::InfinitePast();  // CollectDiskGarbage waits after a failure
  std::thread maintenance_;
  // The disk index was loading at start; the maintenance loop logs its end.
  bool index_loading_ = false;
  bool host_pinning_ = false;  // the backend is pinning host_arena_
  absl::Time started_;
  bool shut_down_ = false;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_SERVER_H_
