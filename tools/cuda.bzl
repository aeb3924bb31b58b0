"""cuda_library: compiles .cu files with the system nvcc for Hopper (sm_90a).

Each .cu becomes one position-independent object through a genrule; the
objects form a cc_library that ordinary cc_* targets link. cudart is linked
statically (@cuda//:cudart), so binaries need only the driver at run time.
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
    "-lineinfo",
]

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library whose srcs are .cu files compiled by nvcc.

    Args:
      name: target name.
      srcs: .cu files.
      hdrs: headers the .cu files and users include (.h, .cuh).
      deps: cc_library deps; their headers must be listed in `hdrs` of those
        targets so the genrule sees them (passed as srcs).
      copts: extra nvcc flags.
    """
    objs = []
    for src in srcs:
        obj = "_objs_%s/%s.o" % (name, src.replace("/", "_").replace(".cu", ""))
        native.genrule(
            name = "%s_%s_nvcc" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs + ["//codec:headers", "//gpu:headers"],
            outs = [obj],
            cmd = "%s %s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (
                NVCC,
                " ".join(NVCC_FLAGS),
                " ".join(copts),
                src,
            ),
            message = "nvcc %s" % src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        alwayslink = True,
        **kwargs
    )
