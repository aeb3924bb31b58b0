#!/usr/bin/env python3
"""Patches the working tree's row-set kernel (as of commit 78f1b2e) and merge kernel to write
%globaltimer stamps past the split records (16 per decode block, 4 per
merge block) for rowset_timeline.py; stamps 10-12 split thread 0's
prologue, 13-15 are a shadow probe's cold load latencies (last warp). Run from the repository root, build
the GPU bundle, measure, then `git checkout gpu/kernels` to undo. The
stamps write past the workspace the launcher sizes: the tests must not
run on such a build.
"""
p='gpu/kernels/attention_rowset.cuh'
s=open(p).read()
def rep(a,b):
    global s
    assert a in s, a
    s=s.replace(a,b,1)
rep("""template <int VB, int G, int S, int P, int T = 1>
__global__""","""// (The memory clobber keeps a stamp from moving past a barrier: without
// it a stamp placed before __syncthreads was seen after it.)
__device__ __forceinline__ unsigned long long GTimer() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory"); return t; }
// A stamp taken once v has arrived (v feeds an add that is kept).
__device__ int g_timer_sink;
__device__ __forceinline__ unsigned long long GTimerAfter(int v) {
  unsigned long long t; int d;
  asm volatile("add.s32 %1, %2, 1;\\n\\tmov.u64 %0, %%globaltimer;" : "=l"(t), "=r"(d) : "r"(v) : "memory");
  if (d == 0x7fffffff) g_timer_sink = d;
  return t;
}
template <int VB, int G, int S, int P, int T = 1>
__global__""")
rep("""  constexpr int kHalf = S / P;      // stages per parity
""","""  constexpr int kHalf = S / P;      // stages per parity
  unsigned long long st[16] = {0, GTimer()};
  unsigned long long* const sp_ = reinterpret_cast<unsigned long long*>(
      records + ((a.num_queries * a.q_heads * d.splits * d.record + 1) & ~int64_t{1})) +
      16 * (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x);
""")
rep("""      if (s < ntiles) issue(s, s, first[s]);
  }
""","""      if (s < ntiles) issue(s, s, first[s]);
    st[2] = GTimer();
    sp_[2] = st[2], sp_[10] = st[10], sp_[11] = st[11], sp_[12] = st[12];
  }
""")
# Thread 0's prologue in steps (10: reaches the tile block, 11: its first
# pages have arrived, 12: barriers initialised; written with stamp 2 right
# after the tiles are issued), and a shadow probe in the
# block's last warp (13-15 are its stamps, written by that warp): the cold
# latency of a sequence length, of a block-table entry past the first
# pages and of one in another sequence's row, loaded one after the other.
rep("""  if (tid == 0) {
    asm volatile("prefetch.tensormap""","""  if (tid == 0) st[10] = GTimer();
  unsigned long long shadow[3] = {0, 0, 0};
  if (tid == blockDim.x - 32) {
    const int32_t* far = a.block_table + ((seq + a.num_queries / 2 + 1) % a.num_queries) * a.max_blocks;
    unsigned long long t = GTimer();
    const int v0 = __ldcg(a.positions + qi);
    shadow[0] = GTimerAfter(v0) - t;
    const int v1 = __ldcg(btab + ((t0 + 16 * S + 16 * (v0 & 1)) >> bs_shift));
    shadow[1] = GTimerAfter(v1) - shadow[0] - t;
    const int v2 = __ldcg(far + (v1 & 3));
    shadow[2] = GTimerAfter(v2) - shadow[1] - shadow[0] - t;
    for (int k = 0; k < 3; ++k) sp_[13 + k] = shadow[k];
  }
  if (tid == 0) {
    asm volatile("prefetch.tensormap""")
rep("""      first[s] = b < a.max_blocks ? __ldg(btab + b) : 0;
    }
""","""      first[s] = b < a.max_blocks ? __ldg(btab + b) : 0;
    }
    {
      int all = 0;
#pragma unroll
      for (int s = 0; s < S; ++s) all += first[s];
      st[11] = GTimerAfter(all);
    }
""")
rep("""    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
""","""    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
    st[12] = GTimer();
""")
rep("""  __syncthreads();  // centroids (and barrier init) visible
""","""  __syncthreads();  // centroids (and barrier init) visible
  st[3] = GTimer();
""")
rep("""  constexpr uint32_t kK8 = 8 * L::kKTok""","""  st[4] = GTimer();
  constexpr uint32_t kK8 = 8 * L::kKTok""")
rep("""  __syncthreads();  // tables complete (and the parity-0 warps' query fragments)
""","""  __syncthreads();  // tables complete (and the parity-0 warps' query fragments)
  st[5] = GTimer();
""")
rep("""    tiles.QueryFromMemory(a, d, states, nullptr, qi, kvh, G);
  }
""","""    tiles.QueryFromMemory(a, d, states, nullptr, qi, kvh, G);
  }
  st[6] = GTimer();
""")
rep("""    MbarWait(mbar0 + 8u * (par + P * k), static_cast<uint32_t>(j / kHalf) & 1u);
""","""    MbarWait(mbar0 + 8u * (par + P * k), static_cast<uint32_t>(j / kHalf) & 1u);
    if (j == 0) st[7] = GTimer();
""")
rep("""    MbarWait(mbar0 + 8u * (par + P * k), phase);
""","""    MbarWait(mbar0 + 8u * (par + P * k), phase);
    if (j == 0) st[7] = GTimer();
""")
rep("""  // stages: once every warp is past its last tile).
  __syncthreads();
""","""  // stages: once every warp is past its last tile).
  __syncthreads();
  st[8] = GTimer();
""")
s=s.rstrip()
idx=s.rindex("}  // namespace tqkv::gpu")
kend=s.rindex("\n}\n", 0, idx)
s=s[:kend]+"""
  if (tid == 0) {
    st[9] = GTimer();
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    st[0] = smid;
    for (int k = 0; k < 10; ++k)
      if (k != 2) sp_[k] = st[k];
  }"""+s[kend:]+"\n"
open(p,'w').write(s)
p='gpu/kernels/attention_merge.cuh'
s=open(p).read()
rep("""  asm volatile("griddepcontrol.wait;" ::: "memory");
""","""  unsigned long long m0, m1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(m0));
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(m1));
""")
rep("""    if (j < n) out[g.channel_map ? g.channel_map[j] : j] = y[k] * inv;
  }
}""","""    if (j < n) out[g.channel_map ? g.channel_map[j] : j] = y[k] * inv;
  }
  if (lane == 0) {
    unsigned long long m2;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(m2));
    const int64_t nrec = a.num_queries * a.q_heads * d.splits * d.record;
    const int64_t nblk = a.num_queries * (a.kv_heads / 8) * d.splits;
    unsigned long long* sp = reinterpret_cast<unsigned long long*>(const_cast<float*>(records) + ((nrec + 1) & ~int64_t{1})) +
                             16 * nblk + 4 * blockIdx.x;
    sp[0] = m0; sp[1] = m1; sp[2] = m2; sp[3] = 0;
  }
}""")
open(p,'w').write(s)
