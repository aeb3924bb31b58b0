#include "service/backend_select.h"

#include "absl/strings/str_cat.h"
#include "codec/cpu_backend.h"

namespace tqkv::service {

absl::StatusOr<SelectedBackend> SelectBackend(const std::string& kind, int cpu_threads,
                                              const CudaBackendFactory& cuda) {
  auto cpu = [&] { return std::make_unique<CpuBackend>(CpuBackend::Options{cpu_threads}); };
  if (kind == "cpu") return SelectedBackend{cpu(), ""};
  if (kind == "cuda") {
    if (!cuda)
      return absl::FailedPreconditionError(
          "--backend=cuda: this tqkv-server was built without the CUDA backend "
          "(//gpu:cuda_backend is not linked); use --backend=cpu or --backend=auto");
    absl::StatusOr<std::unique_ptr<ComputeBackend>> b = cuda();
    if (!b.ok())
      return absl::Status(b.status().code(), absl::StrCat("--backend=cuda: ", b.status().message()));
    return SelectedBackend{std::move(*b), ""};
  }
  if (kind == "auto") {
    if (!cuda) return SelectedBackend{cpu(), "CUDA backend not built in; using cpu"};
    absl::StatusOr<std::unique_ptr<ComputeBackend>> b = cuda();
    if (b.ok()) return SelectedBackend{std::move(*b), ""};
    return SelectedBackend{cpu(),
                           absl::StrCat("CUDA backend unavailable (", b.status().message(),
                                        "); using cpu")};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend must be auto, cpu or cuda, got '", kind, "'"));
}

}  // namespace tqkv::service
