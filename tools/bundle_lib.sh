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
