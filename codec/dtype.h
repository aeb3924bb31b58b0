// Element types of dense K/V tensors and their conversions to fp32.
#ifndef TQKV_CODEC_DTYPE_H_
#define TQKV_CODEC_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/status/statusor.h"

namespace tqkv {

enum class DType : uint8_t { kF16 = 0, kBF16 = 1, kF32 = 2 };

// Bytes per element: 2 for fp16/bf16, 4 for fp32.
size_t DTypeSize(DType t);
std::string_view DTypeName(DType t);
// Accepts "fp16"/"float16"/"half", "bf16"/"bfloat16", "fp32"/"float32"/"float".
absl::StatusOr<DType> ParseDType(std::string_view name);

// IEEE binary16 as a C++ type. Clang before 15 has no _Float16 on x86
// (the fuzzers build with Debian's clang 14); its storage-only __fp16
// converts the same way.
#if defined(__clang__) && __clang_major__ < 15
using Float16 = __fp16;
#else
using Float16 = _Float16;
#endif

// IEEE binary16 <-> binary32, round to nearest even (hardware F16C where the
// compiler targets it).
inline float HalfToFloat(uint16_t h) {
  Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
}
inline uint16_t FloatToHalf(float f) {
  Float16 v = static_cast<Float16>(f);
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
}
inline float BF16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays NaN.
inline uint16_t FloatToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Converts `n` elements of type `t` at `src` to fp32.
void ToFloat(DType t, const void* src, float* dst, size_t n);
// Converts `n` fp32 values to type `t` at `dst`.
void FromFloat(DType t, const float* src, void* dst, size_t n);

}  // namespace tqkv

#endif  // TQKV_CODEC_DTYPE_H_
