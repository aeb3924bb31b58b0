#!/usr/bin/env bash
# Installs exactly what tqkv's build, server and tests need, from Debian's
# packages. Idempotent and quiet: a second run installs nothing.
# Usage: tools/setup.sh            (build + run deps)
set -euo pipefail

PKGS=(
  # build
  bazel-bootstrap bazel-platforms bazel-skylib bazel-rules-java
  g++ default-jdk-headless
  # libraries (design card)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev prometheus-cpp-dev libxxhash-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libssl-dev  # token digests, TLS file checks
  # tests and benchmarks
  prometheus redis-server redis-tools
  python3 python3-grpcio python3-protobuf python3-numpy python3-pytest
  python3-pip python3-setuptools python3-wheel python3-venv  # the client's wheel and its venv test
  libhiredis-dev  # bench/service_bench (Redis baseline client)
  curl procps
  openssl  # the TLS tests make their certificates with the CLI
)

# tests/k8s_manifests_test: kubectl (Debian's kubernetes-client, unless a
# kubectl is installed already) and Node.js with npm.
command -v kubectl >/dev/null || PKGS+=(kubernetes-client)
command -v node >/dev/null || PKGS+=(nodejs)
command -v npm >/dev/null || PKGS+=(npm)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "tqkv setup: installing ${#missing[@]} package(s): ${missing[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Kubernetes schema validator's npm packages, pinned by
# deploy/k8s/validate/package-lock.json, outside the source tree.
k8s_src="$(dirname "$0")/../deploy/k8s/validate"
k8s_dir=/opt/tqkv/k8s-validate
if [ ! -d "$k8s_dir/node_modules" ] || ! cmp -s "$k8s_src/package-lock.json" "$k8s_dir/package-lock.json"; then
  echo "tqkv setup: installing the Kubernetes schema validator under $k8s_dir"
  mkdir -p "$k8s_dir"
  cp "$k8s_src/package.json" "$k8s_src/package-lock.json" "$k8s_dir/"
  (cd "$k8s_dir" && npm ci --no-audit --no-fund --omit=dev --loglevel=error >/dev/null)
fi

if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "tqkv setup: note: /usr/local/cuda/bin/nvcc not found; CUDA targets are skipped (CPU backend only)." >&2
fi
