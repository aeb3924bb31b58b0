#include "service/rpc_scope.h"

#include "absl/strings/str_cat.h"
#include "service/grpc_status.h"

namespace tqkv::service {
namespace {

std::string Authorization(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

}  // namespace

void LineLog::Write(const std::string& line) {
  std::lock_guard<std::mutex> l(mu_);
  *out_ << line << '\n' << std::flush;
}

RpcScope::RpcScope(const RpcEnv& env, const char* method, grpc::CallbackServerContext* ctx)
    : env_(env),
      method_(method),
      ctx_(ctx),
      start_(std::chrono::steady_clock::now()),
      identity_(env.auth->Authenticate(Authorization(ctx))) {}

grpc::Status RpcScope::Finish(const absl::Status& status) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (env_.metrics != nullptr) env_.metrics->Record(method_, status.code(), seconds);
  if (env_.log != nullptr && !status.ok() && status.code() != absl::StatusCode::kNotFound) {
    std::string line = absl::StrCat("tqkv-server: ", method_, " from ", ctx_->peer(), " -> ",
                                    CodeName(status.code()), ": ", std::string(status.message()),
                                    " (", static_cast<int64_t>(seconds * 1e6), " us)");
    env_.log->Write(line);
  }
  return ToGrpcStatus(status);
}

}  // namespace tqkv::service
