// Internal to the data plane (//service:data_plane): DataPlaneServer::Loop,
// one epoll loop and the connections it serves. Its methods are defined by
// concern:
//   data_plane_loop.cc    the loop itself: accepting, dealing out and
//                         registering connections, events, the idle and
//                         frame-timeout sweep, TLS handshakes, closing
//   data_plane_input.cc   the input side: reading, parsing frames, charging
//                         them to the buffered-bytes budget, protocol errors
//   data_plane_serve.cc   serving one request: gets, Attend, Append, puts
//   data_plane_output.cc  the output side: queueing and writing replies
//
// Thread safety: Adopt and Stop may be called from any thread; everything
// else runs on the loop's thread (Init, SetPeers before Run starts).
#ifndef TQKV_SERVICE_DATA_PLANE_LOOP_H_
#define TQKV_SERVICE_DATA_PLANE_LOOP_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/tqkv/v1/tqkv.pb.h"
#include "service/auth.h"
#include "service/data_plane.h"
#include "service/data_plane_conn.h"
#include "service/data_plane_tls.h"
#include "service/kv_service.h"
#include "service/rpc_scope.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the data plane frames are little-endian");

namespace tqkv::service {
namespace data_plane_internal {

// Pieces of a TLS reply smaller than a record are copied together into one
// record of this size; larger payloads are encrypted from where they lie.
inline constexpr size_t kTlsRecordBytes = 16 << 10;

// "what: strerror(errno)".
inline std::string ErrnoText(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

}  // namespace data_plane_internal

class DataPlaneServer::Loop {
 public:
  using Conn = data_plane_internal::Conn;
  using Served = data_plane_internal::Served;

  // `options`, `service`, `env`, `shared` and `tls` (null: plain TCP) are
  // not owned and must outlive the loop; `listen_fd` and `unix_fd` (the
  // Unix-domain listener, -1: none) stay the caller's.
  Loop(int listen_fd, int unix_fd, const DataPlaneOptions& options, KvService* service, const RpcEnv* env,
       Shared* shared, DataPlaneTlsContext* tls)
      : listen_fd_(listen_fd),
        unix_fd_(unix_fd),
        options_(options),
        service_(service),
        env_(env),
        tls_(tls),
        shared_(shared) {}
  // Closes the connections (returning their budget charges) and the
  // descriptors the loop owns.
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // `accept`: this loop accepts connections (on the listeners) and deals them
  // out round-robin over `peers` (itself included). INTERNAL when epoll or
  // the eventfd cannot be set up.
  absl::Status Init(bool accept);

  // The accepting loop's round-robin targets (every loop, itself included).
  void SetPeers(std::vector<Loop*> peers) { peers_ = std::move(peers); }

  // Hands an accepted connection to this loop (from the accepting loop's
  // thread).
  void Adopt(int fd, std::string peer);

  // Makes Run return (from any thread).
  void Stop();

  // Serves until Stop() (or until epoll fails).
  void Run();

 private:
  // data_plane_loop.cc

  // Accepts what is pending on listener `fd` (the TCP one or, `unix`, the
  // Unix-domain one) and deals the connections out round-robin: every
  // loop gets its share whatever the kernel's wake-up order.
  void Accept(int fd, bool unix);
  // Stops or restarts watching the listeners; false if epoll refused.
  bool WatchListener(bool on);
  void PauseAccept();
  void ResumeAccept();
  // Takes `fd` into the loop (TLS session but for Unix-domain peers,
  // epoll); over max_connections it is failed with RESOURCE_EXHAUSTED
  // instead of served.
  void Register(int fd, std::string peer);
  // Closes connections without an event for options_.idle_timeout, and
  // fails those whose charged frame is older than options_.frame_timeout
  // (one DEADLINE_EXCEEDED reply, then the connection closes).
  void CloseIdle(std::chrono::steady_clock::time_point now);
  void Wake();
  // One epoll event on `c`: handshake, read and serve, write, close.
  void OnEvent(Conn* c, uint32_t events);
  // Advances a TLS handshake; false (connection closed) when it failed.
  // The failure is recorded and logged with OpenSSL's reason.
  bool Handshake(Conn* c);
  // Registers the epoll events `c` needs now.
  void UpdateInterest(Conn* c);
  // After reading or writing: closes a connection that is done (its
  // replies written) or half-closes one still draining a failed frame,
  // else updates its events.
  void Settle(Conn* c);
  // Closes and destroys *c, returning its budget charge. A busy connection
  // is shut down and marked closed instead; TakeFinished destroys it.
  void Close(Conn* c);

  // data_plane_input.cc

  // As read(2) on the connection, through TLS when it has it (-1 with
  // errno EAGAIN when TLS must wait for the socket; ECONNRESET on a TLS
  // error, logged).
  ssize_t ReadSome(Conn* c, char* p, size_t n);
  // ReadSome of a Unix-socket connection: recvmsg, keeping a passed
  // descriptor in c->passed_fd.
  ssize_t ReadUnix(Conn* c, char* p, size_t n);
  // Appends what the socket has; false (connection closed) on a reset.
  bool ReadInput(Conn* c);
  // Serves every complete frame while the reply queue has room.
  void Process(Conn* c);
  // Charges the incomplete frame at in_off (`bytes` with its prefix,
  // `avail` of them here) to the server's budget before its body is
  // buffered, and sizes the buffer for it. Over the budget: the connection
  // fails with RESOURCE_EXHAUSTED instead (the rest of the frame is read and
  // dropped so that the client can read the reply).
  void Charge(Conn* c, uint64_t bytes, size_t avail);
  // For a connection not yet authenticated, a frame over
  // max_unauthenticated_frame_bytes at in_off (`prefix` bytes, then an
  // `n`-byte request; `frame` bytes in all, `avail` here): when its request
  // is over the limit too it fails the connection; else once the request
  // is here its credentials are checked (failing the connection when they
  // do not hold) before the payload is accepted. True when the frame may
  // go on as an authenticated one.
  bool CheckUnauthenticated(Conn* c, size_t prefix, uint32_t n, uint64_t frame, size_t avail);
  // Returns the connection's charge, if any, to the budget.
  void Uncharge(Conn* c);
  // A protocol error: one reply with `s`, then the connection closes and
  // the rest of its input is ignored (`skip`: bytes of the failed frame
  // still to come, read and dropped before the close).
  void Fail(Conn* c, const absl::Status& s, uint64_t skip = 0);

  // data_plane_serve.cc

  // The identity a request's credentials (and the connection's client
  // certificate, where the auth file maps certificates) name, as on gRPC.
  absl::StatusOr<Identity> Identify(const Conn* c, const v1::DataPlaneRequest& req) const;
  // Whether a request is bulk backend work (puts, dense and device gets):
  // served on env_->backend_work when there is one.
  static bool UsesBackend(const v1::DataPlaneRequest& req);
  // Serves one request frame on the loop's thread (with its raw payload,
  // empty on a connection without them; `frame_bytes` on the wire in all):
  // queues its reply and records the call.
  void Serve(Conn* c, v1::DataPlaneRequest* request, absl::Span<const uint8_t> payload, uint64_t frame_bytes);
  // Serves one request: its reply, not yet queued. Touches no loop state:
  // of `c` only its put stream and what is fixed at accept (peer, TLS
  // identity), so it may run on a work-queue worker while `c` is busy.
  Served Compute(Conn* c, v1::DataPlaneRequest* request, absl::Span<const uint8_t> payload, uint64_t frame_bytes);
  // Queues `s` as `c`'s reply in `slot` (a new one, or the pending place of
  // a request served off the loop) and records the call.
  void Deliver(Conn* c, data_plane_internal::Reply* slot, Served s);
  // Hands the complete frame at c->in_off (`prefix` bytes, an `n`-byte
  // request, `payload` bytes; `frame` in all) to the backend work queue: the
  // task takes the input buffer holding it (and its budget charge), c->in
  // keeps what came after it, and a pending reply holds its place. False,
  // with nothing changed, when the queue is full.
  bool Submit(Conn* c, v1::DataPlaneRequest* req, size_t prefix, uint32_t n, uint64_t payload, size_t frame);
  // Queues the replies of requests served off the loop (called on the
  // wake-up their tasks send) and serves on their connections.
  void TakeFinished();
  // Serves on after a pause (a reply came back, or the work queue had no
  // room): reads what TLS holds, serves waiting frames, writes, updates the
  // connection's events.
  void Resume(Conn* c);
  // One frame of a put stream (see the proto's "Puts") with its raw
  // payload; fills *head on a commit. A frame whose identity fails fails
  // its stream (its blocks would be missing from the commit otherwise).
  absl::Status ServePut(Conn* c, const absl::StatusOr<Identity>& id, v1::DataPlanePut* put,
                        absl::Span<const uint8_t> raw_in, v1::DataPlaneReply* head);
  // A frame's same-host GPU memory (proto "Same-host GPU memory"):
  // FAILED_PRECONDITION unless this server takes CUDA IPC handles and the
  // connection is on this host's loopback; INVALID_ARGUMENT for a bad dtype.
  absl::StatusOr<DeviceKvRef> DeviceSource(const Conn* c, const v1::DeviceKv& d, const char* field) const;

  // data_plane_shared.cc

  // A share_memory frame (proto "Same-host shared memory"): maps the
  // descriptor passed with it as the connection's shared region.
  absl::Status ShareMemory(Conn* c, const v1::ShareMemory& share, v1::DataPlaneReply* head);
  // Serves the request waiting at c's doorbell, if one is (and c is not
  // busy); returns whether it did.
  bool ServeDoorbell(Conn* c);
  // Says in every doorbell region whether this loop polls, then serves
  // what waits; returns whether anything was served.
  bool PollDoorbells(bool polling);
  // Writes `reply` (a serialized DataPlaneReply) as the answer to request
  // `seq` at c's doorbell and wakes a sleeping client.
  void AnswerDoorbell(Conn* c, uint32_t seq, const std::string& reply);
  // c is closing: its doorbell says nobody polls, a request it holds is
  // answered UNAVAILABLE, and the loop stops watching it.
  void CloseDoorbell(Conn* c);
  // A frame's `shared`: its raw payload (*in, which must have come empty
  // off the wire) and where its reply's payload may go, inside the
  // connection's shared region; INVALID_ARGUMENT or FAILED_PRECONDITION
  // naming why not.
  absl::Status SharedSpans(const Conn* c, const v1::SharedPayload& shared, absl::Span<const uint8_t>* in,
                           absl::Span<uint8_t>* reply) const;

  // data_plane_output.cc

  // Queues a reply: `head`, then `payload` (payload_bytes in all), whose
  // memory the caller keeps alive through the new c->out.back().
  void Queue(Conn* c, const v1::DataPlaneReply& head, std::vector<iovec> payload,
             uint64_t payload_bytes);
  // Makes *r (in c->out) that reply.
  void Fill(Conn* c, data_plane_internal::Reply* r, const v1::DataPlaneReply& head, std::vector<iovec> payload,
            uint64_t payload_bytes);
  // Whether c->out has bytes to write now (replies before a pending one).
  static bool Writable(const Conn* c) { return !c->out.empty() && !c->out.front().pending; }
  // Writes queued replies until done or the socket is full; false if the
  // connection was closed on an error.
  bool Flush(Conn* c);
  // One SSL_write of the front of `iov`: a payload of a record or more is
  // encrypted in place; smaller pieces are first copied together into one
  // record. Returns as sendmsg (EAGAIN while TLS waits for the socket).
  // A retry after EAGAIN starts with the same bytes, as OpenSSL requires:
  // nothing was consumed, and only more replies can have been queued.
  ssize_t WriteTls(Conn* c, const iovec* iov, int n);

  const int listen_fd_;
  const int unix_fd_;  // -1: none
  const DataPlaneOptions& options_;
  KvService* const service_;
  const RpcEnv* const env_;
  DataPlaneTlsContext* const tls_;  // null: plain TCP
  int epoll_fd_ = -1, wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::vector<Loop*> peers_;  // the accepting loop's round-robin targets
  size_t next_peer_ = 0;
  absl::Mutex mu_;
  std::vector<std::pair<int, std::string>> adopted_ ABSL_GUARDED_BY(mu_);
  // Requests served off the loop, their replies waiting to be queued.
  struct Finished {
    Conn* c;
    Served served;
  };
  std::vector<Finished> finished_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> finished_ready_{false};  // finished_ has entries (read without mu_ while polling)
  // Requests of this loop on the work queue. While there are some, the
  // loop polls (epoll without sleeping, and finished_ready_) until
  // poll_until_ instead of sleeping until the task's wake-up, so that a
  // short request's reply is queued as soon as it is ready.
  int in_flight_ = 0;
  std::chrono::steady_clock::time_point poll_until_;
  static constexpr std::chrono::microseconds kPollWhileBusy{500};
  // Until then the loop polls after serving a request (options_.busy_poll).
  std::chrono::steady_clock::time_point spin_until_;
  absl::flat_hash_map<int, std::unique_ptr<Conn>> conns_;
  std::vector<Conn*> stalled_;  // connections whose frame found the work queue full
  std::vector<Conn*> doorbells_;  // connections whose shared memory carries calls
  bool doorbell_polling_ = false;  // what their regions say of this loop
  char scratch_[64 << 10];  // ReadInput's reads outside a charged frame's body
  char record_[data_plane_internal::kTlsRecordBytes];  // WriteTls's gathered record
  // Accepting pauses for kAcceptBackoff when the process is out of
  // descriptors (or memory).
  static constexpr std::chrono::milliseconds kAcceptBackoff{100};
  // How long a connection that failed (its error reply queued) may go on
  // sending the rest of its frame, read and dropped, before it is closed:
  // closing at once, with its bytes unread, would reset the connection and
  // could destroy the reply before the client reads it.
  static constexpr std::chrono::seconds kFailedLinger{2};
  static constexpr std::chrono::milliseconds kStalledRetry{1};
  bool accept_paused_ = false;
  std::chrono::steady_clock::time_point accept_resume_;
  std::chrono::steady_clock::time_point next_sweep_ = std::chrono::steady_clock::now();
  Shared* const shared_;  // the server's, shared by the loops
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_DATA_PLANE_LOOP_H_
