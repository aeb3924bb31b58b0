// Deterministic synthetic data for the CLI (`tqkv put`, `tqkv bench`),
// benchmarks and integration tests: block hash chains, random dense K/V
// blocks and a small model registration.
//
// All functions are pure: the same arguments give the same bytes.
#ifndef TQKV_CLIENT_CPP_SYNTHETIC_H_
#define TQKV_CLIENT_CPP_SYNTHETIC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/tqkv/v1/tqkv.pb.h"

namespace tqkv::client {

// A 32-byte block hash: a hash of (parent, seed, index). Chaining
// ChainHash(prev, seed, i) over i gives a prefix chain.
std::string ChainHash(const std::string& parent, uint64_t seed, uint64_t index);
// The chain of `n` hashes starting from an empty parent.
std::vector<std::string> HashChain(uint64_t seed, size_t n);

// A tensor of `shape` with N(0, 1) values in `dtype` derived from `seed`.
v1::Tensor RandomTensor(v1::DType dtype, const std::vector<int64_t>& shape, uint64_t seed);

// A dense PutBlock for layers [first, last) of `layout` with `tokens`
// tokens (0: block_size), K and V from `seed`.
v1::PutBlock DenseBlock(const v1::ModelLayout& layout, const std::string& hash,
                        const std::string& parent, uint64_t seed, int first = 0, int last = 0,
                        int tokens = 0, v1::DType dtype = v1::DTYPE_FP16);

// A registration of an fp16 model of this shape and cache format (default
// codec otherwise).
v1::RegisterModelRequest ModelRegistration(const std::string& name, int layers, int kv_heads, int q_heads,
                                           int head_dim, int block_size, const std::string& cache_dtype);
// A registration of a small model (2 layers, 2 kv heads, 4 q heads, head
// dim 64, block 16, k4v4 cache format).
v1::RegisterModelRequest SmallModel(const std::string& name);

}  // namespace tqkv::client

#endif  // TQKV_CLIENT_CPP_SYNTHETIC_H_
