// RowCodec: encodes and decodes one component's rows for one (layer, kv head),
// and computes attention terms directly on packed rows.
//
// Encoding a group of g channels x_g (canonical fp32, see canonical.h and
// rotation.h):
//   n = CanonicalNorm(x_g); u = x_g · SafeReciprocal(n); y = Π u;
//   idx_j = number of fp32 codebook boundaries < y_j  (codebook (g, mse_bits));
//   with QJL: r = y − c[idx] (fp32), γ = CanonicalNorm(r),
//             s_i = 1 if Σ_j S_ij r_j >= 0 else 0 (fmaf, ascending j from 0),
//             S the g×g matrix of SplitMixStream(QjlSeed).NextGaussian() as fp32.
// The QJL sketch is taken in the rotated space (S Πᵀ is again iid Gaussian).
// Decoding: ŷ = c[idx] (+ γ·√(π/2)/g · Sᵀ(2s−1) with QJL); x̂_g = n · Πᵀ ŷ.
//
// Seeds: the row's rotation seed is DeriveSeed(model_seed, layer, kv_head, c);
// group i (0 = high precision) rotates with SplitMix64(seed + i); QJL matrices
// depend only on (model seed, component, group) through QjlSeed().
//
// Recipes gather the high-precision channels (sorted metadata indices) into
// group 0 and the remaining channels, ascending, into group 1.
//
// Thread safety: immutable after Create; all methods are const and may be
// called concurrently.
#ifndef TQKV_CODEC_ROW_CODEC_H_
#define TQKV_CODEC_ROW_CODEC_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/codebook.h"
#include "codec/format.h"
#include "codec/rotation.h"
#include "codec/seed.h"

namespace tqkv {

struct CodecKey {
  uint64_t model_seed = 0;
  uint32_t layer = 0;
  uint32_t kv_head = 0;
  Component component = Component::kKey;
};

uint64_t QjlSeed(uint64_t model_seed, Component c, int group);

class RowCodec {
 public:
  struct Group {
    GroupLayout layout;
    std::vector<int> channels;  // source channel of each group coordinate
    bool identity = false;      // channels == 0..d-1
    Rotation rotation;
    const Codebook* codebook = nullptr;
    std::vector<float> qjl;     // g×g row-major, QJL only
    std::vector<float> qjl_t;   // its transpose (for the vectorised sketch)
    float qjl_scale = 0;        // √(π/2)/g
  };

  // `rotation` is used for mse rows; recipe groups always use block Hadamard.
  // `high_channels` (recipes only, REQUIRED there): sorted unique indices in
  // [0, dim) of size RecipeHighChannels(). INVALID_ARGUMENT on any mismatch.
  static absl::StatusOr<std::unique_ptr<RowCodec>> Create(const ComponentSpec& spec, int dim,
                                                          RotationKind rotation,
                                                          const CodecKey& key,
                                                          const std::vector<int>& high_channels = {});

  int dim() const { return layout_.dim; }
  size_t row_bytes() const { return layout_.row_bytes; }
  // Memory this codec holds (rotations, QJL matrices, channel maps).
  size_t HeapBytes() const;
  const RowLayout& layout() const { return layout_; }
  const std::vector<Group>& groups() const { return groups_; }

  // Encodes one row of `dim()` fp32 values into row_bytes() bytes.
  void Encode(const float* x, uint8_t* row) const;
  // Decodes row_bytes() bytes into dim() fp32 values.
  void Decode(const uint8_t* row, float* x) const;

  // Attention on packed rows. A query is prepared once (rotated; QJL sketches
  // applied) into query_state_size() floats; Score(row) = <q, Decode(row)> up
  // to fp32 rounding. Values accumulate Σ w·Decode(row) in the rotated space
  // (value_state_size() floats, zero-initialised by the caller) and
  // FinishValue maps the sum back to dim() channels.
  int query_state_size() const { return query_state_size_; }
  int value_state_size() const { return query_state_size_; }
  void PrepareQuery(const float* q, float* state) const;
  float Score(const uint8_t* row, const float* state) const {
    float out;
    ScoreMany(row, state, 1, &out);
    return out;
  }
  void Accumulate(const uint8_t* row, float weight, float* acc) const {
    AccumulateMany(row, &weight, 1, acc);
  }
  void FinishValue(const float* acc, float* out) const;
  // The same for `count` queries at once (GQA: every q head of a kv head),
  // unpacking the row once: states/accs hold `count` consecutive states of
  // query_state_size() floats; out/weights one value per query.
  void ScoreMany(const uint8_t* row, const float* states, int count, float* out) const;
  void AccumulateMany(const uint8_t* row, const float* weights, int count, float* accs) const;

 private:
  RowCodec() = default;
  RowLayout layout_;
  std::vector<Group> groups_;
  int query_state_size_ = 0;
};

}  // namespace tqkv

#endif  // TQKV_CODEC_ROW_CODEC_H_
