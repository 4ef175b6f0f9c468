#!/usr/bin/env python3
"""RSS of the exporter with a crowded --hpc-job-mapping-dir (issue 26 item 5).

Usage: benches/hpc_rss.py BINARY [N ...]

For each N, writes N mapping files named for GPUs that do not exist on the simulated 8-GPU node
(8, 9, ...), each with 64 job ids of 1,000 bytes (just under the 64 KiB file cap), starts the
binary with --backend sim, waits for five directory scans (the watcher reads it every 1 s
at the default interval), and prints the peak and current RSS (VmHWM, VmRSS).
"""
import json, os, subprocess, sys, tempfile, time, urllib.request


def status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def measure(binary, n):
    with tempfile.TemporaryDirectory() as d:
        for i in range(n):
            with open(os.path.join(d, str(8 + i)), "w") as f:
                for j in range(64):
                    f.write((f"job-{i}-{j}-" + "x" * 1000)[:1000] + "\n")
        p = subprocess.Popen(
            [binary, "--backend", "sim", "-a", "127.0.0.1:0", "--log-format", "json",
             "--hpc-job-mapping-dir", d],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            addr = None
            for line in p.stderr:
                v = json.loads(line)
                if v["fields"].get("message") == "gpu-exporter listening":
                    addr = v["fields"]["address"]
                    break
            # Drain the rest of the log so that the exporter never blocks on it.
            import threading
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read()
                    break
                except Exception:
                    time.sleep(0.1)
            time.sleep(6)  # five scans at the 1 s cadence
            return status(p.pid, "VmHWM"), status(p.pid, "VmRSS")
        finally:
            p.kill()
            p.wait()


def main():
    binary = sys.argv[1]
    for n in [int(a) for a in sys.argv[2:]] or [0, 200, 2000]:
        hwm, rss = measure(binary, n)
        print(f"{n:5d} files: peak RSS {hwm / 1024:.1f} MiB, RSS {rss / 1024:.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
