#include "service/rpc_scope.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "service/grpc_status.h"
#include "service/tls.h"

namespace tqkv::service {
namespace {

std::string Authorization(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

absl::StatusOr<Identity> Authenticate(const Authenticator& auth, grpc::CallbackServerContext* ctx) {
  if (!auth.uses_certificates()) return auth.Authenticate(Authorization(ctx));
  const PeerCertificate peer = PeerCertificateOf(*ctx);
  return auth.Authenticate(Authorization(ctx), &peer);
}

}  // namespace

void LineLog::Put(const std::string& line, LogLevel level) {
  if (stamp_)
    *out_ << absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(), absl::UTCTimeZone()) << static_cast<char>(level)
          << ' ';
  *out_ << line << '\n' << std::flush;
}

void LineLog::Write(const std::string& line, LogLevel level) {
  std::lock_guard<std::mutex> l(mu_);
  Put(line, level);
}

void LineLog::WriteLimited(const std::string& line, std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> l(mu_);
  if (now - window_ >= std::chrono::seconds(1)) {
    window_ = now;
    written_ = 0;
  }
  if (per_second_ > 0 && written_ >= per_second_) {
    ++dropped_;
    return;
  }
  ++written_;
  if (dropped_ > 0) {
    Put(absl::StrCat("tqkv-server: ", dropped_, " log lines of failed calls dropped (more than ", per_second_,
                     " a second)"),
        LogLevel::kWarning);
    dropped_ = 0;
  }
  Put(line, LogLevel::kWarning);
}

RpcScope::RpcScope(const RpcEnv& env, const char* method, grpc::CallbackServerContext* ctx)
    : env_(env),
      method_(method),
      ctx_(ctx),
      start_(std::chrono::steady_clock::now()),
      identity_(Authenticate(*env.auth, ctx)) {}

void RecordCall(const RpcEnv& env, const char* method, const std::string& peer,
                const absl::Status& status, double seconds, uint64_t received_bytes,
                uint64_t sent_bytes) {
  if (env.metrics != nullptr)
    env.metrics->Record(method, status.code(), seconds, received_bytes, sent_bytes);
  if (env.log != nullptr && !status.ok() && status.code() != absl::StatusCode::kNotFound) {
    env.log->WriteLimited(absl::StrCat("tqkv-server: ", method, " from ", peer, " -> ",
                                CodeName(status.code()), ": ", std::string(status.message()),
                                " (", static_cast<int64_t>(seconds * 1e6), " us)"));
  }
}

grpc::Status RpcScope::Finish(const absl::Status& status) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  RecordCall(env_, method_, ctx_->peer(), status, seconds, received_bytes_, sent_bytes_);
  return ToGrpcStatus(status);
}

}  // namespace tqkv::service
