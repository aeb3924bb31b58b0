// BlockStore behaviour in host memory: visibility, two-phase puts, lookups,
// pins and leases, eviction at the watermarks, accounting.
#include "storage/block_store.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

constexpr int kHost = static_cast<int>(Tier::kHost);
constexpr int kDisk = static_cast<int>(Tier::kDisk);

BlockKey Key(int i, std::string tenant = "acme", uint64_t model = 7) {
  return {std::move(tenant), model, "h" + std::to_string(i)};
}

class BlockStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<BlockStore> OpenStore(uint64_t capacity = 1000) {
    BlockStoreOptions o;
    o.host_capacity_bytes = capacity;
    o.clock = &clock_;
    auto store = BlockStore::Open(o);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // Puts TestPayload(key, size) with parent "p".
  absl::StatusOr<CommitOutcome> PutBlock(BlockStore& s, const BlockKey& k, size_t size = 100,
                                         uint32_t salt = 0) {
    return s.Put(k, "p", TestAccounting(size), TestPayload(k, size, salt));
  }

  void ExpectBytes(BlockStore& s, const BlockKey& k, size_t size, Tier tier, uint32_t salt = 0) {
    auto got = s.Get(k);
    ASSERT_TRUE(got.ok()) << DebugString(k) << ": " << got.status();
    EXPECT_EQ(got->payload->view(), TestPayload(k, size, salt)) << DebugString(k);
    EXPECT_EQ(got->tier, tier) << DebugString(k);
  }

  FakeClock clock_;
};

TEST_F(BlockStoreTest, PutThenGetReturnsExactBytesAndMetadata) {
  auto s = OpenStore(1 << 20);
  for (size_t size : {0, 1, 100, 4097, 65536}) {
    BlockKey k = Key(static_cast<int>(size));
    ASSERT_EQ(*PutBlock(*s, k, size), CommitOutcome::kCommitted);
  }
  for (size_t size : {0, 1, 100, 4097, 65536}) {
    BlockKey k = Key(static_cast<int>(size));
    auto got = s->Get(k);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->payload->view(), TestPayload(k, size));
    EXPECT_EQ(got->tier, Tier::kHost);
    EXPECT_EQ(got->parent_hash, "p");
    EXPECT_EQ(got->accounting, TestAccounting(size));
    EXPECT_EQ(got->checksum, BlockChecksum(k, TestPayload(k, size)));
  }
  StoreCounters c = s->Stats().counters;
  EXPECT_EQ(c.puts_committed, 5u);
  EXPECT_EQ(c.get_hits[kHost], 5u);
  EXPECT_EQ(c.get_misses, 0u);
  EXPECT_EQ(s->Get(Key(1, "other")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Stats().counters.get_misses, 1u);
}

TEST_F(BlockStoreTest, PutBuffersComeFromTheArenaAndGoBackToIt) {
  absl::StatusOr<std::unique_ptr<HostArena>> arena = HostArena::Create(1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  {
    BlockStoreOptions o;
    o.host_capacity_bytes = 1 << 20;
    o.clock = &clock_;
    o.host_arena = arena->get();
    absl::StatusOr<std::unique_ptr<BlockStore>> s = BlockStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < 3; ++i) ASSERT_EQ(*PutBlock(**s, Key(i), 100000), CommitOutcome::kCommitted);
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<BlockData> got = (*s)->Get(Key(i));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE((*arena)->Contains(got->payload->data())) << i;
      EXPECT_EQ(got->payload->view(), TestPayload(Key(i), 100000));
    }
    StoreStats st = (*s)->Stats();
    ASSERT_TRUE(st.host_arena.has_value());
    EXPECT_EQ(st.host_arena->in_use_bytes, 3 * 100096u);  // rounded to 256 bytes
    ASSERT_TRUE((*s)->Delete(Key(1)).ok());
    st = (*s)->Stats();
    EXPECT_EQ(st.host_arena->in_use_bytes, 2 * 100096u);
    EXPECT_EQ(st.host_arena->free_listed_bytes, 100096u);
    // The freed chunk serves the next put of that size.
    ASSERT_EQ(*PutBlock(**s, Key(3), 100000), CommitOutcome::kCommitted);
    EXPECT_EQ((*s)->Stats().host_arena->free_listed_bytes, 0u);
    EXPECT_EQ((*s)->Stats().host_arena->heap_fallbacks, 0u);
    ExpectBytes(**s, Key(3), 100000, Tier::kHost);
  }
  EXPECT_EQ((*arena)->stats().in_use_bytes, 0u) << "a closed store returns every chunk";
}

TEST_F(BlockStoreTest, BlockIsInvisibleUntilCommit) {
  auto s = OpenStore();
  BlockKey k = Key(1);
  auto h = s->BeginPut(k, "", TestAccounting(100), 100);
  ASSERT_TRUE(h.ok()) << h.status();
  std::string bytes = TestPayload(k, 100);
  std::copy(bytes.begin(), bytes.end(), h->buffer().begin());
  std::vector<std::string> chain = {k.block_hash};
  EXPECT_EQ(s->Lookup(k.tenant, k.model_id, chain)->hits, 0u);
  EXPECT_EQ(s->Get(k).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Pin(k, absl::Seconds(1)).code(), absl::StatusCode::kNotFound);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.host_reserved_bytes, 100u);
  EXPECT_EQ(st.host_used_bytes, 100u);
  EXPECT_TRUE(st.usage.empty());
  ASSERT_EQ(*s->Commit(*std::move(h)), CommitOutcome::kCommitted);
  EXPECT_EQ(s->Lookup(k.tenant, k.model_id, chain)->hits, 1u);
  ExpectBytes(*s, k, 100, Tier::kHost);
  st = s->Stats();
  EXPECT_EQ(st.host_reserved_bytes, 0u);
  EXPECT_EQ(st.host_used_bytes, 100u);
}

TEST_F(BlockStoreTest, AbortedOrDroppedHandlesLeaveNothingBehind) {
  auto s = OpenStore();
  {
    auto h = s->BeginPut(Key(1), "", TestAccounting(300), 300);
    ASSERT_TRUE(h.ok());
    s->Abort(*std::move(h));
  }
  {
    auto h = s->BeginPut(Key(2), "", TestAccounting(300), 300);
    ASSERT_TRUE(h.ok());
    PutHandle moved = *std::move(h);
    EXPECT_FALSE(h->valid());
    EXPECT_TRUE(moved.valid());
  }  // destroyed uncommitted
  StoreStats st = s->Stats();
  EXPECT_EQ(st.host_used_bytes, 0u);
  EXPECT_EQ(st.host_reserved_bytes, 0u);
  EXPECT_EQ(st.blocks, 0u);
  EXPECT_EQ(st.counters.puts_aborted, 2u);
  EXPECT_EQ(s->Get(Key(1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Get(Key(2)).status().code(), absl::StatusCode::kNotFound);
  // A moved-from (invalid) handle cannot be committed.
  EXPECT_EQ(s->Commit(PutHandle()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BlockStoreTest, RecommitIsIdempotentButDifferentBytesAreRefused) {
  auto s = OpenStore();
  BlockKey k = Key(1);
  ASSERT_EQ(*PutBlock(*s, k), CommitOutcome::kCommitted);
  EXPECT_EQ(*PutBlock(*s, k), CommitOutcome::kAlreadyPresent);
  EXPECT_EQ(PutBlock(*s, k, 100, /*salt=*/1).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(PutBlock(*s, k, 50).status().code(), absl::StatusCode::kAlreadyExists);
  ExpectBytes(*s, k, 100, Tier::kHost);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.counters.puts_committed, 1u);
  EXPECT_EQ(st.counters.puts_already_present, 1u);
  EXPECT_EQ(st.host_used_bytes, 100u);  // the refused copies released their bytes
}

// CommitAll makes a set of blocks visible together or not at all: a
// conflict at its end or a key given twice leaves nothing and releases
// every reservation; identical blocks count as already present.
TEST_F(BlockStoreTest, CommitAllIsAllOrNothing) {
  auto s = OpenStore(10000);
  ASSERT_EQ(*PutBlock(*s, Key(9)), CommitOutcome::kCommitted);
  auto handles = [&](std::vector<int> keys, uint32_t salt_of_last) {
    std::vector<PutHandle> hs;
    for (size_t i = 0; i < keys.size(); ++i) {
      const BlockKey k = Key(keys[i]);
      auto h = s->BeginPut(k, "p", TestAccounting(100), 100);
      EXPECT_TRUE(h.ok()) << h.status();
      const std::string bytes = TestPayload(k, 100, i + 1 == keys.size() ? salt_of_last : 0);
      std::copy(bytes.begin(), bytes.end(), h->buffer().begin());
      hs.push_back(*std::move(h));
    }
    return hs;
  };
  size_t conflict = 99;
  // Key 9 last, with other bytes than the stored one.
  auto r = s->CommitAll(handles({1, 2, 3, 9}, /*salt_of_last=*/1), &conflict);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(conflict, 3u);
  for (int k : {1, 2, 3}) EXPECT_EQ(s->Get(Key(k)).status().code(), absl::StatusCode::kNotFound) << k;
  EXPECT_EQ(s->Stats().host_used_bytes, 100u);
  EXPECT_EQ(s->Stats().host_reserved_bytes, 0u);
  // A key twice.
  EXPECT_EQ(s->CommitAll(handles({4, 4}, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Get(Key(4)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Stats().host_used_bytes, 100u);
  // All new, and key 9 with its own bytes.
  r = s->CommitAll(handles({1, 2, 3, 9}, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<CommitOutcome>{CommitOutcome::kCommitted, CommitOutcome::kCommitted,
                                            CommitOutcome::kCommitted, CommitOutcome::kAlreadyPresent}));
  for (int k : {1, 2, 3, 9}) ExpectBytes(*s, Key(k), 100, Tier::kHost);
  EXPECT_EQ(s->Stats().host_used_bytes, 400u);
  EXPECT_EQ(s->Stats().host_reserved_bytes, 0u);
}

TEST_F(BlockStoreTest, DuplicateInFlightPutsOfOneKeyDoNotMix) {
  auto s = OpenStore();
  BlockKey k = Key(1);
  auto h1 = s->BeginPut(k, "", TestAccounting(100), 100);
  auto h2 = s->BeginPut(k, "", TestAccounting(100), 100);
  ASSERT_TRUE(h1.ok() && h2.ok());
  std::string b1 = TestPayload(k, 100, 1), b2 = TestPayload(k, 100, 2);
  std::copy(b1.begin(), b1.end(), h1->buffer().begin());
  std::copy(b2.begin(), b2.end(), h2->buffer().begin());
  EXPECT_EQ(s->Stats().host_used_bytes, 200u);
  ASSERT_EQ(*s->Commit(*std::move(h2)), CommitOutcome::kCommitted);
  EXPECT_EQ(s->Commit(*std::move(h1)).status().code(), absl::StatusCode::kAlreadyExists);
  ExpectBytes(*s, k, 100, Tier::kHost, 2);
  EXPECT_EQ(s->Stats().host_used_bytes, 100u);
}

TEST_F(BlockStoreTest, BeginPutValidatesItsArguments) {
  auto s = OpenStore();
  EXPECT_EQ(s->BeginPut({"t", 1, ""}, "", TestAccounting(1), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->BeginPut(Key(1), std::string(65, 'p'), TestAccounting(1), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->BeginPut(Key(1), "", TestAccounting(2), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->BeginPut(Key(1), "", TestAccounting(1), 1, {.durable = true}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->BeginPut(Key(1), "", TestAccounting(1001), 1001).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s->Stats().host_used_bytes, 0u);
}

TEST_F(BlockStoreTest, OpenRejectsBadOptions) {
  EXPECT_EQ(BlockStore::Open({.host_high_watermark = 0.5, .host_low_watermark = 0.7})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockStore::Open({.max_pin_ttl = absl::ZeroDuration()}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BlockStoreTest, LookupCountsLeadingHitsAndCounters) {
  auto s = OpenStore(1 << 20);
  for (int i : {0, 1, 2, 4}) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
  std::vector<std::string> chain;
  for (int i = 0; i < 6; ++i) chain.push_back(Key(i).block_hash);
  auto r = s->Lookup("acme", 7, chain);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hits, 3u);  // block 3 is missing; block 4 does not count
  EXPECT_EQ(r->tiers, (std::vector<Tier>{Tier::kHost, Tier::kHost, Tier::kHost}));
  EXPECT_EQ(s->Lookup("acme", 8, chain)->hits, 0u);    // other model
  EXPECT_EQ(s->Lookup("other", 7, chain)->hits, 0u);   // other tenant
  EXPECT_EQ(s->Lookup("acme", 7, {})->hits, 0u);
  StoreCounters c = s->Stats().counters;
  EXPECT_EQ(c.lookups, 4u);
  EXPECT_EQ(c.lookup_hit_blocks[kHost], 3u);
  EXPECT_EQ(c.lookup_hit_blocks[kDisk], 0u);
  EXPECT_EQ(c.lookup_miss_blocks, 3u + 6u + 6u);
  std::vector<std::string> bad = {""};
  EXPECT_EQ(s->Lookup("acme", 7, bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BlockStoreTest, StatsSumAccountingPerTenantModelAndTier) {
  auto s = OpenStore(1 << 20);
  ASSERT_TRUE(PutBlock(*s, Key(1, "a", 1), 100).ok());
  ASSERT_TRUE(PutBlock(*s, Key(2, "a", 1), 300).ok());
  ASSERT_TRUE(PutBlock(*s, Key(1, "a", 2), 40).ok());
  ASSERT_TRUE(PutBlock(*s, Key(1, "b", 1), 8).ok());
  StoreStats st = s->Stats();
  ASSERT_EQ(st.usage.size(), 3u);
  EXPECT_EQ(st.usage[0].tenant, "a");
  EXPECT_EQ(st.usage[0].model_id, 1u);
  EXPECT_EQ(st.usage[0].tier, Tier::kHost);
  EXPECT_EQ(st.usage[0].blocks, 2u);
  EXPECT_EQ(st.usage[0].payload_bytes, 400u);
  BlockAccounting want = TestAccounting(100);
  want += TestAccounting(300);
  EXPECT_EQ(st.usage[0].accounting, want);
  EXPECT_EQ(st.usage[1].model_id, 2u);
  EXPECT_EQ(st.usage[1].accounting, TestAccounting(40));
  EXPECT_EQ(st.usage[2].tenant, "b");
  EXPECT_EQ(st.usage[2].payload_bytes, 8u);
  EXPECT_EQ(st.host_used_bytes, 448u);
  EXPECT_EQ(st.blocks, 4u);
  EXPECT_FALSE(st.disk_enabled);
}

TEST_F(BlockStoreTest, DeleteRemovesButReadersKeepTheirBytes) {
  auto s = OpenStore();
  BlockKey k = Key(1);
  ASSERT_TRUE(PutBlock(*s, k).ok());
  auto held = s->Get(k);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(s->Delete(k).ok());
  EXPECT_EQ(s->Delete(k).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Get(k).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(held->payload->view(), TestPayload(k, 100));
  StoreStats st = s->Stats();
  EXPECT_EQ(st.host_used_bytes, 0u);
  EXPECT_EQ(st.counters.deletes, 1u);
  // The key can be reused with other bytes.
  ASSERT_EQ(*PutBlock(*s, k, 100, 5), CommitOutcome::kCommitted);
  ExpectBytes(*s, k, 100, Tier::kHost, 5);
}

// Capacity 1000, watermarks 900/800, 100-byte blocks, no disk tier.
TEST_F(BlockStoreTest, EvictsAtHighWatermarkDownToLowAndDropsWithoutDisk) {
  auto s = OpenStore(1000);
  for (int i = 0; i < 9; ++i) {
    ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    clock_.Advance(absl::Seconds(1));
  }
  StoreStats st = s->Stats();
  EXPECT_EQ(st.host_used_bytes, 900u);
  EXPECT_EQ(st.counters.evictions, 0u);
  ASSERT_TRUE(PutBlock(*s, Key(9)).ok());  // 1000 > 900: evict to 800
  st = s->Stats();
  EXPECT_EQ(st.counters.evictions, 2u);
  EXPECT_EQ(st.counters.evicted_bytes, 200u);
  EXPECT_EQ(st.counters.drops, 2u);
  EXPECT_EQ(st.counters.spills, 0u);
  EXPECT_EQ(st.host_used_bytes, 800u);
  EXPECT_EQ(s->Get(Key(0)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Get(Key(1)).status().code(), absl::StatusCode::kNotFound);
  for (int i = 2; i < 10; ++i) ExpectBytes(*s, Key(i), 100, Tier::kHost);
}

TEST_F(BlockStoreTest, EvictionFollowsRecency) {
  auto s = OpenStore(1000);
  for (int i = 0; i < 9; ++i) {
    ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    clock_.Advance(absl::Seconds(1));
  }
  ASSERT_TRUE(s->Get(Key(0)).ok());  // now the youngest
  std::vector<std::string> chain = {Key(1).block_hash};
  ASSERT_EQ(s->Lookup("acme", 7, chain)->hits, 1u);  // lookups refresh too
  ASSERT_TRUE(PutBlock(*s, Key(9)).ok());
  ExpectBytes(*s, Key(0), 100, Tier::kHost);
  ExpectBytes(*s, Key(1), 100, Tier::kHost);
  EXPECT_EQ(s->Get(Key(2)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Get(Key(3)).status().code(), absl::StatusCode::kNotFound);
}

// A block that cannot fit even with every evictable block gone is refused
// before anything is evicted for it: the unpinned blocks stay in place.
TEST_F(BlockStoreTest, APutThatCannotFitEvictsNothing) {
  auto s = OpenStore(1000);
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    ASSERT_TRUE(s->Pin(Key(i), absl::Seconds(60)).ok());
  }
  for (int i = 7; i < 9; ++i) ASSERT_TRUE(PutBlock(*s, Key(i)).ok());  // 200 bytes unpinned
  // 400 bytes: 900 used, 200 of them evictable, 100 free.
  EXPECT_EQ(s->BeginPut(Key(20), "", TestAccounting(400), 400).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s->Stats().counters.evictions, 0u);
  for (int i = 0; i < 9; ++i) ExpectBytes(*s, Key(i), 100, Tier::kHost);
  // One that fits once both are evicted is admitted.
  auto h = s->BeginPut(Key(20), "", TestAccounting(300), 300);
  EXPECT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(s->Stats().counters.evictions, 2u);
}

TEST_F(BlockStoreTest, PinnedBlocksAreNeverEvictedAndBudgetHolds) {
  auto s = OpenStore(1000);
  for (int i = 0; i < 9; ++i) {
    ASSERT_TRUE(PutBlock(*s, Key(i)).ok());
    ASSERT_TRUE(s->Pin(Key(i), absl::Seconds(60)).ok());
  }
  // 900 pinned: one more 100-byte block still fits within capacity.
  ASSERT_TRUE(PutBlock(*s, Key(9)).ok());
  EXPECT_EQ(s->Stats().host_used_bytes, 1000u);
  ASSERT_TRUE(s->Pin(Key(9), absl::Seconds(60)).ok());
  auto refused = s->BeginPut(Key(10), "", TestAccounting(1), 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  StoreStats st = s->Stats();
  EXPECT_EQ(st.host_used_bytes, 1000u);
  EXPECT_EQ(st.counters.evictions, 0u);
  EXPECT_EQ(st.counters.puts_rejected, 1u);
  // Explicit eviction skips them too.
  auto ev = s->Evict({});
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->blocks, 0u);
  EXPECT_EQ(ev->skipped_pinned, 10u);
  for (int i = 0; i < 10; ++i) ExpectBytes(*s, Key(i), 100, Tier::kHost);
  // Once the leases expire the pins no longer protect anything.
  clock_.Advance(absl::Seconds(61));
  ASSERT_TRUE(PutBlock(*s, Key(10)).ok());
  EXPECT_EQ(s->Stats().counters.evictions, 3u);  // 1100 -> 800
  EXPECT_EQ(s->Stats().host_used_bytes, 800u);
}

TEST_F(BlockStoreTest, PinsCountAndLeasesExpire) {
  auto s = OpenStore(1000);
  BlockKey k = Key(1);
  ASSERT_TRUE(PutBlock(*s, k).ok());
  EXPECT_EQ(s->Unpin(k).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->Pin(k, absl::ZeroDuration()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Pin(k, absl::Minutes(11)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Pin(Key(2), absl::Seconds(1)).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(s->Pin(k, absl::Seconds(10)).ok());
  ASSERT_TRUE(s->Pin(k, absl::Seconds(5)).ok());  // does not shorten the lease
  ASSERT_TRUE(s->Unpin(k).ok());
  clock_.Advance(absl::Seconds(8));
  // One pin left, lease until t+10: still protected.
  EXPECT_EQ(s->Evict({})->skipped_pinned, 1u);
  clock_.Advance(absl::Seconds(3));
  // Lease expired: the remaining pin is void and Unpin says so.
  EXPECT_EQ(s->Unpin(k).code(), absl::StatusCode::kFailedPrecondition);
  auto ev = s->Evict({});
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->blocks, 1u);
  EXPECT_EQ(ev->skipped_pinned, 0u);
}

// PinAll pins every key or none: a missing key leaves the others' pin
// counts and leases as they were (a pin-then-unpin rollback would have
// extended a pinned block's lease).
TEST_F(BlockStoreTest, PinAllPinsEveryKeyOrNone) {
  auto s = OpenStore(1000);
  ASSERT_TRUE(PutBlock(*s, Key(1)).ok());
  ASSERT_TRUE(PutBlock(*s, Key(2)).ok());
  ASSERT_TRUE(s->Pin(Key(1), absl::Seconds(5)).ok());
  const std::vector<BlockKey> keys = {Key(1), Key(2), Key(3)};
  size_t missing = 99;
  EXPECT_EQ(s->PinAll(keys, absl::Seconds(60), &missing).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing, 2u);
  EXPECT_EQ(s->Unpin(Key(2)).code(), absl::StatusCode::kFailedPrecondition) << "key 2 got no pin";
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(s->Unpin(Key(1)).code(), absl::StatusCode::kFailedPrecondition) << "key 1's lease was not extended";
  ASSERT_TRUE(s->PinAll({keys.data(), 2}, absl::Seconds(10)).ok());
  EXPECT_EQ(s->Evict({})->skipped_pinned, 2u);
  ASSERT_TRUE(s->Unpin(Key(1)).ok());
  ASSERT_TRUE(s->Unpin(Key(2)).ok());
}

TEST_F(BlockStoreTest, RePinAfterExpiryStartsAFreshLease) {
  auto s = OpenStore(1000);
  BlockKey k = Key(1);
  ASSERT_TRUE(PutBlock(*s, k).ok());
  ASSERT_TRUE(s->Pin(k, absl::Seconds(10)).ok());
  ASSERT_TRUE(s->Pin(k, absl::Seconds(10)).ok());
  clock_.Advance(absl::Seconds(20));
  ASSERT_TRUE(s->Pin(k, absl::Seconds(10)).ok());  // old pins void: count is 1
  ASSERT_TRUE(s->Unpin(k).ok());
  EXPECT_EQ(s->Unpin(k).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(BlockStoreTest, EvictByModelAndByBytes) {
  auto s = OpenStore(1 << 20);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(PutBlock(*s, Key(i, "a", 1)).ok());
    ASSERT_TRUE(PutBlock(*s, Key(i, "a", 2)).ok());
    clock_.Advance(absl::Seconds(1));
  }
  auto ev = s->Evict({.scope = ModelScope{"a", 1}, .max_bytes = 99});
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->blocks, 0u);  // a bound: no whole block fits under 99 bytes
  ev = s->Evict({.scope = ModelScope{"a", 1}, .max_bytes = 350});
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->blocks, 3u);  // the oldest three: 300 of at most 350 bytes
  EXPECT_EQ(ev->bytes, 300u);
  EXPECT_EQ(s->Get(Key(2, "a", 1)).status().code(), absl::StatusCode::kNotFound);
  ExpectBytes(*s, Key(3, "a", 1), 100, Tier::kHost);
  ev = s->Evict({.scope = ModelScope{"a", 2}, .drop = true});
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->blocks, 5u);
  StoreStats st = s->Stats();
  ASSERT_EQ(st.usage.size(), 1u);
  EXPECT_EQ(st.usage[0].model_id, 1u);
  EXPECT_EQ(st.usage[0].blocks, 2u);
  EXPECT_EQ(st.counters.drops, 8u);
  EXPECT_EQ(st.host_used_bytes, 200u);
}

TEST_F(BlockStoreTest, ModelRecordsWithoutDiskLiveInMemory) {
  auto s = OpenStore();
  ASSERT_TRUE(s->PutModelRecord("t", 2, "two").ok());
  ASSERT_TRUE(s->PutModelRecord("t", 1, "one").ok());
  EXPECT_EQ(*s->GetModelRecord("t", 2), "two");
  EXPECT_EQ(s->GetModelRecord("t", 3).status().code(), absl::StatusCode::kNotFound);
  auto list = s->ListModelRecords();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].model_id, 1u);
  ASSERT_TRUE(s->DeleteModelRecord("t", 1).ok());
  EXPECT_EQ(s->ListModelRecords()->size(), 1u);
}

}  // namespace
}  // namespace tqkv::storage
