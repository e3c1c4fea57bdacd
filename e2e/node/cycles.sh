#!/usr/bin/env bash
# Run N `make cluster-up REAL_NODE=1 && make cluster-down` cycles; after each, run the leak check.
#
# Usage: e2e/node/cycles.sh [N]        (default 5; run from anywhere, uses the repo's Makefile)
#   KF_CYCLES_PODS=1: between up and down, run the smoke test and leave pods running on the node (a busybox
#   sleeper, a venv-Python sleeper with the hostPath mounts, a crash-looping container), so down.sh has to
#   tear real pods down (CNI leases, netns, mounts, shims).
# Prints one line per cycle (up/down seconds, node RSS, leak check verdict) and a summary; exits 1 if any
# cycle failed or leaked. The sysctls pre-up.sh changes are checked against their values before cycle 1.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib.sh"
kf_host_deps
N="${1:-5}"
# A cluster of its own, so a developer's default cluster is never stopped by this script. The real node
# itself is one per machine (bridge kf0): do not run this while another cluster has a real node.
export KF_CLUSTER_NAME="${KF_CLUSTER_NAME:-kf-cycles}"
LOGDIR="${KF_CYCLES_LOG:-/tmp/kubeforge-cycles}"
mkdir -p "$LOGDIR"
expect=(--expect-sysctl "net.ipv4.ip_forward=$(cat /proc/sys/net/ipv4/ip_forward)")
[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] &&
  expect+=(--expect-sysctl "net.bridge.bridge-nf-call-iptables=$(cat /proc/sys/net/bridge/bridge-nf-call-iptables)")
failed=0

start_pods() { # cycle: smoke test, then pods left running for down.sh
  local kubeconfig="/tmp/kubeforge-clusters/$KF_CLUSTER_NAME/kubeconfig" kubectl
  kubectl="$(kf_bin_dir)/kubectl --kubeconfig $kubeconfig"
  ( cd "$KF_REPO" && .venv/bin/python -m pytest -q -p no:cacheprovider e2e/test_realnode_smoke.py )
  "$KF_REPO/.venv/bin/python" - "$KF_REPO" <<'PY' | $kubectl apply -f -
import json, sys
sys.path.insert(0, sys.argv[1] + "/e2e/node")
import realnode
parts = realnode.venv_python_parts()
def pod(name, command, python=False, restart="Always"):
    c = {"name": "main", "image": realnode.BASE_IMAGE, "imagePullPolicy": "Never", "command": command}
    spec = {"restartPolicy": restart, "containers": [c]}
    if python:
        c["volumeMounts"], c["env"], spec["volumes"] = parts.volume_mounts, parts.env, parts.volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": realnode.on_real_node(spec)}
items = [pod("sleeper", ["sleep", "3600"]),
         pod("py-sleeper", ["python", "-c", "import time, torch; print(torch.__version__, flush=True); time.sleep(3600)"], python=True),
         pod("crasher", ["sh", "-c", "sleep 1; exit 3"])]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
  $kubectl wait --for=condition=Ready pod/sleeper pod/py-sleeper --timeout=120s
  $kubectl get pods -o wide
  iptables -S KUBEFORGE-NODE-IN
}

for ((i = 1; i <= N; i++)); do
  t0=$SECONDS
  if ! make -C "$KF_REPO" cluster-up REAL_NODE=1 >"$LOGDIR/up-$i.log" 2>&1; then
    echo "cycle $i: cluster-up FAILED (log $LOGDIR/up-$i.log)"; tail -n 20 "$LOGDIR/up-$i.log"; failed=1
  fi
  t_up=$((SECONDS - t0))
  node_line="$(grep -E "real node .* Ready in|node processes' RSS" "$LOGDIR/up-$i.log" | tr '\n' ' ')"
  if [ "${KF_CYCLES_PODS:-0}" = 1 ] && [ "$failed" -eq 0 ]; then
    start_pods "$i" >"$LOGDIR/pods-$i.log" 2>&1 || { echo "cycle $i: workload FAILED (log $LOGDIR/pods-$i.log)"; failed=1; }
  fi
  t1=$SECONDS
  make -C "$KF_REPO" cluster-down >"$LOGDIR/down-$i.log" 2>&1 || { echo "cycle $i: cluster-down FAILED (log $LOGDIR/down-$i.log)"; failed=1; }
  t_down=$((SECONDS - t1))
  if verdict="$("$HERE/leakcheck.sh" "${expect[@]}" 2>&1)"; then :; else failed=1; fi
  echo "cycle $i: up ${t_up}s, down ${t_down}s; ${node_line}; $(echo "$verdict" | head -n 20)"
done
[ "$failed" -eq 0 ] && echo "cycles: $N/$N clean" || echo "cycles: FAILURES (see above)"
exit "$failed"
