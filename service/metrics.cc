#include "service/metrics.h"

#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "service/build_info.h"
#include "service/grpc_status.h"

namespace tqkv::service {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  return *b;
}

MetricFamily Family(const char* name, const char* help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void Add(MetricFamily& f, std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f.type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
}

}  // namespace

RpcMetrics::RpcMetrics(prometheus::Registry& registry)
    : latency_(prometheus::BuildHistogram()
                   .Name("tqkv_rpc_duration_seconds")
                   .Help("Latency of tqkv RPC handlers, from start to final status.")
                   .Register(registry)),
      requests_(prometheus::BuildCounter()
                    .Name("tqkv_rpc_requests_total")
                    .Help("tqkv RPCs handled, by method.")
                    .Register(registry)),
      errors_(prometheus::BuildCounter()
                  .Name("tqkv_rpc_errors_total")
                  .Help("tqkv RPCs that ended with a non-OK status, by method and code.")
                  .Register(registry)),
      received_(prometheus::BuildCounter()
                    .Name("tqkv_rpc_received_bytes_total")
                    .Help("Request message bytes received by tqkv RPCs, by method.")
                    .Register(registry)),
      sent_(prometheus::BuildCounter()
                .Name("tqkv_rpc_sent_bytes_total")
                .Help("Response message bytes sent by tqkv RPCs, by method.")
                .Register(registry)) {}

RpcMetrics::MethodMetrics RpcMetrics::ForMethod(const std::string& method) {
  absl::MutexLock l(&mu_);
  auto it = methods_.find(method);
  if (it == methods_.end()) {
    MethodMetrics m{&latency_.Add({{"method", method}}, LatencyBuckets()),
                    &requests_.Add({{"method", method}}), &received_.Add({{"method", method}}),
                    &sent_.Add({{"method", method}})};
    it = methods_.emplace(method, m).first;
  }
  return it->second;  // a copy: flat_hash_map values move on rehash
}

void RpcMetrics::Record(const std::string& method, absl::StatusCode code, double seconds,
                        uint64_t received_bytes, uint64_t sent_bytes) {
  const MethodMetrics m = ForMethod(method);
  m.latency->Observe(seconds);
  m.requests->Increment();
  m.received->Increment(static_cast<double>(received_bytes));
  m.sent->Increment(static_cast<double>(sent_bytes));
  if (code != absl::StatusCode::kOk)
    errors_.Add({{"method", method}, {"code", CodeName(code)}}).Increment();
}

std::vector<MetricFamily> StoreCollector::Collect() const {
  const storage::StoreStats st = store_->Stats();
  std::map<std::pair<std::string, uint64_t>, std::string> names;
  for (const auto& m : registry_->List(nullptr)) names[{m->tenant, m->model_id}] = m->name;
  auto model_label = [&](const std::string& tenant, uint64_t id) {
    auto it = names.find({tenant, id});
    return it != names.end() ? it->second : absl::StrCat("id:", id);
  };

  MetricFamily bytes = Family("tqkv_stored_bytes",
                              "Stored block bytes by tier and kind, and by tenant and model where "
                              "labelled (dense_equivalent is the fp16 K+V the blocks stand for; "
                              "total is what they take).",
                              MetricType::Gauge);
  MetricFamily blocks = Family("tqkv_stored_blocks",
                               "Stored blocks by tier, and by tenant and model where labelled.",
                               MetricType::Gauge);
  MetricFamily ratio = Family("tqkv_compression_ratio",
                              "Dense-equivalent bytes over stored bytes (per tenant and model where "
                              "labelled).",
                              MetricType::Gauge);
  // (tenant, model) -> summed accounting; both empty without tenant labels.
  struct Sum {
    storage::BlockAccounting acc;
    uint64_t payload = 0, blocks = 0;
  };
  std::map<std::tuple<std::string, std::string, std::string>, Sum> sums;  // (tenant, model, tier)
  std::map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> per_model;
  uint64_t tier_blocks[storage::kNumTiers] = {};
  for (const storage::TierUsage& u : st.usage) {
    const std::string tenant = tenant_labels_ ? u.tenant : "";
    const std::string model = tenant_labels_ ? model_label(u.tenant, u.model_id) : "";
    Sum& sum = sums[{tenant, model, storage::TierName(u.tier)}];
    const storage::BlockAccounting& a = u.accounting;
    sum.acc.dense_equivalent_bytes += a.dense_equivalent_bytes;
    sum.acc.packed_k_bytes += a.packed_k_bytes;
    sum.acc.packed_v_bytes += a.packed_v_bytes;
    sum.acc.norms_metadata_bytes += a.norms_metadata_bytes;
    sum.acc.dense_window_bytes += a.dense_window_bytes;
    sum.payload += u.payload_bytes;
    sum.blocks += u.blocks;
    auto& pm = per_model[{tenant, model}];
    pm.first += a.dense_equivalent_bytes;
    pm.second += u.payload_bytes;
    tier_blocks[static_cast<int>(u.tier)] += u.blocks;
  }
  // Label sets in Prometheus' sorted order; tenant and model only when labelled.
  auto labels = [&](std::vector<ClientMetric::Label> head, const std::string& tenant,
                    const std::string& model, std::vector<ClientMetric::Label> tail) {
    if (tenant_labels_) head.push_back({"model", model});
    if (tenant_labels_) head.push_back({"tenant", tenant});
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  for (const auto& [key, sum] : sums) {
    const auto& [tenant, model, tier] = key;
    const storage::BlockAccounting& a = sum.acc;
    const std::pair<const char*, uint64_t> kinds[] = {
        {"dense_equivalent", a.dense_equivalent_bytes}, {"packed_k", a.packed_k_bytes},
        {"packed_v", a.packed_v_bytes},                 {"norms_metadata", a.norms_metadata_bytes},
        {"dense_window", a.dense_window_bytes},         {"total", sum.payload}};
    for (const auto& [kind, v] : kinds)
      Add(bytes, labels({{"kind", kind}}, tenant, model, {{"tier", tier}}), static_cast<double>(v));
    Add(blocks, labels({}, tenant, model, {{"tier", tier}}), static_cast<double>(sum.blocks));
  }
  for (const auto& [key, v] : per_model)
    Add(ratio, labels({}, key.first, key.second, {}),
        v.second ? static_cast<double>(v.first) / v.second : 0.0);

  std::vector<MetricFamily> out = {std::move(bytes), std::move(blocks), std::move(ratio)};
  MetricFamily tb = Family("tqkv_tier_blocks", "Blocks resident per tier (all tenants).",
                           MetricType::Gauge);
  for (storage::Tier t : {storage::Tier::kHost, storage::Tier::kDisk})
    Add(tb, {{"tier", storage::TierName(t)}}, static_cast<double>(tier_blocks[static_cast<int>(t)]));
  out.push_back(std::move(tb));

  auto gauge = [&](const char* name, const char* help, double v) {
    MetricFamily f = Family(name, help, MetricType::Gauge);
    Add(f, {}, v);
    out.push_back(std::move(f));
  };
  gauge("tqkv_host_used_bytes", "Host tier bytes in use (blocks and reservations).",
        static_cast<double>(st.host_used_bytes));
  gauge("tqkv_host_capacity_bytes", "Host tier byte budget.",
        static_cast<double>(st.host_capacity_bytes));
  {
    const storage::HostArena::Stats arena = st.host_arena.value_or(storage::HostArena::Stats{});
    MetricFamily f = Family("tqkv_host_arena_bytes",
                            "The pinned host tier's arena (--pin_host_tier) by state: chunks in use, freed chunks "
                            "waiting for a put of their size, never used (all 0 without the arena).",
                            MetricType::Gauge);
    Add(f, {{"state", "in_use"}}, static_cast<double>(arena.in_use_bytes));
    Add(f, {{"state", "free_listed"}}, static_cast<double>(arena.free_listed_bytes));
    Add(f, {{"state", "untouched"}}, static_cast<double>(arena.untouched_bytes));
    out.push_back(std::move(f));
    MetricFamily fb = Family("tqkv_host_arena_heap_fallbacks_total",
                             "Put buffers allocated on the heap because the arena had no chunk of their size "
                             "(they are copied through staging, not by DMA).",
                             MetricType::Counter);
    Add(fb, {}, static_cast<double>(arena.heap_fallbacks));
    out.push_back(std::move(fb));
  }
  gauge("tqkv_disk_used_bytes", "Disk tier payload bytes.", static_cast<double>(st.disk_used_bytes));
  gauge("tqkv_disk_file_bytes", "Bytes of the disk tier's payload files (removed blocks' bytes until collected).",
        static_cast<double>(st.disk_file_bytes));
  gauge("tqkv_disk_garbage_bytes", "Bytes of the disk tier's payload files that belong to removed blocks.",
        static_cast<double>(st.disk_garbage_bytes));
  gauge("tqkv_disk_index_loading", "1 while the disk tier's index is loading (counts cover the blocks indexed so far).",
        st.index_loading ? 1.0 : 0.0);
  gauge("tqkv_disk_capacity_bytes", "Disk tier byte budget (0 without a disk tier).",
        st.disk_enabled ? static_cast<double>(st.disk_capacity_bytes) : 0.0);
  gauge("tqkv_sequences", "Live decode sequences.", static_cast<double>(service_->sequences().size()));
  gauge("tqkv_sequence_bytes",
        "Host bytes held by decode sequences (appended packed blocks and dense fp32 tail rooms), "
        "outside the block store's budget (--max_sequence_bytes).",
        static_cast<double>(service_->sequences().OwnedBytes()));
  gauge("tqkv_staged_blocks", "Blocks with some but not all layers staged.",
        static_cast<double>(service_->staging().size()));
  gauge("tqkv_staged_bytes",
        "Host bytes of layer-range puts: staged blocks' buffers and the parts open streams hold "
        "(--max_staged_bytes).",
        static_cast<double>(service_->staging().bytes()));

  const storage::StoreCounters& c = st.counters;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    MetricFamily f = Family(name, help, MetricType::Counter);
    Add(f, {}, static_cast<double>(v));
    out.push_back(std::move(f));
  };
  auto per_tier = [&](const char* name, const char* help,
                      const std::array<uint64_t, storage::kNumTiers>& v) {
    MetricFamily f = Family(name, help, MetricType::Counter);
    for (storage::Tier t : {storage::Tier::kGpu, storage::Tier::kHost, storage::Tier::kDisk})
      Add(f, {{"tier", storage::TierName(t)}}, static_cast<double>(v[static_cast<int>(t)]));
    out.push_back(std::move(f));
  };
  counter("tqkv_lookups_total", "Lookup calls.", c.lookups);
  per_tier("tqkv_lookup_hit_blocks_total", "Leading prefix hits reported by Lookup, by tier.",
           c.lookup_hit_blocks);
  counter("tqkv_lookup_miss_blocks_total", "Blocks queried by Lookup that were not hits.",
          c.lookup_miss_blocks);
  per_tier("tqkv_get_hit_blocks_total", "Blocks served by reads (GetBlocks, CreateSequence), by tier.",
           c.get_hits);
  counter("tqkv_get_miss_blocks_total", "Block reads answered NOT_FOUND.", c.get_misses);
  counter("tqkv_evictions_total", "Blocks whose host copy was evicted.", c.evictions);
  counter("tqkv_evicted_bytes_total", "Bytes of evicted host copies.", c.evicted_bytes);
  counter("tqkv_spills_total", "Evictions that wrote the block to disk.", c.spills);
  counter("tqkv_spilled_bytes_total", "Bytes written to disk by evictions.", c.spilled_bytes);
  counter("tqkv_written_behind_total",
          "Host blocks copied to disk by write-behind (--write_behind_fraction), host copy kept.", c.written_behind);
  counter("tqkv_written_behind_bytes_total", "Bytes copied to disk by write-behind.", c.written_behind_bytes);
  counter("tqkv_promotions_total", "Disk blocks copied back into host memory.", c.promotions);
  counter("tqkv_promoted_bytes_total", "Bytes promoted from disk to host.", c.promoted_bytes);
  counter("tqkv_drops_total", "Blocks removed by budget pressure or Evict(drop).", c.drops);
  counter("tqkv_checksum_failures_total", "Stored blocks that failed their checksum.",
          c.checksum_failures);
  counter("tqkv_disk_errors_total",
          "Disk-tier write batches (spills, durable puts, deletes) that failed: a full disk, the free-space "
          "headroom or an I/O error.",
          c.disk_errors);
  counter("tqkv_puts_committed_total", "Blocks committed.", c.puts_committed);
  counter("tqkv_puts_already_present_total", "Puts of blocks already stored with the same bytes.",
          c.puts_already_present);
  counter("tqkv_puts_aborted_total", "Reserved puts released without commit.", c.puts_aborted);
  counter("tqkv_puts_rejected_total", "Puts refused for lack of host memory.", c.puts_rejected);
  counter("tqkv_deletes_total", "Blocks deleted.", c.deletes);

  // GPU tier (packed pages resident in HBM, a cache above host memory).
  const BackendStats gpu = service_->backend().Stats();
  gauge("tqkv_gpu_capacity_bytes", "GPU tier arena bytes (0 on the CPU backend).",
        static_cast<double>(gpu.device_bytes_capacity));
  gauge("tqkv_gpu_used_bytes", "Packed block bytes resident in the GPU tier.",
        static_cast<double>(gpu.device_bytes_used));
  gauge("tqkv_gpu_blocks", "Blocks resident in the GPU tier.", static_cast<double>(gpu.device_blocks));
  gauge("tqkv_host_pinned_bytes", "Bytes of the host tier's arena pinned for DMA so far (--pin_host_tier).",
        static_cast<double>(gpu.host_pinned_bytes));
  counter("tqkv_gpu_promotions_total", "Blocks copied from host memory into the GPU tier.",
          gpu.uploads);
  counter("tqkv_gpu_demotions_total", "Blocks dropped from the GPU tier to make room (their host copy stays).",
          gpu.evictions);

  MetricFamily info = Family("tqkv_backend_info", "The compute backend serving this process.",
                             MetricType::Gauge);
  Add(info, {{"backend", service_->backend().name()}}, 1);
  out.push_back(std::move(info));
  out.push_back(BuildInfoFamily(CurrentBuildInfo(), service_->backend().name()));
  return out;
}

}  // namespace tqkv::service
