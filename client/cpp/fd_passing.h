// Passing a file descriptor over a Unix-domain stream socket (SCM_RIGHTS),
// as a data-plane client shares memory with the server.
#ifndef TQKV_CLIENT_CPP_FD_PASSING_H_
#define TQKV_CLIENT_CPP_FD_PASSING_H_

#include <sys/types.h>

#include <cstddef>

namespace tqkv::client {

// Sends `n` bytes from `p` on `sock` with `fd` (when >= 0) as SCM_RIGHTS
// ancillary data of their first byte: sendmsg's result (bytes sent, or -1
// with errno set), retried on EINTR. No SIGPIPE.
ssize_t SendWithDescriptor(int sock, const void* p, size_t n, int fd);

}  // namespace tqkv::client

#endif  // TQKV_CLIENT_CPP_FD_PASSING_H_
