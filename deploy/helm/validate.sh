#!/usr/bin/env bash
# Offline checks of the Helm chart (run by deploy/k8s/validate.sh, so by `make test`):
# `helm lint --strict` and `helm template` with the chart's values and the ci/ sets
# (secured group; cert-manager, ServiceMonitor, hostPath), each render validated as the
# kustomize manifests are (kubernetes-validate --strict on Kubernetes' own kinds,
# check_manifests.py on all), every HUB_*/SPOKE_* variable a real flag, and the secured
# group's hub and spokes taking exactly deploy/k8s's flags.
#   deploy/helm/validate.sh KUSTOMIZE_RENDERED   (KUBERNETES_VERSION, SHARDCACHE_VENV)
set -euo pipefail
cd "$(dirname "$0")"
kustomize_rendered="$(realpath "$1")"
VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"
KUBERNETES_VERSION="${KUBERNETES_VERSION:-1.32.0}"
HELM_VERSION=v3.22.0
BIN="$HOME/.cache/shardcache/bin"
HELM="$BIN/helm"
# The version go install built (helm's own `version` says only v3.22 without ldflags).
installed="$(go version -m "$HELM" 2>/dev/null | awk '$1 == "mod" && $2 == "helm.sh/helm/v3" {print $3}' || true)"
if [ "$installed" != "$HELM_VERSION" ]; then
  echo "installing helm $HELM_VERSION with go install (the Go module proxy; 2 to 3 minutes on 2 cores)" >&2
  GOBIN="$BIN" GOFLAGS=-buildvcs=false go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# No user's repositories, plugins or registry logins: the chart has no dependencies.
export HELM_CACHE_HOME="$work/helm" HELM_CONFIG_HOME="$work/helm" HELM_DATA_HOME="$work/helm"
chart=shardcache
helm() { "$HELM" "$@" --kube-version "$KUBERNETES_VERSION"; }

# The images' tag is the workspace's version (deploy/images.sh), so appVersion is too;
# the flags' agreement below holds deploy/k8s's tag to it.
cargo_version="$(sed -n 's/^version = "\(.*\)"/\1/p' ../../Cargo.toml | head -1)"
app_version="$(sed -n 's/^appVersion: "\(.*\)"/\1/p' "$chart/Chart.yaml")"
[ "$cargo_version" = "$app_version" ] || { echo "Chart.yaml appVersion $app_version, Cargo.toml $cargo_version" >&2; exit 1; }

renders=()
for values in "" ci/secure-group-values.yaml ci/cert-manager-hostpath-values.yaml; do
  name="$(basename "${values:-default}" .yaml)"
  set -- ${values:+-f "$chart/$values"}
  helm lint --strict --quiet "$chart" "$@" >/dev/null || { helm lint --strict "$chart" "$@"; exit 1; }
  helm template shardcache "$chart" --namespace shardcache "$@" > "$work/$name.yaml"
  "$VENV/bin/python" check_chart.py builtins "$work/$name.yaml" "$work/$name.builtin.yaml"
  # Strict: an unknown field fails; a kind it has no schema for only warns, so fail on that.
  validated="$("$VENV/bin/kubernetes-validate" --strict --quiet -k "$KUBERNETES_VERSION" "$work/$name.builtin.yaml" 2>&1)" \
    && [ -z "$validated" ] || { echo "$validated"; exit 1; }
  # The chart's defaults are the simple deployment, without TLS.
  plain=(); [ -n "$values" ] || plain=(--allow-plaintext)
  echo -n "chart, ${values:-values.yaml}: "
  "$VENV/bin/python" ../k8s/check_manifests.py "$work/$name.yaml" "${plain[@]}"
  renders+=("$work/$name.yaml")
done
"$VENV/bin/python" check_chart.py flags ../../README.md "$kustomize_rendered" "${renders[@]}"
"$VENV/bin/python" check_chart.py agree "$kustomize_rendered" "$work/secure-group-values.yaml"

# What the chart refuses to render.
refuses() {
  local why="$1"; shift
  if helm template shardcache "$chart" "$@" >/dev/null 2>"$work/err"; then
    echo "the chart rendered $* (expected: $why)" >&2; exit 1
  fi
  grep -q "$why" "$work/err" || { cat "$work/err" >&2; exit 1; }
}
refuses "needs tls.enabled" --set tokens.secretName=shardcache-tokens
refuses "write it in Mi, Gi or Ti" --set spoke.cache.size=2T
refuses "not both" --set hub.data.existingClaim=datasets
echo "chart: lint, templates and refusals checked (helm $HELM_VERSION)"
