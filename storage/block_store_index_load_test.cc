// BlockStore opened with load_index_in_background: every stored block
// answers before the scan reaches it (Lookup, Get, Pin, Delete, commits that
// conflict or repeat), nothing removed meanwhile comes back when the scan
// passes it, and a drop waits for the whole index.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "storage/block_store.h"
#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

constexpr size_t kSize = 100;

BlockKey Key(int i) { return {"acme", 7, "h" + std::to_string(i)}; }

std::vector<std::string> Chain(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(Key(i).block_hash);
  return out;
}

class IndexLoadTest : public ::testing::Test {
 protected:
  // A store on dir_ whose disk tier holds blocks 0 .. n-1 and nothing in host.
  void Fill(int n) {
    auto s = BlockStore::Open(Options());
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < n; ++i) ASSERT_TRUE(Put(**s, Key(i)).ok()) << i;
    ASSERT_TRUE((*s)->Evict({}).ok());
    ASSERT_EQ((*s)->Stats().host_used_bytes, 0u);
  }
  BlockStoreOptions Options() {
    BlockStoreOptions o;
    o.host_capacity_bytes = 64 * kSize;
    o.disk_path = dir_.path();
    return o;
  }
  // Opens in the background; the scan waits for `go` before its first batch.
  std::unique_ptr<BlockStore> OpenHeld(absl::Notification* go) {
    BlockStoreOptions o = Options();
    o.load_index_in_background = true;
    o.before_index_batch_for_test = [go](uint64_t) { go->WaitForNotification(); };
    auto s = BlockStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  static absl::StatusOr<CommitOutcome> Put(BlockStore& s, const BlockKey& k, uint32_t salt = 0) {
    return s.Put(k, "", TestAccounting(kSize), TestPayload(k, kSize, salt));
  }
  static void ExpectBytes(BlockStore& s, const BlockKey& k, uint32_t salt = 0) {
    auto got = s.Get(k);
    ASSERT_TRUE(got.ok()) << DebugString(k) << ": " << got.status();
    EXPECT_EQ(got->payload->view(), TestPayload(k, kSize, salt)) << DebugString(k);
  }

  TempDir dir_;
};

TEST_F(IndexLoadTest, EveryBlockAnswersBeforeTheScanAndRemovalsStayRemoved) {
  constexpr int kBlocks = 3000;
  Fill(kBlocks);
  absl::Notification go;
  auto s = OpenHeld(&go);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->Stats().index_loading);
  EXPECT_EQ(s->Stats().blocks, 0u) << "the scan has not indexed anything yet";

  auto hits = s->Lookup("acme", 7, Chain(kBlocks));
  ASSERT_TRUE(hits.ok()) << hits.status();
  EXPECT_EQ(hits->hits, static_cast<size_t>(kBlocks));
  ExpectBytes(*s, Key(2999));
  ASSERT_TRUE(s->Delete(Key(10)).ok());
  ASSERT_TRUE(s->Pin(Key(11), absl::Minutes(5)).ok());
  auto same = Put(*s, Key(12));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, CommitOutcome::kAlreadyPresent) << "a block on disk, not yet scanned";
  EXPECT_EQ(Put(*s, Key(13), /*salt=*/1).status().code(), absl::StatusCode::kAlreadyExists)
      << "other bytes under a stored key, not yet scanned";
  ASSERT_TRUE(s->Delete(Key(14)).ok());
  ASSERT_TRUE(Put(*s, Key(14), /*salt=*/2).ok()) << "deleted, then put again with new bytes";
  EXPECT_EQ(s->Get(Key(kBlocks)).status().code(), absl::StatusCode::kNotFound);

  // A drop needs the whole index: it waits for the scan.
  std::atomic<bool> dropped{false};
  std::thread drop([&] {
    EvictSpec spec;
    spec.scope = ModelScope{"acme", 8};  // nothing of it: only the wait matters
    spec.drop = true;
    EXPECT_TRUE(s->Evict(spec).ok());
    dropped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(dropped) << "a drop must wait for the index";

  go.Notify();
  ASSERT_TRUE(s->AwaitIndexLoaded().ok());
  drop.join();
  EXPECT_TRUE(dropped);
  const StoreStats st = s->Stats();
  EXPECT_FALSE(st.index_loading);
  EXPECT_EQ(st.blocks, static_cast<uint64_t>(kBlocks - 1));
  EXPECT_EQ(st.disk_used_bytes, (kBlocks - 2) * kSize) << "each counted once; 10 deleted, 14's new bytes in host only";
  EXPECT_EQ(s->Get(Key(10)).status().code(), absl::StatusCode::kNotFound) << "the scan must not bring it back";
  EXPECT_TRUE(s->Unpin(Key(11)).ok()) << "the pin taken before the scan passed holds";
  ExpectBytes(*s, Key(14), /*salt=*/2);
  ExpectBytes(*s, Key(13));
  for (int i = 0; i < kBlocks; i += 97)
    if (i != 10 && i != 14) ExpectBytes(*s, Key(i));
}

// Threads delete, put again and read random blocks while a slow scan runs;
// afterwards the store holds exactly the blocks that should be there, each
// with its latest bytes.
TEST_F(IndexLoadTest, CallsDuringASlowScanLeaveExactlyTheExpectedBlocks) {
  constexpr int kBlocks = 20000, kThreads = 4, kOpsPerThread = 1500;
  Fill(kBlocks);
  BlockStoreOptions o = Options();
  o.load_index_in_background = true;
  // 20 batches of 10 ms each: at 3 ms the threads' 6,000 calls often
  // outlasted the scan on the 2-core build machine.
  o.before_index_batch_for_test = [](uint64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(10)); };
  auto opened = BlockStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  BlockStore& s = **opened;
  // Thread t owns the blocks i ≡ t (mod kThreads): no two threads race on one key.
  std::vector<std::set<int>> deleted(kThreads), reput(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int op = 0; op < kOpsPerThread; ++op) {
        const int i = static_cast<int>(rng() % (kBlocks / kThreads)) * kThreads + t;
        const BlockKey k = Key(i);
        switch (rng() % 3) {
          case 0:
            if (!deleted[t].count(i) || reput[t].count(i)) {
              ASSERT_TRUE(s.Delete(k).ok()) << i;
              deleted[t].insert(i);
              reput[t].erase(i);
            }
            break;
          case 1:
            if (deleted[t].count(i) && !reput[t].count(i)) {
              ASSERT_TRUE(Put(s, k, /*salt=*/5).ok()) << i;
              reput[t].insert(i);
            }
            break;
          default: {
            auto got = s.Get(k);
            const bool present = !deleted[t].count(i) || reput[t].count(i);
            ASSERT_EQ(got.ok(), present) << i << ": " << got.status();
            if (present) EXPECT_EQ(got->payload->view(), TestPayload(k, kSize, reput[t].count(i) ? 5 : 0));
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const bool overlapped = s.Stats().index_loading;
  ASSERT_TRUE(s.AwaitIndexLoaded().ok());
  EXPECT_TRUE(overlapped) << "the calls should have run during the scan (make it slower)";
  uint64_t expected = kBlocks;
  for (int t = 0; t < kThreads; ++t)
    for (int i : deleted[t])
      if (!reput[t].count(i)) --expected;
  EXPECT_EQ(s.Stats().blocks, expected);
  for (int t = 0; t < kThreads; ++t) {
    for (int i : deleted[t]) {
      if (reput[t].count(i)) {
        ExpectBytes(s, Key(i), 5);
      } else {
        EXPECT_EQ(s.Get(Key(i)).status().code(), absl::StatusCode::kNotFound) << i;
      }
    }
  }
}

// Destroying the store mid-scan stops the scan; a later open finds everything.
TEST_F(IndexLoadTest, ClosingDuringTheScanStopsIt) {
  Fill(3000);
  {
    BlockStoreOptions o = Options();
    o.load_index_in_background = true;
    o.before_index_batch_for_test = [](uint64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
    auto s = BlockStore::Open(o);
    ASSERT_TRUE(s.ok());
  }
  auto s = BlockStore::Open(Options());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Stats().blocks, 3000u);
}

}  // namespace
}  // namespace tqkv::storage
