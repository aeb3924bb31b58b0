// DataPlaneServer::Loop: the input side (data_plane_loop.h).
#include "service/data_plane_loop.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace tqkv::service {
namespace {

constexpr size_t kPrefaceBytes = 8;
// An input buffer grown past this for a large frame is shrunk once the
// frame has been served.
constexpr size_t kKeptInputBytes = 1 << 20;

}  // namespace

ssize_t DataPlaneServer::Loop::ReadSome(Conn* c, char* p, size_t n) {
  if (c->unix_socket) return ReadUnix(c, p, n);
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

ssize_t DataPlaneServer::Loop::ReadUnix(Conn* c, char* p, size_t n) {
  // A descriptor passed with the bytes (a share_memory frame's memfd) is
  // kept until that frame takes it; an earlier one is closed.
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  iovec iov{p, n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t got = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
  for (cmsghdr* m = got >= 0 ? CMSG_FIRSTHDR(&msg) : nullptr; m != nullptr; m = CMSG_NXTHDR(&msg, m)) {
    if (m->cmsg_level != SOL_SOCKET || m->cmsg_type != SCM_RIGHTS) continue;
    const size_t fds = (m->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < fds; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(m) + i * sizeof(int), sizeof fd);
      c->passed_fd.Reset(fd);
    }
  }
  return got;
}

bool DataPlaneServer::Loop::ReadInput(Conn* c) {
  // TLS hands out one record per call: read until it would block, so that
  // nothing stays buffered inside OpenSSL unseen by epoll.
  const bool until_blocked = c->tls != nullptr;
  for (;;) {
    // Where the read lands: the rest of a charged frame goes straight
    // into the input buffer (sized for it when it was charged), in one
    // read; anything else into scratch_, then appended (or dropped, on a
    // failed connection), so that connections sending small frames hold
    // buffers of their size.
    char* to = scratch_;
    size_t want = sizeof scratch_;
    const size_t rest = c->charged > 0 ? c->charged - (c->in.size() - c->in_off) : 0;
    if (!c->failed && rest > 0) {
      want = rest;
      to = c->in.Room(rest);
    }
    const ssize_t n = ReadSome(c, to, want);
    if (n > 0 && c->failed) {
      c->skip -= std::min<uint64_t>(c->skip, static_cast<uint64_t>(n));
      if (!until_blocked && static_cast<size_t>(n) < want) return true;
      continue;
    }
    if (n > 0) {
      if (to == scratch_) {
        std::memcpy(c->in.Room(static_cast<size_t>(n)), scratch_, static_cast<size_t>(n));
      }
      c->in.Received(static_cast<size_t>(n));
      // What came is parsed before more is read: a frame is charged to
      // the budget (or refused) as soon as its length prefix is here, not
      // after its whole body has been buffered.
      Process(c);
      if (!until_blocked && static_cast<size_t>(n) < want) return true;
      // Under reply backpressure, or with a complete frame waiting, plain
      // TCP stops reading (the socket holds the rest); TLS reads on, since
      // OpenSSL may hold bytes that epoll does not see.
      if (!until_blocked && (c->queued >= options_.max_queued_reply_bytes || c->waiting)) return true;
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

void DataPlaneServer::Loop::Process(Conn* c) {
  c->waiting = false;
  while (!c->failed && !c->closed && c->queued < options_.max_queued_reply_bytes) {
    const size_t avail = c->in.size() - c->in_off;
    const char* p = c->in.data() + c->in_off;
    if (!c->preface_ok) {
      if (avail < kPrefaceBytes) break;
      c->raw = std::memcmp(p, kDataPlanePrefaceRaw, kPrefaceBytes) == 0;
      if (!c->raw && std::memcmp(p, kDataPlanePreface, kPrefaceBytes) != 0) {
        Fail(c, absl::InvalidArgumentError(
                    "not a tqkv data-plane stream: expected the preface \"TQKVDP01\" or \"TQKVDP02\""));
        break;
      }
      c->preface_ok = true;
      c->in_off += kPrefaceBytes;
      continue;
    }
    // The prefix: u32 N (the request's bytes), and with raw payloads u64 P.
    const size_t prefix = c->raw ? 12 : 4;
    if (avail < prefix) break;
    uint32_t n;
    uint64_t payload = 0;
    std::memcpy(&n, p, 4);
    if (c->raw) std::memcpy(&payload, p + 4, 8);
    if (payload > options_.max_request_bytes || n + payload > options_.max_request_bytes) {
      Fail(c,
           absl::ResourceExhaustedError(absl::StrCat("request frame of ", n + payload,
                                                     " bytes is over the data plane's limit of ",
                                                     options_.max_request_bytes)),
           // The whole frame is skipped (for at most kFailedLinger), so that a
           // client still sending it reads the reply instead of a reset.
           prefix + n + payload - avail);
      break;
    }
    const size_t frame = prefix + n + payload;
    // Before a connection has authenticated, a large frame's request is
    // checked before its payload is buffered.
    if (!c->authenticated && frame > options_.max_unauthenticated_frame_bytes &&
        !CheckUnauthenticated(c, prefix, n, frame, avail))
      break;
    if (avail < frame) {
      if (c->charged == 0) Charge(c, frame, avail);
      break;
    }
    if (c->busy) {  // served after the reply of the one being served off the loop
      c->waiting = true;
      break;
    }
    v1::DataPlaneRequest req;
    if (!req.ParseFromArray(p + prefix, static_cast<int>(n))) {
      Fail(c, absl::InvalidArgumentError("request frame is not a DataPlaneRequest"));
      break;
    }
    if (req.op_case() == v1::DataPlaneRequest::kRing) {  // served at the doorbell; no reply here
      c->in_off += frame;
      Uncharge(c);
      ServeDoorbell(c);
      continue;
    }
    if (env_->backend_work != nullptr && UsesBackend(req)) {
      if (Submit(c, &req, prefix, n, payload, frame)) continue;  // its next frame is read meanwhile
      c->waiting = true;  // the work queue is full: offered again shortly
      if (!c->stalled) stalled_.push_back(c);
      c->stalled = true;
      break;
    }
    c->in_off += frame;
    Serve(c, &req, {reinterpret_cast<const uint8_t*>(p + prefix + n), payload}, frame);
    Uncharge(c);  // only the frame at in_off can be charged: this one
    if (options_.busy_poll > absl::ZeroDuration())
      spin_until_ = std::chrono::steady_clock::now() + absl::ToChronoMicroseconds(options_.busy_poll);
  }
  if (c->in_off == c->in.size()) {
    c->in.Clear();
    c->in_off = 0;
  } else if (c->in_off >= (64u << 10)) {
    c->in.DropFront(c->in_off);
    c->in_off = 0;
  }
  // A served large frame's buffer is returned, not kept for the next one.
  if (c->charged == 0 && c->in.capacity() > kKeptInputBytes && c->in.size() <= kKeptInputBytes)
    c->in.ShrinkToFit();
}

bool DataPlaneServer::Loop::CheckUnauthenticated(Conn* c, size_t prefix, uint32_t n, uint64_t frame,
                                                size_t avail) {
  const size_t head = prefix + n;
  if (head > options_.max_unauthenticated_frame_bytes) {
    Fail(c,
         absl::ResourceExhaustedError(absl::StrCat(
             "request of ", head, " bytes on a connection not yet authenticated: the limit there is ",
             options_.max_unauthenticated_frame_bytes,
             " (--data_max_unauthenticated_frame_bytes); a frame with raw payloads (TQKVDP02) has its "
             "request checked before its payload is read")),
         frame - avail);
    return false;
  }
  if (avail < head) {
    if (c->charged == 0) Charge(c, head, avail);
    return false;
  }
  v1::DataPlaneRequest req;
  if (!req.ParseFromArray(c->in.data() + c->in_off + prefix, static_cast<int>(n))) {
    Fail(c, absl::InvalidArgumentError("request frame is not a DataPlaneRequest"));
    return false;
  }
  if (absl::StatusOr<Identity> id = Identify(c, req); !id.ok()) {
    Fail(c, id.status(), frame - avail);
    return false;
  }
  // Authenticated: the frame is charged whole from here on.
  Uncharge(c);
  return true;
}

void DataPlaneServer::Loop::Charge(Conn* c, uint64_t bytes, size_t avail) {
  uint64_t held = shared_->buffered_bytes.load(std::memory_order_relaxed);
  do {
    if (held + bytes > options_.max_buffered_bytes) {
      shared_->budget_refusals.fetch_add(1, std::memory_order_relaxed);
      Fail(c,
           absl::ResourceExhaustedError(absl::StrCat(
               "request frame of ", bytes, " bytes would take the data plane's buffered request bytes to ",
               held + bytes, ", over its budget of ", options_.max_buffered_bytes,
               " (--data_max_buffered_bytes); retry later")),
           bytes - avail);
      return;
    }
  } while (!shared_->buffered_bytes.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
  c->charged = bytes;
  c->frame_start = std::chrono::steady_clock::now();
  if (c->in_off > 0) {
    c->in.DropFront(c->in_off);
    c->in_off = 0;
  }
  c->in.Reserve(bytes);  // exactly the frame: no doubling on the way
}

void DataPlaneServer::Loop::Uncharge(Conn* c) {
  if (c->charged == 0) return;
  shared_->buffered_bytes.fetch_sub(c->charged, std::memory_order_relaxed);
  c->charged = 0;
}

void DataPlaneServer::Loop::Fail(Conn* c, const absl::Status& s, uint64_t skip) {
  RecordCall(*env_, "DataGetBlocks", c->peer, s, 0.0);
  v1::DataPlaneReply head;
  head.set_code(static_cast<uint32_t>(s.code()));
  head.set_message(std::string(s.message()));
  Queue(c, head, {}, 0);
  c->closing = true;
  c->failed = true;
  c->skip = skip;
  c->linger_until = std::chrono::steady_clock::now() + kFailedLinger;
  c->in.Clear();
  c->in.ShrinkToFit();
  c->in_off = 0;
  Uncharge(c);
}

}  // namespace tqkv::service
