#include "gpu/ipc_memory.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/backend.h"

namespace tqkv::gpu {
namespace {

// cuMemGetAddressRange (driver API, reached through the runtime so that
// nothing links libcuda): the allocation that holds a device address.
using AddressRangeFn = int (*)(unsigned long long* base, size_t* size, unsigned long long ptr);

AddressRangeFn AddressRange() {
  static const AddressRangeFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return AddressRangeFn{nullptr};
    return reinterpret_cast<AddressRangeFn>(f);
  }();
  return fn;
}

}  // namespace

absl::StatusOr<IpcMappings> IpcMappings::Open(const std::vector<std::string>& handles) {
  IpcMappings m;
  std::vector<std::string> seen;
  for (size_t i = 0; i < handles.size(); ++i) {
    const std::string& h = handles[i];
    if (h.size() != sizeof(cudaIpcMemHandle_t))
      return absl::InvalidArgumentError(absl::StrCat("CUDA IPC handle ", i, " has ", h.size(), " bytes"));
    size_t at = 0;
    while (at < seen.size() && seen[at] != h) ++at;
    if (at == seen.size()) {
      cudaIpcMemHandle_t handle;
      std::memcpy(&handle, h.data(), sizeof handle);
      void* p = nullptr;
      cudaError_t e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot open CUDA IPC handle ", i, " (", cudaGetErrorName(e), ": ", cudaGetErrorString(e),
            "): the memory must be a live cudaMalloc allocation of another process on this server's host and GPU"));
      }
      Map map{static_cast<uint8_t*>(p), 0};
      m.maps_.push_back(map);  // closed by the destructor from here on
      unsigned long long base = 0;
      size_t size = 0;
      const AddressRangeFn range = AddressRange();
      if (range == nullptr || range(&base, &size, reinterpret_cast<unsigned long long>(p)) != 0)
        return absl::FailedPreconditionError("cannot learn the size of a CUDA IPC allocation (cuMemGetAddressRange)");
      // The mapping starts at the exported allocation's base.
      m.maps_.back().size = size - (reinterpret_cast<unsigned long long>(p) - base);
      seen.push_back(h);
    }
    m.index_.push_back(at);
  }
  return m;
}

IpcMappings& IpcMappings::operator=(IpcMappings&& o) noexcept {
  if (this != &o) {
    Close();
    maps_ = std::move(o.maps_);
    index_ = std::move(o.index_);
    o.maps_.clear();
    o.index_.clear();
  }
  return *this;
}

void IpcMappings::Close() {
  for (const Map& m : maps_) (void)cudaIpcCloseMemHandle(m.base);
  maps_.clear();
}

}  // namespace tqkv::gpu
