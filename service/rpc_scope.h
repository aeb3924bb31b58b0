// RpcScope: the one wrapper every RPC handler runs in. It authenticates the
// caller, times the call, and at Finish records per-method metrics, logs
// failures and maps the absl::Status to grpc::Status (grpc_status.h).
//
//   RpcScope scope(env, "Lookup", ctx);
//   absl::Status s = scope.identity().status();
//   if (s.ok()) s = ...service call...;
//   reactor->Finish(scope.Finish(s));
//
// Thread safety: a scope belongs to one RPC; Finish is called once.
#ifndef TQKV_SERVICE_RPC_SCOPE_H_
#define TQKV_SERVICE_RPC_SCOPE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "base/work_queue.h"
#include "service/auth.h"
#include "service/metrics.h"

namespace tqkv::service {

// Whole-line logging to a stream shared by many threads. Thread-safe.
// Each line starts with the UTC time and a level letter:
//   2026-12-02T21:08:00.123Z I tqkv-server: auth file ... reloaded: ...
enum class LogLevel : char { kInfo = 'I', kWarning = 'W', kError = 'E' };
class LineLog {
 public:
  // WriteLimited writes at most `per_second` lines in any one-second window
  // (0: no limit). stamp=false leaves out the time and level (tests).
  explicit LineLog(std::ostream* out, int per_second = 20, bool stamp = true)
      : out_(out), per_second_(per_second), stamp_(stamp) {}
  void Write(const std::string& line, LogLevel level = LogLevel::kInfo);  // appends '\n' and flushes
  // As Write (at warning level: failed calls) while this second's allowance
  // lasts; later lines are counted instead, and the next line written says
  // how many were dropped (so a client sending bad requests in a loop cannot
  // flood the log).
  void WriteLimited(const std::string& line,
                    std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

 private:
  void Put(const std::string& line, LogLevel level);  // REQUIRES: mu_ held
  std::ostream* const out_;
  const int per_second_;
  const bool stamp_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point window_;  // start of the current second
  int written_ = 0;                               // limited lines written in it
  uint64_t dropped_ = 0;                          // not written since the last note
};

// What every RPC scope needs; owned by the server, shared by all handlers.
struct RpcEnv {
  const Authenticator* auth = nullptr;
  RpcMetrics* metrics = nullptr;  // may be null (no metrics)
  // Where failed calls (other than NOT_FOUND) are logged; null: not logged.
  LineLog* log = nullptr;
  // Where bulk backend work runs (encoding puts, decoding dense gets), so
  // that the threads serving the network never wait for it; null: on those
  // threads. Decode calls (Attend, Append) run where they arrive.
  WorkQueue* backend_work = nullptr;
};

// Records one finished call: per-method metrics (with the message bytes it
// received and sent), and a log line for a failure other than NOT_FOUND.
// `peer` names the caller in the log.
void RecordCall(const RpcEnv& env, const char* method, const std::string& peer,
                const absl::Status& status, double seconds, uint64_t received_bytes = 0,
                uint64_t sent_bytes = 0);

class RpcScope {
 public:
  RpcScope(const RpcEnv& env, const char* method, grpc::CallbackServerContext* ctx);
  RpcScope(const RpcScope&) = delete;
  RpcScope& operator=(const RpcScope&) = delete;

  // The caller (from the bearer token and, where the auth file maps
  // certificates, the verified client certificate), or UNAUTHENTICATED.
  const absl::StatusOr<Identity>& identity() const { return identity_; }
  // Counts message bytes of the call (recorded by Finish).
  void Received(uint64_t bytes) { received_bytes_ += bytes; }
  void Sent(uint64_t bytes) { sent_bytes_ += bytes; }
  // Records and logs the outcome; returns the status to send.
  grpc::Status Finish(const absl::Status& status);

 private:
  const RpcEnv& env_;
  const char* const method_;
  grpc::CallbackServerContext* const ctx_;
  const std::chrono::steady_clock::time_point start_;
  absl::StatusOr<Identity> identity_;
  uint64_t received_bytes_ = 0;
  uint64_t sent_bytes_ = 0;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_RPC_SCOPE_H_
