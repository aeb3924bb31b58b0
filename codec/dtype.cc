#include "codec/dtype.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "codec/simd.h"

namespace tqkv {

size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
    case DType::kF32: return "fp32";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  std::string n(name);
  absl::AsciiStrToLower(&n);
  if (n == "fp16" || n == "float16" || n == "half") return DType::kF16;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "fp32" || n == "float32" || n == "float") return DType::kF32;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", std::string(name), "' (expected fp16, bf16 or fp32)"));
}

void ToFloat(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kF16: {
      const auto* s = static_cast<const Float16*>(src);
      size_t i = n & ~size_t{7};
      simd::HalfToFloat(static_cast<const uint16_t*>(src), dst, static_cast<int>(i));
      for (; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(s[i]);
      return;
    }
  }
}

void FromFloat(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kF16: {
      auto* d = static_cast<Float16*>(dst);
      size_t i = n & ~size_t{7};
      simd::FloatToHalf(src, static_cast<uint16_t*>(dst), static_cast<int>(i));
      for (; i < n; ++i) d[i] = static_cast<Float16>(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToBF16(src[i]);
      return;
    }
  }
}

}  // namespace tqkv
