#!/usr/bin/env python3
"""Checks the Kubernetes manifests of deploy/kubernetes/ offline (no cluster): run by scripts/check-manifests.sh,
which installs what it imports (kubernetes-validate, PyYAML, jsonschema) and kubectl (for `kubectl kustomize`)
into .models/k8s/.

For every overlay (overlays/*), the rendered documents are validated:
  - built-in kinds against the Kubernetes API's JSON schemas of each pinned version (KUBERNETES_VERSIONS, from the
    kubernetes-validate package, strict: an unknown field such as a misspelt `readinesProbe` fails);
  - custom resources against the openAPIV3Schema of the CRDs vendored in schemas/ (VENDORED below: the project,
    the version and the commit they come from), also rejecting unknown fields; their CEL rules
    (x-kubernetes-validations) are not evaluated, and are counted in the report;
and the documents are checked against each other and against the server: the drain's numbers (preStop sleep +
--drain-timeout + margin <= terminationGracePeriodSeconds), the probes' paths, the memory request against the
models' declared budgets (model.json of each package the deployment file names), selectors that select, the
endpoint picker's metric names against the ones the server exports, one InferenceObjective per served chat model,
the Deployment's arguments against the CMD of the Containerfile that builds its image (and that image's plugins).
Then it checks itself: a copy with a misspelt field and one with an inconsistent grace period must fail.

Usage: check.py KUBECTL   (exit status 0: every check passed; 1: the failures are listed)
"""

import copy
import json
import pathlib
import re
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
# The oldest Kubernetes these manifests are for (the preStop sleep action is on by default from 1.30, GA in 1.34)
# and the newest the validator knows.
KUBERNETES_VERSIONS = ["1.33.0", "1.37.0"]
# schemas/: (file, the project it comes from, its version and commit).
VENDORED = [
    ("inference.networking.k8s.io_inferencepools.yaml",
     "kubernetes-sigs/gateway-api-inference-extension", "v1.5.0", "df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849"),
    ("inference.networking.x-k8s.io_inferenceobjectives.yaml",
     "kubernetes-sigs/gateway-api-inference-extension", "v1.5.0", "df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849"),
    ("gateway.networking.k8s.io_httproutes.yaml",
     "kubernetes-sigs/gateway-api", "v1.6.1", "8bb74df00e56ec8f944d48c25e6c1c9c2f6848e3"),
    ("monitoring.coreos.com_servicemonitors.yaml",
     "prometheus-operator/prometheus-operator", "v0.93.0", "f8fafd475f3d132e239432ae6172de60a6cb6516"),
]
# The model-server protocol's gauges, as the server exports them (host/serve-http/src/metrics.rs).
PROTOCOL_METRICS = {
    "queuedRequestsSpec": "loom_num_requests_waiting",
    "runningRequestsSpec": "loom_num_requests_running",
    "kvUsageSpec": "loom_kv_cache_utilization",
}
# What preStop + the drain may not exceed the grace period by less than.
GRACE_MARGIN_S = 5


def strict(schema):
    """The schema with additionalProperties: false on every object that lists its properties (a CRD's
    structural schema prunes unknown fields; a typo should fail here instead of vanishing)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def count_cel(schema):
    if isinstance(schema, dict):
        return len(schema.get("x-kubernetes-validations", [])) + sum(count_cel(v) for v in schema.values())
    if isinstance(schema, list):
        return sum(count_cel(v) for v in schema)
    return 0


def load_crds():
    """(apiVersion, kind) -> (schema, CEL rules not evaluated)."""
    crds = {}
    for name, _project, version, _commit in VENDORED:
        doc = yaml.safe_load((HERE / "schemas" / name).read_text())
        group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
        for v in doc["spec"]["versions"]:
            if v.get("served"):
                s = copy.deepcopy(v["schema"]["openAPIV3Schema"])
                # metadata is checked by the API server, not by the CRD: a name and labels are what we use.
                s["properties"]["metadata"] = {"type": "object"}
                s["properties"].pop("status", None)
                crds[(f"{group}/{v['name']}", kind)] = (strict(s), count_cel(s), f"{name} ({version})")
    return crds


def render(kubectl, overlay):
    out = subprocess.run([kubectl, "kustomize", str(overlay)], check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def key(d):
    return f"{d.get('kind')}/{d.get('metadata', {}).get('name')}"


def validate_schemas(docs, crds, failures, report):
    for d in docs:
        gvk = (d.get("apiVersion"), d.get("kind"))
        if gvk in crds:
            schema, cel, source = crds[gvk]
            errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(d), key=lambda e: list(e.path))
            for e in errors:
                failures.append(f"{key(d)}: {'.'.join(map(str, e.path)) or '(root)'}: {e.message} [{source}]")
            report.append(f"  {key(d)}: {source}" + (f", {cel} CEL rule(s) not evaluated" if cel else ""))
            continue
        for v in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(d, v, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                failures.append(f"{key(d)}: {gvk[0]} {gvk[1]} is neither a Kubernetes {v} kind nor a vendored CRD")
                break
            except jsonschema.ValidationError as e:
                failures.append(f"{key(d)}: Kubernetes {v}: {'.'.join(map(str, e.path)) or '(root)'}: {e.message}")
        else:
            report.append(f"  {key(d)}: Kubernetes {', '.join(KUBERNETES_VERSIONS)}")


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind}{' ' + name if name else ''}, found {len(found)}")
    return found[0]


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def quantity(q):
    """Bytes of a Kubernetes memory quantity."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q))
    if not m:
        raise AssertionError(f"memory quantity {q!r}")
    mult = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[m.group(2)]
    return int(m.group(1)) * mult


def arg(args, flag):
    i = args.index(flag)
    return args[i + 1]


def check_consistency(docs, failures):
    def check(cond, msg):
        if not cond:
            failures.append(msg)

    try:
        dep = one(docs, "Deployment", "loom-serve")
        pod = dep["spec"]["template"]["spec"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        c = next(c for c in pod["containers"] if c["name"] == "loom-serve")
        args = c["args"]
        port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
        check(str(port) == arg(args, "--port"), "the container port is not the server's --port")
        check(arg(args, "--host") == "0.0.0.0", "--host must be 0.0.0.0 in a pod")
        # The drain: SIGTERM comes after preStop; the server drains for at most --drain-timeout.
        drain = float(arg(args, "--drain-timeout"))
        pre = c["lifecycle"]["preStop"]["sleep"]["seconds"]
        grace = pod["terminationGracePeriodSeconds"]
        check(drain > 0, "--drain-timeout 0 would let a stuck drain outlive the grace period")
        check(pre + drain + GRACE_MARGIN_S <= grace,
              f"terminationGracePeriodSeconds {grace} < preStop {pre} s + --drain-timeout {drain} s + {GRACE_MARGIN_S}")
        check(c["readinessProbe"]["httpGet"]["path"] == "/health?strict=true",
              "readiness must probe /health?strict=true")
        check(c["startupProbe"]["httpGet"]["path"] == "/health", "the startup probe must probe /health")
        check(c["livenessProbe"]["httpGet"]["path"] == "/health/live",
              "liveness must probe /health/live (/health is 503 while preparing and draining)")
        check(c["readinessProbe"]["failureThreshold"] * c["readinessProbe"]["periodSeconds"] <= pre + 2,
              "readiness must fail within the preStop sleep of the drain's start")
        # Resources from the models' declared budgets.
        cm_name = next(v["configMap"]["name"] for v in pod["volumes"] if v["name"] == "deployment")
        cm = one(docs, "ConfigMap", cm_name)
        deployment = json.loads(cm["data"]["deployment.json"])
        need, chat_models = 0, []
        for m in deployment["models"]:
            base = pathlib.PurePosixPath(m["base"])
            check(base.is_absolute() and base.parts[1] == "models",
                  f"model {m['base']}: packages come from the /models volume")
            doc = json.loads((REPO / "packages" / base.name / "model.json").read_text())
            mem = doc.get("memory", {})
            device = m.get("device", doc.get("device", "cpu"))
            first = device[0] if isinstance(device, list) else device
            # CPU device memory is host memory; a GPU's is not.
            need += mem.get("invocation_bytes", 0) + (mem.get("device_bytes", 0) if first.startswith("cpu") else 0)
            if doc.get("role") == "chat":
                chat_models.append(m.get("name", doc.get("name", base.name)))
        request = quantity(c["resources"]["requests"]["memory"])
        check(request >= need, f"memory request {request} below the models' declared budgets {need}")
        check(quantity(c["resources"]["limits"]["memory"]) >= request, "memory limit below the request")
        # Selectors.
        svc = one(docs, "Service", "loom-serve")
        check(matches(svc["spec"]["selector"], labels), "the Service does not select the pods")
        pdb = one(docs, "PodDisruptionBudget")
        check(matches(pdb["spec"]["selector"]["matchLabels"], labels), "the PDB does not select the pods")
        sm = one(docs, "ServiceMonitor")
        check(matches(sm["spec"]["selector"]["matchLabels"], svc["metadata"].get("labels", {})),
              "the ServiceMonitor does not select the Service")
        check(any(e["port"] in [p["name"] for p in svc["spec"]["ports"]] and e["path"] == "/metrics"
                  for e in sm["spec"]["endpoints"]), "the ServiceMonitor does not scrape /metrics on a Service port")
        hpa = one(docs, "HorizontalPodAutoscaler")
        check(hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"], "the HPA scales another Deployment")
        check([m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == ["loom_num_requests_waiting"],
              "the HPA scales on the queue depth")
        check(hpa["spec"]["minReplicas"] >= 2, "one replica leaves nothing serving while it drains")
        # The gateway.
        pool = one(docs, "InferencePool")
        check(matches(pool["spec"]["selector"]["matchLabels"], labels), "the InferencePool does not select the pods")
        check([p["number"] for p in pool["spec"]["targetPorts"]] == [port], "the pool's target port")
        epp_svc = one(docs, "Service", pool["spec"]["endpointPickerRef"]["name"])
        check(pool["spec"]["endpointPickerRef"]["port"]["number"] in [p["port"] for p in epp_svc["spec"]["ports"]],
              "the endpoint picker's port")
        epp = one(docs, "Deployment", "loom-serve-epp")
        eargs = epp["spec"]["template"]["spec"]["containers"][0]["args"]
        check(arg(eargs, "--pool-name") == pool["metadata"]["name"], "the picker's --pool-name")
        check(epp["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= grace,
              "the picker's grace period is shorter than the pool's pods'")
        ecm = one(docs, "ConfigMap", next(v["configMap"]["name"] for v in epp["spec"]["template"]["spec"]["volumes"]))
        config = yaml.safe_load(ecm["data"][pathlib.PurePosixPath(arg(eargs, "--config-file")).name])
        ext = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")["parameters"]
        engine = next(e for e in ext["engineConfigs"] if e["name"] == ext["defaultEngine"])
        check(labels.get("inference.networking.k8s.io/engine-type") == engine["name"],
              "the pods' engine-type label is not the picker's engine")
        exported = (REPO / "host/serve-http/src/metrics.rs").read_text()
        for field, name in PROTOCOL_METRICS.items():
            check(engine.get(field) == name, f"the picker's {field} is {engine.get(field)!r}, not {name}")
            check(f'"{name}"' in exported, f"the server does not export {name}")
        objectives = {d["metadata"]["name"]: d for d in docs if d["kind"] == "InferenceObjective"}
        check(sorted(objectives) == sorted(chat_models),
              f"InferenceObjectives {sorted(objectives)} are not the served chat models {sorted(chat_models)}")
        for o in objectives.values():
            check(o["spec"]["poolRef"]["name"] == pool["metadata"]["name"], f"{key(o)} names another pool")
        route = one(docs, "HTTPRoute")
        check(any(b["kind"] == "InferencePool" and b["name"] == pool["metadata"]["name"]
                  for r in route["spec"]["rules"] for b in r["backendRefs"]), "the HTTPRoute does not reach the pool")
    except (AssertionError, KeyError, StopIteration, ValueError) as e:
        failures.append(f"consistency: {type(e).__name__}: {e}")


def containerfile(name):
    """(ENTRYPOINT, CMD, the plugin libraries copied, the runtime base image) of a Containerfile."""
    text = (HERE / name).read_text().replace("\\\n", " ")
    def instr(word):
        found = re.findall(rf"^{word}\s+(.*)$", text, re.M)
        return found
    entry = json.loads(instr("ENTRYPOINT")[-1])
    cmd = json.loads(instr("CMD")[-1])
    libs = re.findall(r"target/release/(lib\w+\.so)", text)
    return entry, cmd, libs, instr("FROM")[-1]


def check_images(overlay, docs, failures):
    """The image an overlay runs is built by a Containerfile whose defaults are the Deployment's arguments."""
    dep = one(docs, "Deployment", "loom-serve")
    c = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "loom-serve")
    tag = c["image"].rsplit(":", 1)[-1]
    name = {"latest": "Containerfile", "cuda": "Containerfile.cuda"}.get(tag)
    if name is None:
        failures.append(f"{overlay}: image {c['image']} is built by no Containerfile")
        return
    entry, cmd, libs, _ = containerfile(name)
    if c.get("command", entry) != entry:
        failures.append(f"{overlay}: the container's command is not {name}'s ENTRYPOINT")
    if c["args"] != cmd:
        failures.append(f"{overlay}: the Deployment's args {c['args']} are not {name}'s CMD {cmd}")
    want = {"libhal_cpu.so", "libprofile_tei.so"} | ({"libhal_cuda.so"} if tag == "cuda" else set())
    if not want <= set(libs):
        failures.append(f"{overlay}: {name} installs {sorted(set(libs))}, not {sorted(want)}")
    gpus = c["resources"].get("limits", {}).get("nvidia.com/gpu")
    if (tag == "cuda") != (gpus is not None):
        failures.append(f"{overlay}: image {c['image']} with nvidia.com/gpu limit {gpus}")


def check_docs(docs, crds, report, overlay="(copy)"):
    failures = []
    validate_schemas(docs, crds, failures, report)
    check_consistency(docs, failures)
    try:
        check_images(overlay, docs, failures)
    except (KeyError, StopIteration, ValueError, IndexError, AssertionError) as e:
        failures.append(f"{overlay}: images: {type(e).__name__}: {e}")
    return failures


def main():
    kubectl = sys.argv[1]
    crds = load_crds()
    overlays = sorted(p for p in (HERE / "overlays").iterdir() if (p / "kustomization.yaml").exists())
    failed = False
    rendered = {}
    for o in overlays:
        docs = render(kubectl, o)
        rendered[o.name] = docs
        report = []
        failures = check_docs(docs, crds, report, o.name)
        print(f"overlay {o.name}: {len(docs)} documents")
        print("\n".join(report))
        for f in failures:
            print(f"  FAIL {f}")
        failed |= bool(failures)
    # The checks check: a misspelt field and a grace period shorter than the drain must each fail.
    docs = copy.deepcopy(rendered[overlays[0].name])
    c = one(docs, "Deployment", "loom-serve")["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    if not any("readinesProbe" in f for f in check_docs(docs, crds, [])):
        print("  FAIL self-test: a misspelt readinessProbe passed")
        failed = True
    docs = copy.deepcopy(rendered[overlays[0].name])
    one(docs, "Deployment", "loom-serve")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    if not any("terminationGracePeriodSeconds" in f for f in check_docs(docs, crds, [])):
        print("  FAIL self-test: a grace period shorter than the drain passed")
        failed = True
    docs = copy.deepcopy(rendered[overlays[0].name])
    one(docs, "InferencePool")["spec"]["endpointPickerRef"]["prot"] = 9002
    if not any("prot" in f for f in check_docs(docs, crds, [])):
        print("  FAIL self-test: a misspelt field of an InferencePool passed")
        failed = True
    docs = copy.deepcopy(rendered[overlays[0].name])
    args = one(docs, "Deployment", "loom-serve")["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("--drain-timeout") + 1] = "30"
    if not any("CMD" in f for f in check_docs(docs, crds, [], overlays[0].name)):
        print("  FAIL self-test: arguments other than the image's CMD passed")
        failed = True
    print(f"{len(overlays)} overlays: {'FAILED' if failed else 'every document valid and consistent'}"
          f" (Kubernetes {', '.join(KUBERNETES_VERSIONS)}; CRDs: "
          + ", ".join(dict.fromkeys(f"{p} {v}" for _, p, v, _ in VENDORED)) + ")")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
