#include "codec/format.h"

#include <gtest/gtest.h>

namespace tqkv {
namespace {

size_t RowBytes(const std::string& name, int dim, bool key = true) {
  auto f = ParseFormat(name);
  EXPECT_TRUE(f.ok()) << f.status();
  auto l = MakeRowLayout(key ? f->k : f->v, dim);
  EXPECT_TRUE(l.ok()) << l.status();
  return l->row_bytes;
}

TEST(Format, RowBytesAt128MatchTheContract) {
  EXPECT_EQ(RowBytes("k2v2", 128), 36u);
  EXPECT_EQ(RowBytes("k3v3", 128), 52u);
  EXPECT_EQ(RowBytes("tq4", 128), 68u);
  EXPECT_EQ(RowBytes("k5v5", 128), 84u);
  EXPECT_EQ(RowBytes("k4v2", 128, true) + RowBytes("k4v2", 128, false), 104u);
  EXPECT_EQ(RowBytes("turboquant25", 128), 44u);
  EXPECT_EQ(RowBytes("turboquant35", 128), 64u);
  EXPECT_EQ(RowBytes("turboquant25_noqjl", 128), 40u);
  EXPECT_EQ(RowBytes("turboquant35_noqjl", 128), 60u);
  EXPECT_EQ(RowBytes("fp16", 128), 256u);
  EXPECT_EQ(RowBytes("k8v8", 128), 132u);
}

TEST(Format, RecipeGroupLayoutAt128) {
  auto l = *MakeRowLayout(ParseFormat("turboquant25")->k, 128);
  ASSERT_EQ(l.groups.size(), 2u);
  EXPECT_EQ(l.groups[0].channels, 32);
  EXPECT_EQ(l.groups[0].mse_bits, 2);
  EXPECT_EQ(l.groups[0].bytes, 8u + 4u + 2u + 2u);
  EXPECT_EQ(l.groups[1].channels, 96);
  EXPECT_EQ(l.groups[1].mse_bits, 1);
  EXPECT_EQ(l.groups[1].index_offset, 16u);
  auto l35 = *MakeRowLayout(ParseFormat("turboquant35")->v, 128);
  EXPECT_EQ(l35.groups[0].channels, 64);
  EXPECT_EQ(l35.groups[0].bits, 4);
  EXPECT_EQ(l35.groups[1].bits, 3);
}

TEST(Format, Aliases) {
  EXPECT_EQ(ParseFormat("tq4")->name, "k4v4");
  EXPECT_EQ(ParseFormat("TQ4_KV")->name, "k4v4");
  EXPECT_EQ(ParseFormat("k4v4")->name, "k4v4");
  EXPECT_EQ(ParseFormat("tq3")->name, "k3v3");
  auto f = ParseFormat("k4v2");
  EXPECT_EQ(f->k.bits, 4);
  EXPECT_EQ(f->v.bits, 2);
  EXPECT_FALSE(f->needs_metadata());
  EXPECT_TRUE(ParseFormat("turboquant35")->needs_metadata());
  EXPECT_TRUE(ParseFormat("turboquant35")->k.qjl);
  EXPECT_FALSE(ParseFormat("turboquant35_noqjl")->k.qjl);
}

TEST(Format, RejectsUnknownNames) {
  for (const char* bad : {"k6v4", "k4v1", "tq7", "k4v4x", "turboquant45", "", "int8", "k4"}) {
    auto f = ParseFormat(bad);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(f.status().message().find("unknown cache format"), std::string::npos);
  }
  // Names are exact: no spaces, signs, leading zeros or bytes after the name.
  for (const std::string& bad : {std::string("k 4v 4"), std::string("k0004v2"), std::string("k+4v4"),
                                std::string("k4v4\0junk", 9), std::string("k4v2 "), std::string("tq 4"),
                                std::string("tq04"), std::string("k4v02"), std::string("tq4\0", 4)}) {
    EXPECT_EQ(ParseFormat(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseFormat("K3V5")->name, "k3v5");
  EXPECT_EQ(ParseFormat("tq3")->name, "k3v3");
}

TEST(Format, RecipeNeedsMultipleOf16) {
  auto l = MakeRowLayout(ParseFormat("turboquant25")->k, 100);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Format, AllNamesParse) {
  for (const std::string& n : AllFormatNames()) EXPECT_TRUE(ParseFormat(n).ok()) << n;
}

TEST(PageGeometry, OffsetsAndPadding) {
  PageGeometry g;
  g.num_blocks = 3;
  g.block_size = 16;
  g.num_kv_heads = 2;
  g.row_bytes = 68;
  g.row_align = 16;
  EXPECT_EQ(g.row_stride(), 80u);
  EXPECT_EQ(g.page_bytes(), 80u * 2 * 16);
  EXPECT_EQ(g.offset(17, 1), 17u * 160 + 80);
  EXPECT_EQ(g.num_slots(), 48);
}

}  // namespace
}  // namespace tqkv
