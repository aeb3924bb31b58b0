#include "codec/packing.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace tqkv {
namespace {

TEST(Packing, RoundTripsEveryWidthAndLength) {
  std::mt19937 rng(7);
  for (int bits = 1; bits <= 8; ++bits) {
    for (size_t n = 0; n <= 300; n += (n < 40 ? 1 : 37)) {
      std::vector<uint8_t> idx(n);
      for (auto& v : idx) v = rng() & ((1u << bits) - 1);
      std::vector<uint8_t> packed(PackedBytes(n, bits) + 1, 0xAB);
      PackBits(idx.data(), n, bits, packed.data());
      EXPECT_EQ(packed.back(), 0xAB) << "wrote past the end, bits=" << bits << " n=" << n;
      std::vector<uint8_t> back(n, 0xFF);
      UnpackBits(packed.data(), n, bits, back.data());
      ASSERT_EQ(back, idx) << "bits=" << bits << " n=" << n;
    }
  }
}

TEST(Packing, PackedBytesIsCeil) {
  EXPECT_EQ(PackedBytes(128, 4), 64u);
  EXPECT_EQ(PackedBytes(128, 3), 48u);
  EXPECT_EQ(PackedBytes(128, 5), 80u);
  EXPECT_EQ(PackedBytes(3, 3), 2u);
  EXPECT_EQ(PackedBytes(1, 1), 1u);
  EXPECT_EQ(PackedBytes(0, 5), 0u);
}

// Golden bytes pin the LSB-first bit order.
TEST(Packing, GoldenBytes) {
  {
    const uint8_t idx[] = {0x1, 0x2, 0x3, 0xF};
    uint8_t out[2];
    PackBits(idx, 4, 4, out);
    EXPECT_EQ(out[0], 0x21);  // even index in the low nibble
    EXPECT_EQ(out[1], 0xF3);
  }
  {
    const uint8_t idx[] = {1, 2, 3, 0};
    uint8_t out[1];
    PackBits(idx, 4, 2, out);
    EXPECT_EQ(out[0], 0b00111001);
  }
  {
    // 3 bits: 5=101, 3=011, 6=110 -> bits 0..8: 1 0 1 | 1 1 0 | 0 1 1
    const uint8_t idx[] = {5, 3, 6};
    uint8_t out[2];
    PackBits(idx, 3, 3, out);
    EXPECT_EQ(out[0], 0b10011101);
    EXPECT_EQ(out[1], 0b00000001);
  }
  {
    // 5 bits: 31, 1 -> 11111 10000 -> byte0 = 0b00111111, byte1 = 0b00000000
    const uint8_t idx[] = {31, 1};
    uint8_t out[2];
    PackBits(idx, 2, 5, out);
    EXPECT_EQ(out[0], 0x3F);
    EXPECT_EQ(out[1], 0x00);
  }
  {
    const uint8_t idx[] = {1, 0, 1, 1, 0, 0, 0, 1, 1};
    uint8_t out[2];
    PackBits(idx, 9, 1, out);
    EXPECT_EQ(out[0], 0b10001101);
    EXPECT_EQ(out[1], 0b00000001);
  }
}

}  // namespace
}  // namespace tqkv
