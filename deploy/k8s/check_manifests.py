"""What a reviewer would check in the rendered manifests, beyond the API schema.

check_manifests.py RENDERED [--allow-plaintext]: the kustomize manifests and the Helm
chart's renders (deploy/helm/validate.sh). Without --allow-plaintext every server serves
TLS; with it (the chart's defaults) TLS may be off, but every URL, probe and scrape must
then agree on that. A server requiring client certificates (--client-ca without
--token-file) must get one from its probes and its ServiceMonitor.
"""

import re
import sys

import yaml

args = [a for a in sys.argv[1:] if not a.startswith("--")]
allow_plaintext = "--allow-plaintext" in sys.argv
docs = [d for d in yaml.safe_load_all(open(args[0])) if d]
by_kind = {}
for doc in docs:
    by_kind.setdefault(doc["kind"], []).append(doc)
problems = []


def check(ok, what):
    if not ok:
        problems.append(what)


BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def quantity(text):
    """Bytes of a Kubernetes quantity (2000Gi) or a spoke size (1800GiB, 1.5TiB)."""
    m = re.fullmatch(r"([0-9.]+)\s*(Ki|Mi|Gi|Ti)B?", str(text))
    return float(m.group(1)) * BINARY[m.group(2)] if m else None


def files_provided(volume):
    """The file names a secret or projected volume provides; None: all of a Secret's keys."""
    sources = [volume["secret"]] if "secret" in volume else [s["secret"] for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
    if any("items" not in s for s in sources):
        return None
    return {item["path"] for s in sources for item in s["items"]}


workloads = by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])
check({w["metadata"]["name"] for w in workloads} == {"shardcache-hub", "shardcache-spoke"}, "hub and spoke workloads")
tls = {}  # workload name -> serves TLS
client_cert = {}  # workload name -> requires a client certificate of every client
for w in workloads:
    name = w["metadata"]["name"]
    pod = w["spec"]["template"]["spec"]
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, f"{name}: runAsNonRoot")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for c in pod["containers"]:
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        tls[name] = any(k.endswith("_TLS_CERT") for k in env)
        check(tls[name] or allow_plaintext, f"{name}: serves TLS")
        scheme = "https" if tls[name] else "http"
        for probe in ("readinessProbe", "livenessProbe"):
            command = c.get(probe, {}).get("exec", {}).get("command", [])
            check(command[:1] == ["shardcache"] and command[-1] == "health", f"{name}: {probe} runs `shardcache health`")
            endpoint = command[command.index("--endpoint") + 1] if "--endpoint" in command else ""
            check(endpoint.startswith(f"{scheme}://localhost:"), f"{name}: {probe} asks {endpoint!r}, the server speaks {scheme}")
            check(("--ca" in command) == tls[name], f"{name}: {probe} passes --ca exactly when the server serves TLS")
        # A server with --client-ca and no --token-file wants a client certificate in every
        # TLS handshake (client certificates are optional only with tokens): a probe
        # without one never passes, the pod is never Ready and liveness restarts it.
        for ca in (k for k in env if k.endswith("_CLIENT_CA") and env[k]):
            token_file = ca[: -len("CLIENT_CA")] + "TOKEN_FILE"
            if tls[name] and not env.get(token_file):
                client_cert[name] = True
                for probe in ("readinessProbe", "livenessProbe"):
                    command = c.get(probe, {}).get("exec", {}).get("command", [])
                    check("--cert" in command and "--key" in command,
                          f"{name}: {probe} presents no client certificate (--cert/--key), but {ca} without {token_file} requires one")
        for probe in ("readinessProbe", "livenessProbe"):
            command = c.get(probe, {}).get("exec", {}).get("command", [])
            check(("--cert" in command) == ("--key" in command), f"{name}: {probe} passes --cert and --key together")
        check("cpu" in c.get("resources", {}).get("requests", {}), f"{name}: cpu request")
        check("memory" in c.get("resources", {}).get("limits", {}), f"{name}: memory limit")
        # Every file a flag names is in a mounted volume (a Secret's key mounted under
        # another name, or not at all, stops the server at start).
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        probe_files = [p for probe in ("readinessProbe", "livenessProbe") for p in c.get(probe, {}).get("exec", {}).get("command", []) if p.startswith("/")]
        for path in [v for k, v in env.items() if v and k.endswith(("_CERT", "_KEY", "_CA", "_FILE"))] + probe_files:
            mount = next((m for m in mounts if path.startswith(m.rstrip("/") + "/")), None)
            check(mount is not None, f"{name}: {path} is on no mounted volume")
            if mount and mounts[mount] in volumes:
                provided = files_provided(volumes[mounts[mount]])
                check(provided is None or path[len(mount) + 1 :] in provided, f"{name}: {path} is not among the files of volume {mounts[mount]}: {provided}")
    for v in pod.get("volumes", []):
        modes = []
        if "secret" in v:
            modes.append(v["secret"].get("defaultMode", 0o644))
        if "projected" in v:
            modes.append(v["projected"].get("defaultMode", 0o644))
            modes += [item["mode"] for s in v["projected"]["sources"] for item in next(iter(s.values())).get("items", []) if "mode" in item]
        for mode in modes:
            check(mode & 0o004 == 0, f"{name}: secret volume {v['name']} is world-readable ({mode:o}); servers refuse such keys")

spoke = next(w for w in workloads if w["metadata"]["name"] == "shardcache-spoke")
check(spoke["kind"] == "StatefulSet", "spoke is a StatefulSet")
claims = {t["metadata"]["name"]: t for t in spoke["spec"].get("volumeClaimTemplates", [])}
host_paths = {v["name"] for v in spoke["spec"]["template"]["spec"].get("volumes", []) if "hostPath" in v}
check("cache" in claims or "cache" in host_paths, "spoke cache on a volumeClaimTemplate or a hostPath (local NVMe)")
services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
check(services.get(spoke["spec"]["serviceName"], {}).get("spec", {}).get("clusterIP") == "None", "spoke headless service")
check("shardcache-hub" in services, "hub service")

# The group: SPOKE_PEERS discovers the ready pods from the headless Service's DNS, each
# pod names itself by its IP, and a disruption budget keeps all but one up.
replicas = spoke["spec"].get("replicas", 1)
spoke_env = {e["name"]: e for e in spoke["spec"]["template"]["spec"]["containers"][0].get("env", [])}
value = lambda name: spoke_env.get(name, {}).get("value")  # noqa: E731
service = spoke["spec"]["serviceName"]
scheme = "https" if tls["shardcache-spoke"] else "http"
check(replicas >= 3, f"spoke group of at least 3 (has {replicas})")
check(value("SPOKE_PEERS") == f"dns+{scheme}://{service}:7071", f"SPOKE_PEERS discovers the headless Service {service} over {scheme}: {value('SPOKE_PEERS')}")
check(value("SPOKE_PEER_SELF") == f"{scheme}://$(POD_IP):7071", "SPOKE_PEER_SELF from the pod's IP")
check(spoke_env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP", "POD_IP from the downward API")
hub_scheme = "https" if tls["shardcache-hub"] else "http"
check(value("SPOKE_HUB") == f"{hub_scheme}://shardcache-hub:7070", f"SPOKE_HUB is the hub Service over {hub_scheme}: {value('SPOKE_HUB')}")
check(bool(value("SPOKE_HUB_CA")) == tls["shardcache-hub"], "SPOKE_HUB_CA exactly when the hub serves TLS")
# The cache's --capacity leaves the volume headroom (RocksDB's compaction).
if "cache" in claims:
    size = quantity(claims["cache"]["spec"]["resources"]["requests"]["storage"])
    capacity = quantity(value("SPOKE_CAPACITY"))
    check(size and capacity and capacity <= 0.95 * size, f"SPOKE_CAPACITY {value('SPOKE_CAPACITY')} leaves headroom on the cache volume")
# A secured group is a group: members asked for tokens must be able to prove who they
# are to each other (their spoke-client certificate against the CA), or every peer read
# is refused and each member fetches every shard from the hub.
if spoke_env.get("SPOKE_TOKEN_FILE"):
    check(tls["shardcache-spoke"], "spokes with tokens serve TLS (tokens never cross in the clear)")
    check(value("SPOKE_CLIENT_CA") == "/tls/ca.pem",
          "spokes with tokens verify their peers' spoke-client certificates (SPOKE_CLIENT_CA)")
    check((value("SPOKE_HUB_CERT") or "").endswith("spoke-client.pem"),
          "spokes present their spoke-client certificate (to hubs and peers)")
budgets = [b for b in by_kind.get("PodDisruptionBudget", []) if b["spec"]["selector"]["matchLabels"] == spoke["spec"]["selector"]["matchLabels"]]
check(len(budgets) == 1 and budgets[0]["spec"].get("maxUnavailable") == 1, "a disruption budget of one spoke at a time")
hub = next(w for w in workloads if w["metadata"]["name"] == "shardcache-hub")
hub_env = {e["name"]: e.get("value") for e in hub["spec"]["template"]["spec"]["containers"][0].get("env", [])}
check(bool(hub_env.get("HUB_METRICS_LISTEN")), "hub serves metrics")

# Metrics: every server is scraped, by pod annotations or a ServiceMonitor, in the scheme
# it serves, with a client certificate where it requires one.
# The Secrets the pods mount their certificates from (README, "Kubernetes": what
# `shardcache certs` writes, but never the CA's key), and cert-manager's.
CERTS_KEYS = {"ca.pem"} | {f"{n}.{ext}" for n in ("hub", "spoke", "spoke-client", "client") for ext in ("pem", "key")}
CERTIFICATE_KEYS = {"ca.crt", "tls.crt", "tls.key"}
certificate_secrets = {c["spec"]["secretName"] for c in by_kind.get("Certificate", [])}
tls_secrets = {
    src["name"]
    for w in workloads
    for v in w["spec"]["template"]["spec"].get("volumes", [])
    if v["name"] == "tls"
    for src in ([{"name": v["secret"]["secretName"]}] if "secret" in v else [x["secret"] for x in v.get("projected", {}).get("sources", []) if "secret" in x])
}
monitors = by_kind.get("ServiceMonitor", [])
for w in (hub, spoke):
    name = w["metadata"]["name"]
    annotations = w["spec"]["template"]["metadata"].get("annotations", {})
    labels = services.get(name, {}).get("metadata", {}).get("labels", {})
    selected = [m for m in monitors if all(labels.get(k) == v for k, v in m["spec"]["selector"].get("matchLabels", {}).items())
                and all(labels.get(e["key"]) in e["values"] for e in m["spec"]["selector"].get("matchExpressions", []) if e["operator"] == "In")]
    check(annotations.get("prometheus.io/scrape") == "true" or selected, f"{name}: scraped (prometheus.io annotations or a ServiceMonitor)")
    scheme = "https" if tls[name] else "http"
    if annotations.get("prometheus.io/scrape") == "true":
        check(annotations.get("prometheus.io/scheme") == scheme, f"{name}: scrape annotation scheme {annotations.get('prometheus.io/scheme')}, the server serves {scheme}")
    ports = {p["name"] for p in services.get(name, {}).get("spec", {}).get("ports", [])}
    for m in selected:
        for e in m["spec"]["endpoints"]:
            check(e.get("port") in ports, f"ServiceMonitor {m['metadata']['name']}: port {e.get('port')} is not a port of Service {name}")
            check(e.get("scheme") == scheme, f"ServiceMonitor {m['metadata']['name']}: scheme {e.get('scheme')}, {name} serves {scheme}")
            if tls[name]:
                check(bool(e.get("tlsConfig", {}).get("ca", {}).get("secret", {}).get("name")), "ServiceMonitor: the CA to verify servers")
            tls_config = e.get("tlsConfig", {})
            if client_cert.get(name):
                check(bool(tls_config.get("cert", {}).get("secret", {}).get("name")) and bool(tls_config.get("keySecret", {}).get("name")),
                      f"ServiceMonitor {m['metadata']['name']}: no client certificate (tlsConfig cert, keySecret), but {name} requires one on its metrics listener")
            # What it reads is in a rendered Certificate's Secret, or in the pods' one TLS
            # Secret (a file of `shardcache certs`).
            for ref in (tls_config.get("ca", {}).get("secret"), tls_config.get("cert", {}).get("secret"), tls_config.get("keySecret")):
                if ref:
                    keys = CERTIFICATE_KEYS if ref.get("name") in certificate_secrets else CERTS_KEYS if ref.get("name") in tls_secrets - certificate_secrets else set()
                    check(ref.get("key") in keys, f"ServiceMonitor {m['metadata']['name']}: {ref} is no key of a rendered Certificate's Secret or of the pods' TLS Secret")

# The custom resources kubernetes-validate has no schema for: known fields only, and
# what they must hold.
SHAPES = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "spec": {"selector", "endpoints", "namespaceSelector", "jobLabel"},
        "endpoint": {"port", "path", "interval", "scrapeTimeout", "scheme", "tlsConfig", "authorization", "relabelings", "metricRelabelings", "honorLabels"},
    },
    ("cert-manager.io/v1", "Certificate"): {
        "spec": {"secretName", "commonName", "dnsNames", "ipAddresses", "usages", "duration", "renewBefore", "privateKey", "issuerRef", "isCA"},
    },
    ("cert-manager.io/v1", "Issuer"): {"spec": {"selfSigned", "ca"}},
}
custom = [d for d in docs if "." in d["apiVersion"].split("/")[0]]
for d in custom:
    shape = SHAPES.get((d["apiVersion"], d["kind"]))
    what = f"{d['kind']} {d['metadata'].get('name')}"
    if not shape:
        check(False, f"{what}: no shape known for {d['apiVersion']}")
        continue
    check(set(d["spec"]) <= shape["spec"], f"{what}: unknown fields {set(d['spec']) - shape['spec']}")
    for e in d["spec"].get("endpoints", []):
        check(set(e) <= shape["endpoint"], f"{what}: unknown endpoint fields {set(e) - shape['endpoint']}")
certificates = {c["spec"]["secretName"]: c for c in by_kind.get("Certificate", [])}
issuers = {i["metadata"]["name"] for i in by_kind.get("Issuer", [])}
for c in certificates.values():
    ref = c["spec"]["issuerRef"]
    check(ref["kind"] == "ClusterIssuer" or ref["name"] in issuers, f"Certificate {c['metadata']['name']}: its Issuer {ref['name']} is not rendered")
# Each server's certificate names what clients check: its Service, and localhost (probes;
# scrapes by pod IP with server_name localhost); spoke-client and client are client
# identities only.
for w, role in ((hub, "hub"), (spoke, "spoke"), (spoke, "spoke-client"), (hub, "client")):
    sources = [s["secret"] for v in w["spec"]["template"]["spec"].get("volumes", []) for s in v.get("projected", {}).get("sources", []) if "secret" in s]
    for s in sources:
        cert = certificates.get(s["name"])
        if cert and any(item["path"] == f"{role}.pem" for item in s["items"]):
            names, usages = cert["spec"].get("dnsNames", []), cert["spec"].get("usages", [])
            if role in ("spoke-client", "client"):
                check(names == [role] and "client auth" in usages and "server auth" not in usages, f"{role}: a client certificate named {role}")
            else:
                check({w["metadata"]["name"], "localhost"} <= set(names) and "server auth" in usages and "client auth" not in usages,
                      f"{role}: a server certificate for its Service and localhost: {names} {usages}")

if problems:
    print("manifest problems:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"{len(docs)} resources: schema-valid and checked")
