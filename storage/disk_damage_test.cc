// Damage to the disk tier's files, found when the store opens: a torn
// write at the end of the WAL (a crash during an unacknowledged write) is
// dropped; any other damage to the WAL, the MANIFEST or the meta table
// fails Open with DATA_LOSS naming the repair path, and tqkv-disk-repair
// (the real binary) then keeps what is intact; damage to a segment file,
// or its loss, is DATA_LOSS for the blocks it hits. Records of the earlier
// format (payloads in block_data's table and blob files) come through a
// rebuild too, their payloads read back from the blob files. In every case
// a block reads back with exactly its bytes or not at all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "storage/at_rest_cipher.h"
#include "storage/block_store.h"
#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

namespace fs = std::filesystem;
constexpr size_t kBlock = 4096;
constexpr int kBlocks = 40;

BlockKey Key(int i) { return {"acme", 7, "h" + std::to_string(i)}; }

absl::StatusOr<std::unique_ptr<BlockStore>> Open(const std::string& dir, const AtRestCipher* cipher = nullptr) {
  BlockStoreOptions o;
  o.host_capacity_bytes = 64 << 20;
  o.disk_path = dir;
  o.at_rest_cipher = cipher;
  return BlockStore::Open(o);
}

absl::Status PutDurable(BlockStore& s, int i) {
  return s.Put(Key(i), "", TestAccounting(kBlock), TestPayload(Key(i), kBlock), {.durable = true})
      .status();
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteFile(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Files of `dir` whose name starts with `prefix` and ends with `suffix`.
std::vector<fs::path> Files(const std::string& dir, const std::string& prefix,
                            const std::string& suffix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() >= prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void FlipByte(const fs::path& p, size_t at) {
  std::string bytes = ReadFile(p);
  ASSERT_LT(at, bytes.size()) << p;
  bytes[at] ^= 0x5a;
  WriteFile(p, bytes);
}

// Flips a byte in the middle of `dir`'s current MANIFEST.
void DamageManifest(const std::string& dir) {
  const fs::path manifest = Files(dir, "MANIFEST-", "").back();
  FlipByte(manifest, fs::file_size(manifest) / 2);
}

// The table file of a column family (its name is in the file's properties).
fs::path TableOf(const std::string& dir, const std::string& cf) {
  for (const fs::path& p : Files(dir, "", ".sst")) {
    if (ReadFile(p).find(cf) != std::string::npos) return p;
  }
  ADD_FAILURE() << "no table file of " << cf << " in " << dir;
  return {};
}

struct Census {
  int exact = 0, absent = 0, data_loss = 0, wrong = 0;
};

// Reads every block: each must be exact, absent or DATA_LOSS (then absent).
Census Read(BlockStore& s) {
  Census c;
  for (int i = 0; i < kBlocks; ++i) {
    auto got = s.Get(Key(i));
    if (got.ok()) {
      (got->payload->view() == TestPayload(Key(i), kBlock) ? c.exact : c.wrong)++;
    } else if (absl::IsNotFound(got.status())) {
      c.absent++;
    } else {
      EXPECT_TRUE(absl::IsDataLoss(got.status())) << i << ": " << got.status();
      EXPECT_TRUE(absl::IsNotFound(s.Get(Key(i)).status())) << i;
      c.data_loss++;
    }
  }
  return c;
}

// Runs the repair binary on `dir` (with `flags`); returns its exit status
// and output.
int Repair(const std::string& dir, std::string* output, const std::string& flags = "") {
  const std::string cmd = "storage/tqkv-disk-repair " + flags + " '" + dir + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) *output += buf;
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void ExpectRepairPath(const absl::Status& s, const std::string& dir) {
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("disk tier at " + dir + " is damaged"), std::string::npos) << s;
  EXPECT_NE(s.message().find("tqkv-disk-repair " + dir), std::string::npos) << s;
}

class DiskDamageTest : public ::testing::Test {
 protected:
  // kBlocks durable blocks in db_, closed cleanly, then opened and closed
  // again so that their meta sits in table files, not only in the WAL.
  void WriteTables() {
    {
      auto s = Open(db_);
      ASSERT_TRUE(s.ok()) << s.status();
      for (int i = 0; i < kBlocks; ++i) ASSERT_TRUE(PutDurable(**s, i).ok());
      ASSERT_TRUE((*s)->PutModelRecord("acme", 7, "model").ok());
    }
    ASSERT_TRUE(Open(db_).ok());
    ASSERT_EQ(Files(db_, "", ".sst").size(), 2u);  // meta, model records
    ASSERT_EQ(Files(db_ + "/segments", "", ".seg").size(), 1u);
  }
  // The same blocks as the earlier format kept them: meta version 2 (3
  // sealed with `cipher`), payloads in block_data, so in table and blob
  // files once closed and reopened.
  void WriteBlockDataTables(const AtRestCipher* cipher = nullptr) {
    {
      auto spill = SpillStore::Open({.path = db_});
      ASSERT_TRUE(spill.ok()) << spill.status();
      for (int i = 0; i < kBlocks; ++i) {
        const std::string payload = TestPayload(Key(i), kBlock);
        DiskBlockMeta m;
        m.size_bytes = kBlock;
        m.checksum = BlockChecksum(Key(i), payload);
        m.accounting = TestAccounting(kBlock);
        m.sealed = cipher != nullptr;
        ASSERT_TRUE((*spill)->OverwriteMetaForTest(Key(i), EncodeDiskBlockMeta(m)).ok());
        std::string stored = payload;
        if (cipher != nullptr) stored = *cipher->Seal(Key(i).tenant, EncodeBlockKey(Key(i)), payload);
        ASSERT_TRUE((*spill)->OverwritePayloadForTest(Key(i), stored).ok());
      }
      ASSERT_TRUE((*spill)->PutModelRecord("acme", 7, "model").ok());
    }
    ASSERT_TRUE(SpillStore::Open({.path = db_}).ok());
    ASSERT_EQ(Files(db_, "", ".sst").size(), 3u);  // meta, payloads, model records
    ASSERT_EQ(Files(db_, "", ".blob").size(), 1u);
  }
  // What a kill -9 leaves after kBlocks durable puts: the directory copied
  // while the store is open, its WAL holding every block. torn_bytes > 0
  // appends that many bytes of one more record, torn mid-write.
  std::string CrashImage(size_t torn_bytes = 0) {
    auto s = Open(db_);
    EXPECT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < kBlocks; ++i) EXPECT_TRUE(PutDurable(**s, i).ok());
    const std::string image = dir_.path() + "/image";
    fs::copy(db_, image, fs::copy_options::recursive);
    if (torn_bytes > 0) {
      const fs::path wal = Files(db_, "", ".log").back();
      const size_t before = fs::file_size(wal);
      EXPECT_TRUE(PutDurable(**s, kBlocks).ok());  // the write the crash tears
      const std::string record = ReadFile(wal).substr(before);
      EXPECT_GT(record.size(), torn_bytes);
      std::ofstream(Files(image, "", ".log").back(), std::ios::binary | std::ios::app)
          << record.substr(0, torn_bytes);
    }
    return image;
  }

  // kBlocks durable blocks sealed with cipher_ (key id 1), in db_.
  void WriteSealed() {
    auto s = Open(db_, cipher_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < kBlocks; ++i) ASSERT_TRUE(PutDurable(**s, i).ok());
  }
  // A key file (owner-only, as the tool requires) under the test's directory.
  std::string KeyFile(const std::string& name, const std::string& keys) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << keys;
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
    return path;
  }

  static constexpr char kKeys[] = "1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
  TempDir dir_;
  const std::string db_ = dir_.path() + "/db";
  std::unique_ptr<AtRestCipher> cipher_ = *AtRestCipher::FromString(kKeys);
};

TEST_F(DiskDamageTest, AWriteTornByACrashIsDropped) {
  const std::string image = CrashImage(/*torn_bytes=*/60);  // of a ~130-byte meta record
  auto s = Open(image);
  ASSERT_TRUE(s.ok()) << s.status();
  Census c = Read(**s);
  EXPECT_EQ(c.exact, kBlocks);
  EXPECT_TRUE(absl::IsNotFound((*s)->Get(Key(kBlocks)).status()));
}

TEST_F(DiskDamageTest, ADamagedWalRecordFailsOpenAndRepairKeepsTheRecordsBeforeIt) {
  const std::string image = CrashImage();
  const fs::path wal = Files(image, "", ".log").back();
  // A byte of the meta record of a block in the middle (a record's length
  // field damaged would look like a write torn at the end).
  const size_t key_at = ReadFile(wal).find(EncodeBlockKey(Key(kBlocks / 2)));
  ASSERT_NE(key_at, std::string::npos);
  FlipByte(wal, key_at + EncodeBlockKey(Key(kBlocks / 2)).size() + 20);
  ExpectRepairPath(Open(image).status(), image);

  std::string out;
  ASSERT_EQ(Repair(image, &out), 0) << out;
  auto s = Open(image);
  ASSERT_TRUE(s.ok()) << s.status();
  Census c = Read(**s);
  EXPECT_EQ(c.wrong, 0);
  EXPECT_GT(c.exact, kBlocks / 4) << out;
  EXPECT_LT(c.exact, kBlocks) << out;  // the damaged record and those after it
  EXPECT_EQ(c.exact + c.absent, kBlocks);
}

TEST_F(DiskDamageTest, TheLastAcknowledgedWalRecordDamagedFailsOpen) {
  const std::string image = CrashImage();
  const fs::path wal = Files(image, "", ".log").back();
  FlipByte(wal, fs::file_size(wal) - 100);
  ExpectRepairPath(Open(image).status(), image);
}

TEST_F(DiskDamageTest, ADamagedManifestFailsOpenAndRepairRebuildsEverything) {
  WriteTables();
  DamageManifest(db_);
  ExpectRepairPath(Open(db_).status(), db_);

  std::string out;
  ASSERT_EQ(Repair(db_, &out), 0) << out;
  EXPECT_NE(out.find("rebuilt"), std::string::npos) << out;
  EXPECT_NE(out.find(std::to_string(kBlocks) + " blocks intact, 0 damaged"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("read back from the blob files"), std::string::npos) << out;  // none needed
  auto s = Open(db_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Read(**s).exact, kBlocks);
  auto record = (*s)->GetModelRecord("acme", 7);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(*record, "model");
}

// The earlier format through a rebuild: RocksDB's rebuilt database does
// not list the blob files; the payloads come back from them.
TEST_F(DiskDamageTest, ARebuildReadsBlockDataPayloadsBackFromTheBlobFiles) {
  WriteBlockDataTables();
  DamageManifest(db_);
  ExpectRepairPath(Open(db_).status(), db_);
  std::string out;
  ASSERT_EQ(Repair(db_, &out), 0) << out;
  EXPECT_NE(out.find(std::to_string(kBlocks) + " blocks intact, 0 damaged"), std::string::npos) << out;
  EXPECT_NE(out.find(std::to_string(kBlocks) + " payloads read back from the blob files"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(db_ + "/blob_salvage"));
  auto s = Open(db_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Read(**s).exact, kBlocks);
}

TEST_F(DiskDamageTest, ADamagedMetaTableFailsOpenAndRepairServesOnlyExactBytes) {
  WriteTables();
  FlipByte(TableOf(db_, "block_meta"), 100);
  ExpectRepairPath(Open(db_).status(), db_);

  std::string out;
  ASSERT_EQ(Repair(db_, &out), 0) << out;
  auto s = Open(db_);
  ASSERT_TRUE(s.ok()) << s.status();
  Census c = Read(**s);
  EXPECT_EQ(c.wrong, 0);
  EXPECT_EQ(c.exact + c.absent, kBlocks);
}

// Blocks sealed at rest: without the key file the repair keeps them
// unverified; with it, a sealed record that fails authentication (its
// ciphertext replaced under RocksDB's own checksums) is deleted and the
// rest verified; a key file without the records' key stops the repair.
TEST_F(DiskDamageTest, RepairWithTheKeyFileVerifiesSealedBlocks) {
  WriteSealed();
  {
    auto spill = SpillStore::Open({.path = db_});
    ASSERT_TRUE(spill.ok()) << spill.status();
    ASSERT_TRUE((*spill)->OverwritePayloadForTest(Key(3), std::string(kBlock + AtRestCipher::kOverheadBytes, 'x')).ok());
  }
  std::string out;
  ASSERT_EQ(Repair(db_, &out), 0) << out;
  EXPECT_NE(out.find("0 blocks intact, 0 damaged blocks deleted, " + std::to_string(kBlocks) +
                     " sealed blocks kept unverified"),
            std::string::npos)
      << out;
  out.clear();
  const std::string other = KeyFile("other-keys", "2 ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n");
  EXPECT_EQ(Repair(db_, &out, "--at_rest_key_file " + other), 1) << out;
  EXPECT_NE(out.find("FAILED_PRECONDITION"), std::string::npos) << out;
  out.clear();
  ASSERT_EQ(Repair(db_, &out, "--at_rest_key_file=" + KeyFile("keys", kKeys)), 0) << out;
  EXPECT_NE(out.find(std::to_string(kBlocks - 1) + " blocks intact, 1 damaged blocks deleted, 0 sealed"),
            std::string::npos)
      << out;
  auto s = Open(db_, cipher_.get());
  ASSERT_TRUE(s.ok()) << s.status();
  Census c = Read(**s);
  EXPECT_EQ(c.exact, kBlocks - 1);
  EXPECT_EQ(c.absent, 1);
  EXPECT_EQ(c.wrong + c.data_loss, 0);
}

// A repair cut short after it set the blob files aside, then a new one: the
// file set aside before and the database's own file of the same name are
// both kept, and the payloads come from whichever copy checks.
TEST_F(DiskDamageTest, ARepairCutShortKeepsEveryBlobFileItSetAside) {
  WriteBlockDataTables();
  const fs::path blob = Files(db_, "", ".blob").at(0);
  fs::create_directories(db_ + "/blob_salvage");
  fs::copy_file(blob, db_ + "/blob_salvage/" + blob.filename().string());
  FlipByte(blob, fs::file_size(blob) / 3);  // the database's copy: one payload damaged
  DamageManifest(db_);
  std::string out;
  ASSERT_EQ(Repair(db_, &out), 0) << out;
  EXPECT_NE(out.find(std::to_string(kBlocks) + " blocks intact, 0 damaged"), std::string::npos) << out;
  auto s = Open(db_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Read(**s).exact, kBlocks);
}

// Sealed payloads through a rebuild: read back from the blob files and
// opened with the key file (checked), or kept unverified without it.
TEST_F(DiskDamageTest, ARebuildReadsSealedPayloadsBack) {
  WriteBlockDataTables(cipher_.get());
  const std::string image = dir_.path() + "/image";
  fs::copy(db_, image, fs::copy_options::recursive);
  const std::string key_file = KeyFile("keys", kKeys);
  for (const std::string& dir : {db_, image}) {
    DamageManifest(dir);
  }
  std::string out;
  ASSERT_EQ(Repair(db_, &out, "--at_rest_key_file " + key_file), 0) << out;
  EXPECT_NE(out.find(std::to_string(kBlocks) + " blocks intact, 0 damaged blocks deleted, 0 sealed"), std::string::npos)
      << out;
  EXPECT_NE(out.find(std::to_string(kBlocks) + " payloads read back"), std::string::npos) << out;
  auto s = Open(db_, cipher_.get());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Read(**s).exact, kBlocks);

  out.clear();
  ASSERT_EQ(Repair(image, &out), 0) << out;
  EXPECT_NE(out.find("0 blocks intact, 0 damaged blocks deleted, " + std::to_string(kBlocks) + " sealed blocks kept unverified"),
            std::string::npos)
      << out;
  auto t = Open(image, cipher_.get());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(Read(**t).exact, kBlocks);
}

// Payloads live in a segment file (the earlier format: a blob file).
TEST_F(DiskDamageTest, ADamagedPayloadFileIsDataLossForTheBlocksItHits) {
  for (bool block_data : {false, true}) {
    SCOPED_TRACE(block_data ? "block_data" : "segments");
    fs::remove_all(db_);
    if (block_data) {
      WriteBlockDataTables();
    } else {
      WriteTables();
    }
    const std::vector<fs::path> files =
        block_data ? Files(db_, "", ".blob") : Files(db_ + "/segments", "", ".seg");
    ASSERT_EQ(files.size(), 1u);
    FlipByte(files[0], fs::file_size(files[0]) / 3);
    {
      auto s = Open(db_);
      ASSERT_TRUE(s.ok()) << s.status();
      Census c = Read(**s);
      EXPECT_EQ(c.wrong, 0);
      EXPECT_GE(c.data_loss, 1);
      EXPECT_GE(c.exact, kBlocks - 2);
      EXPECT_EQ(c.exact + c.data_loss, kBlocks);
      EXPECT_EQ((*s)->Stats().counters.checksum_failures, static_cast<uint64_t>(c.data_loss));
    }
    // The store dropped what it found; the repair tool finds nothing more.
    std::string out;
    ASSERT_EQ(Repair(db_, &out), 0) << out;
    EXPECT_NE(out.find("0 damaged"), std::string::npos) << out;
  }
}

// A segment file lost (deleted by hand): its blocks are DATA_LOSS once,
// then absent; the repair tool deletes their meta.
TEST_F(DiskDamageTest, ALostSegmentFileIsDataLossForItsBlocks) {
  WriteTables();
  fs::remove(Files(db_ + "/segments", "", ".seg").at(0));
  std::string out;
  ASSERT_EQ(Repair(db_, &out), 0) << out;
  EXPECT_NE(out.find("0 blocks intact, " + std::to_string(kBlocks) + " damaged blocks deleted"), std::string::npos)
      << out;
  auto s = Open(db_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->Stats().blocks, 0u);
  EXPECT_EQ(Read(**s).absent, kBlocks);
}

TEST_F(DiskDamageTest, ADamagedPayloadTableIsDataLossForTheBlocksItHits) {
  WriteBlockDataTables();
  const fs::path table = TableOf(db_, "block_data");
  FlipByte(table, fs::file_size(table) / 3);
  auto s = Open(db_);
  ASSERT_TRUE(s.ok()) << s.status();
  Census c = Read(**s);
  EXPECT_EQ(c.wrong, 0);
  EXPECT_GE(c.data_loss, 1);
  EXPECT_EQ(c.exact + c.data_loss, kBlocks);
  EXPECT_EQ((*s)->Stats().counters.checksum_failures, static_cast<uint64_t>(c.data_loss));
}

}  // namespace
}  // namespace tqkv::storage
