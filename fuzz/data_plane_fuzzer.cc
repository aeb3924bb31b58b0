// Fuzz target: the data plane's wire parsing and serving (service/
// data_plane*.cc) through a real DataPlaneServer on loopback, in process,
// over the service of seed_world.h. Each input is the byte stream of one
// connection: the preface, then length-prefixed DataPlaneRequest frames
// (the seeds hold both). Every occurrence of kSequencePlaceholder is
// replaced by the world's sequence id (same length) before sending, so
// Attend and Append frames reach a live sequence. The fuzzer sends the
// bytes, half-closes, and reads until the server closes.
// Findings: crashes, sanitizer reports, leaks, a server that does not close
// a half-closed connection within 5 s, and a connection whose buffered
// request or reply bytes stay charged to their budgets after it closed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "fuzz/seed_world.h"
#include "fuzz/service_harness.h"
#include "service/auth.h"
#include "service/data_plane.h"
#include "service/rpc_scope.h"

namespace {

constexpr char kSequencePlaceholder[] = "seq-XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX";

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "data_plane_fuzzer: %s\n", what);
  std::abort();
}

struct World {
  tqkv::fuzz::SharedParts shared;
  std::unique_ptr<tqkv::fuzz::ServiceHarness> harness;
  tqkv::service::Authenticator auth;  // off: tenant "default", admin
  // As the server runs: backend work (puts, Attend, Append, dense gets) on
  // a queue of its own, the rest on the loop.
  tqkv::WorkQueue work{{.threads = 2, .capacity = 4}};
  tqkv::service::RpcEnv env{&auth, nullptr, nullptr, &work};
  std::unique_ptr<tqkv::service::DataPlaneServer> server;
  std::string sequence_id;
  int port = 0;

  World() {
    harness = std::make_unique<tqkv::fuzz::ServiceHarness>(&shared);
    auto w = tqkv::fuzz::BuildWorld(harness->service(), {"default", true});
    if (!w.ok()) Fail(std::string(w.status().ToString()).c_str());
    sequence_id = w->sequence_id;
    if (sequence_id.size() != sizeof(kSequencePlaceholder) - 1) Fail("sequence id length");
    tqkv::service::DataPlaneOptions o;
    o.listen = "127.0.0.1:0";
    o.threads = 1;
    o.max_request_bytes = 1 << 20;
    o.max_buffered_bytes = 4 << 20;
    o.max_dense_reply_bytes = 8 << 20;
    auto s = tqkv::service::DataPlaneServer::Start(o, &harness->service(), &env);
    if (!s.ok()) Fail(std::string(s.status().ToString()).c_str());
    server = std::move(*s);
    port = std::stoi(server->address().substr(server->address().rfind(':') + 1));
  }
};

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) Fail("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
    Fail("connect");
  }
  return fd;
}

// Writes `bytes`, half-closes, and reads until the server closes; both
// directions at once, so a server blocked on a full reply buffer is not
// waited on forever.
void Exchange(int fd, const std::string& bytes) {
  size_t sent = 0;
  bool write_open = true;
  char buf[1 << 16];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    if (write_open && sent == bytes.size()) {
      ::shutdown(fd, SHUT_WR);
      write_open = false;
    }
    pollfd p{fd, static_cast<short>(POLLIN | (write_open ? POLLOUT : 0)), 0};
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now())
                                          .count());
    if (left <= 0) Fail("the server kept a half-closed connection open for 5 s");
    if (::poll(&p, 1, left) < 0) continue;
    if (p.revents & POLLIN || p.revents & (POLLHUP | POLLERR)) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n == 0) return;
      if (n < 0 && errno != EAGAIN && errno != EINTR) return;  // reset by the server
    }
    if (write_open && (p.revents & POLLOUT)) {
      ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) write_open = false;  // closed by the server
    }
  }
}

// The server releases a closed connection's charges and slot right after
// the close the client saw; give its loop a moment (yielding first: the
// release is usually microseconds away).
void ExpectReleased(const tqkv::service::DataPlaneServer& server) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(2);
  while (true) {
    auto st = server.GetStats();
    if (st.connections == 0 && st.buffered_bytes == 0 && st.reply_bytes == 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      std::fprintf(stderr, "connections %d, buffered bytes %llu, reply bytes %llu after every connection closed\n",
                   st.connections, static_cast<unsigned long long>(st.buffered_bytes),
                   static_cast<unsigned long long>(st.reply_bytes));
      Fail("a closed connection left its accounting behind");
    }
    if (now - start < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = new World;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::string placeholder = kSequencePlaceholder;
  for (size_t at = bytes.find(placeholder); at != std::string::npos;
       at = bytes.find(placeholder, at + placeholder.size())) {
    bytes.replace(at, placeholder.size(), world->sequence_id);
  }
  int fd = Connect(world->port);
  Exchange(fd, bytes);
  ::close(fd);
  ExpectReleased(*world->server);
  return 0;
}
