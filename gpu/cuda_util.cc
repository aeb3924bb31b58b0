#include "gpu/cuda_util.h"

#include "absl/strings/str_cat.h"

namespace tqkv::gpu {

absl::Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorStubLibrary:
      return absl::UnavailableError(msg);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorNotSupported:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

template <MemoryKind Kind>
absl::Status CudaMemory<Kind>::Reserve(size_t bytes) {
  if (bytes <= bytes_ && ptr_ != nullptr) return absl::OkStatus();
  Reset();
  if (bytes == 0) return absl::OkStatus();
  if constexpr (Kind == MemoryKind::kDevice) {
    TQ_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr_, bytes), absl::StrCat("cudaMalloc(", bytes, ")"));
  } else {
    TQ_CUDA_RETURN_IF_ERROR(cudaMallocHost(&ptr_, bytes), absl::StrCat("cudaMallocHost(", bytes, ")"));
  }
  bytes_ = bytes;
  return absl::OkStatus();
}

template <MemoryKind Kind>
void CudaMemory<Kind>::Reset() {
  if (ptr_ != nullptr) {
    if constexpr (Kind == MemoryKind::kDevice) {
      cudaFree(ptr_);
    } else {
      cudaFreeHost(ptr_);
    }
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

template class CudaMemory<MemoryKind::kDevice>;
template class CudaMemory<MemoryKind::kPinnedHost>;

CudaStream::~CudaStream() {
  if (s_ != nullptr) cudaStreamDestroy(s_);
}

absl::StatusOr<CudaStream> CudaStream::Create() {
  CudaStream s;
  TQ_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}

absl::Status CudaStream::Synchronize(const std::string& what) const {
  return CudaStatus(cudaStreamSynchronize(s_), what);
}

CudaEvent::~CudaEvent() {
  if (e_ != nullptr) cudaEventDestroy(e_);
}

absl::StatusOr<CudaEvent> CudaEvent::Create() {
  CudaEvent e;
  TQ_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e.e_), "cudaEventCreate");
  return e;
}

float CudaEvent::ElapsedMs(const CudaEvent& start, const CudaEvent& stop) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, start.e_, stop.e_) != cudaSuccess) return -1.0f;
  return ms;
}

}  // namespace tqkv::gpu
