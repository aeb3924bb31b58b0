#include "codec/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tqkv {

double AttentionShape::effective_scale() const {
  return scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(dim));
}

void ReferenceAttention(const AttentionShape& s, const float* q, int64_t nq,
                        const int64_t* positions, const float* k, const float* v, int64_t tokens,
                        double* out) {
  const int d = s.dim, group = s.q_heads / s.kv_heads;
  const double scale = s.effective_scale();
  std::vector<double> scores;
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t n = std::min(positions[i] + 1, tokens);
    scores.resize(n);
    for (int h = 0; h < s.q_heads; ++h) {
      const int kvh = h / group;
      const float* qh = q + (i * s.q_heads + h) * d;
      double mx = -INFINITY;
      for (int64_t t = 0; t < n; ++t) {
        const float* kr = k + (t * s.kv_heads + kvh) * d;
        double dot = 0;
        for (int j = 0; j < d; ++j) dot += static_cast<double>(qh[j]) * kr[j];
        scores[t] = dot * scale;
        mx = std::max(mx, scores[t]);
      }
      double sum = 0;
      for (int64_t t = 0; t < n; ++t) sum += (scores[t] = std::exp(scores[t] - mx));
      double* o = out + (i * s.q_heads + h) * d;
      for (int j = 0; j < d; ++j) o[j] = 0;
      for (int64_t t = 0; t < n; ++t) {
        const float* vr = v + (t * s.kv_heads + kvh) * d;
        const double p = scores[t] / sum;
        for (int j = 0; j < d; ++j) o[j] += p * vr[j];
      }
    }
  }
}

void DequantizeSequence(const LayerCodec& layer, int block_size, const PackedSequence& seq,
                        std::vector<float>* k, std::vector<float>* v) {
  const int heads = layer.num_kv_heads(), d = layer.k(0).dim();
  const int64_t total = seq.total_tokens();
  k->assign(static_cast<size_t>(total) * heads * d, 0.0f);
  v->assign(k->size(), 0.0f);
  for (int64_t t = 0; t < seq.packed_tokens; ++t) {
    const int64_t b = t / block_size, off = t % block_size;
    for (int h = 0; h < heads; ++h) {
      const size_t kr = (off * heads + h) * layer.k_row_bytes();
      const size_t vr = (off * heads + h) * layer.v_row_bytes();
      layer.k(h).Decode(seq.k_pages[b] + kr, k->data() + (t * heads + h) * d);
      layer.v(h).Decode(seq.v_pages[b] + vr, v->data() + (t * heads + h) * d);
    }
  }
  for (int64_t t = 0; t < seq.tail_k.tokens; ++t)
    for (int h = 0; h < heads; ++h) {
      const int64_t at = seq.packed_tokens + t;
      ToFloat(seq.tail_k.dtype, seq.tail_k.row(t, h), k->data() + (at * heads + h) * d, d);
      ToFloat(seq.tail_v.dtype, seq.tail_v.row(t, h), v->data() + (at * heads + h) * d, d);
    }
}

absl::Status AttendPacked(const LayerCodec& layer, int block_size, const AttentionShape& s,
                          const PackedSequence& seq, const float* q, int64_t nq,
                          const int64_t* positions, float* out, ThreadPool* pool) {
  if (s.kv_heads != layer.num_kv_heads() || s.dim != layer.k(0).dim() || s.q_heads <= 0 ||
      s.q_heads % s.kv_heads != 0)
    return absl::InvalidArgumentError(absl::StrCat("attention shape (q_heads ", s.q_heads,
                                                   ", kv_heads ", s.kv_heads, ", dim ", s.dim,
                                                   ") does not match the layer"));
  if (seq.packed_tokens > static_cast<int64_t>(seq.k_pages.size()) * block_size ||
      seq.k_pages.size() != seq.v_pages.size())
    return absl::InvalidArgumentError("sequence has fewer pages than packed tokens");
  if (seq.tail_k.tokens != seq.tail_v.tokens)
    return absl::InvalidArgumentError("dense tail K and V token counts differ");
  if (seq.tail_k.tokens > 0 && (seq.tail_k.heads != s.kv_heads || seq.tail_k.dim != s.dim ||
                                seq.tail_v.heads != s.kv_heads || seq.tail_v.dim != s.dim))
    return absl::InvalidArgumentError("dense tail shape does not match the layer");
  const int64_t total = seq.total_tokens();
  for (int64_t i = 0; i < nq; ++i)
    if (positions[i] < 0 || positions[i] >= total)
      return absl::InvalidArgumentError(absl::StrCat("query ", i, " position ", positions[i],
                                                     " outside the sequence of ", total, " tokens"));
  const int d = s.dim, group = s.q_heads / s.kv_heads, kvh_count = s.kv_heads;
  const float scale = static_cast<float>(s.effective_scale());
  // One work item per (query, kv head): every q head of the GQA group is
  // scored against a packed row unpacked once (RowCodec::ScoreMany).
  auto work = [&](int64_t begin, int64_t end) {
    std::vector<float> states, acc, scores, tail_row(d), tmp(group), weights(group), mx(group),
        inv(group);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t i = w / kvh_count;
      const int kvh = static_cast<int>(w % kvh_count);
      const RowCodec& kc = layer.k(kvh);
      const RowCodec& vc = layer.v(kvh);
      const int ks = kc.query_state_size(), vs = vc.value_state_size();
      const float* q0 = q + (i * s.q_heads + kvh * group) * d;  // the group's q heads
      states.resize(static_cast<size_t>(group) * ks);
      for (int g = 0; g < group; ++g) kc.PrepareQuery(q0 + g * d, states.data() + g * ks);
      const int64_t n = positions[i] + 1;
      scores.resize(static_cast<size_t>(group) * n);  // [g][t]
      std::fill(mx.begin(), mx.end(), -INFINITY);
      const int64_t packed = std::min(n, seq.packed_tokens);
      for (int64_t t = 0; t < packed; ++t) {
        const uint8_t* row = seq.k_pages[t / block_size] +
                             ((t % block_size) * kvh_count + kvh) * layer.k_row_bytes();
        kc.ScoreMany(row, states.data(), group, tmp.data());
        for (int g = 0; g < group; ++g) {
          const float sc = tmp[g] * scale;
          scores[g * n + t] = sc;
          mx[g] = std::max(mx[g], sc);
        }
      }
      for (int64_t t = packed; t < n; ++t) {
        ToFloat(seq.tail_k.dtype, seq.tail_k.row(t - seq.packed_tokens, kvh), tail_row.data(), d);
        for (int g = 0; g < group; ++g) {
          float dot = 0;
          for (int j = 0; j < d; ++j) dot += q0[g * d + j] * tail_row[j];
          scores[g * n + t] = dot * scale;
          mx[g] = std::max(mx[g], scores[g * n + t]);
        }
      }
      for (int g = 0; g < group; ++g) {
        float sum = 0;
        for (int64_t t = 0; t < n; ++t) sum += (scores[g * n + t] = std::exp(scores[g * n + t] - mx[g]));
        inv[g] = 1.0f / sum;
      }
      acc.assign(static_cast<size_t>(group) * vs, 0.0f);
      for (int64_t t = 0; t < packed; ++t) {
        const uint8_t* row = seq.v_pages[t / block_size] +
                             ((t % block_size) * kvh_count + kvh) * layer.v_row_bytes();
        for (int g = 0; g < group; ++g) weights[g] = scores[g * n + t] * inv[g];
        vc.AccumulateMany(row, weights.data(), group, acc.data());
      }
      for (int g = 0; g < group; ++g) {
        float* o = out + (i * s.q_heads + kvh * group + g) * d;
        vc.FinishValue(acc.data() + g * vs, o);
        for (int64_t t = packed; t < n; ++t) {
          ToFloat(seq.tail_v.dtype, seq.tail_v.row(t - seq.packed_tokens, kvh), tail_row.data(), d);
          const float p = scores[g * n + t] * inv[g];
          for (int j = 0; j < d; ++j) o[j] += p * tail_row[j];
        }
      }
    }
  };
  const int64_t items = nq * kvh_count;
  if (pool) {
    pool->ParallelFor(items, 1, work);
  } else {
    work(0, items);
  }
  return absl::OkStatus();
}

}  // namespace tqkv
