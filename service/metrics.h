// Prometheus metrics of the service (prefix tqkv_). Nothing here is global:
// the server's composition root creates a prometheus::Registry, hands it to
// RpcMetrics, and serves it with a StoreCollector next to it on the metrics
// listener (metrics_http.h).
//
// RpcMetrics (event metrics, updated by the RPC wrapper):
//   tqkv_rpc_duration_seconds{method}        histogram of handler latency
//   tqkv_rpc_requests_total{method}          calls
//   tqkv_rpc_errors_total{method,code}       calls that ended non-OK
//   tqkv_rpc_received_bytes_total{method}    request message bytes
//   tqkv_rpc_sent_bytes_total{method}        response message bytes
//       (serialized protobuf messages of the gRPC methods, without gRPC
//       framing or TLS; the data plane's Data* methods record none)
//
// Process metrics (process_*) come from ProcessCollector (process_metrics.h).
//
// StoreCollector (state read on every scrape from BlockStore::Stats() and
// the registry; counters are the store's monotonic counters):
//   tqkv_stored_bytes{tenant,model,tier,kind}   kind: dense_equivalent,
//       packed_k, packed_v, norms_metadata, dense_window, total
//   tqkv_stored_blocks{tenant,model,tier}
//   tqkv_compression_ratio{tenant,model}        dense_equivalent / total
//   (tenant and model only with tenant_labels; without them the series
//   are summed over tenants and models, so /metrics names none)
//   tqkv_tier_blocks{tier}, tqkv_host_{used,capacity}_bytes,
//   tqkv_disk_{used,capacity}_bytes
//   tqkv_lookups_total, tqkv_lookup_hit_blocks_total{tier},
//   tqkv_lookup_miss_blocks_total, tqkv_get_hit_blocks_total{tier},
//   tqkv_get_miss_blocks_total, tqkv_evictions_total,
//   tqkv_evicted_bytes_total, tqkv_spills_total, tqkv_spilled_bytes_total,
//   tqkv_promotions_total, tqkv_promoted_bytes_total, tqkv_drops_total,
//   tqkv_checksum_failures_total, tqkv_puts_committed_total,
//   tqkv_puts_already_present_total, tqkv_puts_aborted_total,
//   tqkv_puts_rejected_total, tqkv_deletes_total
//   tqkv_sequences, tqkv_staged_blocks, tqkv_backend_info{backend}
//   tqkv_build_info{version,commit,backend}   (service/build_info.h)
//
// Thread safety: both classes are thread-safe.
#ifndef TQKV_SERVICE_METRICS_H_
#define TQKV_SERVICE_METRICS_H_

#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "service/kv_service.h"
#include "service/model_registry.h"
#include "storage/block_store.h"

namespace tqkv::service {

class RpcMetrics {
 public:
  // `registry` must outlive this object.
  explicit RpcMetrics(prometheus::Registry& registry);
  // One finished call that received `received_bytes` and sent `sent_bytes`
  // of messages.
  void Record(const std::string& method, absl::StatusCode code, double seconds,
              uint64_t received_bytes = 0, uint64_t sent_bytes = 0);

 private:
  struct MethodMetrics {
    prometheus::Histogram* latency;
    prometheus::Counter* requests;
    prometheus::Counter* received;
    prometheus::Counter* sent;
  };
  // The method's series, created on first use and cached (prometheus-cpp's
  // Family::Add hashes a label map under a lock on every call).
  MethodMetrics ForMethod(const std::string& method);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, MethodMetrics> methods_ ABSL_GUARDED_BY(mu_);
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& errors_;
  prometheus::Family<prometheus::Counter>& received_;
  prometheus::Family<prometheus::Counter>& sent_;
};

class StoreCollector : public prometheus::Collectable {
 public:
  // None owned; all must outlive the collector (stop the metrics listener
  // before destroying them). `tenant_labels`: label the per-model
  // series with tenant and model (else sum them).
  StoreCollector(storage::BlockStore* store, ModelRegistry* registry, KvService* service,
                 bool tenant_labels = true)
      : store_(store), registry_(registry), service_(service), tenant_labels_(tenant_labels) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  storage::BlockStore* const store_;
  ModelRegistry* const registry_;
  KvService* const service_;
  const bool tenant_labels_;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_METRICS_H_
