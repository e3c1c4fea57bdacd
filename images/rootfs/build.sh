#!/usr/bin/env bash
# The base of the kubeforge images: a Debian bookworm rootfs made by debootstrap (minbase + Python 3.11, venv,
# tini, libgomp, CA certificates), with the user kubeforge (UID/GID 1000), committed by buildah as REF.
# No registry image is pulled: the rootfs comes from Debian's packages.
# Usage: images/rootfs/build.sh REF      (the caller, images/build.sh, caches by the hash of this file)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
KF_REPO_ROOT="$(cd "$here/../.." && pwd)"
"$KF_REPO_ROOT/e2e/host/install.sh" >/dev/null
source "$here/../lib/buildah.sh"
ref="$1"
packages=python3,python3-venv,tini,libgomp1,ca-certificates
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include="$packages" bookworm "$work/root" "$(kf_debian_mirror)" >"$work/log" 2>&1 ||
  { tail -20 "$work/log" >&2; exit 1; }
root="$work/root"
# Nothing an image needs at run time: apt lists and caches, docs, man pages, locales but C.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'C*' -exec rm -rf {} + 2>/dev/null || true
echo 'kubeforge:x:1000:1000:kubeforge:/tmp:/usr/sbin/nologin' >>"$root/etc/passwd"
echo 'kubeforge:x:1000:' >>"$root/etc/group"
echo 'kubeforge:*:19000:0:99999:7:::' >>"$root/etc/shadow"
c="$(kf_buildah from scratch)"
trap 'kf_buildah rm "$c" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
tar -C "$root" -cf "$work/rootfs.tar" .
kf_buildah add "$c" "$work/rootfs.tar" / >/dev/null
kf_buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
  --cmd /bin/sh --os linux --arch amd64 "$c"
kf_buildah commit --rm "$c" "$ref" >/dev/null
