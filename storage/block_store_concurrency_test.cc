// Many threads putting, reading, pinning, deleting and evicting at once, with
// a host budget small enough that eviction and spilling run all the time.
// Every payload is a function of its key (and a per-writer salt in the
// conflict test), so a lost, torn or mixed-up block shows as a byte mismatch.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "storage/block_store.h"
#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

constexpr int kThreads = 8;

BlockKey Key(int i) {
  return {"t" + std::to_string(i % 3), static_cast<uint64_t>(1 + i % 2), "k" + std::to_string(i)};
}
size_t SizeOf(int i) { return 512 + (i * 37) % 1536; }

void CheckInvariants(BlockStore& s) {
  StoreStats st = s.Stats();
  uint64_t host = 0, disk = 0;
  for (const TierUsage& u : st.usage) (u.tier == Tier::kHost ? host : disk) += u.payload_bytes;
  EXPECT_EQ(st.host_used_bytes, host + st.host_reserved_bytes);
  EXPECT_EQ(st.disk_used_bytes, disk);
  EXPECT_LE(st.host_used_bytes, st.host_capacity_bytes);
  EXPECT_LE(st.disk_used_bytes, st.disk_capacity_bytes);
  EXPECT_EQ(st.host_reserved_bytes, 0u);
}

TEST(BlockStoreConcurrency, NoLostOrMixedBlocksUnderEvictionAndSpill) {
  TempDir dir;
  FakeClock clock;
  BlockStoreOptions o;
  o.host_capacity_bytes = 48 << 10;  // ~40 blocks of a 200-block key space
  o.disk_path = dir.path();
  o.disk_capacity_bytes = 16 << 20;  // never full: nothing is dropped
  o.clock = &clock;
  auto opened = BlockStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  BlockStore& s = **opened;

  constexpr int kKeys = 200;
  constexpr int kOps = 600;
  // Keys with i % 10 == 0 may be deleted; every other key, once committed,
  // must stay readable until the end.
  std::vector<std::atomic<bool>> committed(kKeys);
  std::atomic<int> mismatches{0}, unexpected{0};
  absl::Mutex log_mu;
  std::vector<std::string> log;
  auto note = [&](absl::string_view what, int i, const absl::Status& st) {
    unexpected++;
    absl::MutexLock l(&log_mu);
    log.push_back(std::string(what) + " key " + std::to_string(i) + ": " + st.ToString());
  };

  auto worker = [&](int t) {
    std::mt19937 rng(1234 + t);
    for (int op = 0; op < kOps; ++op) {
      int i = rng() % kKeys;
      BlockKey k = Key(i);
      switch (rng() % 10) {
        case 0:
        case 1:
        case 2: {  // put (sometimes durable), possibly racing other writers of k
          PutOptions po{.durable = rng() % 64 == 0};
          auto h = s.BeginPut(k, "", TestAccounting(SizeOf(i)), SizeOf(i), po);
          if (!h.ok()) {
            note("BeginPut", i, h.status());
            break;
          }
          std::string bytes = TestPayload(k, SizeOf(i));
          std::copy(bytes.begin(), bytes.end(), h->buffer().begin());
          if (rng() % 16 == 0) break;  // dropped uncommitted: must leave no trace
          auto c = s.Commit(*std::move(h));
          if (!c.ok()) {
            note("Commit", i, c.status());
          } else {
            committed[i] = true;
          }
          break;
        }
        case 3:
        case 4:
        case 5:
        case 6: {  // get: exact bytes or NOT_FOUND
          const bool was_committed = committed[i];  // read before the Get
          auto g = s.Get(k);
          if (g.ok()) {
            if (g->payload->view() != TestPayload(k, SizeOf(i))) mismatches++;
          } else if (!absl::IsNotFound(g.status())) {
            note("Get", i, g.status());
          } else if (i % 10 != 0 && was_committed) {
            note("Get of a committed block", i, g.status());
          }
          break;
        }
        case 7: {  // lookup a short chain
          std::vector<std::string> chain = {k.block_hash, Key(i + 1).block_hash};
          if (!s.Lookup(k.tenant, k.model_id, chain).ok()) unexpected++;
          break;
        }
        case 8: {  // pin briefly or delete a deletable key
          if (i % 10 == 0) {
            absl::Status d = s.Delete(k);
            if (!d.ok() && !absl::IsNotFound(d)) note("Delete", i, d);
          } else if (s.Pin(k, absl::Seconds(1)).ok()) {
            absl::Status u = s.Unpin(k);
            if (!u.ok()) note("Unpin", i, u);
          }
          break;
        }
        case 9: {  // admin eviction of a few bytes, or time passing
          if (rng() % 2 == 0) {
            auto ev = s.Evict({.max_bytes = 4096});
            if (!ev.ok()) note("Evict", i, ev.status());
          } else {
            clock.Advance(absl::Milliseconds(10));
          }
          break;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();

  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  for (const std::string& line : log) ADD_FAILURE() << line;
  CheckInvariants(s);
  StoreStats st = s.Stats();
  EXPECT_GT(st.counters.spills, 0u);
  EXPECT_GT(st.counters.promotions, 0u);
  EXPECT_GT(st.counters.get_hits[static_cast<int>(Tier::kDisk)], 0u);
  EXPECT_EQ(st.counters.drops, 0u);
  EXPECT_EQ(st.counters.checksum_failures, 0u);
  for (int i = 0; i < kKeys; ++i) {
    if (i % 10 == 0 || !committed[i]) continue;
    auto g = s.Get(Key(i));
    ASSERT_TRUE(g.ok()) << i << ": " << g.status();
    EXPECT_EQ(g->payload->view(), TestPayload(Key(i), SizeOf(i))) << i;
  }
  // Everything on disk must come back after a restart, byte for byte.
  ASSERT_TRUE(s.Evict({}).ok());
  uint64_t blocks = s.Stats().blocks;
  opened->reset();
  auto reopened = BlockStore::Open(o);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->Stats().blocks, blocks);
  for (int i = 0; i < kKeys; ++i) {
    auto g = (*reopened)->Get(Key(i));
    if (g.ok()) {
      EXPECT_EQ(g->payload->view(), TestPayload(Key(i), SizeOf(i))) << i;
    } else {
      EXPECT_TRUE(absl::IsNotFound(g.status()) && (i % 10 == 0 || !committed[i])) << i;
    }
  }
}

TEST(BlockStoreConcurrency, ConflictingWritersOfOneKeyHaveExactlyOneWinner) {
  TempDir dir;
  BlockStoreOptions o;
  o.host_capacity_bytes = 32 << 10;
  o.disk_path = dir.path();
  auto opened = BlockStore::Open(o);
  ASSERT_TRUE(opened.ok());
  BlockStore& s = **opened;

  constexpr int kKeys = 60;
  absl::Mutex mu;
  std::vector<int> winner(kKeys, -1);
  std::vector<int> wins(kKeys, 0);
  std::atomic<int> unexpected{0};
  auto worker = [&](int t) {
    for (int i = 0; i < kKeys; ++i) {
      int key = (i + t * 7) % kKeys;  // different orders per thread
      BlockKey k = Key(key);
      auto c = s.Put(k, "", TestAccounting(SizeOf(key)), TestPayload(k, SizeOf(key), t),
                     {.durable = key % 15 == 0});
      if (c.ok() && *c == CommitOutcome::kCommitted) {
        absl::MutexLock l(&mu);
        winner[key] = t;
        wins[key]++;
      } else if (c.ok() || !absl::IsAlreadyExists(c.status())) {
        unexpected++;  // kAlreadyPresent is impossible: every salt differs
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();

  EXPECT_EQ(unexpected.load(), 0);
  for (int key = 0; key < kKeys; ++key) {
    ASSERT_EQ(wins[key], 1) << key;
    auto g = s.Get(Key(key));
    ASSERT_TRUE(g.ok()) << key << ": " << g.status();
    EXPECT_EQ(g->payload->view(), TestPayload(Key(key), SizeOf(key), winner[key])) << key;
  }
  StoreStats st = s.Stats();
  EXPECT_EQ(st.counters.puts_committed, static_cast<uint64_t>(kKeys));
  EXPECT_GT(st.counters.spills, 0u);
  CheckInvariants(s);
}

// A reader never sees part of a CommitAll: while batches of 32 blocks
// commit, a reader that finds a batch's first block finds its last, and a
// batch refused for a conflict at its end is never seen at all.
TEST(BlockStoreConcurrency, CommitAllIsNeverSeenHalfWay) {
  FakeClock clock;
  BlockStoreOptions o;
  o.host_capacity_bytes = 64 << 20;
  o.clock = &clock;
  auto opened = BlockStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  BlockStore& s = **opened;
  constexpr int kBatches = 200, kPerBatch = 32;
  auto key = [](int batch, int j) { return BlockKey{"t", 1, "b" + std::to_string(batch) + "-" + std::to_string(j)}; };
  // Odd batches end in a key that already holds other bytes.
  for (int b = 1; b < kBatches; b += 2)
    ASSERT_TRUE(s.Put(key(b, kPerBatch - 1), "", TestAccounting(64), TestPayload(key(b, 0), 64)).ok());
  std::atomic<int> done_batches{0};
  std::atomic<bool> stop{false};
  std::atomic<int> half_seen{0}, refused_seen{0};
  std::thread reader([&] {
    while (!stop.load()) {
      const int upto = done_batches.load() + 1;  // the batch being committed, too
      for (int b = 0; b <= upto && b < kBatches; ++b) {
        const bool first = s.Get(key(b, 0)).ok();
        if (b % 2 == 1 && first) refused_seen++;
        if (b % 2 == 0 && first && !s.Get(key(b, kPerBatch - 1)).ok()) half_seen++;
      }
    }
  });
  for (int b = 0; b < kBatches; ++b) {
    std::vector<PutHandle> hs;
    for (int j = 0; j < kPerBatch; ++j) {
      auto h = s.BeginPut(key(b, j), "", TestAccounting(64), 64);
      ASSERT_TRUE(h.ok()) << h.status();
      const std::string bytes = TestPayload(key(b, j), 64);
      std::copy(bytes.begin(), bytes.end(), h->buffer().begin());
      hs.push_back(*std::move(h));
    }
    auto r = s.CommitAll(std::move(hs));
    EXPECT_EQ(r.ok(), b % 2 == 0) << b << ": " << r.status();
    done_batches.store(b);
  }
  stop.store(true);
  reader.join();
  EXPECT_EQ(half_seen.load(), 0);
  EXPECT_EQ(refused_seen.load(), 0);
  CheckInvariants(s);
}

}  // namespace
}  // namespace tqkv::storage
