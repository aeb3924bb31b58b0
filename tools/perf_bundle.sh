#!/usr/bin/env bash
# Packs this machine's perf (linux-perf) and the shared libraries it loads
# into DEST.tar.xz, for CPU profiles on the GPU machine (it has no perf):
# carry the file, then there
#   tar -xJf perf.tar.xz; P=perf; LD_LIBRARY_PATH=$P/lib $P/perf record -g -p PID -o out.data
#   (stop it with kill -INT on perf's own pid), LD_LIBRARY_PATH=$P/lib $P/perf script -i out.data > out.txt
# and summarise out.txt with bench/profiling/perf_stacks.py.
# Usage: tools/perf_bundle.sh [dest=dist/perf]
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-dist/perf}"
PERF="$(readlink -f "$(command -v perf)")"
rm -rf "$DEST"
mkdir -p "$DEST/lib"
cp "$PERF" "$DEST/perf"
ldd "$PERF" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' \
  | while read -r lib; do cp -n "$lib" "$DEST/lib/"; done
tar -C "$(dirname "$DEST")" -cf - "$(basename "$DEST")" | xz -T2 -6 > "$DEST.tar.xz"
du -sh "$DEST.tar.xz"
