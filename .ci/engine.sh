#!/usr/bin/env bash
# Installs (from Debian's packages) and starts what Rollbox's integration
# tests need: containerd, dockerd with runsc registered, busybox-static,
# debootstrap, and clang's wasm32-wasi target. Safe to run twice.
set -euo pipefail

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v runsc >/dev/null || need+=(runsc)
[ -x /bin/busybox ] && /bin/busybox --help 2>&1 | head -1 | grep -q static || [ -f /usr/share/doc/busybox-static/copyright ] || need+=(busybox-static)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v clang >/dev/null || need+=(clang)
command -v wasm-ld >/dev/null || need+=(lld)
[ -d /usr/lib/wasm32-wasi ] || [ -d /usr/include/wasm32-wasi ] || need+=(wasi-libc)
ls /usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1 || need+=(libclang-rt-dev-wasm32)
if [ ${#need[@]} -gt 0 ]; then
  echo "engine: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

mkdir -p /etc/docker
want='{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}}'
if [ ! -f /etc/docker/daemon.json ] || ! grep -q runsc /etc/docker/daemon.json; then
  echo "$want" > /etc/docker/daemon.json
fi

if ! docker info >/dev/null 2>&1; then
  if ! pgrep -x containerd >/dev/null; then
    setsid containerd >/var/log/rollbox-containerd.log 2>&1 < /dev/null &
  fi
  for _ in $(seq 50); do [ -S /run/containerd/containerd.sock ] && break; sleep 0.2; done
  if ! pgrep -x dockerd >/dev/null; then
    setsid dockerd --containerd=/run/containerd/containerd.sock >/var/log/rollbox-dockerd.log 2>&1 < /dev/null &
  fi
  for _ in $(seq 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
fi
docker info --format 'engine: docker {{.ServerVersion}}, runtimes {{range $k, $v := .Runtimes}}{{$k}} {{end}}' >&2
