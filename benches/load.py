#!/usr/bin/env python3
"""Scrape load benchmark: gpu-exporter against the static-body limit and a peer exporter.

Run through benches/load.sh (it installs wrk and prometheus-node-exporter and builds the release
binaries), by hand, on an otherwise idle machine; it is not part of CI. Standard library only;
everything listens on 127.0.0.1.

What it measures, in one run:
- gpu-exporter on the simulated 8xH100-SXM fleet with 200 pods (a fake kubelet serving 25
  time-sliced replicas per GPU), sampling every second (`-c 1000`):
  startup time to the first 200 from /ready (median of several starts), RSS at idle and after
  the load, the sampling tick's CPU time (process CPU over an idle minute / ticks taken), and,
  under wrk, requests/s, p50/p99 latency and CPU seconds per 1,000 scrapes;
- the limit: benches/static_server.rs serving the exact body gpu-exporter returned, from memory;
- the peer: Debian's prometheus-node-exporter with its default collectors.
Every wrk run uses the same threads, connections and duration; each is run without and with
`Accept-Encoding: gzip` (what Prometheus sends). gpu-exporter and the limit are measured in
turns, several rounds (`--rounds`): the median run of each is reported, and gpu-exporter's ratio
to the limit is the median of the per-turn ratios (on a shared 2-vCPU VM one run can be off by
10 % or more either way; two runs in a row see the same drift). The results replace the part of
BENCHMARKS.md between the `load:begin` and `load:end` markers (or print, with --print-only).
"""

import argparse
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
BEGIN, END = "<!-- load:begin -->", "<!-- load:end -->"


class Failure(Exception):
    pass


def log(msg):
    print(f"load: {msg}", file=sys.stderr, flush=True)


def http_get(url, timeout=2.0, headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None, b""


def wait_until(what, pred, deadline_s, step_s=0.002):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    raise Failure(f"timed out after {deadline_s} s waiting for {what}")


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[11], fields[12] are utime and stime (fields 14 and 15 of proc(5), after pid/comm).
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_kib(pid):
    out = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0])
    return out


def metric_value(body, name):
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise Failure(f"{name} not in the exposition")


class Procs:
    def __init__(self, work):
        self.work = work
        self.procs = []

    def start(self, name, argv, env=None):
        out = open(self.work / f"{name}.log", "wb")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.procs.append(p)
        return p

    def stop(self, p):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self):
        for p in self.procs:
            self.stop(p)


def wrk(wrk_bin, url, threads, connections, duration_s, gzip):
    argv = [wrk_bin, f"-t{threads}", f"-c{connections}", f"-d{duration_s}s", "--timeout", "10s",
            "--latency", url]
    if gzip:
        argv[1:1] = ["-H", "Accept-Encoding: gzip"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60)
    if r.returncode != 0:
        raise Failure(f"{' '.join(argv)} failed: {r.stderr.strip() or r.stdout.strip()}")
    text = r.stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    n = re.search(r"(\d+) requests in", text)
    if not m or not n:
        raise Failure(f"cannot read wrk output:\n{text}")
    lat = {}
    for pct, val, unit in re.findall(r"^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s)\s*$", text, re.M):
        lat[pct] = float(val) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    errors = (int(non_2xx.group(1)) if non_2xx else 0) + (sum(map(int, socket.groups())) if socket else 0)
    return {"rps": float(m.group(1)), "requests": int(n.group(1)), "p50_ms": lat["50"],
            "p99_ms": lat["99"], "errors": errors, "raw": text}


def write_assignments(exporter, work, seed, pods_per_gpu):
    r = subprocess.run([exporter, "--backend", "sim", "--sim-profile", "8xH100-SXM",
                        "--sim-seed", str(seed), "--list-devices"], capture_output=True, text=True,
                       timeout=30, check=True)
    uuids = [line.split("\t")[1] for line in r.stdout.splitlines() if line.startswith("GPU ")]
    if len(uuids) != 8:
        raise Failure(f"--list-devices gave {len(uuids)} GPUs:\n{r.stdout}")
    lines = ["# 8 simulated H100s, each time-sliced into replicas held by one pod each."]
    n = 0
    for uuid in uuids:
        for replica in range(pods_per_gpu):
            lines += ["", "[[assignment]]", f'namespace = "team-{n % 13:02d}"',
                      f'pod = "inference-{n:04d}-7f9c8d6b5-x2k4q"', 'container = "server"',
                      f'devices = ["{uuid}::{replica}"]']
            n += 1
    path = work / "pods.toml"
    path.write_text("\n".join(lines) + "\n")
    return path, n


def tool_version(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except OSError:
        return "not found"
    out = (r.stdout + r.stderr).strip().splitlines()
    return out[0] if out else "?"


def machine():
    cpu = "?"
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = int(re.search(r"MemTotal:\s+(\d+)", pathlib.Path("/proc/meminfo").read_text()).group(1))
    return f"{cpu}, {os.cpu_count()} CPUs, {mem_kib / 1048576:.0f} GiB, Linux {platform.release()}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=10, help="seconds per wrk run (default 10)")
    ap.add_argument("--connections", type=int, nargs="+", default=[64, 1],
                    help="wrk connection counts (default 64 1)")
    ap.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="runs of gpu-exporter and the limit, in turns; the median is reported (default 5)")
    ap.add_argument("--idle", type=int, default=60, help="seconds of idle sampling measured (default 60)")
    ap.add_argument("--starts", type=int, default=5, help="startup-to-ready measurements (default 5)")
    ap.add_argument("--pods-per-gpu", type=int, default=25, help="default 25 (200 pods)")
    ap.add_argument("--print-only", action="store_true", help="print the section, leave BENCHMARKS.md")
    ap.add_argument("--node-exporter", default=shutil.which("prometheus-node-exporter") or "")
    ap.add_argument("--wrk", default=shutil.which("wrk") or "")
    args = ap.parse_args()

    rel = ROOT / "target" / "release"
    exporter, kubelet = rel / "gpu-exporter", rel / "fake-kubelet"
    static = rel / "examples" / "static-body-server"
    for p in (exporter, kubelet, static):
        if not p.is_file():
            raise Failure(f"{p} missing: run benches/load.sh (it builds the release binaries)")
    if not args.wrk:
        raise Failure("wrk not found (apt-get install wrk)")
    if not args.node_exporter:
        raise Failure("prometheus-node-exporter not found (apt-get install prometheus-node-exporter)")

    work = pathlib.Path(tempfile.mkdtemp(prefix="gpu-exporter-load-"))
    procs = Procs(work)
    try:
        return run(args, work, procs, exporter, kubelet, static)
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


def run(args, work, procs, exporter, kubelet, static):
    seed = 1
    port, static_port, node_port = 19400, 19499, 19100
    base = f"http://127.0.0.1:{port}"
    assignments, pods = write_assignments(exporter, work, seed, args.pods_per_gpu)
    sock = work / "kubelet.sock"
    kl = procs.start("fake-kubelet", [kubelet, "--socket", sock, "--assignments", assignments])
    wait_until("the fake kubelet's socket", sock.exists, 20, 0.01)
    env = dict(os.environ, NODE_NAME="bench-node", GPU_EXPORTER_LOG="warn")
    argv = [exporter, "--backend", "sim", "--sim-profile", "8xH100-SXM", "--sim-seed", str(seed),
            "-a", f"127.0.0.1:{port}", "-c", "1000", "-k",
            "--pod-resources-kubelet-socket", sock]

    # Startup to the first ready answer.
    starts = []
    for i in range(args.starts):
        t0 = time.monotonic()
        p = procs.start(f"exporter-start-{i}", argv, env)
        wait_until("/ready", lambda: http_get(base + "/ready", 0.5)[0] == 200, 30, 0.001)
        starts.append((time.monotonic() - t0) * 1000)
        procs.stop(p)
        wait_until("the port to be free", lambda: http_get(base + "/ready", 0.2)[0] is None, 10, 0.01)
    log(f"startup to ready, ms: {[round(s, 1) for s in starts]}")

    ours = procs.start("exporter", argv, env)
    wait_until("/ready", lambda: http_get(base + "/ready")[0] == 200, 30, 0.01)
    # Pod labels are there once the first kubelet answer has been applied.
    def with_pods():
        status, body = http_get(base + "/metrics")
        return status == 200 and body.count(b"gpu_exporter_gpu_pod_info{") == pods and body
    wait_until(f"{pods} pod-info series", with_pods, 30, 0.05)

    # Idle: sampling only.
    samples0 = metric_value(http_get(base + "/metrics")[1], "gpu_exporter_samples_total")
    cpu0, t0 = cpu_seconds(ours.pid), time.monotonic()
    time.sleep(args.idle)  # measurement window, not synchronisation
    cpu1, t1 = cpu_seconds(ours.pid), time.monotonic()
    status, body = http_get(base + "/metrics")
    ticks = metric_value(body, "gpu_exporter_samples_total") - samples0
    idle_cpu_per_s = (cpu1 - cpu0) / (t1 - t0)
    tick_cpu_ms = (cpu1 - cpu0) / ticks * 1000 if ticks else float("nan")
    tick_wall_ms = metric_value(body, "gpu_exporter_sample_duration_seconds") * 1000
    idle_mem = memory_kib(ours.pid)
    series = metric_value(body, "gpu_exporter_series")
    log(f"idle: {ticks:.0f} ticks, tick CPU {tick_cpu_ms:.2f} ms, RSS {idle_mem['VmRSS']} KiB")

    body_file, gz_file = work / "body.prom", work / "body.prom.gz"
    body_file.write_bytes(body)
    gz_body = http_get(base + "/metrics", headers={"Accept-Encoding": "gzip"})[1]
    if gz_body[:2] != b"\x1f\x8b":
        raise Failure("/metrics with Accept-Encoding: gzip did not answer gzip")
    gz_file.write_bytes(gz_body)
    st = procs.start("static", [static, body_file, f"127.0.0.1:{static_port}"])
    st_gz = procs.start("static-gzip", [static, gz_file, f"127.0.0.1:{static_port + 1}", "gzip"])
    for p in (static_port, static_port + 1):
        wait_until("the static server", lambda: http_get(f"http://127.0.0.1:{p}/")[0] == 200, 20, 0.01)
    # --web.max-requests=0: no limit on concurrent scrapes (its default of 40 answers 503 beyond).
    ne = procs.start("node-exporter", [args.node_exporter, f"--web.listen-address=127.0.0.1:{node_port}",
                                       "--web.max-requests=0"])
    wait_until("node-exporter", lambda: http_get(f"http://127.0.0.1:{node_port}/metrics", 5)[0] == 200, 30, 0.05)
    ne_body = http_get(f"http://127.0.0.1:{node_port}/metrics", 10)[1]
    ne_mem_idle = memory_kib(ne.pid)

    results = []
    for gzip in (False, True):
        targets = [
            ("gpu-exporter /metrics", base + "/metrics", ours),
            ("static-body limit", f"http://127.0.0.1:{static_port + gzip}/metrics", st_gz if gzip else st),
            ("prometheus-node-exporter", f"http://127.0.0.1:{node_port}/metrics", ne),
        ]
        for conns in args.connections:
            # gpu-exporter and the limit in turns, so both see the same drift of the machine.
            rounds = {name: [] for name, _, _ in targets[:2]}
            for _ in range(args.rounds):
                for name, url, proc in targets[:2]:
                    rounds[name].append(measure(args, name, url, proc, conns, gzip, ours, idle_cpu_per_s))
            mine, limit = (rounds[name] for name, _, _ in targets[:2])
            ratios = [a["rps"] / b["rps"] for a, b in zip(mine, limit)]
            r = median_run(mine)
            r.update(ratio=statistics.median(ratios), all_ratios=ratios)
            results.append(r)
            results.append(median_run(limit))
            name, url, proc = targets[2]
            results.append(measure(args, name, url, proc, conns, gzip, ours, idle_cpu_per_s))
    after_mem = memory_kib(ours.pid)
    for p in (kl, ours):
        if p.poll() is not None:
            raise Failure(f"process {p.args[0]} exited during the run")

    section = report(args, pods, series, len(body), len(gz_body), len(ne_body), starts, ticks, tick_cpu_ms,
                     tick_wall_ms, idle_cpu_per_s, idle_mem, after_mem, ne_mem_idle, results)
    if args.print_only:
        print(section)
    else:
        path = ROOT / "BENCHMARKS.md"
        text = path.read_text()
        if BEGIN not in text or END not in text:
            raise Failure(f"{path}: markers {BEGIN} / {END} not found")
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        path.write_text(head + BEGIN + "\n" + section + END + tail)
        log(f"wrote {path}")
    return 0


def measure(args, name, url, proc, conns, gzip, ours, idle_cpu_per_s):
    wrk(args.wrk, url, args.threads, conns, 2, gzip)  # warm-up
    c0, w0 = cpu_seconds(proc.pid), time.monotonic()
    r = wrk(args.wrk, url, args.threads, conns, args.duration, gzip)
    c1, w1 = cpu_seconds(proc.pid), time.monotonic()
    r.update(name=name, conns=conns, gzip=gzip, cpu_s=c1 - c0, wall_s=w1 - w0, mem=memory_kib(proc.pid))
    if proc is ours:
        r["cpu_net_s"] = r["cpu_s"] - idle_cpu_per_s * (w1 - w0)
        if r["errors"]:
            raise Failure(f"{url}: {r['errors']} failed requests under load:\n{r['raw']}")
    log(f"{name} -c{conns}{' gzip' if gzip else ''}: {r['rps']:.0f} req/s, "
        f"p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms")
    return r


def median_run(runs):
    """The run with the median requests/s (the lower middle one for an even count), with the
    requests/s of all of them."""
    ordered = sorted(runs, key=lambda r: r["rps"])
    r = dict(ordered[(len(ordered) - 1) // 2])
    r["all_rps"] = [x["rps"] for x in runs]
    return r


def report(args, pods, series, body_len, gz_len, ne_body_len, starts, ticks, tick_cpu_ms, tick_wall_ms,
           idle_cpu_per_s, idle_mem, after_mem, ne_mem_idle, results):
    mib = lambda kib: f"{kib / 1024:.1f} MiB"
    out = []
    out.append(f"Run on {time.strftime('%Y-%m-%d')}: {machine()}; "
               f"{tool_version(['rustc', '--version'])}; {tool_version([args.wrk, '-v'])}; "
               f"{tool_version([args.node_exporter, '--version'])}.\n")
    out.append(f"gpu-exporter: `--backend sim --sim-profile 8xH100-SXM -c 1000 -k`, {pods} pods from the "
               f"fake kubelet, {series:.0f} GPU series, body {body_len / 1024:.1f} KiB "
               f"({gz_len / 1024:.1f} KiB gzipped). "
               f"node-exporter body: {ne_body_len / 1024:.1f} KiB. wrk: {args.threads} thread, "
               f"{args.duration} s per run after a 2 s warm-up, on the same machine (wrk and the "
               f"server share the CPUs). gpu-exporter and the limit: {args.rounds} runs each, in turns; "
               f"the median run is shown, and every run's requests/s below the table. For gpu-exporter, "
               f"\"vs limit\" is the median of the per-turn ratios (each run against the limit's run "
               f"right after it, so both saw the same state of the machine).\n")
    out.append("| target | encoding | connections | requests/s | vs limit | p50 | p99 | CPU s / 1,000 scrapes | errors |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    limit = {(r["gzip"], r["conns"]): r["rps"] for r in results if r["name"] == "static-body limit"}
    for r in results:
        cpu = r.get("cpu_net_s", r["cpu_s"]) / r["requests"] * 1000
        enc = "gzip" if r["gzip"] else "identity"
        out.append(f"| {r['name']} | {enc} | {r['conns']} | {r['rps']:,.0f} | "
                   f"{r.get('ratio', r['rps'] / limit[(r['gzip'], r['conns'])]):.2f}x "
                   f"| {r['p50_ms']:.3f} ms | {r['p99_ms']:.3f} ms | {cpu:.3f} | {r['errors']} |")
    out.append("")
    for r in results:
        if "all_rps" in r:
            enc = "gzip" if r["gzip"] else "identity"
            runs = ", ".join(f"{x:,.0f}" for x in r["all_rps"])
            line = f"- {r['name']}, {enc}, {r['conns']} connections: {runs} requests/s"
            if "all_ratios" in r:
                line += " (per turn, vs the limit's run beside it: " + ", ".join(f"{x:.2f}x" for x in r["all_ratios"]) + ")"
            out.append(line)
    ours_after = after_mem
    ne_after = [r for r in results if r["name"] == "prometheus-node-exporter"][-1]["mem"]
    out.append("")
    out.append("| gpu-exporter process | value |")
    out.append("|---|---:|")
    out.append(f"| startup to first `/ready` 200 (median of {len(starts)}; min-max) | "
               f"{statistics.median(starts):.0f} ms ({min(starts):.0f}-{max(starts):.0f}) |")
    out.append(f"| RSS at idle (8 GPUs, {pods} pods, 1 s sampling) | {mib(idle_mem['VmRSS'])} |")
    out.append(f"| RSS after the load runs | {mib(ours_after['VmRSS'])} |")
    out.append(f"| peak RSS (VmHWM) | {mib(ours_after['VmHWM'])} |")
    out.append(f"| sampling tick CPU time (idle, {ticks:.0f} ticks over {args.idle} s) | {tick_cpu_ms:.2f} ms |")
    out.append(f"| last tick's wall time (`gpu_exporter_sample_duration_seconds`) | {tick_wall_ms:.2f} ms |")
    out.append(f"| idle CPU use | {idle_cpu_per_s * 100:.2f} % of one core |")
    out.append(f"| node-exporter RSS, idle / after the load | {mib(ne_mem_idle['VmRSS'])} / {mib(ne_after['VmRSS'])} |")
    out.append("")
    out.append("CPU s / 1,000 scrapes is the server process's CPU time (utime + stime from /proc) during the "
               "run, divided by the requests served; for gpu-exporter the idle sampling CPU over the same "
               "time is subtracted.\n")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        print(f"load: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
