// AVX2 versions of the canonical fp32 primitives. Each computes exactly the
// same values as its scalar contract (canonical.h, rotation.h, codebook.h):
// the same operations on the same operands, only several lanes at a time, so
// results are bit-identical (simd_test.cc checks this on random data).
// The build targets x86-64-v3 (AVX2 + FMA + F16C); see .bazelrc.
#ifndef TQKV_CODEC_SIMD_H_
#define TQKV_CODEC_SIMD_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace tqkv::simd {

// CanonicalSumSquares for n a multiple of 8 (lanes past n count as zero).
inline float SumSquares(const float* x, int n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  for (int base = 0; base < n; base += 32) {
    for (int r = 0; r < 4 && base + 8 * r < n; ++r) {
      __m256 v = _mm256_loadu_ps(x + base + 8 * r);
      acc[r] = _mm256_fmadd_ps(v, v, acc[r]);
    }
  }
  // Butterfly: off 16 pairs vectors (0,2),(1,3); off 8 pairs (0,1); then
  // offsets 4, 2, 1 inside a vector. Lane values match the scalar contract.
  __m256 t0 = _mm256_add_ps(acc[0], acc[2]);
  __m256 t1 = _mm256_add_ps(acc[1], acc[3]);
  __m256 u = _mm256_add_ps(t0, t1);
  u = _mm256_add_ps(u, _mm256_permute2f128_ps(u, u, 1));
  u = _mm256_add_ps(u, _mm256_permute_ps(u, _MM_SHUFFLE(1, 0, 3, 2)));
  u = _mm256_add_ps(u, _mm256_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm256_cvtss_f32(u);
}

// One FWHT of n = 2^k >= 8 values (stage order h = 1, 2, 4, ... as Fwht()).
inline void Fwht(float* v, int n) {
  for (int i = 0; i < n; i += 8) {
    __m256 x = _mm256_loadu_ps(v + i);
    // h = 1: even lanes a+b, odd lanes a−b (= swapped − x).
    __m256 s = _mm256_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1));
    __m256 sum = _mm256_add_ps(x, s), diff = _mm256_sub_ps(s, x);
    x = _mm256_blend_ps(sum, diff, 0b10101010);
    // h = 2
    s = _mm256_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2));
    sum = _mm256_add_ps(x, s), diff = _mm256_sub_ps(s, x);
    x = _mm256_blend_ps(sum, diff, 0b11001100);
    // h = 4
    s = _mm256_permute2f128_ps(x, x, 1);
    sum = _mm256_add_ps(x, s), diff = _mm256_sub_ps(s, x);
    x = _mm256_blend_ps(sum, diff, 0b11110000);
    _mm256_storeu_ps(v + i, x);
  }
  for (int h = 8; h < n; h <<= 1) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; j += 8) {
        __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + h);
        _mm256_storeu_ps(v + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(v + j + h, _mm256_sub_ps(a, b));
      }
    }
  }
}

// idx[j] = #{k : y[j] > bounds[k]} for n a multiple of 8.
inline void Quantize(const float* y, int n, const float* bounds, int nb, uint8_t* idx) {
  auto store = [&](__m256i count, int j) {  // narrow 8 × int32 → 8 × uint8
    __m128i lo = _mm256_castsi256_si128(count), hi = _mm256_extracti128_si256(count, 1);
    __m128i w = _mm_packus_epi32(lo, hi);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(idx + j), _mm_packus_epi16(w, w));
  };
  int j = 0;
  for (; j + 32 <= n; j += 32) {  // four vectors share each broadcast boundary
    __m256 v0 = _mm256_loadu_ps(y + j), v1 = _mm256_loadu_ps(y + j + 8);
    __m256 v2 = _mm256_loadu_ps(y + j + 16), v3 = _mm256_loadu_ps(y + j + 24);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
    for (int k = 0; k < nb; ++k) {
      const __m256 b = _mm256_broadcast_ss(bounds + k);
      c0 = _mm256_sub_epi32(c0, _mm256_castps_si256(_mm256_cmp_ps(v0, b, _CMP_GT_OQ)));
      c1 = _mm256_sub_epi32(c1, _mm256_castps_si256(_mm256_cmp_ps(v1, b, _CMP_GT_OQ)));
      c2 = _mm256_sub_epi32(c2, _mm256_castps_si256(_mm256_cmp_ps(v2, b, _CMP_GT_OQ)));
      c3 = _mm256_sub_epi32(c3, _mm256_castps_si256(_mm256_cmp_ps(v3, b, _CMP_GT_OQ)));
    }
    store(c0, j), store(c1, j + 8), store(c2, j + 16), store(c3, j + 24);
  }
  for (; j < n; j += 8) {
    __m256 v = _mm256_loadu_ps(y + j);
    __m256i count = _mm256_setzero_si256();
    for (int k = 0; k < nb; ++k) {
      __m256 gt = _mm256_cmp_ps(v, _mm256_broadcast_ss(bounds + k), _CMP_GT_OQ);
      count = _mm256_sub_epi32(count, _mm256_castps_si256(gt));  // −(−1) per hit
    }
    store(count, j);
  }
}

// fp16 → fp32 (F16C, exact) for n a multiple of 8.
inline void HalfToFloat(const uint16_t* h, float* out, int n) {
  for (int j = 0; j < n; j += 8)
    _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + j))));
}

// fp32 → fp16, rounding to nearest even (F16C; as a cast to _Float16) for n
// a multiple of 8.
inline void FloatToHalf(const float* x, uint16_t* out, int n) {
  for (int j = 0; j < n; j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 4-bit LSB-first packing of n (multiple of 16) indices < 16.
inline void Pack4(const uint8_t* idx, int n, uint8_t* out) {
  const __m128i mul = _mm_set1_epi16(0x1001);  // lo byte ×1, hi byte ×16
  for (int j = 0; j < n; j += 16) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(idx + j));
    __m128i pairs = _mm_maddubs_epi16(v, mul);  // idx[2i] + 16·idx[2i+1]
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + j / 2), _mm_packus_epi16(pairs, pairs));
  }
}

// out[j] = (x[j] * s[j]) for n a multiple of 8 (used for sign flips).
inline void Mul(const float* x, const float* s, float* out, int n) {
  for (int j = 0; j < n; j += 8)
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(s + j)));
}

// out[j] = (x[j] * c) * s[j]  (rotation epilogue, same rounding as scalar).
inline void ScaleMul(const float* x, float c, const float* s, float* out, int n) {
  const __m256 cv = _mm256_set1_ps(c);
  for (int j = 0; j < n; j += 8)
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), cv),
                                            _mm256_loadu_ps(s + j)));
}

// out[j] = x[j] * c.
inline void Scale(const float* x, float c, float* out, int n) {
  const __m256 cv = _mm256_set1_ps(c);
  for (int j = 0; j < n; j += 8) _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), cv));
}

// out[j] += a * x[j] for n a multiple of 8 (fused; used where the contract
// is a tolerance, not bits: decoding QJL corrections).
inline void Axpy(float a, const float* x, float* out, int n) {
  const __m256 av = _mm256_set1_ps(a);
  for (int j = 0; j < n; j += 8)
    _mm256_storeu_ps(out + j, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + j), _mm256_loadu_ps(out + j)));
}

// z_i = Σ_j m_t[j·n + i] · r_j for i < n (n a multiple of 8), each z_i
// accumulated with fmaf in ascending j from 0 — the canonical QJL sketch
// order — eight rows at a time from the transposed matrix m_t.
inline void MatVecTransposed(const float* m_t, const float* r, float* z, int n) {
  for (int i = 0; i < n; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < n; ++j)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(m_t + static_cast<size_t>(j) * n + i),
                            _mm256_set1_ps(r[j]), acc);
    _mm256_storeu_ps(z + i, acc);
  }
}

// Eight table entries c[idx[j..j+7]] (levels <= 256 entries in c).
inline __m256 LutLoad8(const uint8_t* idx, const float* c, int levels, __m256 lo, __m256 hi) {
  const __m256i iv = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(idx)));
  if (levels <= 8) return _mm256_permutevar8x32_ps(lo, iv);
  if (levels <= 16) {
    const __m256 a = _mm256_permutevar8x32_ps(lo, iv), b = _mm256_permutevar8x32_ps(hi, iv);
    const __m256 use_hi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(iv, _mm256_set1_epi32(7)));
    return _mm256_blendv_ps(a, b, use_hi);
  }
  return _mm256_i32gather_ps(c, iv, 4);
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Σ_j p[j] · c[idx[j]] for n a multiple of 8 (attention scores on packed
// keys; a tolerance contract, not bits: the sum order differs from scalar).
inline float LutDot(const float* p, const uint8_t* idx, int n, const float* c, int levels) {
  alignas(32) float tab[16] = {};  // tables of < 16 entries must not be over-read
  std::memcpy(tab, c, sizeof(float) * (levels < 16 ? levels : 16));
  const __m256 lo = _mm256_load_ps(tab), hi = _mm256_load_ps(tab + 8);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(p + j), LutLoad8(idx + j, c, levels, lo, hi), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(p + j + 8), LutLoad8(idx + j + 8, c, levels, lo, hi), acc1);
  }
  for (; j < n; j += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(p + j), LutLoad8(idx + j, c, levels, lo, hi), acc0);
  return HorizontalSum(_mm256_add_ps(acc0, acc1));
}

// acc[j] += w · c[idx[j]] for n a multiple of 8 (value accumulation).
inline void LutAxpy(float w, const uint8_t* idx, int n, const float* c, int levels, float* acc) {
  alignas(32) float tab[16] = {};  // tables of < 16 entries must not be over-read
  std::memcpy(tab, c, sizeof(float) * (levels < 16 ? levels : 16));
  const __m256 lo = _mm256_load_ps(tab), hi = _mm256_load_ps(tab + 8);
  const __m256 wv = _mm256_set1_ps(w);
  for (int j = 0; j < n; j += 8)
    _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(wv, LutLoad8(idx + j, c, levels, lo, hi),
                                              _mm256_loadu_ps(acc + j)));
}

}  // namespace tqkv::simd

#endif  // TQKV_CODEC_SIMD_H_
