// Deterministic seeds and random streams shared by every backend.
//
// Seed derivation (documented contract; CPU and GPU read the same tables):
//   s0 = SplitMix64(model_seed)
//   s1 = SplitMix64(s0 ^ layer)
//   seed(layer, kv_head, component) = SplitMix64(s1 ^ (kv_head << 1 | component))
// where component is 0 for K and 1 for V, and SplitMix64 is the finaliser of
// Steele, Lea & Flood (2014). Random streams are SplitMix64 generators seeded
// with such a seed; a sign is +1 when the top bit of the next word is 0.
#ifndef TQKV_CODEC_SEED_H_
#define TQKV_CODEC_SEED_H_

#include <cstdint>

namespace tqkv {

enum class Component : uint8_t { kKey = 0, kValue = 1 };

// The SplitMix64 output function (a bijective 64-bit mixer).
constexpr uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t DeriveSeed(uint64_t model_seed, uint32_t layer, uint32_t kv_head,
                              Component c) {
  uint64_t s0 = SplitMix64(model_seed);
  uint64_t s1 = SplitMix64(s0 ^ layer);
  return SplitMix64(s1 ^ ((static_cast<uint64_t>(kv_head) << 1) | static_cast<uint64_t>(c)));
}

// A SplitMix64 stream: word i is SplitMix64(seed + i * golden) as in the
// reference generator.
class SplitMixStream {
 public:
  explicit SplitMixStream(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // +1.0f or -1.0f from the top bit of the next word.
  float NextSign() { return (Next() >> 63) ? -1.0f : 1.0f; }
  // Uniform in (0, 1): 53 random bits, never 0.
  double NextUniform() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }
  // Standard normal by Box-Muller (uses two words per call).
  double NextGaussian();

 private:
  uint64_t state_;
};

}  // namespace tqkv

#endif  // TQKV_CODEC_SEED_H_
