#include "service/data_plane_metrics.h"

namespace tqkv::service {

std::vector<prometheus::MetricFamily> DataPlaneCollector::Collect() const {
  const DataPlaneServer::Stats st = data_plane_->GetStats();
  std::vector<prometheus::MetricFamily> out;
  auto add = [&](const char* name, const char* help, prometheus::MetricType type, double v) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = type;
    prometheus::ClientMetric m;
    if (type == prometheus::MetricType::Counter) {
      m.counter.value = v;
    } else {
      m.gauge.value = v;
    }
    f.metric.push_back(std::move(m));
    out.push_back(std::move(f));
  };
  using prometheus::MetricType;
  add("tqkv_data_plane_connections", "Open data-plane connections.", MetricType::Gauge, st.connections);
  add("tqkv_data_plane_buffered_bytes",
      "Bytes of incomplete data-plane request frames (4 + declared length each) charged to "
      "--data_max_buffered_bytes.",
      MetricType::Gauge, static_cast<double>(st.buffered_bytes));
  add("tqkv_data_plane_buffered_budget_bytes", "The data plane's budget of buffered request bytes.",
      MetricType::Gauge, static_cast<double>(st.buffered_budget_bytes));
  add("tqkv_data_plane_budget_refusals_total",
      "Data-plane request frames refused (RESOURCE_EXHAUSTED) because they would exceed the buffered-bytes budget.",
      MetricType::Counter, static_cast<double>(st.budget_refusals));
  add("tqkv_data_plane_reply_bytes",
      "Payload bytes of data-plane replies not yet written to their sockets, charged to --data_max_reply_bytes.",
      MetricType::Gauge, static_cast<double>(st.reply_bytes));
  add("tqkv_data_plane_frame_timeouts_total",
      "Data-plane request frames failed (DEADLINE_EXCEEDED) for not arriving within --data_frame_timeout_s.",
      MetricType::Counter, static_cast<double>(st.frame_timeouts));
  add("tqkv_work_queue_waiting",
      "Requests waiting for a backend work thread (--work_threads): puts and dense gets.",
      MetricType::Gauge, static_cast<double>(st.work_waiting));
  add("tqkv_work_queue_capacity", "Requests the backend work queue holds at most (--work_queue).", MetricType::Gauge,
      static_cast<double>(st.work_capacity));
  add("tqkv_work_queue_full_total",
      "Requests the full backend work queue refused: data-plane ones are held back and offered again, gRPC ones "
      "run on their gRPC thread.",
      MetricType::Counter, static_cast<double>(st.work_refusals));
  return out;
}

}  // namespace tqkv::service
