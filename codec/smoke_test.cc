#include <gtest/gtest.h>
#include "absl/status/statusor.h"
TEST(Smoke, Works) { absl::StatusOr<int> v = 3; EXPECT_EQ(*v, 3); }
