"""tqkv_fuzzer: one libFuzzer target, and a test that replays its corpus."""

def tqkv_fuzzer(name, srcs, deps, corpus):
    """Declares `name` (the fuzzer, built only by tools/fuzz.sh with clang)
    and `name + "_corpus_test"` (the corpus replayed with the ordinary
    toolchain, part of `bazel test //...`).

    Args:
      name: target name, e.g. "metadata_fuzzer".
      srcs: the source defining LLVMFuzzerTestOneInput.
      deps: its libraries.
      corpus: corpus directory under fuzz/ (seeds and reproducers).
    """
    native.cc_library(
        name = name + "_lib",
        testonly = True,
        srcs = srcs,
        deps = deps,
        alwayslink = True,
    )

    # libFuzzer supplies main(): only tools/fuzz.sh builds this, with
    # clang's -fsanitize=fuzzer.
    native.cc_binary(
        name = name,
        testonly = True,
        deps = [":" + name + "_lib"],
        tags = ["manual"],
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        srcs = ["replay_main.cc"],
        args = [native.package_name() + "/" + corpus],
        data = native.glob([corpus + "/**"]),
        deps = [":" + name + "_lib"],
    )
