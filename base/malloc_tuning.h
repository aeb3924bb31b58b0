// How the process's allocator (glibc malloc) treats freed memory.
#ifndef TQKV_BASE_MALLOC_TUNING_H_
#define TQKV_BASE_MALLOC_TUNING_H_

#include <cstddef>

namespace tqkv {

// Keeps up to `keep_free_bytes` of freed memory at the top of each malloc
// arena for reuse (M_TRIM_THRESHOLD), and serves allocations of up to 64
// MiB from the arenas rather than from fresh mappings (M_MMAP_THRESHOLD).
// A store allocates and frees buffers of hundreds of KiB to MiBs at the
// rate puts, reads and evictions run; memory handed back to the kernel is
// faulted in again a page at a time, which costs more CPU than the copy
// into it (bench/RESULTS.md, "Puts and gets"). 0 leaves glibc's defaults
// (which return a freed block's memory once it is above a few MiB).
// Call once, early in main, before threads start.
void KeepFreedMemoryForReuse(size_t keep_free_bytes);

// tqkv-server's default (--malloc_keep_free_bytes); the benchmarks' harnesses
// use it too.
inline constexpr size_t kDefaultKeepFreeBytes = size_t{256} << 20;

}  // namespace tqkv

#endif  // TQKV_BASE_MALLOC_TUNING_H_
