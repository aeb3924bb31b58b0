// The one place where absl::Status becomes grpc::Status. Codes map one to
// one (absl's canonical codes are gRPC's); the message is kept.
#ifndef TQKV_SERVICE_GRPC_STATUS_H_
#define TQKV_SERVICE_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace tqkv::service {

grpc::Status ToGrpcStatus(const absl::Status& s);

// Upper-case code name, e.g. "NOT_FOUND" (stable: a metric label).
const char* CodeName(absl::StatusCode code);

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_GRPC_STATUS_H_
