# Shared settings and helpers of the real test node (sourced by pre-up.sh, up.sh, down.sh, leakcheck.sh).
#
# Role: one place for the node's fixed network facts (bridge kf0 = 10.88.0.1/16, which is the node IP,
# the kubelet's and CoreDNS's address and the apiserver address pods use) and for the layout of the
# node's state under the cluster work dir:
#
#   <cluster-workdir>/node/
#     pids/<name>.pid          processes we started (containerd, kubelet, kube-proxy, coredns)
#     logs/<name>.log
#     pki/                     kubelet / kube-proxy / coredns client certs (signed by the cluster CA)
#     etc/                     containerd.toml, kubelet.yaml, kube-proxy.yaml, Corefile, kubeconfigs, resolv.conf
#     cni/net.d/ cni/leases/   CNI config and host-local IPAM leases
#     containerd/{root,state}  containerd's own dirs (never /var/lib/containerd)
#     kubelet/                 kubelet --root-dir (never /var/lib/kubelet)
#
#   /run/kubeforge-node/saved/  host sysctls we changed (kept outside the work dir), restored by down.sh
#
# Invariants: nothing of ours lives outside this dir except the bridge, the iptables rules (our own
# KUBEFORGE-NODE chain, and kube-proxy's/kubelet's KUBE-* chains), pod network namespaces under
# /var/run/netns (made and removed by containerd) and containerd-shim sockets under /run/containerd/s.
# down.sh removes all of them; leakcheck.sh verifies it.

KF_BRIDGE="${KF_BRIDGE:-kf0}"
KF_NODE_IP="${KF_NODE_IP:-10.88.0.1}"
KF_POD_CIDR="${KF_POD_CIDR:-10.88.0.0/16}"
KF_POD_RANGE_START="${KF_POD_RANGE_START:-10.88.1.1}"
KF_POD_RANGE_END="${KF_POD_RANGE_END:-10.88.255.254}"
KF_NODE_NAME="${KF_NODE_NAME:-kf-real-0}"
# More real nodes (`make cluster-up REAL_NODES=2`, issue 31): node i >= 1 runs in network namespace kf-real-<i>
# with its pods on bridge kf<i> (10.(88+i).0.1/16, its node IP), joined to the root namespace by a veth pair
# kfv<i> (10.87.<i>.1/30, root) <-> kfup (10.87.<i>.2/30, in the namespace). See extra-node.sh.
KF_REAL_NODES="${KF_REAL_NODES:-1}"
KF_MAX_REAL_NODES=4
# Pods of every real node (10.88.0.0/16 .. 10.91.0.0/16): kube-proxy's clusterCIDR when there is more than one.
KF_ALL_PODS_CIDR="10.88.0.0/14"
# CoreDNS runs once, on node 0's bridge address; every node's pods use it.
KF_DNS_IP="${KF_DNS_IP:-$KF_NODE_IP}"
KF_NETNS=""          # empty: the root network namespace (node 0)
KF_CGROUP_ROOT=""    # empty: the kubelet's default (/); node i uses /kf-real-<i>
# Every kube-proxy treats all real nodes' pods as the cluster's (also with one node: a node added later,
# e.g. by the two-node tests, then needs no change on node 0).
KF_CLUSTER_CIDR="${KF_CLUSTER_CIDR:-$KF_ALL_PODS_CIDR}"
KF_NODE_LABEL="kubeforge.dev/real-node"
KF_PAUSE_IMAGE="${KUBEFORGE_PAUSE_IMAGE:-kubeforge.local/pause:1}"
KF_BASE_IMAGE="${KUBEFORGE_BASE_IMAGE:-kubeforge.local/base:1}"
KF_GUARD_CHAIN="KUBEFORGE-NODE"
KF_INPUT_CHAIN="KUBEFORGE-NODE-IN"
KF_VETH_PREFIX="kfv"  # root ends of the veth pairs to the other nodes' namespaces (iptables wildcard kfv+)
KF_HOST_STATE="${KF_HOST_STATE:-/run/kubeforge-node}"
# up.sh and down.sh hold this lock (fd 8) so two clusters never set up or tear down the node at once.
KF_LOCK="$KF_HOST_STATE.lock"
KF_KUBELET_PORT=10250
KF_PROXY_HEALTHZ_PORT=10256
KF_PROXY_METRICS_PORT=10249
# Host paths containerd, CNI and the kubelet create on their own (outside our dirs). pre-up.sh records which
# existed before; down.sh removes the others once empty of anything but our leftovers.
KF_HOST_PATHS=(/run/containerd /var/run/netns /var/lib/cni /var/log/pods /var/log/containers /var/lib/kubelet /var/lib/containerd /etc/cni)
# Kernel settings the kubelet sets when protectKernelDefaults is false: saved by pre-up.sh, restored by down.sh.
KF_KUBELET_SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
# The processes we start, in start order (down.sh stops them in reverse).
KF_PROCS=(containerd coredns kube-proxy kubelet)

KF_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KF_CACHE="${KUBEFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeforge}"

# kf_host_deps: the project's one install step for host prerequisites (e2e/host/install.sh); idempotent and
# quick when all are present. Every script of the node calls it before its first use of a listed tool.
kf_host_deps() { "$KF_REPO/e2e/host/install.sh" >&2; }

kf_log() { printf '[real-node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
kf_die() { kf_log "ERROR: $*"; exit 1; }

# kf_dirs WORKDIR: set KF_W (cluster work dir) and KF_N (the node's dir inside it).
kf_dirs() {
  [ -n "${1:-}" ] || kf_die "usage: $0 <cluster-workdir>"
  KF_W="$(cd "$1" 2>/dev/null && pwd)" || kf_die "cluster work dir '$1' does not exist"
  KF_N="$KF_W/node"
  KF_CONTAINERD_SOCK="$KF_N/containerd/containerd.sock"
  [ "${#KF_CONTAINERD_SOCK}" -lt 100 ] || kf_die "socket path too long (${#KF_CONTAINERD_SOCK} chars): $KF_CONTAINERD_SOCK"
}

kf_bin_dir() { "$KF_REPO/e2e/build/build.sh" --print-bin-dir; }

kf_pid() { # name -> pid if that process is alive, else nothing
  local f="$KF_N/pids/$1.pid" pid
  [ -f "$f" ] || return 0
  pid="$(cat "$f")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
  return 0
}

# kf_start NAME BINARY ARGS...: start a background process in its own session, output to its log.
kf_start() {
  local name="$1"; shift
  mkdir -p "$KF_N/pids" "$KF_N/logs"
  [ -z "$(kf_pid "$name")" ] || { kf_log "$name already running (pid $(kf_pid "$name"))"; return 0; }
  if [ -n "$KF_NETNS" ]; then # only the network namespace: mounts stay shared (kubelet and containerd need that)
    setsid nsenter --net="/run/netns/$KF_NETNS" "$@" >>"$KF_N/logs/$name.log" 2>&1 </dev/null 8>&- &
  else
    setsid "$@" >>"$KF_N/logs/$name.log" 2>&1 </dev/null 8>&- &
  fi
  echo $! >"$KF_N/pids/$name.pid"
  kf_log "started $name (pid $!), log $KF_N/logs/$name.log"
}

# kf_stop TIMEOUT_S NAME...: SIGTERM the recorded PIDs together, SIGKILL what is left after the timeout.
kf_stop() {
  local timeout="$1" name pid i alive; shift
  declare -A pids=()
  for name in "$@"; do
    pid="$(kf_pid "$name")"
    [ -n "$pid" ] && { pids[$name]="$pid"; kill -TERM "$pid" 2>/dev/null || true; }
  done
  for ((i = 0; i < timeout * 10; i++)); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  for name in "${!pids[@]}"; do
    pid="${pids[$name]}"
    if kill -0 "$pid" 2>/dev/null; then kf_log "$name (pid $pid) ignored SIGTERM; SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    kf_log "stopped $name (pid $pid)"
  done
  for name in "$@"; do rm -f "$KF_N/pids/$name.pid"; done
}

# kf_shim_pids: PIDs of containerd shims that belong to OUR containerd (their -address is our socket).
kf_shim_pids() {
  local d cmd
  for d in /proc/[0-9]*; do
    cmd="$(tr '\0' ' ' 2>/dev/null <"$d/cmdline")" || continue
    case "$cmd" in
      *containerd-shim*"-address $KF_CONTAINERD_SOCK "*) echo "${d#/proc/}" ;;
    esac
  done
}

# kf_mounts_under DIR: mount points at or below DIR, deepest first.
kf_mounts_under() {
  awk -v d="$1" '{ gsub(/\\040/, " ", $5); if ($5 == d || index($5, d "/") == 1) print $5 }' /proc/self/mountinfo |
    awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2-
}

# kf_other_node: print the work dir of a real node of ANOTHER cluster that is alive on this machine (one
# real node per machine: bridge kf0, port 53 on 10.88.0.1, the iptables rules are shared), else nothing.
kf_other_node() {
  local w pid name
  w="$(cat "$KF_HOST_STATE/workdir" 2>/dev/null)" || return 0
  [ -n "$w" ] && [ "$w" != "${KF_W:-}" ] || return 0
  for name in kubelet containerd; do
    pid="$(cat "$w/node/pids/$name.pid" 2>/dev/null)" || continue
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && { echo "$w"; return 0; }
  done
  return 0
}

kf_lock() { exec 8>"$KF_LOCK"; flock 8; }

kf_ctr() { ctr --address "$KF_CONTAINERD_SOCK" --namespace k8s.io "$@"; }

# kf_wait SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.2 s until it succeeds.
# With KF_WAIT_PROC=<name> set, fail at once when that started process has exited.
kf_wait() {
  local timeout="$1" what="$2" i; shift 2
  for ((i = 0; i < timeout * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    if [ -n "${KF_WAIT_PROC:-}" ] && [ -z "$(kf_pid "$KF_WAIT_PROC")" ]; then
      kf_die "$KF_WAIT_PROC exited while waiting for $what; log: $KF_N/logs/$KF_WAIT_PROC.log"
    fi
    sleep 0.2
  done
  kf_die "timed out after ${timeout}s waiting for $what"
}

# Fill KF_CA_CRT, KF_CA_KEY, KF_ADMIN_KUBECONFIG, KF_APISERVER_URL from the env or the work dir.
kf_cluster_facts() {
  KF_CA_KEY="${KF_CA_KEY:-$(find "$KF_W" -maxdepth 5 -path '*/pki/ca.key' -not -path "$KF_N/*" | head -n1)}"
  KF_CA_CRT="${KF_CA_CRT:-${KF_CA_KEY%.key}.crt}"
  [ -f "$KF_CA_KEY" ] && [ -f "$KF_CA_CRT" ] || kf_die "cluster CA not found under $KF_W (set KF_CA_CRT/KF_CA_KEY)"
  KF_ADMIN_KUBECONFIG="${KF_ADMIN_KUBECONFIG:-$(find "$KF_W" -maxdepth 4 -name kubeconfig.yaml -not -path "$KF_N/*" | head -n1)}"
  [ -f "$KF_ADMIN_KUBECONFIG" ] || kf_die "admin kubeconfig not found under $KF_W (set KF_ADMIN_KUBECONFIG)"
  KF_APISERVER_URL="${KF_APISERVER_URL:-$(kf_kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')}"
  [ -n "$KF_APISERVER_URL" ] || kf_die "could not read the apiserver URL from $KF_ADMIN_KUBECONFIG"
}

kf_kubectl() { "${KF_BIN:-$(kf_bin_dir)}/kubectl" --kubeconfig "$KF_ADMIN_KUBECONFIG" "$@"; }
