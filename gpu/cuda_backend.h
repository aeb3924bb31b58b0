// CudaBackend: ComputeBackend on one NVIDIA GPU (plain C++ header; no CUDA
// types). Encode/decode stage host tensors through pinned buffers; Attend
// keeps stored blocks resident in a device arena keyed by BlockRef::id
// (upload on miss, LRU eviction, Forget frees; blocks being filled copy
// layer by layer), dense tails in a second arena keyed by
// AttendSequence::tail_id (only rows not yet copied cross the bus), a
// keyed sequence's block table between calls (its arena slots, with a copy
// on the device: gpu/seq_tables.h), and runs the fused paged attention
// kernels.
#ifndef TQKV_GPU_CUDA_BACKEND_H_
#define TQKV_GPU_CUDA_BACKEND_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "codec/backend.h"

namespace tqkv::gpu {

struct CudaBackendOptions {
  // CUDA device ordinal. Default 0.
  int device = 0;
  // Bytes of the block arena (one cudaMalloc at creation). 0 (the default)
  // sizes it from the device: `arena_fraction` of the memory free at creation.
  size_t arena_bytes = 0;
  double arena_fraction = 0.6;
  // Bytes of the dense-tail arena (fp32 rows of up to 16 tokens per tail:
  // 128 KiB a tail at 8 kv heads × d 128, so the default holds 4,096 live
  // (sequence, layer) tails; beyond it the least recently used are copied
  // again when next used). Default 512 MiB.
  size_t tail_arena_bytes = size_t{512} << 20;
  // Bytes of the block-table arena: each keyed sequence's table of arena
  // slots stays on the device between calls (4 bytes a block, in chunks of
  // a power of two of at least 256 blocks), so a decode call uploads only
  // the blocks it adds. Tables beyond it, and tables longer than
  // `max_table_blocks` (also the arena's readable padding), are uploaded
  // with their call. Default 64 MiB: 4,096 sequences of up to 4,096
  // blocks (64K tokens at block 16).
  size_t table_arena_bytes = size_t{64} << 20;
  size_t max_table_blocks = size_t{1} << 18;
  // Pinned bytes through which stored blocks are copied into the block
  // arena (two halves, each holding at least one block): a call that
  // uploads more (the first Attend over a long context) streams its blocks
  // through them. Default 64 MiB.
  size_t upload_staging_bytes = size_t{64} << 20;
};

// A CudaBackend, or UNAVAILABLE (with the CUDA error) when no GPU/driver is
// present, RESOURCE_EXHAUSTED when the arena cannot be allocated.
// Codecs passed to the backend must outlive it (device tables are cached
// per ModelCodec address).
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const CudaBackendOptions& options);

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_CUDA_BACKEND_H_
