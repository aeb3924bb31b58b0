// Device helpers shared by the TurboQuant kernels: dtype loads/stores, the
// canonical warp reduction, bit unpacking and the rotations on a warp's
// "strided" register layout (lane l holds group coordinates j = l + 32·i).
//
// Bit-exactness with the CPU codec (codec/canonical.h, codec/rotation.h):
// every fp32 operation of the encode path uses the _rn intrinsics so nvcc
// cannot contract a multiply and an add differently from the CPU.
#ifndef TQKV_GPU_KERNELS_COMMON_CUH_
#define TQKV_GPU_KERNELS_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/gpu_codec.h"

namespace tqkv::gpu {

inline constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float LoadElem(const void* base, int64_t i, int dtype) {
  switch (dtype) {
    case kGpuF16: return __half2float(static_cast<const __half*>(base)[i]);
    case kGpuBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void StoreElem(void* base, int64_t i, int dtype, float x) {
  switch (dtype) {
    case kGpuF16: static_cast<__half*>(base)[i] = __float2half_rn(x); break;
    case kGpuBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x); break;
    default: static_cast<float*>(base)[i] = x; break;
  }
}

// Canonical butterfly (codec/canonical.h): acc_l + acc_{l^off}, off = 16..1.
__device__ __forceinline__ float WarpSumCanonical(float acc) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, off));
  return acc;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// Little-endian loads/stores of unaligned scalars in packed rows.
__device__ __forceinline__ float LoadF32Bytes(const uint8_t* p) {
  uint32_t u = uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
  return __uint_as_float(u);
}
__device__ __forceinline__ float LoadF16Bytes(const uint8_t* p) {
  unsigned short u = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(u));
}
__device__ __forceinline__ void StoreF32Bytes(uint8_t* p, float v) {
  uint32_t u = __float_as_uint(v);
  p[0] = u & 0xff; p[1] = (u >> 8) & 0xff; p[2] = (u >> 16) & 0xff; p[3] = u >> 24;
}
// Observed on sm_90a with nvcc 13.0: byte stores taken straight from the
// 16-bit register of cvt.rn.f16.f32 wrote the truncated integer value as
// the low byte. Widening through an opaque 32-bit register avoids it, and
// 2-byte-aligned destinations (every fp16 field of the formats) take one
// 16-bit store.
__device__ __forceinline__ void StoreF16Bytes(uint8_t* p, float v) {
  uint32_t u = __half_as_ushort(__float2half_rn(v));
  asm volatile("" : "+r"(u));
  if ((reinterpret_cast<uintptr_t>(p) & 1) == 0) {
    *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(u);
  } else {
    p[0] = static_cast<uint8_t>(u & 0xffu);
    p[1] = static_cast<uint8_t>(u >> 8);
  }
}
__device__ __forceinline__ float LoadGroupNorm(const GpuGroup& g, const uint8_t* row) {
  return g.fp16_norms ? LoadF16Bytes(row + g.norm_offset) : LoadF32Bytes(row + g.norm_offset);
}
__device__ __forceinline__ float LoadGroupResidual(const GpuGroup& g, const uint8_t* row) {
  return g.fp16_norms ? LoadF16Bytes(row + g.residual_offset) : LoadF32Bytes(row + g.residual_offset);
}

// Index j of an LSB-first bitstream of `bits`-bit indices (bits <= 8).
__device__ __forceinline__ uint32_t UnpackIndex(const uint8_t* p, int j, int bits) {
  const int a = j * bits;
  const int byte = a >> 3, sh = a & 7;
  uint32_t v = p[byte];
  if (sh + bits > 8) v |= uint32_t(p[byte + 1]) << 8;
  return (v >> sh) & ((1u << bits) - 1u);
}

// Writes ceil(n·bits/8) bytes of the LSB-first packing of idx[0, n) (shared
// memory) to dst; the warp's lanes split the bytes.
__device__ __forceinline__ void PackBytesWarp(const uint8_t* idx, int n, int bits, uint8_t* dst,
                                              int lane) {
  const int nbytes = (n * bits + 7) >> 3;
  for (int b = lane; b < nbytes; b += 32) {
    uint32_t v = 0;
    const int a0 = b * 8;
    for (int a = a0; a < a0 + 8;) {
      const int j = a / bits;
      if (j >= n) break;
      const int k = a - j * bits;
      const int take = min(bits - k, a0 + 8 - a);
      v |= ((uint32_t(idx[j]) >> k) & ((1u << take) - 1u)) << (a - a0);
      a += take;
    }
    dst[b] = static_cast<uint8_t>(v);
  }
}

// Number of fp32 boundaries strictly below y (codec/codebook.h), by binary
// search over the ascending table (same count; NaN → 0).
__device__ __forceinline__ uint32_t NearestIndex(const float* b, int nb, float y) {
  int lo = 0, hi = nb;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (y > b[mid]) lo = mid + 1; else hi = mid;
  }
  return static_cast<uint32_t>(lo);
}

// Unnormalised FWHT of every block, in place, on the strided layout. Stage
// order and per-pair operations are those of codec/rotation.cc's Fwht.
template <int VPL>
__device__ __forceinline__ void FwhtStrided(float (&y)[VPL], const int (&bs)[VPL], int lane) {
#pragma unroll
  for (int s = 0; s < 5; ++s) {
    const int h = 1 << s;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const float o = __shfl_xor_sync(kFullMask, y[i], h);
      if (h < bs[i]) y[i] = (lane & h) ? __fsub_rn(o, y[i]) : __fadd_rn(y[i], o);
    }
  }
#pragma unroll
  for (int hi = 1; hi < VPL; hi <<= 1) {
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      if ((i & hi) == 0 && i + hi < VPL && 32 * hi < bs[i]) {
        const float a = y[i], b = y[i + hi];
        y[i] = __fadd_rn(a, b);
        y[i + hi] = __fsub_rn(a, b);
      }
    }
  }
}

// x, opaque to the compiler: it keeps the value in a register instead of
// recomputing it (e.g. per-lane addresses inside a hot loop).
__device__ __forceinline__ uint32_t Opaque(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}

// cp.async of 16 bytes global → shared (L2 only), commit, wait until at
// most N groups are pending.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// The same for 4 bytes (through L1).
__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// A lane's factors of y = Π y (forward) or Πᵀ y for a block-Hadamard group
// on the strided layout (channels lane + 32i): loaded once, applied to any
// number of vectors (RotateStrided's Hadamard case).
template <int VPL>
struct HadamardLane {
  float first[VPL], second[VPL], scale[VPL];
  int bs[VPL];
  int n = 0;
  // bs / scale: size and scale of the Hadamard block holding channel j (0
  // past the last block). Every load is independent of the others (the
  // group's block table is read whole, then walked in registers), so a
  // kernel waits one memory latency here, not one per block and channel.
  __device__ __forceinline__ void Load(const GpuGroup& g, int lane, bool forward) {
    Load(g, forward ? g.s1 : g.s2, forward ? g.s2 : g.s1, lane);
  }
  // The same with the sign vectors given (f first, then s; the block
  // structure from g): AttentionLaunch::k_signs.
  __device__ __forceinline__ void Load(const GpuGroup& g, const float* f, const float* s, int lane) {
    n = g.channels;
    const int nb = g.num_blocks;
    int size[kMaxHadamardBlocks];
    float bscale[kMaxHadamardBlocks];
#pragma unroll
    for (int k = 0; k < kMaxHadamardBlocks; ++k) {
      size[k] = g.block_size[k];
      bscale[k] = g.block_scale[k];
    }
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int j = lane + 32 * i;
      first[i] = j < n ? __ldg(f + j) : 0.0f;
      second[i] = j < n ? __ldg(s + j) : 0.0f;
      bs[i] = 0;
      scale[i] = 0.0f;
      int off = 0;
      bool found = j >= n;
#pragma unroll
      for (int k = 0; k < kMaxHadamardBlocks; ++k) {
        if (!found && k < nb && j < off + size[k]) {
          bs[i] = size[k];
          scale[i] = bscale[k];
          found = true;
        }
        off += size[k];
      }
    }
  }
  // The opposite rotation (Π for a loaded Πᵀ and back): the same blocks
  // with the sign vectors' order swapped, no loads.
  __device__ __forceinline__ HadamardLane Reversed() const {
    HadamardLane r = *this;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      r.first[i] = second[i];
      r.second[i] = first[i];
    }
    return r;
  }
  __device__ __forceinline__ void Apply(float (&y)[VPL], int lane) const {
#pragma unroll
    for (int i = 0; i < VPL; ++i)
      if (lane + 32 * i < n) y[i] = __fmul_rn(y[i], first[i]);
    FwhtStrided<VPL>(y, bs, lane);
#pragma unroll
    for (int i = 0; i < VPL; ++i)
      if (lane + 32 * i < n) y[i] = __fmul_rn(__fmul_rn(y[i], scale[i]), second[i]);
  }
};

// y = Π y (forward=true) or Πᵀ y for a block-Hadamard group (no shared
// memory).
template <int VPL>
__device__ __forceinline__ void HadamardStrided(const GpuGroup& g, float (&y)[VPL], int lane, bool forward) {
  HadamardLane<VPL> h;
  h.Load(g, lane, forward);
  h.Apply(y, lane);
}

// y = Π y (forward=true) or Πᵀ y on the strided layout of group g. `buf` is
// warp-private shared memory of >= n floats (QR only).
template <int VPL>
__device__ __forceinline__ void RotateStrided(const GpuGroup& g, float (&y)[VPL], int lane,
                                              float* buf, bool forward) {
  const int n = g.channels;
  if (g.rotation == kGpuQr) {
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int j = lane + 32 * i;
      if (j < n) buf[j] = y[i];
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int r = lane + 32 * i;
      float acc = 0.0f;
      if (r < n) {
        if (forward) {
          const float* row = g.qr + static_cast<int64_t>(r) * n;
          for (int j = 0; j < n; ++j) acc = __fmaf_rn(__ldg(row + j), buf[j], acc);
        } else {
          for (int j = 0; j < n; ++j) acc = __fmaf_rn(__ldg(g.qr + static_cast<int64_t>(j) * n + r), buf[j], acc);
        }
      }
      y[i] = acc;
    }
    __syncwarp();
    return;
  }
  HadamardStrided<VPL>(g, y, lane, forward);
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_COMMON_CUH_
