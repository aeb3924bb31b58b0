// ProcessCollector: the standard Prometheus process metrics of this process,
// read from procfs on every scrape (prometheus-cpp has no process
// collector):
//   process_cpu_seconds_total          user + system CPU time
//   process_resident_memory_bytes      resident set size
//   process_virtual_memory_bytes       virtual memory size
//   process_open_fds                   open file descriptors
//   process_max_fds                    the soft limit on them
//   process_start_time_seconds         start time, seconds since the epoch
// A file that cannot be read leaves its metrics out of that scrape.
//
// Thread safety: thread-safe (Collect only reads files).
#ifndef TQKV_SERVICE_PROCESS_METRICS_H_
#define TQKV_SERVICE_PROCESS_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <string>
#include <vector>

namespace tqkv::service {

class ProcessCollector : public prometheus::Collectable {
 public:
  // Reads /proc/self and /proc/stat.
  ProcessCollector() = default;
  std::vector<prometheus::MetricFamily> Collect() const override;

  // Reads `proc_root`/self/{stat,statm,fd,limits} and `proc_root`/stat
  // instead, with `ticks_per_second` and `page_bytes` in place of sysconf's.
  static ProcessCollector ForTest(std::string proc_root, long ticks_per_second, long page_bytes);

 private:
  std::string proc_root_ = "/proc";
  long ticks_per_second_ = 0;  // 0: sysconf(_SC_CLK_TCK)
  long page_bytes_ = 0;        // 0: sysconf(_SC_PAGESIZE)
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_PROCESS_METRICS_H_
