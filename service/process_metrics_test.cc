#include "service/process_metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace tqkv::service {
namespace {

std::map<std::string, double> Values(const std::vector<prometheus::MetricFamily>& families) {
  std::map<std::string, double> v;
  for (const auto& f : families) {
    EXPECT_EQ(f.metric.size(), 1u) << f.name;
    v[f.name] = f.type == prometheus::MetricType::Counter ? f.metric[0].counter.value
                                                          : f.metric[0].gauge.value;
  }
  return v;
}

void Write(const std::filesystem::path& p, const std::string& s) { std::ofstream(p) << s; }

// A fake procfs: a command name with spaces and parentheses, 3 fds.
TEST(ProcessCollectorTest, ReadsStatFdsAndLimits) {
  const std::filesystem::path root = std::filesystem::path(std::getenv("TEST_TMPDIR")) / "proc";
  std::filesystem::create_directories(root / "self" / "fd");
  // Fields 3..24: state ppid pgrp session tty tpgid flags minflt cminflt
  // majflt cmajflt utime(14)=250 stime(15)=150 cutime cstime priority nice
  // threads itrealvalue starttime(22)=5000 vsize(23)=123456789 rss(24)=300.
  Write(root / "self" / "stat",
        "42 (tq (kv) srv) S 1 42 42 0 -1 4194560 10 0 0 0 250 150 0 0 20 0 7 0 5000 123456789 "
        "300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n");
  Write(root / "stat", "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n");
  Write(root / "self" / "limits",
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max open files            1024                 524288               files     \n");
  for (const char* fd : {"0", "1", "2"}) Write(root / "self" / "fd" / fd, "");

  const auto v = Values(ProcessCollector::ForTest(root.string(), 100, 4096).Collect());
  EXPECT_DOUBLE_EQ(v.at("process_cpu_seconds_total"), 4.0);
  EXPECT_DOUBLE_EQ(v.at("process_resident_memory_bytes"), 300.0 * 4096);
  EXPECT_DOUBLE_EQ(v.at("process_virtual_memory_bytes"), 123456789);
  EXPECT_DOUBLE_EQ(v.at("process_start_time_seconds"), 1700000000 + 50);
  EXPECT_DOUBLE_EQ(v.at("process_open_fds"), 3);
  EXPECT_DOUBLE_EQ(v.at("process_max_fds"), 1024);
}

TEST(ProcessCollectorTest, MissingFilesLeaveTheirMetricsOut) {
  const std::filesystem::path root = std::filesystem::path(std::getenv("TEST_TMPDIR")) / "empty";
  std::filesystem::create_directories(root);
  EXPECT_TRUE(ProcessCollector::ForTest(root.string(), 100, 4096).Collect().empty());
}

TEST(ProcessCollectorTest, ThisProcess) {
  const auto v = Values(ProcessCollector().Collect());
  EXPECT_GT(v.at("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(v.at("process_open_fds"), 3);
  EXPECT_GT(v.at("process_start_time_seconds"), 1.6e9);
  EXPECT_GE(v.at("process_cpu_seconds_total"), 0);
}

}  // namespace
}  // namespace tqkv::service
