// DataPlaneServer: bulk reads (packed, or dense decoded by the backend), puts, Attend and Append
// over TCP (TLS when the server has TLS, see data_plane_tls.h), next to the gRPC control plane. The wire format is documented in
// proto/tqkv/v1/tqkv.proto ("Data plane"): length-prefixed DataPlaneRequest
// frames in (each with a raw payload of tensors beside it on connections
// that open with kDataPlanePrefaceRaw), one DataPlaneReply header plus the
// raw payloads out per request, in order.
//
// Why: a gRPC GetBlocks of one 64 KiB block costs ~30 us of server CPU in
// HTTP/2 framing, protobuf copies of the payload and thread hand-offs
// (bench/RESULTS.md). Here a request costs one read, one store lookup and
// one sendmsg whose iovecs point into the stored blocks: the payload is not
// copied in user space, and the store's buffers stay referenced
// (shared_ptr) until the kernel has taken every byte.
//
// With TLS the preface and frames travel inside TLS records: a reply's
// payloads are encrypted from the stored blocks, smaller pieces gathered
// into one record first (one copy of the small pieces, none of the large).
// The tenant is identified as on gRPC (rpc_scope.cc): the bearer token and,
// where the auth file maps certificates, the verified client certificate;
// a token of another tenant than the certificate's is UNAUTHENTICATED. A
// failed handshake closes the connection (the client sees UNAVAILABLE) and
// is logged with OpenSSL's reason.
//
// Semantics are KvService::PrepareGet's (tenancy from the bearer token,
// model and fingerprint checks, all-or-nothing: a missing block fails the
// request before any payload byte is sent), KvService::Attend's,
// KvService::Append's and PutSession's (a put stream spans a connection's
// `put` frames up to its commit frame; the connection closing first leaves
// nothing). Each request is recorded in the RPC metrics as method
// "DataGetBlocks", "DataAttend", "DataAppend" or "DataPutBlocks" (latency =
// time to prepare the reply) and failures are logged like RPC failures.
//
// Threads: `threads` event loops (epoll, level-triggered). Loop 0 accepts
// and deals connections out round-robin (leaving it to the kernel's wake-up
// order put nearly every connection on one loop: measured 0.95x Redis GET at
// 512 KiB instead of 1.4x); a request is served inline on its connection's
// loop (a hit on the disk tier reads RocksDB there; an Attend runs the
// backend there). Backpressure: a
// connection whose queued reply bytes exceed max_queued_reply_bytes is not
// read from until the client drains them.
//
// Memory of requests: on a server with auth, a connection none of whose
// requests has authenticated yet may send frames of at most
// max_unauthenticated_frame_bytes, or larger ones whose raw payload is
// read only once their request's credentials have held, so an anonymous
// client holds little. Authenticated frames are read whole (up to max_request_bytes)
// before they are served. The server-wide max_buffered_bytes bounds them: a
// frame is charged its declared size when its length prefix arrives,
// before its body is buffered, and the charge is returned when the frame
// has been served or its connection closes. A frame that would take the
// total over the budget is refused (RESOURCE_EXHAUSTED, connection
// closed) rather than paused: the client learns at once and retries with
// backoff, and a paused reader would hold its socket and its place while
// others wait. frame_timeout bounds how long one frame may hold its charge,
// so slow clients cannot keep the budget from everyone else.
//
// Thread safety: Start/Shutdown from one thread; address() from any.
#ifndef TQKV_SERVICE_DATA_PLANE_H_
#define TQKV_SERVICE_DATA_PLANE_H_

#include <cstdint>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/data_plane_tls.h"
#include "service/kv_service.h"
#include "service/rpc_scope.h"
#include "service/tenant_budget.h"
#include "service/tls.h"

namespace tqkv::service {

// The prefaces (8 bytes on the wire): with the first, a request frame is
// `u32 N` and a DataPlaneRequest; with the second, `u32 H, u64 P`, the
// request and P bytes of raw payload (tensors beside the request).
inline constexpr char kDataPlanePreface[] = "TQKVDP01";
inline constexpr char kDataPlanePrefaceRaw[] = "TQKVDP02";

struct DataPlaneOptions {
  // HOST:PORT to listen on; port 0 picks a free port. Default: 127.0.0.1:50052.
  std::string listen = "127.0.0.1:50052";
  // Event-loop threads. Default: 2.
  int threads = 2;
  // Largest request frame accepted (its request and raw payload); a
  // larger one is answered with RESOURCE_EXHAUSTED and the connection
  // closed. Default: 8 MiB.
  uint32_t max_request_bytes = 8u << 20;
  // Largest dense get reply (decoded K/V are built in memory before they
  // are sent); a larger one is refused with RESOURCE_EXHAUSTED. Default:
  // 64 MiB (the server passes --max_message_bytes).
  uint64_t max_dense_reply_bytes = uint64_t{64} << 20;
  // Reply bytes queued on one connection above which the server stops
  // reading that connection's requests. Default: 64 MiB.
  uint64_t max_queued_reply_bytes = uint64_t{64} << 20;
  // Payload bytes of replies not yet written to their sockets (packed
  // blocks, decoded K/V, Attend outputs), all connections and one tenant's:
  // a reply's payload is charged before it is built (a dense get's decode
  // buffer) or as soon as its blocks are known, and given back when its
  // last byte has been written or its connection closes; a request whose
  // reply would pass either cap is answered RESOURCE_EXHAUSTED instead
  // (clients that do not read their replies hold at most this). Per tenant
  // at least max_dense_reply_bytes, in all at least the per-tenant cap.
  // Defaults: 1 GiB and 512 MiB.
  uint64_t max_reply_bytes = uint64_t{1} << 30;
  uint64_t max_reply_bytes_per_tenant = uint64_t{512} << 20;
  // A connection with no bytes read or written for this long is closed
  // (an open put stream on it commits nothing and releases its memory).
  // Default: 10 minutes.
  absl::Duration idle_timeout = absl::Minutes(10);
  // On a server with auth, the largest frame a connection may send before
  // one of its requests has authenticated. A larger frame with a raw
  // payload is accepted when its request (prefix and DataPlaneRequest) is
  // within it and its credentials hold, checked before the payload is
  // read; otherwise RESOURCE_EXHAUSTED (or the authentication's error) and
  // the connection closes. Default: 64 KiB.
  uint32_t max_unauthenticated_frame_bytes = 64u << 10;
  // Connections served at once; one more is answered RESOURCE_EXHAUSTED
  // and closed. Default: 4096.
  int max_connections = 4096;
  // Budget of the bytes of incomplete request frames held in connections'
  // input buffers, all connections together: a frame is charged 4 + N
  // bytes (its declared length) when its length prefix arrives, before its
  // body is buffered, until it has been served. A frame that would take the
  // total over the budget is answered RESOURCE_EXHAUSTED and the connection
  // closed (the rest of that frame is read and dropped, not buffered).
  // Complete frames waiting behind reply backpressure are not charged;
  // they are bounded by one read per connection. Must be at least
  // 4 + max_request_bytes. Default: 1 GiB (16 frames of 64 MiB).
  uint64_t max_buffered_bytes = uint64_t{1} << 30;
  // A frame must arrive whole within this long of its length prefix; a
  // slower one is answered DEADLINE_EXCEEDED and its connection closed, so
  // no client holds its share of max_buffered_bytes indefinitely (the idle
  // timeout alone lets a client that sends a byte now and then keep it).
  // Default: 60 s (a 64 MiB frame at about 1 MiB/s).
  absl::Duration frame_timeout = absl::Seconds(60);
  // After serving a request, a loop keeps polling its sockets (epoll
  // without sleeping) for this long before it sleeps again, so that the
  // next request of a client that calls in a tight loop (a decode worker's
  // per-layer Attend) is read without a thread wake-up. Costs one core per
  // busy loop while it polls. Default: 0 (sleep at once).
  absl::Duration busy_poll = absl::ZeroDuration();
  // Accept CUDA IPC frames (proto "Same-host GPU memory") from loopback
  // and Unix-domain connections. Default: true.
  bool cuda_ipc = true;
  // Also serve on a Unix-domain stream socket at this path (empty: none),
  // for clients on this host: the same protocol, loops, budgets and auth
  // as the TCP listener, without TLS (the file's mode admits the peers) and
  // without TCP's per-byte and per-round-trip cost. The socket file is
  // created with `socket_mode` (default 0600: the server's user only) and
  // removed at shutdown; one left by an ended process is replaced.
  std::string socket_path;
  unsigned socket_mode = 0600;
  // Largest memory region a Unix-socket connection may share with the
  // server (proto "Same-host shared memory"): its tensors and replies then
  // bypass the socket. 0: no sharing. Default: 1 GiB.
  uint64_t max_shared_bytes = uint64_t{1} << 30;
  // TLS (mTLS with a client CA) from these files, reloaded every
  // tls.reload_interval; off (plain TCP) when !tls.enabled(). Default: off.
  ServerTlsOptions tls;
};


class DataPlaneServer {
 public:
  // Binds, listens and starts the loops. `service` and `env` are not owned
  // and must outlive the server (or its Shutdown). INVALID_ARGUMENT for a
  // malformed address or option, UNAVAILABLE when it cannot be bound;
  // DataPlaneTlsContext::Create's errors for the TLS files.
  static absl::StatusOr<std::unique_ptr<DataPlaneServer>> Start(const DataPlaneOptions& options,
                                                                KvService* service,
                                                                const RpcEnv* env);
  ~DataPlaneServer();  // Shutdown()
  DataPlaneServer(const DataPlaneServer&) = delete;
  DataPlaneServer& operator=(const DataPlaneServer&) = delete;

  // "HOST:PORT" actually bound.
  const std::string& address() const { return address_; }
  // The Unix-domain socket's path (empty: none).
  const std::string& socket_path() const { return options_.socket_path; }

  // A snapshot of the counts behind the data plane's metrics. Thread-safe.
  struct Stats {
    int connections = 0;              // open connections
    uint64_t buffered_bytes = 0;      // charged to max_buffered_bytes now
    uint64_t buffered_budget_bytes = 0;  // options' max_buffered_bytes
    uint64_t budget_refusals = 0;     // frames refused for the budget, since start
    uint64_t frame_timeouts = 0;      // frames failed for frame_timeout, since start
    uint64_t reply_bytes = 0;         // charged to max_reply_bytes now
    // The backend work queue (RpcEnv::backend_work; zeros without one):
    // requests waiting, its capacity, and submissions it refused (full).
    uint64_t work_waiting = 0, work_capacity = 0, work_refusals = 0;
  };
  Stats GetStats() const;

  // Stops accepting, closes every connection (replies not yet written are
  // dropped: the client sees the connection close and may retry) and joins
  // the loops. Idempotent.
  void Shutdown();

  class Loop;  // one epoll loop (data_plane_loop.h)

 private:
  DataPlaneServer() = default;

  DataPlaneOptions options_;
  const RpcEnv* env_ = nullptr;
  std::string address_;
  int listen_fd_ = -1;
  int unix_fd_ = -1;  // options_.socket_path's listener
  std::unique_ptr<DataPlaneTlsContext> tls_;  // null: plain TCP; used by the loops
  std::vector<std::unique_ptr<Loop>> loops_;
  // Shared by the loops (counts only: relaxed atomics).
  struct Shared {
    std::atomic<int> connections{0};          // open connections
    std::atomic<uint64_t> buffered_bytes{0};  // charged to max_buffered_bytes
    std::atomic<uint64_t> budget_refusals{0};
    std::atomic<uint64_t> frame_timeouts{0};
    std::atomic<int> tasks{0};  // requests handed to the backend work queue, not yet back
    std::unique_ptr<TenantBudget> replies;  // unwritten reply payloads (max_reply_bytes)
  };
  Shared shared_;
  std::vector<std::thread> threads_;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_DATA_PLANE_H_
