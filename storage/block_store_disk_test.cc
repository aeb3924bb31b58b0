// BlockStore with its RocksDB tier: spills at the watermark, hits served from
// disk, promotion, restart, durability, corruption, the disk budget.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "storage/block_store.h"
#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

constexpr int kHost = static_cast<int>(Tier::kHost);
constexpr int kDisk = static_cast<int>(Tier::kDisk);

BlockKey Key(int i, std::string tenant = "acme", uint64_t model = 7) {
  return {std::move(tenant), model, "h" + std::to_string(i)};
}

std::vector<std::string> Chain(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(Key(i).block_hash);
  return out;
}

class BlockStoreDiskTest : public ::testing::Test {
 protected:
  std::unique_ptr<BlockStore> OpenStore(uint64_t host = 1000, uint64_t disk = 1 << 20, uint64_t write_behind = 0) {
    BlockStoreOptions o;
    o.host_capacity_bytes = host;
    o.disk_path = dir_.path();
    o.disk_capacity_bytes = disk;
    o.write_behind_above_bytes = write_behind;
    o.clock = &clock_;
    auto store = BlockStore::Open(o);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  absl::StatusOr<CommitOutcome> PutBlock(BlockStore& s, const BlockKey& k, size_t size = 100,
                                         PutOptions opts = {}) {
    clock_.Advance(absl::Seconds(1));  // distinct access times: deterministic LRU
    return s.Put(k, "parent-" + k.block_hash, TestAccounting(size), TestPayload(k, size), opts);
  }

  void ExpectBlock(BlockStore& s, const BlockKey& k, Tier tier, size_t size = 100) {
    auto got = s.Get(k);
    ASSERT_TRUE(got.ok()) << DebugString(k) << ": " << got.status();
    EXPECT_EQ(got->payload->view(), TestPayload(k, size)) << DebugString(k);
    EXPECT_EQ(got->tier, tier) << DebugString(k);
    EXPECT_EQ(got->parent_hash, "parent-" + k.block_hash);
    EXPECT_EQ(got->accounting, TestAccounting(size));
  }

  TempDir dir_;
  FakeClock clock_;
};

// With a host arena, blocks promoted from disk land in it like puts (a
// pinned arena's blocks move to a GPU by DMA), and their chunks go back to
// it when the store lets go of them.
TEST_F(BlockStoreDiskTest, PromotedBlocksLandInTheHostArena) {
  absl::StatusOr<std::unique_ptr<HostArena>> arena = HostArena::Create(1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  {
    BlockStoreOptions o;
    o.host_capacity_bytes = 1000;
    o.disk_path = dir_.path();
    o.clock = &clock_;
    o.host_arena = arena->get();
    absl::StatusOr<std::unique_ptr<BlockStore>> s = BlockStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(PutBlock(**s, Key(i)).ok());
    ASSERT_EQ((*s)->Stats().counters.spills, 2u);
    absl::StatusOr<BlockData> got = (*s)->Get(Key(0));  // from disk, promoted
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tier, Tier::kDisk);
    EXPECT_EQ(got->payload->view(), TestPayload(Key(0), 100));
    EXPECT_TRUE((*arena)->Contains(got->payload->data()));
    EXPECT_EQ((*s)->Stats().counters.promotions, 1u);
    EXPECT_EQ((*s)->Stats().host_arena->heap_fallbacks, 0u);
  }
  EXPECT_EQ((*arena)->stats().in_use_bytes, 0u);
}

TEST_F(BlockStoreDiskTest, EvictionSpillsAndHitsAreServedFromDisk) {
  auto s = OpenStore();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
  StoreStats st = s->Stats();
  EXPECT_EQ(st.counters.evictions, 2u);
  EXPECT_EQ(st.counters.spills, 2u);
  EXPECT_EQ(st.counters.spilled_bytes, 200u);
  EXPECT_EQ(st.counters.drops, 0u);
  EXPECT_EQ(st.host_used_bytes, 800u);
  EXPECT_EQ(st.disk_used_bytes, 200u);
  EXPECT_TRUE(s->SpillStoreForTest()->HasPayloadForTest(Key(0)));
  EXPECT_FALSE(s->SpillStoreForTest()->HasPayloadForTest(Key(2)));

  auto r = s->Lookup("acme", 7, Chain(10));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->hits, 10u);
  EXPECT_EQ(r->tiers[0], Tier::kDisk);
  EXPECT_EQ(r->tiers[1], Tier::kDisk);
  for (int i = 2; i < 10; ++i) EXPECT_EQ(r->tiers[i], Tier::kHost) << i;
  st = s->Stats();
  EXPECT_EQ(st.counters.lookup_hit_blocks[kDisk], 2u);
  EXPECT_EQ(st.counters.lookup_hit_blocks[kHost], 8u);

  // Get from disk: exact bytes, then promoted (800 + 100 <= 900).
  ExpectBlock(*s, Key(0), Tier::kDisk);
  st = s->Stats();
  EXPECT_EQ(st.counters.get_hits[kDisk], 1u);
  EXPECT_EQ(st.counters.promotions, 1u);
  EXPECT_EQ(st.host_used_bytes, 900u);
  ExpectBlock(*s, Key(0), Tier::kHost);
  // Promoted block keeps its disk copy: counted in both tiers.
  ASSERT_EQ(st.usage.size(), 2u);
  EXPECT_EQ(st.usage[0].tier, Tier::kHost);
  EXPECT_EQ(st.usage[0].blocks, 9u);
  EXPECT_EQ(st.usage[1].tier, Tier::kDisk);
  EXPECT_EQ(st.usage[1].blocks, 2u);
  EXPECT_EQ(st.usage[1].accounting.dense_equivalent_bytes, 800u);
  // Host is at the high watermark now: block 1 is served but not promoted.
  ExpectBlock(*s, Key(1), Tier::kDisk);
  EXPECT_EQ(s->Stats().counters.promotions, 1u);
  EXPECT_EQ(s->Stats().counters.get_hits[kHost], 1u);
}

TEST_F(BlockStoreDiskTest, ReEvictingAPromotedBlockNeedsNoWrite) {
  auto s = OpenStore();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(s->Get(Key(0)).ok());  // promoted, youngest
  auto ev = s->Evict({.scope = ModelScope{"acme", 7}});
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->blocks, 9u);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.counters.spills, 2u + 8u);  // block 0 was not written again
  EXPECT_EQ(st.host_used_bytes, 0u);
  EXPECT_EQ(st.disk_used_bytes, 1000u);
  for (int i = 0; i < 10; ++i) ExpectBlock(*s, Key(i), Tier::kDisk);
}

TEST_F(BlockStoreDiskTest, RestartFindsEverySpilledBlock) {
  {
    auto s = OpenStore(1000);
    for (int i = 0; i < 25; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    ASSERT_TRUE(PutBlock(*s, Key(0, "other", 9), 333).ok());
    ASSERT_TRUE(s->Evict({}).ok());  // spill everything still in host
    EXPECT_EQ(s->Stats().host_used_bytes, 0u);
  }
  auto s = OpenStore(1000);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.blocks, 26u);
  EXPECT_EQ(st.disk_used_bytes, 2500u + 333u);
  EXPECT_EQ(st.host_used_bytes, 0u);
  auto r = s->Lookup("acme", 7, Chain(25));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hits, 25u);
  for (Tier t : r->tiers) EXPECT_EQ(t, Tier::kDisk);
  for (int i = 0; i < 25; ++i) {
    auto got = s->Get(Key(i));
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    EXPECT_EQ(got->payload->view(), TestPayload(Key(i), 100)) << i;
    EXPECT_EQ(got->parent_hash, "parent-" + Key(i).block_hash);
    EXPECT_EQ(got->accounting, TestAccounting(100));
  }
  auto got = s->Get(Key(0, "other", 9));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->payload->view(), TestPayload(Key(0, "other", 9), 333));
}

// Payloads live in segment files: Stats counts the files' bytes beside the
// payload bytes, and their garbage (none until blocks are removed;
// CollectDiskGarbage waits for more).
TEST_F(BlockStoreDiskTest, StatsCountThePayloadFiles) {
  constexpr size_t kSize = 8192;
  {
    auto s = OpenStore(1 << 20);
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(PutBlock(*s, Key(i), kSize).ok());
    ASSERT_TRUE(s->Evict({}).ok());
  }  // the close writes the memtable out
  auto s = OpenStore(1 << 20);
  const StoreStats st = s->Stats();
  EXPECT_EQ(st.disk_used_bytes, 8 * kSize);
  EXPECT_GE(st.disk_file_bytes, 8 * kSize);
  EXPECT_LT(st.disk_file_bytes, 8 * kSize + 4096);
  EXPECT_EQ(st.disk_garbage_bytes, 0u);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Delete(Key(i)).ok());
  const StoreStats removed = s->Stats();
  EXPECT_EQ(removed.disk_file_bytes, st.disk_file_bytes);
  EXPECT_GE(removed.disk_garbage_bytes, 4 * kSize);
  EXPECT_LT(removed.disk_garbage_bytes, 4 * kSize + 512);
  auto collected = s->CollectDiskGarbage();
  ASSERT_TRUE(collected.ok()) << collected.status();
  EXPECT_EQ(*collected, 0u);  // below 256 MiB
  ExpectBlock(*s, Key(5), Tier::kDisk, kSize);
}

// Removed blocks' space comes back: their file is rewritten with only the
// live payloads, which read back exactly, before and after a restart.
TEST_F(BlockStoreDiskTest, CollectingDiskGarbageKeepsTheLiveBlocks) {
  constexpr size_t kSize = 8192;
  BlockStoreOptions o;
  o.host_capacity_bytes = 1 << 20;
  o.disk_path = dir_.path();
  o.disk_gc_min_garbage_bytes = 1;
  o.clock = &clock_;
  {
    auto s = BlockStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(PutBlock(**s, Key(i), kSize).ok());
    ASSERT_TRUE((*s)->Evict({}).ok());
  }  // the file is closed: the next store appends to a new one
  {
    auto s = BlockStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->AwaitIndexLoaded().ok());  // each file's live bytes known
    for (int i = 0; i < 6; ++i) ASSERT_TRUE((*s)->Delete(Key(i)).ok());
    const StoreStats before = (*s)->Stats();
    EXPECT_GE(before.disk_garbage_bytes, 6 * kSize);
    auto collected = (*s)->CollectDiskGarbage();
    ASSERT_TRUE(collected.ok()) << collected.status();
    EXPECT_GT(*collected, 0u);
    const StoreStats after = (*s)->Stats();
    EXPECT_EQ(after.disk_garbage_bytes, 0u);
    EXPECT_LT(after.disk_file_bytes, 2 * kSize + 512);
    EXPECT_EQ(after.disk_used_bytes, 2 * kSize);
    for (int i = 6; i < 8; ++i) ExpectBlock(**s, Key(i), Tier::kDisk, kSize);
  }
  auto s = BlockStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->AwaitIndexLoaded().ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ((*s)->Get(Key(i)).status().code(), absl::StatusCode::kNotFound) << i;
  for (int i = 6; i < 8; ++i) ExpectBlock(**s, Key(i), Tier::kDisk, kSize);
}

TEST_F(BlockStoreDiskTest, DurablePutsSurviveRestartAndPlainPutsDoNot) {
  {
    auto s = OpenStore(1 << 20);
    ASSERT_EQ(*PutBlock(*s, Key(1), 100, {.durable = true}), CommitOutcome::kCommitted);
    ASSERT_TRUE(PutBlock(*s, Key(2)).ok());
    // Re-committing an identical host-only block durably writes it through.
    ASSERT_EQ(*PutBlock(*s, Key(2), 100, {.durable = true}), CommitOutcome::kAlreadyPresent);
    ASSERT_TRUE(PutBlock(*s, Key(3)).ok());
    StoreStats st = s->Stats();
    EXPECT_EQ(st.disk_used_bytes, 200u);
    EXPECT_EQ(st.host_used_bytes, 300u);
    ExpectBlock(*s, Key(1), Tier::kHost);  // write-through keeps the host copy
  }
  auto s = OpenStore(1 << 20);
  ExpectBlock(*s, Key(1), Tier::kDisk);
  ExpectBlock(*s, Key(2), Tier::kDisk);
  EXPECT_EQ(s->Get(Key(3)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BlockStoreDiskTest, CorruptPayloadGivesDataLossAndDropsTheBlock) {
  auto s = OpenStore();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
  ASSERT_EQ(s->Lookup("acme", 7, Chain(2))->tiers, (std::vector<Tier>{Tier::kDisk, Tier::kDisk}));
  // Same length, one byte flipped; and a truncated payload.
  std::string bad = TestPayload(Key(0), 100);
  bad[50] ^= 1;
  ASSERT_TRUE(s->SpillStoreForTest()->OverwritePayloadForTest(Key(0), bad).ok());
  ASSERT_TRUE(s->SpillStoreForTest()->OverwritePayloadForTest(Key(1), "short").ok());

  for (int i : {0, 1}) {
    auto got = s->Get(Key(i));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << i;
    EXPECT_EQ(s->Get(Key(i)).status().code(), absl::StatusCode::kNotFound) << i;
    EXPECT_FALSE(s->SpillStoreForTest()->HasPayloadForTest(Key(i))) << i;
  }
  StoreStats st = s->Stats();
  EXPECT_EQ(st.counters.checksum_failures, 2u);
  EXPECT_EQ(st.counters.promotions, 0u);
  EXPECT_EQ(st.disk_used_bytes, 0u);
  EXPECT_EQ(st.blocks, 8u);
  EXPECT_EQ(s->Lookup("acme", 7, Chain(10))->hits, 0u);
  // The dropped key can be stored again.
  ASSERT_EQ(*PutBlock(*s, Key(0)), CommitOutcome::kCommitted);
  ExpectBlock(*s, Key(0), Tier::kHost);
}

TEST_F(BlockStoreDiskTest, CorruptionFoundAfterRestartToo) {
  {
    auto s = OpenStore();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    ASSERT_TRUE(s->Evict({}).ok());
    ASSERT_TRUE(s->SpillStoreForTest()->OverwritePayloadForTest(Key(1), std::string(100, 'x')).ok());
    ASSERT_TRUE(s->SpillStoreForTest()->OverwriteMetaForTest(Key(2), "not a meta").ok());
  }
  auto s = OpenStore();
  StoreStats st = s->Stats();
  EXPECT_EQ(st.blocks, 2u);  // block 2's meta is unreadable: not indexed
  EXPECT_EQ(st.counters.checksum_failures, 1u);
  EXPECT_FALSE(s->SpillStoreForTest()->HasPayloadForTest(Key(2)));
  ExpectBlock(*s, Key(0), Tier::kDisk);
  EXPECT_EQ(s->Get(Key(1)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s->Stats().counters.checksum_failures, 2u);
}

// Checksums are bound to keys: two blocks whose stored records (payload and
// meta, each internally consistent) trade places are DATA_LOSS under both
// keys, never served as each other. A record of the previous format (the
// checksum of the payload alone) is still read.
TEST_F(BlockStoreDiskTest, SwappedRecordsAreDataLossAndOldRecordsStillRead) {
  {
    auto s = OpenStore();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    ASSERT_TRUE(s->Evict({}).ok());
    SpillStore* disk = s->SpillStoreForTest();
    auto meta = [&](int i, uint8_t version) {
      DiskBlockMeta m;
      m.size_bytes = 100;
      m.accounting = TestAccounting(100);
      m.parent_hash = "parent-" + Key(i).block_hash;
      m.checksum = version == 1 ? PayloadChecksum(TestPayload(Key(i), 100))
                                : BlockChecksum(Key(i), TestPayload(Key(i), 100));
      std::string bytes = EncodeDiskBlockMeta(m);
      if (version == 1) {  // the format 1 encoding: the version byte, and the record's own checksum over it
        bytes[0] = 1;
        bytes.resize(bytes.size() - 8);
        const uint64_t c = PayloadChecksum(bytes);
        for (int b = 0; b < 8; ++b) bytes.push_back(static_cast<char>(c >> (8 * b)));
      }
      return bytes;
    };
    // Records of formats 1 and 2 keep their payloads in block_data: the
    // meta first, so the payload goes there.
    ASSERT_TRUE(disk->OverwriteMetaForTest(Key(0), meta(1, 2)).ok());
    ASSERT_TRUE(disk->OverwritePayloadForTest(Key(0), TestPayload(Key(1), 100)).ok());
    ASSERT_TRUE(disk->OverwriteMetaForTest(Key(1), meta(0, 2)).ok());
    ASSERT_TRUE(disk->OverwritePayloadForTest(Key(1), TestPayload(Key(0), 100)).ok());
    ASSERT_TRUE(disk->OverwriteMetaForTest(Key(2), meta(2, 1)).ok());
    ASSERT_TRUE(disk->OverwritePayloadForTest(Key(2), TestPayload(Key(2), 100)).ok());
  }
  auto s = OpenStore();
  EXPECT_EQ(s->Stats().blocks, 3u);
  EXPECT_EQ(s->Get(Key(0)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s->Get(Key(1)).status().code(), absl::StatusCode::kDataLoss);
  ExpectBlock(*s, Key(2), Tier::kDisk);
  EXPECT_EQ(s->Stats().counters.checksum_failures, 2u);
}

TEST_F(BlockStoreDiskTest, DiskBudgetDropsOldestDiskBlocks) {
  auto s = OpenStore(/*host=*/1000, /*disk=*/300);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    ASSERT_LE(s->Stats().disk_used_bytes, 300u) << i;
    ASSERT_LE(s->Stats().host_used_bytes, 900u) << i;
  }
  StoreStats st = s->Stats();
  // 20 blocks: 8 in host, 3 on disk, the rest dropped oldest first.
  EXPECT_EQ(st.host_used_bytes, 800u);
  EXPECT_EQ(st.disk_used_bytes, 300u);
  EXPECT_EQ(st.counters.evictions, 12u);
  EXPECT_EQ(st.counters.drops, 9u);
  EXPECT_EQ(st.blocks, 11u);
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(s->Get(Key(i)).status().code(), absl::StatusCode::kNotFound) << i;
    EXPECT_FALSE(s->SpillStoreForTest()->HasPayloadForTest(Key(i))) << i;
  }
  for (int i = 9; i < 12; ++i) ExpectBlock(*s, Key(i), Tier::kDisk);
}

TEST_F(BlockStoreDiskTest, PinnedDiskBlocksAreNotDroppedForSpace) {
  auto s = OpenStore(/*host=*/1000, /*disk=*/200);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());  // 0,1 on disk
  ASSERT_TRUE(s->Pin(Key(0), absl::Seconds(60)).ok());
  ASSERT_TRUE(s->Pin(Key(1), absl::Seconds(60)).ok());
  ASSERT_TRUE(PutBlock(*s, Key(10)).ok());
  ASSERT_TRUE(PutBlock(*s, Key(11)).ok());  // evicts 2,3: no disk room, so dropped
  StoreStats st = s->Stats();
  EXPECT_EQ(st.disk_used_bytes, 200u);
  EXPECT_EQ(st.counters.drops, 2u);
  ExpectBlock(*s, Key(0), Tier::kDisk);
  EXPECT_EQ(s->Get(Key(2)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BlockStoreDiskTest, DeleteAndDropEvictionRemoveDiskCopies) {
  auto s = OpenStore();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
  ASSERT_TRUE(PutBlock(*s, Key(0, "acme", 8)).ok());
  ASSERT_TRUE(s->Delete(Key(0)).ok());
  EXPECT_FALSE(s->SpillStoreForTest()->HasPayloadForTest(Key(0)));
  EXPECT_EQ(s->Get(Key(0)).status().code(), absl::StatusCode::kNotFound);
  auto ev = s->Evict({.scope = ModelScope{"acme", 7}, .drop = true});
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->blocks, 9u);
  EXPECT_FALSE(s->SpillStoreForTest()->HasPayloadForTest(Key(1)));
  StoreStats st = s->Stats();
  EXPECT_EQ(st.disk_used_bytes, 0u);
  EXPECT_EQ(st.blocks, 1u);
  s.reset();
  s = OpenStore();
  EXPECT_EQ(s->Stats().blocks, 0u);  // nothing deleted comes back
}

TEST_F(BlockStoreDiskTest, ModelRecordsSurviveRestart) {
  {
    auto s = OpenStore();
    ASSERT_TRUE(s->PutModelRecord("acme", 7, "layout v1").ok());
    ASSERT_TRUE(s->PutModelRecord("beta", 1, "layout v2").ok());
  }
  auto s = OpenStore();
  EXPECT_EQ(*s->GetModelRecord("acme", 7), "layout v1");
  auto list = s->ListModelRecords();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[1].tenant, "beta");
  EXPECT_EQ((*list)[1].record, "layout v2");
}

TEST_F(BlockStoreDiskTest, PinnedOldestBlockStaysInHostWhileYoungerOnesSpill) {
  auto s = OpenStore();
  for (int i = 0; i < 9; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
  ASSERT_TRUE(s->Pin(Key(0), absl::Seconds(60)).ok());
  ASSERT_TRUE(PutBlock(*s, Key(9)).ok());
  ExpectBlock(*s, Key(0), Tier::kHost);
  EXPECT_EQ(s->Lookup("acme", 7, Chain(3))->tiers,
            (std::vector<Tier>{Tier::kHost, Tier::kDisk, Tier::kDisk}));
}

// Shutdown eviction (include_pinned) writes pinned blocks to disk too, so a
// restart finds them; plain Evict leaves them in host memory only.
TEST_F(BlockStoreDiskTest, ShutdownEvictionKeepsPinnedBlocks) {
  {
    auto s = OpenStore(1000);
    ASSERT_TRUE(PutBlock(*s, Key(0)).ok());
    ASSERT_TRUE(PutBlock(*s, Key(1)).ok());
    ASSERT_TRUE(s->Pin(Key(0), absl::Minutes(5)).ok());
    auto plain = s->Evict({});
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(plain->blocks, 1u);
    EXPECT_EQ(plain->skipped_pinned, 1u);
    EvictSpec shutdown;
    shutdown.include_pinned = true;
    auto all = s->Evict(shutdown);
    ASSERT_TRUE(all.ok());
    EXPECT_EQ(all->skipped_pinned, 0u);
  }
  auto s = OpenStore(1000);
  ExpectBlock(*s, Key(0), Tier::kDisk);
  ExpectBlock(*s, Key(1), Tier::kDisk);
}

// A spill runs in batches of about batch_bytes, oldest first, until done;
// past its deadline it starts no batch and counts what is left in host
// memory only.
TEST_F(BlockStoreDiskTest, SpillsRunInBatchesUntilTheDeadline) {
  auto s = OpenStore(2000);
  for (int i = 0; i < 9; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
  auto late = s->Evict({.batch_bytes = 250, .deadline = clock_.Now() - absl::Seconds(1)});
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->blocks, 0u);
  EXPECT_EQ(late->left_blocks, 9u);
  EXPECT_EQ(late->left_bytes, 900u);
  auto all = s->Evict({.max_bytes = 850, .batch_bytes = 250, .deadline = clock_.Now() + absl::Seconds(1)});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->blocks, 8u);  // whole blocks within 850 bytes, in batches of 3, 3, 2
  EXPECT_EQ(all->bytes, 800u);
  EXPECT_EQ(all->left_blocks, 0u);
  EXPECT_EQ(s->Stats().counters.spills, 8u);
  ExpectBlock(*s, Key(0), Tier::kDisk);
  ExpectBlock(*s, Key(8), Tier::kHost);
  // Blocks larger than a batch still move: key 8, and key 0, which the read
  // above brought back into host memory.
  EXPECT_EQ(s->Evict({.batch_bytes = 1})->blocks, 2u);
}

// A clock that moves `tick` forward on every reading: each spill batch of
// Evict takes whole seconds of it.
class TickingClock final : public Clock {
 public:
  explicit TickingClock(absl::Duration tick) : tick_(tick) {}
  absl::Time Now() override {
    clock_.Advance(tick_);
    return clock_.Now();
  }

 private:
  const absl::Duration tick_;
  FakeClock clock_;
};

// With flush_by_deadline a spill against a deadline also keeps the time the
// memtables take to flush at its batches' rate (a close writes them): it
// stops earlier than the same spill without, after at least one batch.
TEST(BlockStoreDiskFlushTest, DeadlineSpillKeepsTimeForTheMemtableFlush) {
  auto moved = [](bool flush_by_deadline) -> uint64_t {
    TempDir dir;
    TickingClock clock(absl::Seconds(1));
    BlockStoreOptions o;
    o.host_capacity_bytes = 2000;
    o.disk_path = dir.path();
    o.disk_capacity_bytes = 1 << 20;
    o.clock = &clock;
    auto s = BlockStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return 0;
    for (int i = 0; i < 9; ++i)
      EXPECT_TRUE((*s)->Put(Key(i), "p", TestAccounting(100), TestPayload(Key(i), 100), {}).ok());
    auto r = (*s)->Evict(
        {.batch_bytes = 100, .deadline = clock.Now() + absl::Seconds(40), .flush_by_deadline = flush_by_deadline});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return 0;
    EXPECT_EQ(r->blocks + r->left_blocks, 9u);
    return r->blocks;
  };
  const uint64_t plain = moved(false);
  const uint64_t keeping_flush = moved(true);
  EXPECT_GE(keeping_flush, 1u);
  EXPECT_LT(keeping_flush, plain);
}

// The shutdown spill moves every host block, pinned ones too, within its
// budget; with none left it moves nothing and counts what stays behind.
TEST_F(BlockStoreDiskTest, ShutdownSpillMovesEveryHostBlockWithinItsBudget) {
  {
    auto s = OpenStore(2000);
    for (int i = 0; i < 9; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    ASSERT_TRUE(s->Pin(Key(3), absl::Minutes(5)).ok());
    auto none = s->SpillForShutdown(absl::ZeroDuration());
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(none->blocks, 0u);
    EXPECT_EQ(none->left_blocks, 9u);
    auto all = s->SpillForShutdown(absl::Seconds(30));
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(all->blocks, 9u);
    EXPECT_EQ(all->left_blocks, 0u);
    EXPECT_EQ(s->Stats().host_used_bytes, 0u);
  }
  auto s = OpenStore(2000);
  for (int i = 0; i < 9; ++i) ExpectBlock(*s, Key(i), Tier::kDisk);
}

// Write-behind copies the oldest host-only blocks to disk while they hold
// more than its threshold, keeping the host copies, and only into the disk
// budget's free room; eviction then writes nothing more for them.
TEST_F(BlockStoreDiskTest, WriteBehindCopiesTheOldestHostBlocksToDisk) {
  {
    auto s = OpenStore(/*host=*/2000, /*disk=*/500, /*write_behind=*/300);
    for (int i = 0; i < 9; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    // 900 host-only bytes, 300 allowed: the oldest 600 are copied, but the
    // disk budget has room for 500 only.
    StoreStats st = s->Stats();
    for (int i = 0; i < 500 && st.counters.written_behind < 5; ++i, st = s->Stats())
      absl::SleepFor(absl::Milliseconds(10));
    absl::SleepFor(absl::Milliseconds(200));  // and no more than that
    st = s->Stats();
    EXPECT_EQ(st.counters.written_behind, 5u);
    EXPECT_EQ(st.counters.written_behind_bytes, 500u);
    EXPECT_EQ(st.disk_used_bytes, 500u);
    EXPECT_EQ(st.host_used_bytes, 900u);  // host copies kept
    EXPECT_EQ(st.counters.drops, 0u);
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(s->SpillStoreForTest()->HasPayloadForTest(Key(i)));
    EXPECT_FALSE(s->SpillStoreForTest()->HasPayloadForTest(Key(5)));
    ExpectBlock(*s, Key(0), Tier::kHost);
    // Evicting the written blocks writes nothing.
    auto ev = s->Evict({.max_bytes = 400});
    ASSERT_TRUE(ev.ok()) << ev.status();
    EXPECT_EQ(ev->blocks, 4u);
    EXPECT_EQ(s->Stats().counters.spills, 0u);
  }
  auto s = OpenStore(2000, 500);
  for (int i = 0; i < 5; ++i) ExpectBlock(*s, Key(i), Tier::kDisk);
}

// Sync fsyncs the WAL behind spills; it succeeds with and without a disk tier
// and the spilled blocks stay readable after it and after a reopen.
TEST_F(BlockStoreDiskTest, SyncAfterSpills) {
  {
    auto s = OpenStore(1000);
    for (int i = 0; i < 12; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    ASSERT_TRUE(s->Evict({}).ok());
    EXPECT_TRUE(s->Sync().ok());
  }
  auto s = OpenStore(1000);
  for (int i = 0; i < 12; ++i) ExpectBlock(*s, Key(i), Tier::kDisk);
  BlockStoreOptions memory_only;
  auto m = BlockStore::Open(memory_only);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE((*m)->Sync().ok());
}

}  // namespace
}  // namespace tqkv::storage
