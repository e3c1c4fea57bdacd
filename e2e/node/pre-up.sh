#!/usr/bin/env bash
# Prepare the host network for the real test node; run BEFORE the apiserver starts (it binds the bridge IP).
#
# Usage: e2e/node/pre-up.sh <cluster-workdir>
# Creates bridge kf0 with 10.88.0.1/16 (the node IP), turns on IPv4 forwarding (pod -> Service -> pod is
# routed) and installs our guard chains: FORWARD (pods may talk to pods and to this host, never beyond it)
# and INPUT (the node's addresses answer only loopback and the bridge).
# The sysctl values found are saved under $KF_HOST_STATE (/run/kubeforge-node) and restored by down.sh.
# Idempotent: a second call changes nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kf_host_deps
[ -n "${1:-}" ] || kf_die "usage: $0 <cluster-workdir>"
mkdir -p "$1"
kf_dirs "$1"
mkdir -p "$KF_HOST_STATE/saved"
# Network namespaces that exist before us are not ours: down.sh only removes cni-* ones made later.
[ -f "$KF_HOST_STATE/netns.before" ] || ls /var/run/netns 2>/dev/null >"$KF_HOST_STATE/netns.before" || true

save_only() { # sysctl-path
  local saved="$KF_HOST_STATE/saved/$(echo "$1" | tr / .)"
  [ -f "$saved" ] || cat "/proc/sys/$1" >"$saved"
}
save_and_set() { # sysctl-path value
  local path="/proc/sys/$1" saved="$KF_HOST_STATE/saved/$(echo "$1" | tr / .)"
  [ -f "$saved" ] || cat "$path" >"$saved"
  [ "$(cat "$path")" = "$2" ] || echo "$2" >"$path"
}

[ -f "$KF_HOST_STATE/paths.before" ] || for p in "${KF_HOST_PATHS[@]}"; do [ ! -e "$p" ] || echo "$p"; done >"$KF_HOST_STATE/paths.before"
for p in "${KF_KUBELET_SYSCTLS[@]}"; do [ ! -e "/proc/sys/$p" ] || save_only "$p"; done

if ! ip link show "$KF_BRIDGE" >/dev/null 2>&1; then
  ip link add "$KF_BRIDGE" type bridge
  kf_log "created bridge $KF_BRIDGE"
fi
grep -q "inet $KF_NODE_IP/" <<<"$(ip addr show dev "$KF_BRIDGE")" || ip addr add "$KF_NODE_IP/${KF_POD_CIDR#*/}" dev "$KF_BRIDGE"
ip link set "$KF_BRIDGE" up

save_and_set net/ipv4/ip_forward 1
# Pod -> ClusterIP -> pod on the same bridge needs bridged frames to pass iptables (kube-proxy's DNAT).
[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || modprobe br_netfilter 2>/dev/null || true
if [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]; then
  save_and_set net/bridge/bridge-nf-call-iptables 1
else
  kf_log "warning: br_netfilter unavailable; pod -> Service -> pod on this node may not route"
fi

# FORWARD guard: traffic that enters or leaves through kf0 must stay on kf0.
iptables -w -N "$KF_GUARD_CHAIN" 2>/dev/null || true
iptables -w -F "$KF_GUARD_CHAIN"
# The other real nodes' namespaces hang off veths kfv<i>: kf0 and those veths form the pod network, and
# nothing of it may leave through any other interface.
iptables -w -A "$KF_GUARD_CHAIN" -i "$KF_BRIDGE" -o "$KF_BRIDGE" -j RETURN
iptables -w -A "$KF_GUARD_CHAIN" -i "$KF_BRIDGE" -o "$KF_VETH_PREFIX+" -j RETURN
iptables -w -A "$KF_GUARD_CHAIN" -i "$KF_VETH_PREFIX+" -o "$KF_BRIDGE" -j RETURN
iptables -w -A "$KF_GUARD_CHAIN" -i "$KF_VETH_PREFIX+" -o "$KF_VETH_PREFIX+" -j RETURN
iptables -w -A "$KF_GUARD_CHAIN" -i "$KF_BRIDGE" -j DROP
iptables -w -A "$KF_GUARD_CHAIN" -o "$KF_BRIDGE" -j DROP
iptables -w -A "$KF_GUARD_CHAIN" -i "$KF_VETH_PREFIX+" -j DROP
iptables -w -A "$KF_GUARD_CHAIN" -o "$KF_VETH_PREFIX+" -j DROP
iptables -w -C FORWARD -j "$KF_GUARD_CHAIN" 2>/dev/null || iptables -w -I FORWARD 1 -j "$KF_GUARD_CHAIN"
# The same guard in the mangle table, which the kernel runs before filter: a NetworkPolicy enforcer (netpol.sh)
# puts its own ACCEPTing chain first in filter FORWARD and keeps it there, which would skip the guard above.
iptables -w -t mangle -N "$KF_GUARD_CHAIN" 2>/dev/null || true
iptables -w -t mangle -F "$KF_GUARD_CHAIN"
iptables -w -S "$KF_GUARD_CHAIN" | grep '^-A ' | while read -r _ _ rule; do
  eval "iptables -w -t mangle -A $KF_GUARD_CHAIN $rule"
done
iptables -w -t mangle -C FORWARD -j "$KF_GUARD_CHAIN" 2>/dev/null || iptables -w -t mangle -I FORWARD 1 -j "$KF_GUARD_CHAIN"
# INPUT guard: the node's addresses (and, added by up.sh, the apiserver's port, which listens on all
# addresses) answer only loopback and the bridge, never the external interface.
iptables -w -N "$KF_INPUT_CHAIN" 2>/dev/null || true
iptables -w -F "$KF_INPUT_CHAIN"
iptables -w -A "$KF_INPUT_CHAIN" -i lo -j RETURN
iptables -w -A "$KF_INPUT_CHAIN" -i "$KF_BRIDGE" -j RETURN
iptables -w -A "$KF_INPUT_CHAIN" -i "$KF_VETH_PREFIX+" -j RETURN
iptables -w -A "$KF_INPUT_CHAIN" -d "$KF_POD_CIDR" -j DROP
iptables -w -C INPUT -j "$KF_INPUT_CHAIN" 2>/dev/null || iptables -w -I INPUT 1 -j "$KF_INPUT_CHAIN"
kf_log "host network ready: $KF_BRIDGE $KF_NODE_IP/${KF_POD_CIDR#*/}, ip_forward=1, guard chain $KF_GUARD_CHAIN"
