#!/usr/bin/env python3
"""The chart's rendered DaemonSet run as a real pod under containerd + runc, with dcgm-exporter
chart values files as users have them. Run by scripts/ci-image.sh (which builds and passes the
image archive and helm), as root:

    containerd_chart.py --helm HELM --image-tar IMG.tar --image localhost/gpu-exporter:TAG

For upstream 4.8.2's defaults, a typical 4.8.x user's override file (customMetrics, -n) and a
newer-chart file mounting the user's own ConfigMap (tests/helm/values-upstream-*.yaml, the cases
of probe_e2e.py): `helm template` with image.repository/image.tag naming the imported image (and
no image.digest: the newer file's is made up), then the DaemonSet's first container is run in a
pod of a private containerd (tests/containerd/lab.py) as the kubelet would run it: its image
(the ENTRYPOINT is the exporter), its `args`, its env (`fieldRef: spec.nodeName` resolved to a
fixed node name), its volumeMounts: ConfigMap/Secret volumes written to host directories by
probe_e2e.write_volumes (items and subPath honoured, read-only; a volume naming an object nobody
creates fails the case, as the pod would never start) and hostPath volumes pointed at empty
temporary directories (no kubelet pod-resources socket, no container runtime socket: the
exporter degrades without them). What differs from a node, on purpose: `--backend sim` is
appended (no GPU), DCGM_EXPORTER_LISTEN is 127.0.0.1:<free port> and DCGM_EXPORTER_INTERVAL 1000
(the first sample, and /ready, come quickly), and the pod is always on the host network (the lab
has no CNI); the container's securityContext and resources are not applied. Then the rendered
readiness and liveness probes must answer 200 within a deadline, and /metrics, scraped over HTTP,
must serve exactly the DCGM_FI_* families of the CSV the values file means (probe_e2e's
expectations: customMetrics, the user's ConfigMap, the chart's default CSV mounted over the
image's with subPath). Exits 1 naming each failed check; the lab is always cleaned up.
"""

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "helm"))
sys.path.insert(0, str(ROOT / "tests" / "containerd"))
import probe_e2e  # noqa: E402  (puts tests/ on the path: harness)
import harness  # noqa: E402
from lab import Lab, LabError, free_port, http_get, probe, wait_for  # noqa: E402

NODE_NAME = "gpu-node-7"
# What the image ships at upstream's default -f path: dcgm-exporter's own CSV, byte for byte.
IMAGE_CSV_PATH = "/etc/dcgm-exporter/default-counters.csv"
IMAGE_CSV = probe_e2e.csv_fields((ROOT / "metrics-config" / "upstream" / "default-counters.csv").read_text())
PATIENCE = 60.0
log = harness.make_log("containerd-chart")


def pod_env(c, port):
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[e["name"]] = NODE_NAME
        else:
            raise harness.Failure(f"env {e['name']}: {e.get('valueFrom')} is not something this test resolves")
    # Loopback only, on a port free here: the lab's pods share the host's network.
    env["DCGM_EXPORTER_LISTEN"] = f"127.0.0.1:{port}"
    env["DCGM_EXPORTER_INTERVAL"] = "1000"
    return env


def run_case(lab, name, helm_args, want, repo, tag, failures):
    docs = probe_e2e.render(probe_e2e.HELM, [*helm_args, "--set", f"image.repository={repo}",
                                             "--set", f"image.tag={tag}", "--set", "image.digest="])
    vols = lab.dir / f"{name}-volumes"
    vols.mkdir()
    spec, c, written = probe_e2e.write_volumes(docs, vols)
    if c["image"] != f"{repo}:{tag}":
        raise harness.Failure(f"the container's image is {c['image']}, want the imported {repo}:{tag}")
    mounts = []
    for n, (mount_path, host, ro, node_path) in enumerate(written):
        if host is None:  # hostPath: an empty directory stands in for the node's
            host = lab.dir / f"{name}-hostpath-{n}"
            host.mkdir()
            log(f"{name}: hostPath {node_path} -> an empty directory at {mount_path}")
        mounts.append((str(host), mount_path, ro))
    port = free_port()
    args = [*c.get("args", []), "--backend", "sim"]
    pod = lab.run_pod(name, namespace="gpu-exporter", labels=ds_labels(docs))
    pod.run_container(c["name"], c["image"], args=args, env=pod_env(c, port), mounts=mounts)
    log(f"{name}: pod running {c['image']} with args {args}, {len(mounts)} mounts, on 127.0.0.1:{port}")

    def answers(path):
        def ok():
            if pod.state(c["name"]) == "CONTAINER_EXITED":
                raise harness.Failure(f"the exporter exited:\n{pod.log(c['name'])[-3000:]}")
            return probe(port, path)[0] == 200
        return ok

    try:
        for p in ("readinessProbe", "livenessProbe"):
            g = c[p]["httpGet"]
            if g.get("scheme", "HTTP") != "HTTP" or g["port"] != "metrics":
                raise harness.Failure(f"{p} {g}: this test sends plain HTTP to the metrics port")
            try:
                wait_for(answers(g["path"]), PATIENCE, f"{name}: {p} GET {g['path']} to answer 200")
            except LabError as e:
                raise harness.Failure(str(e)) from e
            log(f"{name}: {p} GET {g['path']}: 200")
        status, body = http_get("127.0.0.1", port, "/metrics")
        if status != 200:
            raise harness.Failure(f"/metrics answered {status}: {body[:300]}")
        w = want()
        served = probe_e2e.check_families(name, body.encode(), w, failures)
        if "within" in w and not served - IMAGE_CSV:
            # The chart's default CSV has rows upstream's lacks: had the image's own file at the
            # args' path been read, none of them would be served.
            failures.append(f"{name}: /metrics serves only families of the image's own {IMAGE_CSV_PATH}, "
                            "not the chart's ConfigMap mounted over it (subPath)")
        if pod.state(c["name"]) != "CONTAINER_RUNNING":
            raise harness.Failure(f"the container is {pod.state(c['name'])} after the scrape")
    except harness.Failure as e:
        failures.append(f"{name}: {e}")
    if any(f.startswith(name) for f in failures):
        print(f"--- {name}: container log\n{pod.log(c['name'])[-3000:]}", file=sys.stderr)
    pod.remove()


def check_missing_object_fails(lab, failures):
    """A volume naming an object nobody creates fails the case, before any pod: the newer-chart
    file without the user's own ConfigMap (tests/helm/objects-team-gpu-metrics.yaml)."""
    name, helm_args, _, _ = next(c for c in probe_e2e.CASES if c[0] == "upstream-newer")
    d = lab.dir / "missing-object"
    d.mkdir()
    try:
        probe_e2e.write_volumes(probe_e2e.render(probe_e2e.HELM, helm_args), d, user_objects=False)
        failures.append(f"{name} without the user's ConfigMap: its volumes were written, want a failure")
    except harness.Failure as e:
        if "ConfigMap team-gpu-metrics" not in str(e):
            failures.append(f"{name} without the user's ConfigMap: failed without naming it: {e}")
        else:
            log(f"{name} without the user's ConfigMap fails: {e}")


def ds_labels(docs):
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    return dict(ds["spec"]["template"]["metadata"].get("labels") or {})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--helm", required=True)
    ap.add_argument("--image-tar", required=True)
    ap.add_argument("--image", required=True, help="the archive's reference, REPOSITORY:TAG")
    a = ap.parse_args()
    repo, _, tag = a.image.rpartition(":")
    if not repo or "/" in tag:
        sys.exit(f"--image {a.image}: want REPOSITORY:TAG")
    probe_e2e.HELM = a.helm
    cases = [(n, h, w) for n, h, _, w in probe_e2e.CASES if n.startswith("upstream-")]
    failures = []
    lab = Lab(log=log)
    try:
        lab.start_containerd()
        lab.import_image(a.image_tar)
        check_missing_object_fails(lab, failures)
        for name, helm_args, want in cases:
            try:
                run_case(lab, name, helm_args, want, repo, tag, failures)
            except harness.Failure as e:
                failures.append(f"{name}: {e}")
    finally:
        problems = lab.cleanup()
    failures += [f"lab cleanup: {p}" for p in problems]
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    print(f"{'FAILED' if failures else 'ok'}: {len(cases)} chart renders run as containerd pods, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
