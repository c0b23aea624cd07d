#!/usr/bin/env bash
# kserve-canary on a real cluster: an empty kind cluster to a promoted and a rolled-back canary.
#
# What it does (docs/install.md#a-walkthrough-on-kind explains each step):
#   1. creates a kind cluster (kind and node image pinned in hack/walkthrough/versions.env) and
#      kind's local registry beside it (localhost:5001, the nodes pull from it);
#   2. installs cert-manager, Knative Serving with Kourier, KServe in Serverless mode and
#      kube-prometheus-stack (Prometheus, the Prometheus Operator, kube-state-metrics), at pinned
#      versions; DCGM is optional and left out (kind has no GPU);
#   3. installs kserve-canary from this checkout with the README's "Before the first release"
#      commands: pip install ., the image built and pushed to the local registry, the controller
#      installed by the digest the push printed (Helm by default, INSTALL_WITH=kustomize for the
#      Kustomize overlay with `kustomize edit set image`);
#   4. deploys the sample sklearn InferenceService, its PromotionPolicy and a load generator;
#   5. pushes a good version (a new storageUri) and waits with `kserve-canary status NAME --watch`
#      (exit 0: promoted), then a bad one that never becomes Ready (exit 4: rolled back).
#
# Where it runs: a machine with docker, kind, kubectl, helm (kustomize for INSTALL_WITH=kustomize),
# Python >= 3.11 with pip (`make setup`'s .venv comes first on PATH) and the internet (images and
# release manifests are downloaded).
# It cannot run on this project's CI machines: they have no container engine daemon and no internet.
# There, tests/deploy/test_walkthrough.py checks the pieces that can run: this script (bash -n and
# ShellCheck), its model steps against the API emulator, the manifests it applies, its pinned
# versions, and that it runs the README's install commands as written.
#
# Usage: hack/kind-walkthrough.sh [up|good|bad|down]   (default: up, then good, then bad)
# Environment: INSTALL_WITH=helm|kustomize (default helm), KEEP_CLUSTER=1 keeps the cluster at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERE="$ROOT/hack/walkthrough"
# shellcheck source=hack/walkthrough/versions.env
source "$HERE/versions.env"

CLUSTER=kserve-canary
NAMESPACE=walkthrough
MODEL=sklearn-iris
INSTALL_WITH="${INSTALL_WITH:-helm}"
# kind's local registry (kind.sigs.k8s.io/docs/user/local-registry, the recipe of
# kubernetes-sigs/kind site/static/examples/kind-with-registry.sh): a registry container published
# on localhost:5001 and on the kind network as kind-registry:5000.
REGISTRY=kind-registry
REGISTRY_PORT=5001
# The README's ghcr.io/your-org/kserve-canary: the image built from this checkout, pushed there.
REPOSITORY=localhost:$REGISTRY_PORT/kserve-canary
IMAGE=$REPOSITORY:dev
GOOD_URI=gs://kfserving-examples/models/sklearn/1.0/model-2
BAD_URI=gs://kfserving-examples/models/sklearn/1.0/does-not-exist

log() { printf '\n== %s\n' "$*"; }

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "kind-walkthrough: $tool is not installed" >&2; exit 2; }
  done
}

# The CLI from this checkout (`make setup` installs it into .venv), else from PATH.
export PATH="$ROOT/.venv/bin:$PATH"

create_cluster() {
  log "kind cluster $CLUSTER ($KIND_NODE_IMAGE)"
  if ! kind get clusters | grep -qx "$CLUSTER"; then
    kind create cluster --name "$CLUSTER" --image "$KIND_NODE_IMAGE" --config "$HERE/kind-cluster.yaml" --wait 120s
  fi
  kubectl config use-context "kind-$CLUSTER"
}

start_registry() {
  log "local registry localhost:$REGISTRY_PORT ($REGISTRY_IMAGE)"
  if [ "$(docker inspect -f '{{.State.Running}}' "$REGISTRY" 2>/dev/null || true)" != true ]; then
    docker run -d --restart=always -p "127.0.0.1:$REGISTRY_PORT:5000" --network bridge --name "$REGISTRY" "$REGISTRY_IMAGE"
  fi
}

# The nodes pull localhost:5001/... from kind-registry:5000: localhost in a node is the node. kind
# v0.27.0 node images already read /etc/containerd/certs.d (containerd config_path), so a hosts.toml
# there is enough, no containerdConfigPatches.
connect_registry() {
  local node dir="/etc/containerd/certs.d/localhost:$REGISTRY_PORT"
  for node in $(kind get nodes --name "$CLUSTER"); do
    docker exec "$node" mkdir -p "$dir"
    printf '[host."http://%s:5000"]\n' "$REGISTRY" | docker exec -i "$node" cp /dev/stdin "$dir/hosts.toml"
  done
  if [ "$(docker inspect -f '{{json .NetworkSettings.Networks.kind}}' "$REGISTRY")" = null ]; then
    docker network connect kind "$REGISTRY"
  fi
  # KEP-1755: how tools find the cluster's local registry.
  kubectl apply -f - <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: local-registry-hosting
  namespace: kube-public
data:
  localRegistryHosting.v1: |
    host: "localhost:$REGISTRY_PORT"
    help: "https://kind.sigs.k8s.io/docs/user/local-registry/"
EOF
}

install_prometheus() {
  log "kube-prometheus-stack $KUBE_PROMETHEUS_STACK_VERSION"
  helm repo add prometheus-community https://prometheus-community.github.io/helm-charts --force-update
  helm upgrade --install kube-prometheus-stack prometheus-community/kube-prometheus-stack \
    --version "$KUBE_PROMETHEUS_STACK_VERSION" -n monitoring --create-namespace \
    -f "$HERE/kube-prometheus-stack-values.yaml" --wait --timeout 10m
}

install_kserve() {
  local release=https://github.com/knative/serving/releases/download/$KNATIVE_SERVING_VERSION
  log "cert-manager $CERT_MANAGER_VERSION"
  kubectl apply -f "https://github.com/cert-manager/cert-manager/releases/download/$CERT_MANAGER_VERSION/cert-manager.yaml"
  kubectl -n cert-manager wait --for=condition=Available deployment --all --timeout=5m
  log "Knative Serving $KNATIVE_SERVING_VERSION with Kourier $KNATIVE_KOURIER_VERSION"
  kubectl apply -f "$release/serving-crds.yaml"
  kubectl apply -f "$release/serving-core.yaml"
  kubectl apply -f "https://github.com/knative/net-kourier/releases/download/$KNATIVE_KOURIER_VERSION/kourier.yaml"
  kubectl patch configmap/config-network -n knative-serving --type merge \
    -p '{"data":{"ingress-class":"kourier.ingress.networking.knative.dev"}}'
  kubectl -n knative-serving wait --for=condition=Available deployment --all --timeout=5m
  log "KServe $KSERVE_VERSION (Serverless)"
  helm upgrade --install kserve-crd oci://ghcr.io/kserve/charts/kserve-crd --version "$KSERVE_VERSION" \
    -n kserve --create-namespace --wait
  helm upgrade --install kserve oci://ghcr.io/kserve/charts/kserve --version "$KSERVE_VERSION" -n kserve \
    --set kserve.controller.deploymentMode=Serverless \
    --set kserve.controller.gateway.disableIstioVirtualHost=true --wait --timeout 10m
  kubectl apply -f "$HERE/queue-proxy-podmonitor.yaml"
}

install_kserve_canary() {
  log "kserve-canary from this checkout ($INSTALL_WITH), image $IMAGE"
  cd "$ROOT"
  # The README's "Before the first release" commands, as written there, with ghcr.io/your-org
  # standing for the local registry (tests/deploy/test_walkthrough.py compares them).
  pip install .
  docker build -t "$IMAGE" .
  docker push "$IMAGE"
  local digest
  digest="$(pushed_digest)"
  kubectl kustomize deploy/crds
  kubectl apply --server-side -k deploy/crds
  kserve-canary validate deploy/base/policies/
  kubectl kustomize deploy/overlays/cluster-wide
  helm template kserve-canary charts/kserve-canary -n kserve-canary --set prometheus.url=http://prometheus-operated.monitoring.svc:9090 --set 'watchNamespaces={ml}'
  if [ "$INSTALL_WITH" = kustomize ]; then
    install_with_kustomize "$digest"
  else
    helm install kserve-canary charts/kserve-canary -n kserve-canary --create-namespace --set prometheus.url=http://prometheus-operated.monitoring.svc:9090 --set image.repository="$REPOSITORY" --set image.digest="$digest"
  fi
  kubectl -n kserve-canary rollout status deployment/kserve-canary --timeout=5m
}

# The digest `docker push "$IMAGE"` printed: the registry's digest of $REPOSITORY (an image pushed
# to several repositories has one RepoDigest per repository).
pushed_digest() {
  local ref
  for ref in $(docker inspect --format '{{range .RepoDigests}}{{.}} {{end}}' "$IMAGE"); do
    if [ "${ref%@*}" = "$REPOSITORY" ]; then
      echo "${ref#*@}"
      return
    fi
  done
  echo "kind-walkthrough: docker inspect $IMAGE names no digest in $REPOSITORY" >&2
  exit 1
}

# The README's Kustomize path: an overlay of your own on cluster-wide, the image set by digest.
install_with_kustomize() {
  local overlay="$ROOT/.walkthrough/overlay"
  rm -rf "$overlay"
  mkdir -p "$overlay"
  printf '%s\n' "apiVersion: kustomize.config.k8s.io/v1beta1" "kind: Kustomization" "resources:" \
    "  - ../../deploy/overlays/cluster-wide" >"$overlay/kustomization.yaml"
  (cd "$overlay" && kustomize edit set image "ghcr.io/kserve-canary/kserve-canary=$REPOSITORY@$1")
  kubectl apply -k "$overlay"
}

# The sample model and its policy (tests/deploy/test_walkthrough.py runs this against the API emulator).
deploy_model() {
  log "the sample model $NAMESPACE/$MODEL and its policy"
  kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
  kserve-canary validate "$HERE/policies/"
  kubectl apply -f "$HERE/policies/$NAMESPACE/$MODEL.yaml"
  kubectl apply -f "$HERE/sklearn-iris.yaml"
  kubectl -n "$NAMESPACE" wait --for=condition=Ready "inferenceservice/$MODEL" --timeout=10m
}

start_load() {
  log "traffic for $NAMESPACE/$MODEL"
  kubectl apply -f "$HERE/load.yaml"
  kubectl -n "$NAMESPACE" rollout status deployment/load --timeout=5m
}

# A new version the GitOps way: a new storageUri, no percentage.
new_version() {
  kubectl -n "$NAMESPACE" patch "inferenceservice/$MODEL" --type merge \
    -p "{\"spec\":{\"predictor\":{\"model\":{\"storageUri\":\"$1\"}}}}"
}

# A new version, then block until its rollout ends with the expected exit code.
push_version() {
  local uri=$1 expected=$2 code=0
  log "new version $uri: expecting exit $expected from kserve-canary status --watch"
  new_version "$uri"
  kserve-canary status "$NAMESPACE/$MODEL" --watch --timeout 1800 || code=$?
  kserve-canary explain "$NAMESPACE/$MODEL" || true
  if [ "$code" != "$expected" ]; then
    echo "kind-walkthrough: kserve-canary status exited $code, expected $expected" >&2
    exit 1
  fi
}

up() {
  need docker kind kubectl helm pip
  if [ "$INSTALL_WITH" = kustomize ]; then need kustomize; fi
  start_registry
  create_cluster
  connect_registry
  install_prometheus
  install_kserve
  install_kserve_canary
  deploy_model
  start_load
}

good() { push_version "$GOOD_URI" 0; }  # promoted: 10 -> 50 -> 100
bad() { push_version "$BAD_URI" 4; }    # never Ready: rolled back at its progressDeadline

down() {
  kind delete cluster --name "$CLUSTER"
  docker rm -f "$REGISTRY"
}

main() {
  case "${1:-all}" in
    up) up ;;
    good) good ;;
    bad) bad ;;
    down) down ;;
    all)
      up
      good
      bad
      log "done: one canary promoted, one rolled back"
      if [ "${KEEP_CLUSTER:-0}" != 1 ]; then down; fi
      ;;
    *) echo "usage: $0 [up|good|bad|down]" >&2; exit 2 ;;
  esac
}

# Sourced (by the tests), it only defines the steps.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
