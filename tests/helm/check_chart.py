#!/usr/bin/env python3
"""Renders the Helm chart over tests/helm/values-*.yaml and checks every render.

    python3 tests/helm/check_chart.py --helm HELM --kubectl KUBECTL

For each values file: `helm template` (release gpu-exporter, namespace gpu-exporter), every
document validated by scripts/validate-manifests.py (kubernetes-validate, strict, oldest and
newest schema; own schemas for ServiceMonitor and PrometheusRule), then what that values file is
about is asserted (probes, web config, mounts, ...). The values-upstream-*.yaml files are
dcgm-exporter chart files as users have them (upstream 4.8.2's defaults, a typical 4.8.x override
file, a newer-chart file with its own ConfigMap): each render's volumes must resolve to objects the
chart renders or the user names, its args must be the file's `arguments`, the CSV the container
reads at the path its args name must be the file's customMetrics (or the chart's default, or the
user's ConfigMap), and selectors, tolerations, node selector and ServiceMonitor relabelings must
mean what they meant upstream (upstream_shape() below). Then the chart rendered with
tests/helm/kustomize-base.yaml is compared with `kubectl kustomize deploy/`, and with
values-process-usage.yaml on top with overlays/process-usage/ ("equivalent" is defined in
equivalent() below), and overlays/web-config/ (TLS + basic auth) is rendered, validated and
checked for HTTPS probes. Values that must make `helm template` fail (a missing certificate, a
headless NodePort Service) are checked to fail with a message naming the value.
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
    for v in ([values] if isinstance(values, str) else values or []):
        cmd += ["-f", v]
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
    kustomize's (the chart adds app.kubernetes.io/instance etc.), the chart's checksum/*
    annotations (its equivalent of the hash suffix) and the container's name (the chart's is
    upstream's `exporter`, checked by case_defaults)."""
    spec = copy.deepcopy(tpl["spec"])
    for c in spec["containers"]:
        c.pop("name", None)
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


UPSTREAM_TOLERATIONS = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]
CHART_RELABELINGS = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
                     {"action": "labeldrop", "regex": "pod|namespace|container|service|endpoint"}]
EXPORTED_COPIES = [{"sourceLabels": [n], "targetLabel": f"exported_{n}"} for n in ("pod", "namespace", "container")]


def case_defaults(docs, label):
    """An empty values file: upstream 4.8.2's defaults where the meaning is the same."""
    probes_plain(docs, label)
    c, p, ds = container(docs), pod(docs), one(docs, "DaemonSet")
    check(c["name"] == "exporter", f"{label}: container name {c['name']}, upstream's is exporter")
    check(c["args"] == ["-f", "/etc/dcgm-exporter/default-counters.csv"], f"{label}: args {c['args']}")
    check("nodeSelector" not in p, f"{label}: a default nodeSelector {p.get('nodeSelector')} (upstream: none)")
    check(p["tolerations"] == UPSTREAM_TOLERATIONS, f"{label}: tolerations {p['tolerations']}")
    check(p["automountServiceAccountToken"] is False and not [d for d in docs if d["kind"].startswith("ClusterRole")],
          f"{label}: no token, no RBAC without pod labels")
    check(ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}, f"{label}: rollingUpdate")
    svc = one(docs, "Service")["spec"]
    check("clusterIP" not in svc and svc["type"] == "ClusterIP" and svc["internalTrafficPolicy"] == "Cluster",
          f"{label}: Service {svc}")
    ep = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    check(ep["honorLabels"] is False and ep["relabelings"] == CHART_RELABELINGS and ep["metricRelabelings"] == EXPORTED_COPIES,
          f"{label}: ServiceMonitor {ep}")
    # The CSV the default args read is the chart's default, in upstream's ConfigMap and key.
    with open(os.path.join(CHART, "files", "default-counters.csv")) as f:
        default_csv = f.read()
    text, source = csv_read(docs, {}, label)
    check(source == "ConfigMap exporter-metrics-config-map key metrics", f"{label}: the CSV comes from {source}")
    check(text is not None and text.strip() == default_csv.strip(), f"{label}: the CSV read is not files/default-counters.csv")
    check("DCGM_EXPORTER_WEB_CONFIG_FILE" not in env(docs), f"{label}: no web config by default")
    check(not [d for d in docs if d["kind"] in ("Secret", "NetworkPolicy")], f"{label}: no Secret/NetworkPolicy by default")
    check(not [d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]],
          f"{label}: dashboards are off by default")


def case_operator(docs, label):
    probes_plain(docs, label)
    c, e, p = container(docs), env(docs), pod(docs)
    check(c["image"] == "registry.example.com/gpu-exporter:0.1.0@sha256:" + "0123456789abcdef" * 4, f"{label}: image {c['image']}")
    check(c["args"] == ["-f", "/etc/dcgm-exporter/dcgm-metrics.csv", "--dump-enabled", "--dump-directory=/tmp/dcgm-exporter-debug",
                        "--dump-retention=24", "--dump-compression"], f"{label}: args {c['args']}")
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
    check(ep["interval"] == "15s" and ep["honorLabels"] is False and ep["relabelings"] == CHART_RELABELINGS
          and ep["metricRelabelings"] == EXPORTED_COPIES + [{"action": "labeldrop", "regex": "DCGM_FI_DRIVER_VERSION"}],
          f"{label}: ServiceMonitor {ep}")
    svc = one(docs, "Service")["spec"]
    check("clusterIP" not in svc and svc["internalTrafficPolicy"] == "Local", f"{label}: Service {svc}")
    check(not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "exporter-metrics-config-map"],
          f"{label}: exporter-metrics-config-map rendered though nothing names it")
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
        # exporter-metrics-config-map: upstream's fixed name, which upstream-shaped values mount.
        check(d["metadata"]["name"].startswith("gpu-metrics") or d["metadata"]["name"] == "exporter-metrics-config-map",
              f"{label}: {d['kind']}/{d['metadata']['name']} ignores fullnameOverride")
    check(one(docs, "ServiceMonitor")["spec"]["namespaceSelector"]["matchNames"] == ["monitoring"], f"{label}: ServiceMonitor namespace")


# ---------------------------------------------------------------- upstream-shaped values files

USER_OBJECTS = os.path.join(VALUES_DIR, "objects-team-gpu-metrics.yaml")


def user_objects():
    """Objects a values file names that the user creates outside the chart."""
    with open(USER_OBJECTS) as f:
        return {(d["kind"], d["metadata"]["name"]): d for d in docs_of(f.read())}


def objects_of(docs):
    out = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    for k, d in user_objects().items():
        check(k not in out, f"the chart renders {k}, which the user's file creates")
        out.setdefault(k, d)
    return out


def volumes_resolve(docs, values, label):
    """Every volume of the pod names an object the chart renders or the user creates (or an
    existingSecret), every key it picks exists there, and every mount names a volume and a
    subPath that volume has. Returns {volume name: {file name in the volume: text}}."""
    objs, files = objects_of(docs), {}
    existing = (values.get("tlsServerConfig") or {}).get("existingSecret")
    for v in pod(docs).get("volumes", []):
        name = v["name"]
        if "configMap" in v:
            cm = objs.get(("ConfigMap", v["configMap"]["name"]))
            if not check(cm is not None, f"{label}: volume {name} names ConfigMap {v['configMap']['name']}, "
                         "which neither the chart renders nor the user creates"):
                continue
            data = cm.get("data") or {}
            items = v["configMap"].get("items")
            for i in items or []:
                check(i["key"] in data, f"{label}: volume {name} picks key {i['key']} that ConfigMap {cm['metadata']['name']} lacks")
            files[name] = {i["path"]: data.get(i["key"]) for i in items} if items else dict(data)
        elif "secret" in v:
            sec = objs.get(("Secret", v["secret"]["secretName"]))
            check(sec is not None or v["secret"]["secretName"] == existing,
                  f"{label}: volume {name} names Secret {v['secret']['secretName']}, not rendered nor existingSecret")
            files[name] = {}
        else:
            check("hostPath" in v, f"{label}: volume {name} is neither a ConfigMap, a Secret nor a hostPath: {v}")
    vols = by_name(pod(docs).get("volumes"))
    for m in container(docs).get("volumeMounts", []):
        if not check(m["name"] in vols, f"{label}: mount {m['mountPath']} names no volume ({m['name']})"):
            continue
        if "subPath" in m and m["name"] in files and files[m["name"]]:
            check(m["subPath"] in files[m["name"]], f"{label}: mount {m['mountPath']} subPath {m['subPath']} is not in volume {m['name']}")
    return files


def csv_path(c):
    """The metrics CSV the exporter reads: -f/--collectors (last one wins), else
    DCGM_EXPORTER_COLLECTORS, else upstream's default path."""
    path, args = None, [str(a) for a in c.get("args", [])]
    for i, a in enumerate(args):
        if a in ("-f", "--collectors") and i + 1 < len(args):
            path = args[i + 1]
        elif a.startswith("--collectors=") or a.startswith("-f="):
            path = a.split("=", 1)[1]
    if path is None:
        e = by_name(c.get("env"))
        path = e.get("DCGM_EXPORTER_COLLECTORS", {}).get("value") or "/etc/dcgm-exporter/default-counters.csv"
    return path


def csv_read(docs, values, label):
    """(text, source) of the CSV file at the path the container's args name, through its mounts:
    a subPath mount of that very file, or a directory mount above it. (None, why) when no mount
    provides it (the image's own file would be read)."""
    c, files = container(docs), volumes_resolve(docs, values, label)
    path = csv_path(c)
    vols = by_name(pod(docs).get("volumes"))
    for m in c.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if m.get("subPath"):
            if path == mp:
                return files.get(m["name"], {}).get(m["subPath"]), source_of(vols[m["name"]], m["subPath"])
        elif path.startswith(mp + "/"):
            rel = path[len(mp) + 1:]
            return files.get(m["name"], {}).get(rel), source_of(vols[m["name"]], rel)
    return None, f"no mount (the image's {path})"


def source_of(vol, fname):
    if "configMap" not in vol:
        return f"volume {vol['name']}"
    key = {i["path"]: i["key"] for i in vol["configMap"].get("items") or []}.get(fname, fname)
    return f"ConfigMap {vol['configMap']['name']} key {key}"


def upstream_shape(docs, values, label):
    """What a dcgm-exporter chart values file means, asserted on our chart's render of it."""
    c, p, ds = container(docs), pod(docs), one(docs, "DaemonSet")
    check(c["name"] == "exporter", f"{label}: container {c['name']}")
    # Args: the file's arguments, then upstream's --dump-* flags when debugDump.enabled.
    dump = values.get("debugDump") or {}
    want = [str(a) for a in values.get("arguments", ["-f", "/etc/dcgm-exporter/default-counters.csv"])]
    if dump.get("enabled"):
        want += ["--dump-enabled", f"--dump-directory={dump.get('directory', '/tmp/dcgm-exporter-debug')}",
                 f"--dump-retention={dump.get('retention', 24)}"] + (["--dump-compression"] if dump.get("compression", True) else [])
    check(c.get("args") == want, f"{label}: args {c.get('args')}, want {want}")
    # Env: the file's extraEnv, as given, after the chart's.
    extra = values.get("extraEnv") or []
    check(c["env"][len(c["env"]) - len(extra):] == extra, f"{label}: extraEnv not at the end of env as given")
    # The CSV read at the path the args name.
    text, source = csv_read(docs, values, label)
    if values.get("customMetrics"):
        check(text is not None and text.strip() == values["customMetrics"].strip(),
              f"{label}: the container reads {csv_path(c)} from {source}, not customMetrics")
    elif text is None:
        check(False, f"{label}: the container reads {csv_path(c)}: {source}")
    # Scheduling exactly as given.
    check(p.get("nodeSelector", {}) == values.get("nodeSelector", {}), f"{label}: nodeSelector {p.get('nodeSelector')}")
    check(p.get("tolerations") == values.get("tolerations", UPSTREAM_TOLERATIONS), f"{label}: tolerations {p.get('tolerations')}")
    if "resources" in values:
        check(c["resources"] == values["resources"], f"{label}: resources {c['resources']}")
    if "rollingUpdate" in values:
        check(ds["spec"]["updateStrategy"]["rollingUpdate"] == values["rollingUpdate"], f"{label}: rollingUpdate")
    check(p.get("hostNetwork", False) == values.get("hostNetwork", False), f"{label}: hostNetwork")
    if values.get("hostNetwork"):
        check(p.get("dnsPolicy") == "ClusterFirstWithHostNet", f"{label}: dnsPolicy with hostNetwork")
    anns = ds["spec"]["template"]["metadata"].get("annotations", {})
    check(subset(values.get("podAnnotations"), anns), f"{label}: podAnnotations {anns}")
    # Selectors: upstream's three labels, the same on the DaemonSet, its pods, the Service and the
    # ServiceMonitor.
    sel = ds["spec"]["selector"]["matchLabels"]
    check(sorted(sel) == ["app.kubernetes.io/component", "app.kubernetes.io/instance", "app.kubernetes.io/name"],
          f"{label}: selector labels {sorted(sel)}")
    check(subset(sel, ds["spec"]["template"]["metadata"]["labels"]), f"{label}: the selector does not select the pods")
    svc_values = {"enable": True, "type": "ClusterIP", "port": 9400, **(values.get("service") or {})}
    if svc_values["enable"]:
        svc = one(docs, "Service")
        check(svc["spec"]["selector"] == sel, f"{label}: Service selector {svc['spec']['selector']}")
        check(svc["spec"]["type"] == svc_values["type"] and svc["spec"]["ports"][0]["port"] == svc_values["port"],
              f"{label}: Service type/port {svc['spec']}")
        if svc_values["type"] != "ClusterIP":
            check(svc["spec"].get("clusterIP") in (None, ""), f"{label}: clusterIP {svc['spec'].get('clusterIP')} with {svc_values['type']}")
        check(subset(svc_values.get("annotations"), svc["metadata"].get("annotations", {})), f"{label}: Service annotations")
    sm_values = {"enabled": True, **(values.get("serviceMonitor") or {})}
    if sm_values["enabled"]:
        sm = one(docs, "ServiceMonitor")
        check(subset(sm["spec"]["selector"]["matchLabels"], one(docs, "Service")["metadata"]["labels"]),
              f"{label}: the ServiceMonitor does not select the Service")
        check(subset(sm_values.get("additionalLabels"), sm["metadata"]["labels"]), f"{label}: ServiceMonitor labels")
        ep = sm["spec"]["endpoints"][0]
        check(ep["honorLabels"] is bool(sm_values.get("honorLabels", False)), f"{label}: honorLabels {ep['honorLabels']}")
        check(ep["relabelings"] == CHART_RELABELINGS + (sm_values.get("relabelings") or []),
              f"{label}: relabelings are not the chart's own followed by the file's: {ep['relabelings']}")
        check(ep.get("metricRelabelings", []) == EXPORTED_COPIES + (sm_values.get("metricRelabelings") or []),
              f"{label}: metricRelabelings {ep.get('metricRelabelings')}")
        if "interval" in sm_values:
            check(ep["interval"] == sm_values["interval"], f"{label}: interval {ep['interval']}")
    # kubernetes.*: the env upstream's chart sets, and its RBAC under its condition.
    k = values.get("kubernetes") or {}
    e = env(docs)
    for key, var in (("enablePodLabels", "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"), ("enablePodUID", "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID")):
        check((var in e) == bool(k.get(key)), f"{label}: kubernetes.{key} {k.get(key)} but {var} {'set' if var in e else 'unset'}")
    if k.get("podLabelAllowlistRegex"):
        check(e["DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"]["value"] == ",".join(k["podLabelAllowlistRegex"]), f"{label}: allowlist")
    rbac = bool((k.get("rbac") or {}).get("create", True) and (k.get("enablePodLabels") or k.get("enablePodUID")))
    roles = [d for d in docs if d["kind"] == "ClusterRole"]
    binds = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    check(len(roles) == len(binds) == int(rbac), f"{label}: kubernetes.rbac.create: {len(roles)} ClusterRoles, {len(binds)} bindings, want {int(rbac)}")
    if rbac and roles and binds:
        check(roles[0]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}], f"{label}: ClusterRole rules")
        check(binds[0]["roleRef"]["name"] == roles[0]["metadata"]["name"]
              and binds[0]["subjects"] == [{"kind": "ServiceAccount", "name": p["serviceAccountName"], "namespace": NAMESPACE}],
              f"{label}: ClusterRoleBinding {binds[0]}")
    token = rbac or bool((values.get("serviceAccount") or {}).get("automountServiceAccountToken"))
    check(p["automountServiceAccountToken"] is token, f"{label}: automountServiceAccountToken {p['automountServiceAccountToken']}, want {token}")
    return c, p, e


def case_upstream_defaults(docs, label):
    with open(os.path.join(VALUES_DIR, "values-upstream-defaults.yaml")) as f:
        values = yaml.safe_load(f)
    c, p, e = upstream_shape(docs, values, label)
    check(c["livenessProbe"]["initialDelaySeconds"] == 45 and c["livenessProbe"]["periodSeconds"] == 5, f"{label}: probe delays")
    check(c["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"], f"{label}: securityContext from the file")
    check("KUBERNETES_ENABLE_DRA" not in e, f"{label}: kubernetesDRA.enabled false")
    # customMetrics unset: the chart's default CSV in upstream's ConfigMap.
    text, source = csv_read(docs, values, label)
    with open(os.path.join(CHART, "files", "default-counters.csv")) as f:
        check(text is not None and text.strip() == f.read().strip() and source == "ConfigMap exporter-metrics-config-map key metrics",
              f"{label}: the CSV read comes from {source}")


def case_upstream_user(docs, label):
    with open(os.path.join(VALUES_DIR, "values-upstream-user.yaml")) as f:
        values = yaml.safe_load(f)
    upstream_shape(docs, values, label)
    check(csv_read(docs, values, label)[1] == "ConfigMap exporter-metrics-config-map key metrics", f"{label}: CSV source")


def case_upstream_newer(docs, label):
    with open(os.path.join(VALUES_DIR, "values-upstream-newer.yaml")) as f:
        values = yaml.safe_load(f)
    c, p, e = upstream_shape(docs, values, label)
    text, source = csv_read(docs, values, label)
    check(source == "ConfigMap team-gpu-metrics key metrics.csv"
          and text == user_objects()[("ConfigMap", "team-gpu-metrics")]["data"]["metrics.csv"], f"{label}: CSV from {source}")
    check(not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] in ("exporter-metrics-config-map", "team-gpu-metrics")],
          f"{label}: the chart renders a metrics ConfigMap nothing names, or the user's own")
    check(c["image"].endswith("@" + values["image"]["digest"]), f"{label}: image.digest")
    check(one(docs, "NetworkPolicy")["spec"]["ingress"][0]["from"] == values["networkPolicy"]["from"], f"{label}: networkPolicy.from")
    check("DCGM_EXPORTER_CONFIG_FILE" in e, f"{label}: config.enabled")
    check(not [v for v in p["volumes"] if v["name"] == "debug-dumps" or "dcgm-exporter-debug" in json.dumps(v)],
          f"{label}: no host directory for dumps that are never written")


def case_configmap_data(docs, label):
    """`-m NAMESPACE:NAME`: get on that ConfigMap only, in its namespace; pods for labels/UIDs."""
    probes_plain(docs, label)
    c, p = container(docs), pod(docs)
    check(c["args"] == ["-m", "gpu-exporter:exporter-metrics-config-map"], f"{label}: args {c['args']}")
    role = one(docs, "Role")
    check(role["metadata"]["namespace"] == NAMESPACE
          and role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                                 "resourceNames": ["exporter-metrics-config-map"], "verbs": ["get"]}],
          f"{label}: Role {role}")
    bind = one(docs, "RoleBinding")
    check(bind["metadata"]["namespace"] == NAMESPACE and bind["roleRef"]["name"] == role["metadata"]["name"]
          and bind["subjects"] == [{"kind": "ServiceAccount", "name": p["serviceAccountName"], "namespace": NAMESPACE}],
          f"{label}: RoleBinding {bind}")
    check(one(docs, "ClusterRole")["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
          f"{label}: ClusterRole for pods")
    check(p["automountServiceAccountToken"] is True, f"{label}: the token is mounted")
    check("NODE_NAME" in env(docs), f"{label}: NODE_NAME scopes the pod watch to the node")


CASES = {
    "configmap-data": case_configmap_data,
    "defaults": case_defaults,
    "operator": case_operator,
    "tls-basic-auth": case_tls_basic_auth,
    "mtls-existing-secret": case_mtls_existing_secret,
    "process-usage": case_process_usage,
    "dra": case_dra,
    "non-root": case_non_root,
    "ipv6": case_ipv6,
    "upstream-defaults": case_upstream_defaults,
    "upstream-user": case_upstream_user,
    "upstream-newer": case_upstream_newer,
}

MUST_FAIL = [
    (["tlsServerConfig.enabled=true", "tlsServerConfig.autoGenerated=false"], "tlsServerConfig.cert"),
    (["tlsServerConfig.enabled=true", "tlsServerConfig.autoGenerated=false", "tlsServerConfig.cert=C",
      "tlsServerConfig.key=K", "tlsServerConfig.clientAuthType=RequireAndVerifyClientCert"], "tlsServerConfig.ca"),
    (["service.type=NodePort", "service.clusterIP=None"], "service.clusterIP"),
    (["service.type=LoadBalancer", "service.clusterIP=None"], "service.clusterIP"),
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

    base = os.path.join(VALUES_DIR, "kustomize-base.yaml")
    for label, kdir, values in (("deploy/ vs kustomize-base.yaml", "deploy", [base]),
                                ("overlays/process-usage/ vs kustomize-base.yaml + values-process-usage.yaml",
                                 "overlays/process-usage", [base, os.path.join(VALUES_DIR, "values-process-usage.yaml")])):
        r = subprocess.run([a.kubectl, "kustomize", os.path.join(ROOT, kdir)], capture_output=True, text=True)
        if not check(r.returncode == 0, f"kubectl kustomize {kdir}: {r.stderr}"):
            continue
        text = helm_template(a.helm, values)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as tmp:
            tmp.write(text)
            tmp.flush()
            check(validate_manifests.main(tmp.name, {"DaemonSet", "ConfigMap"}) == 0, f"{label}: render fails validation")
        before = len(failures)
        equivalent(docs_of(r.stdout), docs_of(text), label)
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
