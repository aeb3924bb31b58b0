#include "codec/packing.h"

#include <cstring>

#include "codec/simd.h"

namespace tqkv {

void PackBits(const uint8_t* idx, size_t n, int bits, uint8_t* out) {
  if (n == 0) return;  // nothing to write (and the pointers may be null)
  const size_t nbytes = PackedBytes(n, bits);
  switch (bits) {
    case 8:
      std::memcpy(out, idx, n);
      return;
    case 4:
      if (n % 16 == 0) {
        simd::Pack4(idx, static_cast<int>(n), out);
        return;
      }
      for (size_t i = 0; i + 1 < n; i += 2) out[i / 2] = uint8_t(idx[i] | (idx[i + 1] << 4));
      if (n & 1) out[n / 2] = idx[n - 1];
      return;
    case 2:
      for (size_t b = 0; b < nbytes; ++b) {
        uint8_t v = 0;
        for (size_t k = 0; k < 4 && b * 4 + k < n; ++k) v |= uint8_t(idx[b * 4 + k] << (2 * k));
        out[b] = v;
      }
      return;
    default:
      break;
  }
  // Generic: accumulate into a 64-bit window and flush whole bytes.
  uint64_t acc = 0;
  int have = 0;
  size_t o = 0;
  const uint32_t mask = (1u << bits) - 1u;
  for (size_t i = 0; i < n; ++i) {
    acc |= static_cast<uint64_t>(idx[i] & mask) << have;
    have += bits;
    while (have >= 8) {
      out[o++] = static_cast<uint8_t>(acc);
      acc >>= 8;
      have -= 8;
    }
  }
  if (have > 0) out[o++] = static_cast<uint8_t>(acc);
}

void UnpackBits(const uint8_t* in, size_t n, int bits, uint8_t* idx) {
  if (n == 0) return;
  switch (bits) {
    case 8:
      std::memcpy(idx, in, n);
      return;
    case 4:
      for (size_t i = 0; i + 1 < n; i += 2) {
        idx[i] = in[i / 2] & 0xf;
        idx[i + 1] = in[i / 2] >> 4;
      }
      if (n & 1) idx[n - 1] = in[n / 2] & 0xf;
      return;
    default:
      break;
  }
  uint64_t acc = 0;
  int have = 0;
  size_t p = 0;
  const uint32_t mask = (1u << bits) - 1u;
  for (size_t i = 0; i < n; ++i) {
    while (have < bits) {
      acc |= static_cast<uint64_t>(in[p++]) << have;
      have += 8;
    }
    idx[i] = static_cast<uint8_t>(acc & mask);
    acc >>= bits;
    have -= bits;
  }
}

}  // namespace tqkv
