#!/usr/bin/env python3
"""Runs the real exporter as the chart's rendered DaemonSet would run it, and probes it as the
kubelet does.

    python3 tests/helm/probe_e2e.py --helm HELM --bin target/release/gpu-exporter

For each case (chart defaults; TLS alone; TLS + basic auth; dcgm-exporter chart values files as
users have them: upstream 4.8.2's defaults, a typical 4.8.x override file with customMetrics and
-n, a newer-chart file mounting the user's own ConfigMap): `helm template`, then every ConfigMap
and Secret the container mounts (the chart's, or the user's own from tests/helm/objects-*.yaml)
is written to a temporary directory standing in for its mountPath, honouring `items` and
`subPath` (paths in args, env and the web config are mapped the same way, as the kubelet's mounts
would make them); a volume naming an object nobody creates fails the case, as the pod would
never start. The exporter is started with the container's args and env (plus `--backend sim`,
127.0.0.1:0 instead of the rendered listen address so traffic stays on loopback, and a runtime
socket path that does not exist). Then:
- each rendered probe (readiness, liveness) is sent as the kubelet sends it: an HTTP(S) GET of its
  path and scheme, no credentials, no certificate verification; it must answer 200 (readiness
  within a deadline: /ready is 503 until the first sample);
- with basic auth, /metrics must answer 401 without credentials and with a wrong password, and 200
  with each user's password from the values file: the chart's bcrypt hashes (helm's htpasswd) and
  generated certificate (genSignedCert) work with the exporter;
- with TLS, plain HTTP must not get a metrics page;
- for the upstream-shaped files, the DCGM_FI_* families served must be exactly those of the CSV
  the values file means (customMetrics, the user's ConfigMap), or a subset of the chart's default
  with DCGM_FI_DEV_GPU_UTIL among them; with -n no series has a hostname label.
Exits 1 naming each failed check.
"""

import argparse
import base64
import http.client
import os
import pathlib
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import harness  # noqa: E402

CHART = ROOT / "deploy" / "helm" / "gpu-exporter"
log = harness.make_log("probe-e2e")

VALUES = ROOT / "tests" / "helm"


def csv_fields(text):
    return {line.split(",")[0].strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")}


def user_cm(name, key):
    docs = [d for d in yaml.safe_load_all((VALUES / "objects-team-gpu-metrics.yaml").read_text()) if d]
    return next(d for d in docs if d["metadata"]["name"] == name)["data"][key]


# name, helm args, basic-auth users (None: the values file's), the DCGM_FI_* families /metrics
# must serve: "exactly" a set, or "within" a set and including "must".
CASES = [
    ("defaults", [], {}, None),
    ("tls", ["--set", "tlsServerConfig.enabled=true"], {}, None),
    ("tls-basic-auth", ["-f", str(VALUES / "values-tls-basic-auth.yaml")], None, None),
    ("upstream-defaults", ["-f", str(VALUES / "values-upstream-defaults.yaml")], {},
     lambda: {"within": csv_fields((ROOT / "deploy" / "helm" / "gpu-exporter" / "files" / "default-counters.csv").read_text()),
              "must": {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}}),
    ("upstream-user", ["-f", str(VALUES / "values-upstream-user.yaml")], {},
     lambda: {"exactly": csv_fields(yaml.safe_load((VALUES / "values-upstream-user.yaml").read_text())["customMetrics"]),
              "no_hostname": True}),
    ("upstream-newer", ["-f", str(VALUES / "values-upstream-newer.yaml")], {},
     lambda: {"exactly": csv_fields(user_cm("team-gpu-metrics", "metrics.csv"))}),
]


def render(helm, args):
    r = subprocess.run([helm, "template", "gpu-exporter", str(CHART), "-n", "gpu-exporter", *args],
                       capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def write_volumes(docs, root, user_objects=True):
    """Writes each ConfigMap/Secret volume the DaemonSet's first container mounts under root (the
    chart's objects and, with user_objects, the user's own from tests/helm/objects-*.yaml),
    honouring `items` and `subPath`; raises harness.Failure for a volume naming an object nobody
    creates or a key it lacks. Returns the pod spec, the container, and its mounts as (mountPath, host path written,
    read-only, None) for ConfigMaps/Secrets, and (mountPath, None, read-only, the node's path) for
    hostPath volumes, left to the caller."""
    ds = next((d for d in docs if d["kind"] == "DaemonSet"), None)
    if ds is None:
        raise harness.Failure("the render has no DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    objects = {}
    for f in sorted(VALUES.glob("objects-*.yaml")) if user_objects else []:
        objects.update({(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(f.read_text()) if d})
    objects.update({(d["kind"], d["metadata"]["name"]): d for d in docs})
    mounts = []
    for n, m in enumerate(c.get("volumeMounts", [])):
        v = volumes.get(m["name"])
        if v is None:
            raise harness.Failure(f"volumeMount {m['mountPath']} names volume {m['name']}, which the pod does not have")
        if "configMap" in v:
            want = ("ConfigMap", v["configMap"]["name"])
            obj = objects.get(want)
            files = dict(obj["data"]) if obj else None
            items = v["configMap"].get("items")
            if files is not None and items:
                missing = [i["key"] for i in items if i["key"] not in files]
                if missing:
                    raise harness.Failure(f"volume {m['name']}: ConfigMap {v['configMap']['name']} lacks keys {missing}")
                files = {i["path"]: files[i["key"]] for i in items}
        elif "secret" in v:
            want = ("Secret", v["secret"]["secretName"])
            obj = objects.get(want)
            files = None
            if obj:
                files = {k: base64.b64decode(x) for k, x in (obj.get("data") or {}).items()}
                files.update(obj.get("stringData") or {})
        elif "hostPath" in v:
            mounts.append((m["mountPath"].rstrip("/"), None, bool(m.get("readOnly")), v["hostPath"]["path"]))
            continue
        else:
            raise harness.Failure(f"volume {m['name']}: a kind this test does not know: {sorted(v)}")
        if files is None:
            raise harness.Failure(f"volume {m['name']} names {want[0]} {want[1]}, which neither the chart renders nor the user creates: "
                                  "the pod would never start")
        d = root / f"{n}-{m['name']}"
        d.mkdir()
        for k, x in files.items():
            (d / k).write_bytes(x if isinstance(x, bytes) else x.encode())
        target = d
        if m.get("subPath"):
            target = d / m["subPath"]
            if not target.is_file():
                raise harness.Failure(f"mount {m['mountPath']}: subPath {m['subPath']} is not in volume {m['name']}")
        # ConfigMap and Secret volumes are always read-only in a pod.
        mounts.append((m["mountPath"].rstrip("/"), target, True, None))
    return spec, c, mounts


def materialize(docs, root):
    """write_volumes, for the exporter run as a plain process: returns the container and a
    function mapping an in-container path to the host path (hostPath volumes are not needed with
    --backend sim)."""
    _, c, all_mounts = write_volumes(docs, root)
    mounts = sorted(((mp, d) for mp, d, _, _ in all_mounts if d is not None), key=lambda t: -len(t[0]))
    dirs = {d if d.is_dir() else d.parent for _, d in mounts}

    def host(path):
        if path.startswith("-") and "=" in path:  # --flag=PATH
            flag, value = path.split("=", 1)
            return f"{flag}={host(value)}"
        for mp, d in mounts:
            if path == mp or path.startswith(mp + "/"):
                return str(d) + path[len(mp):]
        return path

    # The web config names the TLS files by their in-container paths: map them too.
    for d in dirs:
        for f in d.iterdir():
            text = f.read_bytes()
            for mp2, d2 in mounts:
                text = text.replace(f'"{mp2}/'.encode(), f'"{d2}/'.encode())
            f.write_bytes(text)
    return c, host


def fetch(url, auth=None, timeout=5):
    """(status, body) of a GET; TLS without verification, as the kubelet probes."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    headers = {}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx if url.startswith("https") else None) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def check_families(name, body, want, failures):
    """The DCGM_FI_* families /metrics serves against what the values file means; returns them."""
    served = set()
    hostnames = 0
    before = len(failures)
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("DCGM_FI_"):
            served.add(line.split("{")[0].split(" ")[0])
            hostnames += 'hostname="' in line or 'Hostname="' in line
    if "exactly" in want and served != want["exactly"]:
        failures.append(f"{name}: /metrics serves {sorted(served)}, want exactly the CSV's {sorted(want['exactly'])}")
    if "within" in want and not (served <= want["within"] and want["must"] <= served):
        failures.append(f"{name}: /metrics serves {sorted(served)}: not within the chart's default CSV or lacking {sorted(want['must'])}")
    if want.get("no_hostname") and hostnames:
        failures.append(f"{name}: -n given, but {hostnames} DCGM_FI_* series carry a hostname label")
    if len(failures) == before:
        log(f"{name}: /metrics serves {len(served)} DCGM_FI_* families, as the values file's CSV says"
            + ("; no hostname label (-n)" if want.get("no_hostname") else ""))
    return served


def run_case(name, helm_args, users, want, binary, failures):
    docs = render(HELM, helm_args)
    with tempfile.TemporaryDirectory(prefix=f"probe-e2e-{name}-") as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "mounts").mkdir()
        c, host = materialize(docs, tmp / "mounts")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = host(e["value"])
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                env[e["name"]] = "node-1"
        env["DCGM_EXPORTER_LISTEN"] = "127.0.0.1:0"
        if "CONTAINER_RUNTIME_ENDPOINT" in env:  # pod labels on: never the host's real runtime
            env["CONTAINER_RUNTIME_ENDPOINT"] = f"unix://{tmp}/no-runtime.sock"
        env["DCGM_EXPORTER_INTERVAL"] = "1000"  # the first sample, and /ready, come quickly
        args = [host(a) for a in c.get("args", [])] + ["--backend", "sim"]
        procs = harness.Procs(tmp)
        # Not Procs.start(): only the container's environment, nothing inherited from this one.
        p = subprocess.Popen([binary, *args], stdout=open(tmp / "exporter.log", "wb"), stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        procs.procs["exporter"] = p
        try:
            port = harness.logged_port(procs, "exporter", r"listening .*address=127\.0\.0\.1:(\d+)", 30)
            for probe in ("livenessProbe", "readinessProbe"):
                g = c[probe]["httpGet"]
                scheme = g.get("scheme", "HTTP").lower()
                assert g["port"] == "metrics", g
                url = f"{scheme}://127.0.0.1:{port}{g['path']}"
                got = []

                def ok(url=url, got=got):
                    got[:] = [fetch(url)]
                    if got[0][0] not in (200, 503):  # 503: /ready before the first sample
                        raise harness.Failure(f"{name}: {probe} {url} without credentials answers "
                                              f"{got[0][0]} {got[0][1][:80]!r}, want 200")
                    return got[0][0] == 200
                try:
                    harness.wait_for(f"{name}: {probe} {url} to answer 200 without credentials", ok, 30, 0.2, retried=(OSError,))
                    log(f"{name}: {probe} {scheme.upper()} GET {g['path']} without credentials: 200")
                except harness.Failure as e:
                    failures.append(f"{e} (last: {got[0][0] if got else 'no answer'} {got[0][1][:80] if got else b''!r})")
            scheme = "https" if c["livenessProbe"]["httpGet"].get("scheme") == "HTTPS" else "http"
            metrics = f"{scheme}://127.0.0.1:{port}/metrics"
            if users:
                for u, pw in users.items():
                    s, _ = fetch(metrics, (u, pw))
                    if s != 200:
                        failures.append(f"{name}: /metrics with {u}'s password: {s}, want 200")
                    s, _ = fetch(metrics, (u, pw + "x"))
                    if s != 401:
                        failures.append(f"{name}: /metrics with a wrong password for {u}: {s}, want 401")
                s, _ = fetch(metrics)
                if s != 401:
                    failures.append(f"{name}: /metrics without credentials: {s}, want 401")
                log(f"{name}: /metrics 401 without or with wrong credentials, 200 with each of {sorted(users)}")
            else:
                s, body = fetch(metrics)
                if want is None and (s != 200 or b"DCGM_FI_DEV_GPU_UTIL" not in body):
                    failures.append(f"{name}: /metrics: {s}, want 200 with DCGM_FI_DEV_GPU_UTIL")
                elif want is not None:
                    if s != 200:
                        failures.append(f"{name}: /metrics: {s}, want 200")
                    check_families(name, body, want(), failures)
            if scheme == "https":
                try:
                    s, body = fetch(f"http://127.0.0.1:{port}/metrics")
                    if s == 200 and b"DCGM_FI" in body:
                        failures.append(f"{name}: plain HTTP got metrics from a TLS listener")
                except (OSError, http.client.HTTPException):
                    pass  # refused, reset, or TLS bytes that are no HTTP status line
                log(f"{name}: plain HTTP gets no metrics")
            procs.check_alive()
        except harness.Failure as e:
            failures.append(f"{name}: {e}")
        finally:
            procs.stop_all()
            if any(f.startswith(name) for f in failures):
                print(f"--- {name}: exporter log\n{(tmp / 'exporter.log').read_text(errors='replace')[-3000:]}", file=sys.stderr)


def main():
    global HELM
    ap = argparse.ArgumentParser()
    ap.add_argument("--helm", required=True)
    ap.add_argument("--bin", required=True)
    a = ap.parse_args()
    HELM = a.helm
    binary = shutil.which(a.bin) or os.path.abspath(a.bin)
    failures = []
    for name, helm_args, users, want in CASES:
        if users is None:
            with open(ROOT / "tests" / "helm" / "values-tls-basic-auth.yaml") as f:
                users = yaml.safe_load(f)["basicAuth"]["users"]
        run_case(name, helm_args, users, want, binary, failures)
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    print(f"{'FAILED' if failures else 'ok'}: {len(CASES)} renders run and probed, {len(failures)} failures")
    return 1 if failures else 0


HELM = None

if __name__ == "__main__":
    sys.exit(main())
