#include "service/build_info.h"

#include <gtest/gtest.h>

namespace tqkv::service {
namespace {

std::string Label(const prometheus::ClientMetric& m, const std::string& name) {
  for (const auto& l : m.label)
    if (l.name == name) return l.value;
  return "<absent>";
}

TEST(BuildInfoTest, OneGaugeSampleOfValueOneLabelledVersionCommitBackend) {
  const prometheus::MetricFamily f = BuildInfoFamily({"1.2.3", "0a1b2c"}, "cuda");
  EXPECT_EQ(f.name, "tqkv_build_info");
  EXPECT_EQ(f.type, prometheus::MetricType::Gauge);
  ASSERT_EQ(f.metric.size(), 1u);
  const prometheus::ClientMetric& m = f.metric[0];
  EXPECT_EQ(m.label.size(), 3u);
  EXPECT_EQ(Label(m, "version"), "1.2.3");
  EXPECT_EQ(Label(m, "commit"), "0a1b2c");
  EXPECT_EQ(Label(m, "backend"), "cuda");
  EXPECT_EQ(m.gauge.value, 1);
}

TEST(BuildInfoTest, EmptyValuesReadUnknown) {
  const prometheus::ClientMetric m = BuildInfoFamily({}, "").metric.at(0);
  EXPECT_EQ(Label(m, "version"), "unknown");
  EXPECT_EQ(Label(m, "commit"), "unknown");
  EXPECT_EQ(Label(m, "backend"), "unknown");
}

TEST(BuildInfoTest, CurrentBuildIsThisRelease) {
  EXPECT_EQ(CurrentBuildInfo().version, kTqkvVersion);
  EXPECT_NE(std::string(kTqkvVersion), "");
}

}  // namespace
}  // namespace tqkv::service
