#include "base/byte_size.h"

#include <gtest/gtest.h>

#include <string>

namespace tqkv {
namespace {

uint64_t Parse(absl::string_view s) {
  uint64_t b = 0;
  std::string error;
  EXPECT_TRUE(ParseByteSize(s, &b, &error)) << s << ": " << error;
  return b;
}

std::string Refusal(absl::string_view s) {
  uint64_t b = 7;
  std::string error;
  EXPECT_FALSE(ParseByteSize(s, &b, &error)) << s << " parsed as " << b;
  EXPECT_EQ(b, 7u) << s;
  return error;
}

TEST(ByteSize, ParsesPlainCountsAndUnits) {
  EXPECT_EQ(Parse("0"), 0u);
  EXPECT_EQ(Parse("1073741824"), uint64_t{1} << 30);
  EXPECT_EQ(Parse("48000000000"), 48000000000u);
  EXPECT_EQ(Parse("17B"), 17u);
  EXPECT_EQ(Parse("64GiB"), uint64_t{64} << 30);
  EXPECT_EQ(Parse("64Gi"), uint64_t{64} << 30);
  EXPECT_EQ(Parse("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(Parse("1.5KiB"), 1536u);
  EXPECT_EQ(Parse("2TiB"), uint64_t{2} << 40);
  EXPECT_EQ(Parse("10GB"), 10000000000u);
  EXPECT_EQ(Parse("10G"), 10000000000u);
  EXPECT_EQ(Parse("4kB"), 4000u);
  EXPECT_EQ(Parse("0.25MB"), 250000u);
  EXPECT_EQ(Parse(" 8 MiB "), uint64_t{8} << 20);
}

TEST(ByteSize, RefusesWhatIsNotAByteCount) {
  EXPECT_NE(Refusal("").find("not a byte count"), std::string::npos);
  EXPECT_NE(Refusal("GiB").find("not a byte count"), std::string::npos);
  EXPECT_NE(Refusal("-1").find("not a byte count"), std::string::npos);
  EXPECT_NE(Refusal("64gib").find("unknown unit 'gib'"), std::string::npos);
  EXPECT_NE(Refusal("64 GiB x").find("unknown unit"), std::string::npos);
  EXPECT_NE(Refusal("1e9").find("unknown unit 'e9'"), std::string::npos);
  EXPECT_NE(Refusal("0.1KiB").find("whole number"), std::string::npos);
  EXPECT_NE(Refusal("1.0000000000000000001KiB").find("more than 18 decimals"), std::string::npos);
  EXPECT_NE(Refusal("18446744073709551616").find("over 2^64"), std::string::npos);
  EXPECT_NE(Refusal("16384PiB").find("over 2^64"), std::string::npos);
  EXPECT_EQ(Parse("18446744073709551615"), ~uint64_t{0});
}

TEST(ByteSize, UnparsesToWhatParsesBack) {
  for (uint64_t b : {uint64_t{0}, uint64_t{1}, uint64_t{1536}, uint64_t{1} << 30, uint64_t{64} << 30,
                     uint64_t{3} << 50, uint64_t{48000000000}, ~uint64_t{0}}) {
    EXPECT_EQ(Parse(ExactByteSize(b)), b) << ExactByteSize(b);
  }
  EXPECT_EQ(ExactByteSize(uint64_t{64} << 30), "64GiB");
  EXPECT_EQ(ExactByteSize(1536), "1536");
  EXPECT_EQ(AbslUnparseFlag(ByteSize{uint64_t{512} << 20}), "512MiB");
}

TEST(ByteSize, HumanBytesKeepsThreeDigits) {
  EXPECT_EQ(HumanBytes(17), "17 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(uint64_t{640} << 10), "640 KiB");
  EXPECT_EQ(HumanBytes(uint64_t{3} << 30 | uint64_t{1} << 29), "3.50 GiB");
  EXPECT_EQ(HumanBytes(uint64_t{20} << 30), "20.0 GiB");
}

}  // namespace
}  // namespace tqkv
