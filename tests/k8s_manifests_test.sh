#!/usr/bin/env bash
# deploy/k8s rendered and validated offline: every overlay renders with
# `kubectl kustomize` (Debian's kubernetes-client or a newer kubectl), and
# every rendered object passes the Kubernetes OpenAPI schema of its kind and
# tqkv's deployment checks (deploy/k8s/validate/validate.mjs, with the npm
# packages tools/setup.sh installs under /opt/tqkv/k8s-validate).
set -euo pipefail

modules=${TQKV_K8S_VALIDATE_MODULES:-/opt/tqkv/k8s-validate/node_modules}
for tool in kubectl node; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not found (tools/setup.sh installs it)"; exit 1; }
done
[ -d "$modules/kubernetes-models" ] && [ -d "$modules/js-yaml" ] ||
  { echo "FAIL: no kubernetes-models/js-yaml under $modules (tools/setup.sh installs them)"; exit 1; }

src="${TEST_SRCDIR}/${TEST_WORKSPACE}/deploy/k8s"
work="${TEST_TMPDIR}/k8s"
rm -rf "$work"
cp -rL "$src" "$work"  # kustomize wants real files, not runfiles symlinks

node "$work/validate/validate.mjs" "$modules" --self-test

failed=0
for overlay in cpu gpu gpu-tls; do
  echo "== $overlay"
  if ! kubectl kustomize "$work/overlays/$overlay" >"$work/$overlay.yaml" 2>"$work/$overlay.err"; then
    echo "FAIL: kubectl kustomize overlays/$overlay"; cat "$work/$overlay.err"; failed=1; continue
  fi
  node "$work/validate/validate.mjs" "$modules" "$overlay" "$work/$overlay.yaml" || failed=1
done
[ "$failed" = 0 ] && echo "all overlays render and validate"
exit "$failed"
