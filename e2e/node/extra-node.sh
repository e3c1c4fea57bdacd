#!/usr/bin/env bash
# One more real node (index >= 1) beside node 0 (issue 31): `make cluster-up REAL_NODES=2` runs it from up.sh
# once kf-real-0 is Ready, and down.sh runs `down` for every node-<i> dir before it tears node 0 down.
#
# Usage: e2e/node/extra-node.sh <cluster-workdir> <index> up|down|stop-local|lose|partition|heal
#
# Node i is a kubelet + containerd (+ runc) + kube-proxy of its own, joined to the same API server, in network
# namespace kf-real-<i> (its kubelet and containerd enter only that namespace with nsenter: mounts stay shared,
# which the kubelet's volumes and containerd's rootfs need). Everything per node is its own:
#
#   <workdir>/node-<i>/      the same layout as node/ (pids, logs, etc, pki, cni, containerd, kubelet, pod-logs)
#   netns kf-real-<i>        bridge kf<i> 10.(88+i).0.1/16 = node IP and pods' gateway; pods 10.(88+i).1.1-.255.254;
#                            veth kfup 10.87.<i>.2/30, default route to the root namespace; ip_forward=1;
#                            kube-proxy's and the kubelet's iptables rules live (and die) here
#   root netns               veth kfv<i> 10.87.<i>.1/30, route 10.(88+i).0.0/16 via 10.87.<i>.2; pre-up.sh's
#                            guard chains let kf0 <-> kfv+ forward and nothing else leave
#   cgroups                  cgroupRoot /kf-real-<i> (pods under /kf-real-<i>/kubepods in every v1 hierarchy)
#   kubelet port 10250       on its node IP inside the namespace (no clash with node 0's)
# CoreDNS is node 0's (10.88.0.1:53, reached through the root namespace); every packet stays on this machine.
# `stop-local` stops only this node's processes and removes its dir (down.sh's path when another cluster owns
# the host state). `lose` is a node loss (docs/node-loss.md): SIGKILL to its kubelet, kube-proxy, containerd, shims
# and every process in its pods, its namespace, veth, cgroups and state left in place; `up` again rejoins it. `partition` drops every packet between the node and the rest (its processes keep
# running: the node goes NotReady while its pods run), `heal` ends that. Idempotent; prints "real node kf-real-<i> Ready in <s> s" / "... down in <s> s" last.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
W="${1:-}"; IDX="${2:-}"; ACTION="${3:-}"
case "$IDX" in [1-9]) ;; *) echo "usage: $0 <cluster-workdir> <index 1..> up|down|stop-local|lose|partition|heal" >&2; exit 2 ;; esac
source "$HERE/lib.sh"
source "$HERE/configs.sh"
kf_host_deps >/dev/null
# up.sh and down.sh define the steps we reuse; sourced, they run nothing (their main is guarded).
source "$HERE/up.sh"
source "$HERE/down.sh"
set -euo pipefail
[ "$IDX" -lt "$KF_MAX_REAL_NODES" ] || kf_die "node index $IDX: at most $KF_MAX_REAL_NODES real nodes (pods 10.88-10.91)"
kf_dirs "$W"
KF_DNS_IP="$KF_NODE_IP" # node 0's address: its CoreDNS serves every node
KF_N="$KF_W/node-$IDX"
KF_CONTAINERD_SOCK="$KF_N/containerd/containerd.sock"
[ "${#KF_CONTAINERD_SOCK}" -lt 100 ] || kf_die "socket path too long: $KF_CONTAINERD_SOCK"
KF_NODE_NAME="kf-real-$IDX"
KF_NETNS="kf-real-$IDX"
KF_BRIDGE="kf$IDX"
OCTET=$((88 + IDX))
KF_NODE_IP="10.$OCTET.0.1"
KF_POD_CIDR="10.$OCTET.0.0/16"
KF_POD_RANGE_START="10.$OCTET.1.1"
KF_POD_RANGE_END="10.$OCTET.255.254"
KF_CLUSTER_CIDR="$KF_ALL_PODS_CIDR"
KF_CGROUP_ROOT="/kf-real-$IDX"
VETH_ROOT="$KF_VETH_PREFIX$IDX"
VETH_NS="kfup"
LINK_ROOT_IP="10.87.$IDX.1"
LINK_NS_IP="10.87.$IDX.2"

in_ns() { nsenter --net="/run/netns/$KF_NETNS" "$@"; }

cgroup_dirs() { # this node's cgroupRoot in every v1 hierarchy (and the v2 one, where mounted)
  local d
  for d in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [ -e "$d/cgroup.procs" ] || continue
    echo "${d%/}$KF_CGROUP_ROOT"
  done
}

setup_cgroups() {
  local d parent
  for d in $(cgroup_dirs); do
    mkdir -p "$d"
    parent="$(dirname "$d")"
    # cgroup v1 cpuset: a new group has no CPUs or memory nodes until given its parent's.
    if [ -f "$d/cpuset.cpus" ] && [ -z "$(cat "$d/cpuset.cpus")" ]; then
      cat "$parent/cpuset.cpus" >"$d/cpuset.cpus"; cat "$parent/cpuset.mems" >"$d/cpuset.mems"
    fi
  done
}

clean_node_cgroups() {
  local d
  for d in $(cgroup_dirs); do [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null; done
  return 0
}

setup_network() {
  [ -e "/run/netns/$KF_NETNS" ] || ip netns add "$KF_NETNS"
  if ! ip link show "$VETH_ROOT" >/dev/null 2>&1; then
    ip link add "$VETH_ROOT" type veth peer name "$VETH_NS" netns "$KF_NETNS"
  fi
  grep -q "inet $LINK_ROOT_IP/" <<<"$(ip addr show dev "$VETH_ROOT")" || ip addr add "$LINK_ROOT_IP/30" dev "$VETH_ROOT"
  ip link set "$VETH_ROOT" up
  ip route replace "$KF_POD_CIDR" via "$LINK_NS_IP" dev "$VETH_ROOT"
  in_ns ip link set lo up
  grep -q "inet $LINK_NS_IP/" <<<"$(in_ns ip addr show dev "$VETH_NS")" || in_ns ip addr add "$LINK_NS_IP/30" dev "$VETH_NS"
  in_ns ip link set "$VETH_NS" up
  in_ns ip route replace default via "$LINK_ROOT_IP" dev "$VETH_NS"
  in_ns ip link show "$KF_BRIDGE" >/dev/null 2>&1 || in_ns ip link add "$KF_BRIDGE" type bridge
  grep -q "inet $KF_NODE_IP/" <<<"$(in_ns ip addr show dev "$KF_BRIDGE")" ||
    in_ns ip addr add "$KF_NODE_IP/${KF_POD_CIDR#*/}" dev "$KF_BRIDGE"
  in_ns ip link set "$KF_BRIDGE" up
  # Per-namespace settings (they vanish with the namespace): routing, and bridged pod traffic through
  # kube-proxy's iptables rules (pod -> ClusterIP -> pod on the same bridge).
  in_ns sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward'
  in_ns sh -c '[ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables'
  # Only loopback, the veth and the bridge exist in the namespace: nothing here reaches the external interface
  # except through the root namespace's guard chains.
}

up_extra() {
  [ "$(id -u)" = 0 ] || kf_die "the real node needs root"
  ensure_binaries
  kf_cluster_facts
  # Inside the namespace loopback is its own: reach the apiserver (listening on all addresses, its certificate
  # naming 10.88.0.1) at node 0's bridge address, through the veth.
  local port="${KF_APISERVER_URL##*:}"; port="${port%%/*}"
  KF_APISERVER_URL="https://$KF_DNS_IP:$port"
  mkdir -p "$KF_N"/{etc,pki,logs,pids,cni/net.d,cni/leases,containerd,kubelet}
  chmod 700 "$KF_N/pki"
  setup_network
  setup_cgroups
  step "$KF_NODE_NAME: netns $KF_NETNS ($KF_NODE_IP, pods $KF_POD_CIDR), cgroupRoot $KF_CGROUP_ROOT"
  sign_client kubelet "system:node:$KF_NODE_NAME" system:nodes
  sign_client kube-proxy system:kube-proxy
  start_containerd
  start_kube_proxy
  start_kubelet
  echo "real node $KF_NODE_NAME Ready in $((SECONDS - T0)) s"
}

down_extra() {
  drain_pods
  kf_stop 10 kubelet kube-proxy
  stop_runtime
  step "$KF_NODE_NAME: processes stopped"
  local rc=0
  clean_node_dir || rc=1
  [ -d /var/log/containers ] && find /var/log/containers -maxdepth 1 -type l -lname "$KF_N/*" -delete 2>/dev/null
  # The namespace takes its veth end, bridge, routes and iptables rules with it; the root end of the veth goes too.
  if [ -e "/run/netns/$KF_NETNS" ]; then ip netns delete "$KF_NETNS" || rc=1; fi
  # `ip netns add` made /run/netns a mount point of its own: undone when it was ours and is now empty (down.sh's
  # release_run_netns; node 0's pods' namespaces may still be there, then down.sh does it after its clean_netns)
  release_run_netns
  ip link show "$VETH_ROOT" >/dev/null 2>&1 && ip link delete "$VETH_ROOT"
  clean_node_cgroups
  [ "$rc" -eq 0 ] || { kf_log "real node $KF_NODE_NAME down with errors (see above)"; exit 1; }
  echo "real node $KF_NODE_NAME down in $((SECONDS - T0)) s"
}

# The tasks of every pod of this node (every hierarchy's kubepods under its cgroupRoot), one PID a line.
pod_pids() {
  local d
  for d in $(cgroup_dirs); do
    [ -d "$d/kubepods" ] || continue
    find "$d/kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -u
}

# A node dies at once: its kubelet, kube-proxy, containerd and every process of its pods in one kill, their PIDs
# gathered first (killed one group after another, with the shims' /proc scan between them, the pods ran ~15 s past
# their kubelet at nice 19 on a loaded machine, and the fault's time, the kubelet's last word, was not the pods').
# Then the shims, then whatever a pod forked meanwhile.
lose_extra() {
  local name pid pids=()
  for name in kubelet kube-proxy containerd; do
    pid="$(kf_pid "$name")"; [ -z "$pid" ] || pids+=("$pid")
  done
  mapfile -t -O "${#pids[@]}" pids < <(pod_pids)
  [ "${#pids[@]}" -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null || true
  for pid in $(kf_shim_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  pod_pids | xargs -r kill -KILL 2>/dev/null || true
  echo "real node $KF_NODE_NAME lost (processes killed; namespace, cgroups and state kept)"
}

# partition / heal: drop every packet through the node's link to the root namespace, both ways (the kubelet's
# heartbeats, kube-proxy's watch, its pods' traffic to node 0), no process killed; heal removes the rules again.
# iptables in the node's own namespace (first in INPUT, OUTPUT, FORWARD, matched on the veth kfup), so the pods on
# the node still reach each other across its bridge. Idempotent.
PARTITION_RULES=("INPUT -i $VETH_NS" "OUTPUT -o $VETH_NS" "FORWARD -i $VETH_NS" "FORWARD -o $VETH_NS")
partition_extra() {
  local r
  [ -e "/run/netns/$KF_NETNS" ] || { echo "no namespace $KF_NETNS: node $KF_NODE_NAME is not up" >&2; exit 1; }
  for r in "${PARTITION_RULES[@]}"; do
    # shellcheck disable=SC2086  # the rule's words
    in_ns iptables -w 10 -C ${r%% *} ${r#* } -m comment --comment kubeforge-partition -j DROP 2>/dev/null ||
      in_ns iptables -w 10 -I ${r%% *} 1 ${r#* } -m comment --comment kubeforge-partition -j DROP
  done
  echo "real node $KF_NODE_NAME partitioned (every packet through $VETH_NS dropped)"
}
heal_extra() {
  local r
  [ -e "/run/netns/$KF_NETNS" ] || return 0
  for r in "${PARTITION_RULES[@]}"; do
    # shellcheck disable=SC2086
    while timeout 20 nsenter --net="/run/netns/$KF_NETNS" iptables -w 10 -D ${r%% *} ${r#* } -m comment --comment kubeforge-partition -j DROP 2>/dev/null; do :; done
  done
  echo "real node $KF_NODE_NAME healed (partition rules removed)"
}

case "$ACTION" in
  partition) partition_extra ;;
  heal) set +e; heal_extra ;;
  up) trap 'rc=$?; [ "$rc" -eq 0 ] || on_error' EXIT; up_extra ;;
  down) set +e; down_extra ;;
  lose) set +e; lose_extra ;;
  stop-local) set +e; kf_stop 10 kubelet kube-proxy; stop_runtime; clean_node_dir; echo "real node $KF_NODE_NAME stopped" ;;
  *) echo "usage: $0 <cluster-workdir> <index> up|down|stop-local|lose|partition|heal" >&2; exit 2 ;;
esac
