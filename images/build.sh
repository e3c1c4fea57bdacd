#!/usr/bin/env bash
# Build (or reuse from the cache) the local images the real test node needs; print "REF TARPATH" per image.
#
# Cache: ${KUBEFORGE_CACHE:-~/.cache/kubeforge}/images/<name>-<inputs-hash>.tar. The hash covers the build
# script, its sources, the shared packer and (for base) the busybox binary, so a changed input rebuilds.
# Usage: images/build.sh            (both images)      images/build.sh pause|base
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/../e2e/host/install.sh" >&2 # gcc, strip, static busybox
cache="${KUBEFORGE_CACHE:-$HOME/.cache/kubeforge}/images"
mkdir -p "$cache"

build_one() {  # name ref
  local name="$1" ref="$2" inputs hash out
  inputs=("$here/$name/build.sh" "$here/lib/dockersave.py")
  [ "$name" = pause ] && inputs+=("$here/pause/pause.c")
  [ "$name" = base ] && inputs+=("$(command -v busybox)")
  hash="$( { echo "$ref"; cat "${inputs[@]}"; } | sha256sum | cut -c1-16)"
  out="$cache/$name-$hash.tar"
  if [ ! -s "$out" ]; then
    "$here/$name/build.sh" "$out.new" "$ref"
    mv "$out.new" "$out"
  fi
  echo "$ref $out"
}

names=("${@:-pause base}")
for name in ${names[@]}; do
  case "$name" in
    pause) build_one pause "${KUBEFORGE_PAUSE_IMAGE:-kubeforge.local/pause:1}" ;;
    base) build_one base "${KUBEFORGE_BASE_IMAGE:-kubeforge.local/base:1}" ;;
    *) echo "unknown image: $name" >&2; exit 2 ;;
  esac
done
