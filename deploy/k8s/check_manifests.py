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

# The group: SPOKE_PEERS discovers the ready pods from the headless Service's DNS, each
# pod names itself by its IP, and a disruption budget keeps all but one up.
replicas = spoke["spec"].get("replicas", 1)
spoke_env = {e["name"]: e for e in spoke["spec"]["template"]["spec"]["containers"][0].get("env", [])}
service = spoke["spec"]["serviceName"]
check(replicas >= 3, f"spoke group of at least 3 (has {replicas})")
peers = spoke_env.get("SPOKE_PEERS", {}).get("value")
check(peers == f"dns+https://{service}:7071", f"SPOKE_PEERS discovers the headless Service {service}: {peers}")
check(spoke_env.get("SPOKE_PEER_SELF", {}).get("value") == "https://$(POD_IP):7071", "SPOKE_PEER_SELF from the pod's IP")
check(spoke_env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP", "POD_IP from the downward API")
# A secured group is a group: members asked for tokens must be able to prove who they
# are to each other (their spoke-client certificate against the CA), or every peer read
# is refused and each member fetches every shard from the hub.
if spoke_env.get("SPOKE_TOKEN_FILE"):
    check(spoke_env.get("SPOKE_CLIENT_CA", {}).get("value") == "/tls/ca.pem",
          "spokes with tokens verify their peers' spoke-client certificates (SPOKE_CLIENT_CA)")
    check(spoke_env.get("SPOKE_HUB_CERT", {}).get("value", "").endswith("spoke-client.pem"),
          "spokes present their spoke-client certificate (to hubs and peers)")
budgets = [b for b in by_kind.get("PodDisruptionBudget", []) if b["spec"]["selector"]["matchLabels"] == spoke["spec"]["selector"]["matchLabels"]]
check(len(budgets) == 1 and budgets[0]["spec"].get("maxUnavailable") == 1, "a disruption budget of one spoke at a time")
hub = next(w for w in workloads if w["metadata"]["name"] == "shardcache-hub")
hub_env = {e["name"]: e.get("value") for e in hub["spec"]["template"]["spec"]["containers"][0].get("env", [])}
check(bool(hub_env.get("HUB_METRICS_LISTEN")), "hub serves metrics")
check(hub["spec"]["template"]["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true", "hub metrics scrape annotation")

if problems:
    print("manifest problems:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"{len(docs)} resources: schema-valid and checked")
