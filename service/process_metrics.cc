#include "service/process_metrics.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tqkv::service {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

bool ReadAll(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

MetricFamily One(const char* name, const char* help, MetricType type, double v) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  ClientMetric m;
  if (type == MetricType::Counter) {
    m.counter.value = v;
  } else {
    m.gauge.value = v;
  }
  f.metric.push_back(std::move(m));
  return f;
}

}  // namespace

ProcessCollector ProcessCollector::ForTest(std::string proc_root, long ticks_per_second,
                                           long page_bytes) {
  ProcessCollector c;
  c.proc_root_ = std::move(proc_root);
  c.ticks_per_second_ = ticks_per_second;
  c.page_bytes_ = page_bytes;
  return c;
}

std::vector<MetricFamily> ProcessCollector::Collect() const {
  std::vector<MetricFamily> out;
  const double ticks = ticks_per_second_ > 0 ? ticks_per_second_ : sysconf(_SC_CLK_TCK);
  const double page = page_bytes_ > 0 ? page_bytes_ : sysconf(_SC_PAGESIZE);

  // /proc/self/stat: "pid (comm) state ..." where comm may hold spaces and
  // parentheses; the fields after the last ')' start with field 3 (state).
  std::string stat;
  if (ReadAll(proc_root_ + "/self/stat", &stat)) {
    const size_t close = stat.rfind(')');
    std::vector<absl::string_view> f;
    if (close != std::string::npos)
      f = absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
    // f[0] is field 3; utime 14, stime 15, starttime 22, vsize 23, rss 24.
    double utime, stime, start, vsize, rss;
    if (f.size() >= 22 && absl::SimpleAtod(f[11], &utime) && absl::SimpleAtod(f[12], &stime) &&
        absl::SimpleAtod(f[19], &start) && absl::SimpleAtod(f[20], &vsize) &&
        absl::SimpleAtod(f[21], &rss)) {
      out.push_back(One("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                        MetricType::Counter, (utime + stime) / ticks));
      out.push_back(One("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                        MetricType::Gauge, vsize));
      out.push_back(One("process_resident_memory_bytes", "Resident memory size in bytes.",
                        MetricType::Gauge, rss * page));
      // Boot time (btime in /proc/stat) plus the start in ticks since boot.
      std::string sys;
      if (ReadAll(proc_root_ + "/stat", &sys)) {
        for (absl::string_view line : absl::StrSplit(sys, '\n')) {
          double btime;
          if (absl::ConsumePrefix(&line, "btime ") && absl::SimpleAtod(line, &btime)) {
            out.push_back(One("process_start_time_seconds",
                              "Start time of the process since unix epoch in seconds.",
                              MetricType::Gauge, btime + start / ticks));
            break;
          }
        }
      }
    }
  }

  std::error_code ec;
  size_t fds = 0;
  for (std::filesystem::directory_iterator it(proc_root_ + "/self/fd", ec), end; !ec && it != end;
       it.increment(ec))
    ++fds;
  if (!ec)
    out.push_back(One("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
                      static_cast<double>(fds)));

  std::string limits;
  if (ReadAll(proc_root_ + "/self/limits", &limits)) {
    for (absl::string_view line : absl::StrSplit(limits, '\n')) {
      if (!absl::ConsumePrefix(&line, "Max open files")) continue;
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      double soft;
      if (!f.empty() && absl::SimpleAtod(f[0], &soft))
        out.push_back(One("process_max_fds", "Maximum number of open file descriptors.",
                          MetricType::Gauge, soft));
      break;
    }
  }
  return out;
}

}  // namespace tqkv::service
