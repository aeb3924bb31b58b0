#include "client/cpp/rendezvous.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tqkv::client {
namespace {

std::vector<RendezvousShard> Shards(int n) {
  std::vector<RendezvousShard> out;
  for (int i = 0; i < n; ++i) out.push_back({"10.1.0." + std::to_string(i) + ":50051", 1.0});
  return out;
}

std::string Key(int i) { return "chain-root-" + std::to_string(i); }

// The same values are asserted by client/python/sharded_tests/test_rendezvous.py:
// a Python and a C++ client must route alike.
TEST(RendezvousTest, GoldenValuesSharedWithPython) {
  EXPECT_EQ(RendezvousHash(""), 0xf52a15e9a9b5e89bULL);
  EXPECT_EQ(RendezvousHash("a"), 0x2c0bdbf481420f8ULL);
  EXPECT_EQ(RendezvousHash("tqkv"), 0xe9717778d468e490ULL);
  std::string bytes;
  for (int i = 0; i < 32; ++i) bytes.push_back(static_cast<char>(i));
  EXPECT_EQ(RendezvousHash(bytes), 0xa87fa126f653fd51ULL);
  const uint64_t k = RendezvousHash("chain-0"), s = RendezvousHash("10.0.0.1:50051");
  EXPECT_DOUBLE_EQ(RendezvousScore(k, s, 1.0), 0.41050248949562984);
  EXPECT_DOUBLE_EQ(RendezvousScore(k, s, 2.5), 1.0262562237390747);
  const std::vector<RendezvousShard> shards = {
      {"10.0.0.1:50051", 1.0}, {"10.0.0.2:50051", 1.0}, {"10.0.0.3:50051", 2.0}};
  std::string owners;
  for (int i = 0; i < 32; ++i)
    owners += std::to_string(RendezvousOwner("key-" + std::to_string(i), shards));
  EXPECT_EQ(owners, "22201220102202212212221121222012");
}

TEST(RendezvousTest, EmptySetHasNoOwner) { EXPECT_EQ(RendezvousOwner("k", {}), -1); }

TEST(RendezvousTest, OwnerDoesNotDependOnOrder) {
  std::vector<RendezvousShard> a = Shards(5), b(a.rbegin(), a.rend());
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(a[RendezvousOwner(Key(i), a)].name, b[RendezvousOwner(Key(i), b)].name);
}

TEST(RendezvousTest, KeysSpreadEvenlyAndByWeight) {
  constexpr int kKeys = 30000;
  std::vector<RendezvousShard> shards = Shards(3);
  std::vector<int> count(3);
  for (int i = 0; i < kKeys; ++i) ++count[RendezvousOwner(Key(i), shards)];
  for (int c : count) EXPECT_NEAR(c, kKeys / 3, kKeys / 3 * 0.05);
  shards[2].weight = 2.0;  // half the total weight
  count.assign(3, 0);
  for (int i = 0; i < kKeys; ++i) ++count[RendezvousOwner(Key(i), shards)];
  EXPECT_NEAR(count[2], kKeys / 2, kKeys / 2 * 0.05);
  EXPECT_NEAR(count[0], kKeys / 4, kKeys / 4 * 0.05);
}

// Adding a fourth shard moves about a quarter of the keys, all to it;
// removing one moves only its keys.
TEST(RendezvousTest, MembershipChangesMoveAboutOneNth) {
  constexpr int kKeys = 20000;
  const std::vector<RendezvousShard> three = Shards(3), four = Shards(4);
  int moved = 0;
  for (int i = 0; i < kKeys; ++i) {
    const std::string& before = three[RendezvousOwner(Key(i), three)].name;
    const std::string& after = four[RendezvousOwner(Key(i), four)].name;
    if (before == after) continue;
    ++moved;
    ASSERT_EQ(after, four[3].name) << "a key moved between old shards";
  }
  EXPECT_NEAR(moved, kKeys / 4, kKeys / 4 * 0.06);
  std::vector<RendezvousShard> without1 = {four[0], four[2], four[3]};
  for (int i = 0; i < kKeys; ++i) {
    const std::string& before = four[RendezvousOwner(Key(i), four)].name;
    const std::string& after = without1[RendezvousOwner(Key(i), without1)].name;
    if (before != four[1].name) {
      ASSERT_EQ(before, after) << "key " << i << " moved needlessly";
    }
  }
}

}  // namespace
}  // namespace tqkv::client
