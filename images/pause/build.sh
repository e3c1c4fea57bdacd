#!/usr/bin/env bash
# Build the pause (pod sandbox) image tar: a static C binary in an otherwise empty rootfs.
# Usage: images/pause/build.sh OUT.tar [REF]     (REF defaults to kubeforge.local/pause:1)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/../../e2e/host/install.sh" >&2 # gcc, strip, libc6-dev
out="$1"; ref="${2:-kubeforge.local/pause:1}"
root="$(mktemp -d)"; trap 'rm -rf "$root"' EXIT
gcc -static -O2 -Wall -Wextra -Werror -o "$root/pause" "$here/pause.c"
strip "$root/pause"
python3 "$here/../lib/dockersave.py" --rootfs "$root" --ref "$ref" --out "$out" --entrypoint /pause >/dev/null
