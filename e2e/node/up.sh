#!/usr/bin/env bash
# Start the real test node (containerd + runc + CNI bridge, CoreDNS, kube-proxy, kubelet) beside the
# kwok nodes of a running test cluster. Called by `make cluster-up REAL_NODE=1` once the control plane
# is ready; safe to run by hand on a running cluster.
#
# Usage: e2e/node/up.sh <cluster-workdir>
#   Environment (all optional; discovered from the kwokctl layout under the work dir otherwise):
#     KF_CA_CRT, KF_CA_KEY        cluster CA (signs the node's client certs)
#     KF_ADMIN_KUBECONFIG         an admin kubeconfig of the cluster
#     KF_APISERVER_URL            apiserver URL the node's components use (default: the kubeconfig's)
#     KF_REAL_NODE_WAIT_S         when another cluster's real node runs, wait this long for it (default 0: refuse)
#
# Neighbours: pre-up.sh (bridge, sysctls, guard chain; must run before the apiserver binds 10.88.0.1),
# configs.sh (config files), down.sh (the exact reverse), images/build.sh (pause + base images),
# e2e/build/build.sh (kubelet, kube-proxy, coredns, kubectl binaries).
# Prints "real node <name> Ready in <s> s" last. Exits non-zero, with the failing log's tail, otherwise.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib.sh"
source "$HERE/configs.sh"
T0=$SECONDS
step() { kf_log "[$((SECONDS - T0)) s] $*"; }

on_error() {
  local name
  kf_log "up.sh failed; last lines of the node's logs:"
  for name in "${KF_PROCS[@]}"; do
    [ -f "$KF_N/logs/$name.log" ] && { echo "--- $name" >&2; tail -n 15 "$KF_N/logs/$name.log" >&2; }
  done
  kf_log "run e2e/node/down.sh $KF_W to clean up"
}

ensure_binaries() {
  KF_BIN="$(kf_bin_dir)"
  local b
  for b in kubelet kube-proxy coredns kubectl; do
    [ -x "$KF_BIN/$b" ] && continue
    step "building node binaries (kubelet kube-proxy coredns) with e2e/build/build.sh"
    "$KF_REPO/e2e/build/build.sh" node kubectl
    break
  done
}

# sign_client NAME CN [O]: a P-256 key and a 2-day client certificate signed by the cluster CA.
sign_client() {
  local name="$1" cn="$2" org="${3:-}" subj
  subj="/CN=$cn"; [ -n "$org" ] && subj="/O=$org$subj"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$KF_N/pki/$name.key" 2>/dev/null
  openssl req -new -key "$KF_N/pki/$name.key" -subj "$subj" -out "$KF_N/pki/$name.csr"
  openssl x509 -req -in "$KF_N/pki/$name.csr" -CA "$KF_CA_CRT" -CAkey "$KF_CA_KEY" \
    -set_serial "0x$(openssl rand -hex 16)" -days 2 -out "$KF_N/pki/$name.crt" \
    -extfile <(printf 'keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n') 2>/dev/null
  render_kubeconfig "$KF_N/etc/$name.kubeconfig" "$cn" "$KF_N/pki/$name.crt" "$KF_N/pki/$name.key"
}

# The apiserver listens on all addresses so pods reach it at the bridge address; drop its port elsewhere.
guard_apiserver_port() {
  local port="${KF_APISERVER_URL##*:}"; port="${port%%/*}"
  case "$port" in ''|*[!0-9]*) kf_log "warning: no port in $KF_APISERVER_URL; apiserver port not guarded"; return 0 ;; esac
  iptables -w -C "$KF_INPUT_CHAIN" -p tcp --dport "$port" -j DROP 2>/dev/null ||
    iptables -w -A "$KF_INPUT_CHAIN" -p tcp --dport "$port" -j DROP
}

start_containerd() {
  render_containerd
  render_cni
  kf_start containerd containerd --config "$KF_N/etc/containerd.toml"
  KF_WAIT_PROC=containerd kf_wait 30 "containerd ($KF_CONTAINERD_SOCK)" kf_ctr version
  local ref tar
  while read -r ref tar; do
    kf_ctr images import "$tar" >/dev/null
    local have  # not `ctr ... | grep -q`: with pipefail, grep's early exit fails the pipeline (SIGPIPE)
    have="$(kf_ctr images ls -q)"
    grep -qx "$ref" <<<"$have" || kf_die "image $ref missing after import of $tar"
  done < <("$KF_REPO/images/build.sh")
  step "containerd ready, images imported: $KF_PAUSE_IMAGE $KF_BASE_IMAGE"
}

start_coredns() {
  render_corefile
  render_coredns_rbac
  kf_kubectl apply -f "$KF_N/etc/coredns-rbac.yaml" >/dev/null
  kf_start coredns "$KF_BIN/coredns" -conf "$KF_N/etc/Corefile"
  KF_WAIT_PROC=coredns kf_wait 30 "CoreDNS on $KF_NODE_IP:53" sh -c "ss -Hlnu 'src $KF_NODE_IP' | grep -q ':53 '"
}

start_kube_proxy() {
  render_kube_proxy
  kf_start kube-proxy "$KF_BIN/kube-proxy" --config "$KF_N/etc/kube-proxy.yaml" --v=1
}

start_kubelet() {
  render_kubelet
  kf_start kubelet "$KF_BIN/kubelet" --config "$KF_N/etc/kubelet.yaml" \
    --kubeconfig "$KF_N/etc/kubelet.kubeconfig" --root-dir "$KF_N/kubelet" --cert-dir "$KF_N/kubelet/pki" \
    --hostname-override "$KF_NODE_NAME" --node-ip "$KF_NODE_IP" --node-labels "$KF_NODE_LABEL=true" --v=1
  KF_WAIT_PROC=kubelet kf_wait 90 "node $KF_NODE_NAME Ready" node_ready
}

node_ready() {
  [ "$(kf_kubectl get node "$KF_NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# The `kubernetes` Service must lead to an address pods can reach (the bridge), not loopback.
check_apiserver_endpoint() {
  local eps
  eps="$(kf_kubectl get endpointslices -n default -l kubernetes.io/service-name=kubernetes \
    -o jsonpath='{.items[*].endpoints[*].addresses[*]}')"
  case " $eps " in
    *" $KF_NODE_IP "*) ;;
    *) kf_log "WARNING: the kubernetes Service points at '$eps', not $KF_NODE_IP: pods cannot reach the API" \
      "(start the apiserver with bind address $KF_NODE_IP; see docs/real-node.md)" ;;
  esac
}

main() {
  kf_dirs "${1:-}"
  trap 'rc=$?; [ "$rc" -eq 0 ] || on_error' EXIT
  case "$KF_REAL_NODES" in [1-9]) ;; *) kf_die "KF_REAL_NODES must be 1..$KF_MAX_REAL_NODES, got '$KF_REAL_NODES'" ;; esac
  [ "$KF_REAL_NODES" -le "$KF_MAX_REAL_NODES" ] || kf_die "KF_REAL_NODES: at most $KF_MAX_REAL_NODES real nodes"
  [ "$(id -u)" = 0 ] || kf_die "the real node needs root (network namespaces, mounts, iptables)"
  local other waited=0
  while :; do
    kf_lock # held until exit: a concurrent up.sh then finds this node alive and refuses (or waits)
    other="$(kf_other_node)"
    [ -n "$other" ] || break
    [ "$waited" -lt "${KF_REAL_NODE_WAIT_S:-0}" ] || kf_die "a real node of the cluster in $other is running;" \
      "one real node per machine (stop it first: e2e/node/down.sh $other, or make cluster-down with that" \
      "cluster's KF_CLUSTER_NAME; or set KF_REAL_NODE_WAIT_S to wait for it)"
    [ "$waited" -gt 0 ] || kf_log "waiting up to ${KF_REAL_NODE_WAIT_S}s for the real node of $other to stop"
    exec 8>&- # let its down.sh take the lock
    sleep 5; waited=$((waited + 5))
  done
  kf_host_deps # before anything below uses a host tool (pre-up.sh: ip, iptables, modprobe)
  step "host prerequisites present"
  mkdir -p "$KF_HOST_STATE"; echo "$KF_W" >"$KF_HOST_STATE/workdir"
  "$HERE/pre-up.sh" "$KF_W"
  ensure_binaries
  kf_cluster_facts
  step "cluster: $KF_APISERVER_URL (CA $KF_CA_CRT)"
  guard_apiserver_port
  mkdir -p "$KF_N"/{etc,pki,logs,pids,cni/net.d,cni/leases,containerd,kubelet}
  chmod 700 "$KF_N/pki"
  sign_client kubelet "system:node:$KF_NODE_NAME" system:nodes
  sign_client kube-proxy system:kube-proxy
  sign_client coredns "kubeforge:coredns"
  start_containerd
  start_coredns
  step "CoreDNS serving $KF_NODE_IP:53"
  start_kube_proxy
  start_kubelet
  check_apiserver_endpoint
  local rss=0 name pid
  for name in "${KF_PROCS[@]}"; do
    pid="$(kf_pid "$name")"; [ -n "$pid" ] && rss=$((rss + $(awk '/VmRSS/ {print $2}' "/proc/$pid/status")))
  done
  kf_log "node processes' RSS: $((rss / 1024)) MiB (containerd, coredns, kube-proxy, kubelet)"
  echo "real node $KF_NODE_NAME Ready in $((SECONDS - T0)) s"
  local i
  for ((i = 1; i < KF_REAL_NODES; i++)); do
    bash "$HERE/extra-node.sh" "$KF_W" "$i" up
  done
}

# Run main unless sourced (tests source this file to run single steps).
[ "${BASH_SOURCE[0]}" != "$0" ] || main "$@"
