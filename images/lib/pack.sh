# kf_pack_rootfs: a directory as a one-layer image, by buildah (sourced by images/pause/build.sh and
# images/base/build.sh: the real node's images). Sources lib/buildah.sh (kf_buildah) itself.
source "$(dirname "${BASH_SOURCE[0]}")/buildah.sh"
# kf_pack_rootfs DIR REF OUT [buildah config args...]: DIR as a one-layer image REF (files owned by root, symlinks and
# modes kept, every timestamp 0: the same DIR gives the same image), written to OUT as an OCI archive.
kf_pack_rootfs() {
  local dir="$1" ref="$2" out="$3" c mnt
  shift 3
  mkdir -p "$KF_BUILDAH_ROOT" "$KF_BUILDAH_RUNROOT"
  c="$(kf_buildah from --quiet scratch)"
  mnt="$(kf_buildah mount "$c")"
  cp -a --no-preserve=ownership "$dir"/. "$mnt"/
  kf_buildah umount "$c" >/dev/null
  kf_buildah config --os linux --arch amd64 "$@" "$c"
  kf_buildah commit --quiet --rm --timestamp 0 "$c" "$ref" >/dev/null
  rm -f "$out"
  kf_buildah push --quiet --disable-compression "$ref" "oci-archive:$out:$ref" >/dev/null
}
