// Encryption at rest through BlockStore and its RocksDB tier: sealed spills
// read back bit-identical, no payload's plaintext reaches the database's
// files, a wrong or missing key is FAILED_PRECONDITION and keeps the block,
// an edited sealed record is DATA_LOSS, and records written in clear are
// still read by a store with a key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "storage/at_rest_cipher.h"
#include "storage/block_store.h"
#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

constexpr char kKey1[] = "1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
constexpr char kKey1Other[] = "1 ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
constexpr size_t kSize = 64 << 10;

BlockKey Key(int i) { return {"acme", 7, "h" + std::to_string(i)}; }

class BlockStoreAtRestTest : public ::testing::Test {
 protected:
  std::unique_ptr<BlockStore> Open(const std::string& keys) {
    cipher_.reset();
    if (!keys.empty()) cipher_ = *AtRestCipher::FromString(keys);
    BlockStoreOptions o;
    o.host_capacity_bytes = 16 * kSize;
    o.disk_path = dir_.path();
    o.at_rest_cipher = cipher_.get();
    auto s = BlockStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Durable puts of blocks [from, to).
  void Put(BlockStore& s, int from, int to) {
    for (int i = from; i < to; ++i)
      ASSERT_TRUE(s.Put(Key(i), "", TestAccounting(kSize), TestPayload(Key(i), kSize), {.durable = true}).ok());
  }

  // How many of blocks [from, to) have a 32-byte run of their payload in
  // any file of the database (WAL, tables, manifest).
  int PlaintextOnDisk(int from, int to) {
    std::string all;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_.path())) {
      if (!e.is_regular_file()) continue;
      std::ifstream in(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      all += ss.str();
    }
    int found = 0;
    for (int i = from; i < to; ++i) {
      const std::string p = TestPayload(Key(i), kSize);
      for (size_t at : {size_t{0}, kSize / 2, kSize - 32})
        if (all.find(p.substr(at, 32)) != std::string::npos) {
          ++found;
          break;
        }
    }
    return found;
  }

  void ExpectBlock(BlockStore& s, int i) {
    auto got = s.Get(Key(i));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tier, Tier::kDisk);
    EXPECT_TRUE(got->payload->view() == TestPayload(Key(i), kSize)) << i;
  }

  TempDir dir_;
  std::unique_ptr<AtRestCipher> cipher_;
};

TEST_F(BlockStoreAtRestTest, SealedSpillsReadBackBitIdenticalAndNoPlaintextIsOnDisk) {
  auto s = Open(kKey1);
  Put(*s, 0, 8);
  s->Sync().IgnoreError();
  s.reset();
  EXPECT_EQ(PlaintextOnDisk(0, 8), 0);
  s = Open(kKey1);
  for (int i = 0; i < 8; ++i) ExpectBlock(*s, i);
}

TEST_F(BlockStoreAtRestTest, WithoutAKeyThePayloadsAreOnDiskInClear) {
  auto s = Open("");
  Put(*s, 0, 4);
  s.reset();
  EXPECT_EQ(PlaintextOnDisk(0, 4), 4);  // what the sealed test's scan would find
}

TEST_F(BlockStoreAtRestTest, AWrongOrMissingKeyIsFailedPreconditionAndKeepsTheBlock) {
  auto s = Open(kKey1);
  Put(*s, 0, 2);
  s.reset();
  s = Open(kKey1Other);
  auto wrong = s->Get(Key(0));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition) << wrong.status();
  EXPECT_NE(wrong.status().message().find("not the key this record was sealed with"), std::string::npos);
  s.reset();
  s = Open("");
  auto none = s->Get(Key(1));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
  EXPECT_NE(none.status().message().find("encrypted at rest"), std::string::npos);
  s.reset();
  s = Open(kKey1);
  ExpectBlock(*s, 0);
  ExpectBlock(*s, 1);
}

TEST_F(BlockStoreAtRestTest, ClearRecordsStillReadAndNewOnesAreSealed) {
  auto s = Open("");
  Put(*s, 0, 2);
  s.reset();
  s = Open(kKey1);
  ExpectBlock(*s, 0);
  Put(*s, 2, 4);
  s.reset();
  EXPECT_EQ(PlaintextOnDisk(2, 4), 0);
  s = Open(kKey1);
  for (int i = 0; i < 4; ++i) ExpectBlock(*s, i);
}

TEST(SpillStoreAtRestTest, AnEditedSealedRecordIsDataLoss) {
  TempDir dir;
  auto cipher = *AtRestCipher::FromString(kKey1);
  auto spill = SpillStore::Open({.path = dir.path(), .cipher = cipher.get()});
  ASSERT_TRUE(spill.ok()) << spill.status();
  const BlockKey k = Key(0);
  const std::string payload = TestPayload(k, 1000);
  DiskBlockMeta meta{.size_bytes = payload.size(), .checksum = BlockChecksum(k, payload)};
  meta.accounting = TestAccounting(payload.size());
  SpillStore::BlockWrite w{&k, &meta, payload};
  ASSERT_TRUE((*spill)->Apply({w}, {}, false).ok());
  auto back = (*spill)->ReadPayload(k);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->view(), payload);
  // Another record's sealed bytes under this key, and edited bytes.
  const std::string other = *cipher->Seal("acme", EncodeBlockKey(Key(1)), payload);
  ASSERT_TRUE((*spill)->OverwritePayloadForTest(k, other).ok());
  EXPECT_EQ((*spill)->ReadPayload(k).status().code(), absl::StatusCode::kDataLoss);
  std::string edited = *cipher->Seal("acme", EncodeBlockKey(k), payload);
  edited[100] ^= 0x40;
  ASSERT_TRUE((*spill)->OverwritePayloadForTest(k, edited).ok());
  EXPECT_EQ((*spill)->ReadPayload(k).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tqkv::storage
