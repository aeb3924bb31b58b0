// DataPlaneServer::Loop: the loop itself (data_plane_loop.h).
#include "service/data_plane_loop.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "service/net_address.h"

namespace tqkv::service {
namespace {

using data_plane_internal::ErrnoText;

constexpr int kMaxEvents = 64;

// Tags for the non-connection epoll entries.
char kListenTag, kUnixListenTag, kWakeTag;

}  // namespace

DataPlaneServer::Loop::~Loop() {
  for (auto& [fd, conn] : conns_) {
    Uncharge(conn.get());
    close(fd);
  }
  for (auto& [fd, peer] : adopted_) close(fd);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

absl::Status DataPlaneServer::Loop::Init(bool accept) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return absl::InternalError(ErrnoText("epoll/eventfd"));
  epoll_event ev{};
  if (accept) {
    ev.events = EPOLLIN;
    ev.data.ptr = &kListenTag;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0)
      return absl::InternalError(ErrnoText("epoll_ctl(listen)"));
    ev.data.ptr = &kUnixListenTag;
    if (unix_fd_ >= 0 && epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, unix_fd_, &ev) != 0)
      return absl::InternalError(ErrnoText("epoll_ctl(unix listen)"));
  }
  ev.events = EPOLLIN;
  ev.data.ptr = &kWakeTag;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0)
    return absl::InternalError(ErrnoText("epoll_ctl(eventfd)"));
  return absl::OkStatus();
}

void DataPlaneServer::Loop::Adopt(int fd, std::string peer) {
  {
    absl::MutexLock l(&mu_);
    adopted_.emplace_back(fd, std::move(peer));
  }
  Wake();
}

void DataPlaneServer::Loop::Stop() {
  stop_.store(true);
  Wake();
}

void DataPlaneServer::Loop::Run() {
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
    // A frame the full work queue refused is offered again every millisecond.
    if (!stalled_.empty()) wake = std::min(wake.value_or(now + kStalledRetry), now + kStalledRetry);
    int timeout_ms = -1;
    if (wake) {
      const auto left = *wake - std::chrono::steady_clock::now();
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(left).count()));
    }
    if ((in_flight_ > 0 && now < poll_until_) || now < spin_until_) timeout_ms = 0;
    // Doorbells (proto "Doorbell"): their regions say whether this loop
    // polls (before it sleeps, a request that came meanwhile is served
    // rather than missed), and what waits is served.
    if (!doorbells_.empty() && PollDoorbells(timeout_ms == 0)) {
      timeout_ms = 0;
      if (options_.busy_poll > absl::ZeroDuration())
        spin_until_ = std::chrono::steady_clock::now() + absl::ToChronoMicroseconds(options_.busy_poll);
    }
    const int n = epoll_wait(epoll_fd_, events, kMaxEvents, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    bool finished = false;
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
        finished = true;
        continue;
      }
      if (tag == &kListenTag) {
        Accept(listen_fd_, false);
        continue;
      }
      if (tag == &kUnixListenTag) {
        Accept(unix_fd_, true);
        continue;
      }
      OnEvent(static_cast<Conn*>(tag), events[i].events);
    }
    // Work that may close connections runs once the events (which point at
    // connections) have been handled: replies of requests served off the
    // loop, and frames the full work queue refused, offered again.
    if (finished || finished_ready_.load(std::memory_order_acquire)) TakeFinished();
    if (!stalled_.empty()) {
      std::vector<Conn*> stalled;
      stalled.swap(stalled_);
      for (Conn* c : stalled) Resume(c);
    }
  }
}

void DataPlaneServer::Loop::Accept(int listener, bool unix) {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = accept4(listener, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors or memory: the pending connection stays queued
      // and the listener readable, so stop watching it for a while
      // instead of waking up for it in a loop.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) PauseAccept();
      return;  // EAGAIN, or retried on the next wake-up
    }
    const int one = 1;
    if (!unix) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::string peer = unix ? UnixPeerName(options_.socket_path) : PeerName(addr);
    Loop* to = peers_[next_peer_++ % peers_.size()];
    if (to == this) {
      Register(fd, std::move(peer));
    } else {
      to->Adopt(fd, std::move(peer));
    }
  }
}

bool DataPlaneServer::Loop::WatchListener(bool on) {
  epoll_event ev{};
  ev.events = on ? EPOLLIN : 0;
  ev.data.ptr = &kListenTag;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev) != 0) return false;
  ev.data.ptr = &kUnixListenTag;
  return unix_fd_ < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, unix_fd_, &ev) == 0;
}

void DataPlaneServer::Loop::PauseAccept() {
  if (!WatchListener(false)) return;  // then keep trying as before
  accept_paused_ = true;
  accept_resume_ = std::chrono::steady_clock::now() + kAcceptBackoff;
}

void DataPlaneServer::Loop::ResumeAccept() {
  accept_paused_ = false;
  (void)WatchListener(true);
  Accept(listen_fd_, false);
  if (unix_fd_ >= 0) Accept(unix_fd_, true);
}

void DataPlaneServer::Loop::Register(int fd, std::string peer) {
  auto conn = std::make_unique<Conn>();
  conn->fd = fd;
  conn->peer = std::move(peer);
  conn->local = IsLoopbackPeer(conn->peer);
  conn->unix_socket = IsUnixPeer(conn->peer);
  conn->authenticated = !env_->auth->enabled();
  Conn* c = conn.get();
  c->last_active = std::chrono::steady_clock::now();
  conns_[fd] = std::move(conn);
  shared_->connections.fetch_add(1);
  if (tls_ != nullptr && !IsUnixPeer(c->peer)) {
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

void DataPlaneServer::Loop::CloseIdle(std::chrono::steady_clock::time_point now) {
  const auto limit = absl::ToChronoNanoseconds(options_.idle_timeout);
  const auto frame_limit = absl::ToChronoNanoseconds(options_.frame_timeout);
  std::vector<Conn*> idle, slow;
  for (auto& [fd, c] : conns_) {
    if (now - c->last_active > limit || (c->failed && c->skip > 0 && now >= c->linger_until)) {
      idle.push_back(c.get());
    } else if (c->charged > c->in.size() - c->in_off && now - c->frame_start > frame_limit) {  // still arriving
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

void DataPlaneServer::Loop::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
}

void DataPlaneServer::Loop::OnEvent(Conn* c, uint32_t events) {
  c->last_active = std::chrono::steady_clock::now();
  if (c->tls != nullptr && !c->tls->established()) {
    if (!Handshake(c)) return;
    if (!c->tls->established()) return UpdateInterest(c);
    events |= EPOLLIN;  // application data may have come with the handshake's last flight
  }
  if (c->busy && (events & (EPOLLHUP | EPOLLERR))) {  // gone: its pending reply has no reader
    Close(c);
    return;
  }
  if ((events & EPOLLIN) || (c->tls_read_wants_write && (events & EPOLLOUT))) {
    if (!ReadInput(c)) return;
    Process(c);
  }
  if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) || Writable(c)) {
    if (!Flush(c)) return;
    Process(c);  // requests held back by backpressure
    if (!Flush(c)) return;
  }
  Settle(c);
}

void DataPlaneServer::Loop::Settle(Conn* c) {
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

bool DataPlaneServer::Loop::Handshake(Conn* c) {
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

void DataPlaneServer::Loop::UpdateInterest(Conn* c) {
  uint32_t want = 0;
  if ((!c->closing || c->skip > 0) && c->queued < options_.max_queued_reply_bytes && !c->waiting) want |= EPOLLIN;
  if (Writable(c)) want |= EPOLLOUT;
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

void DataPlaneServer::Loop::Close(Conn* c) {
  if (c->stalled) {
    if (auto it = std::find(stalled_.begin(), stalled_.end(), c); it != stalled_.end()) stalled_.erase(it);
    c->stalled = false;
  }
  if (c->busy) {  // its task still uses it: the descriptor stays ours (no new connection reuses it) until then
    if (!c->closed) {
      (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
      shutdown(c->fd, SHUT_RDWR);
      c->closed = true;
    }
    return;
  }
  CloseDoorbell(c);
  const int fd = c->fd;
  (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);  // close() removes it in any case
  close(fd);
  Uncharge(c);  // before the erase destroys *c
  conns_.erase(fd);
  shared_->connections.fetch_sub(1);
}

}  // namespace tqkv::service
