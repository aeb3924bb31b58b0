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
  EXPECT_EQ(back->at.segment, 0u);  // format 2: the payload in block_data
  for (size_t i = 0; i < enc.size(); ++i) {
    std::string bad = enc;
    bad[i] ^= 0x10;
    EXPECT_EQ(DecodeDiskBlockMeta(bad).status().code(), absl::StatusCode::kDataLoss) << i;
  }
  EXPECT_EQ(DecodeDiskBlockMeta(enc.substr(0, enc.size() - 1)).status().code(),
            absl::StatusCode::kDataLoss);

  // With a segment location: format 4 (5 sealed), the location back.
  const SegmentLocation at{7, 123456789012, 4242};
  for (bool sealed : {false, true}) {
    m.sealed = sealed;
    m.at = at;
    enc = EncodeDiskBlockMeta(m);
    back = DecodeDiskBlockMeta(enc);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->version, sealed ? kSealedSegmentDiskFormatVersion : kSegmentDiskFormatVersion);
    EXPECT_EQ(back->sealed, sealed);
    EXPECT_EQ(back->at, at);
    back->version = m.version;
    EXPECT_EQ(*back, m);
    for (size_t i = 0; i < enc.size(); ++i) {
      std::string bad = enc;
      bad[i] ^= 0x10;
      EXPECT_EQ(DecodeDiskBlockMeta(bad).status().code(), absl::StatusCode::kDataLoss) << i;
    }
  }
}

// Bytes of the directory's write-ahead logs (*.log).
uint64_t WalBytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".log") n += e.file_size();
  return n;
}

// A payload is written once, into a segment file: the WAL carries the
// meta only. A clean close writes the memtables out: the next Open replays
// no WAL, and the blocks and their count estimate are there.
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
    ASSERT_GT(WalBytes(dir.path()), 0u);  // the meta, not yet in tables
    ASSERT_LT(WalBytes(dir.path()), keys.size() * 256);
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

// Blocks 0, every, 2 * every ... read back exactly; the rest are absent.
void ExpectEveryNthOnly(SpillStore& store, const std::vector<BlockKey>& keys, const std::vector<std::string>& payloads,
                        int every) {
  for (size_t i = 0; i < keys.size(); ++i) {
    auto got = store.ReadPayload(keys[i]);
    if (i % every != 0) {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << i;
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)->view(), payloads[i]);
  }
}

// Removed blocks leave garbage in segment files that also hold live ones
// (a hot block among deleted ones). Garbage is known once a scan of every
// meta has run; collecting it moves the live payloads and deletes the old
// files, and every live block reads back exactly.
TEST(SpillStore, CollectingGarbageFreesTheSpaceOfRemovedBlocks) {
  TempDir dir;
  const SpillStoreOptions options{.path = dir.path(), .segment_bytes = 1 << 20};
  constexpr int kBlocks = 64, kEvery = 16;  // 64 KiB payloads, 16 to a segment file
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
  for (int step = 0; step < 2; ++step) {  // write, then remove; each closed after
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
  const uint64_t written = (*store)->PayloadFileSpace().file_bytes;
  EXPECT_GT(written, uint64_t{kBlocks} * (64 << 10));
  // Before a scan, no garbage is known and a collection moves nothing.
  EXPECT_EQ((*store)->PayloadFileSpace().garbage_bytes, 0u);
  ASSERT_TRUE((*store)->CollectGarbage(1.0).ok());
  EXPECT_EQ((*store)->PayloadFileSpace().file_bytes, written);
  ASSERT_TRUE((*store)->ScanBlocks([](BlockKey, DiskBlockMeta) { return true; }, nullptr).ok());
  const SpillStore::PayloadSpace before = (*store)->PayloadFileSpace();
  EXPECT_GT(before.garbage_bytes, uint64_t{kBlocks - kBlocks / kEvery} * (64 << 10));
  ASSERT_TRUE((*store)->CollectGarbage(1.0).ok());
  const SpillStore::PayloadSpace after = (*store)->PayloadFileSpace();
  EXPECT_EQ(after.garbage_bytes, 0u);
  EXPECT_LT(after.file_bytes, uint64_t{kBlocks / kEvery} * ((64 << 10) + 256));
  for (int reopen = 0; reopen < 2; ++reopen) {
    ExpectEveryNthOnly(**store, keys, payloads, kEvery);
    store->reset();
    store = SpillStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
  }
}

// Writes and deletes made while a scan runs count in each file's live
// bytes as well as what the scan saw: a block deleted mid-scan is garbage.
TEST(SpillStore, GarbageCountsDeletesMadeDuringTheScan) {
  TempDir dir;
  const SpillStoreOptions options{.path = dir.path(), .segment_bytes = 1 << 10};
  std::vector<BlockKey> keys;
  const std::string payload(4096, 'g');
  const DiskBlockMeta meta = MetaFor(payload);
  for (int i = 0; i < 8; ++i) keys.push_back({"t", 1, "block-" + std::to_string(i)});
  {
    auto store = SpillStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<SpillStore::BlockWrite> writes;
    for (const BlockKey& k : keys) writes.push_back({&k, &meta, payload});
    ASSERT_TRUE((*store)->Apply(writes, {}, /*sync=*/true).ok());  // one segment file each
  }
  auto store = SpillStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  bool deleted = false;
  ASSERT_TRUE((*store)
                  ->ScanBlocks(
                      [&](BlockKey, DiskBlockMeta) {
                        if (!deleted) EXPECT_TRUE((*store)->Apply({}, {keys[7], keys[6]}, false).ok());
                        deleted = true;
                        return true;
                      },
                      nullptr)
                  .ok());
  const SpillStore::PayloadSpace space = (*store)->PayloadFileSpace();
  const uint64_t record = space.file_bytes / keys.size();
  EXPECT_EQ(space.garbage_bytes, 2 * record);
  ASSERT_TRUE((*store)->CollectGarbage(1.0).ok());
  EXPECT_EQ((*store)->PayloadFileSpace().file_bytes, 6 * record);
  for (int i = 0; i < 6; ++i) {
    auto got = (*store)->ReadPayload(keys[i]);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)->view(), payload);
  }
}

// Records of the earlier format (meta version 2, payload in block_data's
// blob files) are read, and removing them leaves blob file garbage that
// CollectGarbage compacts away.
TEST(SpillStore, ReadsAndCollectsBlockDataRecords) {
  TempDir dir;
  const SpillStoreOptions options{.path = dir.path(), .blob_file_bytes = 1 << 20};
  constexpr int kBlocks = 64, kEvery = 16;  // 64 KiB payloads, ~15 to a blob file
  std::vector<BlockKey> keys;
  std::vector<std::string> payloads;
  for (int i = 0; i < kBlocks; ++i) {
    keys.push_back({"t", 1, "block-" + std::to_string(i)});
    payloads.push_back(std::string(64 << 10, static_cast<char>('a' + i % 26)) + std::to_string(i));
  }
  std::vector<BlockKey> removed;
  for (int i = 0; i < kBlocks; ++i)
    if (i % kEvery != 0) removed.push_back(keys[i]);
  for (int step = 0; step < 2; ++step) {  // write, then remove; each closed (flushed) after
    auto store = SpillStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    if (step == 0) {
      for (int i = 0; i < kBlocks; ++i) {
        ASSERT_TRUE((*store)->OverwriteMetaForTest(keys[i], EncodeDiskBlockMeta(MetaFor(payloads[i]))).ok());
        ASSERT_TRUE((*store)->OverwritePayloadForTest(keys[i], payloads[i]).ok());  // into block_data
      }
    } else {
      ASSERT_TRUE((*store)->Apply({}, removed, /*sync=*/true).ok());
    }
  }
  auto store = SpillStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_GT((*store)->PayloadFileSpace().file_bytes, uint64_t{kBlocks} * (64 << 10));
  // Blob garbage is known once a compaction has dropped the removed keys;
  // a collection with none known yet relocates nothing.
  ASSERT_TRUE((*store)->CollectGarbage(1.0).ok());
  const SpillStore::PayloadSpace before = (*store)->PayloadFileSpace();
  EXPECT_GT(before.garbage_bytes, 16u * (64 << 10));  // files with a live block keep their removed ones
  ASSERT_TRUE((*store)->CollectGarbage(1.0).ok());
  const SpillStore::PayloadSpace after = (*store)->PayloadFileSpace();
  EXPECT_EQ(after.garbage_bytes, 0u);
  EXPECT_LT(after.file_bytes, uint64_t{kBlocks / kEvery + 1} * (64 << 10) + 4096);
  ExpectEveryNthOnly(**store, keys, payloads, kEvery);
  // Rewriting one moves it to a segment file and deletes its block_data payload.
  const DiskBlockMeta meta = MetaFor(payloads[0]);
  ASSERT_TRUE((*store)->Apply({{&keys[0], &meta, payloads[0]}}, {}, false).ok());
  auto meta_back = (*store)->ReadMeta(keys[0]);
  ASSERT_TRUE(meta_back.ok()) << meta_back.status();
  EXPECT_EQ(meta_back->version, kSegmentDiskFormatVersion);
  auto got = (*store)->ReadPayload(keys[0]);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->view(), payloads[0]);
}

// A shutdown cancels garbage collection: a collection afterwards is
// refused at once, and the store goes on serving.
TEST(SpillStore, CancelledGarbageCollectionIsRefused) {
  TempDir dir;
  auto store = OpenOrDie(dir.path());
  const BlockKey key{"t", 1, "k"};
  const std::string payload(8192, 'p');
  const DiskBlockMeta meta = MetaFor(payload);
  ASSERT_TRUE(store->Apply({{&key, &meta, payload}}, {}, /*sync=*/false).ok());
  ASSERT_TRUE(store->CollectGarbage(1.0).ok());
  store->CancelGarbageCollection();
  EXPECT_EQ(store->CollectGarbage(1.0).code(), absl::StatusCode::kCancelled);
  auto got = store->ReadPayload(key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->view(), payload);
}

// Collecting rewrites live payloads: refused while that would leave less
// than the free space the store keeps.
TEST(SpillStore, GarbageCollectionKeepsTheFreeSpace) {
  TempDir dir;
  const BlockKey key{"t", 1, "k"}, gone{"t", 1, "gone"};
  const std::string payload(8192, 'p');
  const DiskBlockMeta meta = MetaFor(payload);
  {
    auto store = OpenOrDie(dir.path());
    ASSERT_TRUE(store->Apply({{&key, &meta, payload}, {&gone, &meta, payload}}, {}, /*sync=*/true).ok());
  }
  auto store = SpillStore::Open({.path = dir.path(), .min_free_bytes = uint64_t{1} << 62});
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Apply({}, {gone}, /*sync=*/true).ok());  // deletes need no room
  ASSERT_TRUE((*store)->ScanBlocks([](BlockKey, DiskBlockMeta) { return true; }, nullptr).ok());
  ASSERT_GT((*store)->PayloadFileSpace().garbage_bytes, payload.size());
  EXPECT_EQ((*store)->CollectGarbage(1.0).code(), absl::StatusCode::kResourceExhausted);
  auto got = (*store)->ReadPayload(key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->view(), payload);
}

// Apply says where each payload went; ReadPayload with that hint reads it
// without the meta (here damaged, so a read through the meta fails), and
// a hint into a collected file falls back to the meta.
TEST(SpillStore, APlacementHintReadsWithoutTheMeta) {
  TempDir dir;
  const SpillStoreOptions options{.path = dir.path()};  // a and b in one segment file
  const BlockKey a{"t", 1, "a"}, b{"t", 1, "b"};
  const std::string pa(4096, 'a'), pb(4096, 'b');
  const DiskBlockMeta ma = MetaFor(pa), mb = MetaFor(pb);
  std::vector<SegmentLocation> placed;
  {
    auto store = SpillStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Apply({{&a, &ma, pa}, {&b, &mb, pb}}, {}, /*sync=*/true, &placed).ok());
    ASSERT_EQ(placed.size(), 2u);
    EXPECT_EQ(placed[0].bytes, pa.size());
    ASSERT_TRUE((*store)->OverwriteMetaForTest(a, "garbage").ok());
    EXPECT_EQ((*store)->ReadPayload(a).status().code(), absl::StatusCode::kDataLoss);
    auto got = (*store)->ReadPayload(a, placed[0]);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)->view(), pa);
    ASSERT_TRUE((*store)->DeleteEncodedKeys({EncodeBlockKey(a)}).ok());
  }
  auto store = SpillStore::Open(options);  // the file closed: collectable
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->ScanBlocks([](BlockKey, DiskBlockMeta) { return true; }, nullptr).ok());
  // Half the file is garbage (a's meta is gone): b moves and the file goes.
  const uint64_t before = (*store)->PayloadFileSpace().file_bytes;
  ASSERT_TRUE((*store)->CollectGarbage(1.0).ok());
  EXPECT_LT((*store)->PayloadFileSpace().file_bytes, before);
  auto got = (*store)->ReadPayload(b, placed[1]);  // its file is gone: read through the meta
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->view(), pb);
  auto meta = (*store)->ReadMeta(b);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_NE(meta->at.segment, placed[1].segment);
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
  mb.version = mc.version = kSegmentDiskFormatVersion;  // as read back
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
