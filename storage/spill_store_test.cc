#include "storage/spill_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

DiskBlockMeta MetaFor(absl::string_view payload, std::string parent = "p") {
  DiskBlockMeta m;
  m.size_bytes = payload.size();
  m.checksum = PayloadChecksum(payload);
  m.parent_hash = std::move(parent);
  m.accounting = {100, 11, 12, 13, 14, payload.size()};
  return m;
}

std::unique_ptr<SpillStore> OpenOrDie(const std::string& path) {
  auto store = SpillStore::Open({.path = path});
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

TEST(DiskBlockMeta, RoundTripsAndDetectsCorruption) {
  DiskBlockMeta m = MetaFor("payload", std::string(64, '\x01'));
  std::string enc = EncodeDiskBlockMeta(m);
  auto back = DecodeDiskBlockMeta(enc);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);
  for (size_t i = 0; i < enc.size(); ++i) {
    std::string bad = enc;
    bad[i] ^= 0x10;
    EXPECT_EQ(DecodeDiskBlockMeta(bad).status().code(), absl::StatusCode::kDataLoss) << i;
  }
  EXPECT_EQ(DecodeDiskBlockMeta(enc.substr(0, enc.size() - 1)).status().code(),
            absl::StatusCode::kDataLoss);
}

// Bytes of the directory's write-ahead logs (*.log).
uint64_t WalBytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".log") n += e.file_size();
  return n;
}

// A clean close writes the memtables out: the next Open replays no WAL,
// and the blocks and their count estimate are there.
TEST(SpillStore, ACleanCloseLeavesNoWalToReplay) {
  TempDir dir;
  std::vector<BlockKey> keys;
  const std::string payload(4096, 'w');
  const DiskBlockMeta meta = MetaFor(payload);
  {
    auto store = OpenOrDie(dir.path());
    for (int i = 0; i < 256; ++i) keys.push_back({"t", 1, "block-" + std::to_string(i)});
    std::vector<SpillStore::BlockWrite> writes;
    for (const BlockKey& k : keys) writes.push_back({&k, &meta, payload});
    ASSERT_TRUE(store->Apply(writes, {}, /*sync=*/true).ok());
    ASSERT_GT(WalBytes(dir.path()), keys.size() * payload.size());  // in the WAL, not yet in tables
  }
  EXPECT_LT(WalBytes(dir.path()), 4096u);
  auto store = OpenOrDie(dir.path());
  EXPECT_EQ(store->EstimatedBlocks(), keys.size());
  for (const BlockKey& k : {keys.front(), keys.back()}) {
    auto got = store->ReadPayload(k);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)->view(), payload);
  }
}

// Removed blocks leave garbage in blob files that also hold live ones (a
// hot block among deleted ones); collecting it rewrites the live payloads
// and deletes the old files, and every live block reads back exactly.
TEST(SpillStore, CollectingBlobGarbageFreesTheSpaceOfRemovedBlocks) {
  TempDir dir;
  const SpillStoreOptions options{.path = dir.path(), .blob_file_bytes = 1 << 20};
  constexpr int kBlocks = 64, kEvery = 16;  // 64 KiB payloads, ~15 to a blob file
  std::vector<BlockKey> keys;
  std::vector<std::string> payloads;
  std::vector<DiskBlockMeta> metas;
  for (int i = 0; i < kBlocks; ++i) {
    keys.push_back({"t", 1, "block-" + std::to_string(i)});
    payloads.push_back(std::string(64 << 10, static_cast<char>('a' + i % 26)) + std::to_string(i));
  }
  for (const std::string& p : payloads) metas.push_back(MetaFor(p));
  std::vector<BlockKey> removed;
  for (int i = 0; i < kBlocks; ++i)
    if (i % kEvery != 0) removed.push_back(keys[i]);
  for (int step = 0; step < 2; ++step) {  // write, then remove; each closed (flushed) after
    auto store = SpillStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    if (step == 0) {
      std::vector<SpillStore::BlockWrite> writes;
      for (int i = 0; i < kBlocks; ++i) writes.push_back({&keys[i], &metas[i], payloads[i]});
      ASSERT_TRUE((*store)->Apply(writes, {}, /*sync=*/true).ok());
    } else {
      ASSERT_TRUE((*store)->Apply({}, removed, /*sync=*/true).ok());
    }
  }
  auto store = SpillStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  const uint64_t written = (*store)->BlobFileSpace().file_bytes;
  EXPECT_GT(written, uint64_t{kBlocks} * (64 << 10));
  // Garbage is known once a compaction has dropped the removed keys; a
  // collection with none known yet relocates nothing.
  ASSERT_TRUE((*store)->CollectBlobGarbage(1.0).ok());
  const SpillStore::BlobSpace before = (*store)->BlobFileSpace();
  EXPECT_GT(before.garbage_bytes, 16u * (64 << 10));  // files with a live block keep their removed ones
  ASSERT_TRUE((*store)->CollectBlobGarbage(1.0).ok());
  const SpillStore::BlobSpace after = (*store)->BlobFileSpace();
  EXPECT_EQ(after.garbage_bytes, 0u);
  EXPECT_LT(after.file_bytes, uint64_t{kBlocks / kEvery + 1} * (64 << 10) + 4096);
  for (int i = 0; i < kBlocks; ++i) {
    auto got = (*store)->ReadPayload(keys[i]);
    if (i % kEvery != 0) {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << i;
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)->view(), payloads[i]);
  }
}

// A shutdown cancels garbage collection: a collection afterwards is
// refused at once, and the store goes on serving.
TEST(SpillStore, CancelledBlobGarbageCollectionIsRefused) {
  TempDir dir;
  auto store = OpenOrDie(dir.path());
  const BlockKey key{"t", 1, "k"};
  const std::string payload(8192, 'p');
  const DiskBlockMeta meta = MetaFor(payload);
  ASSERT_TRUE(store->Apply({{&key, &meta, payload}}, {}, /*sync=*/false).ok());
  ASSERT_TRUE(store->CollectBlobGarbage(1.0).ok());
  store->CancelBlobGarbageCollection();
  EXPECT_EQ(store->CollectBlobGarbage(1.0).code(), absl::StatusCode::kCancelled);
  auto got = store->ReadPayload(key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->view(), payload);
}

// Collecting rewrites live payloads: refused while that would leave less
// than the free space the store keeps.
TEST(SpillStore, BlobGarbageCollectionKeepsTheFreeSpace) {
  TempDir dir;
  const BlockKey key{"t", 1, "k"};
  const std::string payload(8192, 'p');
  const DiskBlockMeta meta = MetaFor(payload);
  {
    auto store = OpenOrDie(dir.path());
    ASSERT_TRUE(store->Apply({{&key, &meta, payload}}, {}, /*sync=*/true).ok());
  }
  auto store = SpillStore::Open({.path = dir.path(), .min_free_bytes = uint64_t{1} << 62});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->CollectBlobGarbage(1.0).code(), absl::StatusCode::kResourceExhausted);
  auto got = (*store)->ReadPayload(key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->view(), payload);
}

TEST(SpillStore, OpenRejectsEmptyPath) {
  EXPECT_EQ(SpillStore::Open({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SpillStore, WritesReadsDeletesAndSurvivesReopen) {
  TempDir dir;
  BlockKey a{"t", 1, "a"}, b{"t", 2, "b"}, c{"u", 1, "c"};
  std::string pa = "alpha payload", pb(100000, 'b'), pc;  // pc: empty payload
  pb[777] = 'x';
  DiskBlockMeta ma = MetaFor(pa), mb = MetaFor(pb, ""), mc = MetaFor(pc);
  {
    auto store = OpenOrDie(dir.path());
    std::vector<SpillStore::BlockWrite> writes = {{&a, &ma, pa}, {&b, &mb, pb}, {&c, &mc, pc}};
    ASSERT_TRUE(store->Apply(writes, {}, /*sync=*/true).ok());
    auto got = store->ReadPayload(b);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)->view(), pb);
    std::vector<BlockKey> del = {a};
    ASSERT_TRUE(store->Apply({}, del, /*sync=*/false).ok());
    EXPECT_EQ(store->ReadPayload(a).status().code(), absl::StatusCode::kNotFound);
  }
  auto store = OpenOrDie(dir.path());
  std::map<std::string, DiskBlockMeta> seen;
  std::vector<std::string> corrupt;
  ASSERT_TRUE(store
                  ->ScanBlocks([&](BlockKey k, DiskBlockMeta m) { return seen.emplace(DebugString(k), m).second; },
                               &corrupt)
                  .ok());
  EXPECT_TRUE(corrupt.empty());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[DebugString(b)], mb);
  EXPECT_EQ(seen[DebugString(c)], mc);
  auto got = store->ReadPayload(c);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->view(), "");
}

TEST(SpillStore, ScanReportsCorruptMetaAndDeletesIt) {
  TempDir dir;
  auto store = OpenOrDie(dir.path());
  BlockKey a{"t", 1, "a"}, b{"t", 1, "b"};
  DiskBlockMeta m = MetaFor("x");
  std::vector<SpillStore::BlockWrite> writes = {{&a, &m, "x"}, {&b, &m, "x"}};
  ASSERT_TRUE(store->Apply(writes, {}, false).ok());
  ASSERT_TRUE(store->OverwriteMetaForTest(b, "garbage").ok());
  int good = 0;
  std::vector<std::string> corrupt;
  ASSERT_TRUE(store->ScanBlocks([&](BlockKey, DiskBlockMeta) { return ++good > 0; }, &corrupt).ok());
  EXPECT_EQ(good, 1);
  ASSERT_EQ(corrupt.size(), 1u);
  EXPECT_EQ(corrupt[0], EncodeBlockKey(b));
  ASSERT_TRUE(store->DeleteEncodedKeys(corrupt).ok());
  EXPECT_FALSE(store->HasPayloadForTest(b));
  EXPECT_TRUE(store->HasPayloadForTest(a));
}

TEST(SpillStore, ModelRecordsPersist) {
  TempDir dir;
  {
    auto store = OpenOrDie(dir.path());
    ASSERT_TRUE(store->PutModelRecord("t2", 5, "five").ok());
    ASSERT_TRUE(store->PutModelRecord("t1", 300, "three hundred").ok());
    ASSERT_TRUE(store->PutModelRecord("t1", 2, std::string("two\0", 4)).ok());
    ASSERT_TRUE(store->PutModelRecord("t1", 9, "nine").ok());
    ASSERT_TRUE(store->DeleteModelRecord("t1", 9).ok());
    EXPECT_EQ(store->GetModelRecord("t1", 9).status().code(), absl::StatusCode::kNotFound);
  }
  auto store = OpenOrDie(dir.path());
  auto rec = store->GetModelRecord("t1", 2);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(*rec, std::string("two\0", 4));
  auto list = store->ListModelRecords();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].tenant, "t1");
  EXPECT_EQ((*list)[0].model_id, 2u);
  EXPECT_EQ((*list)[1].model_id, 300u);
  EXPECT_EQ((*list)[1].record, "three hundred");
  EXPECT_EQ((*list)[2].tenant, "t2");
}

}  // namespace
}  // namespace tqkv::storage
