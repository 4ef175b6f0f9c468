"""A private containerd with its CRI plugin, driven like a kubelet: reusable pieces for tests that
need real pods (scripts/ci-image.sh; process attribution against real containers).

Facts this relies on are in shared/reference/real-parts.md: containerd 1.6 + runc from Debian, its
own root/state/socket, `restrict_oom_score_adj = true` (root lacks CAP_SYS_RESOURCE here),
host-network pods with an empty hostname, images built locally (no registry).

    from lab import Lab
    with Lab() as lab:                       # temp dir; everything is undone on exit
        lab.start_containerd()               # also imports a static pause image
        lab.import_image("/tmp/img.tar")     # docker-archive or oci-archive
        pod = lab.run_pod("exporter", namespace="gpu-operator")
        cid = pod.run_container("exporter", "localhost/gpu-exporter:0.1.0", args=[...])
        lab.wait_for(lambda: ..., 30, "what")

Needs: root, containerd, runc, buildah and gcc (Debian packages), grpcio and grpcio-tools (pip).
Every wait is bounded. Cleanup (always, also after a failure) removes the pods through CRI, stops
containerd and any shim it left, unmounts what is left under the temp dir, removes the cgroup
directories of the lab's pods, and deletes the temp dir.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable

HERE = Path(__file__).resolve().parent
PAUSE_IMAGE = "localhost/lab-pause:1"
WORKLOAD_IMAGE = "localhost/lab-workload:1"

PAUSE_SOURCE = """
    #include <signal.h>
    #include <unistd.h>
    static void stop(int sig) { (void)sig; _exit(0); }
    int main(void) {
        signal(SIGTERM, stop);
        signal(SIGINT, stop);
        for (;;) pause();
    }
    """

WORKLOAD_SOURCE = """
    #include <signal.h>
    #include <unistd.h>
    static void stop(int sig) { (void)sig; _exit(0); }
    int main(void) {
        signal(SIGTERM, stop);
        signal(SIGINT, stop);
        if (fork() < 0) _exit(1);
        for (;;) pause();
    }
    """


class LabError(Exception):
    """A step of the lab failed; the message says which and why."""


def wait_for(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.1):
    """Polls `cond` until it returns something truthy (returned) or `timeout` seconds pass (raises
    LabError naming `what` and the last exception `cond` raised, if any)."""
    deadline = time.monotonic() + timeout
    last_err = None
    while True:
        try:
            value = cond()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - reported if the wait fails
            last_err = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_err!r})" if last_err else ""
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def http_get(host: str, port: int, path: str, headers: dict | None = None, timeout: float = 5.0):
    """One HTTP/1.1 GET; returns (status, body text)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def probe(port: int, path: str = "/health", host: str = "127.0.0.1") -> tuple[int, str]:
    """An httpGet probe as the kubelet sends it (its User-Agent, no credentials)."""
    return http_get(host, port, path, {"User-Agent": "kube-probe/1.35", "Accept": "*/*"})


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    """Prometheus text exposition → (name, labels, value); raises on a line it cannot read."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise LabError(f"unparseable exposition line: {line!r}")
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def series(samples, name: str, **labels) -> list[tuple[str, dict, float]]:
    """The samples of `name` whose labels include `labels`."""
    return [s for s in samples if s[0] == name and all(s[1].get(k) == v for k, v in labels.items())]


def scrape(port: int, host: str = "127.0.0.1") -> list[tuple[str, dict, float]]:
    """GET /metrics, parsed."""
    status, body = http_get(host, port, "/metrics")
    if status != 200:
        raise LabError(f"/metrics on {host}:{port} answered {status}: {body[:500]}")
    return parse_metrics(body)


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid` (/proc/<pid>/task/*/children)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(x) for x in (task / "children").read_text().split()]
    return sorted(out)


def run(cmd: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Runs a command with a bounded time; raises LabError with its output when it fails."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise LabError(f"{' '.join(cmd)}: still running after {timeout}s") from e
    if p.returncode != 0:
        raise LabError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p


_CRI_MODULES = None


def _cri_modules():
    """Compiles tests/containerd/cri_v1.proto with grpcio-tools into a temporary directory
    (removed when the process exits) and imports the generated modules; once per process."""
    global _CRI_MODULES
    if _CRI_MODULES is None:
        import atexit
        from grpc_tools import protoc  # type: ignore

        # Under the labs' base directory when a script gives one, so its exit trap removes it
        # even when this process is killed before atexit runs.
        out = Path(tempfile.mkdtemp(prefix="gpu-exporter-cri-", dir=os.environ.get("GPU_EXPORTER_LAB_BASE") or None))
        atexit.register(shutil.rmtree, out, True)
        proto = HERE / "cri_v1.proto"
        rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={out}", f"--grpc_python_out={out}", str(proto)])
        if rc != 0:
            raise LabError(f"protoc failed on {proto} ({rc})")
        sys.path.insert(0, str(out))
        _CRI_MODULES = (importlib.import_module("cri_v1_pb2"), importlib.import_module("cri_v1_pb2_grpc"))
    return _CRI_MODULES


class Cri:
    """A CRI v1 RuntimeService client on a unix socket."""

    def __init__(self, socket: Path, timeout: float = 30.0):
        import grpc  # type: ignore

        self.pb, pb_grpc = _cri_modules()
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.rt = pb_grpc.RuntimeServiceStub(self.channel)
        self.timeout = timeout

    def close(self):
        self.channel.close()

    def version(self):
        return self.rt.Version(self.pb.VersionRequest(version="v1"), timeout=self.timeout)

    def run_pod_sandbox(self, config, runtime_handler: str = "") -> str:
        req = self.pb.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler)
        return self.rt.RunPodSandbox(req, timeout=self.timeout).pod_sandbox_id

    def stop_pod_sandbox(self, pod_id: str):
        self.rt.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout)

    def remove_pod_sandbox(self, pod_id: str):
        self.rt.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout)

    def create_container(self, pod_id: str, config, sandbox_config) -> str:
        req = self.pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=sandbox_config)
        return self.rt.CreateContainer(req, timeout=self.timeout).container_id

    def start_container(self, cid: str):
        self.rt.StartContainer(self.pb.StartContainerRequest(container_id=cid), timeout=self.timeout)

    def stop_container(self, cid: str, grace_s: int = 5):
        self.rt.StopContainer(self.pb.StopContainerRequest(container_id=cid, timeout=grace_s), timeout=self.timeout + grace_s)

    def container_status(self, cid: str):
        return self.rt.ContainerStatus(self.pb.ContainerStatusRequest(container_id=cid), timeout=self.timeout).status

    def sandbox_pid(self, pod_id: str) -> int:
        """The sandbox's own process (the pause process) as a host PID (verbose status info)."""
        req = self.pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True)
        resp = self.rt.PodSandboxStatus(req, timeout=self.timeout)
        return int(json.loads(resp.info["info"])["pid"])

    def exec_sync(self, cid: str, cmd: list[str], timeout_s: int = 30):
        """ExecSync, as `kubectl exec` runs a command in a running container: (exit code,
        stdout, stderr)."""
        req = self.pb.ExecSyncRequest(container_id=cid, cmd=cmd, timeout=timeout_s)
        resp = self.rt.ExecSync(req, timeout=self.timeout + timeout_s)
        return resp.exit_code, resp.stdout.decode(errors="replace"), resp.stderr.decode(errors="replace")

    def container_pid(self, cid: str) -> int:
        """The container's init PID on the host (containerd's verbose status info)."""
        resp = self.rt.ContainerStatus(self.pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=self.timeout)
        return int(json.loads(resp.info["info"])["pid"])


class Pod:
    """A pod sandbox created through CRI, the way the kubelet creates it."""

    def __init__(self, lab: "Lab", name: str, namespace: str, uid: str, config, sandbox_id: str):
        self.lab, self.name, self.namespace, self.uid = lab, name, namespace, uid
        self.config, self.id = config, sandbox_id
        self.containers: dict[str, str] = {}

    @property
    def log_dir(self) -> Path:
        return Path(self.config.log_directory)

    def run_container(
        self,
        name: str,
        image: str,
        args: Iterable[str] = (),
        command: Iterable[str] = (),
        env: dict[str, str] | None = None,
        mounts: Iterable[tuple[str, str, bool]] = (),
        privileged: bool = False,
    ) -> str:
        """CreateContainer + StartContainer. `mounts` are (host path, container path, read-only).
        Returns the container id; the log is at `log_path(name)`."""
        pb = self.lab.cri.pb
        labels = {
            "io.kubernetes.pod.name": self.name,
            "io.kubernetes.pod.namespace": self.namespace,
            "io.kubernetes.pod.uid": self.uid,
            "io.kubernetes.container.name": name,
        }
        cfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=image),
            command=list(command),
            args=list(args),
            envs=[pb.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            mounts=[pb.Mount(host_path=h, container_path=c, readonly=ro) for h, c, ro in mounts],
            labels=labels,
            log_path=f"{name}/0.log",
            linux=pb.LinuxContainerConfig(
                security_context=pb.LinuxContainerSecurityContext(
                    privileged=privileged,
                    namespace_options=self.config.linux.security_context.namespace_options,
                )
            ),
        )
        cid = self.lab.cri.create_container(self.id, cfg, self.config)
        self.lab.cri.start_container(cid)
        self.containers[name] = cid
        return cid

    def log_path(self, container: str) -> Path:
        return self.log_dir / container / "0.log"

    def log(self, container: str) -> str:
        """The container's output (CRI log lines with their timestamp/stream/tag prefix removed)."""
        try:
            raw = self.log_path(container).read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(line.split(" ", 3)[3] if line.count(" ") >= 3 else line for line in raw.splitlines())

    def exec(self, container: str, cmd: list[str], timeout_s: int = 30):
        """Runs `cmd` in the running container (CRI ExecSync): (exit code, stdout, stderr)."""
        return self.lab.cri.exec_sync(self.containers[container], cmd, timeout_s)

    def pid(self, container: str) -> int:
        """The container's main process, as a host PID."""
        return self.lab.cri.container_pid(self.containers[container])

    def pause_pid(self) -> int:
        """The sandbox's pause process, as a host PID (its cgroup names the sandbox id)."""
        return self.lab.cri.sandbox_pid(self.id)

    def state(self, container: str) -> str:
        st = self.lab.cri.container_status(self.containers[container])
        return self.lab.cri.pb.ContainerState.Name(st.state)

    def remove(self):
        """StopPodSandbox + RemovePodSandbox (idempotent)."""
        if self.id is None:
            return
        self.lab.cri.stop_pod_sandbox(self.id)
        self.lab.cri.remove_pod_sandbox(self.id)
        self.lab.pods.remove(self)
        self.id = None


class Lab:
    """A temp dir holding a private containerd (config, root, state, socket, logs)."""

    def __init__(self, keep: bool = False, log: Callable[[str], None] = print, base: str | None = None):
        """`base` (default $GPU_EXPORTER_LAB_BASE, else the temp dir) is where the lab's own
        directory is made; `python3 lab.py teardown DIR` undoes a lab whose process died."""
        self.keep = keep
        self.log = log
        base = base or os.environ.get("GPU_EXPORTER_LAB_BASE") or None
        self.dir = Path(tempfile.mkdtemp(prefix="gpu-exporter-lab-", dir=base))
        self.socket = self.dir / "containerd.sock"
        self.proc: subprocess.Popen | None = None
        self.cri: Cri | None = None
        self.pods: list[Pod] = []
        self.children: list[subprocess.Popen] = []
        self.runtimes: dict[str, str] = {}
        # What teardown needs, on disk so that another process can undo a lab that died.
        self.state = {
            "pod_uids": [],
            "run_containerd_existed": Path("/run/containerd").exists(),
            "run_containerd_s_existed": Path("/run/containerd/s").exists(),
            "kubepods_existed": [str(d) for d in _cgroup_roots() if (d / "kubepods").exists()],
        }
        self._save_state()

    def _save_state(self):
        (self.dir / STATE_FILE).write_text(json.dumps(self.state))

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()
        return False

    def add_runtime(self, handler: str, binary: str):
        """A CRI runtime handler (a pod's runtimeClassName) whose OCI runtime binary is `binary`
        (e.g. a wrapper around runc that edits the bundle, like nvidia-container-runtime).
        Call before start_containerd."""
        self.runtimes[handler] = binary

    def _config(self) -> str:
        d = self.dir
        for sub in ("root", "state", "runc", "opt", "cni-conf", "cni-bin", "pod-logs"):
            (d / sub).mkdir(exist_ok=True)

        def runtime(name: str, binary: str | None) -> str:
            binary_line = f'BinaryName = "{binary}"' if binary else ""
            return textwrap.dedent(f"""
                [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{name}]
                  runtime_type = "io.containerd.runc.v2"
                  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{name}.options]
                    Root = "{d}/runc"
                    SystemdCgroup = false
                    {binary_line}
                """)

        runtimes = runtime("runc", None) + "".join(runtime(k, v) for k, v in self.runtimes.items())
        return textwrap.dedent(f"""
            version = 2
            root = "{d}/root"
            state = "{d}/state"
            [grpc]
              address = "{self.socket}"
            [ttrpc]
              address = "{self.socket}.ttrpc"
            [debug]
              address = ""
            [metrics]
              address = ""
            [plugins."io.containerd.internal.v1.opt"]
              path = "{d}/opt"
            [plugins."io.containerd.grpc.v1.cri"]
              sandbox_image = "{PAUSE_IMAGE}"
              restrict_oom_score_adj = true
              disable_apparmor = true
              stream_server_address = "127.0.0.1"
              stream_server_port = "0"
              enable_selinux = false
              [plugins."io.containerd.grpc.v1.cri".cni]
                bin_dir = "{d}/cni-bin"
                conf_dir = "{d}/cni-conf"
              [plugins."io.containerd.grpc.v1.cri".containerd]
                snapshotter = "overlayfs"
                default_runtime_name = "runc"
            """) + textwrap.indent(runtimes, "    ")

    def start_containerd(self, timeout: float = 30):
        """Starts containerd with the lab's config, waits for CRI to answer, imports the pause
        image."""
        self._launch_containerd(timeout)
        self.import_image(self.build_pause_image())

    def _launch_containerd(self, timeout: float):
        cfg = self.dir / "containerd.toml"
        cfg.write_text(self._config())
        logf = open(self.dir / "containerd.log", "a")
        self.proc = subprocess.Popen(
            ["containerd", "--config", str(cfg), "--log-level", "info"],
            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
        )
        logf.close()
        wait_for(lambda: self.socket.exists() or self.proc.poll() is not None, timeout, f"containerd socket {self.socket}")
        if self.proc.poll() is not None:
            raise LabError(f"containerd exited ({self.proc.returncode}):\n{self.containerd_log()}")
        if self.cri is None:
            self.cri = Cri(self.socket)
        v = wait_for(lambda: self.cri.version(), timeout, "CRI Version")
        self.log(f"containerd up: {v.runtime_name} {v.runtime_version} (CRI {v.runtime_api_version}), socket {self.socket}")

    def stop_containerd(self, grace: float = 10):
        """Stops containerd (SIGTERM, as a service manager does) and waits until it has exited and
        its socket is gone. The pods' shims and processes keep running, as on a node."""
        if self.proc is not None:
            _stop(self.proc, grace=grace)
        wait_for(lambda: not self.socket.exists(), grace, f"containerd socket {self.socket} to go")
        self.log(f"containerd stopped ({self.proc.returncode if self.proc else '-'})")

    def restart_containerd(self, timeout: float = 30):
        """Starts containerd again after `stop_containerd`: same config, root and state, so it
        finds its pods and their running shims again."""
        self._launch_containerd(timeout)

    def containerd_log(self, tail: int = 60) -> str:
        try:
            return "\n".join((self.dir / "containerd.log").read_text(errors="replace").splitlines()[-tail:])
        except FileNotFoundError:
            return ""

    def ctr(self, *args: str, timeout: float = 120) -> str:
        return run(["ctr", "-a", str(self.socket), "-n", "k8s.io", *args], timeout=timeout).stdout

    def import_image(self, tar: str | Path):
        """Imports an image archive into the CRI namespace (k8s.io), unpacked for the snapshotter."""
        self.ctr("images", "import", str(tar))

    # ---- images ------------------------------------------------------------------------------

    def build_image(self, rootfs: Path, tag: str, entrypoint: list[str], out: Path) -> Path:
        """Packs a directory into a single-layer image (buildah, vfs storage in the lab dir) and
        writes it as a docker-archive."""
        store = self.dir / "buildah"
        base = ["buildah", "--root", str(store / "root"), "--runroot", str(store / "run"), "--storage-driver", "vfs"]
        ctr = run(base + ["from", "--quiet", "scratch"]).stdout.strip()
        run(base + ["copy", "--quiet", ctr, f"{rootfs}/", "/"])
        run(base + ["config", "--entrypoint", json.dumps(entrypoint), "--cmd", "", ctr])
        run(base + ["commit", "--quiet", "--format", "oci", "--rm", ctr, tag])
        run(base + ["push", "--quiet", tag, f"docker-archive:{out}:{tag}"])
        return out

    def build_static_image(self, name: str, c_source: str, tag: str) -> Path:
        """An image of one static C program (`gcc -static`) at /<name>, its entrypoint; written
        as a docker-archive in the lab dir (import it with `import_image`)."""
        src = self.dir / f"{name}.c"
        src.write_text(textwrap.dedent(c_source))
        rootfs = self.dir / f"{name}-rootfs"
        rootfs.mkdir()
        run(["gcc", "-static", "-Os", "-o", str(rootfs / name), str(src)])
        return self.build_image(rootfs, tag, [f"/{name}"], self.dir / f"{name}.tar")

    def build_pause_image(self) -> Path:
        """A sandbox image: a static C program that sleeps in pause() until SIGTERM/SIGINT."""
        return self.build_static_image("pause", PAUSE_SOURCE, PAUSE_IMAGE)

    def build_workload_image(self, tag: str = WORKLOAD_IMAGE) -> Path:
        """A workload image: a static C program that forks one child and both sleep until
        SIGTERM/SIGINT, so a container has two processes (main and child)."""
        return self.build_static_image("workload", WORKLOAD_SOURCE, tag)

    # ---- pods ----------------------------------------------------------------------------------

    def run_pod(
        self,
        name: str,
        namespace: str = "default",
        host_network: bool = True,
        privileged: bool = False,
        runtime_handler: str = "",
        labels: dict[str, str] | None = None,
    ) -> Pod:
        """RunPodSandbox as the kubelet does for a BestEffort pod: cgroup parent
        /kubepods/besteffort/pod<uid>, the io.kubernetes.* labels, host network without a hostname
        (a host-network sandbox cannot set one)."""
        pb = self.cri.pb
        uid = str(uuid.uuid4())
        self.state["pod_uids"].append(uid)
        self._save_state()
        log_dir = self.dir / "pod-logs" / f"{namespace}_{name}_{uid}"
        log_dir.mkdir(parents=True)
        ns = pb.NamespaceOption(network=pb.NODE if host_network else pb.POD, pid=pb.CONTAINER, ipc=pb.POD)
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            hostname="" if host_network else name,
            log_directory=str(log_dir),
            labels={
                **(labels or {}),
                "io.kubernetes.pod.name": name,
                "io.kubernetes.pod.namespace": namespace,
                "io.kubernetes.pod.uid": uid,
            },
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=f"/kubepods/besteffort/pod{uid}",
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns, privileged=privileged),
            ),
        )
        sandbox_id = self.cri.run_pod_sandbox(cfg, runtime_handler)
        pod = Pod(self, name, namespace, uid, cfg, sandbox_id)
        self.pods.append(pod)
        return pod

    def spawn(self, cmd: list[str], log_name: str, **kw) -> subprocess.Popen:
        """A helper process (e.g. fake-kubelet) the lab stops at cleanup; output to a log file."""
        logf = open(self.dir / log_name, "w")
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        logf.close()
        self.children.append(p)
        return p

    def read_log(self, log_name: str) -> str:
        try:
            return (self.dir / log_name).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    wait_for = staticmethod(wait_for)

    # ---- cleanup -------------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Undoes everything, whatever state the lab is in: removes the pods through CRI, stops
        the helper processes and containerd, then `teardown`. Returns (and logs) what had to be
        forced or could not be undone; empty when the lab shut down cleanly."""
        problems = []
        for pod in list(self.pods):
            try:
                pod.remove()
            except Exception as e:  # noqa: BLE001
                problems.append(f"removing pod {pod.name}: {e}")
        if self.cri is not None:
            self.cri.close()
        for p in self.children:
            _stop(p)
        if self.proc is not None:
            _stop(self.proc, grace=10)
        problems += teardown(self.dir, self.state, keep=self.keep)
        if self.keep:
            self.log(f"lab kept at {self.dir}")
        for p in problems:
            self.log(f"cleanup: {p}")
        return problems


STATE_FILE = "lab-state.json"


def teardown(lab_dir: Path, state: dict, keep: bool = False) -> list[str]:
    """Forces what a graceful shutdown left: kills (by PID) the processes in the lab's pod cgroups
    and any process whose command line names the lab's directory (containerd, shims, helpers),
    unmounts what is mounted under it, removes the pods' cgroup directories (the kubelet's job),
    the kubepods directories and /run/containerd/s if the lab created them, and the directory."""
    problems = []
    roots = _cgroup_roots()
    pod_dirs = [r / "kubepods" / "besteffort" / f"pod{uid}" for r in roots for uid in state.get("pod_uids", [])]
    for _ in range(3):
        pids = set(_pids_mentioning(str(lab_dir)))
        for d in pod_dirs:
            for procs in d.rglob("cgroup.procs") if d.is_dir() else []:
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(x) for x in procs.read_text().split())
        pids.discard(os.getpid())
        if not pids:
            break
        for pid in sorted(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                problems.append(f"killed leftover process {pid}")
        with contextlib.suppress(LabError):
            wait_for(lambda: all(_gone(pid) for pid in pids), 10, "killed processes to exit")
    for target in _mounts_under(lab_dir):
        r = subprocess.run(["umount", "-l", target], capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"umount {target}: {r.stderr.strip()}")
    for d in pod_dirs:
        _rmdir_tree(d)
        if d.exists():
            problems.append(f"could not remove cgroup {d}")
    existed = set(state.get("kubepods_existed", []))
    for r in roots:
        if str(r) not in existed:
            for d in (r / "kubepods" / "besteffort", r / "kubepods"):
                with contextlib.suppress(OSError):
                    d.rmdir()
    # containerd 1.6 creates /run/containerd/s for shim sockets even with its own state dir. A
    # killed shim leaves its socket there: when the lab created the directory, sockets nobody
    # listens on any more are the lab's shims'.
    if not state.get("run_containerd_s_existed", True):
        shim_dir = Path("/run/containerd/s")
        for sock in shim_dir.glob("*") if shim_dir.is_dir() else []:
            if sock.is_socket() and not _listening(sock):
                with contextlib.suppress(OSError):
                    sock.unlink()
        with contextlib.suppress(OSError):
            shim_dir.rmdir()
    if not state.get("run_containerd_existed", True):
        with contextlib.suppress(OSError):
            Path("/run/containerd").rmdir()
    if not keep:
        shutil.rmtree(lab_dir, ignore_errors=True)
        if lab_dir.exists():
            problems.append(f"could not remove {lab_dir}")
    return problems


def _stop(p: subprocess.Popen, grace: float = 5):
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
        p.wait(timeout=grace)


def _listening(path: Path) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def _gone(pid: int) -> bool:
    """The process has exited (no longer listed, or a zombie waiting for its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _pids_mentioning(needle: str) -> list[int]:
    pids = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            pids.append(int(entry.name))
    return pids


def _mounts_under(d: Path) -> list[str]:
    """Mount points under `d`, deepest first (from /proc/self/mountinfo)."""
    prefix = str(d.resolve()) + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split(" ")[4].replace("\\040", " ")
        if target.startswith(prefix) or target == prefix[:-1]:
            found.append(target)
    return sorted(set(found), key=len, reverse=True)


def _cgroup_roots() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers and the unified one)."""
    roots = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2"):
            roots.append(Path(fields[4]))
    return sorted(set(roots))


def _rmdir_tree(d: Path):
    """Removes an (empty-of-processes) cgroup directory tree, children first."""
    if not d.is_dir():
        return
    for child in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        d.rmdir()


if __name__ == "__main__":
    # python3 lab.py teardown [--kill-mentioning TEXT] DIR...: undo labs whose process died or
    # hangs (scripts' exit traps); first kill, by PID, the processes whose command line contains
    # TEXT (the test process that owns the labs).
    if len(sys.argv) >= 2 and sys.argv[1] == "teardown":
        dirs = sys.argv[2:]
        if dirs[:1] == ["--kill-mentioning"] and len(dirs) >= 2:
            owners = set(_pids_mentioning(dirs[1])) - {os.getpid()}
            for pid in owners:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    print(f"teardown: killed {pid}, which was still running")
            with contextlib.suppress(LabError):
                wait_for(lambda: all(_gone(pid) for pid in owners), 10, "killed processes to exit")
            dirs = dirs[2:]
        for d in dirs:
            d = Path(d)
            state_path = d / STATE_FILE
            if not state_path.exists():
                continue
            for p in teardown(d, json.loads(state_path.read_text())):
                print(f"teardown {d}: {p}")
    else:
        sys.exit("usage: lab.py teardown DIR...")
