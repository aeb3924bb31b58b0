#include "tests/raw_data_plane.h"

#include <gtest/gtest.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#include <algorithm>
#include <cstring>

namespace tqkv::testing {

int RawConnect(const std::string& address) {
  if (address.starts_with("unix:")) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, address.data() + 5, std::min(address.size() - 5, sizeof addr.sun_path - 1));
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
  }
  const size_t colon = address.rfind(':');
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  EXPECT_EQ(getaddrinfo(address.substr(0, colon).c_str(), address.substr(colon + 1).c_str(), &hints, &res), 0);
  if (res == nullptr) return -1;
  const int fd = socket(res->ai_family, SOCK_STREAM, 0);
  EXPECT_EQ(connect(fd, res->ai_addr, res->ai_addrlen), 0);
  freeaddrinfo(res);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void SendRaw(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

std::string Frame(const v1::DataPlaneRequest& r) {
  const std::string body = r.SerializeAsString();
  const uint32_t n = static_cast<uint32_t>(body.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + body;
}

std::string RawFrame(const v1::DataPlaneRequest& r, const std::string& payload) {
  const std::string body = r.SerializeAsString();
  const uint32_t n = static_cast<uint32_t>(body.size());
  const uint64_t p = payload.size();
  return std::string(reinterpret_cast<const char*>(&n), 4) + std::string(reinterpret_cast<const char*>(&p), 8) +
         body + payload;
}

bool ReadReply(int fd, v1::DataPlaneReply* head, std::string* payload) {
  auto read_n = [&](char* p, size_t n) {
    while (n > 0) {
      const ssize_t r = recv(fd, p, n, 0);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  };
  char prefix[12];
  if (!read_n(prefix, 12)) return false;
  uint32_t h;
  uint64_t p;
  std::memcpy(&h, prefix, 4);
  std::memcpy(&p, prefix + 4, 8);
  std::string hb(h, '\0'), dropped;
  std::string* out = payload != nullptr ? payload : &dropped;
  out->assign(p, '\0');
  return read_n(hb.data(), h) && read_n(out->data(), p) && head->ParseFromString(hb);
}

bool ClosedByServer(int fd) {
  char c;
  return recv(fd, &c, 1, 0) == 0;
}

}  // namespace tqkv::testing
