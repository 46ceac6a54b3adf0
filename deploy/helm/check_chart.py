"""Checks of the Helm chart's renders that deploy/k8s/check_manifests.py does not make.

  check_chart.py builtins RENDERED OUT      the resources of Kubernetes' own API (for
                                            kubernetes-validate, which has no schema for
                                            cert-manager's or prometheus-operator's)
  check_chart.py flags README RENDERED...   every HUB_*/SPOKE_* variable set is a flag's
                                            (the flag tables of the README and of the
                                            manual beside it, docs/*.md, which
                                            tests/tests/e2e/flags_documented.rs holds to
                                            the binaries)
  check_chart.py agree KUSTOMIZE HELM       the hub's and the spokes' containers take the
                                            same flags (env, args, command), image and
                                            probes (a client certificate where needed)
"""

import pathlib
import re
import sys

import yaml

CUSTOM_GROUPS = {"cert-manager.io", "monitoring.coreos.com"}
# Flags the chart and deploy/k8s may set differently, with why. None today: the secured
# values render deploy/k8s's flags exactly (capacity included: 90% of 2000Gi is 1800GiB).
MAY_DIFFER = {}


def load(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]


def containers(docs):
    """(workload, container name) -> container, of the Deployments and StatefulSets."""
    return {
        (d["metadata"]["name"], c["name"]): c
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }


def builtins(rendered, out):
    docs = load(rendered)
    kept = [d for d in docs if d["apiVersion"].split("/")[0] not in CUSTOM_GROUPS]
    with open(out, "w") as f:
        yaml.safe_dump_all(kept, f)


def flags(readme, *rendered):
    documented = set()
    pages = [pathlib.Path(readme), *sorted((pathlib.Path(readme).parent / "docs").glob("*.md"))]
    for page in pages:
        for line in open(page):
            if line.startswith("| `--"):
                documented.update(re.findall(r"`((?:HUB|SPOKE)_[A-Z0-9_]+)`", line.split("|")[2]))
    unknown = {
        f"{path}: {workload} sets {e['name']}"
        for path in rendered
        for (workload, _), c in containers(load(path)).items()
        for e in c.get("env", [])
        if re.match(r"(HUB|SPOKE)_", e["name"]) and e["name"] not in documented
    }
    if len(documented) < 40:
        sys.exit(f"only {len(documented)} flag variables read from the tables of {readme} and docs/: has their format changed?")
    if unknown:
        sys.exit("variables that are no server flag (the flag tables of the README and docs/):\n  " + "\n  ".join(sorted(unknown)))
    print(f"every HUB_*/SPOKE_* variable set is one of the {len(documented)} flags")


def agree(kustomize, helm):
    ours, theirs = containers(load(helm)), containers(load(kustomize))
    problems = []
    if set(ours) != set(theirs):
        problems.append(f"containers: chart {sorted(ours)}, kustomize {sorted(theirs)}")
    for key in sorted(set(ours) & set(theirs)):
        a, b = ours[key], theirs[key]
        env_a = {e["name"]: e.get("value", e.get("valueFrom")) for e in a.get("env", [])}
        env_b = {e["name"]: e.get("value", e.get("valueFrom")) for e in b.get("env", [])}
        for name in sorted(set(env_a) | set(env_b)):
            if env_a.get(name) != env_b.get(name) and name not in MAY_DIFFER:
                problems.append(f"{key[0]}: {name} is {env_a.get(name)!r} in the chart, {env_b.get(name)!r} in kustomize")
        for field in ("args", "command", "image", "readinessProbe", "livenessProbe"):
            if a.get(field) != b.get(field):
                problems.append(f"{key[0]}: {field} {a.get(field)!r} in the chart, {b.get(field)!r} in kustomize")
    if problems:
        sys.exit("the chart (secured group values) and deploy/k8s disagree:\n  " + "\n  ".join(problems))
    count = sum(len(c.get("env", [])) for c in ours.values())
    print(f"the chart and kustomize agree on the hub's and the spokes' {count} variables, args, images and probes")


{"builtins": builtins, "flags": flags, "agree": agree}[sys.argv[1]](*sys.argv[2:])
