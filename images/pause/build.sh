#!/usr/bin/env bash
# Build the pause (pod sandbox) image: a static C binary in an otherwise empty rootfs, packed by buildah as an OCI
# archive.
# Usage: images/pause/build.sh OUT.tar [REF]     (REF defaults to kubeforge.local/pause:1)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/../../e2e/host/install.sh" >&2 # gcc, strip, libc6-dev, buildah
out="$1"; ref="${2:-kubeforge.local/pause:1}"
root="$(mktemp -d)"; trap 'rm -rf "$root"' EXIT
gcc -static -O2 -Wall -Wextra -Werror -o "$root/pause" "$here/pause.c"
strip "$root/pause"
source "$here/../lib/buildah.sh"; source "$here/../lib/pack.sh"
kf_pack_rootfs "$root" "$ref" "$out" --entrypoint '["/pause"]'

