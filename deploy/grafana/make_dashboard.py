#!/usr/bin/env python3
"""Generates tqkv.json, the Grafana dashboard of tqkv's memory ratios, tiers,
hit rates and RPC health. Run: python3 deploy/grafana/make_dashboard.py
(checked in; tests/dashboard_test.sh verifies every metric it queries is one
the server exports)."""
import json
import os

PANELS = [
    # (title, unit, [(expr, legend)], kind)
    ("Compression ratio vs fp16 (per model)", "x",
     [("tqkv_compression_ratio", "{{tenant}}/{{model}}")], "timeseries"),
    ("Stored bytes by tier", "bytes",
     [('sum by (tier) (tqkv_stored_bytes{kind="total"})', "{{tier}}"),
      ("tqkv_gpu_used_bytes", "gpu (resident copies)")], "timeseries"),
    ("Dense-equivalent vs stored bytes", "bytes",
     [('sum(tqkv_stored_bytes{kind="dense_equivalent"})', "fp16 equivalent"),
      ('sum(tqkv_stored_bytes{kind="total"})', "stored")], "timeseries"),
    ("Stored bytes by kind", "bytes",
     [('sum by (kind) (tqkv_stored_bytes{kind=~"packed_k|packed_v|norms_metadata|dense_window"})',
       "{{kind}}")], "timeseries"),
    ("Host and GPU tier fill", "percentunit",
     [("tqkv_host_used_bytes / tqkv_host_capacity_bytes", "host"),
      ("tqkv_gpu_used_bytes / tqkv_gpu_capacity_bytes", "gpu"),
      ("tqkv_disk_used_bytes / tqkv_disk_capacity_bytes", "disk")], "timeseries"),
    ("Lookup hit rate by tier", "percentunit",
     [("sum by (tier) (rate(tqkv_lookup_hit_blocks_total[5m])) / ignoring(tier) group_left "
       "(sum(rate(tqkv_lookup_hit_blocks_total[5m])) + sum(rate(tqkv_lookup_miss_blocks_total[5m])))",
       "{{tier}}")], "timeseries"),
    ("Evictions, spills, promotions (blocks/s)", "ops",
     [("rate(tqkv_evictions_total[5m])", "host evictions"),
      ("rate(tqkv_spills_total[5m])", "spills to disk"),
      ("rate(tqkv_promotions_total[5m])", "disk → host"),
      ("rate(tqkv_gpu_promotions_total[5m])", "host → gpu"),
      ("rate(tqkv_gpu_demotions_total[5m])", "gpu demotions"),
      ("rate(tqkv_drops_total[5m])", "drops")], "timeseries"),
    ("RPC latency p99 by method", "s",
     [("histogram_quantile(0.99, sum by (le, method) (rate(tqkv_rpc_duration_seconds_bucket[5m])))",
       "{{method}}")], "timeseries"),
    ("RPC errors by method and code", "ops",
     [("sum by (method, code) (rate(tqkv_rpc_errors_total[5m]))", "{{method}} {{code}}")],
     "timeseries"),
    ("Checksum failures (should stay 0)", "none",
     [("tqkv_checksum_failures_total", "checksum failures")], "stat"),
    ("Live sequences / staged blocks", "none",
     [("tqkv_sequences", "sequences"), ("tqkv_staged_blocks", "staged blocks")], "timeseries"),
    ("Bytes owned by live sequences (appended blocks, dense tails)", "bytes",
     [("tqkv_sequence_bytes", "sequence bytes")], "timeseries"),
]


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
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tqkv.json")
    with open(out, "w") as f:
        json.dump(dash, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
