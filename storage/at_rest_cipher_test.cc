// AtRestCipher: seal/open round trips, the record bound to its tenant and
// aad, precise errors for a missing or different key, rotation, and the key
// file's checks.
#include "storage/at_rest_cipher.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

constexpr char kKey1[] = "1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
constexpr char kKey1Other[] = "1 ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
constexpr char kKey2[] = "2 A0A1A2A3A4A5A6A7A8A9AAABACADAEAFB0B1B2B3B4B5B6B7B8B9BABBBCBDBEBF\n";

std::unique_ptr<AtRestCipher> Cipher(const std::string& contents) {
  auto c = AtRestCipher::FromString(contents);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

TEST(AtRestCipherTest, SealedRecordsOpenBitIdenticalAndHideThePlaintext) {
  auto c = Cipher(std::string("# keys\n\n") + kKey1);
  const std::string plain = TestPayload({"acme", 1, "h"}, 4099);
  auto sealed = c->Seal("acme", "key-a", plain);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_EQ(sealed->size(), plain.size() + AtRestCipher::kOverheadBytes);
  EXPECT_EQ(sealed->find(plain.substr(100, 16)), std::string::npos);
  auto again = c->Seal("acme", "key-a", plain);
  EXPECT_NE(*again, *sealed);  // a fresh nonce each time
  auto open = c->Open("acme", "key-a", *sealed);
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ((*open)->view(), plain);
  auto empty = c->Seal("acme", "key-a", "");
  ASSERT_TRUE(empty.ok());
  auto open_empty = c->Open("acme", "key-a", *empty);
  ASSERT_TRUE(open_empty.ok()) << open_empty.status();
  EXPECT_EQ((*open_empty)->size(), 0u);
}

TEST(AtRestCipherTest, ARecordOpensOnlyForItsTenantAadAndBytes) {
  auto c = Cipher(kKey1);
  const std::string sealed = *c->Seal("acme", "key-a", "some payload bytes");
  EXPECT_EQ(c->Open("other", "key-a", sealed).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(c->Open("acme", "key-b", sealed).status().code(), absl::StatusCode::kDataLoss);
  for (size_t at : {size_t{0}, size_t{30}, sealed.size() - 20, sealed.size() - 1}) {
    std::string bad = sealed;
    bad[at] ^= 1;
    const absl::StatusCode code = c->Open("acme", "key-a", bad).status().code();
    EXPECT_TRUE(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kFailedPrecondition) << at;
  }
  EXPECT_EQ(c->Open("acme", "key-a", sealed.substr(0, 40)).status().code(), absl::StatusCode::kDataLoss);
}

TEST(AtRestCipherTest, AMissingOrDifferentKeyIsAPreciseError) {
  const std::string sealed = *Cipher(kKey1)->Seal("acme", "k", "payload");
  auto missing = Cipher(kKey2)->Open("acme", "k", sealed);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("key id 1, which the key file does not hold"), std::string::npos)
      << missing.status();
  auto other = Cipher(kKey1Other)->Open("acme", "k", sealed);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("not the key this record was sealed with"), std::string::npos)
      << other.status();
}

TEST(AtRestCipherTest, RotationSealsWithTheHighestIdAndOpensOlderRecords) {
  const std::string old_record = *Cipher(kKey1)->Seal("acme", "k", "old");
  auto rotated = Cipher(std::string(kKey2) + kKey1);
  EXPECT_EQ(rotated->current_key_id(), 2u);
  auto open = rotated->Open("acme", "k", old_record);
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ((*open)->view(), "old");
  const std::string new_record = *rotated->Seal("acme", "k", "new");
  EXPECT_EQ(Cipher(kKey1)->Open("acme", "k", new_record).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AtRestCipherTest, MalformedOrExposedKeyFilesAreRefused) {
  EXPECT_EQ(AtRestCipher::FromString("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AtRestCipher::FromString("1 abcd\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AtRestCipher::FromString("0 " + std::string(64, 'a')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AtRestCipher::FromString("1 " + std::string(64, 'g')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AtRestCipher::FromString(std::string(kKey1) + kKey1Other).status().code(),
            absl::StatusCode::kInvalidArgument);
  TempDir dir;
  const std::string path = dir.path() + "/keys";
  std::ofstream(path) << kKey1;
  chmod(path.c_str(), 0640);
  auto exposed = AtRestCipher::FromFile(path);
  EXPECT_EQ(exposed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(exposed.status().message().find("mode 0640"), std::string::npos) << exposed.status();
  chmod(path.c_str(), 0600);
  EXPECT_TRUE(AtRestCipher::FromFile(path).ok());
  EXPECT_EQ(AtRestCipher::FromFile(dir.path() + "/none").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tqkv::storage
