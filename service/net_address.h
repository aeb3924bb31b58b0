// HOST:PORT parsing and TCP listening shared by the gRPC, data-plane and
// metrics listeners; the data plane's Unix-domain socket.
#ifndef TQKV_SERVICE_NET_ADDRESS_H_
#define TQKV_SERVICE_NET_ADDRESS_H_

#include <sys/socket.h>

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"

namespace tqkv::service {

// Splits "host:port" / "[v6]:port" into (host as written, brackets kept;
// port). INVALID_ARGUMENT if malformed or the port is outside 0..65535.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);

// A non-blocking, close-on-exec listening socket on `address` (port 0: a
// free one) with a `backlog`-deep queue; *port gets the bound port. `what`
// names the listener in errors ("data plane", "metrics"): INVALID_ARGUMENT
// for an address that does not resolve, UNAVAILABLE when no address of it
// can be bound.
absl::StatusOr<int> ListenTcp(const std::string& address, const char* what, int backlog, int* port);

// A non-blocking, close-on-exec listening Unix-domain stream socket at
// `path` with file mode `mode` (set before the socket listens, so no
// connection is accepted under a wider mode). A socket file left by a
// process that no longer listens is replaced; INVALID_ARGUMENT for a path
// longer than a socket address holds, ALREADY_EXISTS for a file that is
// not a socket or a socket another process listens on, UNAVAILABLE when
// it cannot be bound.
absl::StatusOr<int> ListenUnix(const std::string& path, const char* what, int backlog, unsigned mode);

// The peer name of a connection accepted on the Unix-domain socket at
// `path`, as gRPC names them: "unix:PATH".
std::string UnixPeerName(const std::string& path);
// Whether a peer name is a UnixPeerName.
bool IsUnixPeer(std::string_view peer_name);

// A peer's address as gRPC names peers: "ipv4:1.2.3.4:5", "ipv6:[::1]:5".
std::string PeerName(const sockaddr_storage& a);

// Whether a PeerName is on this host: its loopback (127.0.0.0/8, ::1, or
// 127.x mapped into IPv6) or a Unix-domain socket.
bool IsLoopbackPeer(std::string_view peer_name);

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_NET_ADDRESS_H_
