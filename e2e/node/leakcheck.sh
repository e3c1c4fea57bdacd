#!/usr/bin/env bash
# Check that the real test node left nothing behind; run after `make cluster-down` (or e2e/node/down.sh).
#
# Usage: e2e/node/leakcheck.sh [--expect-sysctl NAME=VALUE ...] [cluster-workdir]
# Looks for: node processes (containerd, shims, kubelet, kube-proxy, coredns) and any process in a pod
# (another network namespace or a kubepods cgroup); mounts of the node (containerd rootfs/shm, kubelet
# volumes, netns); pod network namespaces; CNI leases; listening sockets on the bridge address or the
# node's ports; iptables/ip6tables rules or chains of ours (KUBE-*, KUBEFORGE-*, CNI-*, 10.88.*);
# the bridges, veths, routes and namespaces of every real node (kf<i>, kfv<i>, kf-real-<i>); shim sockets; kubepods cgroups; our host state dir; sysctls given with
# --expect-sysctl (e.g. net.ipv4.ip_forward=0, the value before cluster-up).
# Prints one line per finding and exits 1, or prints "leakcheck: clean" and exits 0.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kf_host_deps
expect=()
while [ $# -gt 0 ]; do
  case "$1" in
    --expect-sysctl) expect+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
W="${1:-}"
found=0
leak() { echo "LEAK [$1] $2"; found=1; }

check_processes() {
  local d exe net host_net cg
  host_net="$(readlink /proc/$$/ns/net)"
  for d in /proc/[0-9]*; do
    exe="$(readlink "$d/exe" 2>/dev/null)" || continue
    case "${exe##*/}" in
      containerd|containerd-shim*|kubelet|kube-proxy|coredns|runc|pause|kube-router) leak process "pid ${d#/proc/} $exe" ; continue ;;
    esac
    net="$(readlink "$d/ns/net" 2>/dev/null)"
    [ -n "$net" ] && [ "$net" != "$host_net" ] && { leak process "pid ${d#/proc/} $exe runs in another netns ($net)"; continue; }
    cg="$(cat "$d/cgroup" 2>/dev/null)"
    case "$cg" in *kubepods*) leak process "pid ${d#/proc/} $exe is in a kubepods cgroup" ;; esac
  done
}

check_mounts() {
  local pattern="/run/containerd|/var/run/netns|/run/netns|/kubelet/pods|io\.containerd|/run/kubeforge-node"
  [ -n "$W" ] && pattern="$pattern|$W/node"   # node/ and the other nodes' node-<i>/
  awk '{print $5}' /proc/self/mountinfo | grep -E "$pattern" | while read -r m; do echo "LEAK [mount] $m"; done
  grep -qE "$pattern" <<<"$(awk '{print $5}' /proc/self/mountinfo)" && found=1
}

check_netns() {
  local ns
  for ns in $(ls /var/run/netns 2>/dev/null); do
    case "$ns" in cni-*|kf-real-*) leak netns "/var/run/netns/$ns" ;; esac
  done
}

check_leases() {
  [ -d /var/lib/cni/networks/kubeforge ] && leak cni-lease "/var/lib/cni/networks/kubeforge"
  local d
  for d in "$W"/node/cni/leases "$W"/node-[1-9]/cni/leases; do
    [ -n "$W" ] && [ -d "$d" ] && leak cni-lease "$d: $(ls "$d"/* 2>/dev/null | tr '\n' ' ')"
  done
  return 0
}

check_ports() {
  local line
  while read -r line; do
    case "$line" in
      *"$KF_NODE_IP:"*|*":$KF_KUBELET_PORT "*|*":$KF_PROXY_HEALTHZ_PORT "*|*":$KF_PROXY_METRICS_PORT "*) leak port "$line" ;;
      *'"containerd"'*|*'"kubelet"'*|*'"coredns"'*|*'"kube-proxy"'*) leak port "$line" ;;
    esac
  done < <(ss -Hlntup 2>/dev/null)
}

check_iptables() {
  local save line
  for save in iptables-save ip6tables-save; do
    while read -r line; do
      leak iptables "$save: $line"
    done < <("$save" 2>/dev/null | grep -E 'KUBE-|KUBEFORGE|CNI-|10\.(8[7-9]|9[01])\.|kf[0-9]|kfv')
  done
}

check_ipsets() { # the NetworkPolicy enforcer's sets (netpol.sh) in the root namespace
  local set
  command -v ipset >/dev/null 2>&1 || return 0
  for set in $(ipset list -n 2>/dev/null | grep -iE '^kube' || true); do leak ipset "$set"; done
}

check_links() {
  ip link show "$KF_BRIDGE" >/dev/null 2>&1 && leak link "bridge $KF_BRIDGE"
  ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^(kf[0-9]|kfv[0-9])' | while read -r l; do
    echo "LEAK [link] $l"; done
  [ -z "$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^(kf[0-9]|kfv[0-9])')" ] || found=1
  ip route show 2>/dev/null | grep -E '^10\.(8[7-9]|9[01])\.' | while read -r l; do echo "LEAK [route] $l"; done
  [ -z "$(ip route show 2>/dev/null | grep -E '^10\.(8[7-9]|9[01])\.')" ] || found=1
  local l
  for l in $(ip -o link show type veth 2>/dev/null | awk -F': ' '{print $2}'); do leak link "veth $l"; done
}

check_misc() {
  local s d
  for s in /run/containerd/s/*; do [ -e "$s" ] && leak socket "$s"; done
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kf-real-* /sys/fs/cgroup/kf-real-*; do
    [ -d "$d" ] && leak cgroup "$d"; done
  [ -e "$KF_HOST_STATE" ] && leak state "$KF_HOST_STATE"
  [ -e "$KF_LOCK" ] && leak state "$KF_LOCK"
  for d in "${KF_HOST_PATHS[@]}"; do
    [ -e "$d" ] || continue
    case " ${KF_LEAKCHECK_PREEXISTING:-} " in *" $d "*) continue ;; esac
    leak path "$d exists (created by the runtime; remove or list it in KF_LEAKCHECK_PREEXISTING)"
  done
  [ -d /var/log/containers ] && [ -n "$(find /var/log/containers -maxdepth 1 -type l -lname '*/node*/pod-logs/*')" ] &&
    leak path "/var/log/containers holds links into a node's pod-logs"
  for d in "$W"/node "$W"/node-[1-9]; do
    [ -n "$W" ] && [ -d "$d" ] && [ -n "$(find "$d" -mindepth 1 -maxdepth 1 ! -name logs)" ] &&
      leak state "$d still holds: $(find "$d" -mindepth 1 -maxdepth 1 ! -name logs -printf '%f ')"
  done
  local kv name value
  for kv in "${expect[@]}"; do
    name="${kv%%=*}"; value="${kv#*=}"
    [ "$(cat "/proc/sys/$(echo "$name" | tr . /)")" = "$value" ] || leak sysctl "$name is $(cat "/proc/sys/$(echo "$name" | tr . /)"), expected $value"
  done
}

check_processes
check_mounts
check_netns
check_leases
check_ports
check_iptables
check_ipsets
check_links
check_misc
if [ "$found" -eq 0 ]; then
  echo "leakcheck: clean (processes, mounts, netns, CNI leases, ports, iptables, bridge/veths, shim sockets, cgroups, sysctls)"
fi
exit "$found"
