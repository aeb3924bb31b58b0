// tqkv-server: serves the tqkv.v1 KvStore and Admin gRPC services and
// Prometheus metrics. `tqkv-server --help` lists the flags.
//
// On start it prints, on stdout,
//   tqkv-server listening on HOST:PORT
//   tqkv-server data plane listening on HOST:PORT   (unless --data_listen=off)
//   tqkv-server data plane socket on PATH           (with --data_socket)
//   tqkv-server metrics listening on HOST:PORT      (unless metrics are off)
// with the ports actually bound (useful with port 0). SIGHUP re-reads the
// auth file, as a change of the file does (a bad file is logged and the
// previous tokens stay). SIGTERM or
// SIGINT shut it down gracefully (see Server::Shutdown) and it exits 0.
#include <signal.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/byte_size.h"
#include "base/malloc_tuning.h"
#include "google/protobuf/stubs/logging.h"
#include "gpu/cuda_backend.h"
#include "service/build_info.h"
#include "service/rpc_scope.h"
#include "service/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC listen address HOST:PORT (port 0: any free port). Beyond loopback needs "
          "--auth_tokens_file or TLS, or --insecure_listen_any");
ABSL_FLAG(std::string, data_listen, "auto",
          "data-plane address HOST:PORT for bulk reads and puts over TCP, TLS with --tls_cert_file (auto: the gRPC host "
          "and port + 1, or port 0 when --listen has port 0; off: disabled)");
ABSL_FLAG(std::string, data_advertise_host, "",
          "host of the data-plane address clients learn from Stats (with the bound port), e.g. "
          "the pod's IP in Kubernetes; empty: the bound host (a wildcard means the host the client "
          "reached)");
ABSL_FLAG(int, data_threads, 2, "data-plane event-loop threads");
ABSL_FLAG(int, work_threads, 2,
          "threads that run bulk backend work (puts, dense gets; on gRPC too), so that no event loop waits for "
          "an encode; 0: on the event loops (one encode then holds up every connection of its loop)");
ABSL_FLAG(int, work_queue, 64,
          "data-plane requests waiting for a work thread at most; more are held back (their connections are not "
          "read) until there is room");
ABSL_FLAG(int, data_idle_timeout_s, 600,
          "close data-plane connections idle this many seconds (an open put stream on one commits nothing)");
ABSL_FLAG(int, data_max_connections, 4096,
          "most data-plane connections at once; one more gets RESOURCE_EXHAUSTED");
ABSL_FLAG(tqkv::ByteSize, data_max_buffered_bytes, tqkv::ByteSize{uint64_t{1} << 30},
          "budget of bytes held for incomplete data-plane request frames, all connections together: a frame is "
          "charged its declared length when its 4-byte prefix arrives, before its body is buffered; one that would "
          "exceed the budget gets RESOURCE_EXHAUSTED and its connection is closed (clients retry with backoff). "
          "At least 4 + --max_message_bytes; default 1 GiB");
ABSL_FLAG(int, data_frame_timeout_s, 60,
          "a data-plane request frame must arrive whole within this many seconds of its length prefix; a slower "
          "one gets DEADLINE_EXCEEDED and its connection is closed, returning its share of "
          "--data_max_buffered_bytes");
ABSL_FLAG(tqkv::ByteSize, data_max_unauthenticated_frame_bytes, tqkv::ByteSize{64 << 10},
          "with auth on, the largest data-plane frame a connection may send before one of its requests has "
          "authenticated; a larger frame's request (without its raw payload) must fit and authenticate before "
          "its payload is read, else RESOURCE_EXHAUSTED or UNAUTHENTICATED and the connection closes");
ABSL_FLAG(tqkv::ByteSize, data_max_reply_bytes, tqkv::ByteSize{uint64_t{1} << 30},
          "payload bytes of data-plane replies not yet written to their sockets, all connections together: a "
          "request whose reply would pass it gets RESOURCE_EXHAUSTED (clients that do not read hold at most this)");
ABSL_FLAG(tqkv::ByteSize, data_max_reply_bytes_per_tenant, tqkv::ByteSize{uint64_t{512} << 20},
          "the same bytes for one tenant's connections; at least --max_message_bytes");
ABSL_FLAG(bool, data_cuda_ipc, true,
          "serve data-plane puts and dense gets whose K/V lie in the GPU memory of a worker on this host (CUDA "
          "IPC handles, from loopback connections only; needs --backend cuda)");
ABSL_FLAG(std::string, data_socket, "",
          "also serve the data plane on a Unix-domain socket at this path, for clients on this host (address "
          "unix:PATH; no TLS on it: the file's mode admits the peers; auth as on TCP); empty: none");
ABSL_FLAG(std::string, data_socket_mode, "0600",
          "file mode of --data_socket, octal (0600: the server's user only; 0660 adds its group)");
ABSL_FLAG(tqkv::ByteSize, data_max_shared_bytes, tqkv::ByteSize{uint64_t{1} << 30},
          "largest memory a client of --data_socket may share with the server (a sealed memfd): its tensors and "
          "the replies' payloads then bypass the socket; 0: none");
ABSL_FLAG(absl::Duration, data_busy_poll, absl::ZeroDuration(),
          "after serving a request, a data-plane loop polls its sockets this long (e.g. 200us) before it sleeps, "
          "so a decode worker's next per-layer call is read without a thread wake-up; costs a core per busy loop "
          "while it polls; 0: sleep at once");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address HOST:PORT (port 0: any free port; empty: disabled); HTTPS "
          "with --tls_cert_file (and the client CA's mTLS); with --auth_tokens_file a scrape needs "
          "`Authorization: Bearer` of an admin or `metrics` credential. Beyond loopback needs "
          "--auth_tokens_file or TLS, or --insecure_listen_any");
ABSL_FLAG(bool, metrics_auth, true,
          "with --auth_tokens_file, require an admin or `metrics` credential to scrape /metrics; false serves it "
          "to anyone who reaches --metrics_listen (tenant labels stay off unless --metrics_tenant_labels=true)");
ABSL_FLAG(std::string, metrics_tenant_labels, "auto",
          "label per-model series on /metrics with tenant and model: true, false, or auto (only "
          "without --auth_tokens_file, so an authenticated server names no tenant)");
ABSL_FLAG(bool, insecure_listen_any, false,
          "allow listening beyond loopback without authentication (no --auth_tokens_file; for "
          "gRPC and metrics also no TLS); the server warns once at start");
ABSL_FLAG(bool, grpc_reflection, false, "serve gRPC server reflection");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain of the gRPC listener, the data plane and /metrics; set (with "
          "--tls_key_file): all three serve TLS only");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA bundle; set: mutual TLS, every gRPC and data-plane client must present a "
          "certificate it "
          "verifies (tenants from certificates: x509-uri:/x509-cn: lines in --auth_tokens_file)");
ABSL_FLAG(int, tls_reload_interval_s, 60,
          "how often the TLS certificate, key and client CA files are re-read (new handshakes "
          "use the new ones; no restart)");
ABSL_FLAG(std::string, data_dir, "./data",
          "directory of the RocksDB disk tier (created if missing; empty: no disk tier)");
ABSL_FLAG(std::string, at_rest_key_file, "",
          "key file of encryption at rest (`ID HEX` lines: key id, 64 hex digits; mode 0600): "
          "disk-tier payloads are sealed with AES-256-GCM under a per-tenant key derived from the "
          "highest id; older ids still open older records; empty: payloads stored in clear");
ABSL_FLAG(std::string, backend, "auto",
          "compute backend: auto (cuda if built in and a GPU is usable, else cpu), cpu, cuda");
ABSL_FLAG(tqkv::ByteSize, host_budget_bytes, tqkv::ByteSize{uint64_t{1} << 30}, "host-memory budget for block payloads");
ABSL_FLAG(bool, pin_host_tier, false,
          "with the CUDA backend: put buffers come from one arena of --host_budget_bytes that the backend pins "
          "in the background, so blocks move between host memory and the GPU by DMA (the process holds the whole "
          "budget from start-up)");
ABSL_FLAG(tqkv::ByteSize, malloc_keep_free_bytes, tqkv::ByteSize{tqkv::kDefaultKeepFreeBytes},
          "freed memory the allocator keeps at the top of each arena for reuse instead of returning it to the "
          "kernel (blocks and frames are reused at the rate puts and evictions run; memory returned is faulted "
          "in again page by page); 0: glibc's defaults");
ABSL_FLAG(tqkv::ByteSize, tenant_host_quota_bytes, tqkv::ByteSize{0},
          "host bytes one tenant's blocks may hold: at it a tenant evicts its own blocks, never another "
          "tenant's; a put that cannot make room is RESOURCE_EXHAUSTED naming the tenant (0: no limit)");
ABSL_FLAG(tqkv::ByteSize, disk_budget_bytes, tqkv::ByteSize{uint64_t{64} << 30}, "disk budget for spilled/durable blocks");
ABSL_FLAG(double, write_behind_fraction, 0,
          "once blocks with no disk copy hold more than this fraction of the host budget, the oldest are written to "
          "disk in the background (host copies kept), so eviction and shutdown find them written; costs puts "
          "throughput, durable ones most (0: off)");
ABSL_FLAG(tqkv::ByteSize, disk_min_free_bytes, tqkv::ByteSize{uint64_t{1} << 30},
          "free bytes the disk tier's file system keeps: a spill that would leave less is dropped and a durable put "
          "refused (RESOURCE_EXHAUSTED), as on a full disk, before RocksDB runs out of room (0: off)");
ABSL_FLAG(bool, disk_index_in_background, true,
          "serve while the disk tier's index loads (a block not indexed yet is read from disk when asked for); "
          "false: index every block before serving");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "largest gRPC message received or sent");
ABSL_FLAG(int, max_models_per_tenant, 256,
          "models one tenant may register; one more gets RESOURCE_EXHAUSTED (models on disk always load)");
ABSL_FLAG(uint64_t, max_codec_build_work, uint64_t{1} << 33,
          "most multiply-adds building one registration's codec may take, estimated before it is built (a QR "
          "rotation, for a head_dim neither a power of two nor a multiple of 16 or rotation=qr, costs ~(4/3)d^3 "
          "per layer, kv head and K/V); beyond it RegisterModel is RESOURCE_EXHAUSTED (0: no limit)");
ABSL_FLAG(tqkv::ByteSize, grpc_max_memory_bytes, tqkv::ByteSize{uint64_t{1} << 30},
          "memory gRPC may use for its connections and calls, received messages included (a gRPC resource "
          "quota; 0: unbounded)");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "file of `credential tenant [admin|metrics]` lines (credential: a bearer token, x509-uri:URI "
          "or x509-cn:NAME); mode 0600 or stricter; re-read on SIGHUP and when it changes (write a "
          "new file and rename it over); empty: auth off, every "
          "caller is tenant \"default\" with admin rights");
ABSL_FLAG(int, threads, -1, "CPU backend worker threads (-1: cores - 1)");
ABSL_FLAG(int, gpu_device, 0, "CUDA device ordinal of the cuda backend");
ABSL_FLAG(tqkv::ByteSize, gpu_arena_bytes, tqkv::ByteSize{0},
          "device memory the cuda backend reserves for resident blocks (GPU tier); 0: 60% of "
          "the device memory free at start");
ABSL_FLAG(bool, spill_on_shutdown, true,
          "on SIGTERM/SIGINT move host-resident blocks to disk so a restart finds them");
ABSL_FLAG(int, shutdown_spill_deadline_ms, 30000,
          "how long the shutdown spill of host blocks to disk may take, its WAL sync and close included; what is left "
          "is lost (counted, logged)");
ABSL_FLAG(int, shutdown_grace_ms, 10000,
          "how long a graceful shutdown waits for in-flight RPCs before cancelling them");
ABSL_FLAG(int, sequence_ttl_ms, 300000, "idle expiry of decode sequences that ask for ttl 0");
ABSL_FLAG(int, max_put_streams, 4096,
          "most open put streams (gRPC PutBlocks and data-plane puts), all tenants; one more gets RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_put_streams_per_tenant, 256,
          "most open put streams of one tenant; one more gets RESOURCE_EXHAUSTED");
ABSL_FLAG(int, put_stream_timeout_s, 600,
          "a put stream open longer fails with DEADLINE_EXCEEDED and releases the host memory it holds (nothing "
          "of it is committed)");
ABSL_FLAG(int, max_sequences, 4096, "most live decode sequences, all tenants (CreateSequence beyond: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, max_sequences_per_tenant, 1024,
          "most live decode sequences of one tenant (CreateSequence beyond: RESOURCE_EXHAUSTED)");
ABSL_FLAG(tqkv::ByteSize, max_sequence_bytes, tqkv::ByteSize{uint64_t{4} << 30},
          "host bytes all decode sequences may hold beyond the stored blocks they read (tail rooms and "
          "blocks their appends fill): a CreateSequence or an append past it is RESOURCE_EXHAUSTED");
ABSL_FLAG(tqkv::ByteSize, max_sequence_bytes_per_tenant, tqkv::ByteSize{uint64_t{2} << 30},
          "the same bytes for one tenant's sequences");
ABSL_FLAG(tqkv::ByteSize, max_staged_bytes, tqkv::ByteSize{uint64_t{256} << 20},
          "host bytes of blocks that layer-range puts have staged but not completed (whole-block "
          "buffers and the parts open streams hold); a put that would stage more is RESOURCE_EXHAUSTED");
ABSL_FLAG(tqkv::ByteSize, max_staged_bytes_per_tenant, tqkv::ByteSize{uint64_t{1} << 30},
          "the same bytes for one tenant's layer-range puts");
ABSL_FLAG(bool, log_rpc_errors, true, "log failed RPCs (except NOT_FOUND) to stderr");

namespace {

// protobuf's own messages (e.g. a request string field that is not UTF-8,
// from any caller, authenticated or not) at the rate-limited log's pace.
void LogProtobuf(google::protobuf::LogLevel, const char*, int, const std::string& message) {
  static tqkv::service::LineLog log(&std::cerr);
  log.WriteLimited(absl::StrCat("tqkv-server: protobuf: ", message));
}

}  // namespace

int main(int argc, char** argv) {
  google::protobuf::SetLogHandler(&LogProtobuf);
  absl::SetProgramUsageMessage(
      "tqkv-server: GPU-resident KV-cache store with TurboQuant compression.\n"
      "Prints `tqkv-server listening on HOST:PORT` (and the data-plane and metrics addresses)\n"
      "once serving;\n"
      "SIGHUP re-reads the auth file; SIGTERM/SIGINT drain in-flight RPCs, spill host blocks\n"
      "to disk and exit 0. Byte counts take units: 64GiB, 512MiB, 10GB (or plain bytes).");
  absl::FlagsUsageConfig usage;
  // --help lists this file's flags (absl's default looks for a file named
  // after the binary).
  usage.contains_help_flags = [](absl::string_view path) {
    return path.find("service/server_main.cc") != absl::string_view::npos;
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] {
    const tqkv::service::BuildInfo b = tqkv::service::CurrentBuildInfo();
    return absl::StrCat("tqkv-server ", b.version, " (commit ", b.commit.empty() ? "unknown" : b.commit, ")\n");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  tqkv::KeepFreedMemoryForReuse(absl::GetFlag(FLAGS_malloc_keep_free_bytes).bytes);
  tqkv::service::LineLog log(&std::cerr);
  // Debian's Abseil is built without NDEBUG, so every absl::Mutex
  // acquisition (ours and gRPC's) would update a lock graph for deadlock
  // detection; that costs a measurable share of small-RPC throughput.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // Block the shutdown and reload signals in every thread (threads inherit
  // the mask); the main thread collects them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  tqkv::service::ServerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.metrics_auth = absl::GetFlag(FLAGS_metrics_auth);
  const std::string labels = absl::GetFlag(FLAGS_metrics_tenant_labels);
  if (labels == "auto") {
    o.metrics_tenant_labels = tqkv::service::ServerOptions::TenantLabels::kAuto;
  } else if (labels == "true") {
    o.metrics_tenant_labels = tqkv::service::ServerOptions::TenantLabels::kOn;
  } else if (labels == "false") {
    o.metrics_tenant_labels = tqkv::service::ServerOptions::TenantLabels::kOff;
  } else {
    log.Write(absl::StrCat("tqkv-server: --metrics_tenant_labels must be auto, true or false, not '", labels, "'"),
              tqkv::service::LogLevel::kError);
    return 1;
  }
  o.insecure_listen_any = absl::GetFlag(FLAGS_insecure_listen_any);
  o.grpc_reflection = absl::GetFlag(FLAGS_grpc_reflection);
  o.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  o.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  o.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  o.tls.reload_interval = absl::Seconds(absl::GetFlag(FLAGS_tls_reload_interval_s));
  o.data_listen = absl::GetFlag(FLAGS_data_listen);
  o.data_advertise_host = absl::GetFlag(FLAGS_data_advertise_host);
  o.at_rest_key_file = absl::GetFlag(FLAGS_at_rest_key_file);
  o.data_threads = absl::GetFlag(FLAGS_data_threads);
  o.work_threads = absl::GetFlag(FLAGS_work_threads);
  o.work_queue = absl::GetFlag(FLAGS_work_queue);
  o.data_idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_data_idle_timeout_s));
  o.data_max_connections = absl::GetFlag(FLAGS_data_max_connections);
  o.data_max_buffered_bytes = absl::GetFlag(FLAGS_data_max_buffered_bytes).bytes;
  o.data_frame_timeout = absl::Seconds(absl::GetFlag(FLAGS_data_frame_timeout_s));
  o.data_max_reply_bytes = absl::GetFlag(FLAGS_data_max_reply_bytes).bytes;
  o.data_max_reply_bytes_per_tenant = absl::GetFlag(FLAGS_data_max_reply_bytes_per_tenant).bytes;
  o.data_max_unauthenticated_frame_bytes = static_cast<uint32_t>(
      std::min<uint64_t>(absl::GetFlag(FLAGS_data_max_unauthenticated_frame_bytes).bytes, UINT32_MAX));
  o.data_cuda_ipc = absl::GetFlag(FLAGS_data_cuda_ipc);
  o.data_socket = absl::GetFlag(FLAGS_data_socket);
  o.data_busy_poll = absl::GetFlag(FLAGS_data_busy_poll);
  {
    const std::string mode = absl::GetFlag(FLAGS_data_socket_mode);
    char* end = nullptr;
    const unsigned long m = std::strtoul(mode.c_str(), &end, 8);
    if (mode.empty() || *end != '\0' || m > 0777) {
      std::cerr << "tqkv-server: --data_socket_mode '" << mode << "' is not an octal file mode 0..0777" << std::endl;
      return 1;
    }
    o.data_socket_mode = static_cast<unsigned>(m);
  }
  o.data_max_shared_bytes = absl::GetFlag(FLAGS_data_max_shared_bytes).bytes;
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.backend = absl::GetFlag(FLAGS_backend);
  o.host_budget_bytes = absl::GetFlag(FLAGS_host_budget_bytes).bytes;
  o.pin_host_tier = absl::GetFlag(FLAGS_pin_host_tier);
  o.tenant_host_quota_bytes = absl::GetFlag(FLAGS_tenant_host_quota_bytes).bytes;
  o.disk_budget_bytes = absl::GetFlag(FLAGS_disk_budget_bytes).bytes;
  o.write_behind_fraction = absl::GetFlag(FLAGS_write_behind_fraction);
  o.disk_min_free_bytes = absl::GetFlag(FLAGS_disk_min_free_bytes).bytes;
  o.disk_index_in_background = absl::GetFlag(FLAGS_disk_index_in_background);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.max_models_per_tenant = absl::GetFlag(FLAGS_max_models_per_tenant);
  o.max_codec_build_work = absl::GetFlag(FLAGS_max_codec_build_work);
  o.grpc_max_memory_bytes = absl::GetFlag(FLAGS_grpc_max_memory_bytes).bytes;
  o.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.spill_on_shutdown = absl::GetFlag(FLAGS_spill_on_shutdown);
  o.shutdown_grace = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));
  o.shutdown_spill_deadline = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_spill_deadline_ms));
  o.service.sequences.default_ttl = absl::Milliseconds(absl::GetFlag(FLAGS_sequence_ttl_ms));
  for (const auto& [name, value] : {std::pair{"--max_sequences", absl::GetFlag(FLAGS_max_sequences)},
                                     std::pair{"--max_sequences_per_tenant", absl::GetFlag(FLAGS_max_sequences_per_tenant)},
                                     std::pair{"--max_put_streams", absl::GetFlag(FLAGS_max_put_streams)},
                                     std::pair{"--max_put_streams_per_tenant", absl::GetFlag(FLAGS_max_put_streams_per_tenant)},
                                     std::pair{"--put_stream_timeout_s", absl::GetFlag(FLAGS_put_stream_timeout_s)}}) {
    if (value < 1) {
      log.Write(absl::StrCat("tqkv-server: ", name, " must be at least 1, not ", value), tqkv::service::LogLevel::kError);
      return 1;
    }
  }
  o.service.sequences.max_sequences = static_cast<size_t>(absl::GetFlag(FLAGS_max_sequences));
  o.service.sequences.max_sequences_per_tenant = static_cast<size_t>(absl::GetFlag(FLAGS_max_sequences_per_tenant));
  o.service.sequences.max_bytes = absl::GetFlag(FLAGS_max_sequence_bytes).bytes;
  o.service.sequences.max_bytes_per_tenant = absl::GetFlag(FLAGS_max_sequence_bytes_per_tenant).bytes;
  o.service.staging.max_bytes = absl::GetFlag(FLAGS_max_staged_bytes).bytes;
  o.service.staging.max_bytes_per_tenant = absl::GetFlag(FLAGS_max_staged_bytes_per_tenant).bytes;
  o.service.put_streams.max_open = static_cast<size_t>(absl::GetFlag(FLAGS_max_put_streams));
  o.service.put_streams.max_open_per_tenant = static_cast<size_t>(absl::GetFlag(FLAGS_max_put_streams_per_tenant));
  o.service.put_streams.max_age = absl::Seconds(absl::GetFlag(FLAGS_put_stream_timeout_s));
  o.log_rpc_errors = absl::GetFlag(FLAGS_log_rpc_errors);
  o.log = &std::cerr;

  // The CUDA backend (//gpu:cuda_backend) is linked in; it answers
  // UNAVAILABLE where there is no usable GPU (then auto falls back to cpu).
  tqkv::gpu::CudaBackendOptions gpu;
  gpu.device = absl::GetFlag(FLAGS_gpu_device);
  gpu.arena_bytes = absl::GetFlag(FLAGS_gpu_arena_bytes).bytes;
  tqkv::service::CudaBackendFactory cuda = [gpu] { return tqkv::gpu::CreateCudaBackend(gpu); };
  absl::StatusOr<std::unique_ptr<tqkv::service::Server>> server =
      tqkv::service::Server::Start(o, cuda);
  if (!server.ok()) {
    log.Write(absl::StrCat("tqkv-server: ", server.status().ToString()), tqkv::service::LogLevel::kError);
    return 1;
  }
  std::cout << "tqkv-server listening on " << (*server)->address() << std::endl;
  if (!(*server)->data_address().empty())
    std::cout << "tqkv-server data plane listening on " << (*server)->data_address() << std::endl;
  if (!(*server)->data_socket().empty())
    std::cout << "tqkv-server data plane socket on " << (*server)->data_socket() << std::endl;
  if (!(*server)->metrics_address().empty())
    std::cout << "tqkv-server metrics listening on " << (*server)->metrics_address() << std::endl;
  log.Write(absl::StrCat("tqkv-server: ", tqkv::service::CurrentBuildInfo().version, ", backend ",
                         (*server)->backend_name(), ", data_dir '", o.data_dir, "'"));

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    (*server)->ReloadAuth().IgnoreError();  // logs its outcome
  }
  log.Write(absl::StrCat("tqkv-server: signal ", sig, ", shutting down"));
  absl::Status s = (*server)->Shutdown();
  server->reset();
  if (!s.ok()) {
    log.Write(absl::StrCat("tqkv-server: shutdown: ", s.ToString()), tqkv::service::LogLevel::kError);
    return 1;
  }
  log.Write("tqkv-server: stopped");
  return 0;
}
