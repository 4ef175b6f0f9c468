#!/usr/bin/env python3
"""Renders the Helm chart over tests/helm/values-*.yaml and checks every render.

    python3 tests/helm/check_chart.py --helm HELM --kubectl KUBECTL

For each values file: `helm template` (release gpu-exporter, namespace gpu-exporter), every
document validated by scripts/validate-manifests.py (kubernetes-validate, strict, oldest and
newest schema; own schemas for ServiceMonitor and PrometheusRule), then what that values file is
about is asserted (probes, web config, mounts, ...). Then the chart's default render is compared
with `kubectl kustomize deploy/`, and the process-usage render with overlays/process-usage/
("equivalent" is defined in equivalent() below), and overlays/web-config/ (TLS + basic auth)
is rendered, validated and checked for HTTPS probes. Values that must make `helm template` fail
(a missing certificate) are checked to fail with a message naming the value.
Exits 1 listing every failure.
"""

import argparse
import base64
import copy
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(ROOT, "deploy", "helm", "gpu-exporter")
VALUES_DIR = os.path.join(ROOT, "tests", "helm")
RELEASE = NAMESPACE = "gpu-exporter"

sys.path.insert(0, os.path.join(ROOT, "scripts"))
validate_manifests = __import__("validate-manifests")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def helm_template(helm, values=None, sets=(), expect_fail=False):
    cmd = [helm, "template", RELEASE, CHART, "--namespace", NAMESPACE]
    if values:
        cmd += ["-f", values]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if expect_fail:
        return r
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def docs_of(text):
    return [d for d in yaml.safe_load_all(text) if d]


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"want one {kind} {name or ''}, got {len(found)}"
    return found[0]


def kinds(docs):
    return sorted(d["kind"] for d in docs)


def container(docs):
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]


def pod(docs):
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]


def env(docs):
    out = {}
    for e in container(docs).get("env", []):
        check(e["name"] not in out, f"env {e['name']} set twice")
        out[e["name"]] = e
    return out


def by_name(items):
    return {i["name"]: i for i in items or []}


# ---------------------------------------------------------------- equivalence with kustomize

HASH_SUFFIX = re.compile(r"-[a-z0-9]{10}$")


def normalize_pod_template(tpl):
    """What of a DaemonSet's pod template must be equal between the chart and kustomize.

    Equal: the whole pod spec (containers with image, args, ports, probes, resources,
    securityContext; env, volumeMounts and volumes as sets keyed by name, so that the order a
    strategic-merge patch appends in does not matter; service account, token automount,
    priority class, node selector, tolerations, pod securityContext). ConfigMap volume names are
    compared without kustomize's content-hash suffix. Not compared: metadata labels beyond
    kustomize's (the chart adds app.kubernetes.io/instance etc.) and the chart's checksum/*
    annotations (its equivalent of the hash suffix)."""
    spec = copy.deepcopy(tpl["spec"])
    for c in spec["containers"]:
        c["env"] = by_name(c.get("env"))
        c["volumeMounts"] = by_name(c.get("volumeMounts"))
    vols = by_name(spec.get("volumes"))
    for v in vols.values():
        if "configMap" in v:
            v["configMap"]["name"] = HASH_SUFFIX.sub("", v["configMap"]["name"])
    spec["volumes"] = vols
    return spec


def diff(a, b, path=""):
    """Human-readable differences between two YAML values."""
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{path}/{k}: only in the chart: {b[k]!r}")
            elif k not in b:
                out.append(f"{path}/{k}: only in kustomize: {a[k]!r}")
            else:
                out += diff(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            out += diff(x, y, f"{path}/{i}")
    elif a != b:
        out.append(f"{path}: kustomize {a!r} != chart {b!r}")
    return out


def subset(small, big):
    return all(big.get(k) == v for k, v in (small or {}).items())


def equivalent(kustomized, rendered, label):
    """kustomize output vs chart render: same kinds (less the Namespace, which helm's
    --create-namespace makes), same names and namespace, and per kind:
    DaemonSet: normalize_pod_template() equal, same update strategy, kustomize's selector and
    pod labels a subset of the chart's; Service: spec equal but for the selector (a superset);
    ServiceMonitor: endpoints equal; PrometheusRule: spec equal; ConfigMap: data equal (name
    without the hash suffix); ServiceAccount: same token automount."""
    k_docs = [d for d in kustomized if d["kind"] != "Namespace"]
    check(kinds(k_docs) == kinds(rendered), f"{label}: kinds {kinds(k_docs)} vs chart {kinds(rendered)}")
    for k in k_docs:
        kind = k["kind"]
        name = HASH_SUFFIX.sub("", k["metadata"]["name"]) if kind == "ConfigMap" else k["metadata"]["name"]
        match = [r for r in rendered if r["kind"] == kind and r["metadata"]["name"] == name]
        if not check(len(match) == 1, f"{label}: chart renders no {kind}/{name}"):
            continue
        r = match[0]
        check(r["metadata"].get("namespace") == k["metadata"].get("namespace"),
              f"{label}: {kind}/{name} namespace {r['metadata'].get('namespace')} vs {k['metadata'].get('namespace')}")
        check(subset(k["metadata"].get("labels"), r["metadata"].get("labels", {})),
              f"{label}: {kind}/{name} lacks kustomize's labels {k['metadata'].get('labels')}")
        if kind == "DaemonSet":
            d = diff(normalize_pod_template(k["spec"]["template"]), normalize_pod_template(r["spec"]["template"]))
            check(not d, f"{label}: DaemonSet pod spec differs:\n    " + "\n    ".join(d))
            check(k["spec"]["updateStrategy"] == r["spec"]["updateStrategy"], f"{label}: updateStrategy differs")
            check(subset(k["spec"]["selector"]["matchLabels"], r["spec"]["selector"]["matchLabels"]),
                  f"{label}: selector is not a superset of kustomize's")
            check(subset(k["spec"]["template"]["metadata"]["labels"], r["spec"]["template"]["metadata"]["labels"]),
                  f"{label}: pod labels are not a superset of kustomize's")
        elif kind == "Service":
            ks, rs = dict(k["spec"]), dict(r["spec"])
            ks.setdefault("type", "ClusterIP")  # the API server's default
            check(subset(ks.pop("selector"), rs.pop("selector")), f"{label}: Service selector")
            d = diff(ks, rs)
            check(not d, f"{label}: Service spec differs:\n    " + "\n    ".join(d))
        elif kind == "ServiceMonitor":
            d = diff(k["spec"]["endpoints"], r["spec"]["endpoints"])
            check(not d, f"{label}: ServiceMonitor endpoints differ:\n    " + "\n    ".join(d))
            check(subset(k["spec"]["selector"]["matchLabels"], r["spec"]["selector"]["matchLabels"]),
                  f"{label}: ServiceMonitor selector")
        elif kind == "PrometheusRule":
            check(k["spec"] == r["spec"], f"{label}: PrometheusRule spec differs from deploy/prometheusrule.yaml")
        elif kind == "ConfigMap":
            check(k["data"] == r["data"], f"{label}: ConfigMap {name} data differs")
        elif kind == "ServiceAccount":
            check(k.get("automountServiceAccountToken") == r.get("automountServiceAccountToken"),
                  f"{label}: ServiceAccount token automount differs")


# ---------------------------------------------------------------- per values file

def probes_plain(docs, label):
    c = container(docs)
    check(c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}, f"{label}: readiness {c['readinessProbe']}")
    check(c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}, f"{label}: liveness {c['livenessProbe']}")


def probes_https(docs, label):
    c = container(docs)
    for probe, path in (("readinessProbe", "/ready"), ("livenessProbe", "/health")):
        # The kubelet sends no credentials and does not verify: HTTPS, no headers, no tcpSocket.
        check(c[probe].get("httpGet") == {"path": path, "port": "metrics", "scheme": "HTTPS"},
              f"{label}: {probe} must be httpGet {path} over HTTPS without headers: {c[probe]}")


def web_config(docs, label):
    e = env(docs)
    path = e["DCGM_EXPORTER_WEB_CONFIG_FILE"]["value"]
    c = container(docs)
    mount = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    check(len(mount) == 1, f"{label}: nothing mounts {path}")
    vol = by_name(pod(docs)["volumes"])[mount[0]["name"]]
    secret = one(docs, "Secret", vol["secret"]["secretName"])
    key = os.path.relpath(path, mount[0]["mountPath"])
    return yaml.safe_load(secret["stringData"][key]), c


def tls_files(docs, cfg, label, secret_rendered):
    c = container(docs)
    tls = cfg["tls_server_config"]
    for f in ("cert_file", "key_file") + (("client_ca_file",) if "client_ca_file" in tls else ()):
        mount = [m for m in c["volumeMounts"] if tls[f].startswith(m["mountPath"].rstrip("/") + "/")]
        if not check(len(mount) == 1, f"{label}: {f} {tls[f]} is not under a mount"):
            continue
        vol = by_name(pod(docs)["volumes"])[mount[0]["name"]]
        key = os.path.relpath(tls[f], mount[0]["mountPath"])
        if secret_rendered:
            s = one(docs, "Secret", vol["secret"]["secretName"])
            check(key in s["data"], f"{label}: Secret {s['metadata']['name']} lacks {key} for {f}")
        else:
            check(not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == vol["secret"]["secretName"]],
                  f"{label}: an existingSecret must not be rendered")
    return tls


def case_defaults(docs, label):
    probes_plain(docs, label)
    check("DCGM_EXPORTER_WEB_CONFIG_FILE" not in env(docs), f"{label}: no web config by default")
    check(not [d for d in docs if d["kind"] in ("Secret", "NetworkPolicy")], f"{label}: no Secret/NetworkPolicy by default")
    check(not [d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]],
          f"{label}: dashboards are off by default")


def case_operator(docs, label):
    probes_plain(docs, label)
    c, e, p = container(docs), env(docs), pod(docs)
    check(c["image"] == "registry.example.com/gpu-exporter:0.1.0@sha256:" + "0123456789abcdef" * 4, f"{label}: image {c['image']}")
    check(c["args"] == ["-f", "/etc/dcgm-exporter/dcgm-metrics.csv"], f"{label}: args {c['args']}")
    check(e["DCGM_EXPORTER_COLLECTORS"]["value"] == "/etc/dcgm-exporter/dcp-metrics-included.csv", f"{label}: Operator env")
    check(e["DCGM_EXPORTER_LISTEN"]["value"] == ":9400" and e["DCGM_EXPORTER_KUBERNETES"]["value"] == "true", f"{label}: Operator env")
    m = by_name(c["volumeMounts"])["metrics-csv"]
    check(m["mountPath"] == "/etc/dcgm-exporter/dcgm-metrics.csv" and m["subPath"] == "dcgm-metrics.csv", f"{label}: CSV mount {m}")
    v = by_name(p["volumes"])["metrics-csv"]
    check(v["configMap"]["items"][0]["key"] == "dcgm-metrics.csv", f"{label}: CSV key")
    check(by_name(p["volumes"])["hpc-jobs"]["hostPath"]["path"] == "/run/hpc-jobs", f"{label}: extraHostVolumes")
    check(p["nodeSelector"] == {"nvidia.com/gpu.deploy.dcgm-exporter": "true"}, f"{label}: nodeSelector")
    check(c["livenessProbe"]["initialDelaySeconds"] == 45 and c["livenessProbe"]["periodSeconds"] == 5
          and c["readinessProbe"]["initialDelaySeconds"] == 45, f"{label}: probe delays")
    check(p["runtimeClassName"] == "nvidia" and p["imagePullSecrets"] == [{"name": "registry-credentials"}], f"{label}: pod settings")
    tpl = one(docs, "DaemonSet")["spec"]["template"]["metadata"]
    check(tpl["labels"]["team"] == "gpu-platform" and tpl["annotations"]["prometheus.io/scrape"] == "false", f"{label}: pod labels/annotations")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        check(one(docs, kind)["metadata"]["labels"].get("release") == "kube-prometheus-stack", f"{label}: {kind} release label")
    ep = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    check(ep["interval"] == "15s" and ep["honorLabels"] is False and "relabelings" not in ep
          and ep["metricRelabelings"][0]["action"] == "labeldrop", f"{label}: ServiceMonitor {ep}")
    svc = one(docs, "Service")["spec"]
    check("clusterIP" not in svc and svc["internalTrafficPolicy"] == "Local", f"{label}: Service {svc}")
    check(not [a for a in c["args"] if "dump" in a], f"{label}: debugDump is ignored")
    check([i["name"] for i in p["initContainers"]] == ["toolkit-validation"], f"{label}: initContainers")


def case_tls_basic_auth(docs, label):
    probes_https(docs, label)
    cfg, _ = web_config(docs, label)
    tls_files(docs, cfg, label, secret_rendered=True)
    users = cfg.get("basic_auth_users", {})
    check(sorted(users) == ["admin", "prometheus"], f"{label}: basic_auth_users {sorted(users)}")
    for u, h in users.items():
        check(re.fullmatch(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}", h or "") is not None, f"{label}: {u}'s hash is not bcrypt: {h!r}")
    ep = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    check(ep.get("scheme") == "https" and ep["tlsConfig"] == {"insecureSkipVerify": True}, f"{label}: ServiceMonitor TLS {ep}")
    check(ep["basicAuth"]["username"] == {"name": "gpu-exporter-scrape", "key": "username"}, f"{label}: ServiceMonitor basicAuth")
    np = one(docs, "NetworkPolicy")["spec"]
    check(np["ingress"][0]["ports"] == [{"port": "metrics", "protocol": "TCP"}], f"{label}: NetworkPolicy ports")
    check(np["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"},
          f"{label}: NetworkPolicy from")
    check(np["podSelector"]["matchLabels"] == one(docs, "DaemonSet")["spec"]["selector"]["matchLabels"], f"{label}: NetworkPolicy selects the pods")


def case_mtls_existing_secret(docs, label):
    probes_https(docs, label)
    cfg, _ = web_config(docs, label)
    tls = tls_files(docs, cfg, label, secret_rendered=False)
    check(tls.get("client_auth_type") == "RequireAndVerifyClientCert", f"{label}: client_auth_type")
    check(by_name(pod(docs)["volumes"])["tls"]["secret"]["secretName"] == "gpu-exporter-certs", f"{label}: existingSecret volume")
    check("basic_auth_users" not in cfg, f"{label}: no users")


def case_dra(docs, label):
    probes_plain(docs, label)
    e, c, p = env(docs), container(docs), pod(docs)
    check(e["KUBERNETES_ENABLE_DRA"]["value"] == "true", f"{label}: DRA env")
    check(e["DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"]["value"] == "^app$,^team$", f"{label}: allowlist")
    check(e["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"]["value"] == "true"
          and e["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"]["value"] == "true", f"{label}: pod labels/UID")
    check(e["CONTAINER_RUNTIME_ENDPOINT"]["value"] == "unix:///run/crio/crio.sock", f"{label}: CRI-O endpoint")
    m = by_name(c["volumeMounts"])["container-runtime"]
    check(m["mountPath"] == "/run/crio" and m["readOnly"] is True, f"{label}: runtime mount {m}")
    check(by_name(p["volumes"])["container-runtime"]["hostPath"]["path"] == "/run/crio", f"{label}: runtime volume")
    check("GPU_EXPORTER_PATH_PROCFS" not in e and "host-proc" not in by_name(p["volumes"]), f"{label}: no /proc without processUsage")
    boards = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    sources = sorted(glob.glob(os.path.join(ROOT, "dashboards", "*.json")))
    check(len(boards) == len(sources), f"{label}: {len(boards)} dashboard ConfigMaps for {len(sources)} dashboards")
    for b in boards:
        check(b["metadata"]["namespace"] == "monitoring" and b["metadata"]["annotations"] == {"grafana_folder": "GPU"},
              f"{label}: dashboard {b['metadata']['name']} namespace/annotations")
        (key, text), = b["data"].items()
        with open(os.path.join(ROOT, "dashboards", key)) as f:
            check(json.loads(text) == json.load(f), f"{label}: dashboard {key} differs from dashboards/{key}")
    path = e["DCGM_EXPORTER_CONFIG_FILE"]["value"]
    m = by_name(c["volumeMounts"])["config-file"]
    cm = one(docs, "ConfigMap", by_name(p["volumes"])["config-file"]["configMap"]["name"])
    check(os.path.relpath(path, m["mountPath"]) in cm["data"], f"{label}: {path} is not in the config ConfigMap")


def case_process_usage(docs, label):
    probes_plain(docs, label)  # and equivalent() against overlays/process-usage/ below


def case_non_root(docs, label):
    probes_plain(docs, label)
    c, p, e = container(docs), pod(docs), env(docs)
    check(c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["runAsUser"] != 0, f"{label}: non-root")
    check(not [v for v in p.get("volumes", []) if "hostPath" in v], f"{label}: no hostPath without pod attribution")
    check("DCGM_EXPORTER_KUBERNETES" not in e and "KUBERNETES_ENABLE_DRA" not in e, f"{label}: attribution off")
    check(not [d for d in docs if d["kind"] in ("ServiceMonitor", "PrometheusRule")], f"{label}: no CRD objects")


def case_ipv6(docs, label):
    probes_plain(docs, label)
    svc = one(docs, "Service")
    check(svc["spec"]["ipFamilies"] == ["IPv6"] and svc["spec"]["ipFamilyPolicy"] == "SingleStack", f"{label}: Service IP family")
    check(env(docs)["DCGM_EXPORTER_LISTEN"]["value"] == ":9400", f"{label}: listen on :9400 (both families)")
    p = pod(docs)
    check(p["hostNetwork"] is True and p["dnsPolicy"] == "ClusterFirstWithHostNet", f"{label}: hostNetwork")
    for d in docs:
        check(d["metadata"].get("namespace") == "monitoring", f"{label}: {d['kind']} not in namespaceOverride")
        check(d["metadata"]["name"].startswith("gpu-metrics"), f"{label}: {d['kind']}/{d['metadata']['name']} ignores fullnameOverride")
    check(one(docs, "ServiceMonitor")["spec"]["namespaceSelector"]["matchNames"] == ["monitoring"], f"{label}: ServiceMonitor namespace")


CASES = {
    "defaults": case_defaults,
    "operator": case_operator,
    "tls-basic-auth": case_tls_basic_auth,
    "mtls-existing-secret": case_mtls_existing_secret,
    "process-usage": case_process_usage,
    "dra": case_dra,
    "non-root": case_non_root,
    "ipv6": case_ipv6,
}

MUST_FAIL = [
    (["tlsServerConfig.enabled=true", "tlsServerConfig.autoGenerated=false"], "tlsServerConfig.cert"),
    (["tlsServerConfig.enabled=true", "tlsServerConfig.autoGenerated=false", "tlsServerConfig.cert=C",
      "tlsServerConfig.key=K", "tlsServerConfig.clientAuthType=RequireAndVerifyClientCert"], "tlsServerConfig.ca"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--helm", required=True)
    ap.add_argument("--kubectl", required=True)
    a = ap.parse_args()

    files = sorted(glob.glob(os.path.join(VALUES_DIR, "values-*.yaml")))
    names = [os.path.basename(f)[len("values-"):-len(".yaml")] for f in files]
    check(sorted(names) == sorted(CASES), f"values files {names} vs checks {sorted(CASES)}")
    renders = {}
    with tempfile.TemporaryDirectory() as tmp:
        for f, name in zip(files, names):
            text = helm_template(a.helm, f)
            out = os.path.join(tmp, f"{name}.yaml")
            with open(out, "w") as fh:
                fh.write(text)
            docs = docs_of(text)
            renders[name] = docs
            print(f"--- values-{name}.yaml: {len(docs)} objects: {', '.join(sorted(set(kinds(docs))))}")
            rc = validate_manifests.main(out, {"DaemonSet", "ConfigMap"})
            check(rc == 0, f"values-{name}.yaml: render fails validation (see above)")
            mounts = [m["mountPath"].rstrip("/") + "/" for m in container(docs).get("volumeMounts", [])]
            nested = [(a_, b) for a_ in mounts for b in mounts if a_ != b and b.startswith(a_)]
            # A mount inside another (read-only ConfigMap) mount needs a mountpoint the runtime
            # cannot create there.
            check(not nested, f"values-{name}.yaml: nested volume mounts {nested}")
            if name in CASES:
                try:
                    CASES[name](docs, f"values-{name}.yaml")
                except (KeyError, AssertionError, TypeError, IndexError) as e:
                    failures.append(f"values-{name}.yaml: {type(e).__name__}: {e}")

    for label, kdir, name in (("deploy/ vs chart defaults", "deploy", "defaults"),
                              ("overlays/process-usage/ vs values-process-usage.yaml", "overlays/process-usage", "process-usage")):
        r = subprocess.run([a.kubectl, "kustomize", os.path.join(ROOT, kdir)], capture_output=True, text=True)
        if not check(r.returncode == 0, f"kubectl kustomize {kdir}: {r.stderr}"):
            continue
        before = len(failures)
        equivalent(docs_of(r.stdout), renders.get(name, []), label)
        print(f"--- {label}: {'equivalent' if len(failures) == before else 'DIFFERENT'}")

    # The kustomize overlay for TLS + basic auth: valid, HTTPS probes without credentials, the
    # web config from a mounted Secret, the example file's paths under that mount.
    label = "overlays/web-config/"
    r = subprocess.run([a.kubectl, "kustomize", os.path.join(ROOT, "overlays", "web-config")], capture_output=True, text=True)
    if check(r.returncode == 0, f"kubectl kustomize {label}: {r.stderr}"):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as tmp:
            tmp.write(r.stdout)
            tmp.flush()
            check(validate_manifests.main(tmp.name) == 0, f"{label}: render fails validation")
        docs = docs_of(r.stdout)
        before = len(failures)
        try:
            probes_https(docs, label)
            path = env(docs)["DCGM_EXPORTER_WEB_CONFIG_FILE"]["value"]
            m = [m for m in container(docs)["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
            check(len(m) == 1 and "secret" in by_name(pod(docs)["volumes"])[m[0]["name"]], f"{label}: {path} not from a Secret mount")
            with open(os.path.join(ROOT, "overlays", "web-config", "web-config.yaml.example")) as f:
                example = yaml.safe_load(f)
            for k, v in example["tls_server_config"].items():
                check(v.startswith(m[0]["mountPath"] + "/"), f"{label}: web-config.yaml.example {k} {v} is not in the Secret mount")
            ep = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
            check(ep["scheme"] == "https" and set(ep["basicAuth"]) == {"username", "password"}, f"{label}: ServiceMonitor {ep}")
        except (KeyError, AssertionError, TypeError, IndexError) as e:
            failures.append(f"{label}: {type(e).__name__}: {e}")
        print(f"--- {label}: {'HTTPS probes, web config mounted' if len(failures) == before else 'WRONG'}")

    # TLS with the generated certificate and nothing else set: Prometheus verifies it against the
    # generated CA under a name the certificate carries.
    label = "--set tlsServerConfig.enabled=true"
    text = helm_template(a.helm, sets=["tlsServerConfig.enabled=true"])
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as tmp:
        tmp.write(text)
        tmp.flush()
        check(validate_manifests.main(tmp.name, {"DaemonSet", "Secret"}) == 0, f"{label}: render fails validation")
    docs = docs_of(text)
    try:
        probes_https(docs, label)
        tc = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"]
        secret = one(docs, "Secret", tc["ca"]["secret"]["name"])
        check(tc["ca"]["secret"]["key"] in secret["data"], f"{label}: the ServiceMonitor's CA key is not in {secret['metadata']['name']}")
        cert = base64.b64decode(secret["data"]["tls.crt"])
        r = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"], input=cert, capture_output=True)
        check(r.returncode == 0 and f"DNS:{tc['serverName']}".encode() in r.stdout,
              f"{label}: serverName {tc['serverName']} is not in the certificate's names: {r.stdout!r} {r.stderr!r}")
        ca = base64.b64decode(secret["data"][tc["ca"]["secret"]["key"]])
        with tempfile.NamedTemporaryFile("wb", suffix=".pem") as caf, tempfile.NamedTemporaryFile("wb", suffix=".pem") as cf:
            caf.write(ca)
            caf.flush()
            cf.write(cert)
            cf.flush()
            r = subprocess.run(["openssl", "verify", "-CAfile", caf.name, cf.name], capture_output=True, text=True)
            check(r.returncode == 0, f"{label}: the certificate does not verify against the CA: {r.stdout}{r.stderr}")
        print(f"--- {label}: the ServiceMonitor verifies the generated certificate")
    except (KeyError, AssertionError, TypeError, IndexError, FileNotFoundError) as e:
        failures.append(f"{label}: {type(e).__name__}: {e}")

    for sets, must_name in MUST_FAIL:
        r = helm_template(a.helm, sets=sets, expect_fail=True)
        check(r.returncode != 0 and must_name in r.stderr,
              f"helm template --set {','.join(sets)} must fail naming {must_name}: rc {r.returncode} {r.stderr.strip()}")
    print(f"--- {len(MUST_FAIL)} invalid value sets refused with a message naming the value")

    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    print(f"{'FAILED' if failures else 'ok'}: {len(files)} values files, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
