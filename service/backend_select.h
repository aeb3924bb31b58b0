// Picks the ComputeBackend for --backend=auto|cpu|cuda.
//
// The CUDA backend lives in gpu/ and is optional at link time: the server's
// main passes a factory when //gpu:cuda_backend is linked and null when it
// is not. The factory returns UNAVAILABLE when there is no usable GPU.
//   cpu  → CpuBackend.
//   cuda → the CUDA backend; FAILED_PRECONDITION when not linked, the
//          factory's error (UNAVAILABLE) when no GPU.
//   auto → the CUDA backend if linked and available, else CpuBackend (with
//          a note saying why).
#ifndef TQKV_SERVICE_BACKEND_SELECT_H_
#define TQKV_SERVICE_BACKEND_SELECT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "codec/backend.h"

namespace tqkv::service {

using CudaBackendFactory = std::function<absl::StatusOr<std::unique_ptr<ComputeBackend>>()>;

struct SelectedBackend {
  std::unique_ptr<ComputeBackend> backend;
  std::string note;  // why auto chose what it chose ("" otherwise)
};

// INVALID_ARGUMENT for an unknown kind. `cpu_threads`: CpuBackend workers
// (-1: cores − 1).
absl::StatusOr<SelectedBackend> SelectBackend(const std::string& kind, int cpu_threads,
                                              const CudaBackendFactory& cuda);

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_BACKEND_SELECT_H_
