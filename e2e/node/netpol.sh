#!/usr/bin/env bash
# NetworkPolicy enforced on the real nodes (issue 31 item 2): one kube-router per real node, running only its
# NetworkPolicy controller (--run-firewall: iptables + ipset), in the node's network namespace, against the
# cluster's API server.
#
# Usage: e2e/node/netpol.sh <cluster-workdir> up|down
#   up:   for node 0 (root namespace, <workdir>/node) and every node-<i> (namespace kf-real-<i>): a client cert
#         CN=kubeforge:netpol (signed by the cluster CA; ClusterRole kubeforge:netpol reads pods, namespaces,
#         nodes, services, endpoints and NetworkPolicies), a kubeconfig, then kube-router; waits until each has
#         installed its chains (KUBE-ROUTER-FORWARD) in its namespace. Prints "netpol enforced on <n> node(s)" last.
#   down: stops them by PID and removes their iptables chains and ipsets (a node's namespace takes its own along
#         when the node goes; node 0's live in the root namespace). Idempotent. down.sh calls it first.
#
# Why kube-router and not sigs.k8s.io/kube-network-policies v0.8.0 (it builds from the module proxy): that enforcer
# hands packets to user space with the nftables `queue` expression, and the test machines' kernel has no
# CONFIG_NFT_QUEUE (`nft add rule inet t c queue num 100` -> "No such file or directory"; checked 2026-11-28, no
# loadable modules). kube-router's controller needs only iptables `set` matches on ipsets, `physdev` for bridged
# pod traffic and conntrack, which this kernel has.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
W="${1:-}"; ACTION="${2:-}"
source "$HERE/lib.sh"
source "$HERE/configs.sh"
kf_host_deps >/dev/null
source "$HERE/up.sh"
set -euo pipefail
kf_dirs "$W"
SERVICE_CIDR="10.96.0.0/16"   # realnode.SERVICE_CIDR
CHAIN_RE='^(KUBE-ROUTER-|KUBE-POD-FW-|KUBE-NWPLCY-)'

# node_vars DIR: KF_N, KF_NETNS, KF_NODE_NAME, apiserver URL for the node whose state is in DIR.
node_vars() {
  KF_N="$1"
  case "$1" in
    */node) KF_NETNS=""; KF_NODE_NAME="kf-real-0" ;;
    *) KF_NETNS="kf-real-${1##*-}"; KF_NODE_NAME="kf-real-${1##*-}" ;;
  esac
}

in_node() { if [ -n "$KF_NETNS" ]; then nsenter --net="/run/netns/$KF_NETNS" "$@"; else "$@"; fi; }

node_dirs() { local d; for d in "$KF_W/node" "$KF_W"/node-[1-9]; do [ -d "$d/pids" ] && echo "$d"; done; return 0; }

render_rbac() { # -> $KF_W/node/etc/netpol-rbac.yaml
  cat >"$KF_W/node/etc/netpol-rbac.yaml" <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "kubeforge:netpol", labels: {$KF_NODE_LABEL: "true"}}
rules:
- apiGroups: [""]
  resources: [pods, namespaces, nodes, services, endpoints]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kubeforge:netpol", labels: {$KF_NODE_LABEL: "true"}}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kubeforge:netpol"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "kubeforge:netpol"}
EOF
}

chains_installed() { in_node iptables -w -S KUBE-ROUTER-FORWARD >/dev/null 2>&1; }

# clean_rules: kube-router's jumps, chains (filter table) and ipsets in the current node's namespace.
clean_rules() {
  local rule c chains
  in_node iptables-save -t filter 2>/dev/null | grep -E "^-A (INPUT|FORWARD|OUTPUT) .*-j KUBE-ROUTER-" |
    sed 's/^-A/-D/' | while read -r rule; do eval "in_node iptables -w -t filter $rule" 2>/dev/null || true; done
  chains="$(in_node iptables-save -t filter 2>/dev/null | grep -oE "^:[^ ]+" | tr -d : | grep -E "$CHAIN_RE" || true)"
  for c in $chains; do in_node iptables -w -t filter -F "$c" 2>/dev/null || true; done
  for c in $chains; do in_node iptables -w -t filter -X "$c" 2>/dev/null || true; done
  for c in $(in_node ipset list -n 2>/dev/null | grep -iE '^kube' || true); do in_node ipset destroy "$c" 2>/dev/null || true; done
}

up_all() {
  KF_BIN="$(kf_bin_dir)"
  [ -x "$KF_BIN/kube-router" ] || "$KF_REPO/e2e/build/build.sh" kube-router
  kf_cluster_facts
  local url0="$KF_APISERVER_URL" port="${KF_APISERVER_URL##*:}" d n=0
  port="${port%%/*}"
  render_rbac
  kf_kubectl apply -f "$KF_W/node/etc/netpol-rbac.yaml" >/dev/null
  for d in $(node_dirs); do
    node_vars "$d"
    # Inside a node's namespace the apiserver is at node 0's bridge address (its certificate names it).
    if [ -n "$KF_NETNS" ]; then KF_APISERVER_URL="https://$KF_NODE_IP:$port"; else KF_APISERVER_URL="$url0"; fi
    sign_client netpol "kubeforge:netpol"
    kf_start kube-router "$KF_BIN/kube-router" --kubeconfig="$KF_N/etc/netpol.kubeconfig" \
      --hostname-override="$KF_NODE_NAME" --run-firewall=true --run-router=false --run-service-proxy=false \
      --enable-cni=false --enable-ipv6=false --health-port=0 --metrics-port=0 \
      --service-cluster-ip-range="$SERVICE_CIDR" --iptables-sync-period=30s --v=1
    KF_WAIT_PROC=kube-router kf_wait 60 "kube-router's chains on $KF_NODE_NAME" chains_installed
    n=$((n + 1))
  done
  echo "netpol enforced on $n node(s)"
}

down_all() {
  local d
  for d in $(node_dirs); do
    node_vars "$d"
    kf_stop 10 kube-router
    if [ -z "$KF_NETNS" ] || [ -e "/run/netns/$KF_NETNS" ]; then clean_rules; fi
  done
  if [ -f "$KF_W/node/etc/netpol-rbac.yaml" ] && ( kf_cluster_facts ) >/dev/null 2>&1; then
    kf_cluster_facts
    kf_kubectl delete -f "$KF_W/node/etc/netpol-rbac.yaml" --ignore-not-found >/dev/null 2>&1 || true
  fi
  echo "netpol down"
}

case "$ACTION" in
  up) up_all ;;
  down) set +e; down_all ;;
  *) echo "usage: $0 <cluster-workdir> up|down" >&2; exit 2 ;;
esac
