"""The pieces the Python test and benchmark drivers share (tests/e2e/e2e.py, benches/fleet/fleet.py):
a log line with a prefix, the failure exception, free loopback ports (and the port a server
started on port 0 logged), HTTP GET, polling with a
deadline, the started processes (stopped TERM, then KILL), the work directory a run keeps its logs
in, and the queries of the dashboards. Standard library only.

Importing it: `sys.path.insert(0, str(ROOT / "tests"))`, then `import harness`.
"""

import contextlib
import json
import re
import os
import pathlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

# What wait_for() treats as "not yet" (the server is not listening, answers with an error status,
# or sends something that does not parse yet): it retries on these until the deadline.
RETRIED = (OSError, urllib.error.URLError, ValueError)


def make_log(prefix):
    """A log(msg) that prints `[prefix HH:MM:SS] msg`, flushed at once."""

    def log(msg):
        print(f"[{prefix} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    return log


class Failure(Exception):
    """A check failed or a wait ran out: the driver prints it and exits 1."""


def ephemeral_ports(path="/proc/sys/net/ipv4/ip_local_port_range"):
    """The kernel's ephemeral port range (lo, hi): where bind(port 0) and outgoing connections
    take their local port. Linux's default if the file cannot be read."""
    try:
        lo, hi = (int(v) for v in pathlib.Path(path).read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


_HANDED_OUT = set()


def free_port():
    """A TCP port free on 127.0.0.1 now, for a server that binds it a moment later.

    Not one the kernel would pick for bind(0): it hands those out again at once (two calls may
    return the same port), and any outgoing connection may take one before the server binds.
    So the port comes from outside the ephemeral range, is checked by binding it, and is never
    returned twice by this process. Where a server can report its own port (gpu-exporter logs
    it), start it on port 0 instead: see logged_port()."""
    lo, hi = ephemeral_ports()
    pool = [p for p in range(10000, 65536) if not lo <= p <= hi and p not in _HANDED_OUT]
    for port in random.sample(pool, min(len(pool), 500)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    # Every port outside the ephemeral range is taken (or the range is all of them): fall back to
    # one the kernel picks, racy as that is.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def logged_port(procs, name, pattern, deadline_s=30):
    """The port a process started on port 0 says it listens on: group 1 of the first line of its
    log that matches `pattern` (a regex). Failure if it exits, or prints no such line in time."""
    rx = re.compile(pattern)

    def port():
        if not procs.alive(name):
            raise Failure(f"{name} exited with {procs.procs[name].returncode}:\n{procs.tail(name)}")
        for line in (procs.logdir / f"{name}.log").read_text(errors="replace").splitlines():
            m = rx.search(line)
            if m:
                return int(m.group(1))
        return None

    return wait_for(f"{name} to log its port (/{pattern}/)", port, deadline_s, 0.1)


def http_get(url, timeout, headers=None):
    """GETs url: (status, body bytes, response headers). HTTP error statuses raise HTTPError."""
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read(), r.headers


def wait_for(what, fn, deadline_s, interval=0.5, retried=RETRIED):
    """Polls fn() until it returns a truthy value (returned) or deadline_s passes (Failure naming
    `what` and the last error). The exceptions in `retried` count as "not yet"; others propagate."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        try:
            v = fn()
            if v:
                return v
        except retried as e:
            last = e
        time.sleep(interval)
    raise Failure(f"timed out after {deadline_s}s waiting for {what}" + (f" (last error: {last})" if last else ""))


class Procs:
    """Started processes, each logging to logdir/NAME.log, stopped (TERM, then KILL) on exit."""

    def __init__(self, logdir):
        self.procs = {}
        self.logdir = logdir

    def start(self, name, argv, env=None):
        """Starts argv in its own session, with env added to this process' environment."""
        out = open(self.logdir / f"{name}.log", "wb")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, **(env or {})), start_new_session=True)
        self.procs[name] = p
        return p

    def pid(self, name):
        return self.procs[name].pid

    def alive(self, name):
        return self.procs[name].poll() is None

    def check_alive(self):
        """Failure (with the end of its log) if any started process has exited."""
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise Failure(f"{name} exited with {p.returncode}:\n{self.tail(name)}")

    def stop(self, name, grace_s=5):
        """TERMs one process and waits up to grace_s for it to exit, then KILLs it."""
        p = self.procs[name]
        if p.poll() is None:
            p.terminate()
            self._reap(p, grace_s)

    def stop_all(self, grace_s=5):
        """TERMs every process still running at once, waits up to grace_s for them all (one
        deadline, not one each: a caller's own limit, such as run.sh's `timeout --kill-after`, must
        not kill this process half-way and leave the rest running), then KILLs whatever is left."""
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.0, deadline - time.monotonic()))
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)

    @staticmethod
    def _reap(p, grace_s):
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    def tail(self, name, n=20):
        """The last n lines of the process' log ("" if unreadable)."""
        try:
            return "\n".join((self.logdir / f"{name}.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def require_tools(tools, packages):
    """Failure naming the Debian packages to install if any of tools is not on PATH."""
    for tool in tools:
        if not shutil.which(tool):
            raise Failure(f"{tool} not found: apt-get install {packages}")


@contextlib.contextmanager
def work_dir(name, keep, log, grace_s=5):
    """A fresh /tmp/gpu-exporter-NAME-*/ with logs/, and Procs logging there: yields (work, procs).
    On the way out every process is stopped (grace_s: Procs.stop_all) and `PASS|FAIL in Ns; logs
    in ...` logged; after a pass the directory is removed unless keep."""
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"gpu-exporter-{name}-"))
    (work / "logs").mkdir()
    procs = Procs(work / "logs")
    started = time.monotonic()
    ok = False
    try:
        yield work, procs
        ok = True
    finally:
        procs.stop_all(grace_s)
        log(f"{'PASS' if ok else 'FAIL'} in {time.monotonic() - started:.0f}s; logs in {work / 'logs'}")
        if ok and not keep:
            shutil.rmtree(work, ignore_errors=True)


# Dashboard queries that read only A100 MIG instances' engine activity. The simulated fleets'
# A100s have no profiling source (NVML GPM is Hopper and newer; no DCGM is read), as on a real
# A100 node, so these must be empty (docs/nvml.md, "Profiling metrics"): (dashboard, panel refId).
NEEDS_MIG_PROFILING = (("gpu-cluster", '"Idle GPUs held by pods" B'),)


def needs_mig_profiling(where):
    """Whether a query, named `dashboard: "panel" refId ...` or `dashboard.json: ...`, is one of
    NEEDS_MIG_PROFILING."""
    return any(where.startswith((f"{d}: {p}", f"{d}.json: {p}")) for d, p in NEEDS_MIG_PROFILING)


def dashboard_targets(dashboards_dir):
    """(path, uid, what, expr, instant) of every panel target (what: `"title" refId`) and query
    variable (what: `variable NAME`, instant) of every dashboard JSON in dashboards_dir, by file."""
    out = []
    for path in sorted(dashboards_dir.glob("*.json")):
        d = json.loads(path.read_text())
        for p in d["panels"]:
            for t in p.get("targets", []):
                out.append((path, d["uid"], f'"{p["title"]}" {t["refId"]}', t["expr"], bool(t.get("instant"))))
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                out.append((path, d["uid"], f"variable {v['name']}", v["query"]["query"], True))
    return out


def as_promql(expr):
    """Grafana's label_values(sel, label) and query_result(q) as plain PromQL (instant queries)."""
    m = re.match(r"^label_values\((.*),\s*(\w+)\)$", expr.strip(), re.S)
    if m:
        return f"count by ({m.group(2)}) ({m.group(1)})"
    m = re.match(r"^query_result\((.*)\)$", expr.strip(), re.S)
    return m.group(1) if m else expr


UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}  # PromQL/Grafana duration units


def duration_s(text):
    """A PromQL, rule-file or Grafana duration ("90s", "5m", "1h30m", "500ms") in seconds; 0 for
    none (an empty or missing panel interval)."""
    return sum(int(n) * UNIT_S[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d)", text or ""))


def scale_group_intervals(rules_text, factor):
    """A rule file with each group's own `interval:` multiplied by `factor` (at least 1 s): the tests
    run Prometheus at a few seconds' interval where the shipped groups assume 15 s or more, so a
    group that runs every minute there runs at the same number of the tests' intervals here."""
    def repl(m):
        return f"{m.group(1)}interval: {max(1, round(duration_s(m.group(2)) * factor))}s{m.group(3) or ''}"

    unit = r"\d+(?:ms|s|m|h|d)"
    return re.sub(rf"^(\s+)interval: ((?:{unit})+)(\s.*)?$", repl, rules_text, flags=re.M)
