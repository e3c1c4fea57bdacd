#!/usr/bin/env bash
# Build the test cluster's binaries from the Go module proxy, pinned and cached by version.
#
# Usage: e2e/build/build.sh [--print-bin-dir] [component|group ...]
#   components: etcd kube-apiserver kube-controller-manager kubectl kube-scheduler kwok kwokctl
#               helm kubelet kube-proxy coredns registry kube-router kueue kube-scheduler-stock
#   groups:     control-plane (first seven), node (kubelet kube-proxy coredns), all (default)
#   (registry: the OCI distribution registry that `make images REGISTRY=...` is tested against;
#    kube-router: only its NetworkPolicy controller runs, the real nodes' enforcer, e2e/node/netpol.sh;
#    kueue: Kueue's manager, started by `make cluster-up KUEUE=1`; its CRDs land in share/crds/kueue/;
#    kube-scheduler-stock: the stock kube-scheduler of k8s.io/kubernetes, no plugins added, for
#    `make cluster-up SCHEDULER=default`)
#
# Each upstream piece is built through its own wrapper module in e2e/build/mod/<wrapper>
# (copied to the cache, so the repo is never modified). Binaries land in
#   ${KUBEFORGE_CACHE:-~/.cache/kubeforge}/k8s-v1.34.10/bin
# A binary is trusted only when its stamp (.stamp/<name>) names the pinned version; it is
# compiled to a temporary name and renamed into place, so a crashed build never leaves a
# half binary behind. Components already built are skipped (a warm machine: seconds).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE_ROOT="${KUBEFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeforge}"
CACHE="$CACHE_ROOT/k8s-$K8S_VERSION"
BIN="$CACHE/bin"
STAMPS="$BIN/.stamp"
SRC="$CACHE/src"
SHARE="$CACHE/share"

ALL=(etcd kube-apiserver kube-controller-manager kubectl kube-scheduler kwok kwokctl helm kubelet kube-proxy coredns registry
  kube-router kueue kube-scheduler-stock)
CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager kubectl kube-scheduler kwok kwokctl)
NODE=(kubelet kube-proxy coredns)

log() { printf '[build-cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# component -> "wrapper|package|version"
spec() {
  case "$1" in
    etcd)                    echo "etcd|go.etcd.io/etcd/server/v3|$ETCD_VERSION" ;;
    kube-apiserver)          echo "kubernetes|k8s.io/kubernetes/cmd/kube-apiserver|$K8S_VERSION" ;;
    kube-controller-manager) echo "kubernetes|k8s.io/kubernetes/cmd/kube-controller-manager|$K8S_VERSION" ;;
    kubectl)                 echo "kubernetes|k8s.io/kubernetes/cmd/kubectl|$K8S_VERSION" ;;
    kubelet)                 echo "kubernetes|k8s.io/kubernetes/cmd/kubelet|$K8S_VERSION" ;;
    kube-proxy)              echo "kubernetes|k8s.io/kubernetes/cmd/kube-proxy|$K8S_VERSION" ;;
    kube-scheduler-stock)    echo "kubernetes|k8s.io/kubernetes/cmd/kube-scheduler|$K8S_VERSION" ;;
    kube-scheduler)          echo "scheduler|.|$K8S_VERSION+scheduler-plugins-$SCHEDULER_PLUGINS_VERSION" ;;
    kwok)                    echo "kwok|sigs.k8s.io/kwok/cmd/kwok|$KWOK_VERSION" ;;
    kwokctl)                 echo "kwok|sigs.k8s.io/kwok/cmd/kwokctl|$KWOK_VERSION" ;;
    helm)                    echo "helm|helm.sh/helm/v3/cmd/helm|$HELM_VERSION" ;;
    coredns)                 echo "coredns|github.com/coredns/coredns|$COREDNS_VERSION" ;;
    registry)                echo "registry|github.com/distribution/distribution/v3/cmd/registry|$REGISTRY_VERSION" ;;
    kube-router)             echo "kube-router|github.com/cloudnativelabs/kube-router/v2/cmd/kube-router|$KUBE_ROUTER_VERSION" ;;
    kueue)                   echo "kueue|sigs.k8s.io/kueue/cmd/kueue|$KUEUE_VERSION" ;;
    *) return 1 ;;
  esac
}

ldflags_for() {
  local wrapper="$1" f="-s -w"
  case "$wrapper" in
    kubernetes|scheduler)
      local major="${K8S_VERSION#v}"; major="${major%%.*}"
      local minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
      for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        f+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
        f+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
      done ;;
    kwok)
      f+=" -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
      f+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}" ;;
    kube-router)
      f+=" -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION"
      f+=" -X github.com/cloudnativelabs/kube-router/v2/pkg/version.BuildDate=1970-01-01T00:00:00Z" ;;
    helm)
      local minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
      f+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
      f+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
      f+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor" ;;
    kueue)
      f+=" -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION -X sigs.k8s.io/kueue/pkg/version.BuildDate=1970-01-01T00:00:00Z" ;;
  esac
  echo "$f"
}

is_built() {
  local name="$1" version="$2"
  [[ -x "$BIN/$name" && -f "$STAMPS/$name" && "$(cat "$STAMPS/$name")" == "$version" ]]
}

# Copy the wrapper module into the cache (fresh copy each time: go.mod/go.sum may be updated there).
prepare_src() {
  local wrapper="$1"
  mkdir -p "$SRC"
  rm -rf "$SRC/$wrapper.tmp"
  cp -r "$HERE/mod/$wrapper" "$SRC/$wrapper.tmp"
  rm -rf "$SRC/$wrapper"
  mv "$SRC/$wrapper.tmp" "$SRC/$wrapper"
}

build_one() {
  local name="$1" s wrapper pkg version
  s="$(spec "$name")" || die "unknown component '$name' (known: ${ALL[*]} control-plane node all)"
  IFS='|' read -r wrapper pkg version <<<"$s"
  if is_built "$name" "$version"; then
    log "$name $version: cached ($BIN/$name)"
    return 0
  fi
  log "$name $version: building from wrapper e2e/build/mod/$wrapper (package $pkg) ..."
  prepare_src "$wrapper"
  local tmp="$BIN/.$name.tmp.$$" t0=$SECONDS
  mkdir -p "$BIN" "$STAMPS"
  rm -f "$BIN/.$name.tmp."*  # leftovers of an interrupted build (we hold the build lock)
  # -mod=mod lets Go complete go.sum in the cache copy (e.g. kubelet-only dependencies);
  # every version is fixed by the wrapper's go.mod, so this never picks a newer module.
  (
    cd "$SRC/$wrapper"
    CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" \
      go build -trimpath -tags=selinux,notest,grpcnotrace \
        -ldflags "$(ldflags_for "$wrapper")" -o "$tmp" "$pkg"
  ) || { rm -f "$tmp"; die "$name: go build failed (see above)"; }
  mv -f "$tmp" "$BIN/$name"
  printf '%s' "$version" >"$STAMPS/.$name.tmp" && mv -f "$STAMPS/.$name.tmp" "$STAMPS/$name"
  log "$name $version: built in $((SECONDS - t0)) s ($(du -h "$BIN/$name" | cut -f1))"
  printf '%s %s %d\n' "$name" "$version" "$((SECONDS - t0))" >>"$CACHE/build-times.log"
  [[ "$name" == kube-scheduler ]] && install_crds
  [[ "$name" == kueue ]] && install_kueue_crds
  return 0
}

# Kueue's CRDs ship in its module zip (config/components/crd/bases/); copied beside the binary's stamp version.
install_kueue_crds() {
  local dir
  dir="$(cd "$SRC/kueue" && GOWORK=off GOTOOLCHAIN=local GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  rm -rf "$SHARE/crds/.kueue.tmp"
  mkdir -p "$SHARE/crds/.kueue.tmp"
  cp "$dir"/config/components/crd/bases/*.yaml "$SHARE/crds/.kueue.tmp/"
  chmod 644 "$SHARE/crds/.kueue.tmp/"*.yaml
  printf '%s' "$KUEUE_VERSION" >"$SHARE/crds/.kueue.tmp/.version"
  rm -rf "$SHARE/crds/kueue"
  mv "$SHARE/crds/.kueue.tmp" "$SHARE/crds/kueue"
  log "Kueue CRDs: $SHARE/crds/kueue/"
}

# The PodGroup CRD ships in the scheduler-plugins module zip.
install_crds() {
  local dir
  dir="$(cd "$SRC/scheduler" && GOWORK=off GOTOOLCHAIN=local GOFLAGS=-mod=mod \
    go list -m -f '{{.Dir}}' sigs.k8s.io/scheduler-plugins)"
  mkdir -p "$SHARE/crds"
  cp "$dir/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml" "$SHARE/crds/.podgroups.tmp"
  chmod 644 "$SHARE/crds/.podgroups.tmp"
  mv -f "$SHARE/crds/.podgroups.tmp" "$SHARE/crds/scheduling.x-k8s.io_podgroups.yaml"
  log "PodGroup CRD: $SHARE/crds/scheduling.x-k8s.io_podgroups.yaml"
}

# Cold build seconds per component (this project's build-times.log, 2-core Xeon, 2026-11-29), to balance the lanes.
weight() {
  case "$1" in
    kueue) echo 416 ;; kube-apiserver) echo 153 ;; coredns) echo 106 ;; helm) echo 100 ;; kube-router) echo 99 ;;
    kube-scheduler) echo 92 ;; kwok) echo 73 ;; registry) echo 50 ;; kube-controller-manager) echo 42 ;;
    etcd) echo 37 ;; *) echo 15 ;;
  esac
}

# Builds the components in KF_BUILD_JOBS lanes (default 2) at once. One `go build` leaves a core idle while it links
# or downloads modules (a sequential cold build used 1.3 of 2 cores); two lanes fill it. A wrapper's components stay
# in one lane, in order (they share its source copy in the cache and each other's compiled packages); wrappers go to
# the lane with the least work so far, the largest first. The Go build and module caches are safe to share.
build_lanes() {
  local jobs="${KF_BUILD_JOBS:-2}" n s wrapper version
  [[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "KF_BUILD_JOBS must be a whole number >= 1 (got '$jobs')"
  local -A group=() cost=()
  local order=()
  for n in "$@"; do
    s="$(spec "$n")"; wrapper="${s%%|*}"; version="${s##*|}"
    [[ -n "${group[$wrapper]+x}" ]] || { order+=("$wrapper"); group[$wrapper]=""; cost[$wrapper]=0; }
    [[ " ${group[$wrapper]} " == *" $n "* ]] && continue
    group[$wrapper]+=" $n"
    is_built "$n" "$version" || cost[$wrapper]=$(( cost[$wrapper] + $(weight "$n") ))
  done
  local -a lane=() load=()
  local i best w
  for ((i = 0; i < jobs; i++)); do lane[i]=""; load[i]=0; done
  for w in $(for w in "${order[@]}"; do echo "${cost[$w]} $w"; done | sort -k1,1nr -s | cut -d' ' -f2); do
    best=0
    for ((i = 1; i < jobs; i++)); do (( load[i] < load[best] )) && best=$i; done
    lane[best]+="${group[$w]}"; load[best]=$(( load[best] + cost[$w] ))
  done
  local pids=() failed=0
  for ((i = 0; i < jobs; i++)); do
    [[ -n "${lane[i]}" ]] || continue
    (( jobs == 1 )) || log "lane $((i + 1)) of $jobs (~${load[i]} s cold):${lane[i]}"
    ( for n in ${lane[i]}; do build_one "$n"; done ) &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || failed=1; done
  (( failed == 0 )) || die "a build lane failed (see above)"
}

main() {
  local want=()
  if [[ "${1:-}" == "--print-bin-dir" ]]; then echo "$BIN"; return 0; fi
  [[ $# -eq 0 ]] && set -- all
  for a in "$@"; do
    case "$a" in
      all) want+=("${ALL[@]}") ;;
      control-plane) want+=("${CONTROL_PLANE[@]}") ;;
      node) want+=("${NODE[@]}") ;;
      -h|--help) sed -n '2,16p' "$0"; return 0 ;;
      *) spec "$a" >/dev/null || die "unknown component '$a' (known: ${ALL[*]} control-plane node all)"; want+=("$a") ;;
    esac
  done
  local missing=() n s version
  for n in "${want[@]}"; do
    s="$(spec "$n")"; version="${s##*|}"
    is_built "$n" "$version" || missing+=("$n")
  done
  [[ "$(printf '%s\n' "${want[@]}" | grep -cx kube-scheduler)" -gt 0 && ! -f "$SHARE/crds/scheduling.x-k8s.io_podgroups.yaml" ]] \
    && missing+=(crd)
  [[ "$(printf '%s\n' "${want[@]}" | grep -cx kueue)" -gt 0 && ! -f "$SHARE/crds/kueue/.version" ]] \
    && missing+=(kueue-crds)
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "all ${#want[@]} requested components cached in $BIN"
    return 0
  fi
  if ! command -v go >/dev/null 2>&1; then
    die "Go is not installed (need Go >= 1.26 on PATH) and these are not built yet: ${missing[*]}.
  Install Go, or put prebuilt binaries of the pinned versions (see e2e/build/versions.env) into $BIN
  and write the version into $STAMPS/<name>."
  fi
  mkdir -p "$CACHE"
  # One build at a time per cache (other sessions may call this concurrently).
  exec 9>"$CACHE/.build.lock"
  if ! flock -n 9; then log "another build holds $CACHE/.build.lock; waiting ..."; flock 9; fi
  log "go: $(go version); cache: $CACHE; to build: ${missing[*]}"
  local t0=$SECONDS
  build_lanes "${want[@]}"
  [[ -f "$SHARE/crds/scheduling.x-k8s.io_podgroups.yaml" ]] || { prepare_src scheduler; install_crds; }
  if printf '%s\n' "${want[@]}" | grep -qx kueue && [[ ! -f "$SHARE/crds/kueue/.version" \
      || "$(cat "$SHARE/crds/kueue/.version")" != "$KUEUE_VERSION" ]]; then
    prepare_src kueue; install_kueue_crds
  fi
  log "done in $((SECONDS - t0)) s; binaries in $BIN"
}

main "$@"
