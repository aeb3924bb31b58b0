// Prometheus metrics of the data plane, read from DataPlaneServer::GetStats()
// on every scrape (server.cc registers the collector with the metrics listener):
//   tqkv_data_plane_connections                   open connections
//   tqkv_data_plane_buffered_bytes                bytes of incomplete request
//       frames charged to --data_max_buffered_bytes
//   tqkv_data_plane_buffered_budget_bytes         that budget
//   tqkv_data_plane_budget_refusals_total         frames refused for it
//   tqkv_data_plane_frame_timeouts_total          frames failed for
//       --data_frame_timeout_s
//   tqkv_work_queue_waiting, _capacity            the backend work queue
//       (--work_threads, --work_queue): requests waiting, its bound
//   tqkv_work_queue_full_total                    requests it refused
//
// Thread safety: thread-safe (GetStats is).
#ifndef TQKV_SERVICE_DATA_PLANE_METRICS_H_
#define TQKV_SERVICE_DATA_PLANE_METRICS_H_

#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "service/data_plane.h"

namespace tqkv::service {

class DataPlaneCollector : public prometheus::Collectable {
 public:
  // `data_plane` is not owned and must outlive the collector (unregister it
  // from the metrics listener, or stop the listener, first).
  explicit DataPlaneCollector(const DataPlaneServer* data_plane) : data_plane_(data_plane) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const DataPlaneServer* const data_plane_;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_DATA_PLANE_METRICS_H_
