#include "client/cpp/synthetic.h"

#include <xxhash.h>

#include <random>

#include "codec/dtype.h"
#include "codec/seed.h"

namespace tqkv::client {

std::string ChainHash(const std::string& parent, uint64_t seed, uint64_t index) {
  std::string in = parent;
  in.append(reinterpret_cast<const char*>(&seed), sizeof(seed));
  in.append(reinterpret_cast<const char*>(&index), sizeof(index));
  std::string out;
  for (uint64_t salt = 0; salt < 2; ++salt) {
    XXH128_hash_t h = XXH3_128bits_withSeed(in.data(), in.size(), salt);
    out.append(reinterpret_cast<const char*>(&h), sizeof(h));
  }
  return out;
}

std::vector<std::string> HashChain(uint64_t seed, size_t n) {
  std::vector<std::string> chain;
  std::string parent;
  for (size_t i = 0; i < n; ++i) {
    parent = ChainHash(parent, seed, i);
    chain.push_back(parent);
  }
  return chain;
}

v1::Tensor RandomTensor(v1::DType dtype, const std::vector<int64_t>& shape, uint64_t seed) {
  v1::Tensor t;
  t.set_dtype(dtype);
  size_t n = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    n *= static_cast<size_t>(d);
  }
  // Approximately N(0, 1), cheaply: the Irwin–Hall sum of four 16-bit
  // uniforms from one SplitMix64 word, centred and scaled to unit variance
  // (bounded at ±3.46). Benchmarks generate gigabytes of blocks with this.
  SplitMixStream rng(seed);
  std::vector<float> x(n);
  constexpr float kScale = 1.7320508f / 65536.0f;  // √3 / 2^16
  for (float& v : x) {
    const uint64_t w = rng.Next();
    const uint32_t sum = static_cast<uint32_t>(w & 0xffff) + static_cast<uint32_t>((w >> 16) & 0xffff) +
                         static_cast<uint32_t>((w >> 32) & 0xffff) + static_cast<uint32_t>(w >> 48);
    v = (static_cast<float>(sum) - 131070.0f) * kScale;
  }
  const DType dt = dtype == v1::DTYPE_BF16 ? DType::kBF16
                   : dtype == v1::DTYPE_FP32 ? DType::kF32
                                             : DType::kF16;
  t.mutable_data()->resize(n * DTypeSize(dt));
  FromFloat(dt, x.data(), t.mutable_data()->data(), n);
  return t;
}

v1::PutBlock DenseBlock(const v1::ModelLayout& layout, const std::string& hash,
                        const std::string& parent, uint64_t seed, int first, int last, int tokens,
                        v1::DType dtype) {
  if (last == 0) last = static_cast<int>(layout.num_layers());
  if (tokens == 0) tokens = static_cast<int>(layout.block_size());
  const std::vector<int64_t> shape = {last - first, tokens, layout.num_kv_heads(),
                                      layout.head_dim()};
  v1::PutBlock b;
  b.set_block_hash(hash);
  b.set_parent_hash(parent);
  *b.mutable_k() = RandomTensor(dtype, shape, seed * 2 + 1);
  *b.mutable_v() = RandomTensor(dtype, shape, seed * 2 + 2);
  return b;
}

v1::RegisterModelRequest ModelRegistration(const std::string& name, int layers, int kv_heads, int q_heads,
                                           int head_dim, int block_size, const std::string& cache_dtype) {
  v1::RegisterModelRequest r;
  r.set_model_name(name);
  v1::ModelLayout* l = r.mutable_layout();
  l->set_num_layers(layers);
  l->set_num_kv_heads(kv_heads);
  l->set_num_q_heads(q_heads);
  l->set_head_dim(head_dim);
  l->set_block_size(block_size);
  l->set_dtype(v1::DTYPE_FP16);
  r.mutable_codec()->set_cache_dtype(cache_dtype);
  return r;
}

v1::RegisterModelRequest SmallModel(const std::string& name) {
  v1::RegisterModelRequest r = ModelRegistration(name, 2, 2, 4, 64, 16, "k4v4");
  r.mutable_codec()->set_rotation_seed(7);
  r.set_block_hash_scheme("tqkv-test-xxh3");
  return r;
}

}  // namespace tqkv::client
