#include "client/cpp/client.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tqkv::client {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const ClientOptions& o) {
  if (!o.use_tls()) return grpc::InsecureChannelCredentials();
  if (o.tls_cert_file.empty() != o.tls_key_file.empty())
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file go together");
  grpc::SslCredentialsOptions ssl;
  if (!o.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(o.tls_ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!o.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(o.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(o.tls_key_file);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

Client::Client(const ClientOptions& options, std::shared_ptr<grpc::ChannelCredentials> credentials)
    : options_(options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  for (const auto& [name, value] : options.channel_args) args.SetInt(name, value);
  channel_ = grpc::CreateCustomChannel(options.target, credentials, args);
  kv_ = v1::KvStore::NewStub(channel_);
  admin_ = v1::Admin::NewStub(channel_);
  health_ = grpc::health::v1::Health::NewStub(channel_);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("client target is empty");
  if (options.max_attempts < 1) return absl::InvalidArgumentError("max_attempts must be >= 1");
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = Credentials(options);
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<Client>(new Client(options, *std::move(credentials)));
}

std::unique_ptr<grpc::ClientContext> Client::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoNanoseconds(options_.deadline));
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  return ctx;
}

absl::Status Client::WithRetry(const std::function<grpc::Status(grpc::ClientContext*)>& attempt) {
  absl::Duration backoff = options_.initial_backoff;
  for (int i = 1;; ++i) {
    std::unique_ptr<grpc::ClientContext> ctx = NewContext();
    grpc::Status s = attempt(ctx.get());
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || i >= options_.max_attempts)
      return FromGrpc(s);
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(backoff));
    backoff = std::min(backoff * options_.backoff_multiplier, options_.max_backoff);
  }
}

absl::StatusOr<bool> Client::Health() {
  grpc::health::v1::HealthCheckResponse resp;
  absl::Status s = WithRetry([&](grpc::ClientContext* ctx) {
    return health_->Check(ctx, grpc::health::v1::HealthCheckRequest(), &resp);
  });
  if (!s.ok()) return s;
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

#define TQKV_UNARY(Method, Stub, Req, Resp)                                              \
  absl::StatusOr<v1::Resp> Client::Method(const v1::Req& req) {                          \
    v1::Resp resp;                                                                       \
    absl::Status s = WithRetry(                                                          \
        [&](grpc::ClientContext* ctx) { return Stub->Method(ctx, req, &resp); });        \
    if (!s.ok()) return s;                                                               \
    return resp;                                                                         \
  }

TQKV_UNARY(RegisterModel, kv_, RegisterModelRequest, RegisterModelResponse)
TQKV_UNARY(Lookup, kv_, LookupRequest, LookupResponse)
TQKV_UNARY(Pin, kv_, PinRequest, PinResponse)
TQKV_UNARY(Unpin, kv_, UnpinRequest, UnpinResponse)
TQKV_UNARY(Delete, kv_, DeleteRequest, DeleteResponse)
TQKV_UNARY(CreateSequence, kv_, CreateSequenceRequest, CreateSequenceResponse)
TQKV_UNARY(Append, kv_, AppendRequest, AppendResponse)
TQKV_UNARY(Attend, kv_, AttendRequest, AttendResponse)
TQKV_UNARY(DropSequence, kv_, DropSequenceRequest, DropSequenceResponse)
TQKV_UNARY(Stats, kv_, StatsRequest, StatsResponse)
TQKV_UNARY(ListModels, kv_, ListModelsRequest, ListModelsResponse)
TQKV_UNARY(Evict, admin_, EvictRequest, EvictResponse)
TQKV_UNARY(UnregisterModel, admin_, UnregisterModelRequest, UnregisterModelResponse)
#undef TQKV_UNARY

absl::StatusOr<v1::PutBlocksResponse> Client::PutBlocks(const v1::PutHeader& header,
                                                        const std::vector<v1::PutBlock>& blocks) {
  v1::PutBlocksResponse resp;
  absl::Status s = WithRetry([&](grpc::ClientContext* ctx) {
    std::unique_ptr<grpc::ClientWriter<v1::PutBlocksRequest>> w = kv_->PutBlocks(ctx, &resp);
    v1::PutBlocksRequest msg;
    *msg.mutable_header() = header;
    bool ok = w->Write(msg);
    for (size_t i = 0; ok && i < blocks.size(); ++i) {
      *msg.mutable_block() = blocks[i];
      ok = w->Write(msg);
    }
    // A failed Write means the server has already finished the call; its
    // status comes from Finish either way.
    if (ok) w->WritesDone();
    return w->Finish();
  });
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<std::vector<v1::GetBlocksResponse>> Client::GetBlocks(
    const v1::GetBlocksRequest& req) {
  std::vector<v1::GetBlocksResponse> out;
  absl::Status s = WithRetry([&](grpc::ClientContext* ctx) {
    out.clear();
    std::unique_ptr<grpc::ClientReader<v1::GetBlocksResponse>> r = kv_->GetBlocks(ctx, req);
    v1::GetBlocksResponse resp;
    while (r->Read(&resp)) out.push_back(std::move(resp));
    return r->Finish();
  });
  if (!s.ok()) return s;
  return out;
}

}  // namespace tqkv::client
