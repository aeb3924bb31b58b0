#include "base/malloc_tuning.h"

#include <malloc.h>

#include <algorithm>
#include <climits>

namespace tqkv {

void KeepFreedMemoryForReuse(size_t keep_free_bytes) {
  if (keep_free_bytes == 0) return;
  constexpr int kArenaAllocationsUpTo = 64 << 20;
  mallopt(M_MMAP_THRESHOLD, kArenaAllocationsUpTo);
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(std::min<size_t>(keep_free_bytes, INT_MAX)));
}

}  // namespace tqkv
