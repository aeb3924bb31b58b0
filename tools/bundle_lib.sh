# Sourced by the bundle scripts (tools/gpu_bundle.sh, tests/bundle_e2e.sh).
# bundle_copy_libs DEST FILE...: copies the non-glibc shared libraries that
# FILEs load into DEST/lib (glibc, libstdc++ and libgcc_s come from the host;
# cudart is linked statically).
bundle_copy_libs() {
  local dest="$1"
  shift
  mkdir -p "$dest/lib"
  local f
  for f in "$@"; do
    ldd "$f" | awk '/=> \// {print $3}' \
      | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libdl|libpthread|librt)\.so' \
      | while read -r lib; do cp -n "$lib" "$dest/lib/" 2>/dev/null || true; done
  done
}

# bundle_pack DEST RUNNER: writes DEST_xz/bundle.tar.xz (DEST compressed: the
# device tool carries at most 64 MiB and every binary holds the CUDA fatbins;
# a dictionary larger than the bundle lets xz store those copies once: ~20
# MB instead of ~69)
# and DEST_xz/RUNNER, which unpacks into a temp dir and runs DEST/RUNNER with
# the same arguments.
bundle_pack() {
  local dest="$1" runner="$2" packed="${1}_xz" name
  name="$(basename "$dest")"
  rm -rf "$packed"
  mkdir -p "$packed"
  tar -C "$(dirname "$dest")" -cf - "$name" | xz -T2 --lzma2=preset=6,dict=192MiB > "$packed/bundle.tar.xz"
  cat > "$packed/$runner" <<RUN
#!/usr/bin/env bash
# Unpacks the bundle into a temp dir and runs its $runner.
set -e
HERE="\$(cd "\$(dirname "\$0")" && pwd)"
TMP="\$(mktemp -d)"
tar -C "\$TMP" -xJf "\$HERE/bundle.tar.xz"
exec "\$TMP/$name/$runner" "\$@"
RUN
  chmod +x "$packed/$runner"
  du -sh "$packed"
}
