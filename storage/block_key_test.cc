#include "storage/block_key.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/container/flat_hash_set.h"

namespace tqkv::storage {
namespace {

TEST(BlockKey, EncodeDecodeRoundTrips) {
  for (const std::string& tenant : {std::string(), std::string("acme"), std::string(200, 'x'),
                                   std::string("a\0b", 3)}) {
    for (uint64_t model : {uint64_t{0}, uint64_t{7}, ~uint64_t{0}}) {
      for (size_t hlen : {size_t{1}, size_t{32}, size_t{64}}) {
        BlockKey k{tenant, model, std::string(hlen, '\xab')};
        k.block_hash[0] = '\0';
        absl::StatusOr<BlockKey> back = DecodeBlockKey(EncodeBlockKey(k));
        ASSERT_TRUE(back.ok()) << back.status();
        EXPECT_EQ(*back, k);
      }
    }
  }
}

TEST(BlockKey, LayoutIsDocumented) {
  BlockKey k{"ab", 0x0102030405060708ULL, "h"};
  EXPECT_EQ(EncodeBlockKey(k), std::string("\x02"
                                           "ab\x01\x02\x03\x04\x05\x06\x07\x08h",
                                           12));
  EXPECT_EQ(EncodeBlockKey(k).rfind(EncodeModelPrefix("ab", 0x0102030405060708ULL), 0), 0u);
}

TEST(BlockKey, TenantsDoNotShareKeyPrefixes) {
  // Without the length prefix "a"+model could collide with "ab"+model.
  BlockKey k1{"a", 1, "bc"};
  BlockKey k2{"ab", 1, "c"};
  EXPECT_NE(EncodeBlockKey(k1), EncodeBlockKey(k2));
  EXPECT_NE(EncodeBlockKey(k1).rfind(EncodeModelPrefix("ab", 1), 0), 0u);
}

TEST(BlockKey, ModelIdsSortNumerically) {
  EXPECT_LT(EncodeModelPrefix("t", 255), EncodeModelPrefix("t", 256));
}

TEST(BlockKey, ValidationRejectsBadSizes) {
  EXPECT_EQ(ValidateBlockKey({"t", 1, ""}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateBlockKey({"t", 1, std::string(65, 'h')}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateBlockKey({std::string(257, 't'), 1, "h"}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateBlockKey({std::string(256, 't'), 1, std::string(64, 'h')}).ok());
}

TEST(BlockKey, DecodeRejectsMalformedInput) {
  EXPECT_FALSE(DecodeBlockKey("").ok());
  EXPECT_FALSE(DecodeBlockKey(std::string("\x05" "ab", 3)).ok());          // truncated tenant
  EXPECT_FALSE(DecodeBlockKey(std::string("\x01" "a1234567", 9)).ok());    // no hash
  EXPECT_FALSE(DecodeBlockKey(std::string("\xff\xff\xff\xff\xff", 5)).ok());  // bad varint
}

TEST(BlockKey, HashesAndComparesAllFields) {
  absl::flat_hash_set<BlockKey> set;
  set.insert({"t", 1, "h"});
  set.insert({"t", 2, "h"});
  set.insert({"u", 1, "h"});
  set.insert({"t", 1, "g"});
  set.insert({"t", 1, "h"});
  EXPECT_EQ(set.size(), 4u);
}

TEST(BlockAccounting, AddsAndSubtractsEveryField) {
  BlockAccounting a{1, 2, 3, 4, 5, 6};
  BlockAccounting b{10, 20, 30, 40, 50, 60};
  BlockAccounting sum = a;
  sum += b;
  EXPECT_EQ(sum, (BlockAccounting{11, 22, 33, 44, 55, 66}));
  sum -= a;
  EXPECT_EQ(sum, b);
}

TEST(Tier, NamesAreStable) {
  EXPECT_STREQ(TierName(Tier::kGpu), "gpu");
  EXPECT_STREQ(TierName(Tier::kHost), "host");
  EXPECT_STREQ(TierName(Tier::kDisk), "disk");
}

}  // namespace
}  // namespace tqkv::storage
