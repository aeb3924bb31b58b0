// The host side of the kept block tables: the table arena's chunks and a
// table's reconciliation with the next call's list (no GPU needed).
#include "gpu/seq_tables.h"

#include <gtest/gtest.h>

#include <vector>

namespace tqkv::gpu {
namespace {

std::vector<BlockRef> Refs(std::initializer_list<uint64_t> ids, bool complete = true) {
  std::vector<BlockRef> r;
  for (uint64_t id : ids) r.push_back({id, nullptr, complete});
  return r;
}

TEST(TableChunksTest, PowerOfTwoChunksAreReusedAndBounded) {
  TableChunks c(/*entries=*/2048, /*max_chunk=*/1024);
  size_t size = 0;
  std::optional<size_t> a = c.Allocate(10, &size);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(size, TableChunks::kMinChunk);
  std::optional<size_t> b = c.Allocate(300, &size);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, 256u);
  EXPECT_EQ(size, 512u);
  EXPECT_FALSE(c.Allocate(1025, &size).has_value()) << "longer than the largest chunk";
  std::optional<size_t> d = c.Allocate(1024, &size);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, 768u);
  EXPECT_FALSE(c.Allocate(512, &size).has_value()) << "only 256 entries were never carved";
  EXPECT_EQ(c.used(), 256u + 512u + 1024u);
  c.Free(*b, 512);
  std::optional<size_t> e = c.Allocate(400, &size);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e, *b) << "a freed chunk serves its size again";
  EXPECT_EQ(c.used(), 256u + 512u + 1024u);
}

TEST(SeqTableTest, KeepsTheCommonPrefixAndCatchesAReplacedEnd) {
  SeqTable t;
  std::vector<BlockRef> v = Refs({11, 12, 13, 14, 15});
  EXPECT_EQ(t.Keep(v, /*generation=*/7), 0u);
  for (size_t j = 0; j < v.size(); ++j) t.Push(v[j], static_cast<int32_t>(100 + j));
  EXPECT_EQ(t.size(), 5u);
  EXPECT_EQ(t.slots.size(), 8u) << "padded to whole 16-byte words";
  EXPECT_EQ(t.slots[5], 0);
  t.uploaded = 5;

  // The list grew: everything is kept.
  std::vector<BlockRef> grown = Refs({11, 12, 13, 14, 15, 16});
  EXPECT_EQ(t.Keep(grown, 7), 5u);
  t.Push(grown[5], 105);
  EXPECT_EQ(t.uploaded, 5u);

  // Its end taken back and refilled with another block: rebuilt.
  std::vector<BlockRef> refilled = Refs({11, 12, 13, 14, 15, 99});
  EXPECT_EQ(t.Keep(refilled, 7), 0u);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.uploaded, 0u);
  for (size_t j = 0; j < refilled.size(); ++j) t.Push(refilled[j], static_cast<int32_t>(200 + j));
  t.uploaded = 6;

  // A shorter list (an append undone): its prefix is kept, the rest dropped
  // and zeroed, so a re-upload never carries stale slots.
  std::vector<BlockRef> shorter = Refs({11, 12, 13});
  EXPECT_EQ(t.Keep(shorter, 7), 3u);
  EXPECT_EQ(t.uploaded, 3u);
  EXPECT_EQ(t.slots.size(), 4u);
  EXPECT_EQ(t.slots[3], 0);

  // Another arena generation (a block lost its slot): nothing is kept.
  EXPECT_EQ(t.Keep(shorter, 8), 0u);
  EXPECT_EQ(t.generation, 8u);
}

TEST(SeqTableTest, RemembersTheFirstBlockBeingFilled) {
  SeqTable t;
  std::vector<BlockRef> v = Refs({1, 2, 3});
  t.Keep(v, 1);
  for (size_t j = 0; j < v.size(); ++j) t.Push(v[j], 0);
  EXPECT_EQ(t.first_filling, SIZE_MAX);
  t.Push({4, nullptr, /*complete=*/false}, 0);
  t.Push({5, nullptr, /*complete=*/false}, 0);
  EXPECT_EQ(t.first_filling, 3u);
  std::vector<BlockRef> w = Refs({1, 2, 3, 4});
  t.Keep(w, 1);
  EXPECT_EQ(t.first_filling, 3u);
  std::vector<BlockRef> x = Refs({1, 2});
  t.Keep(x, 1);
  EXPECT_EQ(t.first_filling, SIZE_MAX) << "no kept block is being filled";
  t.Clear();
  EXPECT_EQ(t.first_filling, SIZE_MAX);
}

}  // namespace
}  // namespace tqkv::gpu
