# Shared settings of the image builds (sourced by images/build.sh and images/rootfs/build.sh).
#
# Every image here is built by buildah as root with chroot isolation (no daemon, no registry): its storage lives
# under the kubeforge cache (never the host's /var/lib/containers), so builds of different checkouts share layers
# and nothing of it leaks into the system's container storage. Archives are OCI archives (`buildah push
# oci-archive:`) that containerd imports with `ctr images import`.
KF_IMG_CACHE="${KUBEFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeforge}"
KF_BUILDAH_ROOT="${KF_BUILDAH_ROOT:-$KF_IMG_CACHE/buildah/storage}"
KF_BUILDAH_RUNROOT="${KF_BUILDAH_RUNROOT:-/run/kubeforge-buildah}"
# overlay needs a kernel overlayfs (present wherever containerd's overlayfs snapshotter runs); vfs is the fallback.
KF_BUILDAH_DRIVER="${KF_BUILDAH_DRIVER:-overlay}"
export BUILDAH_ISOLATION=chroot

kf_buildah() {
  buildah --root "$KF_BUILDAH_ROOT" --runroot "$KF_BUILDAH_RUNROOT" --storage-driver "$KF_BUILDAH_DRIVER" "$@"
}

# kf_hash FILE_OR_DIR...: a short hash of the names and contents of the files (dirs: their tracked-looking files).
kf_hash() {
  local p
  for p in "$@"; do
    if [ -d "$p" ]; then
      find "$p" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 | LC_ALL=C sort -z |
        xargs -0 sha256sum
    else
      sha256sum "$p"
    fi
  done | sed "s#  $KF_REPO_ROOT/#  #" | sha256sum | cut -c1-16
}

# kf_debian_mirror: the Debian mirror the host's apt uses (so no mirror is named in the repository).
kf_debian_mirror() {
  local uri
  uri="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
  [ -n "$uri" ] || uri="$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
  [ -n "$uri" ] || { echo "no Debian mirror found in the host's apt sources" >&2; return 1; }
  echo "$uri"
}
