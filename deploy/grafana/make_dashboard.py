#!/usr/bin/env python3
"""Generates tqkv.json, the Grafana dashboard of tqkv's memory ratios, tiers,
hit rates, RPC health and traffic, and the server process' memory, CPU and
file descriptors. Run: python3 deploy/grafana/make_dashboard.py
(checked in; tests/dashboard_test.cc evaluates every query against a real
server through Prometheus)."""
import json
import os

# Every series is filtered by the instance variable; rates use Grafana's
# $__rate_interval (at least four scrapes).
I = 'instance=~"$instance"'
R = "$__rate_interval"


def sel(metric, extra=""):
    """`metric{instance=~"$instance",extra}`."""
    return "%s{%s%s}" % (metric, I, "," + extra if extra else "")


def rate(metric, extra=""):
    return "rate(%s[%s])" % (sel(metric, extra), R)


def hit_ratio(hits, misses, by_tier):
    """Hits over hits + misses in the window. Without traffic the
    denominator is 0 and `> 0` drops it: the panel shows a gap, not 0/0."""
    total = "(sum(%s) + sum(%s) > 0)" % (rate(hits), rate(misses))
    if by_tier:
        return "sum by (tier) (%s) / on () group_left () %s" % (rate(hits), total)
    return "sum(%s) / %s" % (rate(hits), total)


def fill(used, capacity):
    """used / capacity; a capacity of 0 (no GPU, no disk tier) reads as 0
    fill, not NaN."""
    return "%s / clamp_min(%s, 1)" % (sel(used), sel(capacity))


PER_METHOD_REQUESTS = "sum by (method) (%s)" % rate("tqkv_rpc_requests_total")

PANELS = [
    # (title, unit, [(expr, legend)], kind)
    ("Compression ratio vs fp16 (per model where labelled)", "x",
     [(sel("tqkv_compression_ratio"), "{{instance}} {{tenant}} {{model}}")], "timeseries"),
    ("Stored bytes by tier", "bytes",
     [("sum by (tier) (%s)" % sel("tqkv_stored_bytes", 'kind="total"'), "{{tier}}"),
      ("sum(%s)" % sel("tqkv_gpu_used_bytes"), "gpu (resident copies)")], "timeseries"),
    ("Dense-equivalent vs stored bytes", "bytes",
     [("sum(%s)" % sel("tqkv_stored_bytes", 'kind="dense_equivalent"'), "fp16 equivalent"),
      ("sum(%s)" % sel("tqkv_stored_bytes", 'kind="total"'), "stored")], "timeseries"),
    ("Stored bytes by kind", "bytes",
     [("sum by (kind) (%s)" % sel("tqkv_stored_bytes",
                                  'kind=~"packed_k|packed_v|norms_metadata|dense_window"'),
       "{{kind}}")], "timeseries"),
    ("Host, GPU and disk tier fill", "percentunit",
     [(fill("tqkv_host_used_bytes", "tqkv_host_capacity_bytes"), "{{instance}} host"),
      (fill("tqkv_gpu_used_bytes", "tqkv_gpu_capacity_bytes"), "{{instance}} gpu"),
      (fill("tqkv_disk_used_bytes", "tqkv_disk_capacity_bytes"), "{{instance}} disk")],
     "timeseries"),
    ("Disk tier space: payloads, their files, removed blocks' bytes", "bytes",
     [(sel("tqkv_disk_used_bytes"), "{{instance}} payloads"),
      (sel("tqkv_disk_file_bytes"), "{{instance}} files"),
      (sel("tqkv_disk_garbage_bytes"), "{{instance}} garbage")], "timeseries"),
    ("Requests per method", "reqps",
     [(PER_METHOD_REQUESTS, "{{method}}")], "timeseries"),
    ("Error ratio per method (non-OK / calls)", "percentunit",
     # Methods without errors show 0 rather than nothing.
     [("(sum by (method) (%s) or 0 * %s) / (%s > 0)"
       % (rate("tqkv_rpc_errors_total"), PER_METHOD_REQUESTS, PER_METHOD_REQUESTS),
       "{{method}}")], "timeseries"),
    ("RPC errors by method and code", "ops",
     [("sum by (method, code) (%s)" % rate("tqkv_rpc_errors_total"), "{{method}} {{code}}")],
     "timeseries"),
    ("RPC latency p99 by method", "s",
     # Only methods called in the window (others would be NaN).
     [("histogram_quantile(0.99, sum by (le, method) (%s)) and on (method) "
       "(sum by (method) (%s) > 0)"
       % (rate("tqkv_rpc_duration_seconds_bucket"), rate("tqkv_rpc_duration_seconds_count")),
       "{{method}}")], "timeseries"),
    ("Lookup hit rate by tier", "percentunit",
     [(hit_ratio("tqkv_lookup_hit_blocks_total", "tqkv_lookup_miss_blocks_total", True),
       "{{tier}}")], "timeseries"),
    ("Block read hit rate (GetBlocks, CreateSequence)", "percentunit",
     [(hit_ratio("tqkv_get_hit_blocks_total", "tqkv_get_miss_blocks_total", False), "all tiers"),
      (hit_ratio("tqkv_get_hit_blocks_total", "tqkv_get_miss_blocks_total", True), "{{tier}}")],
     "timeseries"),
    ("Rejected puts (host memory full, blocks/s)", "ops",
     [(rate("tqkv_puts_rejected_total"), "{{instance}} rejected"),
      (rate("tqkv_puts_aborted_total"), "{{instance}} aborted")], "timeseries"),
    ("Evictions, spills, promotions (blocks/s)", "ops",
     [("sum(%s)" % rate("tqkv_evictions_total"), "host evictions"),
      ("sum(%s)" % rate("tqkv_spills_total"), "spills to disk"),
      ("sum(%s)" % rate("tqkv_promotions_total"), "disk → host"),
      ("sum(%s)" % rate("tqkv_gpu_promotions_total"), "host → gpu"),
      ("sum(%s)" % rate("tqkv_gpu_demotions_total"), "gpu demotions"),
      ("sum(%s)" % rate("tqkv_drops_total"), "drops")], "timeseries"),
    ("Checksum failures (should stay 0)", "none",
     [("sum(%s)" % sel("tqkv_checksum_failures_total"), "checksum failures")], "stat"),
    ("Live sequences / staged blocks", "none",
     [("sum(%s)" % sel("tqkv_sequences"), "sequences"),
      ("sum(%s)" % sel("tqkv_staged_blocks"), "staged blocks")], "timeseries"),
    ("Bytes owned by live sequences (appended blocks, dense tails)", "bytes",
     [(sel("tqkv_sequence_bytes"), "{{instance}}")], "timeseries"),
    ("gRPC message bytes per method (received, sent)", "Bps",
     [("sum by (method) (%s)" % rate("tqkv_rpc_received_bytes_total"), "{{method}} in"),
      ("sum by (method) (%s)" % rate("tqkv_rpc_sent_bytes_total"), "{{method}} out")],
     "timeseries"),
    ("Server resident memory", "bytes",
     [(sel("process_resident_memory_bytes"), "{{instance}} resident"),
      (sel("tqkv_host_capacity_bytes"), "{{instance}} host tier budget")], "timeseries"),
    ("Server CPU (cores busy)", "none",
     [(rate("process_cpu_seconds_total"), "{{instance}}")], "timeseries"),
    ("Open file descriptors / limit", "percentunit",
     [("%s / clamp_min(%s, 1)" % (sel("process_open_fds"), sel("process_max_fds")),
       "{{instance}}")], "timeseries"),
]

# The instance (in Kubernetes: the pod's address) to show; all by default.
INSTANCE_VARIABLE = {
    "name": "instance",
    "label": "Instance (pod)",
    "type": "query",
    "datasource": {"type": "prometheus", "uid": "${datasource}"},
    "definition": "label_values(tqkv_backend_info, instance)",
    "query": {"query": "label_values(tqkv_backend_info, instance)", "refId": "instance"},
    "refresh": 2,
    "multi": True,
    "includeAll": True,
    "allValue": ".*",
    "sort": 1,
}


def panel(i, title, unit, targets, kind):
    return {
        "id": i + 1,
        "type": kind,
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + j), "expr": e, "legendFormat": l}
                    for j, (e, l) in enumerate(targets)],
    }


def main():
    dash = {
        "title": "tqkv — KV-cache store",
        "uid": "tqkv-overview",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"},
                               INSTANCE_VARIABLE]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tqkv.json")
    with open(out, "w") as f:
        json.dump(dash, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
