#include "client/cpp/fd_passing.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace tqkv::client {

ssize_t SendWithDescriptor(int sock, const void* p, size_t n, int fd) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{const_cast<void*>(p), n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* m = CMSG_FIRSTHDR(&msg);
    m->cmsg_level = SOL_SOCKET;
    m->cmsg_type = SCM_RIGHTS;
    m->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(m), &fd, sizeof fd);
  }
  ssize_t w;
  do {
    w = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  return w;
}

}  // namespace tqkv::client
