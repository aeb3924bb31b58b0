#include "storage/clock.h"

#include <gtest/gtest.h>

namespace tqkv::storage {
namespace {

TEST(FakeClock, MovesOnlyWhenTold) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1005));
  clock.Set(absl::FromUnixSeconds(7));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(7));
}

TEST(RealClock, IsNearAbslNow) {
  RealClock clock;
  Clock& c = clock;
  EXPECT_LT(absl::AbsDuration(c.Now() - absl::Now()), absl::Seconds(5));
}

}  // namespace
}  // namespace tqkv::storage
