#!/usr/bin/env bash
# The one install step for host prerequisites (`make host-deps`): every Debian package listed in
# e2e/host/packages.txt whose commands or files are missing is installed with apt-get, then all are checked.
#
# Usage: e2e/host/install.sh [--check]
#   --check   install nothing: list what is missing and exit 1 if anything is.
# Idempotent and cheap when everything is present (no apt-get call), so every script that uses a listed tool
# calls it before the first use (tests/test_host_deps.py checks that order). Needs root only to install.
# Prints "host prerequisites present (N packages)" last, or the missing ones and exits non-zero.
set -euo pipefail
manifest="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/packages.txt"
check_only=0
[ "${1:-}" = --check ] && check_only=1

present() { # tool: a command on PATH (sbin included: root's tools live there) or an existing file
  case "$1" in
    /*) [ -e "$1" ] ;;
    busybox) # the real node's base image copies it into a rootfs: it must be the static build
      local b; b="$(PATH="$PATH:/usr/sbin:/sbin" command -v busybox 2>/dev/null)" || return 1
      case "$(LC_ALL=C ldd "$b" 2>&1 || true)" in *"not a dynamic executable"*) return 0 ;; *) return 1 ;; esac ;;
    *) PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null 2>&1 ;;
  esac
}

missing_packages() { # prints "package (tool tool)" per package with a missing tool
  local pkg tool gone
  while read -r pkg tools; do
    case "$pkg" in ''|'#'*) continue ;; esac
    gone=()
    for tool in $tools; do present "$tool" || gone+=("$tool"); done
    [ ${#gone[@]} -eq 0 ] || echo "$pkg (${gone[*]})"
  done <"$manifest"
}

count="$(grep -cvE '^\s*(#|$)' "$manifest")"
missing="$(missing_packages)"
if [ -z "$missing" ]; then
  echo "host prerequisites present ($count packages)"
  exit 0
fi
echo "host prerequisites missing:" >&2
sed 's/^/  /' <<<"$missing" >&2
[ "$check_only" = 0 ] || exit 1
if [ "$(id -u)" != 0 ]; then
  echo "install them as root: apt-get install --no-install-recommends $(cut -d' ' -f1 <<<"$missing" | tr '\n' ' ')" >&2
  exit 1
fi
mapfile -t pkgs < <(cut -d' ' -f1 <<<"$missing")
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
missing="$(missing_packages)"
if [ -n "$missing" ]; then
  echo "still missing after apt-get install:" >&2; sed 's/^/  /' <<<"$missing" >&2; exit 1
fi
echo "host prerequisites present ($count packages; installed: ${pkgs[*]})"
