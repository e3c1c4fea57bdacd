#!/usr/bin/env bash
# Run the e2e suite on a kind cluster (machines with Docker, kind and network access; not the build
# machines). Steps: create the kind cluster -> switch kube-scheduler to the scheduler-plugins image
# (Coscheduling) -> PodGroup CRD + RBAC -> kwok controller in the cluster + our stages as Stage objects
# -> simulated GPU nodes (same manifests as the local cluster) -> pytest e2e with KUBECONFIG set.
# Env: KIND_NODE_IMAGE, KF_KIND_KEEP=1 (keep the cluster), PYTEST_ARGS.
# host-deps: external docker kind: this path is for machines that have them (README, `make e2e-kind`)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source e2e/build/versions.env
NAME=kubeforge-e2e
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:${K8S_VERSION%.*}.0}"
SCHED_IMAGE="registry.k8s.io/scheduler-plugins/kube-scheduler:${SCHEDULER_PLUGINS_VERSION}"
KWOK_RELEASE="https://github.com/kubernetes-sigs/kwok/releases/download/${KWOK_VERSION}"
PY="${PY:-.venv/bin/python}"
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: '$tool' not found (needs Docker, kind, kubectl)" >&2; exit 2; }
done
KUBECONFIG_FILE="$(mktemp -d)/kubeconfig"
export KUBECONFIG="$KUBECONFIG_FILE"
cleanup() { [[ "${KF_KIND_KEEP:-}" == 1 ]] || kind delete cluster --name "$NAME"; }
trap cleanup EXIT

kind create cluster --name "$NAME" --config e2e/kind/cluster.yaml --image "$KIND_NODE_IMAGE" --kubeconfig "$KUBECONFIG"
node="$NAME-control-plane"
docker exec "$node" sed -i "s#image: .*kube-scheduler.*#image: ${SCHED_IMAGE}#" /etc/kubernetes/manifests/kube-scheduler.yaml

crd_dir="$(mktemp -d)"
(cd e2e/build/mod/scheduler && GOFLAGS=-mod=mod go mod download -json sigs.k8s.io/scheduler-plugins >/dev/null &&
  cp "$(GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/scheduler-plugins)/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml" "$crd_dir/")
kubectl apply --server-side -f "$crd_dir/scheduling.x-k8s.io_podgroups.yaml"
kubectl apply -f e2e/kind/scheduler-rbac.yaml

kubectl apply -f "$KWOK_RELEASE/kwok.yaml"
kubectl -n kube-system rollout status deployment/kwok-controller --timeout=180s
kubectl apply -f e2e/kfcluster/stages/
PYTHONPATH=e2e "$PY" -c 'import json; from kfcluster import config, render; print(json.dumps(render.node_list([config.node_pool_from_env(__import__("os").environ)])))' \
  | kubectl apply -f -
kubectl wait --for=condition=Ready node -l type=kwok --timeout=120s
kubectl -n kube-system wait --for=condition=Ready pod -l component=kube-scheduler --timeout=180s

"$PY" -m pytest -m "cluster and not realnode and not slow" e2e ${PYTEST_ARGS:-}
