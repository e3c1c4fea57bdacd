# Render the real node's config files (sourced by up.sh after lib.sh; every function writes one file).
#
# Role: the only place that knows the config formats of containerd (CRI plugin, v2 config), the CNI
# bridge plugin, the kubelet (KubeletConfiguration), kube-proxy (KubeProxyConfiguration) and CoreDNS
# (Corefile). up.sh calls them in order; they read the KF_* variables of lib.sh and kf_dirs.
#
# Invariants (why each setting is there is in docs/real-node.md):
#   - every address is the bridge's (KF_NODE_IP) or loopback; nothing binds the external interface;
#   - containerd and the kubelet use their own dirs under $KF_N, never /var/lib/{containerd,kubelet}
#     or /etc/cni/net.d;
#   - CoreDNS has no `forward` plugin: it answers cluster names only and sends nothing elsewhere.

render_containerd() { # -> $KF_N/etc/containerd.toml
  cat >"$KF_N/etc/containerd.toml" <<EOF
version = 2
root = "$KF_N/containerd/root"
state = "$KF_N/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$KF_CONTAINERD_SOCK"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$KF_N/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$KF_PAUSE_IMAGE"
  # root here lacks CAP_SYS_RESOURCE: without this every sandbox fails (oom_score_adj=-998 refused).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$KF_N/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$KF_N/cni/net.d"
    max_conf_num = 1
EOF
}

render_cni() { # -> $KF_N/cni/net.d/10-kubeforge.conflist
  cat >"$KF_N/cni/net.d/10-kubeforge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kubeforge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$KF_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$KF_N/cni/leases",
        "ranges": [[{"subnet": "$KF_POD_CIDR", "rangeStart": "$KF_POD_RANGE_START",
                     "rangeEnd": "$KF_POD_RANGE_END", "gateway": "$KF_NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
}

# kf_kubeconfig FILE USER CERT KEY: a kubeconfig for the apiserver at $KF_APISERVER_URL.
render_kubeconfig() {
  local file="$1" user="$2" cert="$3" key="$4"
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kubeforge
  cluster:
    server: $KF_APISERVER_URL
    certificate-authority: $KF_CA_CRT
users:
- name: $user
  user:
    client-certificate: $cert
    client-key: $key
contexts:
- name: kubeforge
  context: {cluster: kubeforge, user: $user}
current-context: kubeforge
EOF
}

render_kubelet() { # -> $KF_N/etc/kubelet.yaml
  : >"$KF_N/etc/resolv.conf" # pods inherit no host nameserver or search domain
  cat >"$KF_N/etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $KF_NODE_IP
port: $KF_KUBELET_PORT
readOnlyPort: 0
healthzPort: 0
containerRuntimeEndpoint: unix://$KF_CONTAINERD_SOCK
cgroupDriver: cgroupfs
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $KF_CA_CRT}
authorization:
  mode: Webhook
# Tainted so that pods meant for the kwok GPU nodes never land here: only pods that ask for the real node
# (realnode.REAL_NODE_TOLERATION) run on it.
registerWithTaints:
- {key: kubeforge.dev/real-node, value: "true", effect: NoSchedule}
clusterDomain: cluster.local
clusterDNS: [${KF_DNS_IP:-$KF_NODE_IP}]
$([ -z "${KF_CGROUP_ROOT:-}" ] || echo "cgroupRoot: $KF_CGROUP_ROOT")
resolvConf: $KF_N/etc/resolv.conf
podLogsDir: $KF_N/pod-logs
maxPods: 64
serializeImagePulls: false
# Test machines have full disks (a 252 GB disk with 5 GB free reads as 98% used): evict only when really out of
# space (absolute floors, not percentages of a disk's size). Image garbage collection is off (100): every image on
# this node was imported from an archive and none can be pulled back, so a collected pause image left every pod in
# ContainerCreating ("failed to pull kubeforge.local/pause:1", the first CI failure of session 4).
evictionHard: {memory.available: "100Mi", nodefs.available: "256Mi", nodefs.inodesFree: "1%", imagefs.available: "256Mi"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Fast pod status and teardown for tests.
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
fileCheckFrequency: 10s
shutdownGracePeriod: 0s
EOF
}

render_kube_proxy() { # -> $KF_N/etc/kube-proxy.yaml
  cat >"$KF_N/etc/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
hostnameOverride: $KF_NODE_NAME
bindAddress: $KF_NODE_IP
clusterCIDR: ${KF_CLUSTER_CIDR:-$KF_POD_CIDR}
healthzBindAddress: 127.0.0.1:$KF_PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$KF_PROXY_METRICS_PORT
nodePortAddresses: ["$KF_NODE_IP/32"]
clientConnection:
  kubeconfig: $KF_N/etc/kube-proxy.kubeconfig
# Leave the host's conntrack sysctls alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
  minSyncPeriod: 0s
  syncPeriod: 30s
EOF
}

render_corefile() { # -> $KF_N/etc/Corefile
  cat >"$KF_N/etc/Corefile" <<EOF
# Cluster DNS of the kubeforge real node: answers cluster names only; no forward plugin, nothing leaves the host.
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $KF_NODE_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KF_N/etc/coredns.kubeconfig kubeforge
        pods insecure
        ttl 5
    }
    # Without "disable denial", a peer's name stays NXDOMAIN in the cache for seconds after it appears.
    cache 30 {
        disable denial cluster.local
    }
}
# Every other name: a definite NXDOMAIN at once (not SERVFAIL, which resolvers report as a temporary failure).
.:53 {
    bind $KF_NODE_IP
    template ANY ANY {
        rcode NXDOMAIN
    }
}
EOF
}

render_coredns_rbac() { # -> $KF_N/etc/coredns-rbac.yaml (what CoreDNS's kubernetes plugin reads)
  cat >"$KF_N/etc/coredns-rbac.yaml" <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "kubeforge:coredns", labels: {$KF_NODE_LABEL: "true"}}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kubeforge:coredns", labels: {$KF_NODE_LABEL: "true"}}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kubeforge:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "kubeforge:coredns"}
EOF
}
