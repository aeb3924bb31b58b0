// DataPlaneServer::Loop: the output side (data_plane_loop.h).
#include "service/data_plane_loop.h"

#include <sys/socket.h>

#include <algorithm>

namespace tqkv::service {
namespace {

using data_plane_internal::kTlsRecordBytes;
using data_plane_internal::Reply;

constexpr size_t kReplyPrefixBytes = 12;  // u32 header length + u64 payload length
constexpr int kMaxIov = 64;

}  // namespace

void DataPlaneServer::Loop::Queue(Conn* c, const v1::DataPlaneReply& head, std::vector<iovec> payload,
                                  uint64_t payload_bytes) {
  Fill(c, &c->out.emplace_back(), head, std::move(payload), payload_bytes);
}

void DataPlaneServer::Loop::Fill(Conn* c, Reply* slot, const v1::DataPlaneReply& head, std::vector<iovec> payload,
                                 uint64_t payload_bytes) {
  Reply& r = *slot;
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

bool DataPlaneServer::Loop::Flush(Conn* c) {
  if (c->tls != nullptr && !c->tls->established()) return true;  // after the handshake
  while (Writable(c)) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = c->out.begin(); it != c->out.end() && !it->pending && n < kMaxIov; ++it)
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

ssize_t DataPlaneServer::Loop::WriteTls(Conn* c, const iovec* iov, int n) {
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

}  // namespace tqkv::service
