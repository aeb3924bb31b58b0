// DataPlaneServer::Loop: memory shared with same-host clients and its
// doorbell (data_plane_loop.h; proto "Same-host shared memory").
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <string>

#include "proto/tqkv/v1/doorbell.h"
#include "service/data_plane_loop.h"

namespace tqkv::service {

using data_plane_internal::PassedFd;
using data_plane_internal::Served;

absl::Status DataPlaneServer::Loop::ShareMemory(Conn* c, const v1::ShareMemory& share, v1::DataPlaneReply* head) {
  if (!c->unix_socket)
    return absl::FailedPreconditionError(
        "memory is shared only over the data plane's Unix-domain socket (--data_socket), not TCP");
  if (options_.max_shared_bytes == 0)
    return absl::FailedPreconditionError("this server shares no memory (--data_max_shared_bytes=0)");
  PassedFd fd;
  fd.Reset(c->passed_fd.Release());
  if (fd.get() < 0)
    return absl::FailedPreconditionError(
        "no file descriptor came with the share_memory frame: send a memfd as SCM_RIGHTS with its bytes");
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return absl::InvalidArgumentError(
        "the shared descriptor must be a memfd sealed against shrinking (F_SEAL_SHRINK), so that no read "
        "passes its end");
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || st.st_size <= 0)
    return absl::InvalidArgumentError("the shared memfd is empty");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (share.doorbell() && size < v1::doorbell::kMinBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("a shared region with a doorbell has at least ", v1::doorbell::kMinBytes, " bytes"));
  if (size > options_.max_shared_bytes)
    return absl::ResourceExhaustedError(absl::StrCat("a shared region of ", size, " bytes is over the server's ",
                                                     options_.max_shared_bytes, " (--data_max_shared_bytes)"));
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED)
    return absl::InvalidArgumentError(absl::StrCat("mapping the shared memfd: ", std::strerror(errno)));
  c->shared.Reset(static_cast<uint8_t*>(p), size);
  head->set_shared_memory_bytes(size);
  const bool listed = std::find(doorbells_.begin(), doorbells_.end(), c) != doorbells_.end();
  c->doorbell = share.doorbell();
  if (c->doorbell) {
    c->doorbell_served = v1::doorbell::Word(c->shared.base(), v1::doorbell::kRequestSeq)->load();
    v1::doorbell::Word(c->shared.base(), v1::doorbell::kServerPolling)->store(doorbell_polling_ ? 1 : 0);
    if (!listed) doorbells_.push_back(c);
  } else if (listed) {
    doorbells_.erase(std::find(doorbells_.begin(), doorbells_.end(), c));
  }
  return absl::OkStatus();
}

bool DataPlaneServer::Loop::ServeDoorbell(Conn* c) {
  namespace db = v1::doorbell;
  if (!c->doorbell || c->busy || c->closed) return false;
  uint8_t* base = c->shared.base();
  const uint32_t seq = db::Word(base, db::kRequestSeq)->load();
  if (seq == c->doorbell_served) return false;
  c->doorbell_served = seq;
  c->last_active = std::chrono::steady_clock::now();  // a call that crossed no socket keeps it open too
  // The frame is copied out first: the client's memory may change under us.
  const uint32_t n = db::Word(base, db::kRequestBytes)->load(std::memory_order_relaxed);
  Served s;
  s.method = "DataAttend";
  s.start = std::chrono::steady_clock::now();
  v1::DataPlaneRequest req;
  if (n < 12 || n > db::kAreaBytes) {
    s.status = absl::InvalidArgumentError(absl::StrCat("a doorbell request of ", n, " bytes (at most ",
                                                       db::kAreaBytes, ")"));
  } else {
    const std::string frame(reinterpret_cast<const char*>(base + db::kRequestArea), n);
    uint32_t body;
    std::memcpy(&body, frame.data(), 4);
    if (body != n - 12 || !req.ParseFromArray(frame.data() + 12, static_cast<int>(body))) {
      s.status = absl::InvalidArgumentError("the doorbell's request frame is not a DataPlaneRequest");
    } else if (req.op_case() != v1::DataPlaneRequest::kAttend && req.op_case() != v1::DataPlaneRequest::kAppend) {
      s.status = absl::FailedPreconditionError("the doorbell serves attend and append; send other frames on the socket");
    } else {
      s = Compute(c, &req, {}, n);
      if (s.status.ok() && s.payload_bytes > 0)
        s.status = absl::ResourceExhaustedError("the reply's payload does not fit the frame's shared reply area");
    }
  }
  if (!s.status.ok()) {
    s.head.Clear();
    s.head.set_code(static_cast<uint32_t>(s.status.code()));
    s.head.set_message(std::string(s.status.message()));
  }
  if (s.authenticated) c->authenticated = true;
  std::string reply = s.head.SerializeAsString();
  if (reply.size() + 12 > db::kReplyAreaBytes) {
    v1::DataPlaneReply big;
    big.set_code(static_cast<uint32_t>(absl::StatusCode::kResourceExhausted));
    big.set_message("the reply header does not fit the doorbell's reply area");
    reply = big.SerializeAsString();
  }
  AnswerDoorbell(c, seq, reply);
  RecordCall(*env_, s.method, c->peer, s.status,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - s.start).count(), n,
             reply.size() + 12);
  return true;
}

void DataPlaneServer::Loop::AnswerDoorbell(Conn* c, uint32_t seq, const std::string& reply) {
  namespace db = v1::doorbell;
  uint8_t* base = c->shared.base();
  const uint32_t h = static_cast<uint32_t>(reply.size());
  const uint64_t none = 0;
  std::memcpy(base + db::kReplyArea, &h, 4);
  std::memcpy(base + db::kReplyArea + 4, &none, 8);
  std::memcpy(base + db::kReplyArea + 12, reply.data(), reply.size());
  db::Word(base, db::kReplyBytes)->store(h + 12, std::memory_order_relaxed);
  db::Word(base, db::kReplySeq)->store(seq);
  if (db::Word(base, db::kClientWaiting)->load() != 0)
    syscall(SYS_futex, db::Word(base, db::kReplySeq), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void DataPlaneServer::Loop::CloseDoorbell(Conn* c) {
  namespace db = v1::doorbell;
  if (auto it = std::find(doorbells_.begin(), doorbells_.end(), c); it != doorbells_.end()) doorbells_.erase(it);
  if (!c->doorbell) return;
  c->doorbell = false;
  // A client that rings from now on finds no poller and sends a ring frame,
  // which fails on the closed socket; one that rang before is answered.
  uint8_t* base = c->shared.base();
  db::Word(base, db::kServerPolling)->store(0);
  const uint32_t seq = db::Word(base, db::kRequestSeq)->load();
  if (seq == c->doorbell_served) return;
  v1::DataPlaneReply closed;
  closed.set_code(static_cast<uint32_t>(absl::StatusCode::kUnavailable));
  closed.set_message("the data plane closed the connection");
  AnswerDoorbell(c, seq, closed.SerializeAsString());
}

bool DataPlaneServer::Loop::PollDoorbells(bool polling) {
  if (polling != doorbell_polling_) {
    for (Conn* c : doorbells_)
      v1::doorbell::Word(c->shared.base(), v1::doorbell::kServerPolling)->store(polling ? 1 : 0);
    doorbell_polling_ = polling;
  }
  bool served = false;
  for (Conn* c : doorbells_) served = ServeDoorbell(c) || served;
  return served;
}

absl::Status DataPlaneServer::Loop::SharedSpans(const Conn* c, const v1::SharedPayload& shared,
                                                absl::Span<const uint8_t>* in, absl::Span<uint8_t>* reply) const {
  if (c->shared.base() == nullptr)
    return absl::FailedPreconditionError("this connection shares no memory: send a share_memory frame first");
  if (!in->empty())
    return absl::InvalidArgumentError("a frame with `shared` carries no raw payload of its own");
  const uint64_t size = c->shared.size();
  auto check = [&](uint64_t off, uint64_t n, const char* what) {
    if (off <= size && n <= size - off) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("shared ", what, " [", off, ", +", n, ") is outside the ", size, " shared bytes"));
  };
  if (absl::Status s = check(shared.offset(), shared.bytes(), "payload"); !s.ok()) return s;
  if (absl::Status s = check(shared.reply_offset(), shared.reply_capacity(), "reply"); !s.ok()) return s;
  *in = {c->shared.base() + shared.offset(), shared.bytes()};
  *reply = {c->shared.base() + shared.reply_offset(), shared.reply_capacity()};
  return absl::OkStatus();
}

}  // namespace tqkv::service
