// A full disk seen through a RocksDB file system that refuses writes with
// ENOSPC while `full` is set (the fault is injected; the database, its
// files and RocksDB's error handling are real). Runs everywhere, where
// block_store_full_disk_test's real tmpfs cannot be mounted too.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "rocksdb/env.h"
#include "storage/full_disk_fs.h"
#include "storage/spill_store.h"
#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

DiskBlockMeta MetaFor(const BlockKey& key, absl::string_view payload) {
  DiskBlockMeta m;
  m.size_bytes = payload.size();
  m.checksum = BlockChecksum(key, payload);
  m.accounting = TestAccounting(payload.size());
  return m;
}

absl::Status Write(SpillStore& s, const BlockKey& key, const std::string& payload) {
  DiskBlockMeta meta = MetaFor(key, payload);
  SpillStore::BlockWrite w{&key, &meta, payload};
  return s.Apply({&w, 1}, {}, /*sync=*/true);
}

TEST(SpillStoreFullDisk, WritesFailAsFullReadsGoOnAndWritesResumeWithSpace) {
  TempDir dir;
  auto fs = std::make_shared<FullDiskFs>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
  {
    auto s = SpillStore::Open({.path = dir.path(), .env = env.get()});
    ASSERT_TRUE(s.ok()) << s.status();
    const BlockKey a{"acme", 7, "a"}, b{"acme", 7, "b"}, c{"acme", 7, "c"};
    const std::string pa = TestPayload(a, 1000), pb = TestPayload(b, 1000), pc = TestPayload(c, 1000);
    ASSERT_TRUE(Write(**s, a, pa).ok());

    fs->full = true;
    absl::Status full = Write(**s, b, pb);
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
    EXPECT_NE(full.message().find("disk tier at " + dir.path() + " is full"), std::string::npos)
        << full;
    // Stopped: the next write tries to resume and is refused the same way.
    EXPECT_EQ(Write(**s, c, pc).code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ((*s)->PutModelRecord("acme", 7, "m").code(), absl::StatusCode::kResourceExhausted);
    auto read = (*s)->ReadPayload(a);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ((*read)->view(), pa);
    EXPECT_TRUE(absl::IsNotFound((*s)->ReadPayload(b).status()));

    fs->full = false;
    absl::Status resumed = Write(**s, c, pc);
    ASSERT_TRUE(resumed.ok()) << resumed;
    EXPECT_TRUE((*s)->PutModelRecord("acme", 7, "m").ok());
  }
  auto s = SpillStore::Open({.path = dir.path(), .env = env.get()});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)->ReadPayload({"acme", 7, "a"}).ok());
  EXPECT_TRUE(absl::IsNotFound((*s)->ReadPayload({"acme", 7, "b"}).status()));
  EXPECT_TRUE((*s)->ReadPayload({"acme", 7, "c"}).ok());
}

}  // namespace
}  // namespace tqkv::storage
