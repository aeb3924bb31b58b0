"""cuda_library: compiles .cu files with the system nvcc for Hopper (sm_90a).

Each .cu becomes one position-independent object through a genrule (named
`.pic.o` so that Bazel links it into both PIC and non-PIC outputs, e.g. the
shared library that the Python benchmark loads); the objects form a
cc_library that ordinary cc_* targets link. cudart is linked statically
(@cuda//:cudart), so binaries need only the driver at run time.

IEEE division and sqrt stay on (no --use_fast_math): the encode kernels
reproduce the CPU codec bit for bit.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "-gencode arch=compute_90a,code=sm_90a",
    "-gencode arch=compute_90,code=compute_90",
    "--expt-relaxed-constexpr",
    "-Xcompiler -fPIC",
    "-Xcompiler -Wall",
    "-Xcompiler -Wno-sign-compare",
    "-lineinfo",
]

# The profiling hooks of gpu/kernels/profile_hooks.cuh, by
# --define=tqkv_profile=NAME (config settings in tools/BUILD).
PROFILE_HOOKS = ["rowset_no_tiles", "rowset_no_merge", "rowset_no_prologue", "encode_fwht4", "encode_no_fwht"]

def _profile_flag():
    cases = {"//conditions:default": ""}
    for i, hook in enumerate(PROFILE_HOOKS):
        cases["//tools:profile_" + hook] = " -DTQKV_PROFILE_HOOK=%d" % (i + 1)
    return select(cases)

def cuda_library(name, srcs, hdrs = [], nvcc_srcs = [], cc_srcs = [], deps = [], copts = [], **kwargs):
    """A cc_library whose srcs are .cu files compiled by nvcc.

    Args:
      name: target name.
      srcs: .cu files.
      cc_srcs: host-only .cc files of the same library (the host compiler).
      hdrs: headers exported to users of the library (plain C++ headers).
      nvcc_srcs: extra files the .cu files include (.cuh, headers of deps);
        they are inputs of every nvcc action.
      deps: cc_library deps the objects need at link time.
      copts: extra nvcc flags.
    """
    objs = []
    for src in srcs:
        base = src.replace("/", "_").rsplit(".", 1)[0]
        obj = "_objs_%s/%s.pic.o" % (name, base)
        native.genrule(
            name = "%s_%s_nvcc" % (name, base),
            srcs = [src] + hdrs + nvcc_srcs,
            outs = [obj],
            cmd = "%s %s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (
                NVCC,
                " ".join(NVCC_FLAGS),
                " ".join(copts),
                src,
            ) + _profile_flag(),
            message = "nvcc %s" % src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs + cc_srcs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        alwayslink = True,
        **kwargs
    )

def cuda_binary(name, srcs, nvcc_srcs = [], deps = [], **kwargs):
    """A cc_binary whose main() is in .cu files (cuda_library `name`_main).

    Args:
      name: target name.
      srcs: .cu files, one of them with main().
      nvcc_srcs: extra files the .cu files include (see cuda_library).
      deps: cc_library deps the objects need at link time.
      **kwargs: passed to the cc_binary.
    """
    cuda_library(name = name + "_main", srcs = srcs, nvcc_srcs = nvcc_srcs, deps = deps)
    native.cc_binary(name = name, deps = [":%s_main" % name], **kwargs)
