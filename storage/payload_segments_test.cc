#include "storage/payload_segments.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "rocksdb/file_system.h"
#include "storage/full_disk_fs.h"
#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

namespace fs = std::filesystem;

std::string Read(PayloadSegments& s, const SegmentLocation& at) {
  std::string out(at.bytes, '\0');
  const absl::Status r = s.Read(at, out.data());
  EXPECT_TRUE(r.ok()) << r;
  return out;
}

std::unique_ptr<PayloadSegments> OpenOrDie(const std::string& dir, rocksdb::FileSystem* fs, uint64_t segment_bytes) {
  auto s = PayloadSegments::Open(dir, fs, segment_bytes);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// Records append in order, roll over to a new file at the segment size,
// read back exactly; a reopened directory appends to a new file numbered
// above the old ones, which stay readable.
TEST(PayloadSegments, AppendsRollsOverAndReadsBack) {
  TempDir dir;
  rocksdb::FileSystem* fs = rocksdb::FileSystem::Default().get();
  std::vector<std::string> payloads;
  for (int i = 0; i < 10; ++i) payloads.push_back(std::string(3000 + i, static_cast<char>('a' + i)));
  payloads.push_back("");  // an empty payload is a record too
  std::vector<PayloadSegments::Record> records;
  std::vector<std::string> keys;
  for (size_t i = 0; i < payloads.size(); ++i) keys.push_back("key-" + std::to_string(i));
  for (size_t i = 0; i < payloads.size(); ++i) records.push_back({keys[i], payloads[i]});
  std::vector<SegmentLocation> at;
  {
    auto s = OpenOrDie(dir.path(), fs, 8000);
    auto got = s->Append(records, /*sync=*/true);
    ASSERT_TRUE(got.ok()) << got.status();
    at = *got;
    ASSERT_EQ(at.size(), payloads.size());
    for (size_t i = 0; i < at.size(); ++i) {
      EXPECT_EQ(at[i].bytes, payloads[i].size());
      EXPECT_EQ(Read(*s, at[i]), payloads[i]) << i;
    }
    // Three records of ~3 KB fill a file of 8,000 bytes: four files.
    EXPECT_EQ(at.front().segment, 1u);
    EXPECT_EQ(at.back().segment, 4u);
    const PayloadSegments::FileSizes files = s->Files();
    EXPECT_EQ(files.bytes.size(), 4u);
    EXPECT_EQ(files.active, 4u);
    uint64_t total = 0;
    for (const auto& [n, bytes] : files.bytes) total += bytes;
    uint64_t expected = 0;
    for (size_t i = 0; i < payloads.size(); ++i) expected += SegmentRecordBytes(keys[i].size(), payloads[i].size());
    EXPECT_EQ(total, expected);
  }
  auto s = OpenOrDie(dir.path(), fs, 8000);
  for (size_t i = 0; i < at.size(); ++i) EXPECT_EQ(Read(*s, at[i]), payloads[i]) << i;
  auto more = s->Append({{"later", "bytes"}}, /*sync=*/false);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ((*more)[0].segment, 5u);
  EXPECT_EQ(Read(*s, (*more)[0]), "bytes");
}

// ReadAll lists a file's records with their keys and payloads; a torn last
// record ends the list and marks the file as not whole.
TEST(PayloadSegments, ReadAllListsRecordsAndStopsAtATornOne) {
  TempDir dir;
  rocksdb::FileSystem* fs = rocksdb::FileSystem::Default().get();
  {
    auto s = OpenOrDie(dir.path(), fs, 1 << 20);
    ASSERT_TRUE(s->Append({{"k1", "first"}, {"k2", "second"}, {"k3", "third"}}, false).ok());
  }
  const std::string file = dir.path() + "/" + PayloadSegments::FileName(1);
  auto s = OpenOrDie(dir.path(), fs, 1 << 20);
  auto all = s->ReadAll(1);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE((*all)->whole);
  ASSERT_EQ((*all)->records.size(), 3u);
  EXPECT_EQ((*all)->records[1].encoded_key, "k2");
  EXPECT_EQ((*all)->records[1].payload, "second");
  EXPECT_EQ(Read(*s, (*all)->records[2].at), "third");

  s.reset();
  fs::resize_file(file, fs::file_size(file) - 2);  // the last record torn
  s = OpenOrDie(dir.path(), fs, 1 << 20);
  all = s->ReadAll(1);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_FALSE((*all)->whole);
  EXPECT_EQ((*all)->records.size(), 2u);

  // A flipped byte in a header ends the walk there too.
  s.reset();
  {
    std::FILE* f = std::fopen(file.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 5, SEEK_SET);  // the first record's key length
    std::fputc(0x7f, f);
    std::fclose(f);
  }
  s = OpenOrDie(dir.path(), fs, 1 << 20);
  all = s->ReadAll(1);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_FALSE((*all)->whole);
  EXPECT_TRUE((*all)->records.empty());
}

// A removed file is gone for readers (NOT_FOUND: read the meta again); the
// file being appended to cannot be removed; a location past a file's end
// is DATA_LOSS.
TEST(PayloadSegments, RemoveAndBadLocations) {
  TempDir dir;
  auto s = OpenOrDie(dir.path(), rocksdb::FileSystem::Default().get(), 100);
  auto at = s->Append({{"a", std::string(200, 'a')}, {"b", std::string(200, 'b')}}, false);
  ASSERT_TRUE(at.ok()) << at.status();
  ASSERT_EQ((*at)[0].segment, 1u);
  ASSERT_EQ((*at)[1].segment, 2u);
  EXPECT_EQ(s->Remove(2).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s->Remove(1).ok());
  EXPECT_FALSE(fs::exists(dir.path() + "/" + PayloadSegments::FileName(1)));
  std::string buf(200, '\0');
  EXPECT_EQ(s->Read((*at)[0], buf.data()).code(), absl::StatusCode::kNotFound);
  SegmentLocation past = (*at)[1];
  past.offset += 1;
  EXPECT_EQ(s->Read(past, buf.data()).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Read(*s, (*at)[1]), std::string(200, 'b'));
  // A call that starts where the last one filled its file starts a new one.
  auto next = s->Append({{"c", std::string(100 << 10, 'c')}, {"d", "d"}}, false);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)[0].segment, 3u);
  EXPECT_EQ((*next)[1].segment, 4u);
  EXPECT_EQ(Read(*s, (*next)[0]), std::string(100 << 10, 'c'));
  EXPECT_EQ(Read(*s, (*next)[1]), "d");
}

// A full disk fails the append whole (RESOURCE_EXHAUSTED); the next append
// goes to a new file, and what was written before reads back.
TEST(PayloadSegments, AFullDiskFailsTheAppendAndTheNextStartsANewFile) {
  TempDir dir;
  FullDiskFs fs;
  auto s = OpenOrDie(dir.path(), &fs, 1 << 20);
  auto before = s->Append({{"a", "before"}}, true);
  ASSERT_TRUE(before.ok()) << before.status();
  fs.full = true;
  EXPECT_EQ(s->Append({{"b", "during"}}, true).status().code(), absl::StatusCode::kResourceExhausted);
  fs.full = false;
  auto after = s->Append({{"c", "after"}}, true);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ((*after)[0].segment, (*before)[0].segment + 1);
  EXPECT_EQ(Read(*s, (*before)[0]), "before");
  EXPECT_EQ(Read(*s, (*after)[0]), "after");
}

}  // namespace
}  // namespace tqkv::storage
