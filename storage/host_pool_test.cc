#include "storage/host_pool.h"

#include <gtest/gtest.h>

#include <cstring>

namespace tqkv::storage {
namespace {

TEST(HostBuffer, AllocatesAndCopies) {
  auto buf = HostBuffer::CopyOf("hello");
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ((*buf)->view(), "hello");
  EXPECT_EQ((*buf)->size(), 5u);
  auto empty = HostBuffer::Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->size(), 0u);
  EXPECT_EQ((*empty)->view(), "");
}

TEST(HostBuffer, HugeAllocationFailsAsStatus) {
  auto buf = HostBuffer::Allocate(size_t{1} << 62);
  EXPECT_EQ(buf.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(HostPool, WatermarksFollowOptions) {
  HostPool pool({.capacity_bytes = 1000, .high_watermark = 0.9, .low_watermark = 0.8});
  EXPECT_EQ(pool.capacity_bytes(), 1000u);
  EXPECT_EQ(pool.high_bytes(), 900u);
  EXPECT_EQ(pool.low_bytes(), 800u);
}

TEST(HostPool, ReserveNeverExceedsCapacity) {
  HostPool pool({.capacity_bytes = 1000});
  EXPECT_TRUE(pool.TryReserve(600));
  EXPECT_FALSE(pool.TryReserve(401));
  EXPECT_EQ(pool.used_bytes(), 600u);
  EXPECT_TRUE(pool.TryReserve(400));
  EXPECT_EQ(pool.used_bytes(), 1000u);
  EXPECT_FALSE(pool.TryReserve(1));
  pool.Release(1000);
  EXPECT_EQ(pool.used_bytes(), 0u);
}

TEST(HostPool, BytesToFreeEvictsFromHighDownToLow) {
  HostPool pool({.capacity_bytes = 1000, .high_watermark = 0.9, .low_watermark = 0.8});
  ASSERT_TRUE(pool.TryReserve(800));
  EXPECT_EQ(pool.BytesToFreeFor(100), 0u);  // 900 is at, not above, the high mark
  ASSERT_TRUE(pool.TryReserve(100));
  EXPECT_EQ(pool.BytesToFreeFor(100), 200u);  // 1000 -> 800
  EXPECT_EQ(pool.BytesToFreeFor(850), 750u);  // larger than low: down to capacity
}

TEST(HostPool, ValidateRejectsInvertedWatermarks) {
  EXPECT_FALSE(HostPool::Validate({.high_watermark = 0.5, .low_watermark = 0.6}).ok());
  EXPECT_FALSE(HostPool::Validate({.high_watermark = 1.5}).ok());
  EXPECT_TRUE(HostPool::Validate({}).ok());
}

}  // namespace
}  // namespace tqkv::storage
