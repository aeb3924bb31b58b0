#include "storage/block_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace tqkv::storage {
namespace {

absl::Time T(int s) { return absl::FromUnixSeconds(s); }

BlockRecord MakeRecord(std::string tenant, uint64_t model, std::string hash, uint64_t size,
                       absl::Time access) {
  BlockRecord r;
  r.key = {std::move(tenant), model, std::move(hash)};
  r.size_bytes = size;
  r.accounting = {2 * size, size / 2, size / 4, 1, 0, size};
  r.last_access = access;
  return r;
}

std::shared_ptr<const HostBuffer> Buf(size_t n) {
  return std::shared_ptr<const HostBuffer>(*HostBuffer::Allocate(n));
}

std::vector<std::string> HostOrder(BlockIndex& index) {
  std::vector<std::string> out;
  index.ForEachHostLru([&](BlockRecord* r) {
    out.push_back(r->key.block_hash);
    return true;
  });
  return out;
}

std::vector<std::string> DiskOrder(BlockIndex& index) {
  std::vector<std::string> out;
  index.ForEachDiskOnlyLru([&](BlockRecord* r) {
    out.push_back(r->key.block_hash);
    return true;
  });
  return out;
}

TEST(BlockIndex, InsertFindEraseAndGenerations) {
  BlockIndex index;
  BlockRecord* a = index.Insert(MakeRecord("t", 1, "a", 10, T(1)));
  BlockRecord* b = index.Insert(MakeRecord("t", 1, "b", 10, T(2)));
  EXPECT_NE(a->generation, b->generation);
  EXPECT_EQ(index.Find({"t", 1, "a"}), a);
  EXPECT_EQ(index.Find({"t", 2, "a"}), nullptr);
  EXPECT_EQ(index.size(), 2u);
  uint64_t gen_a = a->generation;
  index.Erase(a);
  EXPECT_EQ(index.Find({"t", 1, "a"}), nullptr);
  BlockRecord* a2 = index.Insert(MakeRecord("t", 1, "a", 10, T(3)));
  EXPECT_GT(a2->generation, gen_a);
}

TEST(BlockIndex, ResidencyDrivesListsAndByteTotals) {
  BlockIndex index;
  BlockRecord* a = index.Insert(MakeRecord("t", 1, "a", 100, T(1)));
  BlockRecord* b = index.Insert(MakeRecord("t", 1, "b", 50, T(2)));
  index.SetHostCopy(a, Buf(100));
  index.SetHostCopy(b, Buf(50));
  EXPECT_EQ(index.host_bytes(), 150u);
  EXPECT_EQ(HostOrder(index), (std::vector<std::string>{"a", "b"}));
  // Spill a: it stays host-resident until its host copy is dropped; while
  // it has both copies it counts in both tiers and once in its model.
  index.SetOnDisk(a, true);
  EXPECT_EQ(index.disk_bytes(), 100u);
  EXPECT_TRUE(DiskOrder(index).empty());
  ASSERT_EQ(index.Residency().size(), 1u);
  EXPECT_EQ(index.Residency()[0].blocks, 2u);
  EXPECT_EQ(index.Residency()[0].payload_bytes, 150u);
  uint64_t tier_blocks = 0;
  for (const TierUsage& u : index.Usage()) tier_blocks += u.blocks;
  EXPECT_EQ(tier_blocks, 3u);
  index.SetHostCopy(a, nullptr);
  EXPECT_EQ(index.host_bytes(), 50u);
  EXPECT_EQ(HostOrder(index), (std::vector<std::string>{"b"}));
  EXPECT_EQ(DiskOrder(index), (std::vector<std::string>{"a"}));
  EXPECT_EQ(a->best_tier(), Tier::kDisk);
  EXPECT_EQ(index.Residency()[0].blocks, 2u);
  index.Erase(a);
  EXPECT_EQ(index.disk_bytes(), 0u);
  EXPECT_TRUE(DiskOrder(index).empty());
  EXPECT_EQ(index.Residency()[0].blocks, 1u);
  index.Erase(b);
  EXPECT_TRUE(index.Residency().empty());
}

TEST(BlockIndex, TouchMovesToYoungEndAndRelistKeepsAge) {
  BlockIndex index;
  for (int i = 0; i < 4; ++i) {
    BlockRecord* r = index.Insert(MakeRecord("t", 1, std::string(1, 'a' + i), 1, T(i)));
    index.SetHostCopy(r, Buf(1));
  }
  index.Touch(index.Find({"t", 1, "a"}), T(10));
  EXPECT_EQ(HostOrder(index), (std::vector<std::string>{"b", "c", "d", "a"}));
  // c and b leave host for disk in that order; the disk list stays by age.
  BlockRecord* c = index.Find({"t", 1, "c"});
  index.SetOnDisk(c, true);
  index.SetHostCopy(c, nullptr);
  BlockRecord* b = index.Find({"t", 1, "b"});
  index.SetOnDisk(b, true);
  index.SetHostCopy(b, nullptr);
  EXPECT_EQ(DiskOrder(index), (std::vector<std::string>{"b", "c"}));
}

// Many touched disk-only records, then host records joining the disk list:
// every walk gives the exact order of last access, touched records and
// newcomers interleaved by age; walking twice changes nothing.
TEST(BlockIndex, TouchedRecordsAndNewcomersKeepExactAgeOrder) {
  BlockIndex index;
  constexpr int kDisk = 2000, kHost = 50;
  for (int i = 0; i < kDisk; ++i) {
    BlockRecord* r = index.Insert(MakeRecord("t", 1, "d" + std::to_string(i), 1, T(i)));
    index.SetOnDisk(r, true);
  }
  for (int i = 0; i < kHost; ++i) {
    BlockRecord* r = index.Insert(MakeRecord("t", 1, "h" + std::to_string(i), 1, T(5000 + 2 * i)));
    index.SetHostCopy(r, Buf(1));
  }
  // The odd disk records are touched at odd times from 5003 on (some
  // between the host records' accesses), in reverse order; some twice.
  for (int i = kDisk - 1; i >= 1; i -= 2) index.Touch(index.Find({"t", 1, "d" + std::to_string(i)}), T(5001 + 2 * i));
  for (int i = 1; i < 100; i += 2) index.Touch(index.Find({"t", 1, "d" + std::to_string(i)}), T(5001 + 2 * i));
  // Host records move to disk (as spills do), oldest first.
  for (int i = 0; i < kHost; ++i) {
    BlockRecord* r = index.Find({"t", 1, "h" + std::to_string(i)});
    index.SetOnDisk(r, true);
    index.SetHostCopy(r, nullptr);
  }
  std::vector<std::pair<absl::Time, std::string>> want;
  index.ForEach([&](BlockRecord* r) { want.push_back({r->last_access, r->key.block_hash}); });
  std::sort(want.begin(), want.end());
  std::vector<std::string> want_order;
  for (const auto& [t, h] : want) want_order.push_back(h);
  EXPECT_EQ(DiskOrder(index), want_order);
  EXPECT_EQ(DiskOrder(index), want_order);
  EXPECT_EQ(index.disk_only_blocks(), static_cast<size_t>(kDisk + kHost));
}

TEST(BlockIndex, ForEachMayEraseTheVisitedRecord) {
  BlockIndex index;
  for (int i = 0; i < 5; ++i) {
    BlockRecord* r = index.Insert(MakeRecord("t", 1, std::string(1, 'a' + i), 1, T(i)));
    index.SetHostCopy(r, Buf(1));
  }
  int visited = 0;
  index.ForEachHostLru([&](BlockRecord* r) {
    ++visited;
    if (r->key.block_hash != "c") index.Erase(r);
    return true;
  });
  EXPECT_EQ(visited, 5);
  EXPECT_EQ(HostOrder(index), (std::vector<std::string>{"c"}));
  EXPECT_EQ(index.host_bytes(), 1u);
}

TEST(BlockIndex, UsageSumsPerTenantModelAndTier) {
  BlockIndex index;
  BlockRecord* a = index.Insert(MakeRecord("t", 1, "a", 100, T(1)));
  BlockRecord* b = index.Insert(MakeRecord("t", 1, "b", 40, T(1)));
  BlockRecord* c = index.Insert(MakeRecord("u", 7, "c", 8, T(1)));
  index.SetHostCopy(a, Buf(100));
  index.SetHostCopy(b, Buf(40));
  index.SetOnDisk(b, true);
  index.SetOnDisk(c, true);
  std::vector<TierUsage> u = index.Usage();
  ASSERT_EQ(u.size(), 3u);
  EXPECT_EQ(u[0].tenant, "t");
  EXPECT_EQ(u[0].tier, Tier::kHost);
  EXPECT_EQ(u[0].blocks, 2u);
  EXPECT_EQ(u[0].payload_bytes, 140u);
  EXPECT_EQ(u[0].accounting, (BlockAccounting{280, 70, 35, 2, 0, 140}));
  EXPECT_EQ(u[1].tier, Tier::kDisk);
  EXPECT_EQ(u[1].blocks, 1u);
  EXPECT_EQ(u[1].payload_bytes, 40u);
  EXPECT_EQ(u[2].tenant, "u");
  EXPECT_EQ(u[2].model_id, 7u);
  EXPECT_EQ(u[2].payload_bytes, 8u);
  index.Erase(b);
  index.Erase(c);
  u = index.Usage();
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].blocks, 1u);
  EXPECT_EQ(u[0].accounting, (BlockAccounting{200, 50, 25, 1, 0, 100}));
}

TEST(BlockRecord, ProtectedNeedsPinAndUnexpiredLease) {
  BlockRecord r;
  EXPECT_FALSE(r.Protected(T(5)));
  r.pin_count = 1;
  r.lease_deadline = T(10);
  EXPECT_TRUE(r.Protected(T(9)));
  EXPECT_FALSE(r.Protected(T(10)));
  r.pin_count = 0;
  EXPECT_FALSE(r.Protected(T(9)));
}

}  // namespace
}  // namespace tqkv::storage
