#!/usr/bin/env python3
"""End-to-end check of the alert rules and dashboards against a real Prometheus and Alertmanager.

Run through tests/e2e/run.sh (see tests/e2e/README.md). Standard library only. Everything listens
on 127.0.0.1; every wait has a deadline; every process started here is stopped on exit.

What it does:
1. Starts 21 gpu-exporter processes as simulated nodes (node-01..node-21: 8xH100-SXM, 4xA100-80GB-MIG
   and 1xA100-40GB profiles, `-c 1000`, NODE_NAME set). Scenario files script one fault per node on
   node-01..node-07: GPU off the bus, double-bit ECC, overheating, PCIe replays, NVLink errors, row
   remap failure, XID 119. node-08 is killed once it has been scraped (exporter down). node-21 runs
   the newest naming generation (dcgm-exporter 4.10's default set plus per-link NVLink fields), with
   four faults whose alerts read renamed series (XID 79, overheating, PCIe replays, row remap).
2. Pod labels: node-09 (8xH100-SXM) and node-10 (4xA100-80GB-MIG) run with `-k` against a
   fake-kubelet each (crates/gpu-exporter-testing/src/bin/fake-kubelet.rs, docs/pods.md). Their assignments (TOML, written
   here from the ids `gpu-exporter --list-devices` prints for the node's profile and seed) cover a
   whole GPU held by one pod, a MIG instance held by one pod (mixed-strategy resource name), a
   time-sliced GPU shared by two pods (`<uuid>::<n>`), and one idle GPU and one idle MIG instance
   held by pods (the idle GPU must raise GPUUnderutilized; the idle A100 MIG instance cannot, as it
   has no activity series without a DCGM source). Every other GPU a pod holds is kept busy.
   node-10 also has a whole GPU and a MIG instance allocated through DRA ResourceClaims (NVIDIA's
   DRA driver's device names, `--kubernetes-enable-dra`).
   HPC jobs: node-12 runs with `--hpc-job-mapping-dir`; one file names two jobs, one file is not
   UTF-8 (ignored and counted), and one file is written while the exporter runs.
3. Starts Alertmanager (webhook to a receiver in this process) and Prometheus (file_sd targets,
   2 s scrape/eval, the rules from alerts/ with every `for:` longer than 10 s rewritten to 10 s).
4. Asserts that exactly the expected alerts are pending/firing in Prometheus, active in
   Alertmanager and delivered to the receiver, no more and no fewer (healthy nodes stay silent).
5. Asserts the pod attribution through the Prometheus HTTP API: pod/namespace/container labels on
   the series of singly held GPUs and MIG instances (and on nothing else), no pod labels on the
   shared GPU, one gpu_exporter_gpu_pod_info series per holder (both replicas of the shared GPU),
   gpu_exporter_pod_resources_up == 1 and no unknown device ids on the pods nodes; the dra_*
   labels of the DRA-allocated GPU and MIG instance (and on nothing else), and no unresolved DRA
   device. Then the hpc_job labels: one copy per job, on exactly the GPUs whose files say so,
   the written-later file included, and the bad file counted.
6. Runs every dashboard query (variables filled in) and NVIDIA's dashboard 12239 queries through the
   Prometheus HTTP API and asserts each returns data, the pod-label queries included.

run.sh always passes --fake-kubelet. Run without it (python3 tests/e2e/e2e.py --binary BIN), no
node runs with `-k`, no GPUUnderutilized is expected and pod-label queries may come back empty.
"""

import argparse
import collections
import http.server
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import harness  # noqa: E402 (tests/harness.py)
from harness import Failure, free_port, http_get, wait_for  # noqa: E402

FOR_CAP_S = 10  # every `for:` longer than this is shortened to it (documented in README.md)

# Pods mode: which containers a node's fake kubelet says hold which GPU (`gpu`) or MIG instance
# (`gpu` and `gi`, its GPU_I_ID), through time-slicing replica `replica` when set. The scenario
# keeps every held GPU at BUSY_UTIL % (a MIG instance follows its GPU), so GPUUnderutilized stays
# quiet for it, except those held with busy=False: those idle at 0 % and must raise GPUUnderutilized.
# Per-process usage: the host PIDs each container runs on its device (`pids`, the sim runs them
# and the fake kubelet writes their cgroups into a fake host /proc and lists their containers on
# its fake CRI socket), their share of the device (`weight`), and the pod's labels.
# With `claim` the GPU or MIG instance is allocated through that DRA ResourceClaim (NVIDIA's DRA
# driver, gpu.nvidia.com) instead of the device plugin.
Holder = collections.namedtuple("Holder", "namespace pod container gpu gi replica busy pids weight labels claim",
                                defaults=(None, None, True, (), 1.0, None, None))
POD_HOLDERS = {
    "node-09": [  # 8xH100-SXM
        Holder("ml", "trainer-09", "main", gpu=0, pids=(9001,),           # a whole GPU, one pod
               labels={"app": "trainer", "team": "ml", "tier": "gold"}),
        Holder("infer", "embed-a", "server", gpu=1, replica=0, pids=(9101,), weight=3.0,  # GPU 1
               labels={"app": "embed", "team": "search"}),               # time-sliced, shared by
        Holder("infer", "embed-b", "server", gpu=1, replica=1, pids=(9102, 9103), weight=2.0,
               labels={"app": "embed", "team": "search"}),               # three pods, each using
        Holder("infer", "embed-c", "server", gpu=1, replica=2, pids=(9104,),  # its own share
               labels={"app": "embed", "team": "ranking"}),
        Holder("dev", "notebook-09", "jupyter", gpu=2, busy=False),     # held, idle, no process
    ],
    "node-10": [  # 4xA100-80GB-MIG
        Holder("batch", "etl-10", "worker", gpu=0, gi=2, pids=(10001, 10002),  # MIG 3g.40gb
               labels={"app": "etl"}),
        Holder("dev", "notebook-10", "jupyter", gpu=1, gi=0, busy=False),  # MIG 7g.80gb, idle
        Holder("ml", "dra-train-10", "main", gpu=3, claim="dra-train-10-gpu",  # DRA, whole GPU,
               pids=(10101,), labels={"app": "train", "team": "ml"}),        # its processes too
        Holder("batch", "dra-etl-10", "worker", gpu=2, gi=1, claim="dra-etl-10-mig",  # DRA, MIG 4g.40gb
               pids=(10201, 10202), labels={"app": "etl"}),
    ],
}
# Processes outside any pod (a host daemon): (pid, gpu) per node; the sim runs them on that GPU,
# which no pod holds, and the fake kubelet's /proc places them under a systemd unit. Accounting
# charges them as consumer="outside_pods" and GPUWorkOutsideAllocation must fire.
HOST_PROCESSES = {"node-09": [(9901, 3)]}
# Pods nodes whose GPUs are older than Hopper (A100): without a DCGM source they have no
# DCGM_FI_PROF_* series, so their MIG instances have no activity series and GPUUnderutilized
# cannot see an idle MIG instance there (as on a real A100 node read through NVML alone).
PRE_HOPPER = {"node-10"}
# Dashboard targets that can only have data from an idle MIG instance's engine activity: the only
# simulated MIG fleet is an A100 one (PRE_HOPPER), which has none without a DCGM source. They are
# reported as skipped, not passed; they must be empty (data there would mean the simulator serves
# profiling fields on an A100 again).
# How each pods node lays out cgroups in its fake /proc (another real-world form on each).
CGROUPS = {
    "node-09": {},  # the default: cgroup v2, systemd driver, containerd
    "node-10": {"cgroup_driver": "cgroupfs", "cgroup_version": 1, "runtime": "crio"},
}
# Pod labels copied onto series (--kubernetes-pod-label-allowlist-regex): `tier` is left out.
LABEL_ALLOWLIST = "^app$,^team$"
# The documented tolerance of summed per-container utilisation against the device's (docs/pods.md).
UTIL_TOLERANCE_PER_CONTAINER = 1
# HPC jobs (--hpc-job-mapping-dir) on node-12 (8xH100-SXM, no fault, no pods): files written before
# the exporter starts, a bad one (ignored), and one written once it runs (re-read on change).
HPC_NODE = "node-12"
HPC_FILES = {"0": b"slurm-1001\nslurm-1002\n", "3": b"\xff\xfe not text\n"}
HPC_LATER = {"1": b"slurm-2001\n"}
HPC_JOBS = {"0": ["slurm-1001", "slurm-1002"], "1": ["slurm-2001"]}
BUSY_UTIL = 60


def pod_uid(node, h):
    """A fixed pod UID per holder, written into the assignments and expected on the series."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpu-exporter-e2e/{node}/{h.namespace}/{h.pod}"))


# The panel proposed for the workloads dashboard ("GPU use per pod on shared GPUs"): each query,
# with the dashboard's variables filled in, must return each pod's own use (docs/pods.md).
# The workloads dashboard's panels on per-container usage: their queries are checked against the
# simulated processes.
USAGE_PANELS = ("GPU use per pod on shared GPUs", "GPU memory per pod on shared GPUs")


def usage_panel_queries():
    d = json.loads((ROOT / "dashboards/gpu-workloads.json").read_text())
    out = [t["expr"] for p in d["panels"] if p["title"] in USAGE_PANELS for t in p.get("targets", [])]
    if len(out) != len(USAGE_PANELS):
        raise Failure(f"dashboards/gpu-workloads.json: expected one query in each of {USAGE_PANELS}, found {out}")
    return out


def pod_events(node):
    """Scenario events holding each GPU a pod holds at BUSY_UTIL % (or 0 % if its pods idle)."""
    busy = {}
    for h in POD_HOLDERS.get(node, []):
        busy[h.gpu] = busy.get(h.gpu, False) or h.busy
    return [dict(at="0s", gpu=g, action="utilization", pattern="constant", value=BUSY_UTIL if b else 0)
            for g, b in sorted(busy.items())]


# (node, profile, seed, scenario events as TOML, expected alerts as (alertname, gpu))
FAULT_AT = "12s"
NODES = [
    ("node-01", "8xH100-SXM", 11, [dict(gpu=3, action="fall-off-bus")], [("GPUFallenOffBus", "3")]),
    ("node-02", "4xA100-80GB-MIG", 12, [dict(gpu=2, action="ecc-dbe", count=2)],
     [("GPUDoubleBitECCError", "2"), ("GPURetiredPagesPending", "2")]),
    ("node-03", "8xH100-SXM", 13, [dict(gpu=5, action="thermal-throttle", temperature=95, duration="1h")],
     [("GPUTemperatureHigh", "5"), ("GPUThermalThrottling", "5")]),
    ("node-04", "1xA100-40GB", 14, [dict(gpu=0, action="pcie-replays", count=5000)], [("GPUPCIeReplaysRising", "0")]),
    ("node-05", "8xH100-SXM", 15, [dict(gpu=1, action="nvlink-errors", count=5000)], [("GPUNVLinkErrors", "1")]),
    ("node-06", "4xA100-80GB-MIG", 16, [dict(gpu=3, action="row-remap-failure")], [("GPURowRemapFailure", "3")]),
    ("node-07", "8xH100-SXM", 17, [dict(gpu=6, action="xid", xid=119)], [("GPUCriticalXID", "6")]),
    ("node-08", "1xA100-40GB", 18, [], [("GPUExporterDown", "")]),  # killed after its first scrape
] + [
    (f"node-{i:02d}", ["8xH100-SXM", "4xA100-80GB-MIG", "1xA100-40GB"][i % 3], 100 + i,
     pod_events(f"node-{i:02d}"), [])
    for i in range(9, 21)
] + [
    # The newest naming generation: its own CSV (NEWEST_CSV). Its faults raise the alerts whose series
    # were renamed, from the newest names alone: XID 79 reported by a GPU that stays readable
    # (DCGM_FI_DEV_XID_ERROR), a hot GPU (DCGM_FI_DEV_GPU_TEMP_CELSIUS), PCIe replays
    # (DCGM_FI_DEV_PCIE_REPLAY_TOTAL), a row remap failure (DCGM_FI_DEV_ROW_REMAP_FAILED). The newest
    # default set has no violation, clock-event or health rows, so the hot GPU raises no
    # GPUThermalThrottling there.
    ("node-21", "8xH100-SXM", 121,
     [dict(gpu=2, action="thermal-throttle", temperature=95, duration="1h"),
      dict(gpu=4, action="pcie-replays", count=5000),
      dict(gpu=6, action="row-remap-failure"),
      dict(gpu=7, action="xid", xid=79)],
     [("GPUTemperatureHigh", "2"), ("GPUPCIeReplaysRising", "4"), ("GPURowRemapFailure", "6"),
      ("GPUFallenOffBus", "7")]),
]
NEWEST = "node-21"
NEWEST_CSV = ROOT / "metrics-config/dcgm-exporter-4.10-default-counters.csv"
PER_LINK_ROWS = """
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL,   counter, NVLink replays per link.
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_PER_LINK_TOTAL, counter, NVLink flow-control CRC errors per link.
DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK,           gauge,   NVLink TX+RX throughput per link (in MB/s).
"""
# A classic node whose CSV also lists the newest name of every renamed metric (not the newest
# driver-version label row): each dashboard query must give the same answer from either side.
MIXED = "node-18"
# The classic node node-21's "has data" is compared with (same profile, healthy, no pods): it runs
# dcgm-exporter 4.8's default set (tests/fixtures/upstream/), the classic twin of node-21's.
CLASSIC_PEER = "node-15"
UPSTREAM_CLASSIC_CSV = ROOT / "tests/fixtures/upstream/default-counters.csv"
KILLED = "node-08"
# Dashboard variables: one real node for the node dashboard (an H100 node, so NVLink has data).
# `cluster` is "All" (the series here have no cluster label); `raw` and `per_node` are what the
# dashboard's hidden variables give with the recording rules loaded and every node selected
# (check_dashboards also runs the fallback, and the per-node side with one node).
VARIABLES = {
    "gpu-exporter-cluster": {"cluster": ".*", "hostname": ".*", "raw": "none", "per_node": "none"},
    "gpu-exporter-node": {"cluster": ".*", "hostname": "node-03", "gpu": ".*"},
    "gpu-exporter-workloads": {"cluster": ".*", "hostname": ".*", "namespace": ".*", "pod": ".*", "raw": "none"},
    "gpu-exporter-usage": {"cluster": ".*", "hostname": ".*", "namespace": ".*", "pod": ".*", "price": "0.15"},
}
# A recorded series name (alerts/gpu-exporter.recording.yml): level:metric:operation.
RECORDED = re.compile(r"\b[a-z_]+:[a-z_]+:[a-z_0-9]+\b")
GRAFANA_BUILTINS = {"__rate_interval": "30s", "__interval": "10s", "__range": "1m"}
# NVIDIA's dashboard (grafana.com 12239) with its variables $instance and $gpu set to "All".
NVIDIA_12239 = [
    'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})',
    'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})',
    'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
    'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}',
    'label_values(DCGM_FI_DEV_GPU_TEMP, instance)',
    'label_values(DCGM_FI_DEV_GPU_TEMP, gpu)',
]


log = harness.make_log("e2e")


class Receiver(http.server.BaseHTTPRequestHandler):
    """Alertmanager webhook receiver: records every alert it is sent."""

    alerts = []
    lock = threading.Lock()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        payload = json.loads(body)
        with Receiver.lock:
            Receiver.alerts.extend(a["labels"] for a in payload.get("alerts", []) if a.get("status") == "firing")
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def key(labels):
    host = labels.get("hostname") or labels.get("Hostname") or labels.get("node", "")
    return (labels["alertname"], host, labels.get("gpu", ""))


def expected_alerts(pods_mode):
    want = [(a, node, gpu) for node, _, _, _, exp in NODES for a, gpu in exp]
    want += [("GPUHPCJobFilesInvalid", HPC_NODE, "")]  # its mapping directory holds a bad file
    if pods_mode:  # one per idle GPU or MIG instance a pod holds
        want += [("GPUUnderutilized", node, str(h.gpu))
                 for node, hs in POD_HOLDERS.items() for h in hs
                 if not h.busy and not (h.gi is not None and node in PRE_HOPPER)]
        # Accounting (issue 37): every held GPU or MIG instance its holder runs no process on,
        # MIG instances of pre-Hopper GPUs too (it needs processes, not engine activity).
        want += [("GPUAllocatedIdle", node, str(h.gpu))
                 for node, hs in POD_HOLDERS.items() for h in hs if not h.pids]
        want += [("GPUWorkOutsideAllocation", node, str(gpu))
                 for node, hps in HOST_PROCESSES.items() for _, gpu in hps]
    return sorted(want)


def scenario_toml(events):
    out = []
    for ev in events:
        out.append("[[event]]")
        out.append(f'at = "{ev.get("at", FAULT_AT)}"')
        for k, v in ev.items():
            if k == "at":
                continue
            out.append(f"{k} = {json.dumps(v)}")
        out.append("")
    return "\n".join(out)


def shorten_for(rules_text):
    """The documented mechanical rewrite: every `for:` longer than FOR_CAP_S becomes FOR_CAP_S."""
    def repl(m):
        return f"{m.group(1)}for: {FOR_CAP_S}s" if harness.duration_s(m.group(2)) > FOR_CAP_S else m.group(0)

    return re.sub(r"^(\s*)for: (\S+)\s*$", repl, rules_text, flags=re.M)


def fill(expr, variables):
    values = dict(GRAFANA_BUILTINS, **variables)
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def needs_pods(expr):
    return ('pod!=""' in expr or "gpu_exporter_gpu_pod_info" in expr or "gpu_exporter_container_" in expr
            or re.search(r",\s*(namespace|pod)\)\s*$", expr) is not None)


class Prom:
    def __init__(self, base):
        self.base = base

    def api(self, path, **params):
        url = f"{self.base}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        _, body, _ = http_get(url, 10)
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise Failure(f"{path} {params}: {doc}")
        return doc["data"]

    def query(self, expr):
        m = re.match(r"^label_values\((.*),\s*(\w+)\)$", expr.strip())
        if m:
            data = self.api("/api/v1/series", **{"match[]": m.group(1)})
            return [s for s in data if m.group(2) in s]
        m = re.match(r"^query_result\((.*)\)$", expr.strip(), re.S)
        if m:  # Grafana's query_result(): an instant query
            expr = m.group(1)
        try:
            return self.api("/api/v1/query", query=expr)["result"]
        except urllib.error.HTTPError as e:
            raise Failure(f"query rejected: {expr}: {e.read().decode(errors='replace')}") from e


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True, help="gpu-exporter release binary")
    ap.add_argument("--fake-kubelet", default="",
                    help="fake-kubelet binary; pod-label mode when given (run.sh always gives it)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    harness.require_tools(["prometheus", "prometheus-alertmanager", "promtool"],
                          "prometheus prometheus-alertmanager")
    with harness.work_dir("e2e", args.keep, log) as (work, procs):
        run(args, work, procs)


def run(args, work, procs):
    # Webhook receiver (in this process).
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    hook_port = hook.server_address[1]

    # Scenario files, then (pods mode) the fake kubelets, so the exporters find them at startup.
    pods_mode = bool(args.fake_kubelet)
    sim = {}
    for node, profile, seed, events, _ in NODES:
        scen = work / f"{node}.toml"
        scen.write_text(scenario_toml(events))
        sim[node] = [args.binary, "--backend", "sim", "--sim-profile", profile, "--sim-seed", str(seed),
                     "--sim-scenario", str(scen)]
    devices = start_fake_kubelets(args, work, procs, sim) if pods_mode else {}
    hpc_dir = work / f"{HPC_NODE}-hpc"
    hpc_dir.mkdir()
    for name, content in HPC_FILES.items():
        (hpc_dir / name).write_bytes(content)
    newest_csv = work / "newest.csv"
    newest_csv.write_text(NEWEST_CSV.read_text() + PER_LINK_ROWS)
    sim[NEWEST] += ["-f", str(newest_csv)]
    mixed_csv = work / "mixed.csv"
    mixed_csv.write_text((ROOT / "metrics-config/default-counters.csv").read_text() + "\n"
                         + "".join(f"{newest}, gauge, the newest name of {classic}.\n"
                                   for classic, (newest, _) in dashboard_generations().items()))
    sim[MIXED] += ["-f", str(mixed_csv)]
    sim[CLASSIC_PEER] += ["-f", str(UPSTREAM_CLASSIC_CSV)]

    # Exporters, on port 0: each logs the port it got (a port picked here and passed in could be
    # taken by then: CI once lost a run to "Address already in use").
    ports = {}
    for node, argv in sim.items():
        argv = argv + ["-a", "127.0.0.1:0", "-c", "1000"]
        if node in devices:
            argv += ["-k", "--pod-resources-kubelet-socket", str(kubelet_socket(work, node)),
                     "--container-runtime-endpoint", f"unix://{cri_socket(work, node)}",
                     "--path.procfs", str(proc_root(work, node)),
                     "--sim-processes", str(work / f"{node}-pods.toml"),
                     "--kubernetes-process-usage", "--kubernetes-enable-pod-uid",
                     "--kubernetes-enable-pod-labels", "--kubernetes-pod-label-allowlist-regex", LABEL_ALLOWLIST,
                     "--kubernetes-enable-dra",
                     # Accounting published every 10 s (default: a minute): the dashboards'
                     # windows here are 30 s and 1 m, where a user's are hours.
                     "--accounting-publish-interval", "10000"]
        if node == HPC_NODE:
            argv += ["--hpc-job-mapping-dir", str(hpc_dir)]
        procs.start(node, argv, env={"NODE_NAME": node})
    for node in sim:
        ports[node] = harness.logged_port(procs, node, r"gpu-exporter listening .*address=127\.0\.0\.1:(\d+)")
    for node, port in ports.items():
        wait_for(f"{node} /ready", lambda: http_get(f"http://127.0.0.1:{port}/ready", 5)[0] == 200, 30)
        if not procs.alive(node):
            raise Failure(f"{node} exited:\n{procs.tail(node)}")
    log(f"{len(ports)} exporters ready" + (f" ({', '.join(devices)} with -k)" if devices else ""))

    # Alertmanager.
    am_port = free_port()
    (work / "alertmanager.yml").write_text(json.dumps({
        "route": {"receiver": "hook", "group_by": ["..."], "group_wait": "1s", "group_interval": "2s",
                  "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [
            {"url": f"http://127.0.0.1:{hook_port}/", "send_resolved": False}]}],
    }))
    procs.start("alertmanager", ["prometheus-alertmanager", f"--config.file={work / 'alertmanager.yml'}",
                                 f"--storage.path={work / 'am-data'}", f"--web.listen-address=127.0.0.1:{am_port}",
                                 "--cluster.listen-address="])
    wait_for("alertmanager ready", lambda: http_get(f"http://127.0.0.1:{am_port}/-/ready", 5)[0] == 200, 30)

    # Prometheus.
    rules = work / "rules.yml"
    # Groups with their own interval (1 min) run at this Prometheus' 2 s, like the others.
    rules.write_text(harness.scale_group_intervals(
        shorten_for((ROOT / "alerts/gpu-exporter.rules.yml").read_text()), 2 / 60))
    recording = work / "recording.yml"
    recording.write_text(harness.scale_group_intervals(
        (ROOT / "alerts/gpu-exporter.recording.yml").read_text(), 2 / 60))
    r = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=30)
    if r.returncode:
        raise Failure(f"shortened rules do not check: {r.stdout}{r.stderr}")
    # node-01..node-10 carry a `cluster` target label, the others none (a single-cluster
    # Prometheus): dashboards, rules and the cluster variable must handle both.
    (work / "targets.json").write_text(json.dumps(
        [{"targets": [f"127.0.0.1:{p}"], "labels": {"node": n, **({"cluster": "e2e"} if n <= "node-10" else {})}}
         for n, p in ports.items()]))
    prom_port = free_port()
    (work / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "2s", "scrape_timeout": "1s", "evaluation_interval": "2s"},
        "rule_files": [str(rules), str(recording)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "gpu-exporter",
                            "file_sd_configs": [{"files": [str(work / "targets.json")], "refresh_interval": "5s"}]}],
    }))
    procs.start("prometheus", ["prometheus", f"--config.file={work / 'prometheus.yml'}",
                               f"--storage.tsdb.path={work / 'prom-data'}", "--storage.tsdb.retention.time=1h",
                               f"--web.listen-address=127.0.0.1:{prom_port}"])
    prom = Prom(f"http://127.0.0.1:{prom_port}")
    wait_for("prometheus ready", lambda: http_get(f"{prom.base}/-/ready", 5)[0] == 200, 60)

    def all_up():
        active = prom.api("/api/v1/targets")["activeTargets"]
        return len(active) == len(ports) and all(t["health"] == "up" for t in active)
    wait_for("every target scraped and up", all_up, 60)
    log("Prometheus scrapes every exporter")
    procs.stop(KILLED)
    log(f"stopped {KILLED} (exporter down)")

    for name, content in HPC_LATER.items():  # a job starts while the exporter runs
        (hpc_dir / name).write_bytes(content)

    check_alerts(prom, am_port, pods_mode)
    if pods_mode:
        check_pods(prom, devices)
        check_usage(prom)
    check_hpc(prom)
    check_dashboards(prom, pods_mode)
    check_newest_names(prom)
    check_dashboards_on_both_generations(prom)
    report_memory(procs)


def check_alerts(prom, am_port, pods_mode):
    want = expected_alerts(pods_mode)

    def prom_alerts():
        return sorted(key(a["labels"]) for a in prom.api("/api/v1/alerts")["alerts"])

    def received():
        with Receiver.lock:
            return sorted({key(a) for a in Receiver.alerts})

    try:
        wait_for("every expected alert at the receiver", lambda: set(want) <= set(received()), 180, 1)
    except Failure as e:
        raise Failure(f"{e}\n  missing: {sorted(set(want) - set(received()))}\n  "
                      f"in Prometheus: {prom_alerts()}") from None
    log(f"all {len(want)} expected alerts delivered")
    # No more alerts may be on their way: let Prometheus evaluate the rules for longer than the
    # (shortened) `for:` of any rule, then nothing may be pending or firing beyond the expected set.
    groups = prom.api("/api/v1/rules")["groups"]
    t0 = max(g["lastEvaluation"] for g in groups)

    def evaluated_past():
        gs = prom.api("/api/v1/rules")["groups"]
        done = [g for g in gs if parse_ts(g["lastEvaluation"]) >= parse_ts(t0) + FOR_CAP_S + 4]
        return len(done) == len(gs)
    wait_for(f"rules evaluated {FOR_CAP_S + 4}s past the last expected alert", evaluated_past, 60)
    got = prom_alerts()
    if got != want:
        raise Failure(f"Prometheus alerts differ from the expected set\n  unexpected: "
                      f"{sorted(set(got) - set(want))}\n  missing: {sorted(set(want) - set(got))}\n  "
                      f"all: {got}")
    states = {a["state"] for a in prom.api("/api/v1/alerts")["alerts"]}
    if states != {"firing"}:
        raise Failure(f"alerts not all firing: {states}")
    _, body, _ = http_get(f"http://127.0.0.1:{am_port}/api/v2/alerts?active=true", 5)
    am = sorted(key(a["labels"]) for a in json.loads(body))
    if am != want:
        raise Failure(f"Alertmanager alerts differ: unexpected {sorted(set(am) - set(want))}, "
                      f"missing {sorted(set(want) - set(am))}")
    # Alertmanager flushes each group every group_interval (2s): wait for one more flush.
    wait_for("Alertmanager flush", lambda: received() == want or len(received()) > len(want), 10)
    if received() != want:
        raise Failure(f"receiver got {received()}, want {want}")
    with Receiver.lock:
        per_alert = {}
        for a in Receiver.alerts:
            per_alert.setdefault(key(a), []).append(a)
    log(f"exactly the expected alerts reached the receiver: {want}")
    return per_alert


def parse_ts(ts):
    # RFC 3339 with nanoseconds, e.g. 2026-12-02T10:00:00.123456789Z
    m = re.match(r"(\d+)-(\d+)-(\d+)T(\d+):(\d+):(\d+)(\.\d+)?Z", ts)
    if not m:
        raise ValueError(f"timestamp {ts!r}")
    import calendar
    y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
    return calendar.timegm((y, mo, d, h, mi, s)) + float(m.group(7) or 0)


def check_dashboards(prom, pods_mode):
    failures, skipped, no_source, passed = [], [], [], 0
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        d = json.loads(path.read_text())
        variables = VARIABLES[d["uid"]]
        queries = []
        for p in d["panels"]:
            for t in p.get("targets", []):
                queries.append((f'{path.name}: "{p["title"]}" {t["refId"]}', t["expr"]))
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                queries.append((f"{path.name}: variable {v['name']}", v["query"]["query"]))
            if v["name"] in ("raw", "per_node"):  # rules loaded, every node selected: they must say so
                got = [r["metric"].get(v["name"]) for r in prom.query(fill(v["query"]["query"], variables))]
                want = variables[v["name"]]
                if d["uid"] == "gpu-exporter-workloads" and not pods_mode:
                    want = ".+"  # no pod holds a GPU: nothing is recorded, the raw side (empty) answers
                if got != [want]:
                    failures.append(f"{path.name}: variable {v['name']} is {got}, want [{want!r}]")
        # A query reading recorded series runs twice: as it runs with the recording rules loaded
        # ($raw = none: the recorded side must have data), and as it runs without them (the
        # recorded names replaced by one nothing records, $raw = .+: the raw side must).
        runs = []
        for where, expr in queries:
            runs.append((where, expr, variables))
            if RECORDED.search(expr):
                runs.append((f"{where} (without recording rules)", RECORDED.sub("no_recording_rules_loaded", expr),
                             dict(variables, raw=".+")))
            if "$per_node" in expr:  # one node picked: the per-node recorded side must answer
                one = VARIABLES["gpu-exporter-node"]["hostname"]
                runs.append((f"{where} (node {one} only)", expr, dict(variables, hostname=one, per_node=".+")))
        for where, expr, values in runs:
            q = fill(expr, values)
            if "$" in q:
                failures.append(f"{where}: unfilled variable in {q}")
                continue
            result = prom.query(q)
            if harness.needs_mig_profiling(where):
                if result:
                    failures.append(f"{where}: data from A100 MIG instances' engine activity, which they "
                                    f"cannot have without a DCGM source: {q} gave {result}")
                else:
                    no_source.append(where)
            elif result:
                passed += 1
            elif needs_pods(expr) and not pods_mode:
                skipped.append(where)
            else:
                failures.append(f"{where}: no data for {q}")
    for expr in NVIDIA_12239:
        q = fill(expr, {"instance": ".*", "gpu": ".*"})
        if prom.query(q):
            passed += 1
        else:
            failures.append(f"NVIDIA 12239: no data for {q}")
    log(f"dashboard queries: {passed} returned data, {len(failures)} failed"
        + (f", {len(skipped)} skipped (need pod labels; run without --fake-kubelet)" if skipped else ""))
    for s in skipped:
        log(f"  skipped: {s}")
    for s in no_source:
        log(f"  empty as it must be (A100 MIG instances have no engine activity without DCGM): {s}")
    if failures:
        raise Failure("dashboard queries without data:\n  " + "\n  ".join(failures))


def dashboard_generations():
    """scripts/gen-dashboards.py's rename table: classic name -> (newest name, conversion)."""
    src = (ROOT / "scripts/gen-dashboards.py").read_text()
    # Only the table: the script itself needs the Grafana SDK, which the e2e does not.
    table = src[src.index("NEWEST = {"):src.index("\n}\n", src.index("NEWEST = {")) + 3]
    scope = {}
    exec(table, scope)  # noqa: S102 (our own file)
    return scope["NEWEST"]


def dashboard_runs():
    """(dashboard uid, where, expr) of every panel target and query variable."""
    return [(uid, f"{path.name}: {what}", expr)
            for path, uid, what, expr, _ in harness.dashboard_targets(ROOT / "dashboards")]


def check_dashboards_on_both_generations(prom):
    """The dashboards serve either naming generation, in the classic units:
    - node-21 (newest names only) has data for exactly the queries of the node and cluster
      dashboards (recorded and raw) and variables that have data for node-15 (classic names, same
      profile);
    - on node-18 (both names for every renamed metric) each such panel query, at one instant, gives the
      same series and values as itself with the classic names removed (so the newest side
      answers, converted): the conversions are right and nothing is counted twice."""
    table = dashboard_generations()
    classic_re = re.compile(r"\b(" + "|".join(sorted(table, key=len, reverse=True)) + r")\b(?!_)")
    runs = []
    for uid, where, expr in dashboard_runs():
        if uid == "gpu-exporter-workloads":  # no pods on these nodes
            continue
        base = dict(VARIABLES[uid])
        runs.append((where, expr, base))
        if RECORDED.search(expr):
            runs.append((f"{where} (without recording rules)", RECORDED.sub("no_recording_rules_loaded", expr),
                         dict(base, raw=".+")))
    at = time.time() - 5  # a scrape of every node is in the head by then

    def query(expr, values, node):
        q = harness.as_promql(fill(expr, dict(values, hostname=node)))
        return prom.api("/api/v1/query", query=q, time=f"{at:.3f}")["result"]

    def key(series):
        return tuple(sorted((k, v) for k, v in series["metric"].items() if k != "__name__"))

    failures, compared = [], 0
    for where, expr, values in runs:
        newest, classic = bool(query(expr, values, NEWEST)), bool(query(expr, values, CLASSIC_PEER))
        if newest != classic:
            failures.append(f"{where}: {NEWEST} {'has' if newest else 'has no'} data, {CLASSIC_PEER} "
                            f"{'has' if classic else 'has no'}")
        if " variable " in where or not classic_re.search(expr):  # variables list labels, not values
            continue
        both = {key(s): float(s["value"][1]) for s in query(expr, values, MIXED)}
        only_newest = {key(s): float(s["value"][1])
                       for s in query(classic_re.sub("no_classic_series", expr), values, MIXED)}
        if both.keys() != only_newest.keys():
            failures.append(f"{where}: on {MIXED} the series differ between the classic names "
                            f"({len(both)}) and the newest ones ({len(only_newest)})")
            continue
        for k, a in both.items():
            b = only_newest[k]
            if not math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-9) and not (abs(a - b) <= 1 and abs(a) >= 10):
                failures.append(f"{where}: on {MIXED} {dict(k)}: {a} from the classic names, {b} from the "
                                "newest ones")
                break
        compared += bool(both)
    if failures:
        raise Failure("dashboards differ between naming generations:\n  " + "\n  ".join(failures))
    if compared < 20:
        raise Failure(f"only {compared} dashboard queries compared between naming generations")
    log(f"dashboards on both naming generations: in {len(runs)} queries {NEWEST} (newest names) has data "
        f"exactly where {CLASSIC_PEER} has; {compared} give the same values from either name on {MIXED}")


def check_newest_names(prom):
    """node-21 serves the DCGM 4.7/4.8 names, each in its own unit, and per-link NVLink series,
    and no classic name; the other nodes serve no newest name. node-21's alerts (check_alerts has
    checked they are exactly the expected ones) carry the newest driver-version label only."""
    def values(q):
        return [float(s["value"][1]) for s in prom.query(q)]

    def problems():
        out = []
        sel = f'{{node="{NEWEST}"}}'
        checks = [
            # (query, expected number of series, predicate on each value, what it means)
            (f"DCGM_FI_DEV_GPU_UTIL_RATIO{sel}", 8, lambda v: 0 <= v <= 1, "a 0-1 ratio"),
            (f"DCGM_FI_DEV_SM_CLOCK_HERTZ{sel}", 8, lambda v: v >= 1e8, "Hz (>= 100 MHz)"),
            (f"DCGM_FI_DEV_FB_CAPACITY_BYTES{sel}", 8, lambda v: v > 80e9, "bytes (80 GB H100)"),
            (f"DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL{sel}", 8, lambda v: 1e6 <= v < 1e8, "joules"),
            (f"DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND{sel}", 8, lambda v: v >= 0, "B/s"),
            (f'DCGM_FI_DEV_GPU_TEMP_CELSIUS{{node="{NEWEST}",DCGM_FI_SYSTEM_DRIVER_VERSION!=""}}', 8,
             lambda v: 20 <= v <= 100, "°C, with the DCGM_FI_SYSTEM_DRIVER_VERSION label"),
            # 8 GPUs x 18 active NVLinks, labelled as dcgm-exporter's link entities.
            (f'DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL{{node="{NEWEST}",nvlink=~"[1-9]|1[0-8]",'
             f'gpu_uuid=~"GPU-.+",model_name!=""}}', 144, lambda v: v >= 0, "a per-link counter"),
            (f"DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK{sel}", 144, lambda v: v >= 0, "MB/s per link"),
            (f"DCGM_FI_DEV_GPU_UTIL{sel}", 0, None, "absent: classic name"),
            (f"DCGM_FI_DEV_SM_CLOCK{sel}", 0, None, "absent: classic name"),
            ('DCGM_FI_DEV_GPU_UTIL_RATIO{node!~"%s|%s"}' % (NEWEST, MIXED), 0, None, "absent on classic nodes"),
        ]
        for q, n, ok, meaning in checks:
            vs = values(q)
            if len(vs) != n:
                out.append(f"{q}: expected {n} series ({meaning}), found {len(vs)}")
            elif ok and not all(ok(v) for v in vs):
                out.append(f"{q}: values not {meaning}: {sorted(vs)[:3]}...{sorted(vs)[-3:]}")
        # node-21's alerts come from the newest series: they carry the newest driver-version label
        # and not the classic one (GPUFallenOffBus drops both).
        for a in prom.api("/api/v1/alerts")["alerts"]:
            labels = a["labels"]
            if labels.get("hostname") != NEWEST or labels["alertname"] == "GPUFallenOffBus":
                continue
            if "DCGM_FI_SYSTEM_DRIVER_VERSION" not in labels or "DCGM_FI_DRIVER_VERSION" in labels:
                out.append(f"{labels['alertname']} on {NEWEST}: not from the newest series: {labels}")
        return out

    settle(f"{NEWEST} (newest names) differs", problems, 30)
    log(f"{NEWEST} serves the DCGM 4.7/4.8 names in their units and 144 per-link NVLink series; "
        "its alerts carry DCGM_FI_SYSTEM_DRIVER_VERSION")


def report_memory(procs):
    peaks = []
    for node, _, _, _, _ in NODES:
        if node == KILLED or not procs.alive(node):
            continue
        status = pathlib.Path(f"/proc/{procs.procs[node].pid}/status").read_text()
        hwm = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))
        peaks.append((hwm, node))
    peaks.sort()
    log(f"exporter peak RSS (VmHWM): min {peaks[0][0] / 1024:.1f} MiB ({peaks[0][1]}), "
        f"max {peaks[-1][0] / 1024:.1f} MiB ({peaks[-1][1]})")


# --- Pod labels: fake kubelets (crates/gpu-exporter-testing/src/bin/fake-kubelet.rs; file format in docs/pods.md) ---


def kubelet_socket(work, node):
    return work / f"{node}-kubelet.sock"


def cri_socket(work, node):
    return work / f"{node}-cri.sock"


def proc_root(work, node):
    return work / f"{node}-proc"


def list_devices(argv, node):
    """The node's GPUs and MIG instances as `gpu-exporter --list-devices` prints them, given the
    node's own sim flags and NODE_NAME: {gpu: (uuid, {gi: (mig uuid, profile, dra name)}, dra name)}."""
    r = subprocess.run(argv + ["--list-devices"], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, NODE_NAME=node))
    if r.returncode:
        raise Failure(f"{node}: --list-devices failed ({r.returncode}): {r.stderr.strip()}")
    gpus, last = {}, None
    for line in r.stdout.splitlines():
        m = re.match(r"GPU (\d+)\t(GPU-[^\t]+)\t.*\tdra (\S+)$", line)
        if m:
            last = int(m.group(1))
            gpus[last] = (m.group(2), {}, m.group(3))
            continue
        m = re.match(r"\s+MIG GPU_I_ID (\d+)\t(MIG-[^\t]+)\t[^\t]*\t(\S+)\tdra (\S+)$", line)
        if m and last is not None:
            gpus[last][1][int(m.group(1))] = (m.group(2), m.group(3), m.group(4))
        elif line.strip():
            raise Failure(f"{node}: unexpected --list-devices line {line!r}")
    return gpus


def device_of(node, h, gpus):
    """(resource or None for the default nvidia.com/gpu, device id) of holder h; for a DRA holder
    (None, the DRA driver's device name)."""
    if h.gpu not in gpus:
        raise Failure(f"{node}: the sim has no GPU {h.gpu} (has {sorted(gpus)})")
    uuid, migs, dra = gpus[h.gpu]
    resource = None
    if h.gi is not None:
        if h.gi not in migs:
            raise Failure(f"{node}: GPU {h.gpu} has no MIG instance GPU_I_ID {h.gi} (has {sorted(migs)})")
        uuid, profile, dra = migs[h.gi]
        resource = f"nvidia.com/mig-{profile}"  # the device plugin's mixed MIG strategy
    if h.claim:
        return None, dra
    return resource, uuid if h.replica is None else f"{uuid}::{h.replica}"


def assignments_toml(node, holders, gpus):
    out = [f"# fake-kubelet assignments for {node}, written by tests/e2e/e2e.py", ""]
    out += [f"{k} = {json.dumps(v)}" for k, v in CGROUPS.get(node, {}).items()] + [""]
    for h in holders:
        resource, device = device_of(node, h, gpus)
        out.append("[[assignment]]")
        for k in ("namespace", "pod", "container"):
            out.append(f"{k} = {json.dumps(getattr(h, k))}")
        out.append(f"pod_uid = {json.dumps(pod_uid(node, h))}")
        if h.claim:  # NVIDIA's DRA driver: the pool is the node's name
            out += [f"claim = {json.dumps(h.claim)}", f"pool = {json.dumps(node)}"]
        if resource:
            out.append(f"resource = {json.dumps(resource)}")
        out.append(f"devices = [{json.dumps(device)}]")
        if h.pids:
            out.append(f"pids = [{', '.join(str(p) for p in h.pids)}]")
            out.append(f"weight = {h.weight}")
        if h.labels:
            out.append("labels = { " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}"
                                                 for k, v in sorted(h.labels.items())) + " }")
        out.append("")
    for pid, gpu in HOST_PROCESSES.get(node, []):
        out += ["[[host_process]]", f"pid = {pid}", f"device = {json.dumps(gpus[gpu][0])}",
                'unit = "gpu-burn"', ""]
    return "\n".join(out)


def start_fake_kubelets(args, work, procs, sim):
    """Starts one fake kubelet per POD_HOLDERS node; returns {node: list_devices(...)}."""
    devices = {}
    for node, holders in POD_HOLDERS.items():
        gpus = list_devices(sim[node], node)
        devices[node] = gpus
        assignments = work / f"{node}-pods.toml"
        assignments.write_text(assignments_toml(node, holders, gpus))
        sock = kubelet_socket(work, node)
        name = f"{node}-kubelet"
        procs.start(name, [args.fake_kubelet, "--socket", str(sock), "--assignments", str(assignments),
                           "--cri-socket", str(cri_socket(work, node)), "--proc-root", str(proc_root(work, node))])
        pods = len({(h.namespace, h.pod) for h in holders})
        want = f"fake-kubelet: serving {pods} pods on {sock}"

        def serving():
            if not procs.alive(name):
                raise Failure(f"fake-kubelet for {node} exited:\n{procs.tail(name)}")
            lines = (procs.logdir / f"{name}.log").read_text(errors="replace").splitlines()
            served = [ln for ln in lines if ln.startswith("fake-kubelet: serving")]
            if served and served[0] != want:
                raise Failure(f"fake-kubelet for {node}: printed {served[0]!r}, want {want!r}")
            return bool(served) and sock.exists()
        wait_for(f"fake-kubelet for {node} to print {want!r}", serving, 20, 0.2)
    log(f"fake kubelets serve {sum(len(h) for h in POD_HOLDERS.values())} assignments on "
        f"{', '.join(POD_HOLDERS)}")
    return devices


def settle(what, problems_fn, deadline_s, interval=1):
    """Polls problems_fn() (a list of problems) until it is empty or the deadline passes."""
    end = time.monotonic() + deadline_s
    while True:
        problems = problems_fn()
        if not problems:
            return
        if time.monotonic() >= end:
            raise Failure(f"{what} (after {deadline_s}s):\n  " + "\n  ".join(problems))
        time.sleep(interval)


def check_pods(prom, devices):
    """Pod attribution as seen through Prometheus, against POD_HOLDERS and the listed device ids."""
    entities = {}  # (node, gpu, gi) -> sorted distinct (namespace, pod, container) holding it
    for node, holders in POD_HOLDERS.items():
        for h in holders:
            entities.setdefault((node, h.gpu, h.gi), set()).add((h.namespace, h.pod, h.container))
    entities = {k: sorted(v) for k, v in entities.items()}

    def pod_of(m):
        return tuple(m.get(k, "") for k in ("namespace", "pod", "container"))

    def show(series):
        return [{k: v for k, v in s["metric"].items() if k in (
            "__name__", "hostname", "node", "gpu", "UUID", "GPU_I_ID", "namespace", "pod", "container", "vgpu")}
            | {"value": s["value"][1]} for s in series]

    def problems():
        out = []
        # Self-metrics of the pod-resources client, only on the -k nodes.
        nodes = {s["metric"].get("node") for s in prom.query("gpu_exporter_pod_resources_up")}
        if nodes != set(POD_HOLDERS):
            out.append(f"gpu_exporter_pod_resources_up: expected on {sorted(POD_HOLDERS)}, found on {sorted(nodes)}")
        for node in POD_HOLDERS:
            held = len({(g, gi) for n, g, gi in entities if n == node})
            for metric, value in (("gpu_exporter_pod_resources_up", "1"),
                                  ("gpu_exporter_pod_resources_unknown_devices", "0"),
                                  ("gpu_exporter_pod_resources_allocated_entities", str(held))):
                got = [s["value"][1] for s in prom.query(f'{metric}{{node="{node}"}}')]
                if got != [value]:
                    out.append(f"{metric}{{node={node!r}}}: expected {value}, found {got}")
        # Device series: pod labels exactly where one container holds the entity.
        for (node, gpu, gi), holders in entities.items():
            labelled = holders[0] if len(holders) == 1 else ("", "", "")
            what = "one pod" if len(holders) == 1 else f"shared by {len(holders)} pods, so unlabelled"
            metrics = ["DCGM_FI_DEV_FB_USED"] + (
                ["DCGM_FI_DEV_FB_FREE"] if gi is not None else ["DCGM_FI_DEV_GPU_UTIL"])
            for metric in metrics:
                q = f'{metric}{{hostname="{node}", gpu="{gpu}", GPU_I_ID="{"" if gi is None else gi}"}}'
                got = prom.query(q)
                if [pod_of(s["metric"]) for s in got] != [labelled]:
                    out.append(f"{q} ({what}): expected one series with namespace/pod/container="
                               f"{'/'.join(labelled) or '(none)'}, found {show(got)}")
        # Nothing else carries pod labels.
        want = sorted((node, str(gpu), "" if gi is None else str(gi)) + holders[0]
                      for (node, gpu, gi), holders in entities.items() if len(holders) == 1)
        got = sorted((s["metric"].get("hostname", ""), s["metric"].get("gpu", ""), s["metric"].get("GPU_I_ID", ""))
                     + pod_of(s["metric"]) for s in prom.query('DCGM_FI_DEV_FB_USED{pod!=""}'))
        if got != want:
            out.append(f'DCGM_FI_DEV_FB_USED{{pod!=""}}: expected (hostname, gpu, GPU_I_ID, namespace, pod, '
                       f"container) {want}, found {got}")
        # gpu_exporter_gpu_pod_info: one series per holder (both replicas of a shared GPU), with
        # the UUID of the GPU (a MIG instance adds GPU_I_ID).
        want = sorted((node, str(h.gpu), devices[node][h.gpu][0], "" if h.gi is None else str(h.gi),
                       h.namespace, h.pod, h.container, "" if h.replica is None else str(h.replica))
                      for node, hs in POD_HOLDERS.items() for h in hs)
        info = prom.query("gpu_exporter_gpu_pod_info")
        got = sorted(tuple(s["metric"].get(k, "") for k in (
            "node", "gpu", "UUID", "GPU_I_ID", "namespace", "pod", "container", "vgpu")) for s in info)
        if got != want:
            out.append("gpu_exporter_gpu_pod_info: expected (node, gpu, UUID, GPU_I_ID, namespace, pod, "
                       f"container, vgpu)\n    {want}\n  found\n    {got}")
        # DRA: the claim's labels on exactly the DRA-allocated GPUs and MIG instances (the pool is
        # the node; a MIG instance adds its UUID), none unresolved.
        dra_keys = ("hostname", "gpu", "GPU_I_ID", "namespace", "pod", "dra_claim_name", "dra_pool_name",
                    "dra_device_name", "dra_driver_name", "dra_mig_device_uuid")
        want = sorted((node, str(h.gpu), "" if h.gi is None else str(h.gi), h.namespace, h.pod, h.claim, node,
                       device_of(node, h, devices[node])[1], "gpu.nvidia.com",
                       "" if h.gi is None else devices[node][h.gpu][1][h.gi][0])
                      for node, hs in POD_HOLDERS.items() for h in hs if h.claim)
        got = sorted(tuple(s["metric"].get(k, "") for k in dra_keys)
                     for s in prom.query('DCGM_FI_DEV_FB_USED{dra_claim_name!=""}'))
        if got != want:
            out.append(f'DCGM_FI_DEV_FB_USED{{dra_claim_name!=""}}: expected {dra_keys}\n    {want}\n  found\n    {got}')
        for node in POD_HOLDERS:
            q = f'gpu_exporter_pod_resources_dra_unresolved_devices{{node="{node}"}}'
            got = sorted((s["metric"].get("reason", ""), s["value"][1]) for s in prom.query(q))
            if got != [("no_match", "0"), ("unrecognised_name", "0")]:
                out.append(f"{q}: expected 0 for no_match and unrecognised_name, found {got}")
        return out

    settle("pod attribution differs from the fake kubelets' assignments", problems, 30)
    shared = [k for k, holders in entities.items() if len(holders) > 1]
    dra = sum(1 for hs in POD_HOLDERS.values() for h in hs if h.claim)
    log(f"pod labels as assigned: {len(entities) - len(shared)} singly held GPUs/MIG instances labelled "
        f"({dra} through DRA claims, with dra_* labels), "
        f"{len(shared)} shared GPU(s) unlabelled with one gpu_exporter_gpu_pod_info per holder, "
        f"pod_resources_up == 1 on {', '.join(POD_HOLDERS)}")


def check_usage(prom):
    """Per-process usage as seen through Prometheus: every pod's own use of the GPU or MIG
    instance it runs on, summing to the device's within the documented tolerance, with pod_uid
    and the allowlisted pod labels; and the runtime's and /proc's self-metrics."""
    def value(series):
        return float(series["value"][1])

    def problems():
        out = []
        for node, holders in POD_HOLDERS.items():
            pids = sum(len(h.pids) for h in holders)
            for metric, want in (("gpu_exporter_cri_up", 1.0),
                                 ('gpu_exporter_gpu_processes{outcome="attributed"}', float(pids)),
                                 ('gpu_exporter_gpu_processes{outcome="unknown_container"}', 0.0),
                                 ('gpu_exporter_gpu_processes{outcome="unreadable"}', 0.0)):
                q = metric.replace("}", f', node="{node}"}}') if "{" in metric else f'{metric}{{node="{node}"}}'
                got = [value(x) for x in prom.query(q)]
                if got != [want]:
                    out.append(f"{q}: expected {want}, found {got}")
            entities = {}
            for h in holders:
                entities.setdefault((h.gpu, h.gi), []).append(h)
            for (gpu, gi), hs in sorted(entities.items(), key=str):
                sel = f'hostname="{node}", gpu="{gpu}", GPU_I_ID="{"" if gi is None else gi}"'
                running = sorted((h.namespace, h.pod) for h in hs if h.pids)
                fb = prom.query(f"gpu_exporter_container_fb_used_bytes{{{sel}}}")
                got = sorted((x["metric"].get("namespace"), x["metric"].get("pod")) for x in fb)
                if got != running:
                    out.append(f"gpu_exporter_container_fb_used_bytes{{{sel}}}: pods {got}, expected {running}")
                    continue
                for x in fb:
                    m = x["metric"]
                    h = next(h for h in hs if h.pod == m.get("pod"))
                    if m.get("pod_uid") != pod_uid(node, h):
                        out.append(f"{m.get('pod')}: pod_uid {m.get('pod_uid')!r}, expected {pod_uid(node, h)!r}")
                    want_labels = {k: v for k, v in (h.labels or {}).items() if k in ("app", "team")}
                    got_labels = {k: m[k] for k in ("app", "team", "tier") if k in m}
                    if got_labels != want_labels:
                        out.append(f"{m.get('pod')}: pod labels {got_labels}, expected {want_labels} (tier is not allowlisted)")
                    if value(x) <= 0:
                        out.append(f"{m.get('pod')} on {node} GPU {gpu}: no memory")
                    if any(k.startswith("dra_") or k in ("hpc_job", "vgpu") for k in m):
                        out.append(f"{m.get('pod')} on {node} GPU {gpu}: a per-container series is a copy: {m}")
                # A DRA holder's copies carry its pod_uid and allowlisted labels too.
                for h in hs:
                    if not h.claim:
                        continue
                    copies = prom.query(f'DCGM_FI_DEV_FB_USED{{{sel}, dra_claim_name="{h.claim}"}}')
                    want = {"pod_uid": pod_uid(node, h)} | {k: v for k, v in (h.labels or {}).items()
                                                          if k in ("app", "team")}
                    got = [{k: x["metric"].get(k) for k in want} for x in copies]
                    if got != [want]:
                        out.append(f"DRA copy of {h.pod} on {node} GPU {gpu} GI {gi}: {got}, expected [{want}]")
                device_fb = [value(x) for x in prom.query(f"DCGM_FI_DEV_FB_USED{{{sel}}}")]
                summed = sum(value(x) for x in fb) / 1048576
                # Memory: the containers' sum is the device's, to the MiB (a copy per holder on a
                # shared entity in virtual mode; one unlabelled series here).
                if running and (not device_fb or summed != device_fb[0]):
                    out.append(f"{node} GPU {gpu} GI {gi}: containers use {summed} MiB, device FB_USED {device_fb}")
                if gi is None and len(running) > 1:
                    sm = prom.query(f"gpu_exporter_container_sm_utilization_percent{{{sel}}}")
                    util = [value(x) for x in prom.query(f"DCGM_FI_DEV_GPU_UTIL{{{sel}}}")]
                    total = sum(value(x) for x in sm)
                    tolerance = UTIL_TOLERANCE_PER_CONTAINER * len(running)
                    if len(sm) != len(running) or not util or abs(total - util[0]) > tolerance:
                        out.append(f"{node} GPU {gpu}: per-pod SM {[(x['metric'].get('pod'), value(x)) for x in sm]} "
                                   f"sums to {total}, device GPU_UTIL {util} (tolerance {tolerance})")
                    elif any(value(x) <= 0 for x in sm):
                        out.append(f"{node} GPU {gpu}: a busy pod reads 0 % SM: {sm}")
        variables = VARIABLES["gpu-exporter-workloads"]
        for q in usage_panel_queries():
            got = {(x["metric"].get("hostname"), x["metric"].get("pod")) for x in prom.query(fill(q, variables))}
            want = {(node, h.pod) for node, hs in POD_HOLDERS.items() for h in hs if h.pids
                    and ("sm_utilization" not in q or h.gi is None)}
            if got != want:
                out.append(f"panel query {q}: pods {sorted(got)}, expected {sorted(want)}")
        return out

    settle("per-pod GPU usage differs from the simulated processes", problems, 30)
    shared = [(n, h.gpu) for n, hs in POD_HOLDERS.items() for h in hs if h.replica is not None]
    log(f"per-pod usage: every pod's own SM and memory on {len(POD_HOLDERS)} nodes, the {len(shared)} pods "
        f"on the time-sliced GPU summing to the device within {UTIL_TOLERANCE_PER_CONTAINER} point each, "
        "pod_uid and allowlisted labels present, the proposed panel's queries answer")


def check_hpc(prom):
    """hpc_job labels on HPC_NODE as its mapping files say (one copy per job, the file written
    while the exporter ran included); the bad file ignored and counted; no other node affected."""
    gpus_on_node = 8  # HPC_NODE is an 8xH100-SXM node

    def problems():
        out = []
        want = sorted((HPC_NODE, gpu, job) for gpu, jobs in HPC_JOBS.items() for job in jobs)
        got = sorted((s["metric"].get("hostname", ""), s["metric"].get("gpu", ""), s["metric"]["hpc_job"])
                     for s in prom.query('DCGM_FI_DEV_FB_USED{hpc_job!=""}'))
        if got != want:
            out.append(f'DCGM_FI_DEV_FB_USED{{hpc_job!=""}}: expected (hostname, gpu, hpc_job) {want}, found {got}')
        copies = collections.Counter(s["metric"]["gpu"] for s in prom.query(
            f'DCGM_FI_DEV_FB_USED{{hostname="{HPC_NODE}"}}'))
        want = {str(g): len(HPC_JOBS.get(str(g), [None])) for g in range(gpus_on_node)}
        if dict(copies) != want:
            out.append(f"series per GPU on {HPC_NODE}: expected {want}, found {dict(copies)}")
        files = {s["metric"]["state"]: s["value"][1]
                 for s in prom.query(f'gpu_exporter_hpc_job_files{{node="{HPC_NODE}"}}')}
        if files != {"ok": str(len(HPC_JOBS)), "bad": "1"}:
            out.append(f"gpu_exporter_hpc_job_files on {HPC_NODE}: expected ok={len(HPC_JOBS)}, bad=1, found {files}")
        errors = {s["metric"]["reason"]: s["value"][1]
                  for s in prom.query(f'gpu_exporter_hpc_job_file_errors_total{{node="{HPC_NODE}"}}')}
        if errors.get("not_utf8") != "1" or any(v != "0" for r, v in errors.items() if r != "not_utf8"):
            out.append(f"gpu_exporter_hpc_job_file_errors_total on {HPC_NODE}: expected not_utf8 1, the rest 0, "
                       f"found {errors}")
        nodes = {s["metric"].get("node") for s in prom.query("gpu_exporter_hpc_job_files")}
        if nodes != {HPC_NODE}:
            out.append(f"gpu_exporter_hpc_job_files: expected on {HPC_NODE} only, found on {sorted(nodes)}")
        return out

    settle("hpc_job labels differ from the mapping files", problems, 30)
    log(f"hpc_job labels as the files on {HPC_NODE} say: {sum(len(j) for j in HPC_JOBS.values())} jobs on "
        f"{len(HPC_JOBS)} GPUs (one written while running), the bad file ignored and counted")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    try:
        main()
    except Failure as e:
        log(f"FAILED: {e}")
        sys.exit(1)
