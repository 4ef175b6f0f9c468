"""The figures of the full fleet run (fleet.py without --ci): what it costs to collect the fleet,
how fast the dashboards answer with and without the recording rules, and what each metric costs.
Written into BENCHMARKS.md between the `fleet:begin` and `fleet:end` markers. Standard library only.
"""

import concurrent.futures
import gzip
import json
import math
import os
import pathlib
import platform
import re
import statistics
import subprocess
import time

from fleet import (KIND_OF, KIND_TEXT, KINDS, NO_RULES, RECORDED, ROOT, Failure, as_promql,
                   dashboard_queries, fill, http_get, log, rss_mib)
from harness import duration_s  # tests/harness.py, on the path once fleet is imported

BEGIN, END = "<!-- fleet:begin -->", "<!-- fleet:end -->"
CLK_TCK = os.sysconf("SC_CLK_TCK")
GPUS_PER_NODE = 8
STEP_S = 15  # Grafana's step for a 1 h panel (about 1,000 px wide) at a 15 s scrape interval,
#              unless the panel's "Min interval" is longer (the cluster dashboard's is 1 minute)
PANEL_SLOTS = 6  # a browser's concurrent requests to one host: how many panel queries Grafana runs at once


def cpu_s(pid):
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def loadavg():
    return pathlib.Path("/proc/loadavg").read_text().split()[:3]


def snapshot(fleet):
    """One sample of the run's costs."""
    pm, vm = fleet.prom.metrics(), fleet.vm.metrics()
    groups = fleet.prom.get("/api/v1/rules")["groups"]
    return {
        "t": time.time(), "load": loadavg(),
        "prom_rss": rss_mib(fleet.procs.pid("prometheus")), "vm_rss": rss_mib(fleet.procs.pid("victoria-metrics")),
        "sim_rss": rss_mib(fleet.procs.pid("fleet-sim")),
        "prom_cpu": cpu_s(fleet.procs.pid("prometheus")), "vm_cpu": cpu_s(fleet.procs.pid("victoria-metrics")),
        "sim_cpu": cpu_s(fleet.procs.pid("fleet-sim")),
        "head_series": pm.get("prometheus_tsdb_head_series", math.nan),
        "appended": pm.get('prometheus_tsdb_head_samples_appended_total{type="float"}',
                           pm.get("prometheus_tsdb_head_samples_appended_total", math.nan)),
        "prom_heap": pm.get("go_memstats_heap_inuse_bytes", math.nan),
        "vm_rows": sum(v for k, v in vm.items() if k.startswith("vm_rows_inserted_total")),
        # Iterations run and missed (a group still evaluating when its next one is due) per group.
        "iterations": group_counters(pm, "prometheus_rule_group_iterations_total"),
        "missed": group_counters(pm, "prometheus_rule_group_iterations_missed_total"),
        "groups": {g["name"]: {"eval": g["evaluationTime"], "interval": g.get("interval", math.nan),
                               "rules": {r["name"] + json.dumps(r.get("labels", {}), sort_keys=True): r["evaluationTime"]
                                         for r in g["rules"]}} for g in groups},
    }


def group_counters(metrics, name):
    """{rule group name: value} of Prometheus' per-group counter `name` (labelled "file;group")."""
    out = {}
    for k, v in metrics.items():
        m = re.fullmatch(name + r'\{rule_group="[^"]*;([^"]+)"\}', k)
        if m:
            out[m.group(1)] = v
    return out


def collect(fleet, args):
    """Lets the fleet run for args.minutes, sampling costs every minute."""
    fleet.samples = [snapshot(fleet)]
    end = fleet.started + args.minutes * 60
    next_log = time.time() + 300
    while time.time() < end:
        time.sleep(min(60, max(1, end - time.time())))
        fleet.procs.check_alive()
        fleet.samples.append(snapshot(fleet))
        if time.time() >= next_log:
            s = fleet.samples[-1]
            log(f"{(time.time() - fleet.started) / 60:.0f}/{args.minutes:.0f} min: Prometheus {s['prom_rss']:.0f} MiB, "
                f"{s['head_series']:.0f} head series; VictoriaMetrics {s['vm_rss']:.0f} MiB; load {' '.join(s['load'])}")
            next_log += 300


# --- bodies: bytes, series per GPU, per field ----------------------------------------------------

def parse_families(text):
    """{family: series} of an exposition body."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0)
            out[name] = out.get(name, 0) + 1
    return out


def bodies(fleet):
    """Per node kind: bytes of a scrape (plain, gzip) and series per family, from its first node."""
    out = {}
    for kind in KINDS:
        i = next(i for i in range(len(fleet.targets)) if KIND_OF[i % 10] == kind and i % 100 not in
                 (3, 13, 23, 33, 43, 53, 69))  # a node without a fault
        url = f"http://{fleet.targets[i]['targets'][0]}/metrics"
        _, plain, _ = http_get(url, 30, headers={"Accept-Encoding": "identity"})
        _, packed, hdr = http_get(url, 30, headers={"Accept-Encoding": "gzip"})
        if hdr.get("Content-Encoding") != "gzip":
            raise Failure(f"{url}: no gzip body")
        text = gzip.decompress(packed).decode()
        out[kind] = {"node": fleet.targets[i]["labels"]["node"], "plain": len(plain), "gzip": len(packed),
                     "families": parse_families(text)}
    return out


def csv_fields():
    """(metric, type) rows of the shipped default-counters.csv."""
    rows = []
    for line in (ROOT / "metrics-config/default-counters.csv").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, typ, _ = [c.strip() for c in line.split(",", 2)]
            rows.append((name, typ))
    return rows


# --- latency -------------------------------------------------------------------------------------

def panel_steps():
    """{(dashboard uid, panel title): query step in seconds}: STEP_S, or the panel's min interval."""
    out = {}

    def walk(uid, panels):
        for p in panels:
            out[(uid, p.get("title"))] = max(STEP_S, duration_s(p.get("interval")))
            walk(uid, p.get("panels", []))
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        d = json.loads(path.read_text())
        walk(d["uid"], d.get("panels", []))
    return out


# The workloads dashboard is also measured with one namespace picked, as docs/fleet.md advises at
# this scale: a team's namespace with one pod on each whole-GPU node (`dev`, 700 pods), and the
# training one (`ml`, 4,200 pods, 40% of the fleet's containers).
ONE_NAMESPACE = ("dev", "ml")


def panel_queries(fleet):
    """(dashboard, panel target, query as run with the rules, as run without them or None, instant,
    step in seconds): every variable "All", then the workloads panels that read `$namespace` again
    with each of ONE_NAMESPACE picked (target tagged "[namespace X]")."""
    sets = fleet.variable_sets()
    steps = panel_steps()
    out = []
    queries = [q for q in dashboard_queries() if "variable" not in q[1]]
    for ns in (None, *ONE_NAMESPACE):
        for uid, where, expr, instant in queries:
            if ns and (uid != "gpu-exporter-workloads" or "$namespace" not in expr):
                continue
            values = dict(sets[uid][0], __range="1h", **({"namespace": ns} if ns else {}))
            rules = as_promql(fill(expr, dict(values, raw="none")))
            raw = None
            if RECORDED.search(expr) and "$raw" in expr:
                raw = fill(RECORDED.sub(NO_RULES, expr), dict(values, raw=".+"))
            target = where.split(": ", 1)[1]
            title = re.fullmatch(r'"(.*)" [A-Z]', target).group(1)
            out.append((uid, target + (f" [namespace {ns}]" if ns else ""), rules, raw, instant,
                        steps[(uid, title)]))
    return out


# A query with the recording rules must answer in well under a second; one without them (the
# fallback) takes seconds to minutes at fleet scale on 2 cores, so it runs once, under a shorter
# limit, which the engine also enforces (`timeout`): the latency stage is bounded by the number of
# queries, not by the slowest one.
QUERY_TIMEOUT_S = 120
RAW_TIMEOUT_S = 30
SLOW_S = 10  # a query slower than this the first time is not repeated (the workloads dashboard with
#              every namespace selected takes minutes at 8,000 GPUs: five rounds of it took half an hour)


def timed(api, expr, instant, t_end, step, limit=QUERY_TIMEOUT_S):
    """Seconds one query took; inf if it failed or took longer than `limit`."""
    start = time.perf_counter()
    try:
        if instant:
            api.get("/api/v1/query", timeout=limit + 5, query=expr, time=f"{t_end:.3f}", timeout_=f"{limit}s")
        else:
            api.get("/api/v1/query_range", timeout=limit + 5, query=expr, start=f"{t_end - 3600:.3f}",
                    end=f"{t_end:.3f}", step=step, timeout_=f"{limit}s")
    except (OSError, Failure) as e:
        log(f"query failed or timed out after {time.perf_counter() - start:.0f} s ({e.__class__.__name__}): {expr[:120]}")
        return math.inf
    took = time.perf_counter() - start
    return math.inf if took > limit else took


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))]


def latencies(fleet, args, t_end):
    """{(dashboard, target): {(backend, mode): [seconds...]}}, queries interleaved round-robin."""
    qs = panel_queries(fleet)
    res = {}
    for backend, api in [("prometheus", fleet.prom), ("victoria-metrics", fleet.vm)]:
        for r in range(args.repeat):
            for uid, where, rules, raw, instant, step in qs:
                runs = res.setdefault((uid, where), {}).setdefault((backend, "rules"), [])
                if runs and runs[0] > SLOW_S:
                    continue  # far from interactive the first time: once is enough to say so
                runs.append(timed(api, rules, instant, t_end, step))
            log(f"latency: {backend} round {r + 1}/{args.repeat} with the recording rules done")
        # Without the rules after, not between: a raw query's garbage would weigh on the next ones.
        for uid, where, rules, raw, instant, step in qs:
            if raw:
                took = timed(api, raw, instant, t_end, step, RAW_TIMEOUT_S)
                res[(uid, where)][(backend, "raw")] = [took]
                if took > 5:
                    log(f"  {backend} raw {where}: {fmt_s(took)}")
        log(f"latency: {backend} without the recording rules done")
    return qs, res


def refreshes(fleet, t_end, mode, reps):
    """Wall time of a whole cluster-dashboard refresh, PANEL_SLOTS queries at a time (without the
    rules each query under RAW_TIMEOUT_S)."""
    limit = QUERY_TIMEOUT_S if mode == "rules" else RAW_TIMEOUT_S
    qs = [(rules if mode == "rules" or not raw else raw, instant, step)
          for uid, _, rules, raw, instant, step in panel_queries(fleet) if uid == "gpu-exporter-cluster"]
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(PANEL_SLOTS) as pool:
            took = list(pool.map(lambda q: timed(fleet.prom, q[0], q[1], t_end, q[2], limit), qs))
        out.append(math.inf if math.inf in took else time.perf_counter() - start)
    return out


# --- the run's figures ---------------------------------------------------------------------------

def measure(fleet, args):
    log("measuring: scrape bodies")
    fleet.bodies = bodies(fleet)
    t_end = time.time() - 2 * fleet.interval
    fleet.t_end = t_end
    log("measuring: query latencies (every panel, 1 h range)")
    fleet.queries, fleet.lat = latencies(fleet, args, t_end)
    log("measuring: whole cluster-dashboard refreshes")
    fleet.refresh = {"rules": refreshes(fleet, t_end, "rules", 3), "raw": refreshes(fleet, t_end, "raw", 1)}
    fleet.samples.append(snapshot(fleet))
    # Series per node kind, as stored (scrape_samples_scraped of every node, by kind).
    per = fleet.prom.instant("scrape_samples_scraped", int(t_end * 1000))["result"]
    by_kind = {}
    for r in per:
        i = int(r["metric"]["node"].split("-")[1]) - 1
        by_kind.setdefault(KIND_OF[i % 10], []).append(float(r["value"][1]))
    fleet.scraped = {k: statistics.median(v) for k, v in by_kind.items()}
    fleet.kind_nodes = {k: len(v) for k, v in by_kind.items()}


def version(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (r.stdout + r.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "?"


def fmt_s(x):
    if math.isinf(x):
        return "timeout"  # over the query's limit (QUERY_TIMEOUT_S, or RAW_TIMEOUT_S without the rules)
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def report(fleet, args):
    text = render(fleet, args)
    if not args.report:
        print(text)
        return
    path = pathlib.Path(args.report)
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise Failure(f"{path}: no {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + BEGIN + "\n" + text + "\n" + END + tail)
    (fleet.work / "fleet.json").write_text(json.dumps({
        "samples": fleet.samples, "latency": {f"{k[0]} {k[1]}": {f"{b} {m}": v for (b, m), v in d.items()}
                                              for k, d in fleet.lat.items()},
        "refresh": fleet.refresh, "bodies": fleet.bodies}, indent=1))
    log(f"wrote the Fleet section of {path}")


def render(fleet, args):
    s0, s1 = fleet.samples[0], fleet.samples[-1]
    gpus = len(fleet.targets) * GPUS_PER_NODE
    per_k = gpus / 1000
    # Ingestion over the last ten minutes of the collection (before the query load).
    coll = [s for s in fleet.samples if s["t"] <= fleet.t_end]
    a, b = next((s for s in coll if s["t"] >= coll[-1]["t"] - 600), coll[0]), coll[-1]
    dt = b["t"] - a["t"]
    samples_s = (b["appended"] - a["appended"]) / dt
    vm_rows_s = (b["vm_rows"] - a["vm_rows"]) / dt
    prom_cpu = (b["prom_cpu"] - a["prom_cpu"]) / dt
    vm_cpu = (b["vm_cpu"] - a["vm_cpu"]) / dt
    sim_cpu = (b["sim_cpu"] - a["sim_cpu"]) / dt
    loads = [float(s["load"][0]) for s in fleet.samples]
    minutes = (fleet.t_end - fleet.started) / 60
    L = []
    L.append(f"Run on {datetime_utc()}: {cpu_model()}, {os.cpu_count()} CPUs (`nproc`), "
             f"{mem_gib():.0f} GiB, Linux {platform.release()}; {version(['prometheus', '--version'])}; "
             f"victoria-metrics {victoria_version()}.")
    L.append("")
    L.append(f"Machine load (`uptime`, 1-minute average) over the run: start {s0['load'][0]}, median "
             f"{statistics.median(loads):.2f}, max {max(loads):.2f}, end {s1['load'][0]} on {os.cpu_count()} CPUs. "
             "Other engineers' builds shared the machine; figures under load are upper bounds for an idle one.")
    L.append("")
    kinds = ", ".join(f"{fleet.kind_nodes.get(k, 0)} {KIND_TEXT[k]}" for k in KINDS)
    L.append(f"Fleet: {len(fleet.targets)} nodes, {gpus:,} GPUs ({kinds}; seven nodes in a hundred with a "
             f"hardware fault), in two clusters; Prometheus scraping every {fleet.interval} s, rules every "
             f"{fleet.interval} s (groups that set their own `interval:` at theirs: table below), remote-writing to VictoriaMetrics; {minutes:.0f} minutes of data before measuring.")
    L.append("")
    L.append("### Series and bytes per scrape")
    L.append("")
    L.append("| node kind | series per node (stored) | per GPU | self-metrics per node | bytes per scrape | gzip | gzip per GPU |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for k in KINDS:
        bd = fleet.bodies[k]
        fam = bd["families"]
        own = sum(v for f, v in fam.items() if f.startswith("gpu_exporter_") and f != "gpu_exporter_gpu_pod_info")
        stored = fleet.scraped.get(k, sum(fam.values()))
        L.append(f"| {KIND_TEXT[k]} | {stored:,.0f} | {(stored - own) / GPUS_PER_NODE:.1f} | {own} | "
                 f"{bd['plain'] / 1024:,.1f} KiB | {bd['gzip'] / 1024:,.1f} KiB | {bd['gzip'] / GPUS_PER_NODE / 1024:.2f} KiB |")
    L.append("")
    L.append("Series per GPU count every GPU series (MIG instance series included, on the MIG kind) and pod-info "
             "series; self-metrics are the exporter's own `gpu_exporter_*` series. Stored = "
             "`scrape_samples_scraped` (median of the kind's nodes).")
    L.append("")
    L.append("### Collection cost")
    L.append("")
    L.append(f"| | total | per 1,000 GPUs |")
    L.append("|---|---:|---:|")
    L.append(f"| Prometheus head series | {s1['head_series']:,.0f} | {s1['head_series'] / per_k:,.0f} |")
    L.append(f"| samples ingested per second (scrapes + recording rules) | {samples_s:,.0f} | {samples_s / per_k:,.0f} |")
    L.append(f"| Prometheus RSS at the end of collection | {b['prom_rss']:,.0f} MiB | {b['prom_rss'] / per_k:,.0f} MiB |")
    L.append(f"| Prometheus Go heap in use | {b['prom_heap'] / 2**20:,.0f} MiB | {b['prom_heap'] / 2**20 / per_k:,.0f} MiB |")
    L.append(f"| Prometheus RSS, peak sample (after the query load) | {max(s['prom_rss'] for s in fleet.samples):,.0f} MiB | |")
    L.append(f"| Prometheus CPU (scrape, rules, remote write) | {prom_cpu:.2f} cores | {prom_cpu / per_k:.3f} cores |")
    L.append(f"| VictoriaMetrics rows ingested per second | {vm_rows_s:,.0f} | {vm_rows_s / per_k:,.0f} |")
    L.append(f"| VictoriaMetrics RSS | {b['vm_rss']:,.0f} MiB | {b['vm_rss'] / per_k:,.0f} MiB |")
    L.append(f"| VictoriaMetrics CPU | {vm_cpu:.2f} cores | {vm_cpu / per_k:.3f} cores |")
    L.append(f"| fleet-sim (all {len(fleet.targets)} exporters) RSS / CPU | {b['sim_rss']:,.0f} MiB / {sim_cpu:.2f} cores | |")
    L.append("")
    L.append("CPU and ingestion rates are over the last ten minutes of collection.")
    L.append("")
    L.append("### Dashboard query latency at " + f"{gpus:,} GPUs (1 h range)")
    L.append("")
    longer = sorted({uid.removeprefix("gpu-exporter-") for (uid, _), s in panel_steps().items() if s > STEP_S})
    L.append(f"Each panel query as Grafana sends it: range queries over the last hour at the panel's step "
             f"(the minimum interval of the {' and '.join(longer)} dashboards, 1 min; {STEP_S} s on the others), "
             f"table and bar-gauge "
             f"panels instant; every variable \"All\" (node dashboard: one node; workloads panels that filter by namespace also "
             f"with one picked, \"[namespace X]\"). \"rules\" is the query as it "
             f"runs with the recording rules, run {args.repeat} times on Prometheus and on VictoriaMetrics "
             f"(cache off), in rounds over every query: p50 / p95 (of {args.repeat} runs, p95 is the slowest; "
             f"a query over {SLOW_S} s the first time runs once). \"raw\" is the "
             f"query as it runs without them (the fallback), once, under a {RAW_TIMEOUT_S} s limit "
             f"(\"timeout\": over it). \"same\": the query reads no recorded series.")
    L.append("")
    L.append("| dashboard | panel query | Prometheus raw | Prometheus rules | VictoriaMetrics raw | VictoriaMetrics rules |")
    L.append("|---|---|---:|---:|---:|---:|")
    over = []
    for uid, where, rules, raw, instant, _ in fleet.queries:
        d = fleet.lat[(uid, where)]

        def cell(backend, mode):
            v = d.get((backend, mode))
            return f"{fmt_s(pct(v, 50))} / {fmt_s(pct(v, 95))}" if v else "same"
        L.append(f"| {uid.removeprefix('gpu-exporter-')} | {where}{' (instant)' if instant else ''} | "
                 f"{cell('prometheus', 'raw')} | {cell('prometheus', 'rules')} | "
                 f"{cell('victoria-metrics', 'raw')} | {cell('victoria-metrics', 'rules')} |")
        if uid == "gpu-exporter-cluster" and pct(d[("prometheus", "rules")], 95) >= 1.0:
            over.append(where)
    L.append("")
    cl = [(w, fleet.lat[("gpu-exporter-cluster", w)]) for u, w, *_ in fleet.queries if u == "gpu-exporter-cluster"]
    worst_rules = max(cl, key=lambda x: pct(x[1][("prometheus", "rules")], 95))
    worst_raw = max(cl, key=lambda x: pct(x[1].get(("prometheus", "raw"), x[1][("prometheus", "rules")]), 95))
    L.append(f"Target, every cluster-dashboard panel under 1 s p95 at {gpus:,} GPUs on Prometheus with the "
             f"recording rules: {'**met**' if not over else '**not met** for ' + ', '.join(over)} (slowest: "
             f"{worst_rules[0]}, {fmt_s(pct(worst_rules[1][('prometheus', 'rules')], 95))}). Without them the slowest "
             f"is {worst_raw[0]}, {fmt_s(pct(worst_raw[1].get(('prometheus', 'raw'), worst_raw[1][('prometheus', 'rules')]), 95))}.")
    L.append("")
    r, w = fleet.refresh["rules"], fleet.refresh["raw"]
    L.append(f"A whole cluster-dashboard refresh on Prometheus ({PANEL_SLOTS} queries at a time, as a browser "
             f"sends them): {fmt_s(statistics.median(r))} with the recording rules (median of {len(r)}), "
             f"{fmt_s(statistics.median(w))} without (once; \"timeout\": a query took over {RAW_TIMEOUT_S} s).")
    L.append("")
    L.append("### Rule evaluation")
    L.append("")
    late = [s for s in fleet.samples if s["t"] >= fleet.started + 30 * 60 and s["t"] <= fleet.t_end] or fleet.samples
    L.append("| rule group | interval | evaluation time, median | max | rules | iterations missed / due |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for g in late[-1]["groups"]:
        ev = [s["groups"][g]["eval"] for s in late if g in s["groups"]]
        due = late[-1]["iterations"].get(g, math.nan) - late[0]["iterations"].get(g, math.nan)
        missed = late[-1]["missed"].get(g, math.nan) - late[0]["missed"].get(g, math.nan)
        L.append(f"| {g} | {late[-1]['groups'][g]['interval']:.0f} s | {fmt_s(statistics.median(ev))} | {fmt_s(max(ev))} | {len(late[-1]['groups'][g]['rules'])} | "
                 f"{missed:.0f} / {due:.0f} |")
    rules = {}
    for s in late:
        for g, gd in s["groups"].items():
            for name, v in gd["rules"].items():
                rules.setdefault(name, []).append(v)
    top = sorted(rules, key=lambda n: statistics.median(rules[n]), reverse=True)[:6]
    L.append("")
    L.append("Slowest rules (median): " + "; ".join(
        f"{re.sub(r'[{].*', '', n)}{' ' + n[n.index('{'):] if n.endswith('}') and n[n.index('{'):] != '{}' else ''} "
        f"{fmt_s(statistics.median(rules[n]))}" for n in top) + f". Measured over minutes 30 to {minutes:.0f} "
        f"(every 30-minute window full), from `/api/v1/rules`.")
    L.append("")
    L.append("### Agreement")
    L.append("")
    ag, rc = fleet.agreement, fleet.recorded
    L.append(f"At one evaluation time, {ag['agree']} of {ag['queries']} queries (every dashboard query, with "
             f"and without the recording rules, every alert and recording-rule expression) gave the same "
             f"answer on Prometheus and VictoriaMetrics ({ag['queries'] - len(ag['empty'])} with data); "
             f"rate/increase values differed by up to {ag['rate_worst']:.1%} (MetricsQL does not extrapolate). "
             f"Recorded vs raw: {rc['agree']} of {rc['checked']} agree ({rc['left_out']} of {len(fleet.targets)} "
             f"nodes left out for a scrape in flight at the evaluation time).")
    L.append("")
    L.append("### What each metric costs (series per GPU, default CSV)")
    L.append("")
    L.append("Series per GPU by node kind, from each kind's scrape; the last column is the share of a "
             "whole-GPU node's series, and the Prometheus memory it takes at 8,000 such GPUs (the head's "
             f"RSS per series in this run, {b['prom_rss'] * 2**20 / s1['head_series']:,.0f} bytes). "
             "Drop a row from the metrics CSV to save it.")
    L.append("")
    L.append("| metric | CSV type | whole GPU | time-sliced GPU | MIG GPU (7 instances) | share (whole) | memory at 8,000 GPUs |")
    L.append("|---|---|---:|---:|---:|---:|---:|")
    fams = {k: fleet.bodies[k]["families"] for k in KINDS}
    whole_total = sum(v for f, v in fams["whole"].items())
    per_series = b["prom_rss"] * 2**20 / s1["head_series"]
    csv = dict(csv_fields())
    names = [n for n, _ in csv_fields()] + sorted({f for k in KINDS for f in fams[k]} - set(csv))
    for n in names:
        vals = [fams[k].get(n, 0) / GPUS_PER_NODE for k in KINDS]
        if not any(vals) and n not in csv:
            continue
        typ = csv.get(n, "derived" if n.startswith("DCGM_EXP_") else
                      ("pod labels" if n == "gpu_exporter_gpu_pod_info" else "self-metric (per node)"))
        share = fams["whole"].get(n, 0) / whole_total
        mem = fams["whole"].get(n, 0) / GPUS_PER_NODE * 8000 * per_series / 2**20
        L.append(f"| `{n}` | {typ} | {vals[0]:g} | {vals[1]:g} | {vals[2]:g} | {share:.1%} | {mem:,.1f} MiB |")
    return "\n".join(L)


def datetime_utc():
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def cpu_model():
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def mem_gib():
    m = re.search(r"MemTotal:\s+(\d+) kB", pathlib.Path("/proc/meminfo").read_text())
    return int(m.group(1)) / 2**20


def victoria_version():
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"], capture_output=True,
                           text=True, timeout=10)
        return r.stdout.strip() or "?"
    except OSError:
        return "?"
