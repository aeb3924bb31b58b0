// A second process for the CUDA IPC tests (a worker that owns GPU memory):
// reads u64 n and n bytes on stdin, copies them into a new cudaMalloc
// allocation and writes its cudaIpcMemHandle_t (64 bytes) on stdout. Then
// per command byte on stdin: 'r' writes the allocation's n bytes back on
// stdout (what the server wrote into it), 'q' (or end of input) exits.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

bool ReadAll(void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = read(0, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteAll(const void* p, size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(1, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

int main() {
  uint64_t n = 0;
  if (!ReadAll(&n, sizeof n)) return 2;
  std::vector<char> bytes(n);
  if (!ReadAll(bytes.data(), n)) return 2;
  void* d = nullptr;
  if (cudaMalloc(&d, n) != cudaSuccess || cudaMemcpy(d, bytes.data(), n, cudaMemcpyHostToDevice) != cudaSuccess) {
    std::fprintf(stderr, "cuda_ipc_exporter: cannot allocate %llu bytes\n", static_cast<unsigned long long>(n));
    return 3;
  }
  cudaIpcMemHandle_t h;
  if (cudaIpcGetMemHandle(&h, d) != cudaSuccess || !WriteAll(&h, sizeof h)) return 3;
  char cmd = 0;
  while (ReadAll(&cmd, 1) && cmd == 'r') {
    if (cudaMemcpy(bytes.data(), d, n, cudaMemcpyDeviceToHost) != cudaSuccess || !WriteAll(bytes.data(), n)) return 3;
  }
  cudaFree(d);
  return 0;
}
