// Profiling hooks (bench/profiling/README.md). A build made with
// --define=tqkv_profile=HOOK (tools/BUILD's settings, applied by
// tools/cuda.bzl to every nvcc action) takes one part of a kernel out, so
// that timing what is left splits a call into its parts:
//   rowset_no_tiles     the row-set decode's tile steps do no arithmetic
//                       (they still wait for each stage, count their read
//                       and refill it)
//   rowset_no_merge     that, and no merge kernel after the row-set decode
//   rowset_no_prologue  that, and no lookup tables or query rotation in the
//                       row-set block's prologue
//   encode_fwht4        the lane-row encode's FWHT runs 4 of its 7 stages
//   encode_no_fwht      the lane-row encode's FWHT runs none
// Every hook makes outputs wrong: CreateCudaBackend refuses a build with
// one on (ProfileHookName in gpu/kernels.h), and the GPU tests fail on it.
#ifndef TQKV_GPU_KERNELS_PROFILE_HOOKS_CUH_
#define TQKV_GPU_KERNELS_PROFILE_HOOKS_CUH_

#ifndef TQKV_PROFILE_HOOK
#define TQKV_PROFILE_HOOK 0
#endif

namespace tqkv::gpu::profile {

enum Hook : int {
  kNone = 0,
  kRowsetNoTiles = 1,
  kRowsetNoMerge = 2,
  kRowsetNoPrologue = 3,
  kEncodeFwht4 = 4,
  kEncodeNoFwht = 5,
};
inline constexpr int kHook = TQKV_PROFILE_HOOK;
static_assert(kHook >= kNone && kHook <= kEncodeNoFwht, "TQKV_PROFILE_HOOK names no hook");

// How much of the row-set decode is taken out: 0 (none) to 3 (the rowset_*
// hooks are cumulative).
inline constexpr int kRowsetCut = kHook >= kRowsetNoTiles && kHook <= kRowsetNoPrologue ? kHook : 0;
// FWHT stages the lane-row encode runs (of 7).
inline constexpr int kEncodeFwhtStages = kHook == kEncodeFwht4 ? 4 : kHook == kEncodeNoFwht ? 0 : 7;

inline constexpr const char* kHookName = kHook == kRowsetNoTiles      ? "rowset_no_tiles"
                                         : kHook == kRowsetNoMerge    ? "rowset_no_merge"
                                         : kHook == kRowsetNoPrologue ? "rowset_no_prologue"
                                         : kHook == kEncodeFwht4      ? "encode_fwht4"
                                         : kHook == kEncodeNoFwht     ? "encode_no_fwht"
                                                                      : nullptr;

}  // namespace tqkv::gpu::profile

#endif  // TQKV_GPU_KERNELS_PROFILE_HOOKS_CUH_
