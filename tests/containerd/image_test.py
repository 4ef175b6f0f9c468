#!/usr/bin/env python3
"""gpu-exporter's container image under a real containerd + runc, run as the NVIDIA GPU Operator's
DaemonSet runs it, scraped from the host. Run by scripts/ci-image.sh (which builds and passes the
image archive, the fake-kubelet binary and the C NVML stand-in), as root:

  image_test.py --image-tar IMG.tar --image REF --fake-kubelet BIN --nvml-standin LIB.so \
                [--dcgm-image-tar IMG-DCGM.tar --dcgm-image REF]

Three pods (five with the DCGM variant), one after the other, each host-network, privileged, with the Operator's env
(DCGM_EXPORTER_LISTEN=":PORT", DCGM_EXPORTER_KUBERNETES="true",
DCGM_EXPORTER_COLLECTORS=/etc/dcgm-exporter/dcp-metrics-included.csv, NODE_NAME), `args` only
(the image's ENTRYPOINT starts the exporter) and the kubelet's pod-resources directory mounted
(a fake-kubelet socket on the host):
  1. operator:   no args, no GPU driver in the container (what a node without the toolkit gets):
                 /health answers 200 to a kubelet-style probe, /ready 503 naming the missing
                 libnvidia-ml.so.1, /metrics serves the self-metrics saying why and no GPU series;
                 the CSV the Operator names is the one loaded; pod-resources is reachable.
  2. simulated:  args --backend=auto --sim-seed=1 -c 1000: NVML cannot load, so the simulated 8xH100 node
                 is served, with hostname=NODE_NAME and the fake kubelet's pods as labels.
  3. nvml:       runtimeClassName "nvidia" (a toolkit stand-in that bind-mounts the C NVML
                 stand-in at /usr/lib64/libnvidia-ml.so.1 and runs ldconfig in the container),
                 args --backend nvml -c 1000: the stand-in's two GPUs are served through the real loader
                 path of the image, with pod labels.
The image variant with DCGM's libraries (scripts/build-image.sh --dcgm-lib: here the libdcgm
stand-in, tests/dcgm_abi/dcgm_standin.c, at /usr/lib/x86_64-linux-gnu/libdcgm.so.4 where DCGM's
own library lives in NVIDIA's images), on two A100 stand-ins (no GPM: NVML cannot read their
profiling fields), in the GPU Operator's two DCGM modes, `args` empty as the Operator passes them
(DCGM_EXPORTER_INTERVAL=1000 in the env, as a ClusterPolicy's dcgmExporter.env would set it):
  4. dcgm-embedded:   the Operator's default (no standalone DCGM: no DCGM_REMOTE_HOSTENGINE_INFO):
                      DCGM runs embedded in the exporter and serves every DCGM_FI_PROF_* row of the
                      dcp CSV for both GPUs; no connection is made (the stand-in's "hostengine"
                      is set down), and removing the pod stops the embedded hostengine.
  5. dcgm-standalone: the Operator's standalone `nvidia-dcgm` (DCGM_REMOTE_HOSTENGINE_INFO=
                      localhost:5555): the exporter connects (dcgmConnect_v2) and serves the same.
The stand-in has no network: its "hostengine" is a key = value file (GPUs, UUIDs, profiling metric
groups, values), mounted read-only into the pod and named by DCGM_STANDIN_CONFIG; a second,
writable mount receives its call counters (DCGM_STANDIN_STATUS), which the test reads from the
host. Those two variables are the stand-in's, not the exporter's or the Operator's.
Every wait is bounded; everything is cleaned up (lab.py) even when a check fails.
"""

import argparse
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lab import Lab, LabError, free_port, probe, scrape, series, wait_for  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NODE_NAME = "gpu-node-7"
DCP_CSV = "/etc/dcgm-exporter/dcp-metrics-included.csv"
PATIENCE = 60.0

STANDIN_GPUS = {
    "GPU-5c7a1f3e-0000-4a6b-9d1e-00000000c0de": ("0", "47"),
    "GPU-5c7a1f3e-1111-4a6b-9d1e-00000000c0de": ("1", "52"),
}

checks: list[str] = []


def check(cond: bool, what: str, detail: str = ""):
    if not cond:
        raise AssertionError(f"FAILED: {what}\n{detail}")
    checks.append(what)
    print(f"  ok  {what}", flush=True)


def dcp_rows() -> int:
    """The metric rows of the dcp CSV the image ships: active (uncommented, non-blank), not `label`."""
    text = (REPO / "metrics-config" / "upstream" / "dcp-metrics-included.csv").read_text()
    rows = [l.split(",") for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    return sum(1 for r in rows if r[1].strip() != "label")


def operator_env(port: int, extra: dict | None = None) -> dict:
    return {
        "DCGM_EXPORTER_LISTEN": f":{port}",
        "DCGM_EXPORTER_KUBERNETES": "true",
        "DCGM_EXPORTER_COLLECTORS": DCP_CSV,
        "NODE_NAME": NODE_NAME,
        **(extra or {}),
    }


def start_exporter(lab: Lab, name: str, image: str, port: int, args, kubelet_dir: Path,
                   env_extra=None, mounts=(), runtime_handler=""):
    pod = lab.run_pod(name, namespace="gpu-operator", privileged=True, runtime_handler=runtime_handler,
                      labels={"app": "nvidia-dcgm-exporter"})
    pod.run_container(
        "nvidia-dcgm-exporter", image, args=args, env=operator_env(port, env_extra),
        mounts=[(str(kubelet_dir), "/var/lib/kubelet/pod-resources", True), *mounts],
        privileged=True,
    )
    # The kubelet's probes: httpGet /health on the port, until it answers 2xx/3xx.
    def healthy():
        state = pod.state("nvidia-dcgm-exporter")
        if state == "CONTAINER_EXITED":
            raise LabError(f"the exporter exited:\n{pod.log('nvidia-dcgm-exporter')}")
        return probe(port)[0] == 200
    try:
        wait_for(healthy, PATIENCE, f"{name}: /health on :{port}")
    except LabError as e:
        raise AssertionError(f"{e}\nlog:\n{pod.log('nvidia-dcgm-exporter')}") from e
    return pod


def fake_kubelet(lab: Lab, binary: str, assignments: Path, sock_dir: Path, log_name: str):
    sock_dir.mkdir(parents=True)
    p = lab.spawn([binary, "--socket", str(sock_dir / "kubelet.sock"), "--assignments", str(assignments)], log_name)
    wait_for(lambda: "serving" in lab.read_log(log_name) or p.poll() is not None, 30, f"fake-kubelet {log_name}")
    if p.poll() is not None:
        raise LabError(f"fake-kubelet exited: {lab.read_log(log_name)}")
    return p


def pod_operator(lab: Lab, image: str, kubelet_dir: Path):
    print("pod 1 (operator): the Operator's env, no args, no driver in the container", flush=True)
    port = free_port()
    pod = start_exporter(lab, "exporter-operator", image, port, [], kubelet_dir)
    st, body = probe(port, "/health")
    check(st == 200, f"kubelet probe GET /health -> 200 ({body.strip()!r})")
    st, body = probe(port, "/ready")
    check(st == 503 and "libnvidia-ml.so.1" in body,
          "GET /ready -> 503 naming the missing libnvidia-ml.so.1", f"{st} {body}")
    def sampled():
        s = scrape(port)
        errs = series(s, "gpu_exporter_sample_errors_total", reason="discovery_error")
        return s if errs and float(errs[0][2]) >= 1 else None
    samples = wait_for(sampled, PATIENCE, "the first sample (a discovery error)")
    check(series(samples, "gpu_exporter_build_info", backend="nvml") != [],
          "gpu_exporter_build_info{backend=\"nvml\"}: the default backend, as the Operator passes none")
    check(all(v == 0 for _, _, v in series(samples, "gpu_exporter_gpus")),
          "gpu_exporter_gpus is 0 in every state")
    errs = series(samples, "gpu_exporter_sample_errors_total", reason="discovery_error")
    check(errs and float(errs[0][2]) >= 1, "gpu_exporter_sample_errors_total{reason=\"discovery_error\"} >= 1")
    check(not any(n.startswith("DCGM_FI_") for n, _, _ in samples), "no DCGM_FI_* series without a GPU")
    log = pod.log("nvidia-dcgm-exporter")
    rows = dcp_rows()
    check(re.search(rf"listening.*metrics={rows}.*collectors=" + re.escape(DCP_CSV), log) is not None,
          f"the exporter loaded {DCP_CSV} ({rows} metrics: every active row of dcgm-exporter's own metrics-config/upstream/dcp-metrics-included.csv)", log)
    check(f"{DCP_CSV}:" not in log, "no row of it is skipped (a skip warning names file:line)", log)
    check(pod.state("nvidia-dcgm-exporter") == "CONTAINER_RUNNING", "the container is still running")
    pod.remove()


def pod_simulated(lab: Lab, image: str, kubelet_dir: Path):
    print("pod 2 (simulated): args --backend=auto --sim-seed=1 -c 1000", flush=True)
    port = free_port()
    # -c 1000: a sample every second (default 30 s), so the pod labels show within seconds.
    pod = start_exporter(lab, "exporter-sim", image, port, ["--backend=auto", "--sim-seed=1", "-c", "1000"], kubelet_dir)

    def attributed():
        s = scrape(port)
        return s if series(s, "DCGM_FI_DEV_GPU_UTIL", pod="llm-train-0") else None
    samples = wait_for(attributed, PATIENCE, "a GPU series with the fake kubelet's pod label")
    util = series(samples, "DCGM_FI_DEV_GPU_UTIL")
    check(len(util) == 8, f"8 simulated GPUs serve DCGM_FI_DEV_GPU_UTIL ({len(util)})")
    check(all(l.get("hostname") == NODE_NAME for _, l, _ in util), f"every series has hostname=\"{NODE_NAME}\" (NODE_NAME)")
    train = series(samples, "DCGM_FI_DEV_GPU_UTIL", pod="llm-train-0", namespace="ml", container="trainer")
    check(len(train) == 2, "GPUs 0 and 1 carry pod=\"llm-train-0\", namespace=\"ml\", container=\"trainer\"")
    check(series(samples, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") != [], "the dcp CSV's profiling rows are served")
    check(series(samples, "gpu_exporter_build_info", backend="sim") != [], "gpu_exporter_build_info{backend=\"sim\"}")
    up = series(samples, "gpu_exporter_pod_resources_up")
    check(up and up[0][2] == 1, "gpu_exporter_pod_resources_up 1 (the mounted kubelet socket answers)")
    st, _ = probe(port, "/ready")
    check(st == 200, "GET /ready -> 200")
    log = pod.log("nvidia-dcgm-exporter")
    check("--backend auto" in log and "libnvidia-ml.so.1" in log and "simulated" in log,
          "the log says why it fell back to the simulator", log)
    pod.remove()


STANDIN_NODE = """\
driver_version = 550.54.15
nvml_version = 12.550.54.15
cuda_version = 12040
gpus = 2
"""


def standin_node() -> str:
    text = STANDIN_NODE
    for uuid, (i, temp) in STANDIN_GPUS.items():
        g = f"gpu.{i}."
        text += "".join(f"{g}{k} = {v}\n" for k, v in [
            ("uuid", uuid), ("name", "NVIDIA H100 80GB HBM3"), ("brand", 14), ("minor", i),
            ("pci_bus_id", f"00000000:{0x19 + int(i):02X}:00.0"), ("serial", f"16523240{i}"),
            ("temp", temp), ("power_mw", 302000), ("power_limit_mw", 700000),
            ("enforced_limit_mw", 700000), ("pstate", 0), ("clock.sm", 1980), ("clock.mem", 2619),
            ("util.gpu", 75), ("util.mem", 30), ("enc", 0), ("dec", 0),
            ("mem.total", 85899345920), ("mem.reserved", 536870912), ("mem.used", 10737418240),
            ("mem.free", 85899345920 - 536870912 - 10737418240),
        ])
    return text


def pod_nvml(lab: Lab, image: str, kubelet_dir: Path, node_dir: Path):
    print("pod 3 (nvml): runtimeClassName nvidia injects the NVML stand-in; args --backend nvml -c 1000", flush=True)
    port = free_port()
    pod = start_exporter(
        lab, "exporter-nvml", image, port, ["--backend", "nvml", "-c", "1000"], kubelet_dir,
        env_extra={"NVML_STANDIN_CONFIG": "/etc/nvml-standin/node.conf"},
        mounts=[(str(node_dir), "/etc/nvml-standin", True)],
        runtime_handler="nvidia",
    )
    toolkit_log = lab.read_log("toolkit.log")
    check("injected" in toolkit_log and "/usr/lib64/libnvidia-ml.so.1" in toolkit_log,
          "the toolkit stand-in bind-mounted the library at /usr/lib64/libnvidia-ml.so.1", toolkit_log)
    check(re.search(r"update-ldcache \['/usr/lib64'\] .*rc=0", toolkit_log) is not None,
          "its createContainer hook ran the image's /sbin/ldconfig in the container (rc 0)", toolkit_log)

    def served():
        s = scrape(port)
        return s if len(series(s, "DCGM_FI_DEV_GPU_TEMP")) == 2 and series(s, "DCGM_FI_DEV_GPU_TEMP", pod="infer-0") else None
    try:
        samples = wait_for(served, PATIENCE, "the stand-in's two GPUs with pod labels")
    except LabError as e:
        raise AssertionError(f"{e}\nlog:\n{pod.log('nvidia-dcgm-exporter')}") from e
    for uuid, (i, temp) in STANDIN_GPUS.items():
        got = series(samples, "DCGM_FI_DEV_GPU_TEMP", gpu=i, UUID=uuid)
        check(len(got) == 1 and got[0][2] == float(temp) and got[0][1].get("modelName") == "NVIDIA H100 80GB HBM3"
              and got[0][1].get("hostname") == NODE_NAME and got[0][1].get("DCGM_FI_DRIVER_VERSION") == "550.54.15",
              f"DCGM_FI_DEV_GPU_TEMP{{gpu=\"{i}\",UUID=\"{uuid}\"}} {temp} with modelName, hostname, driver version",
              str(got))
    check(len(series(samples, "DCGM_FI_DEV_GPU_TEMP", pod="infer-0", namespace="serving", container="server")) == 1,
          "GPU 1 carries pod=\"infer-0\", namespace=\"serving\", container=\"server\"")
    check(series(samples, "gpu_exporter_build_info", backend="nvml") != [], "gpu_exporter_build_info{backend=\"nvml\"}")
    # The library was found through the ld cache, not a default directory: the exporter mapped
    # the injected file, the container's cache lists it, and the image's loader does not search
    # /usr/lib64 by itself.
    pid = pod.pid("nvidia-dcgm-exporter")
    maps = Path(f"/proc/{pid}/maps").read_text()
    check("/usr/lib64/libnvidia-ml.so.1" in maps, f"the exporter (host PID {pid}) mapped /usr/lib64/libnvidia-ml.so.1")
    cache = Path(f"/proc/{pid}/root/etc/ld.so.cache").read_bytes()
    check(b"/usr/lib64/libnvidia-ml.so.1" in cache, "the container's /etc/ld.so.cache lists /usr/lib64/libnvidia-ml.so.1")
    loader = next(Path(f"/proc/{pid}/root/lib/x86_64-linux-gnu").glob("ld-linux-*.so.*"))
    search = subprocess.run([str(loader), "--help"], capture_output=True, text=True, timeout=10).stdout
    default_dirs = [l.split()[0] for l in search.splitlines() if "(system search path)" in l]
    check(default_dirs and not any(d.startswith("/usr/lib64") for d in default_dirs),
          f"the image's loader searches {default_dirs} by default (no /usr/lib64): the cache is what found it")
    st, body = probe(port, "/ready")
    check(st == 200, "GET /ready -> 200", body)
    # Runbooks: `kubectl exec ... -- dcgm-exporter --version` and `--list-devices` in the running
    # container (the container's env names the exporter's port: listing must not bind it).
    rc, out, err = pod.exec("nvidia-dcgm-exporter", ["dcgm-exporter", "--version"])
    check(rc == 0 and "gpu-exporter" in out + err, f"exec dcgm-exporter --version -> 0 ({(out + err).strip()!r})",
          f"rc={rc}\n{out}\n{err}")
    rc, out, err = pod.exec("nvidia-dcgm-exporter", ["dcgm-exporter", "--backend", "nvml", "--list-devices"])
    listed = [l for l in out.splitlines() if l.startswith("GPU ")]
    check(rc == 0 and len(listed) == len(STANDIN_GPUS) and all(u in out for u in STANDIN_GPUS),
          f"exec dcgm-exporter --list-devices -> 0, listing the {len(STANDIN_GPUS)} GPUs", f"rc={rc}\n{out}\n{err}")
    check("in use" not in err and "listening" not in err, "--list-devices did not try the port", err)
    check(probe(port, "/health")[0] == 200 and pod.state("nvidia-dcgm-exporter") == "CONTAINER_RUNNING",
          "the running exporter still serves")
    log = pod.log("nvidia-dcgm-exporter")
    check("cannot load libnvidia-ml" not in log, "the log has no NVML load failure", log)
    pod.remove()


A100_GPUS = {
    "GPU-a100a100-0000-4a6b-9d1e-00000000a100": "0",
    "GPU-a100a100-1111-4a6b-9d1e-00000000a100": "1",
}
PROF_FIELDS = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004,
    "DCGM_FI_PROF_DRAM_ACTIVE": 1005,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1009,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 1010,
}


def dcp_prof_rows() -> set:
    text = (REPO / "metrics-config" / "upstream" / "dcp-metrics-included.csv").read_text()
    return {l.split(",")[0].strip() for l in text.splitlines()
            if l.strip().startswith("DCGM_FI_PROF_")}


def a100_node() -> str:
    """The NVML stand-in as two A100s without GPM (their profiling fields need DCGM)."""
    text = STANDIN_NODE
    for uuid, i in A100_GPUS.items():
        g = f"gpu.{i}."
        text += "".join(f"{g}{k} = {v}\n" for k, v in [
            ("uuid", uuid), ("name", "NVIDIA A100-SXM4-80GB"), ("brand", 14), ("minor", i), ("gpm", 0),
            ("pci_bus_id", f"00000000:{0x27 + int(i):02X}:00.0"), ("serial", f"13240{i}"),
            ("temp", 40 + int(i)), ("power_mw", 250000), ("power_limit_mw", 400000),
            ("enforced_limit_mw", 400000), ("pstate", 0), ("clock.sm", 1410), ("clock.mem", 1593),
            ("util.gpu", 60), ("util.mem", 20), ("enc", 0), ("dec", 0),
            ("mem.total", 85899345920), ("mem.reserved", 536870912), ("mem.used", 10737418240),
            ("mem.free", 85899345920 - 536870912 - 10737418240),
        ])
    return text


def prof_value(gpu: str, field: int) -> float:
    """What the stand-in's hostengine holds for `field` of NVML GPU `gpu`: distinct everywhere."""
    return (field - 1000) / 100 + int(gpu) / 1000


def dcgm_hostengine(up: bool) -> str:
    """The DCGM stand-in's hostengine: the A100s numbered the other way round from NVML (so a value
    lands on the right series only when the exporter maps DCGM's GPUs by UUID)."""
    lines = [f"hostengine = {'up' if up else 'down'}", f"gpus = {len(A100_GPUS)}",
             "metricgroup.0 = 1 0 1001 1002 1003 1004 1005", "metricgroup.1 = 2 0 1009 1010"]
    for uuid, i in A100_GPUS.items():
        dcgm_id = len(A100_GPUS) - 1 - int(i)
        lines.append(f"uuid.{dcgm_id} = {uuid}")
        lines += [f"value.1.{dcgm_id}.{f} = {prof_value(i, f)!r}" for f in PROF_FIELDS.values()]
    return "\n".join(lines) + "\n"


def standin_counters(path: Path) -> dict:
    if not path.exists():
        return {}
    return {k.strip(): int(v) for k, _, v in (l.partition(" = ") for l in path.read_text().splitlines()) if v}


def pod_dcgm(lab: Lab, image: str, kubelet_dir: Path, mode: str):
    embedded = mode == "embedded"
    print(f"pod (dcgm-{mode}): the DCGM variant on two A100 stand-ins, the Operator's "
          f"{'default (embedded DCGM)' if embedded else 'standalone DCGM (DCGM_REMOTE_HOSTENGINE_INFO)'}", flush=True)
    base = lab.dir / f"dcgm-{mode}"
    (base / "nvml").mkdir(parents=True)
    (base / "nvml" / "node.conf").write_text(a100_node())
    (base / "dcgm").mkdir()
    # Embedded: no hostengine is up, so only the in-process one can serve.
    (base / "dcgm" / "hostengine.conf").write_text(dcgm_hostengine(up=not embedded))
    (base / "status").mkdir()
    counters = base / "status" / "calls"
    env = {
        "DCGM_EXPORTER_INTERVAL": "1000",
        "NVML_STANDIN_CONFIG": "/etc/nvml-standin/node.conf",
        "DCGM_STANDIN_CONFIG": "/etc/dcgm-standin/hostengine.conf",
        "DCGM_STANDIN_STATUS": "/var/run/dcgm-standin/calls",
    }
    if not embedded:
        env["DCGM_REMOTE_HOSTENGINE_INFO"] = "localhost:5555"
    port = free_port()
    pod = start_exporter(
        lab, f"exporter-dcgm-{mode}", image, port, [], kubelet_dir, env_extra=env,
        mounts=[(str(base / "nvml"), "/etc/nvml-standin", True), (str(base / "dcgm"), "/etc/dcgm-standin", True),
                (str(base / "status"), "/var/run/dcgm-standin", False)],
        runtime_handler="nvidia",
    )
    wanted = dcp_prof_rows()
    check(wanted and wanted <= set(PROF_FIELDS), f"the dcp CSV's profiling rows: {sorted(wanted)}")

    def served():
        s = scrape(port)
        return s if all(len(series(s, name)) == len(A100_GPUS) for name in wanted) else None
    try:
        samples = wait_for(served, PATIENCE, f"{mode}: every DCGM_FI_PROF_* row for both A100s")
    except LabError as e:
        raise AssertionError(f"{e}\nlog:\n{pod.log('nvidia-dcgm-exporter')}\ncounters: {standin_counters(counters)}") from e
    for uuid, i in A100_GPUS.items():
        for name in sorted(wanted):
            got = series(samples, name, gpu=i, UUID=uuid)
            check(len(got) == 1 and got[0][2] == prof_value(i, PROF_FIELDS[name])
                  and got[0][1].get("modelName") == "NVIDIA A100-SXM4-80GB",
                  f"{mode}: {name}{{gpu=\"{i}\"}} {prof_value(i, PROF_FIELDS[name])} (the hostengine's value of that UUID)",
                  str(got))
    check(len(series(samples, "DCGM_FI_DEV_GPU_TEMP")) == len(A100_GPUS), f"{mode}: NVML still serves the rest")
    label = "embedded" if embedded else "remote"
    mode_series = series(samples, "gpu_exporter_dcgm_mode", mode=label)
    check(mode_series and mode_series[0][2] == 1, f"{mode}: gpu_exporter_dcgm_mode{{mode=\"{label}\"}} 1")
    connected = series(samples, "gpu_exporter_dcgm_connected")
    check(connected and connected[0][2] == 1, f"{mode}: gpu_exporter_dcgm_connected 1")
    check(not series(samples, "gpu_exporter_fields_unavailable", reason="needs_dcgm_profiling"),
          f"{mode}: no field reported as needing DCGM")
    calls = standin_counters(counters)
    if embedded:
        check(calls.get("dcgmStartEmbedded_v2", 0) == 1 and calls.get("dcgmConnect_v2", 0) == 0
              and calls.get("embedded.running") == 1,
              "embedded: dcgmStartEmbedded_v2 once, no dcgmConnect_v2 (no -r)", str(calls))
    else:
        check(calls.get("dcgmConnect_v2", 0) >= 1 and calls.get("dcgmStartEmbedded_v2", 0) == 0,
              "standalone: dcgmConnect_v2 to localhost:5555, no embedded hostengine", str(calls))
    # DCGM's library was found by name through the image's ld cache at the path of NVIDIA's own.
    pid = pod.pid("nvidia-dcgm-exporter")
    maps = Path(f"/proc/{pid}/maps").read_text()
    check("/usr/lib/x86_64-linux-gnu/libdcgm.so.4" in maps,
          f"{mode}: the exporter (host PID {pid}) mapped /usr/lib/x86_64-linux-gnu/libdcgm.so.4")
    log = pod.log("nvidia-dcgm-exporter")
    want_log = "the embedded hostengine" if embedded else "the hostengine at localhost:5555"
    check(f"connected to {want_log}" in log, f"{mode}: the log says it reads {want_log}", log)
    # The kubelet's way to end a pod: StopContainer with a grace period (SIGTERM), then remove.
    lab.cri.stop_container(pod.containers["nvidia-dcgm-exporter"], grace_s=10)
    if embedded:
        calls = standin_counters(counters)
        check(calls.get("dcgmStopEmbedded", 0) == 1 and calls.get("embedded.running") == 0,
              "embedded: SIGTERM stopped the embedded hostengine (dcgmStopEmbedded) before the exporter exited",
              f"{calls}\n{pod.log('nvidia-dcgm-exporter')}")
    pod.remove()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image-tar", required=True)
    ap.add_argument("--image", required=True, help="the archive's image reference")
    ap.add_argument("--fake-kubelet", required=True)
    ap.add_argument("--nvml-standin", required=True, help="the C NVML stand-in, built as libnvidia-ml.so.1")
    ap.add_argument("--dcgm-image-tar", help="the image variant with DCGM's libraries (the libdcgm stand-in)")
    ap.add_argument("--dcgm-image", help="that archive's image reference")
    ap.add_argument("--keep", action="store_true", help="keep the lab's directory (logs) afterwards")
    a = ap.parse_args()
    if bool(a.dcgm_image_tar) != bool(a.dcgm_image):
        ap.error("--dcgm-image-tar and --dcgm-image go together")
    start = time.monotonic()
    # A timeout's SIGTERM unwinds through the cleanup below like any failure.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("image_test.py: terminated"))
    lab = Lab(keep=a.keep)
    try:
        try:
            wrapper = lab.dir / "nvidia-container-runtime"
            wrapper.write_text(
                "#!/bin/sh\n"
                f"export STANDIN_RUNC=\"$(command -v runc)\" STANDIN_LIB='{Path(a.nvml_standin).resolve()}' "
                f"STANDIN_LIB_DIR=/usr/lib64 STANDIN_LOG='{lab.dir / 'toolkit.log'}'\n"
                f"exec '{sys.executable}' '{Path(__file__).resolve().parent / 'toolkit_standin.py'}' \"$@\"\n")
            wrapper.chmod(0o755)
            lab.add_runtime("nvidia", str(wrapper))
            lab.start_containerd()
            lab.import_image(a.image_tar)
            print(f"imported {a.image_tar} as {a.image}", flush=True)

            sim_dir = lab.dir / "kubelet-sim"
            fake_kubelet(lab, a.fake_kubelet, REPO / "tests/fixtures/pods/h100-seed1.toml", sim_dir, "fake-kubelet-sim.log")
            pod_operator(lab, a.image, sim_dir)
            pod_simulated(lab, a.image, sim_dir)

            node_dir = lab.dir / "nvml-standin"
            node_dir.mkdir()
            (node_dir / "node.conf").write_text(standin_node())
            gpu1 = next(u for u, (i, _) in STANDIN_GPUS.items() if i == "1")
            assignments = lab.dir / "standin-pods.toml"
            assignments.write_text(
                f'[[assignment]]\nnamespace = "serving"\npod = "infer-0"\ncontainer = "server"\ndevices = ["{gpu1}"]\n')
            nvml_dir = lab.dir / "kubelet-nvml"
            fake_kubelet(lab, a.fake_kubelet, assignments, nvml_dir, "fake-kubelet-nvml.log")
            pod_nvml(lab, a.image, nvml_dir, node_dir)

            if a.dcgm_image_tar:
                lab.import_image(a.dcgm_image_tar)
                print(f"imported {a.dcgm_image_tar} as {a.dcgm_image}", flush=True)
                for mode in ("embedded", "standalone"):
                    pod_dcgm(lab, a.dcgm_image, sim_dir, mode)
        except BaseException:
            print("--- containerd log (tail) ---\n" + lab.containerd_log(), file=sys.stderr)
            print("--- toolkit stand-in log ---\n" + lab.read_log("toolkit.log"), file=sys.stderr)
            raise
    finally:
        problems = lab.cleanup()
    # The pods were removed through CRI and containerd stopped: nothing should have needed force.
    check(not problems, "clean shutdown: pods removed through CRI, nothing killed or left mounted", "\n".join(problems))
    print(f"image test passed: {len(checks)} checks in {time.monotonic() - start:.1f}s", flush=True)


if __name__ == "__main__":
    main()
