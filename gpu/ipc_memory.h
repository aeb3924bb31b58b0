// Another process's GPU allocations, opened through CUDA IPC for the span
// of one call (a same-host worker's K/V cache: codec DeviceKvRef).
#ifndef TQKV_GPU_IPC_MEMORY_H_
#define TQKV_GPU_IPC_MEMORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tqkv::gpu {

class IpcMappings {
 public:
  // Opens each handle (cudaIpcMemHandle_t bytes; equal handles once) on
  // the current device and learns each allocation's size.
  // FAILED_PRECONDITION naming the handle and the CUDA error when one
  // cannot be opened (another host's or device's memory, a freed
  // allocation, the exporting process itself).
  static absl::StatusOr<IpcMappings> Open(const std::vector<std::string>& handles);
  IpcMappings() = default;
  IpcMappings(IpcMappings&& o) noexcept { *this = std::move(o); }
  IpcMappings& operator=(IpcMappings&& o) noexcept;  // closes this one's handles first
  IpcMappings(const IpcMappings&) = delete;
  ~IpcMappings() { Close(); }

  // Handle i's allocation, from its first byte, and its size.
  uint8_t* base(size_t i) const { return maps_[index_[i]].base; }
  uint64_t size(size_t i) const { return maps_[index_[i]].size; }

 private:
  void Close();  // closes every handle it opened

  struct Map {
    uint8_t* base = nullptr;
    uint64_t size = 0;
  };
  std::vector<Map> maps_;      // one per distinct handle
  std::vector<size_t> index_;  // handle i → maps_
};

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_IPC_MEMORY_H_
