#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (-fsanitize=fuzzer,
# address, undefined) and runs each for a bounded time on a copy of its seed
# corpus. Exits non-zero when a target finds a crash, a leak, a sanitizer
# report, a timeout or an out-of-memory input; the reproducer is left under
# $TQKV_FUZZ_DIR/artifacts/ (add it to fuzz/corpus/<target>/ with the fix:
# the target's corpus test replays it from then on).
#
# Why a second Bazel output base: the project's toolchain is Debian's g++,
# which has no libFuzzer (gcc's coverage hooks are not libFuzzer's).
# Pointing CC at clang in the main output base would re-configure the C++
# toolchain for everyone sharing it and throw away its cache; in an output
# base of its own the clang build keeps its own cache and leaves the main
# one alone. System libraries (gRPC, protobuf, Abseil, RocksDB) are Debian's,
# uninstrumented: the sanitizers see tqkv's code and what it passes them.
#
# Usage: tools/fuzz.sh [TARGET...]   (default: every target below)
# Environment:
#   TQKV_FUZZ_SECONDS      seconds per target (default 25)
#   TQKV_FUZZ_JOBS         parallel targets (default 1)
#   TQKV_FUZZ_DIR          work directory (default: a fresh temp dir)
#   TQKV_FUZZ_OUTPUT_BASE  Bazel output base of the clang build
#                          (default ~/.cache/tqkv-fuzz)
# Prints one line per target: executions, execs/s, corpus size, result.
set -uo pipefail
cd "$(dirname "$0")/.."

ALL=(metadata_fuzzer format_name_fuzzer service_fuzzer data_plane_fuzzer)
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=("${ALL[@]}")
SECONDS_PER=${TQKV_FUZZ_SECONDS:-25}
OUTPUT_BASE=${TQKV_FUZZ_OUTPUT_BASE:-$HOME/.cache/tqkv-fuzz}
WORK=${TQKV_FUZZ_DIR:-$(mktemp -d -t tqkv-fuzz.XXXXXX)}
mkdir -p "$WORK/artifacts"

if ! command -v clang >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "tqkv fuzz: installing clang (libFuzzer)"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang >/dev/null || exit 1
fi
CLANG=$(command -v clang)

BAZEL_FLAGS=(
  --symlink_prefix=/ --repo_env=CC="$CLANG"
  --copt=-fsanitize=fuzzer-no-link,address,undefined --copt=-fno-sanitize-recover=all
  --copt=-fno-omit-frame-pointer --copt=-O1 --copt=-gline-tables-only
  --linkopt=-fsanitize=fuzzer,address,undefined --linkopt=-fsanitize-link-c++-runtime
)
labels=()
for t in "${TARGETS[@]}"; do labels+=("//fuzz:$t"); done
build_log="$WORK/build.log"
if ! bazel --output_base="$OUTPUT_BASE" build "${BAZEL_FLAGS[@]}" "${labels[@]}" >"$build_log" 2>&1; then
  grep -v 'ld.gold: warning' "$build_log" | tail -40
  echo "tqkv fuzz: build failed (log $build_log)"
  exit 1
fi
BIN=$(bazel --output_base="$OUTPUT_BASE" info "${BAZEL_FLAGS[@]}" bazel-bin 2>/dev/null)

corpus_of() { sed -n "/name = \"$1\"/,/corpus =/s/.*corpus = \"\(.*\)\".*/\1/p" fuzz/BUILD; }

run_one() {
  local t=$1 corpus log
  corpus=$(corpus_of "$t")
  mkdir -p "$WORK/$t"
  cp -r "fuzz/$corpus/." "$WORK/$t/"
  log="$WORK/$t.log"
  # Leaks are checked (detect_leaks); an input over -rss_limit_mb or one
  # allocation over -malloc_limit_mb is a finding too.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    "$BIN/fuzz/$t" -max_total_time="$SECONDS_PER" -timeout=10 -max_len=65536 -rss_limit_mb=4096 \
    -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$WORK/artifacts/$t-" "$WORK/$t" >"$log" 2>&1
  local rc=$?
  local runs secs
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  secs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  if [ "$rc" -eq 0 ]; then
    echo "fuzz $t: ${runs:-?} executions, ${secs:-?} exec/s, $(ls "$WORK/$t" | wc -l) corpus files: OK"
  else
    echo "fuzz $t: FAILED (exit $rc) after ${runs:-?} executions; log $log"
    grep -m20 -E 'ERROR|SUMMARY|Test unit written|runtime error' "$log"
  fi
  return "$rc"
}

failed=0
export -f run_one corpus_of
export WORK BIN SECONDS_PER
if [ "${TQKV_FUZZ_JOBS:-1}" -gt 1 ]; then
  printf '%s\n' "${TARGETS[@]}" | xargs -P "$TQKV_FUZZ_JOBS" -I{} bash -c 'run_one {}' || failed=1
else
  for t in "${TARGETS[@]}"; do run_one "$t" || failed=1; done
fi
exit "$failed"
