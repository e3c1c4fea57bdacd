#!/usr/bin/env bash
# Build (or reuse from the cache) kubeforge's images; print "REF ARCHIVE" per image.
#
#   images/build.sh                  pause base              (the real test node's images; e2e/node/up.sh)
#   images/build.sh operator runtime                         (`make images`: the operator and the CPU runtime)
#   images/build.sh rootfs                                   (the debootstrap base the two build on)
#
# Cache: ${KUBEFORGE_CACHE:-~/.cache/kubeforge}/images/<name>-<inputs-hash>.tar. The hash covers everything the
# image is made of (build scripts, Containerfile, the project's sources and pyproject.toml, the overrides, the
# wheels dir, uv's version, the base image's hash), so an unchanged input tree never rebuilds and a changed one
# does. Every image is built by buildah (lib/buildah.sh) and written as an OCI archive: pause and base are a
# directory packed as one layer (kf_pack_rootfs), rootfs is debootstrap committed, operator and runtime are
# `buildah bud` of their Containerfile.
# With KF_IMPORT=1 (`make images` sets it) each archive is also imported into the real node's containerd when
# that node is up on this machine. Each name keeps its ${KF_IMAGE_KEEP:-3} most recently used archives in the cache
# (lib/prune.sh); older ones are removed.
# With KF_REGISTRY=<host>[:port]/<path> (`make images REGISTRY=...`) the operator and runtime images are also pushed
# there by buildah, as <registry>/operator:<version> and <registry>/runtime:<version>-cpu, and their lines print
# the pushed refs (the archive beside them is what was pushed). Credentials: `buildah login` / REGISTRY_AUTH_FILE;
# KF_REGISTRY_TLS_VERIFY=false for a registry served over plain HTTP.
set -euo pipefail
shopt -s inherit_errexit
here="$(cd "$(dirname "$0")" && pwd)"
KF_REPO_ROOT="$(cd "$here/.." && pwd)"
cache="${KUBEFORGE_CACHE:-$HOME/.cache/kubeforge}/images"
mkdir -p "$cache"
# One build at a time per cache (parallel test sessions and `make images` share buildah's storage); bounded wait.
exec 9>"$cache/.build.lock"
flock -w 3600 9 || { echo "images: another build held $cache/.build.lock for an hour" >&2; exit 1; }
WHEELS="${WHEELS:-$(cd "$KF_REPO_ROOT/.." && pwd)/shared/wheels}"
VERSION="$(python3 -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['project']['version'])" \
  "$KF_REPO_ROOT/pyproject.toml")"
log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
source "$here/lib/prune.sh"
# handed_out NAME ARCHIVE: mark ARCHIVE as just used, then drop NAME's archives beyond the newest KF_IMAGE_KEEP
handed_out() { touch -- "$2"; kf_prune_archives "$cache" "$1" "${KF_IMAGE_KEEP:-3}"; }

packed_one() {  # name ref: the real node's images, a directory packed by buildah
  local name="$1" ref="$2" inputs hash out
  inputs=("$here/$name/build.sh" "$here/lib/buildah.sh" "$here/lib/pack.sh")
  [ "$name" = pause ] && inputs+=("$here/pause/pause.c")
  [ "$name" = base ] && inputs+=("$(command -v busybox)")
  hash="$( { echo "$ref"; cat "${inputs[@]}"; } | sha256sum | cut -c1-16)"
  out="$cache/$name-$hash.tar"
  if [ ! -s "$out" ]; then
    "$here/$name/build.sh" "$out.new" "$ref"
    mv "$out.new" "$out"
  fi
  handed_out "$name" "$out"
  echo "$ref $out"
}

buildah_ready() {
  "$KF_REPO_ROOT/e2e/host/install.sh" >/dev/null
  source "$here/lib/buildah.sh"
  mkdir -p "$KF_BUILDAH_ROOT" "$KF_BUILDAH_RUNROOT"
}

ROOTFS_REF=kubeforge.local/debian:bookworm
rootfs_hash() { kf_hash "$here/rootfs/build.sh" "$here/lib/buildah.sh"; }

# ensure_rootfs: the debootstrap base image in buildah's storage (an archive in the cache too, so a fresh storage
# is refilled without debootstrap). Sets ROOTFS_HASH.
ensure_rootfs() {
  ROOTFS_HASH="$(rootfs_hash)"
  local out="$cache/rootfs-$ROOTFS_HASH.tar" t0=$SECONDS
  if [ ! -s "$out" ]; then
    log "rootfs: debootstrap bookworm (minbase + python3) ..."
    "$here/rootfs/build.sh" "$ROOTFS_REF"
    kf_buildah push --disable-compression "$ROOTFS_REF" "oci-archive:$out.new:$ROOTFS_REF" >/dev/null
    mv "$out.new" "$out"
    log "rootfs built in $((SECONDS - t0)) s"
    echo "$ROOTFS_HASH" >"$KF_IMG_CACHE/buildah/rootfs.hash"
  elif [ "$(cat "$KF_IMG_CACHE/buildah/rootfs.hash" 2>/dev/null)" != "$ROOTFS_HASH" ] ||
       ! kf_buildah inspect --type image "$ROOTFS_REF" >/dev/null 2>&1; then
    local id  # a fresh or stale buildah storage: refill it from the archive
    id="$(kf_buildah pull --quiet "oci-archive:$out:$ROOTFS_REF")"
    kf_buildah tag "$id" "$ROOTFS_REF"
    echo "$ROOTFS_HASH" >"$KF_IMG_CACHE/buildah/rootfs.hash"
  fi
  handed_out rootfs "$out"
  echo "$ROOTFS_REF $out"
}

# built_one NAME REF: the operator or the runtime image, built with `buildah bud` from images/NAME/Containerfile.
built_one() {
  local name="$1" ref="$2" hash out ctx t0=$SECONDS wheel_hash=none
  if [ "$name" = runtime ]; then
    [ -d "$WHEELS" ] || { log "missing $WHEELS (the CPU torch wheel)"; exit 1; }
    wheel_hash="$(cd "$WHEELS" && kf_hash .)"   # relative names: the same wheels hash alike from any checkout
  fi
  local uv="${KF_UV:-$KF_REPO_ROOT/.venv/bin/uv}"   # KF_UV: a checkout without its own .venv (a git worktree)
  [ -x "$uv" ] || { log "$uv not found (make venv)"; exit 1; }
  local extra=()   # the runtime's second venv: the verifiers library and the example environments
  if [ "$name" = runtime ]; then extra=("$here/envs-requirements.txt" "$KF_REPO_ROOT/examples/envs"); fi
  hash="$( { echo "$ref $ROOTFS_HASH $wheel_hash $("$uv" --version)"; kf_hash "$here/$name/Containerfile" \
    "$here/build.sh" "$here/overrides.txt" "$KF_REPO_ROOT/pyproject.toml" "$KF_REPO_ROOT/README.md" \
    "$KF_REPO_ROOT/api" "$KF_REPO_ROOT/operator" "$KF_REPO_ROOT/runtime" "${extra[@]}"; } | sha256sum | cut -c1-16)"
  out="$cache/$name-$hash.tar"
  if [ ! -s "$out" ]; then
    ctx="$(mktemp -d)"
    # the kubeforge wheel, built from a copy of the sources (the checkout stays untouched)
    mkdir -p "$ctx/src"
    cp -r "$KF_REPO_ROOT"/{pyproject.toml,README.md,api,operator,runtime} "$ctx/src/"
    find "$ctx/src" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
    "$uv" build --quiet --wheel --out-dir "$ctx/dist" "$ctx/src" >/dev/null 2>&1 ||
      "$uv" build --wheel --out-dir "$ctx/dist" "$ctx/src"
    mv "$ctx"/dist/kubeforge-*.whl "$ctx/kubeforge.whl"
    cp "$uv" "$ctx/uv"; cp "$KF_REPO_ROOT/pyproject.toml" "$here/overrides.txt" "$ctx/"
    if [ "$name" = runtime ]; then
      cp "$here/envs-requirements.txt" "$ctx/"
      mkdir "$ctx/envs"; cp -r "$KF_REPO_ROOT/examples/envs/." "$ctx/envs/"
      find "$ctx/envs" -name __pycache__ -prune -exec rm -rf {} +
    fi
    log "$name: buildah bud ..."
    local vols=(-v "${UV_CACHE_DIR:-$HOME/.cache/uv}:/root/.cache/uv")
    if [ "$name" = runtime ]; then vols+=(-v "$WHEELS:/wheels:ro"); fi
    # the host's CA bundle for the build steps only (a machine may reach the package index through a proxy whose
    # CA only the host trusts); ARG, not ENV: nothing of it stays in the image
    local ca="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" args=(--build-arg "BASE=$ROOTFS_REF")
    if [ -f "$ca" ]; then
      vols+=(-v "$ca:/run/kubeforge-host-ca.crt:ro"); args+=(--build-arg SSL_CERT_FILE=/run/kubeforge-host-ca.crt)
    fi
    kf_buildah bud --quiet --layers "${args[@]}" "${vols[@]}" \
      --annotation "kubeforge.dev/inputs=$hash" -f "$here/$name/Containerfile" -t "$ref" "$ctx" >&2
    rm -rf "$ctx"
    kf_buildah push --disable-compression "$ref" "oci-archive:$out.new:$ref" >/dev/null
    mv "$out.new" "$out"
    log "$name built in $((SECONDS - t0)) s: $(du -m "$out" | cut -f1) MiB archive"
  fi
  handed_out "$name" "$out"
  echo "$ref $out"
}

# import_into_node REF ARCHIVE: into the real node's containerd, when that node runs on this machine.
import_into_node() {
  local w sock pid
  w="$(cat /run/kubeforge-node/workdir 2>/dev/null)" || return 0
  sock="$w/node/containerd/containerd.sock"; pid="$(cat "$w/node/pids/containerd.pid" 2>/dev/null)" || return 0
  [ -S "$sock" ] && kill -0 "$pid" 2>/dev/null || return 0
  ctr --address "$sock" -n k8s.io images import "$2" >/dev/null
  log "imported $1 into the real node's containerd ($w)"
}

# push_to_registry NAME REF ARCHIVE: push REF (refilled from ARCHIVE when buildah's storage lost it) to
# $KF_REGISTRY/NAME:<REF's tag>; prints the pushed ref.
push_to_registry() {
  local name="$1" ref="$2" archive="$3" dest
  dest="${KF_REGISTRY%/}/$name:${ref##*:}"
  if ! kf_buildah inspect --type image "$ref" >/dev/null 2>&1; then
    kf_buildah tag "$(kf_buildah pull --quiet "oci-archive:$archive:$ref")" "$ref"
  fi
  log "$name: push $ref -> $dest"
  kf_buildah push --quiet --tls-verify="${KF_REGISTRY_TLS_VERIFY:-true}" "$ref" "docker://$dest" >&2
  echo "$dest"
}

names=("${@:-pause base}")
for name in ${names[@]}; do
  case "$name" in
    pause) packed_one pause "${KUBEFORGE_PAUSE_IMAGE:-kubeforge.local/pause:1}" ;;
    base) packed_one base "${KUBEFORGE_BASE_IMAGE:-kubeforge.local/base:1}" ;;
    rootfs) buildah_ready; ensure_rootfs ;;
    operator|runtime)
      buildah_ready; ensure_rootfs >/dev/null
      ref="kubeforge.local/$name:$VERSION"
      if [ "$name" = runtime ]; then ref="$ref-cpu"; fi
      line="$(built_one "$name" "$ref")"
      if [ "${KF_IMPORT:-0}" = 1 ]; then import_into_node $line; fi
      if [ -n "${KF_REGISTRY:-}" ]; then
        pushed="$(push_to_registry "$name" $line)"; line="$pushed ${line#* }"
        if [ "$name" = operator ]; then
          log "chart: --set image.repository=${pushed%:*} --set image.tag=${pushed##*:}"
        else
          log "chart: --set runtimeImage=$pushed"
        fi
      fi
      echo "$line" ;;
    *) echo "unknown image: $name" >&2; exit 2 ;;
  esac
done
