#!/usr/bin/env bash
# Run N `make cluster-up REAL_NODE=1 && make cluster-down` cycles; after each, run the leak check.
#
# Usage: e2e/node/cycles.sh [N]        (default 5; run from anywhere, uses the repo's Makefile)
# Prints one line per cycle (up/down seconds, node RSS, leak check verdict) and a summary; exits 1 if any
# cycle failed or leaked. The sysctls pre-up.sh changes are checked against their values before cycle 1.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib.sh"
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
for ((i = 1; i <= N; i++)); do
  t0=$SECONDS
  if ! make -C "$KF_REPO" cluster-up REAL_NODE=1 >"$LOGDIR/up-$i.log" 2>&1; then
    echo "cycle $i: cluster-up FAILED (log $LOGDIR/up-$i.log)"; tail -n 20 "$LOGDIR/up-$i.log"; failed=1
  fi
  t_up=$((SECONDS - t0))
  node_line="$(grep -E "real node .* Ready in|node processes' RSS" "$LOGDIR/up-$i.log" | tr '\n' ' ')"
  t1=$SECONDS
  make -C "$KF_REPO" cluster-down >"$LOGDIR/down-$i.log" 2>&1 || { echo "cycle $i: cluster-down FAILED (log $LOGDIR/down-$i.log)"; failed=1; }
  t_down=$((SECONDS - t1))
  if verdict="$("$HERE/leakcheck.sh" "${expect[@]}" 2>&1)"; then :; else failed=1; fi
  echo "cycle $i: up ${t_up}s, down ${t_down}s; ${node_line}; $(echo "$verdict" | head -n 20)"
done
[ "$failed" -eq 0 ] && echo "cycles: $N/$N clean" || echo "cycles: FAILURES (see above)"
exit "$failed"
