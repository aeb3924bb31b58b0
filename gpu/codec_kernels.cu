// Launchers of the encode/decode kernels (gpu/kernels/codec_kernels.cuh).
#include "gpu/kernels.h"
#include "gpu/kernels/codec_kernels.cuh"

namespace tqkv::gpu {
namespace {

// Checks slots into *bad (reset to kNoBadSlot first).
cudaError_t CheckSlots(const int64_t* slots, int64_t n, int64_t num_slots, unsigned long long* bad,
                       cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(bad, 0xff, sizeof(unsigned long long), stream);
  if (e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  CheckSlotsKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(slots, n, num_slots, bad);
  return cudaGetLastError();
}

template <int VPL>
cudaError_t EncodeWith(const EncodeLaunch& a, cudaStream_t stream) {
  const int64_t rows = a.tokens * a.heads;
  const dim3 grid(static_cast<unsigned>((rows + kCodecWarps - 1) / kCodecWarps), 2);
  const size_t smem = kCodecWarps * (VPL * 32 * 2 + 256) * sizeof(float);
  EncodeKernel<VPL><<<grid, 32 * kCodecWarps, smem, stream>>>(a);
  return cudaGetLastError();
}

template <int VPL>
cudaError_t DecodeWith(const DecodeLaunch& a, cudaStream_t stream) {
  const int64_t rows = a.tokens * a.heads;
  const dim3 grid(static_cast<unsigned>((rows + kCodecWarps - 1) / kCodecWarps), 2);
  const size_t smem = kCodecWarps * VPL * 32 * sizeof(float);
  DecodeKernel<VPL><<<grid, 32 * kCodecWarps, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchEncode(const EncodeLaunch& a, cudaStream_t stream) {
  if (a.bad_slot == nullptr || a.tokens < 0 || a.heads <= 0) return cudaErrorInvalidValue;
  const int64_t limit = a.k_pages.num_slots < a.v_pages.num_slots ? a.k_pages.num_slots : a.v_pages.num_slots;
  cudaError_t e = CheckSlots(a.slots, a.tokens, limit, a.bad_slot, stream);
  if (e != cudaSuccess || a.tokens == 0) return e;
  switch ((a.max_group_channels + 31) / 32) {
    case 0:  // dense components only
    case 1: return EncodeWith<1>(a, stream);
    case 2: return EncodeWith<2>(a, stream);
    case 3: return EncodeWith<3>(a, stream);
    case 4: return EncodeWith<4>(a, stream);
    case 5:
    case 6: return EncodeWith<6>(a, stream);
    case 7:
    case 8: return EncodeWith<8>(a, stream);
    default: return cudaErrorNotSupported;  // groups wider than kMaxGroupChannels
  }
}

cudaError_t LaunchDecode(const DecodeLaunch& a, cudaStream_t stream) {
  if (a.bad_slot == nullptr || a.tokens < 0 || a.heads <= 0) return cudaErrorInvalidValue;
  const int64_t limit = a.k_pages.num_slots < a.v_pages.num_slots ? a.k_pages.num_slots : a.v_pages.num_slots;
  cudaError_t e = CheckSlots(a.slots, a.tokens, limit, a.bad_slot, stream);
  if (e != cudaSuccess || a.tokens == 0) return e;
  switch ((a.max_group_channels + 31) / 32) {
    case 0:
    case 1: return DecodeWith<1>(a, stream);
    case 2: return DecodeWith<2>(a, stream);
    case 3: return DecodeWith<3>(a, stream);
    case 4: return DecodeWith<4>(a, stream);
    case 5:
    case 6: return DecodeWith<6>(a, stream);
    case 7:
    case 8: return DecodeWith<8>(a, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace tqkv::gpu
