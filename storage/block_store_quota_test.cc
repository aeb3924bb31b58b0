// Per-tenant host quotas (BlockStoreOptions::tenant_host_quota_bytes): a
// tenant over its quota evicts its own blocks, never another tenant's, and
// is refused when its own cannot make room.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "storage/block_store.h"
#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

constexpr size_t kSize = 100;

BlockKey Key(const std::string& tenant, int i) { return {tenant, 7, "h" + std::to_string(i)}; }

class TenantQuotaTest : public ::testing::Test {
 protected:
  std::unique_ptr<BlockStore> Open(uint64_t quota) {
    BlockStoreOptions o;
    o.host_capacity_bytes = 10 * kSize;
    o.tenant_host_quota_bytes = quota;
    o.clock = &clock_;
    auto s = BlockStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  absl::Status Put(BlockStore& s, const BlockKey& k) {
    clock_.Advance(absl::Seconds(1));
    return s.Put(k, "", TestAccounting(kSize), TestPayload(k, kSize)).status();
  }
  int Present(BlockStore& s, const std::string& tenant, int n) {
    int present = 0;
    for (int i = 0; i < n; ++i) {
      auto got = s.Get(Key(tenant, i));
      if (!got.ok()) continue;
      EXPECT_TRUE(got->payload->view() == TestPayload(Key(tenant, i), kSize));
      ++present;
    }
    return present;
  }

  FakeClock clock_;
};

TEST_F(TenantQuotaTest, WithoutAQuotaOneTenantsPutsEvictAnothers) {
  auto s = Open(0);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Put(*s, Key("victim", i)).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Put(*s, Key("hog", i)).ok());
  EXPECT_EQ(Present(*s, "victim", 4), 0);
}

TEST_F(TenantQuotaTest, ATenantOverItsQuotaEvictsItsOwnBlocksOnly) {
  auto s = Open(4 * kSize);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Put(*s, Key("victim", i)).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Put(*s, Key("hog", i)).ok()) << i;
  EXPECT_EQ(Present(*s, "victim", 4), 4);
  EXPECT_EQ(Present(*s, "hog", 16), 0);  // its oldest went first
  for (int i = 16; i < 20; ++i) EXPECT_TRUE(s->Get(Key("hog", i)).ok()) << i;
  EXPECT_LE(s->Stats().host_used_bytes, 8 * kSize);
}

TEST_F(TenantQuotaTest, ATenantWhoseBlocksCannotBeEvictedIsRefusedAndNothingOfTheRefusalStays) {
  auto s = Open(4 * kSize);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(Put(*s, Key("hog", i)).ok());
    ASSERT_TRUE(s->Pin(Key("hog", i), absl::Minutes(1)).ok());
  }
  absl::Status refused = Put(*s, Key("hog", 4));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("tenant 'hog'"), std::string::npos) << refused;
  EXPECT_TRUE(absl::IsNotFound(s->Get(Key("hog", 4)).status()));
  // The host tier has room; others put freely.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Put(*s, Key("other", i)).ok());
  StoreStats st = s->Stats();
  EXPECT_EQ(st.host_reserved_bytes, 0u);
  EXPECT_EQ(st.counters.puts_rejected, 1u);
  // Once the pins' leases end, the tenant's own blocks make room again.
  clock_.Advance(absl::Minutes(2));
  EXPECT_TRUE(Put(*s, Key("hog", 5)).ok());
}

TEST_F(TenantQuotaTest, UncommittedPutsCountAndReturnTheirShareWhenAborted) {
  auto s = Open(4 * kSize);
  std::vector<PutHandle> handles;
  for (int i = 0; i < 4; ++i) {
    auto h = s->BeginPut(Key("t", i), "", TestAccounting(kSize), kSize);
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*std::move(h));
  }
  // A fifth block of the same stream is over the quota: the reservations
  // cannot be evicted.
  auto fifth = s->BeginPut(Key("t", 4), "", TestAccounting(kSize), kSize);
  EXPECT_EQ(fifth.status().code(), absl::StatusCode::kResourceExhausted);
  handles.clear();  // the stream fails: nothing committed, shares returned
  EXPECT_EQ(s->Stats().host_reserved_bytes, 0u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(absl::IsNotFound(s->Get(Key("t", i)).status()));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Put(*s, Key("t", i)).ok());
  // A block larger than the quota is refused outright.
  auto big = s->BeginPut(Key("t", 9), "", TestAccounting(5 * kSize), 5 * kSize);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Present(*s, "t", 4), 4);
}

TEST_F(TenantQuotaTest, WithADiskTierTheTenantsOwnBlocksSpill) {
  TempDir dir;
  BlockStoreOptions o;
  o.host_capacity_bytes = 10 * kSize;
  o.tenant_host_quota_bytes = 4 * kSize;
  o.disk_path = dir.path();
  o.clock = &clock_;
  auto s = BlockStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Put(**s, Key("victim", i)).ok());
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(Put(**s, Key("hog", i)).ok()) << i;
  for (int i = 0; i < 4; ++i) {
    auto got = (*s)->Get(Key("victim", i));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tier, Tier::kHost);
  }
  EXPECT_EQ((*s)->Stats().counters.spills, 8u);
  EXPECT_EQ(Present(**s, "hog", 12), 12);  // 8 of them from disk
  // Reads do not promote the tenant's disk blocks past its quota.
  EXPECT_LE((*s)->Stats().host_used_bytes, 8 * kSize);
  for (const TierUsage& u : (*s)->Stats().usage) {
    if (u.tenant == "hog" && u.tier == Tier::kHost) {
      EXPECT_LE(u.payload_bytes, 4 * kSize);
    }
  }
}

}  // namespace
}  // namespace tqkv::storage
