#include "storage/host_arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "storage/host_pool.h"

namespace tqkv::storage {
namespace {

std::unique_ptr<HostArena> Arena(size_t bytes) {
  absl::StatusOr<std::unique_ptr<HostArena>> a = HostArena::Create(bytes);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *std::move(a) : nullptr;
}

TEST(HostArena, ChunksAreAlignedDisjointAndInside) {
  std::unique_ptr<HostArena> a = Arena(1 << 20);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->size(), size_t{2} << 20);  // whole huge pages
  std::vector<std::pair<uint8_t*, size_t>> got;
  for (size_t n : {1, 255, 256, 257, 4096, 100000}) {
    uint8_t* p = a->Allocate(n);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % HostArena::kAlign, 0u);
    EXPECT_TRUE(a->Contains(p) && a->Contains(p + n - 1));
    std::memset(p, static_cast<int>(n & 0xff), n);
    got.push_back({p, n});
  }
  std::sort(got.begin(), got.end());
  for (size_t i = 1; i < got.size(); ++i) EXPECT_LE(got[i - 1].first + got[i - 1].second, got[i].first);
  for (auto [p, n] : got) a->Free(p, n);
  EXPECT_EQ(a->stats().in_use_bytes, 0u);
  EXPECT_EQ(a->Allocate(0), nullptr);
  EXPECT_FALSE(a->Contains(a->base() + a->size()));
}

TEST(HostArena, FreedChunksServeTheirSizeAgainAndFullArenaSaysNull) {
  std::unique_ptr<HostArena> a = Arena(2 << 20);
  ASSERT_NE(a, nullptr);
  const size_t block = 500 * 1000;  // rounds to 500,224: four fit in 2 MiB
  std::vector<uint8_t*> p;
  while (uint8_t* q = a->Allocate(block)) p.push_back(q);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(a->Allocate(block), nullptr);
  a->Free(p[2], block);
  EXPECT_EQ(a->stats().free_listed_bytes, 500224u);
  EXPECT_EQ(a->Allocate(2 * block), nullptr) << "a free chunk serves only its own size";
  EXPECT_EQ(a->Allocate(block - 10), p[2]) << "same rounded size";
  EXPECT_EQ(a->stats().free_listed_bytes, 0u);
  // What is left at the top still serves small chunks.
  const HostArena::Stats st = a->stats();
  EXPECT_EQ(st.in_use_bytes, 4 * 500224u);
  EXPECT_EQ(st.untouched_bytes, a->size() - 4 * 500224u);
  EXPECT_NE(a->Allocate(st.untouched_bytes), nullptr);
  EXPECT_EQ(a->Allocate(1), nullptr);
  for (uint8_t* q : p) a->Free(q, block);
  a->Free(a->base() + 4 * 500224, st.untouched_bytes);
  EXPECT_EQ(a->stats().in_use_bytes, 0u);
}

TEST(HostArena, HostBuffersComeFromTheArenaThenFallBackToTheHeap) {
  std::unique_ptr<HostArena> a = Arena(2 << 20);
  ASSERT_NE(a, nullptr);
  std::vector<std::unique_ptr<HostBuffer>> bufs;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<std::unique_ptr<HostBuffer>> b = HostBuffer::Allocate(500 * 1000, a.get());
    ASSERT_TRUE(b.ok());
    std::memset((*b)->data(), i, (*b)->size());
    bufs.push_back(*std::move(b));
  }
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(a->Contains(bufs[i]->data())) << i;
  EXPECT_FALSE(a->Contains(bufs[4]->data()));
  EXPECT_EQ(a->stats().heap_fallbacks, 1u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(bufs[i]->data()[499999], i);
  uint8_t* first = bufs[0]->data();
  bufs[0].reset();  // back to the arena
  absl::StatusOr<std::unique_ptr<HostBuffer>> again = HostBuffer::Allocate(500 * 1000, a.get());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->data(), first);
  again->reset();
  bufs.clear();
  EXPECT_EQ(a->stats().in_use_bytes, 0u);
  absl::StatusOr<std::unique_ptr<HostBuffer>> empty = HostBuffer::Allocate(0, a.get());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->size(), 0u);
}

TEST(HostArena, ConcurrentAllocationsNeverOverlap) {
  std::unique_ptr<HostArena> a = Arena(8 << 20);
  ASSERT_NE(a, nullptr);
  constexpr int kThreads = 4, kRounds = 2000;
  std::vector<std::thread> threads;
  std::vector<std::vector<std::pair<uint8_t*, size_t>>> kept(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<uint8_t*, size_t>>& mine = kept[t];
      for (int r = 0; r < kRounds; ++r) {
        const size_t n = 1000 + 512 * (r % 3);
        uint8_t* p = a->Allocate(n);
        if (p == nullptr) continue;
        std::memset(p, t + 1, n);
        mine.push_back({p, n});
        if (r % 2 == 1 && mine.size() >= 2) {  // free the one before, still holding this thread's bytes
          auto [q, qn] = mine[mine.size() - 2];
          EXPECT_EQ(std::count(q, q + qn, static_cast<uint8_t>(t + 1)), static_cast<ptrdiff_t>(qn));
          a->Free(q, qn);
          mine.erase(mine.end() - 2);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  std::vector<std::pair<uint8_t*, size_t>> all;
  for (int t = 0; t < kThreads; ++t) {
    for (auto [p, n] : kept[t]) EXPECT_EQ(std::count(p, p + n, static_cast<uint8_t>(t + 1)), static_cast<ptrdiff_t>(n));
    all.insert(all.end(), kept[t].begin(), kept[t].end());
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LE(all[i - 1].first + all[i - 1].second, all[i].first);
  for (auto [p, n] : all) a->Free(p, n);
  EXPECT_EQ(a->stats().in_use_bytes, 0u);
}

TEST(HostArena, RejectsZeroBytes) {
  EXPECT_EQ(HostArena::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tqkv::storage
