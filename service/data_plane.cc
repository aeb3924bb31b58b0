// DataPlaneServer (data_plane.h): option checks, the listening socket, and
// starting and stopping the loops (data_plane_loop.h).
#include "service/data_plane.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/data_plane_loop.h"
#include "service/net_address.h"

namespace tqkv::service {

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Start(
    const DataPlaneOptions& options, KvService* service, const RpcEnv* env) {
  if (options.threads < 1 || options.threads > 64)
    return absl::InvalidArgumentError(
        absl::StrCat("data plane threads must be 1..64, not ", options.threads));
  if (options.max_request_bytes < 64)
    return absl::InvalidArgumentError("data plane max_request_bytes must be at least 64");
  if (options.max_connections < 1) return absl::InvalidArgumentError("data plane max_connections must be at least 1");
  if (options.idle_timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("data plane idle_timeout must be positive");
  if (options.frame_timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("data plane frame_timeout must be positive");
  if (options.max_buffered_bytes < 4 + uint64_t{options.max_request_bytes})
    return absl::InvalidArgumentError(absl::StrCat(
        "data plane max_buffered_bytes (", options.max_buffered_bytes, ") must hold one largest frame (4 + ",
        options.max_request_bytes, " bytes)"));
  if (options.max_reply_bytes_per_tenant < options.max_dense_reply_bytes ||
      options.max_reply_bytes < options.max_reply_bytes_per_tenant)
    return absl::InvalidArgumentError(absl::StrCat(
        "data plane reply budgets must hold one largest dense reply: max_dense_reply_bytes ",
        options.max_dense_reply_bytes, " <= max_reply_bytes_per_tenant ", options.max_reply_bytes_per_tenant,
        " <= max_reply_bytes ", options.max_reply_bytes));
  std::unique_ptr<DataPlaneServer> s(new DataPlaneServer());
  s->options_ = options;
  s->env_ = env;
  s->shared_.replies = std::make_unique<TenantBudget>(TenantBudgetLimits{
      .total = options.max_reply_bytes,
      .per_tenant = options.max_reply_bytes_per_tenant,
      .what = "bytes of data-plane replies not yet read",
      .total_flag = "--data_max_reply_bytes",
      .per_tenant_flag = "--data_max_reply_bytes_per_tenant"});
  int port = 0;
  TQ_ASSIGN_OR_RETURN(s->listen_fd_, ListenTcp(options.listen, "data plane", 1024, &port));
  TQ_ASSIGN_OR_RETURN(auto hp, SplitHostPort(options.listen));
  s->address_ = absl::StrCat(hp.first, ":", port);
  if (!options.socket_path.empty()) {
    if (options.socket_mode > 0777)
      return absl::InvalidArgumentError(absl::StrCat("data plane socket mode ", options.socket_mode, " is not 0..0777"));
    TQ_ASSIGN_OR_RETURN(s->unix_fd_, ListenUnix(options.socket_path, "data plane", 1024, options.socket_mode));
  }
  if (options.tls.enabled()) {
    TQ_ASSIGN_OR_RETURN(s->tls_, DataPlaneTlsContext::Create(options.tls, env->log));
  }
  std::vector<Loop*> all;
  for (int i = 0; i < options.threads; ++i) {
    auto loop = std::make_unique<Loop>(s->listen_fd_, s->unix_fd_, s->options_, service, env, &s->shared_,
                                       s->tls_.get());
    TQ_RETURN_IF_ERROR(loop->Init(/*accept=*/i == 0));
    all.push_back(loop.get());
    s->loops_.push_back(std::move(loop));
  }
  s->loops_[0]->SetPeers(std::move(all));
  for (auto& loop : s->loops_) s->threads_.emplace_back([l = loop.get()] { l->Run(); });
  return s;
}

void DataPlaneServer::Shutdown() {
  for (auto& loop : loops_) loop->Stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  // Requests still on the backend work queue use the loops' connections:
  // they finish first.
  while (shared_.tasks.load(std::memory_order_acquire) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  loops_.clear();  // closes every connection
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
  if (unix_fd_ >= 0) {
    close(unix_fd_);
    unlink(options_.socket_path.c_str());
  }
  unix_fd_ = -1;
}

DataPlaneServer::Stats DataPlaneServer::GetStats() const {
  Stats s;
  s.connections = shared_.connections.load(std::memory_order_relaxed);
  s.buffered_bytes = shared_.buffered_bytes.load(std::memory_order_relaxed);
  s.buffered_budget_bytes = options_.max_buffered_bytes;
  s.budget_refusals = shared_.budget_refusals.load(std::memory_order_relaxed);
  s.frame_timeouts = shared_.frame_timeouts.load(std::memory_order_relaxed);
  s.reply_bytes = shared_.replies != nullptr ? shared_.replies->used() : 0;
  if (const WorkQueue* q = env_ != nullptr ? env_->backend_work : nullptr; q != nullptr) {
    s.work_waiting = q->waiting();
    s.work_capacity = q->capacity();
    s.work_refusals = q->refusals();
  }
  return s;
}

DataPlaneServer::~DataPlaneServer() { Shutdown(); }

}  // namespace tqkv::service
