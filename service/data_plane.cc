#include "service/data_plane.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "service/convert.h"
#include "service/data_plane_tls.h"
#include "service/net_address.h"
#include "service/put_session.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the data plane frames are little-endian");

namespace tqkv::service {
namespace {

constexpr size_t kPrefaceBytes = 8;
constexpr size_t kReplyPrefixBytes = 12;  // u32 header length + u64 payload length
constexpr int kMaxIov = 64;
constexpr int kMaxEvents = 64;
// Pieces of a TLS reply smaller than a record are copied together into one
// record of this size; larger payloads are encrypted from where they lie.
constexpr size_t kTlsRecordBytes = 16 << 10;
// An input buffer grown past this for a large frame is shrunk once the
// frame has been served.
constexpr size_t kKeptInputBytes = 1 << 20;

std::string ErrnoText(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// One queued reply: `head` (prefix + DataPlaneReply) and iovecs over it and
// over the stored payloads, which `blocks` keeps alive until the last byte
// has been handed to the kernel.
struct Reply {
  std::unique_ptr<char[]> head;  // every byte is written: no zero fill
  size_t head_bytes = 0;
  std::vector<storage::BlockData> blocks;
  std::unique_ptr<uint8_t[]> dense;  // a dense get's decoded K/V (the iovec points into it)
  std::vector<iovec> parts;  // non-empty; parts[0] covers `head`
  size_t next = 0;           // first part not fully written
};

struct Conn {
  int fd = -1;
  std::string peer;
  std::string in;          // received bytes; [in_off, size) not yet parsed
  size_t in_off = 0;
  bool preface_ok = false;
  bool closing = false;    // close once the queued replies are written
  // After a protocol error: the rest of the input is discarded; `skip`
  // bytes of an oversized frame are still read (and dropped) after the
  // error reply, so that a client still sending it can read the reply.
  bool failed = false;
  uint64_t skip = 0;
  bool half_closed = false;  // shutdown(SHUT_WR) sent while skipping
  // The incomplete frame at in_off is charged `charged` bytes (its 4 + N)
  // to the server's buffered-bytes budget since `frame_start`; 0: none.
  uint64_t charged = 0;
  std::chrono::steady_clock::time_point frame_start;
  std::chrono::steady_clock::time_point last_active;  // last event (idle timeout)
  uint32_t interest = 0;   // epoll events registered
  std::deque<Reply> out;
  uint64_t queued = 0;     // unwritten reply bytes
  // The open put stream (DataPlanePut frames up to the commit frame): its
  // session, the tenant its frames must come from, and its first error
  // (then the session is gone and nothing of the stream stays reserved).
  std::unique_ptr<PutSession> put;
  std::string put_tenant;
  absl::Status put_error;
  bool put_open = false;
  // TLS (when the server has it): the session, the verified client
  // certificate once established, and a read or write that OpenSSL holds
  // until the socket is writable or readable respectively.
  std::unique_ptr<TlsSession> tls;
  bool tls_read_wants_write = false;
  bool tls_write_wants_read = false;
};

// Tags for the non-connection epoll entries.
char kListenTag, kWakeTag;

std::string PeerName(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    port = ntohs(v4->sin_port);
    return absl::StrCat("ipv4:", host, ":", port);
  }
  if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    port = ntohs(v6->sin6_port);
    return absl::StrCat("ipv6:[", host, "]:", port);
  }
  return "unknown";
}

// A listening socket on `address`; *port gets the bound port.
absl::StatusOr<int> Listen(const std::string& address, int* port) {
  TQ_ASSIGN_OR_RETURN(auto hp, SplitHostPort(address));
  std::string host = hp.first;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(hp.second);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("data plane address '", address, "': ", gai_strerror(rc)));
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = ErrnoText("socket");
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
      last_error = ErrnoText("bind/listen");
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    return absl::UnavailableError(
        absl::StrCat("cannot serve the data plane on ", address, ": ", last_error));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    const std::string error = ErrnoText("getsockname");
    close(fd);
    return absl::InternalError(absl::StrCat("cannot serve the data plane on ", address, ": ", error));
  }
  *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

}  // namespace

class DataPlaneServer::Loop {
 public:
  Loop(int listen_fd, const DataPlaneOptions& options, KvService* service, const RpcEnv* env,
       Shared* shared, DataPlaneTlsContext* tls)
      : listen_fd_(listen_fd),
        options_(options),
        service_(service),
        env_(env),
        tls_(tls),
        shared_(shared) {}

  ~Loop() {
    for (auto& [fd, conn] : conns_) {
      Uncharge(conn.get());
      close(fd);
    }
    for (auto& [fd, peer] : adopted_) close(fd);
    if (wake_fd_ >= 0) close(wake_fd_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }

  // `accept`: this loop accepts connections (on listen_fd_) and deals them
  // out round-robin over `peers` (itself included).
  absl::Status Init(bool accept) {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0) return absl::InternalError(ErrnoText("epoll/eventfd"));
    epoll_event ev{};
    if (accept) {
      ev.events = EPOLLIN;
      ev.data.ptr = &kListenTag;
      if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0)
        return absl::InternalError(ErrnoText("epoll_ctl(listen)"));
    }
    ev.events = EPOLLIN;
    ev.data.ptr = &kWakeTag;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0)
      return absl::InternalError(ErrnoText("epoll_ctl(eventfd)"));
    return absl::OkStatus();
  }

  void SetPeers(std::vector<Loop*> peers) { peers_ = std::move(peers); }

  // Hands an accepted connection to this loop (from the accepting loop's
  // thread).
  void Adopt(int fd, std::string peer) {
    {
      absl::MutexLock l(&mu_);
      adopted_.emplace_back(fd, std::move(peer));
    }
    Wake();
  }

  void Stop() {
    stop_.store(true);
    Wake();
  }

  void Run() {
    epoll_event events[kMaxEvents];
    for (;;) {
      // Timed work runs between waits, never while a wait's events (which
      // point at connections) are being handled: the end of the accept
      // backoff and, while connections are open, a sweep a second that
      // closes idle ones.
      const auto now = std::chrono::steady_clock::now();
      if (accept_paused_ && now >= accept_resume_) ResumeAccept();
      if (now >= next_sweep_) {
        CloseIdle(now);
        next_sweep_ = now + std::chrono::seconds(1);
      }
      std::optional<std::chrono::steady_clock::time_point> wake;
      if (accept_paused_) wake = accept_resume_;
      if (!conns_.empty()) wake = std::min(wake.value_or(next_sweep_), next_sweep_);
      int timeout_ms = -1;
      if (wake) {
        const auto left = *wake - std::chrono::steady_clock::now();
        timeout_ms = static_cast<int>(
            std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(left).count()));
      }
      const int n = epoll_wait(epoll_fd_, events, kMaxEvents, timeout_ms);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return;
      for (int i = 0; i < n; ++i) {
        void* tag = events[i].data.ptr;
        if (tag == &kWakeTag) {
          uint64_t wakes;
          (void)!read(wake_fd_, &wakes, sizeof wakes);
          if (stop_.load()) return;
          std::vector<std::pair<int, std::string>> adopted;
          {
            absl::MutexLock l(&mu_);
            adopted.swap(adopted_);
          }
          for (auto& [fd, peer] : adopted) Register(fd, std::move(peer));
          continue;
        }
        if (tag == &kListenTag) {
          Accept();
          continue;
        }
        OnEvent(static_cast<Conn*>(tag), events[i].events);
      }
    }
  }

 private:
  // Accepts what is pending and deals the connections out round-robin:
  // every loop gets its share whatever the kernel's wake-up order.
  void Accept() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors or memory: the pending connection stays queued
        // and the listener readable, so stop watching it for a while
        // instead of waking up for it in a loop.
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) PauseAccept();
        return;  // EAGAIN, or retried on the next wake-up
      }
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      Loop* to = peers_[next_peer_++ % peers_.size()];
      if (to == this) {
        Register(fd, PeerName(addr));
      } else {
        to->Adopt(fd, PeerName(addr));
      }
    }
  }

  // Stops or restarts watching the listener; false if epoll refused.
  bool WatchListener(bool on) {
    epoll_event ev{};
    ev.events = on ? EPOLLIN : 0;
    ev.data.ptr = &kListenTag;
    return epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev) == 0;
  }

  void PauseAccept() {
    if (!WatchListener(false)) return;  // then keep trying as before
    accept_paused_ = true;
    accept_resume_ = std::chrono::steady_clock::now() + kAcceptBackoff;
  }

  void ResumeAccept() {
    accept_paused_ = false;
    (void)WatchListener(true);
    Accept();
  }

  void Register(int fd, std::string peer) {
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    conn->peer = std::move(peer);
    Conn* c = conn.get();
    c->last_active = std::chrono::steady_clock::now();
    conns_[fd] = std::move(conn);
    shared_->connections.fetch_add(1);
    if (tls_ != nullptr) {
      absl::StatusOr<std::unique_ptr<TlsSession>> session = TlsSession::Accept(tls_->Current(), fd);
      if (!session.ok()) {
        RecordCall(*env_, "DataGetBlocks", c->peer, session.status(), 0.0);
        Close(c);
        return;
      }
      c->tls = *std::move(session);
    }
    c->interest = EPOLLIN;
    epoll_event ev{};
    ev.events = c->interest;
    ev.data.ptr = c;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      Close(c);
      return;
    }
    if (shared_->connections.load() > options_.max_connections) {
      // Over the cap: one RESOURCE_EXHAUSTED reply, then the connection
      // closes once the client has sent what it had (up to 1 MiB read and
      // dropped) and read the reply.
      Fail(c, absl::ResourceExhaustedError(absl::StrCat("the data plane serves at most ", options_.max_connections,
                                                        " connections; try again later")),
           /*skip=*/1 << 20);
      UpdateInterest(c);
    }
  }

  // Closes connections without an event for options_.idle_timeout, and
  // fails those whose charged frame is older than options_.frame_timeout
  // (one DEADLINE_EXCEEDED reply, then the connection closes).
  void CloseIdle(std::chrono::steady_clock::time_point now) {
    const auto limit = absl::ToChronoNanoseconds(options_.idle_timeout);
    const auto frame_limit = absl::ToChronoNanoseconds(options_.frame_timeout);
    std::vector<Conn*> idle, slow;
    for (auto& [fd, c] : conns_) {
      if (now - c->last_active > limit) {
        idle.push_back(c.get());
      } else if (c->charged > 0 && now - c->frame_start > frame_limit) {
        slow.push_back(c.get());
      }
    }
    for (Conn* c : idle) Close(c);
    for (Conn* c : slow) {
      shared_->frame_timeouts.fetch_add(1, std::memory_order_relaxed);
      const uint64_t got = c->in.size() - c->in_off;
      Fail(c, absl::DeadlineExceededError(absl::StrCat(
                  "a request frame of ", c->charged - 4, " bytes must arrive within ",
                  absl::FormatDuration(options_.frame_timeout), " of its length prefix; ",
                  got > 4 ? got - 4 : 0, " bytes of it came")));
      if (!Flush(c)) continue;
      if (c->out.empty()) {
        Close(c);
      } else {
        UpdateInterest(c);  // OnEvent closes it once the reply is written
      }
    }
  }

  void Wake() {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }

  void OnEvent(Conn* c, uint32_t events) {
    c->last_active = std::chrono::steady_clock::now();
    if (c->tls != nullptr && !c->tls->established()) {
      if (!Handshake(c)) return;
      if (!c->tls->established()) return UpdateInterest(c);
      events |= EPOLLIN;  // application data may have come with the handshake's last flight
    }
    if ((events & EPOLLIN) || (c->tls_read_wants_write && (events & EPOLLOUT))) {
      if (!ReadInput(c)) return;
      Process(c);
    }
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) || !c->out.empty()) {
      if (!Flush(c)) return;
      Process(c);  // requests held back by backpressure
      if (!Flush(c)) return;
    }
    if (c->closing && c->out.empty()) {
      if (c->skip == 0) {
        Close(c);
        return;
      }
      if (!c->half_closed) {  // the client reads the reply, then EOF, while we drain its frame
        if (c->tls != nullptr) c->tls->Shutdown();
        shutdown(c->fd, SHUT_WR);
        c->half_closed = true;
      }
    }
    UpdateInterest(c);
  }

  // Advances a TLS handshake; false (connection closed) when it failed.
  // The failure is recorded and logged with OpenSSL's reason.
  bool Handshake(Conn* c) {
    switch (c->tls->Handshake()) {
      case TlsIo::kDone:
        return true;
      case TlsIo::kWantRead:
        c->tls_read_wants_write = false;
        return true;
      case TlsIo::kWantWrite:
        c->tls_read_wants_write = true;  // UpdateInterest asks for EPOLLOUT
        return true;
      default:
        RecordCall(*env_, "DataTlsHandshake", c->peer,
                   absl::UnavailableError(absl::StrCat("TLS handshake failed: ", c->tls->error())), 0.0);
        Close(c);
        return false;
    }
  }

  // As read(2) on the connection, through TLS when it has it (-1 with
  // errno EAGAIN when TLS must wait for the socket; ECONNRESET on a TLS
  // error, logged).
  ssize_t ReadSome(Conn* c, char* p, size_t n) {
    if (c->tls == nullptr) return read(c->fd, p, n);
    TlsIo io;
    const size_t got = c->tls->Read(p, n, &io);
    c->tls_read_wants_write = io == TlsIo::kWantWrite;
    if (io == TlsIo::kDone) return static_cast<ssize_t>(got);
    if (io == TlsIo::kClosed) return 0;
    errno = EAGAIN;
    if (io == TlsIo::kError) {
      RecordCall(*env_, "DataGetBlocks", c->peer, absl::UnavailableError(absl::StrCat("TLS: ", c->tls->error())),
                 0.0);
      errno = ECONNRESET;
    }
    return -1;
  }

  // Appends what the socket has; false (connection closed) on a reset.
  bool ReadInput(Conn* c) {
    // TLS hands out one record per call: read until it would block, so that
    // nothing stays buffered inside OpenSSL unseen by epoll.
    const bool until_blocked = c->tls != nullptr;
    for (;;) {
      const ssize_t n = ReadSome(c, scratch_, sizeof scratch_);
      if (n > 0 && c->failed) {
        c->skip -= std::min<uint64_t>(c->skip, static_cast<uint64_t>(n));
        if (!until_blocked && static_cast<size_t>(n) < sizeof scratch_) return true;
        continue;
      }
      if (n > 0) {
        c->in.append(scratch_, static_cast<size_t>(n));
        // Each chunk is parsed before the next is read: a frame is charged
        // to the budget (or refused) as soon as its length prefix is here,
        // not after its whole body has been buffered.
        Process(c);
        if (!until_blocked && static_cast<size_t>(n) < sizeof scratch_) return true;
        // Under reply backpressure plain TCP stops reading (the socket
        // holds the rest); TLS reads on, since OpenSSL may hold bytes that
        // epoll does not see.
        if (!until_blocked && c->queued >= options_.max_queued_reply_bytes) return true;
        continue;
      }
      if (n == 0) {  // the client is done sending: answer what is complete, then close
        c->closing = true;
        c->skip = 0;
        return true;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      Close(c);
      return false;
    }
  }

  // Serves every complete frame while the reply queue has room.
  void Process(Conn* c) {
    while (!c->failed && c->queued < options_.max_queued_reply_bytes) {
      const size_t avail = c->in.size() - c->in_off;
      const char* p = c->in.data() + c->in_off;
      if (!c->preface_ok) {
        if (avail < kPrefaceBytes) break;
        if (std::memcmp(p, kDataPlanePreface, kPrefaceBytes) != 0) {
          Fail(c, absl::InvalidArgumentError(
                      "not a tqkv data-plane stream: expected the preface \"TQKVDP01\""));
          break;
        }
        c->preface_ok = true;
        c->in_off += kPrefaceBytes;
        continue;
      }
      if (avail < 4) break;
      uint32_t n;
      std::memcpy(&n, p, 4);
      if (n > options_.max_request_bytes) {
        Fail(c, absl::ResourceExhaustedError(
                 absl::StrCat("request frame of ", n, " bytes is over the data plane's limit of ",
                              options_.max_request_bytes)),
             4 + uint64_t{n} - avail);
        break;
      }
      if (avail < 4 + size_t{n}) {
        if (c->charged == 0) Charge(c, 4 + uint64_t{n}, avail);
        break;
      }
      v1::DataPlaneRequest req;
      if (!req.ParseFromArray(p + 4, static_cast<int>(n))) {
        Fail(c, absl::InvalidArgumentError("request frame is not a DataPlaneRequest"));
        break;
      }
      c->in_off += 4 + size_t{n};
      Serve(c, &req);
      Uncharge(c);  // only the frame at in_off can be charged: this one
    }
    if (c->in_off == c->in.size()) {
      c->in.clear();
      c->in_off = 0;
    } else if (c->in_off >= (64u << 10)) {
      c->in.erase(0, c->in_off);
      c->in_off = 0;
    }
    // A served large frame's buffer is returned, not kept for the next one.
    if (c->charged == 0 && c->in.capacity() > kKeptInputBytes && c->in.size() <= kKeptInputBytes)
      c->in.shrink_to_fit();
  }

  // Charges the incomplete frame at in_off (`bytes` with its prefix,
  // `avail` of them here) to the server's budget before its body is
  // buffered, and sizes the buffer for it. Over the budget: the connection
  // fails with RESOURCE_EXHAUSTED instead (the rest of the frame is read and
  // dropped so that the client can read the reply).
  void Charge(Conn* c, uint64_t bytes, size_t avail) {
    uint64_t held = shared_->buffered_bytes.load(std::memory_order_relaxed);
    do {
      if (held + bytes > options_.max_buffered_bytes) {
        shared_->budget_refusals.fetch_add(1, std::memory_order_relaxed);
        Fail(c,
             absl::ResourceExhaustedError(absl::StrCat(
                 "request frame of ", bytes - 4, " bytes would take the data plane's buffered request bytes to ",
                 held + bytes, ", over its budget of ", options_.max_buffered_bytes,
                 " (--data_max_buffered_bytes); retry later")),
             bytes - avail);
        return;
      }
    } while (!shared_->buffered_bytes.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
    c->charged = bytes;
    c->frame_start = std::chrono::steady_clock::now();
    if (c->in_off > 0) {
      c->in.erase(0, c->in_off);
      c->in_off = 0;
    }
    c->in.reserve(bytes);  // exactly the frame: no doubling on the way
  }

  // Returns the connection's charge, if any, to the budget.
  void Uncharge(Conn* c) {
    if (c->charged == 0) return;
    shared_->buffered_bytes.fetch_sub(c->charged, std::memory_order_relaxed);
    c->charged = 0;
  }

  // A protocol error: one reply with `s`, then the connection closes and
  // the rest of its input is ignored (`skip`: bytes of the failed frame
  // still to come, read and dropped before the close).
  void Fail(Conn* c, const absl::Status& s, uint64_t skip = 0) {
    RecordCall(*env_, "DataGetBlocks", c->peer, s, 0.0);
    v1::DataPlaneReply head;
    head.set_code(static_cast<uint32_t>(s.code()));
    head.set_message(std::string(s.message()));
    Queue(c, head, {}, 0);
    c->closing = true;
    c->failed = true;
    c->skip = skip;
    c->in.clear();
    c->in.shrink_to_fit();
    c->in_off = 0;
    Uncharge(c);
  }

  // One frame of a put stream (see the proto's "Puts"); fills *head on a
  // commit.
  // A frame whose identity fails fails its stream (its blocks would be
  // missing from the commit otherwise).
  absl::Status ServePut(Conn* c, const absl::StatusOr<Identity>& id, v1::DataPlanePut* put,
                        v1::DataPlaneReply* head) {
    if (!c->put_open) {
      if (id.ok()) c->put = service_->NewPutSession(*id);
      c->put_tenant = id.ok() ? id->tenant : "";
      c->put_error = absl::OkStatus();
      c->put_open = true;
    }
    absl::Status s = c->put_error;
    if (s.ok() && !id.ok()) s = id.status();
    if (s.ok() && id->tenant != c->put_tenant)
      s = absl::PermissionDeniedError("every frame of a data-plane put stream must carry the same identity");
    if (s.ok() && put->has_header()) {
      v1::PutBlocksRequest msg;
      msg.mutable_header()->Swap(put->mutable_header());
      s = c->put->OnMessage(msg);
    }
    if (s.ok() && put->blocks_size() > 0)  // one batch: dense blocks are encoded together
      s = c->put->OnBlocks(put->blocks());
    if (s.ok() && put->commit()) {
      absl::StatusOr<v1::PutBlocksResponse> r = c->put->Finish();
      if (r.ok()) *head->mutable_put() = std::move(*r);
      s = r.status();
    }
    if (!s.ok()) {
      c->put.reset();  // releases the stream's reservations; nothing was committed
      c->put_error = s;
    }
    if (put->commit()) {
      c->put.reset();
      c->put_open = false;
    }
    return s;
  }

  void Serve(Conn* c, v1::DataPlaneRequest* request) {
    const v1::DataPlaneRequest& req = *request;
    const auto start = std::chrono::steady_clock::now();
    const bool attend = req.op_case() == v1::DataPlaneRequest::kAttend;
    const bool append = req.op_case() == v1::DataPlaneRequest::kAppend;
    const bool put = req.op_case() == v1::DataPlaneRequest::kPut;
    absl::Status status;
    v1::DataPlaneReply head;
    GetPlan plan;
    std::unique_ptr<uint8_t[]> dense;
    std::vector<iovec> payload;
    uint64_t payload_bytes = 0;
    // As on gRPC (rpc_scope.cc): the client certificate counts where the
    // auth file maps certificates.
    const PeerCertificate none;
    const PeerCertificate* peer = c->tls != nullptr ? &c->tls->peer() : &none;
    if (absl::StatusOr<Identity> id = env_->auth->uses_certificates()
                                          ? env_->auth->Authenticate(req.authorization(), peer)
                                          : env_->auth->Authenticate(req.authorization());
        put) {
      status = ServePut(c, id, request->mutable_put(), &head);
    } else if (!id.ok()) {
      status = id.status();
    } else if (attend) {
      absl::StatusOr<v1::AttendResponse> r = service_->Attend(*id, req.attend());
      if (r.ok()) {
        *head.mutable_attend() = std::move(*r);
      } else {
        status = r.status();
      }
    } else if (append) {
      absl::StatusOr<v1::AppendResponse> r = service_->Append(*id, req.append());
      if (r.ok()) {
        *head.mutable_append() = std::move(*r);
      } else {
        status = r.status();
      }
    } else if (req.op_case() != v1::DataPlaneRequest::kGetBlocks) {
      status = absl::InvalidArgumentError("DataPlaneRequest names no operation (get_blocks, attend, append, put)");
    } else if (absl::StatusOr<GetPlan> p = service_->PrepareGet(*id, req.get_blocks()); !p.ok()) {
      status = p.status();
    } else {
      plan = std::move(*p);
      if (req.with_format()) *head.mutable_format() = plan.model->format;
      // Dense: K then V of each block, decoded by the backend into one buffer.
      const size_t t = plan.dense ? KvService::DenseTensorBytes(plan) : 0;
      if (plan.dense && 2 * t * plan.blocks.size() > options_.max_dense_reply_bytes) {
        status = absl::ResourceExhaustedError(
            absl::StrCat("a dense reply of ", 2 * t * plan.blocks.size(), " bytes is over the data plane's limit of ",
                         options_.max_dense_reply_bytes, "; ask for fewer blocks a request"));
      } else if (plan.dense) {
        dense.reset(new uint8_t[2 * t * plan.blocks.size()]);  // every byte is decoded into: no zero fill
        status = service_->DecodeDenseBlocks(plan, dense.get());
      }
      for (size_t i = 0; status.ok() && i < plan.blocks.size(); ++i) {
        const KvService::Span span =
            plan.dense ? KvService::Span{dense.get() + 2 * t * i, 2 * t} : KvService::PackedBytes(plan, i);
        v1::DataPlaneBlock* b = head.add_blocks();
        b->set_block_hash(plan.hashes[i]);
        b->set_tier(ToProtoTier(plan.blocks[i].tier));
        b->set_payload_bytes(span.size);
        if (span.size > 0) payload.push_back({const_cast<uint8_t*>(span.data), span.size});
        payload_bytes += span.size;
      }
    }
    if (!status.ok()) {
      head.Clear();
      head.set_code(static_cast<uint32_t>(status.code()));
      head.set_message(std::string(status.message()));
      payload.clear();
      payload_bytes = 0;
      plan.blocks.clear();
    }
    if (!status.ok()) dense.reset();
    Queue(c, head, std::move(payload), payload_bytes);
    c->out.back().blocks = std::move(plan.blocks);
    c->out.back().dense = std::move(dense);
    RecordCall(*env_, attend ? "DataAttend" : append ? "DataAppend" : put ? "DataPutBlocks" : "DataGetBlocks", c->peer, status,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  void Queue(Conn* c, const v1::DataPlaneReply& head, std::vector<iovec> payload,
             uint64_t payload_bytes) {
    Reply& r = c->out.emplace_back();
    const uint32_t h = static_cast<uint32_t>(head.ByteSizeLong());
    r.head_bytes = kReplyPrefixBytes + h;
    r.head = std::make_unique_for_overwrite<char[]>(r.head_bytes);
    std::memcpy(r.head.get(), &h, 4);
    std::memcpy(r.head.get() + 4, &payload_bytes, 8);
    head.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(r.head.get()) + kReplyPrefixBytes);
    r.parts.reserve(1 + payload.size());
    r.parts.push_back({r.head.get(), r.head_bytes});
    r.parts.insert(r.parts.end(), payload.begin(), payload.end());
    c->queued += r.head_bytes + payload_bytes;
  }

  // Writes queued replies until done or the socket is full; false if the
  // connection was closed on an error.
  bool Flush(Conn* c) {
    if (c->tls != nullptr && !c->tls->established()) return true;  // after the handshake
    while (!c->out.empty()) {
      iovec iov[kMaxIov];
      int n = 0;
      for (auto it = c->out.begin(); it != c->out.end() && n < kMaxIov; ++it)
        for (size_t k = it->next; k < it->parts.size() && n < kMaxIov; ++k) iov[n++] = it->parts[k];
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<size_t>(n);
      const ssize_t w = c->tls != nullptr ? WriteTls(c, iov, n) : sendmsg(c->fd, &m, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        Close(c);
        return false;
      }
      c->queued -= static_cast<uint64_t>(w);
      size_t left = static_cast<size_t>(w);
      while (left > 0) {
        Reply& r = c->out.front();
        iovec& part = r.parts[r.next];
        const size_t take = std::min(left, part.iov_len);
        part.iov_base = static_cast<char*>(part.iov_base) + take;
        part.iov_len -= take;
        left -= take;
        if (part.iov_len == 0 && ++r.next == r.parts.size()) c->out.pop_front();
      }
    }
    return true;
  }

  // One SSL_write of the front of `iov`: a payload of a record or more is
  // encrypted in place; smaller pieces are first copied together into one
  // record. Returns as sendmsg (EAGAIN while TLS waits for the socket).
  // A retry after EAGAIN starts with the same bytes, as OpenSSL requires:
  // nothing was consumed, and only more replies can have been queued.
  ssize_t WriteTls(Conn* c, const iovec* iov, int n) {
    if (n < 1) {  // Flush passes at least one part
      errno = EINVAL;
      return -1;
    }
    const char* p = static_cast<const char*>(iov[0].iov_base);
    size_t len = iov[0].iov_len;
    if (len < kTlsRecordBytes && n > 1) {
      len = 0;
      for (int i = 0; i < n && len < kTlsRecordBytes; ++i) {
        const size_t take = std::min(iov[i].iov_len, kTlsRecordBytes - len);
        std::memcpy(record_ + len, iov[i].iov_base, take);
        len += take;
      }
      p = record_;
    }
    TlsIo io;
    const size_t w = c->tls->Write(p, len, &io);
    c->tls_write_wants_read = io == TlsIo::kWantRead;
    if (io == TlsIo::kDone) return static_cast<ssize_t>(w);
    errno = io == TlsIo::kWantRead || io == TlsIo::kWantWrite ? EAGAIN : EPIPE;
    return -1;
  }

  void UpdateInterest(Conn* c) {
    uint32_t want = 0;
    if ((!c->closing || c->skip > 0) && c->queued < options_.max_queued_reply_bytes) want |= EPOLLIN;
    if (!c->out.empty()) want |= EPOLLOUT;
    if (c->tls != nullptr) {
      if (c->tls_write_wants_read || !c->tls->established()) want |= EPOLLIN;
      if (c->tls_read_wants_write) want |= EPOLLOUT;
    }
    if (want == c->interest) return;
    c->interest = want;
    epoll_event ev{};
    ev.events = want;
    ev.data.ptr = c;
    // A connection whose events cannot be changed cannot be served: shut
    // it down, so that its hang-up (always reported) closes it.
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c->fd, &ev) != 0) shutdown(c->fd, SHUT_RDWR);
  }

  void Close(Conn* c) {
    const int fd = c->fd;
    (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);  // close() removes it in any case
    close(fd);
    conns_.erase(fd);  // destroys *c
    Uncharge(c);
    shared_->connections.fetch_sub(1);
  }

  const int listen_fd_;
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
  absl::flat_hash_map<int, std::unique_ptr<Conn>> conns_;
  char scratch_[64 << 10];
  char record_[kTlsRecordBytes];  // WriteTls's gathered record
  // Accepting pauses for kAcceptBackoff when the process is out of
  // descriptors (or memory).
  static constexpr std::chrono::milliseconds kAcceptBackoff{100};
  bool accept_paused_ = false;
  std::chrono::steady_clock::time_point accept_resume_;
  std::chrono::steady_clock::time_point next_sweep_ = std::chrono::steady_clock::now();
  Shared* const shared_;  // the server's, shared by the loops
};

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Start(
    const DataPlaneOptions& options, KvService* service, const RpcEnv* env) {
  if (options.threads < 1 || options.threads > 64)
    return absl::InvalidArgumentError(
        absl::StrCat("data plane threads must be 1..64, not ", options.threads));
  if (options.max_request_bytes < 64)
    return absl::InvalidArgumentError("data plane max_request_bytes must be at least 64");
  if (options.max_connections < 1) return absl::InvalidArgumentError("data plane max_connections must be at least 1");
  if (options.idle_timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("data plane idle_timeout must be positive");
  if (options.frame_timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("data plane frame_timeout must be positive");
  if (options.max_buffered_bytes < 4 + uint64_t{options.max_request_bytes})
    return absl::InvalidArgumentError(absl::StrCat(
        "data plane max_buffered_bytes (", options.max_buffered_bytes, ") must hold one largest frame (4 + ",
        options.max_request_bytes, " bytes)"));
  std::unique_ptr<DataPlaneServer> s(new DataPlaneServer());
  s->options_ = options;
  int port = 0;
  TQ_ASSIGN_OR_RETURN(s->listen_fd_, Listen(options.listen, &port));
  TQ_ASSIGN_OR_RETURN(auto hp, SplitHostPort(options.listen));
  s->address_ = absl::StrCat(hp.first, ":", port);
  if (options.tls.enabled()) {
    TQ_ASSIGN_OR_RETURN(s->tls_, DataPlaneTlsContext::Create(options.tls, env->log));
  }
  std::vector<Loop*> all;
  for (int i = 0; i < options.threads; ++i) {
    auto loop = std::make_unique<Loop>(s->listen_fd_, s->options_, service, env, &s->shared_, s->tls_.get());
    TQ_RETURN_IF_ERROR(loop->Init(/*accept=*/i == 0));
    all.push_back(loop.get());
    s->loops_.push_back(std::move(loop));
  }
  s->loops_[0]->SetPeers(std::move(all));
  for (auto& loop : s->loops_) s->threads_.emplace_back([l = loop.get()] { l->Run(); });
  return s;
}

void DataPlaneServer::Shutdown() {
  for (auto& loop : loops_) loop->Stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  loops_.clear();  // closes every connection
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

DataPlaneServer::Stats DataPlaneServer::GetStats() const {
  Stats s;
  s.connections = shared_.connections.load(std::memory_order_relaxed);
  s.buffered_bytes = shared_.buffered_bytes.load(std::memory_order_relaxed);
  s.buffered_budget_bytes = options_.max_buffered_bytes;
  s.budget_refusals = shared_.budget_refusals.load(std::memory_order_relaxed);
  s.frame_timeouts = shared_.frame_timeouts.load(std::memory_order_relaxed);
  return s;
}

DataPlaneServer::~DataPlaneServer() { Shutdown(); }

}  // namespace tqkv::service
