// LSB-first bit packing of small unsigned indices.
//
// Contract (reference §3): bit k of index j is stored at absolute bit
// position j*bits + k, i.e. byte (j*bits+k)/8, bit (j*bits+k)%8. At 4 bits the
// even index is the low nibble; 3- and 5-bit indices cross byte boundaries.
// Unused high bits of the last byte are zero.
#ifndef TQKV_CODEC_PACKING_H_
#define TQKV_CODEC_PACKING_H_

#include <cstddef>
#include <cstdint>

namespace tqkv {

// Bytes needed for `n` indices of `bits` bits: ceil(n*bits/8).
constexpr size_t PackedBytes(size_t n, int bits) { return (n * bits + 7) / 8; }

// Packs n indices (each < 2^bits) into out[0, PackedBytes(n, bits)).
// REQUIRES: 1 <= bits <= 8. Writes every output byte (no need to pre-zero).
void PackBits(const uint8_t* idx, size_t n, int bits, uint8_t* out);

// Inverse of PackBits: reads PackedBytes(n, bits) bytes, writes n indices.
void UnpackBits(const uint8_t* in, size_t n, int bits, uint8_t* idx);

}  // namespace tqkv

#endif  // TQKV_CODEC_PACKING_H_
