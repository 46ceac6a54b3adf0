"""What a reviewer would check in the rendered manifests, beyond the API schema."""

import sys

import yaml

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
by_kind = {}
for doc in docs:
    by_kind.setdefault(doc["kind"], []).append(doc)
problems = []


def check(ok, what):
    if not ok:
        problems.append(what)


workloads = by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])
check({w["metadata"]["name"] for w in workloads} == {"shardcache-hub", "shardcache-spoke"}, "hub and spoke workloads")
for w in workloads:
    name = w["metadata"]["name"]
    pod = w["spec"]["template"]["spec"]
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, f"{name}: runAsNonRoot")
    for c in pod["containers"]:
        for probe in ("readinessProbe", "livenessProbe"):
            command = c.get(probe, {}).get("exec", {}).get("command", [])
            check(command[:1] == ["shardcache"] and command[-1] == "health", f"{name}: {probe} runs `shardcache health`")
        check("cpu" in c.get("resources", {}).get("requests", {}), f"{name}: cpu request")
        check("memory" in c.get("resources", {}).get("limits", {}), f"{name}: memory limit")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        check(any(k.endswith("_TLS_CERT") for k in env), f"{name}: serves TLS")
    for v in pod.get("volumes", []):
        if "secret" in v:
            mode = v["secret"].get("defaultMode", 0o644)
            check(mode & 0o004 == 0, f"{name}: secret volume {v['name']} is world-readable ({mode:o}); servers refuse such keys")

spoke = next(w for w in workloads if w["metadata"]["name"] == "shardcache-spoke")
check(spoke["kind"] == "StatefulSet", "spoke is a StatefulSet")
claims = [t["metadata"]["name"] for t in spoke["spec"].get("volumeClaimTemplates", [])]
check("cache" in claims, "spoke cache on a volumeClaimTemplate")
annotations = spoke["spec"]["template"]["metadata"].get("annotations", {})
check(annotations.get("prometheus.io/scrape") == "true", "spoke metrics scrape annotation")
services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
check(services.get(spoke["spec"]["serviceName"], {}).get("spec", {}).get("clusterIP") == "None", "spoke headless service")
check("shardcache-hub" in services, "hub service")

if problems:
    print("manifest problems:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"{len(docs)} resources: schema-valid and checked")
