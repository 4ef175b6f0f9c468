#!/usr/bin/env python3
"""The fleet run: a simulated GPU fleet scraped by a real Prometheus that remote-writes to a real
VictoriaMetrics; every dashboard query and alert expression is run on both and compared, the
recording rules are compared with the raw queries they replace, and (full run) the costs are
measured and written to BENCHMARKS.md. Run through benches/fleet/run.sh (see README.md there).

    fleet.py --sim PATH --ci                      # CI: 50 nodes, 5 s interval, checks only (~1 min)
    fleet.py --sim PATH --nodes 1000 --minutes 95 --report BENCHMARKS.md    # the measurement

Standard library only. Everything listens on 127.0.0.0/8; every wait has a deadline; every process
started here is stopped on exit (also on SIGTERM from run.sh's `timeout`). On failure the work
directory with all logs is kept and printed.

What "agree" means (Prometheus P vs VictoriaMetrics V, and recorded vs raw): both are instant
queries at the same evaluation timestamp T (milliseconds). Results agree when they have the same
set of label sets and each pair of values is equal within 1e-9 relative (NaN equals NaN; float
sums over thousands of series differ in their last bits with the order of addition, and
VictoriaMetrics stores values to 12 significant digits). The metric name is not part of the
label set: MetricsQL keeps it after functions that do not change what a series measures
(avg_over_time(x) is still called x), PromQL drops it; no dashboard legend or alert label uses
it, and dropping it must not merge two series. Two documented exceptions:
- topk/bottomk: ties at the cut-off make the choice of series implementation-defined; the sorted
  values must agree, and the label sets of the values above the cut-off.
- rate, irate, increase, delta: MetricsQL computes them differently by design (no extrapolation;
  the increase counted from the last sample before the window), so values differ by up to an
  interval's increase, more for series younger than the window. The label sets must agree (the
  same GPUs are shown, the same alerts fire); the largest value difference is reported.
T is chosen so that no target has a sample exactly one window (of any window the expressions use)
before T: Prometheus 2.x includes a sample at the window's start, MetricsQL does not.
VictoriaMetrics runs with -search.latencyOffset=0s (it otherwise hides the last 30 s of data from
queries) and -search.maxLookback=5m (Prometheus' lookback delta; VictoriaMetrics otherwise derives
it from the sample interval), and -search.disableCache so latency figures are not cache hits; T is
two scrape intervals in the past, and VictoriaMetrics must hold every target's and every recorded
series' latest sample at T that Prometheus holds before anything is compared.

Recorded vs raw: at a past evaluation timestamp T of each recording group, each dashboard query
that reads its recorded series must give the same answer as its raw fallback, and each recording
rule's series the same as its expression. A rule sees the samples committed when it ran; a query later
also sees samples of scrapes that started before T and were still in flight (scrape start is the
sample timestamp). Nodes with a scrape in flight at T (start <= T < start + scrape duration + 1 s
for the commit, COMMIT_SLACK_MS) are left out of that comparison (listed in the output).
"""

import argparse
import json
import math
import pathlib
import re
import signal
import sys
import time
import urllib.error
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import harness  # noqa: E402 (tests/harness.py)
from harness import Failure, as_promql, free_port, http_get  # noqa: E402

RULE_FILES = [ROOT / "alerts/gpu-exporter.rules.yml", ROOT / "alerts/gpu-exporter.recording.yml"]
RECORDED = re.compile(r"\b[a-z_]+:[a-z_]+:[a-z_0-9]+\b")  # level:metric:operation
NO_RULES = "no_recording_rules_loaded"  # what recorded names become to run a query as without them
COMMIT_SLACK_MS = 1000  # how long after a scrape ends its samples may still be uncommitted
RATE_FUNCS = re.compile(r"\b(rate|irate|increase|delta)\(")
WINDOW = re.compile(r"\[(\d+)([smhd])(?::\d+[smhd])?\]")
KINDS = ["whole", "shared", "mig"]  # fleet_sim.rs: i % 10 in 0..6, 7..8, 9
KIND_OF = {**{d: "whole" for d in range(7)}, 7: "shared", 8: "shared", 9: "mig"}
KIND_TEXT = {"whole": "8xH100-SXM, one pod per GPU", "shared": "8xH100-SXM time-sliced, 4 pods per GPU",
             "mig": "8xA100-80GB, 7 MIG instances per GPU, one pod each"}


log = harness.make_log("fleet")


def wait_for(what, fn, deadline_s, interval=1.0):
    """harness.wait_for, also retrying on KeyError (a query result without the field yet)."""
    return harness.wait_for(what, fn, deadline_s, interval, retried=harness.RETRIED + (KeyError,))


# Accounting counters that need per-process readings (--kubernetes-process-usage), which the
# simulated fleet does not make: recording rules over them (and over their recorded series) are
# empty by design here.
PER_PROCESS = ("gpu_exporter_container_sm_busy_gpu_seconds_total",
               "gpu_exporter_container_idle_allocated_gpu_seconds_total",
               "gpu_exporter_busy_gpu_hours", "gpu_exporter_idle_allocated_gpu_hours")

class Api:
    """The Prometheus HTTP query API of Prometheus or VictoriaMetrics."""

    def __init__(self, name, base, extra=None):
        self.name, self.base, self.extra = name, base, extra or {}

    def get(self, path, timeout=120, **params):
        """GET path?params (a trailing `_` is dropped from a name: `timeout_` is the engine's own query
        timeout, `timeout` this client's, in seconds)."""
        params = {k.removesuffix("_"): v for k, v in params.items()}
        url = f"{self.base}{path}?" + urllib.parse.urlencode(dict(params, **self.extra))
        try:
            _, body, _ = http_get(url, timeout=timeout)
        except urllib.error.HTTPError as e:
            raise Failure(f"{self.name} {path} {params}: HTTP {e.code}: {e.read().decode(errors='replace')[:500]}")
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise Failure(f"{self.name} {path} {params}: {doc}")
        return doc["data"]

    def instant(self, expr, t):
        return self.get("/api/v1/query", query=expr, time=f"{t / 1000:.3f}")

    def range(self, expr, start, end, step):
        return self.get("/api/v1/query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step)

    def metrics(self):
        _, body, _ = http_get(f"{self.base}/metrics", 30)
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out


def rss_mib(pid):
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


# --- queries -------------------------------------------------------------------------------------

def fill(expr, values):
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def dashboard_queries():
    """(dashboard uid, where, expr, instant) for every panel target and query variable."""
    return [(uid, f"{path.stem}: {what}", expr, instant)
            for path, uid, what, expr, instant in harness.dashboard_targets(ROOT / "dashboards")]


def rule_exprs():
    """(where, name, expr, static labels or None for an alert, group) of every rule, read from the
    rule files' `- name:`, `- alert|record:`, `expr: |` and `labels:` lines (no YAML module)."""
    out = []
    for f in RULE_FILES:
        lines = f.read_text().splitlines()
        i, group = 0, None
        while i < len(lines):
            g = re.match(r"^  - name: (\S+)", lines[i])
            if g:
                group = g.group(1)
            m = re.match(r"^\s*- (alert|record): (\S+)", lines[i])
            i += 1
            if not m:
                continue
            kind, name, expr, labels = m.group(1), m.group(2), [], {}
            while i < len(lines) and not re.match(r"^\s*- (alert|record): ", lines[i]) \
                    and not re.match(r"^  - name: ", lines[i]):
                line = lines[i]
                if re.match(r"^\s*expr: \|\s*$", line):
                    indent = len(line) - len(line.lstrip()) + 2
                    i += 1
                    while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) >= indent:
                        expr.append(lines[i].strip())
                        i += 1
                    continue
                if re.match(r"^\s*labels:\s*$", line):
                    indent = len(line) - len(line.lstrip()) + 2
                    i += 1
                    while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) >= indent:
                        k, _, v = lines[i].strip().partition(":")
                        labels[k.strip()] = v.strip().strip('"')
                        i += 1
                    continue
                i += 1
            out.append((f"{kind} {name}", name, " ".join(expr), labels if kind == "record" else None, group))
    return out


def windows_s(exprs, rate_interval):
    ws = {rate_interval}
    for e in exprs:
        for n, u in WINDOW.findall(e):
            ws.add(int(n) * harness.UNIT_S[u])
    return sorted(ws)


# --- comparing results ---------------------------------------------------------------------------

def normalize(data, drop_name=False):
    """{sorted label items: value}; without the metric name if drop_name (two series that differ
    only by name are an error)."""
    if data["resultType"] == "scalar":
        return {(): float(data["result"][1])}
    out = {}
    for r in data["result"]:
        key = tuple(sorted((k, v) for k, v in r["metric"].items() if not (drop_name and k == "__name__")))
        if key in out:
            raise Failure(f"two series differ only by their metric name: {dict(key)}")
        out[key] = float(r["value"][1])
    return out


def close(a, b, rel):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= 1e-9 + rel * max(abs(a), abs(b))


def compare(expr, a, b):
    """None if results a and b agree (see the module doc), else why not; and the largest relative
    value difference of a rate-family expression (0 otherwise)."""
    rate_family = bool(RATE_FUNCS.search(expr))
    k_fn = re.search(r"\b(topk|bottomk)\(", expr)
    if k_fn:
        va, vb = sorted(a.values()), sorted(b.values())
        if len(va) != len(vb) or not all(close(x, y, 1e-9) for x, y in zip(va, vb)):
            return f"topk values differ: {va} vs {vb}", 0.0
        if not va:
            return None, 0.0
        cut = va[0] if k_fn.group(1) == "topk" else va[-1]  # ties with it may differ
        above_a = {k for k, v in a.items() if not close(v, cut, 1e-9)}
        above_b = {k for k, v in b.items() if not close(v, cut, 1e-9)}
        if above_a != above_b:
            return f"topk series above the cut-off differ: {sorted(above_a ^ above_b)[:3]}", 0.0
        return None, 0.0
    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        return (f"label sets differ: {len(only_a)} only in the first, {len(only_b)} only in the second; "
                f"e.g. {[dict(x) for x in (only_a[:1] + only_b[:1])]}"), 0.0
    worst = 0.0
    for k, va in a.items():
        vb = b[k]
        if rate_family:
            if not (math.isnan(va) or math.isnan(vb)) and max(abs(va), abs(vb)) > 0:
                worst = max(worst, abs(va - vb) / max(abs(va), abs(vb)))
        elif not close(va, vb, 1e-9):
            return f"{dict(k)}: {va!r} vs {vb!r}", 0.0
    return None, worst


# --- the run -------------------------------------------------------------------------------------

class Fleet:
    def __init__(self, args, work, procs):
        self.args, self.work, self.procs = args, work, procs
        self.interval = args.interval
        self.rate_interval = 4 * args.interval  # Grafana: max(4 x scrape interval, step + scrape)
        self.failures = []

    def start(self):
        a = self.args
        # VictoriaMetrics, single node (Debian's victoria-metrics).
        self.vm_port = free_port()
        self.procs.start("victoria-metrics", [
            "victoria-metrics", f"-storageDataPath={self.work / 'vm-data'}",
            f"-httpListenAddr=127.0.0.1:{self.vm_port}", "-retentionPeriod=1d",
            "-search.latencyOffset=0s", "-search.maxLookback=5m", "-search.disableCache",
            "-search.maxUniqueTimeseries=2000000", "-search.maxQueryDuration=300s", "-loggerLevel=WARN"])
        self.vm = Api("VictoriaMetrics", f"http://127.0.0.1:{self.vm_port}", {"nocache": "1"})
        wait_for("VictoriaMetrics /health", lambda: http_get(f"{self.vm.base}/health", 30)[0] == 200, 60)

        # The simulated fleet: it stops by itself when the run's time is up.
        targets = self.work / "targets.json"
        self.procs.start("fleet-sim", [
            a.sim, "--nodes", str(a.nodes), "--interval-ms", str(self.interval * 1000), "--clusters", "2",
            "--targets", str(targets), "--duration-s", str(a.timeout + 60)])
        wait_for("fleet-sim listening", lambda: "listening" in (self.work / "logs/fleet-sim.log").read_text(), 120)
        self.targets = json.loads(targets.read_text())
        log(f"fleet-sim: {a.nodes} nodes listening on 127.1.0.1 and up")

        # Prometheus: scrape every node, evaluate alert and recording rules, remote-write to VM. The
        # groups with their own interval (1 min) keep it in scrapes: as shipped at 15 s, 4x shorter
        # at --ci's 5 s, so a short run sees as many of their evaluations as a long one.
        rule_files = []
        for f in RULE_FILES:
            rule_files.append(self.work / f.name)
            rule_files[-1].write_text(harness.scale_group_intervals(f.read_text(), self.interval / 15))
        self.prom_port = free_port()
        cfg = {
            "global": {"scrape_interval": f"{self.interval}s", "scrape_timeout": f"{max(1, self.interval * 2 // 3)}s",
                       "evaluation_interval": f"{self.interval}s"},
            "rule_files": [str(f) for f in rule_files],
            "remote_write": [{"url": f"http://127.0.0.1:{self.vm_port}/api/v1/write"}],
            "scrape_configs": [{"job_name": "gpu-exporter",
                                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "10s"}]}],
        }
        (self.work / "prometheus.yml").write_text(json.dumps(cfg, indent=1))
        self.procs.start("prometheus", [
            "prometheus", f"--config.file={self.work / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.work / 'prom-data'}", "--storage.tsdb.retention.time=1d",
            f"--web.listen-address=127.0.0.1:{self.prom_port}", "--query.timeout=5m"])
        self.prom = Api("Prometheus", f"http://127.0.0.1:{self.prom_port}")
        wait_for("Prometheus ready", lambda: http_get(f"{self.prom.base}/-/ready", 30)[0] == 200, 120)

        seen = {}

        def all_up():
            active = self.prom.get("/api/v1/targets", state="active")["activeTargets"]
            up = sum(t["health"] == "up" for t in active)
            errors = sorted({t["lastError"] for t in active if t["lastError"]})
            seen.update(active=len(active), up=up, errors=errors[:3])
            return len(active) == a.nodes and up == a.nodes
        try:
            wait_for(f"all {a.nodes} targets scraped and up", all_up, 120 + 12 * self.interval, 2)
        except Failure as e:
            raise Failure(f"{e}: {seen}") from None
        self.started = time.time()
        log(f"Prometheus scrapes all {a.nodes} targets every {self.interval} s")

    # -- timestamps --

    def sample_times(self, span_s, t_end):
        """{node: [(ts_ms, scrape_duration_s)]} of every target over the last span_s before t_end."""
        up = self.prom.instant(f"up[{span_s}s]", t_end)["result"]
        dur = self.prom.instant(f"scrape_duration_seconds[{span_s}s]", t_end)["result"]
        durs = {}
        for r in dur:
            for ts, v in r["values"]:
                durs[(r["metric"]["node"], round(float(ts) * 1000))] = float(v)
        out = {}
        for r in up:
            node = r["metric"]["node"]
            out[node] = [(round(float(ts) * 1000), durs.get((node, round(float(ts) * 1000)), 0.0))
                         for ts, _ in r["values"]]
        return out

    def pick_time(self, exprs):
        """A T (ms) a scrape interval or more in the past with no sample one window before it."""
        ws = windows_s(exprs, self.rate_interval)
        t = int((time.time() - 2 * self.interval) * 1000)
        samples = self.sample_times(max(ws) + 4 * self.interval, t) if max(ws) <= 3600 else None
        if samples is None:  # windows longer than an hour (GPUCountDropped's 6h subquery): check the short ones
            samples = self.sample_times(max(w for w in ws if w <= 3600) + 4 * self.interval, t)
        stamps = {ts for v in samples.values() for ts, _ in v}
        for _ in range(1000):
            if not any((t - w * 1000) in stamps for w in ws):
                return t
            t -= 1
        raise Failure("no evaluation time without a sample on a window boundary")

    def vm_caught_up(self, t):
        """VictoriaMetrics holds what Prometheus holds at t (remote write delivered and searchable):
        every target's latest sample and every recorded series' latest evaluation. Sets
        self.behind to what is still missing."""
        self.behind = ["(not compared yet)"]
        recorded = sorted({name for _, name, _, static, _ in rule_exprs() if static is not None})

        def latest(api):
            out = {r["metric"].get("node"): float(r["value"][1])
                   for r in api.instant("max by (node) (timestamp(up))", t)["result"]}
            for name in recorded:
                out.update({name: float(r["value"][1]) for r in api.instant(f"max(timestamp({name}))", t)["result"]})
            return out
        p, v = latest(self.prom), latest(self.vm)
        self.behind = sorted(n for n in p if n not in v or abs(p[n] - v[n]) > 0.0015)
        return not self.behind

    # -- checks --

    def variable_sets(self):
        """Dashboard variables as the checks fill them: All, a node of each kind on the node dashboard."""
        whole, mig = "node-0004", "node-0010"  # node-0004 has a GPU off the bus
        base = {"__rate_interval": f"{self.rate_interval}s", "__interval": f"{self.interval}s", "__range": "1h"}
        return {
            "gpu-exporter-cluster": [dict(base, cluster=".*", hostname=".*", per_node="none")],
            "gpu-exporter-node": [dict(base, cluster=".*", hostname=h, gpu=".*") for h in (whole, mig)],
            "gpu-exporter-workloads": [dict(base, cluster=".*", hostname=".*", namespace=".*", pod=".*")],
            "gpu-exporter-usage": [dict(base, cluster=".*", hostname=".*", namespace=".*", pod=".*", price="0.15")],
        }

    def query_runs(self):
        """(where, expr) for every dashboard query with its variables filled in, each query that
        reads recorded series both as with the recording rules (raw=none) and as without them."""
        runs = []
        sets = self.variable_sets()
        for uid, where, expr, _ in dashboard_queries():
            for values in sets[uid]:
                tag = f" [{values['hostname']}]" if uid == "gpu-exporter-node" else ""
                runs.append((where + tag, as_promql(fill(expr, dict(values, raw="none")))))
                if RECORDED.search(expr) and "$raw" in expr:
                    runs.append((where + tag + " (raw)", as_promql(fill(RECORDED.sub(NO_RULES, expr),
                                                                        dict(values, raw=".+")))))
                if "$per_node" in expr:  # some nodes picked: the per-node recorded side answers
                    picked = dict(values, raw="none", hostname="node-0004|node-0010", per_node=".+")
                    runs.append((where + " [node-0004|node-0010]", as_promql(fill(expr, picked))))
        for where, _, expr, _, _ in rule_exprs():
            runs.append((where, expr))
        return runs

    def check_agreement(self):
        runs = self.query_runs()
        t = self.pick_time([e for _, e in runs])
        try:
            wait_for("VictoriaMetrics to hold every sample Prometheus holds at T", lambda: self.vm_caught_up(t), 120, 2)
        except Failure as e:
            raise Failure(f"{e}: {len(self.behind)} targets behind, e.g. {self.behind[:5]}") from None
        failures, empty, worst = [], [], {}
        for where, expr in runs:
            a = normalize(self.prom.instant(expr, t), drop_name=True)
            b = normalize(self.vm.instant(expr, t), drop_name=True)
            why, w = compare(expr, a, b)
            if w:
                worst[where] = w
            if why:
                failures.append(f"{where}: {why}\n    {expr}")
            if not a:
                empty.append(where)
        log(f"Prometheus vs VictoriaMetrics at T={t / 1000:.3f}: {len(runs) - len(failures)}/{len(runs)} queries agree "
            f"({len(runs) - len(empty)} with data, {len(empty)} empty on both)")
        if worst:
            w = max(worst, key=worst.get)
            log(f"  empty on both: {empty}")
            log(f"  rate/increase expressions: {len(worst)} with values; largest relative difference {worst[w]:.1%} ({w})")
        self.agreement = {"queries": len(runs), "agree": len(runs) - len(failures), "empty": empty,
                          "rate_worst": max(worst.values()) if worst else 0.0, "t": t}
        if failures:
            self.failures.append("Prometheus and VictoriaMetrics disagree:\n  " + "\n  ".join(failures))
        # The switches must say the recording rules are loaded (raw) and every node is selected
        # (per_node), on both.
        for api in (self.prom, self.vm):
            for uid, where, expr, _ in dashboard_queries():
                for var in ("raw", "per_node"):
                    if where.endswith(f"variable {var}"):
                        got = [r["metric"].get(var) for r in
                               api.instant(as_promql(fill(expr, {"cluster": ".*", "hostname": ".*"})), t)["result"]]
                        if got != ["none"]:
                            raise Failure(f"{api.name}: {where} gives {got}, want ['none'] (rules loaded, all nodes)")
        # Not vacuous: most queries must have data (the fleet has pods, MIG, faults).
        if len(empty) > len(runs) // 4:
            self.failures.append(f"{len(empty)} of {len(runs)} queries are empty on both: {empty}")

    def check_recorded(self):
        """Recorded = raw on Prometheus, at a past evaluation timestamp of each recording group."""
        rules = [r for r in rule_exprs() if r[3] is not None]
        group_of = {name: group for _, name, _, _, group in rules}
        now = int(time.time() * 1000)
        at = {}  # group: (T, nodes with a scrape in flight at T)
        for group in dict.fromkeys(group_of.values()):
            first = next(name for _, name, _, _, g in rules if g == group)
            series = self.prom.instant(f"{first}[{10 * self.interval}s]", now)["result"]
            evals = [round(float(ts) * 1000) for ts, _ in (series[0]["values"] if series else [])]
            evals = [e for e in evals if e <= now - 2 * self.interval * 1000]
            if not evals:
                raise Failure(f"recording group {group} has not been evaluated")
            t = evals[-1]
            # The scrapes around T: from four intervals before to four after (a scrape that started
            # before T may have committed after it).
            samples = self.sample_times(8 * self.interval, t + 4 * self.interval * 1000)
            # A scrape's samples are stamped with its start s and committed after its duration d, plus
            # the append itself, which on a loaded machine has taken over 100 ms (a 50-node CI run saw
            # a rule miss a sample committed then): a second of slack.
            straddle = sorted(n for n, v in samples.items()
                              if any(s <= t < s + d * 1000 + COMMIT_SLACK_MS for s, d in v))
            at[group] = (t, straddle)
        failures, n, only_left_out, empty_by_design, empty_per_process = [], 0, [], [], []
        sets = self.variable_sets()
        nodes = [tg["labels"]["node"] for tg in self.targets]
        for uid, where, expr, _ in dashboard_queries():
            if not (RECORDED.search(expr) and "$raw" in expr):
                continue
            base = sets[uid][0]
            groups = {group_of[m] for m in RECORDED.findall(expr)}
            if len(groups) != 1:
                raise Failure(f"{where} reads recorded series of several groups: {sorted(groups)}")
            t, straddle = at[groups.pop()]
            # A selection of nodes, not "All": the heatmap compares its per-node side ($per_node);
            # its per-cluster series are checked against their expression with the other rules.
            values = dict(base, hostname="|".join(sorted(set(nodes) - set(straddle))), per_node=".+")
            rec = normalize(self.prom.instant(fill(expr, dict(values, raw="none")), t), drop_name=True)
            raw = normalize(self.prom.instant(fill(RECORDED.sub(NO_RULES, expr), dict(values, raw=".+")), t),
                            drop_name=True)
            if harness.needs_mig_profiling(where):
                if rec or raw:
                    failures.append(f"{where}: data from A100 MIG instances' engine activity, which they "
                                    f"cannot have without a DCGM source")
                else:
                    empty_by_design.append(where)
                continue
            why, _ = compare(expr, rec, raw)
            if not why and not rec and self.prom.instant(fill(expr, dict(base, raw="none")), t)["result"]:
                only_left_out.append(where)  # its data is on the nodes left out only: not compared
                continue
            n += 1
            if why or not rec:
                failures.append(f"{where}: {why or 'no data'}")
        for where, name, expr, static, group in rules:
            t, straddle = at[group]
            selector = name + "{" + ",".join(f'{k}="{v}"' for k, v in static.items()) + "}"
            got = normalize(self.prom.instant(selector, t))
            want_all = {tuple(sorted(dict(k, __name__=name, **static).items())): v
                        for k, v in ((dict(kk), vv) for kk, vv in normalize(self.prom.instant(expr, t)).items())}
            got = {k: v for k, v in got.items() if dict(k).get("hostname") not in straddle}
            want = {k: v for k, v in want_all.items() if dict(k).get("hostname") not in straddle}
            if not want_all and not got and any(m in expr for m in PER_PROCESS):
                empty_per_process.append(where)  # the fleet reads no processes: empty by design
                continue
            if not want and not got and want_all:
                only_left_out.append(f"{where} {static or ''}")
                continue
            n += 1
            why, _ = compare(expr, got, want)
            if why or not want:
                failures.append(f"{where} {static or ''}: {why or 'no data'}\n    {expr}")
        left = sorted({x for _, st in at.values() for x in st})
        log(f"recorded vs raw at each recording group's last evaluation: {n - len(failures)}/{n} agree "
            f"({len(left)} of {len(nodes)} nodes left out: a scrape in flight then{': ' + ', '.join(left) if left else ''})")
        if only_left_out:
            log(f"  not compared, their data is on left-out nodes only: {only_left_out}")
        if empty_by_design:
            log(f"  empty on both as they must be (A100 MIG instances have no engine activity without DCGM): "
                f"{empty_by_design}")
        if empty_per_process:
            log(f"  empty on both as they must be (the simulated fleet reads no processes, so no busy or "
                f"idle-allocated time): {empty_per_process}")
        if len(only_left_out) > 3:
            failures.append(f"{len(only_left_out)} queries not compared (data on left-out nodes only): {only_left_out}")
        self.recorded = {"checked": n, "agree": n - len(failures), "left_out": len(left)}
        if failures:
            self.failures.append("recorded series differ from the raw queries:\n  " + "\n  ".join(failures))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", required=True, help="the fleet-sim binary (cargo build --release --bin fleet-sim)")
    ap.add_argument("--ci", action="store_true", help="50 nodes, 5 s interval, checks only")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--interval", type=int, default=15, help="scrape, sampling and rule interval, seconds")
    ap.add_argument("--minutes", type=float, default=95, help="minutes of data before measuring (full run)")
    ap.add_argument("--repeat", type=int, default=5,
                    help="runs of each query with the recording rules for the latency figures (without them: once)")
    ap.add_argument("--report", help="write the Fleet section of this file (BENCHMARKS.md)")
    ap.add_argument("--timeout", type=int, default=0, help="hard limit in seconds (run.sh passes it)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if args.ci:
        args.nodes, args.interval, args.minutes = 50, 5, 0
    if not args.timeout:
        args.timeout = 300 if args.ci else int(args.minutes * 60) + 5400
    harness.require_tools(["prometheus", "promtool", "victoria-metrics"], "prometheus victoria-metrics")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"fleet: SIGTERM (time limit {args.timeout}s?)"))
    with harness.work_dir("fleet", args.keep, log, grace_s=15) as (work, procs):
        fleet = Fleet(args, work, procs)
        fleet.start()
        if args.ci:
            # Enough samples for the rate windows ($__rate_interval = 4 scrapes) and a few rule
            # evaluations before T (two intervals in the past).
            def scrapes():
                r = fleet.prom.instant(f"min(count_over_time(up[{10 * args.interval}s]))", int(time.time() * 1000))
                return r["result"] and float(r["result"][0]["value"][1]) >= 8
            wait_for("eight scrapes of every target", scrapes, 20 * args.interval, 2)

            # The hardware faults start 30 s in. The checks read the fleet a few intervals back, which
            # must see them (warn and fail GPUs), or a per-state query has no data to compare; and
            # not while they begin: a series that ends (a GPU lost) or starts (a health code
            # changes) has under two samples in a $__rate_interval window for a while, where
            # Prometheus' increase() gives nothing and MetricsQL's a value. So: the faults recorded
            # at least a rate window (four intervals) and three more before now.
            def faults_recorded():
                t = int((time.time() - 7 * args.interval) * 1000)
                q = 'count(count by (health) (hostname:dcgm_gpus_by_health:count{health=~"warn|fail"}))'
                r = fleet.prom.instant(q, t)
                return r["result"] and float(r["result"][0]["value"][1]) == 2
            wait_for("the faults in the recorded health states", faults_recorded, 20 * args.interval, 2)
        else:
            sys.modules.setdefault("fleet", sys.modules[__name__])  # measure imports this module, not a copy
            import measure  # noqa: E402 (benches/fleet/measure.py: the full run's figures)
            measure.collect(fleet, args)
        procs.check_alive()
        fleet.check_agreement()
        fleet.check_recorded()
        if fleet.failures:
            raise Failure("\n".join(fleet.failures))
        if not args.ci:
            measure.measure(fleet, args)
            measure.report(fleet, args)
        procs.check_alive()


if __name__ == "__main__":
    try:
        main()
    except Failure as e:
        log(f"FAILED: {e}")
        sys.exit(1)
