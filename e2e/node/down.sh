#!/usr/bin/env bash
# Stop the real test node and remove every trace of it. Called first by `make cluster-down`.
#
# Usage: e2e/node/down.sh <cluster-workdir>
# Order (each step makes the next one safe):
#   1. cordon the node and delete its pods through the API, so the kubelet itself tears them down
#      (CNI DEL releases the IP lease and the veth, volumes are unmounted, netns removed);
#   2. stop kubelet, kube-proxy, CoreDNS by their recorded PIDs;
#   3. kill any task containerd still has, stop containerd, then its shims (found by our socket);
#   4. `kube-proxy --cleanup` and the kubelet's canary chains, our guard chain;
#   5. leftover pod netns (cni-* made after pre-up), mounts under the node dir, the node dir itself
#      (logs are kept), host paths the runtime created (/run/containerd, /var/lib/cni, ...: only those
#      that did not exist before pre-up.sh), kubepods cgroups, the bridge, and the sysctls pre-up.sh saved.
# Idempotent and safe on a half-started node; prints "real node down in <s> s" last.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib.sh"
T0=$SECONDS
step() { kf_log "[$((SECONDS - T0)) s] $*"; }

if [ -n "${1:-}" ] && [ -d "$1" ]; then
  kf_dirs "$1"
elif [ -f "$KF_HOST_STATE/workdir" ] && [ -d "$(cat "$KF_HOST_STATE/workdir")" ]; then
  kf_dirs "$(cat "$KF_HOST_STATE/workdir")"
else
  KF_W=""; KF_N="/nonexistent-kubeforge-node"; KF_CONTAINERD_SOCK="$KF_N/containerd.sock"
fi

drain_pods() {
  [ -n "$(kf_pid kubelet)" ] || return 0
  ( kf_cluster_facts ) >/dev/null 2>&1 || { kf_log "cluster unreachable: skipping the API drain"; return 0; }
  kf_cluster_facts
  kf_kubectl get --raw /readyz >/dev/null 2>&1 || { kf_log "apiserver not ready: skipping the API drain"; return 0; }
  kf_kubectl cordon "$KF_NODE_NAME" >/dev/null 2>&1 || true
  kf_kubectl delete pods -A --field-selector "spec.nodeName=$KF_NODE_NAME" \
    --grace-period=2 --wait=true --timeout=60s >/dev/null 2>&1 || kf_log "warning: pod deletion timed out"
  # The kubelet stops sandboxes (CNI DEL, netns removal) right after the containers; wait for it.
  local i
  for ((i = 0; i < 150; i++)); do
    [ -z "$(kf_ctr tasks ls -q 2>/dev/null)" ] && break
    sleep 0.2
  done
  kf_kubectl delete node "$KF_NODE_NAME" --wait=false >/dev/null 2>&1 || true
  [ -f "$KF_N/etc/coredns-rbac.yaml" ] && kf_kubectl delete -f "$KF_N/etc/coredns-rbac.yaml" --ignore-not-found >/dev/null 2>&1
  step "pods deleted through the kubelet"
}

stop_runtime() {
  local id pid
  if [ -n "$(kf_pid containerd)" ]; then
    for id in $(kf_ctr tasks ls -q 2>/dev/null); do
      kf_log "leftover task $id: killing"
      kf_ctr tasks kill -s SIGKILL "$id" >/dev/null 2>&1
      kf_ctr tasks delete -f "$id" >/dev/null 2>&1
    done
  fi
  kf_stop 15 containerd
  for pid in $(kf_shim_pids); do
    kf_log "leftover shim pid $pid: stopping"
    kill -TERM "$pid" 2>/dev/null; sleep 0.5; kill -KILL "$pid" 2>/dev/null
  done
}

clean_iptables() {
  local bin t c ipt
  bin="$(kf_bin_dir 2>/dev/null)"
  if [ -x "$bin/kube-proxy" ] && grep -q -- '-N KUBE-' <<<"$(iptables -w -t nat -S 2>/dev/null)"; then
    "$bin/kube-proxy" --cleanup --v=0 >/dev/null 2>&1 || kf_log "warning: kube-proxy --cleanup failed"
  fi
  # The kubelet's own chains (kube-proxy --cleanup leaves them).
  for ipt in iptables ip6tables; do
    for t in filter nat mangle; do
      for c in KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT KUBE-FIREWALL KUBE-PROXY-CANARY; do
        "$ipt" -w -t "$t" -S "$c" >/dev/null 2>&1 || continue
        "$ipt" -w -t "$t" -S | grep -- "-j $c\$" | sed 's/^-A/-D/' | while read -r rule; do
          eval "$ipt -w -t $t $rule" 2>/dev/null
        done
        "$ipt" -w -t "$t" -F "$c" 2>/dev/null; "$ipt" -w -t "$t" -X "$c" 2>/dev/null
      done
    done
  done
  while iptables -w -D FORWARD -j "$KF_GUARD_CHAIN" 2>/dev/null; do :; done
  iptables -w -F "$KF_GUARD_CHAIN" 2>/dev/null; iptables -w -X "$KF_GUARD_CHAIN" 2>/dev/null
  while iptables -w -t mangle -D FORWARD -j "$KF_GUARD_CHAIN" 2>/dev/null; do :; done
  iptables -w -t mangle -F "$KF_GUARD_CHAIN" 2>/dev/null; iptables -w -t mangle -X "$KF_GUARD_CHAIN" 2>/dev/null
  while iptables -w -D INPUT -j "$KF_INPUT_CHAIN" 2>/dev/null; do :; done
  iptables -w -F "$KF_INPUT_CHAIN" 2>/dev/null; iptables -w -X "$KF_INPUT_CHAIN" 2>/dev/null
  return 0
}

clean_netns() {
  local ns
  [ -d /var/run/netns ] || return 0
  for ns in $(ls /var/run/netns); do
    case "$ns" in cni-*) ;; *) continue ;; esac
    grep -qx "$ns" "$KF_HOST_STATE/netns.before" 2>/dev/null && continue
    kf_log "leftover netns $ns: removing"
    ip netns delete "$ns" 2>/dev/null || { umount -l "/var/run/netns/$ns" 2>/dev/null; rm -f "/var/run/netns/$ns"; }
  done
  release_run_netns
}

# release_run_netns: `ip netns add` (node i >= 1, extra-node.sh) and containerd (pod namespaces) bind-mount
# /run/netns onto itself with shared propagation. When the directory was not there before pre-up.sh and is now
# empty, unmount it (every stacked layer; lazily when busy) and remove it, so nothing is left behind. Node 1's
# `down` runs before node 0's pods are gone (their cni-* namespaces keep the directory busy), so down.sh calls
# this again after clean_netns. (/var/run is a link to /run: mountinfo names the mount /run/netns.)
release_run_netns() {
  local d
  grep -qx /var/run/netns "$KF_HOST_STATE/paths.before" 2>/dev/null && return 0
  d="$(readlink -f /var/run/netns 2>/dev/null)" || return 0
  [ -d "$d" ] && [ -z "$(ls -A "$d" 2>/dev/null)" ] || return 0
  while mountpoint -q "$d"; do umount "$d" 2>/dev/null || umount -l "$d" 2>/dev/null || break; done
  mountpoint -q "$d" && { kf_log "warning: $d is still a mount point"; return 0; }
  rmdir "$d" 2>/dev/null || true
}

clean_node_dir() {
  [ -d "$KF_N" ] || return 0
  local m leases
  leases="$(find "$KF_N/cni/leases" -type f -name '10.*' 2>/dev/null | wc -l)"
  [ "$leases" -eq 0 ] || kf_log "warning: $leases CNI lease(s) were not released by the kubelet; removing them"
  for m in $(kf_mounts_under "$KF_N"); do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
  if [ -n "$(kf_mounts_under "$KF_N")" ]; then
    kf_log "ERROR: mounts remain under $KF_N; not deleting it:"; kf_mounts_under "$KF_N" >&2
    return 1
  fi
  find "$KF_N" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf --one-file-system {} +
}

# Paths containerd/CNI/kubelet made outside our dirs: drop our entries; remove the path if it is new.
clean_host_paths() {
  local p
  [ -d /var/log/containers ] && find /var/log/containers -maxdepth 1 -type l -lname "$KF_N/*" -delete 2>/dev/null
  [ -f "$KF_HOST_STATE/paths.before" ] || return 0
  for p in "${KF_HOST_PATHS[@]}"; do
    [ -e "$p" ] || continue
    grep -qx "$p" "$KF_HOST_STATE/paths.before" && continue
    if [ -n "$(kf_mounts_under "$p")$(kf_mounts_under "$(readlink -f "$p")")" ]; then
      kf_log "warning: mounts remain under $p; leaving it"; continue
    fi
    rm -rf --one-file-system "$p"
  done
}

clean_cgroups() {
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kf-real-[1-9]; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  return 0
}

restore_host() {
  local f path
  ip link show "$KF_BRIDGE" >/dev/null 2>&1 && ip link delete "$KF_BRIDGE"
  for f in "$KF_HOST_STATE"/saved/*; do
    [ -f "$f" ] || continue
    path="/proc/sys/$(basename "$f" | tr . /)"
    [ -e "$path" ] && cat "$f" >"$path"
  done
  rm -rf "$KF_HOST_STATE"
  rm -f "$KF_LOCK" # our fd 8 keeps the lock until exit; a waiter re-creates nothing it needs from this file
}

# The other real nodes (node-<i> dirs, extra-node.sh), before node 0: their pods, processes, namespaces, cgroups.
extra_nodes() { # action
  local d i rc=0
  [ -n "$KF_W" ] || return 0
  for d in "$KF_W"/node-[1-9]; do
    [ -d "$d" ] || continue
    i="${d##*-}"
    bash "$HERE/extra-node.sh" "$KF_W" "$i" "$1" || rc=1
  done
  return "$rc"
}

# The NetworkPolicy enforcers (netpol.sh), first: their rules in the root namespace go with them.
netpol_down() {
  [ -n "$KF_W" ] || return 0
  compgen -G "$KF_W/node*/pids/kube-router.pid" >/dev/null || return 0
  bash "$HERE/netpol.sh" "$KF_W" down || kf_log "warning: netpol.sh down failed"
}

main() {
  local other
  kf_host_deps
  kf_lock
  netpol_down
  other="$(kf_other_node)"
  if [ -n "$other" ]; then
    # Another cluster's real node owns the host state (bridge, iptables, sysctls): leave all of it alone.
    kf_log "the real node of $other is running: cleaning only this cluster's node dir"
    extra_nodes stop-local
    kf_stop 10 kubelet kube-proxy coredns
    stop_runtime
    clean_node_dir
    echo "real node down in $((SECONDS - T0)) s (host state left to $other)"
    return
  fi
  local extra_rc=0
  extra_nodes down || extra_rc=1
  drain_pods
  kf_stop 10 kubelet kube-proxy coredns
  stop_runtime
  step "processes stopped"
  clean_iptables
  clean_netns
  clean_node_dir
  local rc=$?
  clean_host_paths
  clean_cgroups
  restore_host
  [ "$rc" -eq 0 ] && [ "$extra_rc" -eq 0 ] || { kf_log "real node down with errors (see above)"; exit 1; }
  echo "real node down in $((SECONDS - T0)) s"
}

# Run main unless sourced (extra-node.sh sources this file for its steps).
[ "${BASH_SOURCE[0]}" != "$0" ] || main
