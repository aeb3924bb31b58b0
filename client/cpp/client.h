// tqkv C++ client: typed calls over the tqkv.v1 KvStore/Admin stubs.
//
// Every call gets its own deadline (Options::deadline) and carries the
// bearer token if one is set. A call that fails with UNAVAILABLE is retried
// with exponential backoff (and only then: every other code is returned at
// once), up to Options::max_attempts attempts in all. Retrying is safe for
// every tqkv call: puts are idempotent (identical blocks are
// "already_present") and a failed put stream commits nothing.
//
// Errors are absl::Status with the server's gRPC code and message.
//
// Thread safety: a Client may be shared by threads; calls are independent.
#ifndef TQKV_CLIENT_CPP_CLIENT_H_
#define TQKV_CLIENT_CPP_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/tqkv/v1/tqkv.grpc.pb.h"

namespace tqkv::client {

struct ClientOptions {
  // Server address HOST:PORT. Required.
  std::string target;
  // Deadline of each attempt of each call. Default: 30 s.
  absl::Duration deadline = absl::Seconds(30);
  // Attempts per call when the server answers UNAVAILABLE (1: no retry).
  // Default: 4.
  int max_attempts = 4;
  // Backoff before the first retry; multiplied by backoff_multiplier after
  // each, capped at max_backoff. Defaults: 50 ms, 2, 2 s.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  double backoff_multiplier = 2.0;
  absl::Duration max_backoff = absl::Seconds(2);
  // Bearer token sent as `authorization: Bearer <token>`; empty: none.
  // Default: empty.
  std::string token;
  // Largest message sent or received. Default: 64 MiB.
  int max_message_bytes = 64 << 20;
  // TLS: connect with TLS, verifying the server's certificate against
  // tls_ca_file (PEM) or, when that is empty, the system's root CAs.
  // Setting any tls_* file implies it. Default: false (plaintext).
  bool tls = false;
  std::string tls_ca_file;
  // Client certificate chain and key (PEM) for servers that require mutual
  // TLS; both or neither. Default: empty.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Name the server's certificate must carry, when it is not the host of
  // `target` (e.g. connecting by IP address). Default: empty.
  std::string tls_server_name;
  // Extra integer gRPC channel arguments (names from grpc_types.h, e.g.
  // "grpc.max_reconnect_backoff_ms"). Default: none.
  std::vector<std::pair<std::string, int>> channel_args;

  bool use_tls() const {
    return tls || !tls_ca_file.empty() || !tls_cert_file.empty() || !tls_key_file.empty();
  }
};

// grpc::Status → absl::Status (same code and message).
absl::Status FromGrpc(const grpc::Status& s);

class Client {
 public:
  // Creates the channel (connection is lazy; a failed TLS handshake shows
  // as UNAVAILABLE on the calls). INVALID_ARGUMENT for an empty target or
  // only one of tls_cert_file/tls_key_file; NOT_FOUND when a TLS file
  // cannot be read.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // SERVING → true, NOT_SERVING → false; errors as statuses.
  absl::StatusOr<bool> Health();

  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(const v1::RegisterModelRequest& req);
  // One stream: the header, then every block; commits at the end.
  absl::StatusOr<v1::PutBlocksResponse> PutBlocks(const v1::PutHeader& header,
                                                  const std::vector<v1::PutBlock>& blocks);
  absl::StatusOr<v1::LookupResponse> Lookup(const v1::LookupRequest& req);
  // Every response of the stream, in order.
  absl::StatusOr<std::vector<v1::GetBlocksResponse>> GetBlocks(const v1::GetBlocksRequest& req);
  absl::StatusOr<v1::PinResponse> Pin(const v1::PinRequest& req);
  absl::StatusOr<v1::UnpinResponse> Unpin(const v1::UnpinRequest& req);
  absl::StatusOr<v1::DeleteResponse> Delete(const v1::DeleteRequest& req);
  absl::StatusOr<v1::CreateSequenceResponse> CreateSequence(const v1::CreateSequenceRequest& req);
  absl::StatusOr<v1::AppendResponse> Append(const v1::AppendRequest& req);
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& req);
  absl::StatusOr<v1::DropSequenceResponse> DropSequence(const v1::DropSequenceRequest& req);
  absl::StatusOr<v1::StatsResponse> Stats(const v1::StatsRequest& req);
  absl::StatusOr<v1::ListModelsResponse> ListModels(const v1::ListModelsRequest& req);
  absl::StatusOr<v1::EvictResponse> Evict(const v1::EvictRequest& req);
  absl::StatusOr<v1::UnregisterModelResponse> UnregisterModel(const v1::UnregisterModelRequest& req);

  // A context with this client's deadline and token, for direct stub use.
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  v1::KvStore::Stub& kv_stub() { return *kv_; }
  const ClientOptions& options() const { return options_; }

 private:
  Client(const ClientOptions& options, std::shared_ptr<grpc::ChannelCredentials> credentials);
  // Runs attempt(ctx) with retries on UNAVAILABLE.
  absl::Status WithRetry(const std::function<grpc::Status(grpc::ClientContext*)>& attempt);

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvStore::Stub> kv_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace tqkv::client

#endif  // TQKV_CLIENT_CPP_CLIENT_H_
