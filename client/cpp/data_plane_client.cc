#include "client/cpp/data_plane_client.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/fd_passing.h"
#include "proto/tqkv/v1/doorbell.h"
#include "google/protobuf/io/coded_stream.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the data plane frames are little-endian");

namespace tqkv::client {
namespace {

// Frames with raw payloads (proto "Data plane"): `u32 N, u64 P`, the
// request, P payload bytes; without: `u32 N`, the request.
constexpr char kPrefaceRaw[] = "TQKVDP02";
constexpr char kPreface[] = "TQKVDP01";

absl::Status Errno(absl::StatusCode code, const std::string& what) {
  return absl::Status(code, absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlaneClient>> DataPlaneClient::Connect(
    const DataPlaneClientOptions& options) {
  std::unique_ptr<DataPlaneClient> c(new DataPlaneClient(options));
  if (absl::Status s = c->EnsureConnected(); !s.ok()) return s;
  return c;
}

DataPlaneClient::~DataPlaneClient() {
  tls_.reset();
  if (fd_ >= 0) close(fd_);
  if (shared_.base != nullptr) munmap(shared_.base, shared_.size);
  if (shared_.fd >= 0) close(shared_.fd);
}

absl::Status DataPlaneClient::Broken(const absl::Status& s) {
  tls_.reset();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  write_failed_ = false;
  return s;
}

absl::Status DataPlaneClient::EnsureConnected() {
  if (write_failed_) Broken(absl::OkStatus()).IgnoreError();  // its replies were read or given up
  if (fd_ >= 0) return absl::OkStatus();
  const std::string& t = options_.target;
  if (t.starts_with("unix:")) {
    if (absl::Status s = OpenUnix(t.substr(5)); !s.ok()) return s;
    if (absl::Status s = Ready(""); !s.ok()) return s;
    return options_.shared_memory_bytes > 0 ? ShareMemory() : absl::OkStatus();
  }
  if (options_.shared_memory_bytes > 0)
    return absl::InvalidArgumentError(
        absl::StrCat("data plane target '", t, "': memory is shared only over a unix: target"));
  const size_t colon = t.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == t.size())
    return absl::InvalidArgumentError(absl::StrCat("data plane target '", t, "' is not HOST:PORT"));
  std::string host = t.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), t.substr(colon + 1).c_str(), &hints, &res); rc != 0)
    return absl::UnavailableError(absl::StrCat("data plane ", t, ": ", gai_strerror(rc)));
  absl::Status last = absl::UnavailableError(absl::StrCat("data plane ", t, ": no address"));
  for (addrinfo* ai = res; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = Errno(absl::StatusCode::kUnavailable, "socket");
      continue;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      last = Errno(absl::StatusCode::kUnavailable, absl::StrCat("connect to data plane ", t));
      close(fd);
      continue;
    }
    fd_ = fd;
  }
  freeaddrinfo(res);
  if (fd_ < 0) return last;
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return Ready(host);
}

absl::Status DataPlaneClient::Ready(const std::string& host) {
  const int64_t us = absl::ToInt64Microseconds(options_.timeout);
  timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (options_.tls.enabled()) {
    absl::StatusOr<std::unique_ptr<TlsStream>> tls = TlsStream::Connect(fd_, options_.tls, host);
    if (!tls.ok()) return Broken(tls.status());
    tls_ = *std::move(tls);
  }
  return SendAll(options_.raw_payloads ? kPrefaceRaw : kPreface, 8);
}

absl::Status DataPlaneClient::OpenUnix(const std::string& path) {
  if (options_.tls.enabled())
    return absl::InvalidArgumentError(
        absl::StrCat("data plane unix:", path, ": a Unix-domain socket has no TLS (leave the TLS options unset)"));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    return absl::InvalidArgumentError(
        absl::StrCat("data plane target unix:", path, ": a socket path is 1..", sizeof addr.sun_path - 1, " bytes"));
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno(absl::StatusCode::kUnavailable, "socket");
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    absl::Status s = Errno(absl::StatusCode::kUnavailable, absl::StrCat("connect to data plane unix:", path));
    close(fd);
    return s;
  }
  fd_ = fd;
  return absl::OkStatus();
}

absl::Status DataPlaneClient::ShareMemory() {
  if (shared_.base == nullptr) {
    const size_t size = options_.shared_memory_bytes;
    if (options_.doorbell && size < v1::doorbell::kMinBytes)
      return Broken(absl::InvalidArgumentError(
          absl::StrCat("a doorbell needs at least ", v1::doorbell::kMinBytes, " shared bytes")));
    const int fd = memfd_create("tqkv-data-plane", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return Broken(Errno(absl::StatusCode::kUnavailable, "memfd_create"));
    // Sealed against shrinking and growing: the server never reads past its end.
    if (ftruncate(fd, static_cast<off_t>(size)) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      absl::Status s = Errno(absl::StatusCode::kResourceExhausted, "sizing the shared memfd");
      close(fd);
      return Broken(s);
    }
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      absl::Status s = Errno(absl::StatusCode::kResourceExhausted, "mapping the shared memfd");
      close(fd);
      return Broken(s);
    }
    shared_ = {fd, static_cast<uint8_t*>(p), size};
  }
  // The share_memory frame, with the memfd as SCM_RIGHTS on its bytes.
  v1::DataPlaneRequest dr;
  dr.mutable_share_memory()->set_doorbell(options_.doorbell);
  if (!options_.token.empty()) dr.set_authorization(absl::StrCat("Bearer ", options_.token));
  const uint32_t n = static_cast<uint32_t>(dr.ByteSizeLong());
  const uint64_t none = 0;
  frame_.resize(12 + n);
  std::memcpy(frame_.data(), &n, 4);
  std::memcpy(frame_.data() + 4, &none, 8);
  dr.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(frame_.data() + 12));
  const ssize_t w = SendWithDescriptor(fd_, frame_.data(), frame_.size(), shared_.fd);
  if (w < 0) return SendFailed(w);
  // The descriptor went with the first byte; the rest of a short write follows.
  if (absl::Status s = SendAll(frame_.data() + w, frame_.size() - static_cast<size_t>(w)); !s.ok()) return s;
  v1::DataPlaneReply reply;
  if (absl::Status s = ReceiveBare(&reply); !s.ok()) return Broken(s);
  if (reply.shared_memory_bytes() != shared_.size)
    return Broken(absl::InternalError(absl::StrCat("the server mapped ", reply.shared_memory_bytes(), " of ",
                                                   shared_.size, " shared bytes")));
  doorbell_seq_ = v1::doorbell::Word(shared_.base, v1::doorbell::kRequestSeq)->load();
  return absl::OkStatus();
}

absl::Status DataPlaneClient::NeedsRaw() const {
  if (options_.raw_payloads) return absl::OkStatus();
  return absl::FailedPreconditionError("raw tensors need DataPlaneClientOptions::raw_payloads");
}

absl::Status DataPlaneClient::SendFailed(ssize_t w) {
  if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
    // The server closed the connection; replies it sent first may still
    // be waiting to be read: keep the socket for reading.
    const absl::Status s = Errno(absl::StatusCode::kUnavailable, "data plane send");
    shutdown(fd_, SHUT_WR);
    write_failed_ = true;
    return s;
  }
  return Failed(w, "send");
}

absl::Status DataPlaneClient::Failed(ssize_t r, const char* op) {
  if (r == 0) return Broken(absl::UnavailableError("data plane connection closed by the server"));
  if (errno == EAGAIN || errno == EWOULDBLOCK)
    return Broken(absl::DeadlineExceededError(absl::StrCat("data plane ", op, " timed out")));
  return Broken(Errno(absl::StatusCode::kUnavailable, absl::StrCat("data plane ", op)));
}

absl::Status DataPlaneClient::SendAll(const char* p, size_t n) {
  while (n > 0 && tls_ != nullptr) {
    absl::StatusOr<size_t> w = tls_->Write(p, n);
    if (!w.ok()) return Broken(w.status());
    p += *w;
    n -= *w;
  }
  while (n > 0) {
    const ssize_t w = send(fd_, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return SendFailed(w);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status DataPlaneClient::Recv(char* p, size_t cap, size_t want, size_t* have, int flags) {
  while (*have < want && tls_ != nullptr) {  // TLS hands out a record at a time: loop
    absl::StatusOr<size_t> r = tls_->Read(p + *have, cap - *have);
    if (!r.ok()) return Broken(r.status());
    if (*r == 0) return Broken(absl::UnavailableError("data plane connection closed by the server"));
    *have += *r;
  }
  while (*have < want) {
    const ssize_t r = recv(fd_, p + *have, cap - *have, flags);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Failed(r, "receive");
    *have += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

void DataPlaneClient::PollForReply() {
  if (options_.reply_poll <= absl::ZeroDuration() || tls_ != nullptr) return;
  const absl::Time until = absl::Now() + options_.reply_poll;
  pollfd pfd{fd_, POLLIN, 0};
  while (poll(&pfd, 1, 0) == 0 && absl::Now() < until) {
  }
}

absl::Status DataPlaneClient::GetBlocks(const v1::GetBlocksRequest& req, DataPlaneBlocks* out,
                                        bool with_format) {
  v1::DataPlaneRequest dr;
  *dr.mutable_get_blocks() = req;
  dr.set_with_format(with_format);
  return Exchange(&dr, out);
}

absl::StatusOr<v1::AttendResponse> DataPlaneClient::Attend(const v1::AttendRequest& req) {
  v1::DataPlaneRequest dr;
  if (absl::Status s = Exchange(&dr, &scratch_, v1::DataPlaneRequest::kAttendFieldNumber, &req); !s.ok())
    return s;
  return std::move(*scratch_.reply_.mutable_attend());
}

absl::StatusOr<v1::AttendResponse> DataPlaneClient::Attend(const v1::AttendRequest& req,
                                                            std::span<const std::span<const char>> inputs,
                                                            std::span<char> out) {
  if (absl::Status s = NeedsRaw(); !s.ok()) return s;
  // The outputs have their queries' dtypes and shapes.
  uint64_t want = 0;
  for (const v1::AttendItem& item : req.items()) {
    uint64_t n = item.q().dtype() == v1::DTYPE_FP32 ? 4 : 2;
    for (int64_t d : item.q().shape()) n *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
    want += n;
  }
  if (out.size() != want)
    return absl::InvalidArgumentError(
        absl::StrCat("the outputs take ", want, " bytes, `out` has ", out.size()));
  // The server returns outputs as the reply's payload for a frame with one.
  size_t in_bytes = 0;
  for (std::span<const char> part : inputs) in_bytes += part.size();
  if (in_bytes == 0)
    return absl::InvalidArgumentError("no raw inputs: a request with every tensor inline takes Attend(req)");
  v1::DataPlaneRequest dr;
  if (absl::Status s = Exchange(&dr, &scratch_, v1::DataPlaneRequest::kAttendFieldNumber, &req, inputs, out);
      !s.ok())
    return s;
  return std::move(*scratch_.reply_.mutable_attend());
}

absl::StatusOr<v1::AppendResponse> DataPlaneClient::Append(const v1::AppendRequest& req) {
  v1::DataPlaneRequest dr;
  if (absl::Status s = Exchange(&dr, &scratch_, v1::DataPlaneRequest::kAppendFieldNumber, &req); !s.ok())
    return s;
  return std::move(*scratch_.reply_.mutable_append());
}

absl::StatusOr<v1::AppendResponse> DataPlaneClient::Append(const v1::AppendRequest& req,
                                                            std::span<const std::span<const char>> inputs) {
  if (absl::Status s = NeedsRaw(); !s.ok()) return s;
  v1::DataPlaneRequest dr;
  if (absl::Status s = Exchange(&dr, &scratch_, v1::DataPlaneRequest::kAppendFieldNumber, &req, inputs); !s.ok())
    return s;
  return std::move(*scratch_.reply_.mutable_append());
}

absl::StatusOr<v1::PutBlocksResponse> DataPlaneClient::PutBlocks(const v1::PutHeader& header,
                                                                  std::vector<v1::PutBlock> blocks,
                                                                  size_t frame_bytes, const v1::DeviceKv* device) {
  constexpr int kInFlight = 8;
  if (absl::Status s = EnsureConnected(); !s.ok()) return s;
  // The stream lives on this connection: if it breaks, the server drops the
  // stream and the client must not go on over a new one.
  const int stream_fd = fd_;
  auto lost = [&] {
    return absl::UnavailableError("data plane connection lost during a put stream; nothing was committed");
  };
  int in_flight = 0;
  int sent = 0;  // frames sent: frame k's payload may use shared area k mod kInFlight
  absl::Status first_error;
  v1::DataPlaneReply reply;
  // Sends `dr` as the stream's next frame; then reads replies until at most
  // `keep` frames are in flight. An I/O failure ends the call.
  // An I/O failure after the server reported an error (it closes the
  // connection after a protocol error) reports that error.
  // The blocks' tensors (or packed payloads) travel as the frame's raw
  // payload, moved out of the messages: no serialization copy.
  std::vector<std::string> payload;
  auto frame = [&](v1::DataPlaneRequest* dr, int keep) -> absl::Status {
    if (fd_ != stream_fd) return first_error.ok() ? lost() : first_error;
    const std::vector<std::span<const char>> parts(payload.begin(), payload.end());
    if (absl::Status s = SendFrame(dr, 0, nullptr, parts, sent++ % kInFlight); !s.ok()) {
      // A server that refused an earlier frame answers it, then closes:
      // its reply says why this send failed.
      for (; write_failed_ && in_flight > 0 && first_error.ok(); --in_flight) {
        absl::Status r = ReceiveBare(&reply);
        if (!r.ok() && fd_ == stream_fd) first_error = r;
      }
      Broken(absl::OkStatus()).IgnoreError();
      return first_error.ok() ? s : first_error;
    }
    ++in_flight;
    dr->Clear();
    payload.clear();
    while (in_flight > keep) {
      absl::Status s = ReceiveBare(&reply);
      --in_flight;
      if (!s.ok() && first_error.ok()) first_error = s;
      if (fd_ != stream_fd) return first_error.ok() ? lost() : first_error;
    }
    return absl::OkStatus();
  };
  v1::DataPlaneRequest dr;
  *dr.mutable_put()->mutable_header() = header;
  if (device != nullptr) *dr.mutable_put()->mutable_device() = *device;
  size_t bytes = 0;
  auto take = [&](std::string* data) {
    if (data->empty()) return;
    payload.push_back(std::move(*data));
    data->clear();
  };
  for (v1::PutBlock& b : blocks) {
    bytes += b.ByteSizeLong();
    if (options_.raw_payloads) {
      if (b.has_k()) take(b.mutable_k()->mutable_data());
      if (b.has_v()) take(b.mutable_v()->mutable_data());
      take(b.mutable_payload());
    }
    dr.mutable_put()->add_blocks()->Swap(&b);
    if (bytes < frame_bytes) continue;
    bytes = 0;
    if (absl::Status s = frame(&dr, kInFlight - 1); !s.ok()) return s;
    if (!first_error.ok()) break;  // end the failed stream: its commit frame returns the error
    if (device != nullptr) *dr.mutable_put()->mutable_device() = *device;
  }
  dr.mutable_put()->set_commit(true);
  if (absl::Status s = frame(&dr, 0); !s.ok()) return s;
  if (!first_error.ok()) return first_error;
  return std::move(*reply.mutable_put());
}

absl::Status DataPlaneClient::SendFrame(v1::DataPlaneRequest* dr, int field,
                                       const google::protobuf::MessageLite* body,
                                       std::span<const std::span<const char>> payload, int area) {
  absl::StatusOr<std::span<const std::span<const char>>> wire = BuildFrame(dr, field, body, payload, area);
  if (!wire.ok()) return wire.status();
  if (wire->empty()) return SendAll(frame_.data(), frame_.size());
  std::vector<std::span<const char>> parts = {frame_};
  for (std::span<const char> part : *wire)
    if (!part.empty()) parts.push_back(part);
  return SendParts(parts);
}

absl::StatusOr<std::span<const std::span<const char>>> DataPlaneClient::BuildFrame(
    v1::DataPlaneRequest* dr, int field, const google::protobuf::MessageLite* body,
    std::span<const std::span<const char>> payload, int area) {
  using google::protobuf::io::CodedOutputStream;
  if (absl::Status s = EnsureConnected(); !s.ok()) return s;
  if (!options_.token.empty()) dr->set_authorization(absl::StrCat("Bearer ", options_.token));
  dr->clear_shared();
  uint64_t total = 0;
  for (std::span<const char> part : payload) total += part.size();
  // Payloads start past the doorbell's words and frames, when it has them.
  const size_t first = options_.doorbell ? v1::doorbell::kPayloads : 0;
  if (shared_.base != nullptr && fd_ >= 0 && total > 0) {
    // The payload through the shared memory when it fits this frame's
    // area; the reply's payload may take the rest of it.
    constexpr size_t kAreas = 8, kAlign = 64;
    const size_t usable = shared_.size - first;
    const size_t span = area < 0 ? usable : usable / kAreas / kAlign * kAlign;
    const size_t at = first + (area < 0 ? 0 : static_cast<size_t>(area) % kAreas * span);
    if (total <= span) {
      uint8_t* to = shared_.base + at;
      for (std::span<const char> part : payload) {
        std::memcpy(to, part.data(), part.size());
        to += part.size();
      }
      const size_t reply_at = std::min(span, (total + kAlign - 1) / kAlign * kAlign);
      v1::SharedPayload* sp = dr->mutable_shared();
      sp->set_offset(at);
      sp->set_bytes(total);
      sp->set_reply_offset(at + reply_at);
      sp->set_reply_capacity(span - reply_at);
      payload = {};
    }
  } else if (shared_.base != nullptr && fd_ >= 0 && area < 0) {
    // A reply's payload (read blocks) may come this way.
    dr->mutable_shared()->set_reply_offset(first);
    dr->mutable_shared()->set_reply_capacity(shared_.size - first);
  }
  const size_t head = dr->ByteSizeLong();
  const size_t body_bytes = body != nullptr ? body->ByteSizeLong() : 0;
  const uint32_t tag = static_cast<uint32_t>(field) << 3 | 2;  // length-delimited
  const size_t n = head + (body != nullptr ? CodedOutputStream::VarintSize32(tag) +
                                                 CodedOutputStream::VarintSize64(body_bytes) + body_bytes
                                           : 0);
  if (n > UINT32_MAX) return absl::InvalidArgumentError("data plane request over 4 GiB");
  uint64_t payload_bytes = 0;
  for (std::span<const char> part : payload) payload_bytes += part.size();
  const size_t prefix = options_.raw_payloads ? 12 : 4;
  frame_.resize(prefix + n);
  const uint32_t n32 = static_cast<uint32_t>(n);
  std::memcpy(frame_.data(), &n32, 4);
  if (options_.raw_payloads) std::memcpy(frame_.data() + 4, &payload_bytes, 8);
  auto* p = reinterpret_cast<uint8_t*>(frame_.data() + prefix);
  p = dr->SerializeWithCachedSizesToArray(p);
  if (body != nullptr) {
    p = CodedOutputStream::WriteVarint32ToArray(tag, p);
    p = CodedOutputStream::WriteVarint64ToArray(body_bytes, p);
    body->SerializeWithCachedSizesToArray(p);
  }
  return payload_bytes == 0 ? std::span<const std::span<const char>>() : payload;
}

absl::Status DataPlaneClient::RingDoorbell(v1::DataPlaneRequest* dr, DataPlaneBlocks* out, int field,
                                          const google::protobuf::MessageLite* body,
                                          std::span<const std::span<const char>> payload, std::span<char> into,
                                          bool* rang) {
  namespace db = v1::doorbell;
  *rang = false;
  absl::StatusOr<std::span<const std::span<const char>>> wire = BuildFrame(dr, field, body, payload);
  if (!wire.ok()) return wire.status();
  // A payload that did not fit, or a frame larger than the doorbell's
  // area: the socket takes the call.
  if (!wire->empty() || frame_.size() > db::kAreaBytes) return absl::OkStatus();
  *rang = true;
  ++doorbell_calls_;
  uint8_t* base = shared_.base;
  std::memcpy(base + db::kRequestArea, frame_.data(), frame_.size());
  db::Word(base, db::kRequestBytes)->store(static_cast<uint32_t>(frame_.size()), std::memory_order_relaxed);
  const uint32_t seq = ++doorbell_seq_;
  db::Word(base, db::kRequestSeq)->store(seq);
  // A server loop that does not poll is woken by a ring frame.
  if (db::Word(base, db::kServerPolling)->load() == 0) {
    v1::DataPlaneRequest ring;
    ring.mutable_ring();
    if (absl::Status s = SendFrame(&ring); !s.ok()) return s;
  }
  std::atomic<uint32_t>* reply_seq = db::Word(base, db::kReplySeq);
  const absl::Time start = absl::Now();
  while (reply_seq->load() != seq && absl::Now() - start < options_.reply_poll) {
  }
  if (reply_seq->load() != seq) {
    db::Word(base, db::kClientWaiting)->store(1);
    for (uint32_t v; (v = reply_seq->load()) != seq;) {
      const absl::Duration left = options_.timeout - (absl::Now() - start);
      if (left <= absl::ZeroDuration()) {
        db::Word(base, db::kClientWaiting)->store(0);
        return Broken(absl::DeadlineExceededError("data plane doorbell call timed out"));
      }
      const timespec ts = absl::ToTimespec(left);
      syscall(SYS_futex, reply_seq, FUTEX_WAIT, v, &ts, nullptr, 0);
    }
    db::Word(base, db::kClientWaiting)->store(0);
  }
  const uint32_t n = db::Word(base, db::kReplyBytes)->load(std::memory_order_relaxed);
  uint32_t h;
  if (n >= 12) std::memcpy(&h, base + db::kReplyArea, 4);
  if (n < 12 || n > db::kReplyAreaBytes || h != n - 12 ||
      !out->reply_.ParseFromArray(base + db::kReplyArea + 12, static_cast<int>(h)))
    return Broken(absl::InternalError("the doorbell's reply frame does not parse"));
  if (out->reply_.code() != 0)
    return absl::Status(static_cast<absl::StatusCode>(out->reply_.code()), out->reply_.message());
  const uint64_t shared = out->reply_.shared_reply_bytes();
  if (shared != into.size() || (shared > 0 && shared > dr->shared().reply_capacity()))
    return Broken(absl::InternalError(absl::StrCat("the doorbell's reply has ", shared,
                                                   " payload bytes, expected ", into.size())));
  if (shared > 0) std::memcpy(into.data(), base + dr->shared().reply_offset(), shared);
  return absl::OkStatus();
}

absl::Status DataPlaneClient::SendParts(std::span<std::span<const char>> parts) {
  if (tls_ != nullptr) {
    for (std::span<const char> part : parts)
      if (absl::Status s = SendAll(part.data(), part.size()); !s.ok()) return s;
    return absl::OkStatus();
  }
  // One sendmsg for the lot while the socket takes it; a partial write
  // resumes inside the part it stopped in.
  std::vector<iovec> iov;
  for (std::span<const char> part : parts) iov.push_back({const_cast<char*>(part.data()), part.size()});
  size_t first = 0;
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t w = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return SendFailed(w);
    for (auto left = static_cast<size_t>(w); left > 0 && first < iov.size();) {
      const size_t step = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + step;
      iov[first].iov_len -= step;
      left -= step;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return absl::OkStatus();
}

absl::Status DataPlaneClient::ReceiveBare(v1::DataPlaneReply* reply) {
  constexpr size_t kPrefix = 12;
  char prefix[kPrefix];
  size_t have = 0;
  if (absl::Status s = Recv(prefix, kPrefix, kPrefix, &have, MSG_WAITALL); !s.ok()) return s;
  uint32_t h;
  uint64_t p;
  std::memcpy(&h, prefix, 4);
  std::memcpy(&p, prefix + 4, 8);
  if (h > options_.max_header_bytes || p != 0)
    return Broken(absl::InternalError(absl::StrCat("unexpected data plane reply: ", h, " header and ", p,
                                                   " payload bytes")));
  head_.resize(h);
  have = 0;
  if (h > 0) {
    if (absl::Status s = Recv(head_.data(), h, h, &have, MSG_WAITALL); !s.ok()) return s;
  }
  if (!reply->ParseFromArray(head_.data(), static_cast<int>(h)))
    return Broken(absl::InternalError("data plane reply header does not parse"));
  if (reply->code() != 0) return absl::Status(static_cast<absl::StatusCode>(reply->code()), reply->message());
  return absl::OkStatus();
}

absl::Status DataPlaneClient::Exchange(v1::DataPlaneRequest* dr, DataPlaneBlocks* out, int field,
                                       const google::protobuf::MessageLite* body,
                                       std::span<const std::span<const char>> payload, std::span<char> into) {
  const bool call = field == v1::DataPlaneRequest::kAttendFieldNumber ||
                    field == v1::DataPlaneRequest::kAppendFieldNumber;
  if (options_.doorbell && call && !payload.empty()) {
    if (absl::Status s = EnsureConnected(); !s.ok()) return s;
    bool rang = false;
    absl::Status s = RingDoorbell(dr, out, field, body, payload, into, &rang);
    if (rang || !s.ok()) return s;
  }
  if (absl::Status s = SendFrame(dr, field, body, payload); !s.ok()) return s;

  // One recv usually brings the prefix, the header and the payload's first
  // bytes; the rest of the payload is received in place.
  constexpr size_t kPrefix = 12, kFirstRead = 4096;
  if (head_.size() < kFirstRead) head_.resize(kFirstRead);
  size_t have = 0;
  PollForReply();
  if (absl::Status s = Recv(head_.data(), head_.size(), kPrefix, &have, 0); !s.ok()) return s;
  uint32_t h;
  uint64_t p;
  std::memcpy(&h, head_.data(), 4);
  std::memcpy(&p, head_.data() + 4, 8);
  if (h > options_.max_header_bytes)
    return Broken(absl::ResourceExhaustedError(
        absl::StrCat("data plane reply header of ", h, " bytes is over the client's limit")));
  if (head_.size() < kPrefix + h) head_.resize(kPrefix + h);
  if (absl::Status s = Recv(head_.data(), head_.size(), kPrefix + h, &have, 0); !s.ok()) return s;
  if (!out->reply_.ParseFromArray(head_.data() + kPrefix, static_cast<int>(h)))
    return Broken(absl::InternalError("data plane reply header does not parse"));
  // The payload: the blocks' bytes, or what the caller receives into.
  uint64_t sum = 0;
  out->offsets_.clear();
  for (const v1::DataPlaneBlock& b : out->reply_.blocks()) {
    out->offsets_.push_back(sum);
    sum += b.payload_bytes();
  }
  if (!into.empty()) sum = out->reply_.code() == 0 ? into.size() : 0;
  // Where the payload goes: the caller's buffer, or *out's (grown to it).
  auto destination = [&](uint64_t bytes) {
    if (!into.empty()) return into.data();
    if (bytes > out->capacity_) {
      out->buf_.reset(new char[bytes]);
      out->capacity_ = bytes;
    }
    out->payload_bytes_ = bytes;
    return out->buf_.get();
  };
  if (const uint64_t shared = out->reply_.shared_reply_bytes(); shared > 0) {
    // The payload is in the shared memory, where this frame said.
    if (p != 0 || shared != sum || have != kPrefix + h || !dr->has_shared() ||
        shared > dr->shared().reply_capacity())
      return Broken(absl::InternalError(absl::StrCat("data plane reply puts ", shared,
                                                     " payload bytes in shared memory, expected ", sum)));
    std::memcpy(destination(shared), shared_.base + dr->shared().reply_offset(), shared);
    return absl::OkStatus();
  }
  const size_t early = have - kPrefix - h;  // payload bytes already received
  if (sum != p || early > p)
    return Broken(absl::InternalError(absl::StrCat("data plane reply announces ", p,
                                                   " payload bytes, expected ", sum)));
  char* dest = destination(p);
  if (early > 0) std::memcpy(dest, head_.data() + kPrefix + h, early);
  // MSG_WAITALL: one call sleeps until the whole rest has arrived.
  size_t got = early;
  if (absl::Status s = Recv(dest, p, p, &got, MSG_WAITALL); !s.ok()) return s;
  if (out->reply_.code() != 0)
    return absl::Status(static_cast<absl::StatusCode>(out->reply_.code()), out->reply_.message());
  return absl::OkStatus();
}

}  // namespace tqkv::client
