#!/usr/bin/env bash
# Build the base image for kubeforge pods on the real test node: busybox-static and nothing else, packed by buildah
# as an OCI archive.
# Pods run the host's Python through hostPath mounts (see images/README.md and e2e/node/realnode.py).
# Usage: images/base/build.sh OUT.tar [REF]      (REF defaults to kubeforge.local/base:1)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/../../e2e/host/install.sh" >&2 # static busybox, buildah
out="$1"; ref="${2:-kubeforge.local/base:1}"
busybox="$(command -v busybox)"
case "$(ldd "$busybox" 2>&1 || true)" in *"not a dynamic executable"*) ;; *) echo "busybox at $busybox is not static (install busybox-static)" >&2; exit 1 ;; esac
root="$(mktemp -d)"; trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,root,proc,sys,dev,var/tmp,lib/x86_64-linux-gnu,lib64}
chmod 1777 "$root/tmp" "$root/var/tmp"
install -m 0755 "$busybox" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
  [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done
ln -s ../../bin/env "$root/usr/bin/env"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
source "$here/../lib/buildah.sh"; source "$here/../lib/pack.sh"
kf_pack_rootfs "$root" "$ref" "$out" --cmd '["/bin/sh"]'

