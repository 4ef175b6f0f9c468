#!/usr/bin/env python3
"""Soak scraper for scripts/soak.sh: concurrent scrapes of /metrics on loopback, each on a fresh
connection, parsed with a strict text-format 0.0.4 parser; checks that no series of a healthy GPU
goes missing and that every scrape is answered within --deadline (1 s) whatever else is going on.

Standard library only. Prints one JSON summary line at the end; exits 1 on any violation.
"""
import argparse
import json
import re
import sys
import threading
import time
import urllib.request

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
SAMPLE = re.compile(
    rf"^({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*,?)?\}})? "
    r"([-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?|NaN|Inf|inf)|[-+]Inf)"
    r"(?: -?[0-9]+)?$"
)
HELP = re.compile(rf"^# HELP ({NAME}) (?:[^\\\n]|\\[\\n])*$|^# HELP ({NAME})$")
TYPE = re.compile(rf"^# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)$")
GPU_LABEL = re.compile(r'(?:^|,)gpu="([0-9]+)"')


def parse(text):
    """Returns {gpu index: set of metric names}; raises ValueError on any malformed line."""
    per_gpu = {}
    typed = set()
    for n, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        if line.startswith("# HELP "):
            if not HELP.match(line):
                raise ValueError(f"line {n}: bad HELP: {line!r}")
            continue
        if line.startswith("# TYPE "):
            m = TYPE.match(line)
            if not m:
                raise ValueError(f"line {n}: bad TYPE: {line!r}")
            if m.group(1) in typed:
                raise ValueError(f"line {n}: second TYPE for {m.group(1)}")
            typed.add(m.group(1))
            continue
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise ValueError(f"line {n}: bad sample: {line!r}")
        labels = m.group(2) or ""
        g = GPU_LABEL.search(labels)
        # DCGM_FI_* series exist for every readable GPU; DCGM_EXP_* ones (clock-event windows,
        # XID counts) only for GPUs with events, so they are not compared across GPUs.
        if g and m.group(1).startswith("DCGM_FI_"):
            per_gpu.setdefault(int(g.group(1)), set()).add(m.group(1))
    if not text.endswith("\n"):
        raise ValueError("body does not end with a newline")
    return per_gpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--flaky-gpu", type=int, required=True, help="the GPU the scenario loses")
    ap.add_argument("--always", default="DCGM_FI_DEV_GPU_TEMP", help="series every healthy GPU must have")
    ap.add_argument("--deadline", type=float, default=1.0,
                    help="a scrape (fresh connection, whole body) slower than this many seconds fails")
    args = ap.parse_args()

    lock = threading.Lock()
    stats = {"scrapes": 0, "errors": [], "flaky_present": 0, "flaky_absent": 0, "max_latency_ms": 0.0,
             "latencies_ms": []}
    deadline = time.monotonic() + args.duration

    def worker():
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            problem = None
            try:
                with urllib.request.urlopen(args.url, timeout=10) as r:
                    body = r.read().decode("utf-8")
                    status = r.status
                    ctype = r.headers.get("Content-Type", "")
                if status != 200:
                    problem = f"status {status}"
                elif not ctype.startswith("text/plain; version=0.0.4"):
                    problem = f"content type {ctype!r}"
                else:
                    per_gpu = parse(body)
                    healthy = [g for g in range(args.gpus) if g != args.flaky_gpu]
                    ref = per_gpu.get(healthy[0], set())
                    for g in healthy:
                        have = per_gpu.get(g, set())
                        if args.always not in have:
                            problem = f"GPU {g} lacks {args.always}"
                            break
                        if have != ref:
                            problem = f"GPU {g} series differ from GPU {healthy[0]}: {sorted(have ^ ref)}"
                            break
                    flaky = args.always in per_gpu.get(args.flaky_gpu, set())
            except Exception as e:  # noqa: BLE001 - every failure is a finding
                problem = f"{type(e).__name__}: {e}"
            ms = (time.monotonic() - t0) * 1000
            if problem is None and ms > args.deadline * 1000:
                problem = f"slow: {ms:.0f} ms"
            with lock:
                stats["scrapes"] += 1
                stats["latencies_ms"].append(ms)
                if problem:
                    stats["errors"].append(problem)
                elif flaky:
                    stats["flaky_present"] += 1
                else:
                    stats["flaky_absent"] += 1
            time.sleep(0.1)

    threads = [threading.Thread(target=worker) for _ in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = sorted(stats.pop("latencies_ms")) or [0.0]
    stats["p50_latency_ms"] = round(lat[len(lat) // 2], 2)
    stats["p99_latency_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2)
    stats["max_latency_ms"] = round(lat[-1], 2)
    stats["error_count"] = len(stats["errors"])
    stats["errors"] = stats["errors"][:20]
    print(json.dumps(stats))
    return 1 if stats["error_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
