#!/usr/bin/env bash
# Offline checks of the Kubernetes manifests (run by `make test`): kustomize renders them,
# kubernetes-validate checks every resource against the API schema (strict: no unknown
# fields), and check_manifests.py checks what the schema cannot: probes, resources, a
# non-root user, secrets never world-readable, the spoke's cache on a claim, metrics
# annotations. Then the Helm chart beside them, checked the same way and held to these
# manifests' flags (deploy/helm/validate.sh).
set -euo pipefail
cd "$(dirname "$0")"
VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"
KUBERNETES_VERSION=1.32.0
if ! command -v kubectl >/dev/null 2>&1; then
  echo "installing kubectl (Debian's kubernetes-client) for kustomize" >&2
  if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo -n); fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null
fi
rendered="$(mktemp)"
trap 'rm -f "$rendered"' EXIT
kubectl kustomize . > "$rendered"
"$VENV/bin/kubernetes-validate" --strict --quiet -k "$KUBERNETES_VERSION" "$rendered"
echo -n "kustomize: "
"$VENV/bin/python" check_manifests.py "$rendered"
KUBERNETES_VERSION="$KUBERNETES_VERSION" SHARDCACHE_VENV="$VENV" bash ../helm/validate.sh "$rendered"
# Monitoring: the recording rules and alerts parse (promtool, from Debian's prometheus,
# installed by scripts/ensure-test-deps.sh), the alerts pass their unit tests, and every
# query of the Grafana dashboard is a series they record.
promtool check rules ../prometheus/rules.yml >/dev/null
# The alerts fire as their unit tests say (a job waiting on data, with its cause).
(cd ../prometheus && promtool test rules rules_test.yml >/dev/null)
"$VENV/bin/python" - ../prometheus/rules.yml ../grafana/shardcache.json <<'PY'
import json, sys, yaml
recorded = {r["record"] for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"] if "record" in r}
# A panel of a job's row selects its job: the series recorded, with a label selector.
queries = [t["expr"] for p in json.load(open(sys.argv[2]))["panels"] for t in p.get("targets", [])]
unknown = [q for q in queries if q.split("{")[0] not in recorded]
if unknown or not queries:
    sys.exit(f"dashboard queries that no rule records: {unknown}")
print(f"{len(recorded)} recording rules; the dashboard's {len(queries)} panels use them")
PY
