// Internal to the data plane (//service:data_plane): the state of one
// connection and of one queued reply, as the loop (data_plane_loop.h) keeps
// them. Not part of the DataPlaneServer contract.
//
// Thread safety: a Conn belongs to one loop and is touched only on that
// loop's thread.
#ifndef TQKV_SERVICE_DATA_PLANE_CONN_H_
#define TQKV_SERVICE_DATA_PLANE_CONN_H_

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/tqkv/v1/tqkv.pb.h"
#include "service/data_plane_tls.h"
#include "service/put_session.h"
#include "service/tenant_budget.h"
#include "storage/block_store.h"

namespace tqkv::service::data_plane_internal {

// One queued reply: `head` (prefix + DataPlaneReply) and iovecs over it and
// over the stored payloads, which `blocks` keeps alive until the last byte
// has been handed to the kernel.
struct Reply {
  std::unique_ptr<char[]> head;  // every byte is written: no zero fill
  size_t head_bytes = 0;
  std::vector<storage::BlockData> blocks;
  std::unique_ptr<uint8_t[]> owned;  // a dense get's decoded K/V, an Attend's raw outputs (iovecs point into it)
  TenantBudget::Reservation charge;  // the payload's bytes in the data plane's reply budget
  std::vector<iovec> parts;  // non-empty once filled; parts[0] covers `head`
  size_t next = 0;           // first part not fully written
  // The place of the reply of a request being served off the loop (on the
  // backend work queue): nothing at or after it is written until it is
  // filled.
  bool pending = false;
};

// A served request's reply and what its payload points into, before it is
// queued: built where the request is served (the loop's thread or a
// backend work-queue worker), queued on the loop's thread.
struct Served {
  absl::Status status;
  v1::DataPlaneReply head;
  std::vector<iovec> payload;
  uint64_t payload_bytes = 0;
  std::vector<storage::BlockData> blocks;
  std::unique_ptr<uint8_t[]> owned;
  TenantBudget::Reservation charge;
  bool authenticated = false;  // its credentials held: the connection is authenticated from now on
  const char* method = "";     // for the call's metrics and log line
  std::chrono::steady_clock::time_point start;
  uint64_t frame_bytes = 0;
};

// A connection's received bytes. Unlike std::string it grows without
// zero-filling, so that reads land in it directly instead of going through
// a scratch buffer (a copy of every byte received).
class InputBuffer {
 public:
  InputBuffer() = default;
  // A moved-from buffer is empty (the bytes, and pointers into them, move).
  InputBuffer(InputBuffer&& o) noexcept
      : data_(std::move(o.data_)), size_(std::exchange(o.size_, 0)), capacity_(std::exchange(o.capacity_, 0)) {}
  InputBuffer& operator=(InputBuffer&& o) noexcept {
    data_ = std::move(o.data_);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
    return *this;
  }

  const char* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  // Room for at least `n` more bytes after size(), keeping the contents
  // (growing at least 2x when it must grow); returns where they go.
  char* Room(size_t n) {
    if (capacity_ - size_ < n) Reallocate(std::max(size_ + n, 2 * capacity_));
    return data_.get() + size_;
  }
  // Counts `n` bytes written at Room() as received. REQUIRES: n at most
  // the room asked for.
  void Received(size_t n) { size_ += n; }
  // Drops the first `n` bytes. REQUIRES: n <= size().
  void DropFront(size_t n) {
    std::memmove(data_.get(), data_.get() + n, size_ - n);
    size_ -= n;
  }
  void Clear() { size_ = 0; }
  // Capacity for `n` bytes in all, exactly, if it has less.
  void Reserve(size_t n) {
    if (capacity_ < n) Reallocate(n);
  }
  // Returns memory beyond size() to the allocator.
  void ShrinkToFit() {
    if (capacity_ > size_) Reallocate(size_);
  }

 private:
  void Reallocate(size_t capacity) {
    std::unique_ptr<char[]> d = capacity > 0 ? std::make_unique_for_overwrite<char[]>(capacity) : nullptr;
    if (size_ > 0) std::memcpy(d.get(), data_.get(), size_);
    data_ = std::move(d);
    capacity_ = capacity;
  }

  std::unique_ptr<char[]> data_;
  size_t size_ = 0, capacity_ = 0;
};

// A file descriptor a client passed (SCM_RIGHTS), closed with its owner.
class PassedFd {
 public:
  PassedFd() = default;
  PassedFd(const PassedFd&) = delete;
  PassedFd& operator=(const PassedFd&) = delete;
  ~PassedFd() { Reset(-1); }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// The memory a connection shares with its client (proto "Same-host shared
// memory"), unmapped with its owner.
class SharedRegion {
 public:
  SharedRegion() = default;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion() { Reset(nullptr, 0); }
  uint8_t* base() const { return base_; }
  size_t size() const { return size_; }
  void Reset(uint8_t* base, size_t size) {
    if (base_ != nullptr) munmap(base_, size_);
    base_ = base;
    size_ = size;
  }

 private:
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

struct Conn {
  int fd = -1;
  std::string peer;
  bool local = false;      // the peer is on this host's loopback (may pass CUDA IPC handles)
  bool unix_socket = false;  // accepted on the Unix-domain socket (may share memory)
  // The last descriptor the client passed, until a share_memory frame
  // takes it, and the memory it shares.
  PassedFd passed_fd;
  SharedRegion shared;
  // The shared region carries calls too (proto "Doorbell"): the request
  // number last served.
  bool doorbell = false;
  uint32_t doorbell_served = 0;
  // A request of this connection has passed authentication (always, on a
  // server without auth): until then its frames are held to
  // max_unauthenticated_frame_bytes, and a raw payload is accepted only
  // after its request's credentials have been checked.
  bool authenticated = false;
  InputBuffer in;          // received bytes; [in_off, size) not yet parsed
  size_t in_off = 0;
  bool preface_ok = false;
  // Opened with kDataPlanePrefaceRaw: frames are `u32 H, u64 P`, the
  // request, then P bytes of raw payload.
  bool raw = false;
  bool closing = false;    // close once the queued replies are written
  // After a protocol error: the rest of the input is discarded; `skip`
  // bytes of an oversized frame are still read (and dropped) after the
  // error reply, so that a client still sending it can read the reply.
  bool failed = false;
  uint64_t skip = 0;
  // A failed connection still skipping is closed at this time regardless
  // (kFailedLinger after the failure).
  std::chrono::steady_clock::time_point linger_until;
  bool half_closed = false;  // shutdown(SHUT_WR) sent while skipping
  // The incomplete frame at in_off is charged `charged` bytes (all of it, prefix included)
  // to the server's buffered-bytes budget since `frame_start`; 0: none.
  uint64_t charged = 0;
  std::chrono::steady_clock::time_point frame_start;
  std::chrono::steady_clock::time_point last_active;  // last event (idle timeout)
  uint32_t interest = 0;   // epoll events registered
  // A frame is being served off the loop (on the backend work queue); its
  // reply's place is a pending Reply in `out`. Meanwhile the next frame is
  // read and charged but not served, and the connection is not destroyed
  // (the task uses it): a close marks it `closed` and is finished when the
  // task's reply comes back.
  bool busy = false;
  bool closed = false;
  // A complete frame waits: for the busy one, or (`stalled`) for room in
  // the work queue. Nothing more is read until it is served.
  bool waiting = false;
  bool stalled = false;
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

}  // namespace tqkv::service::data_plane_internal

#endif  // TQKV_SERVICE_DATA_PLANE_CONN_H_
