#include "service/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <prometheus/registry.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "service/listen_policy.h"
#include "service/process_metrics.h"

namespace tqkv::service {
namespace {

// Drops gRPC's reflection plugin from a builder. Linking libgrpc++_reflection
// registers the plugin with every ServerBuilder of the process (a static
// initializer), so "off" must take it out again.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
      return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(p.get()) != nullptr;
    });
  }
};

// Who owns `dir` and who this process is, for a data_dir it cannot write
// (in Kubernetes: a volume without the pod's fsGroup).
std::string DirectoryAccess(const std::filesystem::path& dir) {
  struct stat st {};
  std::string owner = "cannot stat it";
  if (stat(dir.c_str(), &st) == 0)
    owner = absl::StrFormat("%s is owned by %d:%d with mode %04o", dir.string(), st.st_uid, st.st_gid,
                            st.st_mode & 07777);
  gid_t groups[64];
  const int n = getgroups(64, groups);
  std::string supplementary;
  for (int i = 0; i < n; ++i) absl::StrAppend(&supplementary, i ? "," : "", groups[i]);
  return absl::StrFormat(
      "%s; the server runs as uid %d gid %d groups [%s]; make the directory writable by that user "
      "or one of its groups (in Kubernetes: securityContext.fsGroup)",
      owner, getuid(), getgid(), supplementary);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      const CudaBackendFactory& cuda) {
  std::unique_ptr<Server> s(new Server(options));
  TQ_ASSIGN_OR_RETURN(auto listen, SplitHostPort(options.listen));
  if (options.max_message_bytes < 1024)
    return absl::InvalidArgumentError("--max_message_bytes must be at least 1024");
  if (options.work_threads < 0 || options.work_threads > 64 || options.work_queue < 1)
    return absl::InvalidArgumentError(absl::StrCat("--work_threads must be 0..64 (not ", options.work_threads,
                                                   ") and --work_queue at least 1 (not ", options.work_queue, ")"));
  if (!options.auth_tokens_file.empty()) {
    TQ_ASSIGN_OR_RETURN(s->auth_, Authenticator::FromFile(options.auth_tokens_file));
  }
  if (options.log != nullptr) s->log_ = std::make_unique<LineLog>(options.log);
  auto note = [&](const std::string& line) {
    if (s->log_) s->log_->Write(absl::StrCat("tqkv-server: ", line));
  };
  const bool data_on = !options.data_listen.empty() && options.data_listen != "off";
  if (options.data_busy_poll < absl::ZeroDuration() || options.data_busy_poll > absl::Seconds(1))
    return absl::InvalidArgumentError(
        absl::StrCat("--data_busy_poll ", absl::FormatDuration(options.data_busy_poll), " is outside 0..1s"));
  if (!data_on && !options.data_socket.empty())
    return absl::InvalidArgumentError("--data_socket needs the data plane (--data_listen is off)");
  const std::string data_listen =
      options.data_listen == "auto"
          ? absl::StrCat(listen.first, ":", listen.second == 0 ? 0 : listen.second + 1)
          : options.data_listen;
  TQ_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      ServerCredentials(options.tls));
  {  // Before anything binds or opens the store.
    const bool auth = s->auth_->enabled();
    const bool tls = options.tls.enabled();
    std::vector<ListenerExposure> listeners = {{"--listen", options.listen, auth || tls}};
    if (data_on) listeners.push_back({"--data_listen", data_listen, auth || tls});
    if (!options.metrics_listen.empty())
      listeners.push_back({"--metrics_listen", options.metrics_listen, (auth && options.metrics_auth) || tls});
    std::string warning;
    TQ_RETURN_IF_ERROR(CheckListeners(listeners, options.insecure_listen_any, &warning));
    if (!warning.empty()) note(warning);
    if (s->auth_->uses_certificates() && !options.tls.mutual())
      note("the auth file maps client certificates, but without --tls_client_ca_file no "
           "certificate is verified: those lines identify nobody");
  }

  if (options.clock == nullptr) s->owned_clock_ = std::make_unique<storage::RealClock>();
  s->clock_ = options.clock ? options.clock : s->owned_clock_.get();

  storage::BlockStoreOptions so;
  so.host_capacity_bytes = options.host_budget_bytes;
  so.tenant_host_quota_bytes = options.tenant_host_quota_bytes;
  so.disk_capacity_bytes = options.disk_budget_bytes;
  if (!(options.write_behind_fraction >= 0 && options.write_behind_fraction <= 1))
    return absl::InvalidArgumentError(
        absl::StrCat("--write_behind_fraction must be in [0, 1], not ", options.write_behind_fraction));
  // 0 turns it off; any other fraction writes above at least one byte.
  so.write_behind_above_bytes =
      options.write_behind_fraction == 0
          ? 0
          : std::max<uint64_t>(1, static_cast<uint64_t>(options.write_behind_fraction *
                                                         static_cast<double>(options.host_budget_bytes)));
  so.disk_min_free_bytes = options.disk_min_free_bytes;
  so.load_index_in_background = options.disk_index_in_background;
  so.max_pin_ttl = options.service.max_pin_ttl;
  so.clock = s->clock_;
  if (!options.data_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.data_dir, ec);
    if (ec)
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create --data_dir ", options.data_dir, ": ", ec.message(), " (",
                       DirectoryAccess(std::filesystem::path(options.data_dir).parent_path()), ")"));
    if (access(options.data_dir.c_str(), W_OK | X_OK) != 0)
      return absl::FailedPreconditionError(
          absl::StrCat("--data_dir ", options.data_dir, " is not writable: ",
                       DirectoryAccess(options.data_dir)));
    so.disk_path = (std::filesystem::path(options.data_dir) / "rocksdb").string();
  }
  if (!options.at_rest_key_file.empty()) {
    if (options.data_dir.empty())
      return absl::InvalidArgumentError("--at_rest_key_file needs a disk tier (--data_dir)");
    TQ_ASSIGN_OR_RETURN(s->at_rest_, storage::AtRestCipher::FromFile(options.at_rest_key_file));
    so.at_rest_cipher = s->at_rest_.get();
    note(absl::StrCat("disk tier payloads encrypted at rest with key id ", s->at_rest_->current_key_id()));
  }
  TQ_ASSIGN_OR_RETURN(SelectedBackend b, SelectBackend(options.backend, options.threads, cuda));
  s->backend_ = std::move(b.backend);
  s->backend_note_ = b.note;
  if (!b.note.empty()) note(b.note);
  if (options.pin_host_tier && s->backend_->name() == "cuda") {
    TQ_ASSIGN_OR_RETURN(s->host_arena_, storage::HostArena::Create(options.host_budget_bytes));
    TQ_RETURN_IF_ERROR(s->backend_->UseHostArena(s->host_arena_->base(), s->host_arena_->size()));
    so.host_arena = s->host_arena_.get();
    s->host_pinning_ = true;
  }
  s->started_ = absl::Now();
  TQ_ASSIGN_OR_RETURN(s->store_, storage::BlockStore::Open(so));
  s->index_loading_ = s->store_->Stats().index_loading;
  if (s->index_loading_) note("indexing the disk tier in the background; serving meanwhile");
  s->registry_ = std::make_unique<ModelRegistry>(
      s->store_.get(), ModelRegistryOptions{.max_models_per_tenant = options.max_models_per_tenant,
                                            .max_codec_build_work = options.max_codec_build_work});
  TQ_ASSIGN_OR_RETURN(std::vector<std::string> warnings, s->registry_->Load());
  for (const std::string& w : warnings) note(w);


  s->service_ = std::make_unique<KvService>(options.service, s->store_.get(), s->registry_.get(),
                                            s->backend_.get(), s->clock_);

  s->prom_registry_ = std::make_shared<prometheus::Registry>();
  s->rpc_metrics_ = std::make_unique<RpcMetrics>(*s->prom_registry_);
  const bool tenant_labels =
      options.metrics_tenant_labels == ServerOptions::TenantLabels::kAuto
          ? !s->auth_->enabled()
          : options.metrics_tenant_labels == ServerOptions::TenantLabels::kOn;
  s->collector_ = std::make_shared<StoreCollector>(s->store_.get(), s->registry_.get(),
                                                   s->service_.get(), tenant_labels);
  if (!options.metrics_listen.empty()) {
    MetricsHttpOptions mo;
    mo.listen = options.metrics_listen;
    mo.tls = options.tls;
    mo.auth = options.metrics_auth ? s->auth_.get() : nullptr;
    TQ_ASSIGN_OR_RETURN(s->metrics_http_,
                        MetricsHttpServer::Start(mo,
                                                 {s->prom_registry_, s->collector_,
                                                  std::make_shared<ProcessCollector>()},
                                                 s->log_.get()));
    s->metrics_address_ = s->metrics_http_->address();
  }

  if (options.work_threads > 0)
    s->backend_work_ = std::make_unique<WorkQueue>(WorkQueue::Options{
        .threads = options.work_threads, .capacity = static_cast<size_t>(options.work_queue)});
  s->env_ = RpcEnv{s->auth_.get(), s->rpc_metrics_.get(),
                   options.log_rpc_errors ? s->log_.get() : nullptr, s->backend_work_.get()};
  s->kv_handler_ = std::make_unique<KvStoreHandler>(s->service_.get(), &s->env_);
  s->admin_handler_ = std::make_unique<AdminHandler>(s->service_.get(), &s->env_);

  // The data plane first: Stats reports its address from the first call on.
  if (data_on) {
    DataPlaneOptions dp;
    dp.listen = data_listen;
    dp.threads = options.data_threads;
    dp.idle_timeout = options.data_idle_timeout;
    dp.max_connections = options.data_max_connections;
    dp.max_buffered_bytes = options.data_max_buffered_bytes;
    dp.frame_timeout = options.data_frame_timeout;
    dp.max_unauthenticated_frame_bytes = options.data_max_unauthenticated_frame_bytes;
    dp.max_reply_bytes = options.data_max_reply_bytes;
    dp.max_reply_bytes_per_tenant = options.data_max_reply_bytes_per_tenant;
    dp.cuda_ipc = options.data_cuda_ipc;
    dp.socket_path = options.data_socket;
    dp.socket_mode = options.data_socket_mode;
    dp.max_shared_bytes = options.data_max_shared_bytes;
    dp.busy_poll = options.data_busy_poll;
    dp.max_request_bytes = static_cast<uint32_t>(options.max_message_bytes);
    dp.max_dense_reply_bytes = static_cast<uint64_t>(options.max_message_bytes);
    dp.tls = options.tls;  // the data plane speaks TLS whenever gRPC does
    TQ_ASSIGN_OR_RETURN(s->data_plane_, DataPlaneServer::Start(dp, s->service_.get(), &s->env_));
    s->data_address_ = s->data_plane_->address();
    s->data_plane_collector_ = std::make_shared<DataPlaneCollector>(s->data_plane_.get());
    if (s->metrics_http_) s->metrics_http_->Add(s->data_plane_collector_);
    std::string advertised = s->data_address_;
    if (!options.data_advertise_host.empty()) {
      std::string host = options.data_advertise_host;
      if (host.find(':') != std::string::npos && host.front() != '[') host = absl::StrCat("[", host, "]");
      advertised = absl::StrCat(host, s->data_address_.substr(s->data_address_.rfind(':')));
    }
    s->service_->SetDataPlaneAddress(advertised);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  if (options.grpc_reflection) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  } else {
    builder.SetOption(std::make_unique<WithoutReflection>());
  }
  int bound_port = 0;
  builder.AddListeningPort(options.listen, credentials, &bound_port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Large HTTP/2 frames and an eager flow-control window: block payloads are
  // 64 KiB-1 MiB.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 24);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  if (options.grpc_max_memory_bytes > 0) {
    grpc::ResourceQuota quota("tqkv-server");
    quota.Resize(static_cast<size_t>(options.grpc_max_memory_bytes));
    builder.SetResourceQuota(quota);
  }
  builder.RegisterService(s->kv_handler_.get());
  builder.RegisterService(s->admin_handler_.get());
  s->grpc_server_ = builder.BuildAndStart();
  if (s->grpc_server_ == nullptr || bound_port == 0)
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  s->address_ = absl::StrCat(listen.first, ":", bound_port);
  s->maintenance_ = std::thread([p = s.get()] { p->MaintenanceLoop(); });
  return s;
}

absl::Status Server::ReloadAuth() {
  return LogAuthReload(auth_->enabled() ? auth_->Reload()
                                        : absl::FailedPreconditionError("no --auth_tokens_file: nothing to reload"));
}

absl::Status Server::LogAuthReload(const absl::StatusOr<std::string>& r) {
  if (log_) {
    log_->Write(r.ok() ? absl::StrCat("tqkv-server: auth file ", options_.auth_tokens_file,
                                      " reloaded: ", *r)
                       : absl::StrCat("tqkv-server: auth file reload failed, the previous "
                                      "tokens stay in force: ", r.status().ToString()),
                r.ok() ? LogLevel::kInfo : LogLevel::kError);
  }
  return r.status();
}

void Server::MaintenanceLoop() {
  while (!stop_maintenance_.WaitForNotificationWithTimeout(options_.maintenance_interval)) {
    service_->Maintain();
    if (auto r = auth_->ReloadIfChanged()) LogAuthReload(*r).IgnoreError();  // an edited auth file
    if (index_loading_) ReportIndexLoaded();
    if (host_pinning_) ReportHostPinned();
    CollectDiskGarbage();
  }
}

void Server::CollectDiskGarbage() {
  if (absl::Now() < disk_gc_after_) return;
  const absl::StatusOr<uint64_t> freed = store_->CollectDiskGarbage();
  if (!freed.ok()) disk_gc_after_ = absl::Now() + absl::Minutes(1);  // a full disk: retried, not every second
  if (!log_ || (freed.ok() && *freed == 0) || absl::IsCancelled(freed.status())) return;
  log_->Write(freed.ok() ? absl::StrCat("tqkv-server: disk tier: rewrote the payload files holding ", *freed,
                                        " bytes of removed blocks")
                         : absl::StrCat("tqkv-server: disk tier: collecting removed blocks' space failed: ",
                                        freed.status().ToString()));
}

void Server::ReportHostPinned() {
  const BackendStats st = backend_->Stats();
  const bool done = st.host_pinned_bytes >= host_arena_->size();
  if (!done && st.host_pinning_error.empty()) return;
  host_pinning_ = false;
  if (!log_) return;
  if (done) {
    log_->Write(absl::StrCat("tqkv-server: host tier pinned for DMA: ", host_arena_->size(), " bytes ",
                             absl::FormatDuration(absl::Trunc(absl::Now() - started_, absl::Milliseconds(1))),
                             " after start"));
  } else {
    log_->Write(absl::StrCat("tqkv-server: ", st.host_pinning_error,
                             "; blocks outside the pinned part are copied through staging"),
                LogLevel::kError);
  }
}

void Server::ReportIndexLoaded() {
  const storage::StoreStats st = store_->Stats();
  if (st.index_loading) return;
  index_loading_ = false;
  const absl::Status s = store_->AwaitIndexLoaded();  // done: returns at once
  if (!log_) return;
  if (s.ok()) {
    uint64_t disk_blocks = 0;  // (blocks put while it indexed are in st.blocks too)
    for (const storage::TierUsage& u : st.usage)
      if (u.tier == storage::Tier::kDisk) disk_blocks += u.blocks;
    log_->Write(absl::StrCat("tqkv-server: disk tier indexed: ", disk_blocks, " blocks (", st.disk_used_bytes,
                             " bytes on disk) ", absl::FormatDuration(absl::Trunc(absl::Now() - started_, absl::Milliseconds(1))),
                             " after start"));
  } else {
    log_->Write(absl::StrCat("tqkv-server: indexing the disk tier failed: ", s.ToString(),
                             "; blocks it did not reach are not served"));
  }
}

absl::Status Server::Shutdown() {
  if (shut_down_) return absl::OkStatus();
  shut_down_ = true;
  absl::Status status;
  if (grpc_server_) {
    if (auto* health = grpc_server_->GetHealthCheckService()) health->Shutdown();
    grpc_server_->Shutdown(std::chrono::system_clock::now() +
                           absl::ToChronoNanoseconds(options_.shutdown_grace));
    grpc_server_->Wait();
    grpc_server_.reset();
  }
  if (data_plane_) data_plane_->Shutdown();
  if (maintenance_.joinable()) {
    if (store_) store_->StopDiskGarbageCollection();  // the loop may be in a long compaction
    stop_maintenance_.Notify();
    maintenance_.join();
  }
  metrics_http_.reset();  // no scrape may run while the store goes away
  service_.reset();  // sequences release their block references
  if (store_ && options_.spill_on_shutdown && store_->disk_enabled()) {
    absl::StatusOr<storage::EvictResult> r = store_->SpillForShutdown(options_.shutdown_spill_deadline);
    if (!r.ok()) status.Update(r.status());
    if (r.ok() && log_) {
      std::string line = absl::StrCat("tqkv-server: shutdown moved ", r->blocks, " blocks (", r->bytes,
                                      " bytes) out of host memory (to disk; dropped where the disk budget is full)");
      if (r->left_blocks > 0)
        absl::StrAppend(&line, "; ", r->left_blocks, " blocks (", r->left_bytes,
                        " bytes) were not spilled by the deadline and are lost with the process");
      log_->Write(line, r->left_blocks > 0 ? LogLevel::kWarning : LogLevel::kInfo);
    }
  }
  if (store_) status.Update(store_->Sync());
  store_.reset();
  return status;
}

Server::Server(const ServerOptions& options) : options_(options) {}

Server::~Server() { Shutdown().IgnoreError(); }

}  // namespace tqkv::service
