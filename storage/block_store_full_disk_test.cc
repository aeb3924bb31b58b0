// A full disk under the disk tier: a real tmpfs of a few MiB, filled by
// durable puts and spills, then grown again. The test mounts it in a
// mount namespace of its own (it needs CAP_SYS_ADMIN, as root in a
// container has; it is skipped where mounting is not allowed).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "storage/block_store.h"
#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

constexpr size_t kBlock = 256 << 10;

BlockKey Key(int i) { return {"acme", 7, "h" + std::to_string(i)}; }

// A tmpfs of `bytes` mounted on a fresh directory; Resize remounts it.
// The mount lives in a mount namespace of this process alone, so it
// vanishes with the process however the test ends.
class SmallTmpfs {
 public:
  explicit SmallTmpfs(uint64_t bytes) {
    path_ = dir_.path() + "/fs";
    ::mkdir(path_.c_str(), 0700);
    static const bool private_ns =
        ::unshare(CLONE_NEWNS) == 0 &&
        ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
    mounted_ = private_ns && ::mount("tmpfs", path_.c_str(), "tmpfs", 0, Size(bytes).c_str()) == 0;
  }
  ~SmallTmpfs() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  bool Resize(uint64_t bytes) {
    return ::mount("tmpfs", path_.c_str(), "tmpfs", MS_REMOUNT, Size(bytes).c_str()) == 0;
  }
  std::string db() const { return path_ + "/db"; }

 private:
  static std::string Size(uint64_t bytes) { return "size=" + std::to_string(bytes); }
  TempDir dir_;
  std::string path_;
  bool mounted_ = false;
};

class FullDiskTest : public ::testing::Test {
 protected:
  std::unique_ptr<BlockStore> Open(uint64_t host_bytes, uint64_t min_free = 0) {
    BlockStoreOptions o;
    o.host_capacity_bytes = host_bytes;
    o.disk_path = fs_.db();
    o.disk_min_free_bytes = min_free;
    o.clock = &clock_;
    auto s = BlockStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  absl::StatusOr<CommitOutcome> Put(BlockStore& s, int i, bool durable) {
    clock_.Advance(absl::Milliseconds(1));
    return s.Put(Key(i), "", TestAccounting(kBlock), TestPayload(Key(i), kBlock),
                 {.durable = durable});
  }
  // The block reads back with exactly its bytes.
  void ExpectExact(BlockStore& s, int i) {
    auto got = s.Get(Key(i));
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    EXPECT_TRUE(got->payload->view() == TestPayload(Key(i), kBlock)) << i;
  }
  void ExpectAbsent(BlockStore& s, int i) {
    EXPECT_EQ(s.Get(Key(i)).status().code(), absl::StatusCode::kNotFound) << i;
  }

  SmallTmpfs fs_{8 << 20};
  FakeClock clock_;
};

TEST_F(FullDiskTest, DurablePutsFailPreciselyKeepWhatWasAcknowledgedAndResumeWithSpace) {
  if (!fs_.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
  auto s = Open(64 << 20);
  ASSERT_NE(s, nullptr);
  int acked = 0;
  absl::Status full;
  for (; acked < 100; ++acked) {
    auto r = Put(*s, acked, /*durable=*/true);
    if (!r.ok()) {
      full = r.status();
      break;
    }
  }
  ASSERT_LT(acked, 100) << "an 8 MiB disk took 25 MiB of durable blocks";
  ASSERT_GT(acked, 0);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("disk tier at " + fs_.db() + " is full"), std::string::npos)
      << full;
  const int refused = acked;
  ExpectAbsent(*s, refused);

  // Still full: refused again, quickly and the same way.
  auto again = Put(*s, 500, /*durable=*/true);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kResourceExhausted) << again.status();
  ExpectAbsent(*s, 500);

  // Reads and host-memory puts go on.
  for (int i = 0; i < acked; ++i) ExpectExact(*s, i);
  ASSERT_TRUE(Put(*s, 600, /*durable=*/false).ok());
  ExpectExact(*s, 600);

  // Space returns: the next durable put resumes the disk tier.
  ASSERT_TRUE(fs_.Resize(64 << 20));
  auto resumed = Put(*s, 700, /*durable=*/true);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_TRUE(s->PutModelRecord("acme", 9, "record").ok());

  // A restart finds exactly the acknowledged durable blocks.
  s.reset();
  s = Open(64 << 20);
  ASSERT_NE(s, nullptr);
  for (int i = 0; i < acked; ++i) ExpectExact(*s, i);
  ExpectExact(*s, 700);
  ExpectAbsent(*s, refused);
  ExpectAbsent(*s, 500);
  ExpectAbsent(*s, 600);  // host memory only
  auto record = s->GetModelRecord("acme", 9);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(*record, "record");
}

// With a headroom the disk never fills: durable puts are refused while the
// file system still has the headroom free (naming the flag), what was
// acknowledged stays, and the store restarts on that disk.
TEST_F(FullDiskTest, TheHeadroomRefusesWritesBeforeTheDiskIsFull) {
  if (!fs_.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
  constexpr uint64_t kHeadroom = 2 << 20;  // RocksDB's open store already takes ~4 MiB of the 8
  auto s = Open(64 << 20, kHeadroom);
  ASSERT_NE(s, nullptr);
  int acked = 0;
  absl::Status refused;
  for (; acked < 100; ++acked) {
    auto r = Put(*s, acked, /*durable=*/true);
    if (!r.ok()) {
      refused = r.status();
      break;
    }
  }
  ASSERT_GT(acked, 0) << refused;
  ASSERT_LT(acked, 100);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("--disk_min_free_bytes"), std::string::npos) << refused;
  struct statvfs fs {};
  ASSERT_EQ(::statvfs(fs_.db().c_str(), &fs), 0);
  EXPECT_GE(static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize, kHeadroom - kBlock) << "the headroom is kept";
  ExpectAbsent(*s, acked);
  EXPECT_EQ(s->Stats().counters.disk_errors, 1u);
  for (int i = 0; i < acked; ++i) ExpectExact(*s, i);
  ASSERT_TRUE(Put(*s, 600, /*durable=*/false).ok()) << "host-memory puts go on";
  s.reset();
  s = Open(64 << 20, kHeadroom);
  ASSERT_NE(s, nullptr);
  for (int i = 0; i < acked; ++i) ExpectExact(*s, i);
}

TEST_F(FullDiskTest, EvictionDropsInsteadOfSpillingWhileTheDiskIsFull) {
  if (!fs_.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
  auto s = Open(2 << 20);  // 8 blocks
  ASSERT_NE(s, nullptr);
  // 60 blocks through 2 MiB of host memory and an 8 MiB disk: spills
  // until the disk is full, drops after that; no put fails.
  for (int i = 0; i < 60; ++i) {
    auto r = Put(*s, i, /*durable=*/false);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
  }
  StoreStats st = s->Stats();
  EXPECT_GT(st.counters.spills, 0u);
  EXPECT_GT(st.counters.drops, 0u);
  // Every block still indexed has its exact bytes (host or disk).
  int present = 0;
  for (int i = 0; i < 60; ++i) {
    auto got = s->Get(Key(i));
    if (got.status().code() == absl::StatusCode::kNotFound) continue;
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    EXPECT_TRUE(got->payload->view() == TestPayload(Key(i), kBlock)) << i;
    ++present;
  }
  EXPECT_GE(present, 8);
  EXPECT_EQ(Put(*s, 100, /*durable=*/true).status().code(), absl::StatusCode::kResourceExhausted);

  // Space returns: after the retry interval, eviction spills again.
  ASSERT_TRUE(fs_.Resize(64 << 20));
  clock_.Advance(absl::Seconds(2));
  const uint64_t spills = s->Stats().counters.spills;
  for (int i = 200; i < 210; ++i) ASSERT_TRUE(Put(*s, i, /*durable=*/false).ok()) << i;
  EXPECT_GT(s->Stats().counters.spills, spills);
}

TEST_F(FullDiskTest, AStoreOnAFullDiskOpensAndServesItsBlocks) {
  if (!fs_.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
  int acked = 0;
  {
    auto s = Open(64 << 20);
    ASSERT_NE(s, nullptr);
    while (acked < 100 && Put(*s, acked, /*durable=*/true).ok()) ++acked;
    ASSERT_LT(acked, 100);
  }
  auto s = Open(64 << 20);
  ASSERT_NE(s, nullptr);
  for (int i = 0; i < acked; ++i) ExpectExact(*s, i);
  // Opening may have freed some space (RocksDB recovers its WAL into a
  // table file); a durable put either fits or is refused as full.
  auto r = Put(*s, 500, /*durable=*/true);
  EXPECT_TRUE(r.ok() || absl::IsResourceExhausted(r.status())) << r.status();
  ASSERT_TRUE(Put(*s, 600, /*durable=*/false).ok());
}

}  // namespace
}  // namespace tqkv::storage
