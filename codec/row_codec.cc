#include "codec/row_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "codec/canonical.h"
#include "codec/dtype.h"
#include "codec/packing.h"
#include "codec/simd.h"

namespace tqkv {
namespace {

constexpr int kMaxDim = 1024;

void StoreF32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }
float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
void StoreF16(uint8_t* p, float v) {
  uint16_t h = FloatToHalf(v);
  std::memcpy(p, &h, 2);
}
float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

float LoadNorm(const RowCodec::Group& g, const uint8_t* row) {
  return g.layout.fp16_norms ? LoadF16(row + g.layout.norm_offset)
                             : LoadF32(row + g.layout.norm_offset);
}
float LoadResidual(const RowCodec::Group& g, const uint8_t* row) {
  return g.layout.fp16_norms ? LoadF16(row + g.layout.residual_offset)
                             : LoadF32(row + g.layout.residual_offset);
}

// ŷ for one group: centroids plus the QJL correction; returns the norm.
float DecodeRotated(const RowCodec::Group& g, const uint8_t* row, float* yhat) {
  const int n = g.layout.channels;
  uint8_t idx[kMaxDim];
  UnpackBits(row + g.layout.index_offset, n, g.layout.mse_bits, idx);
  const float* c = g.codebook->centroids_f.data();
  for (int j = 0; j < n; ++j) yhat[j] = c[idx[j]];
  if (g.layout.qjl) {
    uint8_t s[kMaxDim];
    UnpackBits(row + g.layout.sign_offset, n, 1, s);
    float gamma = LoadResidual(g, row) * g.qjl_scale;
    for (int i = 0; i < n; ++i) {
      float sign = s[i] ? gamma : -gamma;
      const float* srow = &g.qjl[static_cast<size_t>(i) * n];
      if (n % 8 == 0) {
        simd::Axpy(sign, srow, yhat, n);
      } else {
        for (int j = 0; j < n; ++j) yhat[j] += sign * srow[j];
      }
    }
  }
  return LoadNorm(g, row);
}

}  // namespace

uint64_t QjlSeed(uint64_t model_seed, Component c, int group) {
  return SplitMix64(SplitMix64(model_seed ^ 0x514a4c00ULL) ^
                    ((static_cast<uint64_t>(c) << 8) | static_cast<uint64_t>(group)));
}

size_t RowCodec::HeapBytes() const {
  size_t bytes = sizeof(RowCodec);
  for (const Group& g : groups_) {
    const Rotation& r = g.rotation;
    bytes += sizeof(Group) + sizeof(int) * (g.channels.size() + r.blocks().size()) +
             sizeof(float) * (g.qjl.size() + g.qjl_t.size() + r.signs1().size() + r.signs2().size() +
                              r.matrix().size());
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<RowCodec>> RowCodec::Create(const ComponentSpec& spec, int dim,
                                                           RotationKind rotation,
                                                           const CodecKey& key,
                                                           const std::vector<int>& high) {
  if (dim > kMaxDim)
    return absl::InvalidArgumentError(absl::StrCat("head dim ", dim, " > ", kMaxDim));
  absl::StatusOr<RowLayout> layout = MakeRowLayout(spec, dim);
  if (!layout.ok()) return layout.status();
  std::unique_ptr<RowCodec> codec(new RowCodec());
  codec->layout_ = *std::move(layout);
  if (spec.kind == ComponentSpec::Kind::kDense) {
    codec->query_state_size_ = dim;
    return codec;
  }
  const uint64_t seed = DeriveSeed(key.model_seed, key.layer, key.kv_head, key.component);
  std::vector<std::vector<int>> channels;
  if (spec.kind == ComponentSpec::Kind::kMse) {
    if (!high.empty())
      return absl::InvalidArgumentError("high-precision channels given for a non-recipe format");
    channels.emplace_back(dim);
    for (int j = 0; j < dim; ++j) channels[0][j] = j;
  } else {
    const int want = codec->layout_.groups[0].channels;
    if (static_cast<int>(high.size()) != want)
      return absl::InvalidArgumentError(absl::StrCat(RecipeName(spec.recipe), " at head dim ", dim,
                                                     " needs ", want,
                                                     " high-precision channels, got ", high.size()));
    std::vector<bool> is_high(dim, false);
    for (size_t i = 0; i < high.size(); ++i) {
      if (high[i] < 0 || high[i] >= dim)
        return absl::InvalidArgumentError(
            absl::StrCat("high-precision channel ", high[i], " outside [0, ", dim, ")"));
      if (i > 0 && high[i] <= high[i - 1])
        return absl::InvalidArgumentError("high-precision channels must be sorted and unique");
      is_high[high[i]] = true;
    }
    channels.push_back(high);
    channels.emplace_back();
    for (int j = 0; j < dim; ++j)
      if (!is_high[j]) channels[1].push_back(j);
  }
  for (size_t gi = 0; gi < channels.size(); ++gi) {
    Group g;
    g.layout = codec->layout_.groups[gi];
    g.channels = std::move(channels[gi]);
    g.identity = g.channels.size() == static_cast<size_t>(dim);
    const int n = g.layout.channels;
    RotationKind kind = spec.kind == ComponentSpec::Kind::kRecipe ? RotationKind::kBlockHadamard
                                                                  : rotation;
    uint64_t group_seed = spec.kind == ComponentSpec::Kind::kRecipe ? SplitMix64(seed + gi) : seed;
    absl::StatusOr<Rotation> rot = Rotation::Create(kind, n, group_seed);
    if (!rot.ok()) return rot.status();
    g.rotation = *std::move(rot);
    absl::StatusOr<const Codebook*> cb = GetCodebook(n, g.layout.mse_bits);
    if (!cb.ok()) return cb.status();
    g.codebook = *cb;
    if (g.layout.qjl) {
      SplitMixStream rng(QjlSeed(key.model_seed, key.component, static_cast<int>(gi)));
      g.qjl.resize(static_cast<size_t>(n) * n);
      for (float& s : g.qjl) s = static_cast<float>(rng.NextGaussian());
      g.qjl_t.resize(g.qjl.size());
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) g.qjl_t[static_cast<size_t>(j) * n + i] = g.qjl[static_cast<size_t>(i) * n + j];
      g.qjl_scale = static_cast<float>(std::sqrt(std::numbers::pi / 2) / n);
    }
    codec->query_state_size_ += n * (g.layout.qjl ? 2 : 1);
    codec->groups_.push_back(std::move(g));
  }
  return codec;
}

void RowCodec::Encode(const float* x, uint8_t* row) const {
  if (layout_.spec.kind == ComponentSpec::Kind::kDense) {
    FromFloat(DType::kF16, x, row, layout_.dim);
    return;
  }
  float buf[kMaxDim];
  uint8_t idx[kMaxDim];
  for (const Group& g : groups_) {
    const int n = g.layout.channels;
    if (g.identity) {
      std::memcpy(buf, x, sizeof(float) * n);
    } else {
      for (int j = 0; j < n; ++j) buf[j] = x[g.channels[j]];
    }
    const bool vec = n % 8 == 0;  // SIMD path: bit-identical results (simd.h)
    const float norm = vec ? std::sqrt(simd::SumSquares(buf, n)) : CanonicalNorm(buf, n);
    const float inv = SafeReciprocal(norm);
    if (vec) {
      simd::Scale(buf, inv, buf, n);
    } else {
      for (int j = 0; j < n; ++j) buf[j] = buf[j] * inv;
    }
    g.rotation.Forward(buf, buf);
    const float* b = g.codebook->boundaries_f.data();
    const int nb = static_cast<int>(g.codebook->boundaries_f.size());
    if (vec) {
      simd::Quantize(buf, n, b, nb, idx);
    } else {
      for (int j = 0; j < n; ++j) idx[j] = NearestIndex(b, nb, buf[j]);
    }
    PackBits(idx, n, g.layout.mse_bits, row + g.layout.index_offset);
    if (g.layout.fp16_norms) {
      StoreF16(row + g.layout.norm_offset, norm);
    } else {
      StoreF32(row + g.layout.norm_offset, norm);
    }
    if (g.layout.qjl) {
      const float* c = g.codebook->centroids_f.data();
      for (int j = 0; j < n; ++j) buf[j] = buf[j] - c[idx[j]];
      const float gamma = CanonicalNorm(buf, n);
      if (g.layout.fp16_norms) {
        StoreF16(row + g.layout.residual_offset, gamma);
      } else {
        StoreF32(row + g.layout.residual_offset, gamma);
      }
      uint8_t s[kMaxDim];
      if (vec) {
        float z[kMaxDim];
        simd::MatVecTransposed(g.qjl_t.data(), buf, z, n);
        for (int i = 0; i < n; ++i) s[i] = z[i] >= 0.0f;
      } else {
        for (int i = 0; i < n; ++i) {
          const float* srow = &g.qjl[static_cast<size_t>(i) * n];
          float acc = 0.0f;
          for (int j = 0; j < n; ++j) acc = std::fma(srow[j], buf[j], acc);
          s[i] = acc >= 0.0f;
        }
      }
      PackBits(s, n, 1, row + g.layout.sign_offset);
    }
  }
}

void RowCodec::Decode(const uint8_t* row, float* x) const {
  if (layout_.spec.kind == ComponentSpec::Kind::kDense) {
    ToFloat(DType::kF16, row, x, layout_.dim);
    return;
  }
  float yhat[kMaxDim];
  for (const Group& g : groups_) {
    const int n = g.layout.channels;
    float norm = DecodeRotated(g, row, yhat);
    g.rotation.Inverse(yhat, yhat);
    for (int j = 0; j < n; ++j) x[g.channels[j]] = yhat[j] * norm;
  }
}

void RowCodec::PrepareQuery(const float* q, float* state) const {
  if (layout_.spec.kind == ComponentSpec::Kind::kDense) {
    std::memcpy(state, q, sizeof(float) * layout_.dim);
    return;
  }
  float* p = state;
  for (const Group& g : groups_) {
    const int n = g.layout.channels;
    for (int j = 0; j < n; ++j) p[j] = q[g.channels[j]];
    g.rotation.Forward(p, p);
    if (g.layout.qjl) {
      // Sq: <S q_rot, ±1> gives the sketch term of <q_rot, Sᵀ s>.
      for (int i = 0; i < n; ++i) {
        const float* srow = &g.qjl[static_cast<size_t>(i) * n];
        float acc = 0;
        for (int j = 0; j < n; ++j) acc += srow[j] * p[j];
        p[n + i] = acc;
      }
      p += n;
    }
    p += n;
  }
}

void RowCodec::ScoreMany(const uint8_t* row, const float* states, int count, float* out) const {
  const int stride = query_state_size_;
  if (layout_.spec.kind == ComponentSpec::Kind::kDense) {
    float x[kMaxDim];
    ToFloat(DType::kF16, row, x, layout_.dim);
    for (int q = 0; q < count; ++q) {
      const float* st = states + q * stride;
      float acc = 0;
      for (int j = 0; j < layout_.dim; ++j) acc += st[j] * x[j];
      out[q] = acc;
    }
    return;
  }
  for (int q = 0; q < count; ++q) out[q] = 0;
  int offset = 0;  // of the group's terms within a state
  uint8_t idx[kMaxDim], s[kMaxDim];
  for (const Group& g : groups_) {
    const int n = g.layout.channels;
    UnpackBits(row + g.layout.index_offset, n, g.layout.mse_bits, idx);
    if (g.layout.qjl) UnpackBits(row + g.layout.sign_offset, n, 1, s);
    const float* c = g.codebook->centroids_f.data();
    const int levels = 1 << g.layout.mse_bits;
    const float norm = LoadNorm(g, row);
    const float residual = g.layout.qjl ? LoadResidual(g, row) * g.qjl_scale : 0.0f;
    for (int q = 0; q < count; ++q) {
      const float* p = states + q * stride + offset;
      float dot = 0;
      if (n % 8 == 0) {
        dot = simd::LutDot(p, idx, n, c, levels);
      } else {
        for (int j = 0; j < n; ++j) dot += p[j] * c[idx[j]];
      }
      if (g.layout.qjl) {
        float sk = 0;
        for (int i = 0; i < n; ++i) sk += s[i] ? p[n + i] : -p[n + i];
        dot += residual * sk;
      }
      out[q] += norm * dot;
    }
    offset += n * (g.layout.qjl ? 2 : 1);
  }
}

void RowCodec::AccumulateMany(const uint8_t* row, const float* weights, int count,
                              float* accs) const {
  const int stride = query_state_size_;
  if (layout_.spec.kind == ComponentSpec::Kind::kDense) {
    float x[kMaxDim];
    ToFloat(DType::kF16, row, x, layout_.dim);
    for (int q = 0; q < count; ++q)
      for (int j = 0; j < layout_.dim; ++j) accs[q * stride + j] += weights[q] * x[j];
    return;
  }
  int offset = 0;
  uint8_t idx[kMaxDim], s[kMaxDim];
  for (const Group& g : groups_) {
    const int n = g.layout.channels;
    UnpackBits(row + g.layout.index_offset, n, g.layout.mse_bits, idx);
    if (g.layout.qjl) UnpackBits(row + g.layout.sign_offset, n, 1, s);
    const float* c = g.codebook->centroids_f.data();
    const float norm = LoadNorm(g, row);
    const float residual = g.layout.qjl ? LoadResidual(g, row) * g.qjl_scale : 0.0f;
    for (int q = 0; q < count; ++q) {
      float* p = accs + q * stride + offset;
      const float wn = weights[q] * norm;
      if (n % 8 == 0) {
        simd::LutAxpy(wn, idx, n, c, 1 << g.layout.mse_bits, p);
      } else {
        for (int j = 0; j < n; ++j) p[j] += wn * c[idx[j]];
      }
      if (g.layout.qjl) {
        const float ws = wn * residual;
        for (int i = 0; i < n; ++i) p[n + i] += s[i] ? ws : -ws;
      }
    }
    offset += n * (g.layout.qjl ? 2 : 1);
  }
}

void RowCodec::FinishValue(const float* acc, float* out) const {
  if (layout_.spec.kind == ComponentSpec::Kind::kDense) {
    std::memcpy(out, acc, sizeof(float) * layout_.dim);
    return;
  }
  float y[kMaxDim];
  const float* p = acc;
  for (const Group& g : groups_) {
    const int n = g.layout.channels;
    std::memcpy(y, p, sizeof(float) * n);
    if (g.layout.qjl) {
      // y += Sᵀ a, a the accumulated signed sketch weights.
      const float* a = p + n;
      for (int i = 0; i < n; ++i) {
        const float* srow = &g.qjl[static_cast<size_t>(i) * n];
        for (int j = 0; j < n; ++j) y[j] += a[i] * srow[j];
      }
      p += n;
    }
    g.rotation.Inverse(y, y);
    for (int j = 0; j < n; ++j) out[g.channels[j]] = y[j];
    p += n;
  }
}

}  // namespace tqkv
