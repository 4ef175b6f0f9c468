#!/usr/bin/env python3
"""Per-process attribution against a real containerd + runc (no fake runtime, no fake /proc), as
root. Run by scripts/ci-containerd.sh:

  attribution_test.py --exporter BIN --fake-kubelet BIN

A private containerd (lab.py) runs two kubelet-style pods from images built here (a static C
workload that forks a child, so a container has two processes; the static pause image):
  ml/trainer      container main                 labels app=trainer, team=research
  serve/embed     containers server and sidecar  labels app=embed
The simulated fleet (8xH100, seed 1) reports per-process GPU readings for the real host PIDs of
those containers (`--sim-processes`, an assignments file written once the PIDs are known), plus
the test's own PID (a host process outside pods) and the trainer's pause process. The exporter
reads the real /proc and asks the private containerd over CRI; a fake kubelet serves
pod-resources from the same file (the exporter's per-process mode runs under -k).

Checks:
  0. the first scrape after /ready already has all of the below (the first sample waits for the
     first answers of the kubelet and the runtime);
  1. the CRI listing: gpu_exporter_cri_up 1, 2 pods, 3 containers (the sandboxes are not counted);
  2. per-container series of every real container carry its pod, namespace, container, pod UID
     and pod labels, with its real process count (trainer/main: 2, its main PID and its child);
     the host PID counts as outside pods, nothing unreadable or unknown;
  3. the pause process maps to its sandbox: attributed to ml/trainer with container="" (the pod,
     no container), its pod UID and labels;
  4. containerd stopped mid-run: the exporter keeps serving, gpu_exporter_cri_up 0 and
     gpu_exporter_cri_errors_total{reason="unavailable"} counts it; past --cri-ttl the pod labels
     and per-container series go (runtime_unavailable counted); containerd started again (same
     state: the pods' shims survived): the same series come back with the same labels;
  5. serve/embed deleted mid-run (CRI StopPodSandbox + RemovePodSandbox; the fake kubelet's file
     rewritten without it, as the kubelet would): no series names it within one refresh.
A second exporter at the default 30 s collect interval, on the same pods, checks 0 and 5 without
waiting for a tick (the first sample waits for the first answers; a change is re-rendered).
Every wait is bounded; everything is cleaned up even when a check fails.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lab import (  # noqa: E402
    WORKLOAD_IMAGE, Lab, LabError, child_pids, free_port, probe, scrape, series, wait_for,
)

INTERVAL_MS = 1000
CRI_REFRESH_MS = 1000
CRI_TTL_MS = 3000
KUBELET_REFRESH_MS = 1000
# "Within one refresh": the refresh period of each source, plus one collect interval for the
# sample to be published, plus scheduling slack on a loaded 2-core machine.
ONE_REFRESH_S = max(CRI_REFRESH_MS, KUBELET_REFRESH_MS) / 1000 + INTERVAL_MS / 1000 + 3
PATIENCE = 30.0

checks: list[str] = []


def check(cond: bool, what: str, detail: str = ""):
    if not cond:
        raise AssertionError(f"FAILED: {what}\n{detail}")
    checks.append(what)
    print(f"  ok  {what}", flush=True)


def gpu_uuids(exporter: str) -> list[str]:
    out = subprocess.run([exporter, "--backend", "sim", "--sim-profile", "8xH100-SXM", "--sim-seed", "1",
                          "--list-devices"], capture_output=True, text=True, timeout=30, check=True).stdout
    return [line.split("\t")[1] for line in out.splitlines() if line.startswith("GPU ")]


def assignments(entries) -> str:
    """entries: (namespace, pod, container, device, pids)."""
    out = []
    for ns, pod, container, device, pids in entries:
        out.append(f'[[assignment]]\nnamespace = "{ns}"\npod = "{pod}"\ncontainer = "{container}"\n'
                   f'devices = ["{device}"]\npids = [{", ".join(map(str, pids))}]\n')
    return "\n".join(out)


def value(samples, name, **labels):
    found = series(samples, name, **labels)
    return found[0][2] if len(found) == 1 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exporter", required=True)
    ap.add_argument("--fake-kubelet", required=True)
    ap.add_argument("--marker", default="", help="ignored: lets an exit trap find this process")
    args = ap.parse_args()

    lab = Lab()
    failed = False
    try:
        lab.start_containerd()
        lab.import_image(lab.build_workload_image())

        trainer = lab.run_pod("trainer", namespace="ml", labels={"app": "trainer", "team": "research"})
        trainer.run_container("main", WORKLOAD_IMAGE)
        embed = lab.run_pod("embed", namespace="serve", labels={"app": "embed"})
        embed.run_container("server", WORKLOAD_IMAGE)
        embed.run_container("sidecar", WORKLOAD_IMAGE)

        main_pid = trainer.pid("main")
        child = wait_for(lambda: child_pids(main_pid), 10, f"the workload's child process (PID {main_pid})")
        check(len(child) == 1, f"trainer/main runs two processes: {main_pid} and its child {child}")
        pause_pid = trainer.pause_pid()
        server_pid, sidecar_pid = embed.pid("server"), embed.pid("sidecar")
        host_pid = os.getpid()  # this test: a host process outside pods
        cg = Path(f"/proc/{pause_pid}/cgroup").read_text()
        check(trainer.id in cg and f"pod{trainer.uid}" in cg,
              f"the pause process {pause_pid}'s real cgroup names the sandbox id and the pod UID", cg)

        gpus = gpu_uuids(args.exporter)
        check(len(gpus) == 8, f"the simulated 8xH100 fleet lists 8 GPUs ({gpus[:1]}…)")
        # GPU 0: trainer/main (main, child) + a host process; GPU 1: the trainer's pause process
        # (a second assignment of the same container: only the PID matters for attribution);
        # GPU 2: serve/embed/server; GPU 3: serve/embed/sidecar.
        trainer_rows = [
            ("ml", "trainer", "main", gpus[0], [main_pid, child[0], host_pid]),
            ("ml", "trainer", "main", gpus[1], [pause_pid]),
        ]
        embed_rows = [
            ("serve", "embed", "server", gpus[2], [server_pid]),
            ("serve", "embed", "sidecar", gpus[3], [sidecar_pid]),
        ]
        afile = lab.dir / "assignments.toml"
        afile.write_text(assignments(trainer_rows + embed_rows))
        kubelet_sock = lab.dir / "kubelet.sock"
        fk = lab.spawn([args.fake_kubelet, "--socket", str(kubelet_sock), "--assignments", str(afile)],
                       "fake-kubelet.log")
        wait_for(lambda: "serving" in lab.read_log("fake-kubelet.log") or fk.poll() is not None, PATIENCE,
                 "fake-kubelet to serve")
        check(fk.poll() is None, "fake-kubelet serves pod-resources", lab.read_log("fake-kubelet.log"))

        port = free_port()
        exp = lab.spawn([
            args.exporter, "--backend", "sim", "--sim-profile", "8xH100-SXM", "--sim-seed", "1",
            "--sim-processes", str(afile), "-k", "--pod-resources-kubelet-socket", str(kubelet_sock),
            "--pod-resources-refresh", str(KUBELET_REFRESH_MS),
            "--container-runtime-endpoint", f"unix://{lab.socket}", "--path.procfs", "/proc",
            "--cri-refresh", str(CRI_REFRESH_MS), "--cri-ttl", str(CRI_TTL_MS), "--cri-timeout", "1000",
            "--kubernetes-process-usage", "--kubernetes-enable-pod-uid", "--kubernetes-enable-pod-labels",
            "-a", f"127.0.0.1:{port}", "-c", str(INTERVAL_MS),
            # Accounting published every 3 s (default: a minute), so that the energy check
            # below sees several publications, each kept over the samples between.
            "--accounting-publish-interval", "3000",
        ], "exporter.log")

        # The same, at the default collect interval (30 s): its first scrape and a pod's
        # deletion must not wait for a tick.
        port30 = free_port()
        exp30 = lab.spawn([
            args.exporter, "--backend", "sim", "--sim-profile", "8xH100-SXM", "--sim-seed", "1",
            "--sim-processes", str(afile), "-k", "--pod-resources-kubelet-socket", str(kubelet_sock),
            "--pod-resources-refresh", str(KUBELET_REFRESH_MS),
            "--container-runtime-endpoint", f"unix://{lab.socket}", "--path.procfs", "/proc",
            "--cri-refresh", str(CRI_REFRESH_MS), "--cri-ttl", str(CRI_TTL_MS), "--cri-timeout", "1000",
            "--kubernetes-process-usage", "--kubernetes-enable-pod-uid", "--kubernetes-enable-pod-labels",
            "-a", f"127.0.0.1:{port30}",
        ], "exporter-30s.log")

        def exporter_log():
            return lab.read_log("exporter.log")[-4000:]

        def alive():
            if exp.poll() is not None:
                raise AssertionError(f"the exporter exited ({exp.returncode}):\n{exporter_log()}")
            return True

        wait_for(lambda: alive() and probe(port)[0] == 200, PATIENCE, f"exporter /health on :{port}")

        expected = {
            # (namespace, pod, container, gpu): (processes, pod uid, pod labels)
            ("ml", "trainer", "main", "0"): (2, trainer.uid, {"app": "trainer", "team": "research"}),
            ("ml", "trainer", "", "1"): (1, trainer.uid, {"app": "trainer", "team": "research"}),
            ("serve", "embed", "server", "2"): (1, embed.uid, {"app": "embed"}),
            ("serve", "embed", "sidecar", "3"): (1, embed.uid, {"app": "embed"}),
        }

        def attributed(samples, keys):
            """Every expected per-container series is there with its labels and count."""
            for (ns, pod, container, gpu) in keys:
                n, uid, labels = expected[(ns, pod, container, gpu)]
                found = series(samples, "gpu_exporter_container_processes", namespace=ns, pod=pod, gpu=gpu)
                found = [s for s in found if s[1].get("container", "") == container]
                if len(found) != 1 or found[0][2] != n or found[0][1].get("pod_uid") != uid:
                    return False
                if any(found[0][1].get(k) != v for k, v in labels.items()):
                    return False
            return True

        # The first published sample waits for the first answer of the kubelet and the runtime:
        # the first scrape after /ready already attributes every real container.
        wait_for(lambda: alive() and probe(port, "/ready")[0] == 200, PATIENCE, f"exporter /ready on :{port}")
        samples = scrape(port)
        check(attributed(samples, expected),
              "the first scrape after /ready attributes every real container's processes",
              "\n".join(f"{n}{l} {v}" for n, l, v in series(samples, "gpu_exporter_container_processes")))

        wait_for(lambda: probe(port30, "/ready")[0] == 200 or exp30.poll() is not None, PATIENCE,
                 f"exporter (30 s interval) /ready on :{port30}")
        first30 = scrape(port30)
        check(attributed(first30, expected),
              "at the default 30 s interval too, the first scrape after /ready attributes every real container",
              lab.read_log("exporter-30s.log")[-2000:])

        # 1. The CRI listing.
        check(value(samples, "gpu_exporter_cri_up") == 1, "gpu_exporter_cri_up 1 (the real containerd answers)")
        check((value(samples, "gpu_exporter_cri_pods"), value(samples, "gpu_exporter_cri_containers")) == (2, 3),
              "the CRI listing: 2 pods, 3 containers (sandboxes not counted)",
              str(series(samples, "gpu_exporter_cri_pods") + series(samples, "gpu_exporter_cri_containers")))

        # 2. Real containers' processes.
        for (ns, pod, container, gpu), (n, uid, labels) in expected.items():
            s = [x for x in series(samples, "gpu_exporter_container_processes", namespace=ns, pod=pod, gpu=gpu)
                 if x[1].get("container", "") == container][0]
            if container:
                check(all(s[1].get(k) == v for k, v in labels.items()) and s[1]["pod_uid"] == uid and s[2] == n,
                      f"GPU {gpu}: {ns}/{pod}/{container}: {n} process(es), pod_uid {uid}, labels {labels}", str(s))
        fb = series(samples, "gpu_exporter_container_fb_used_bytes", namespace="ml", pod="trainer", container="main")
        check(len(fb) == 1 and fb[0][2] > 0, "trainer/main's framebuffer series is there and non-zero", str(fb))
        outcomes = {s[1]["outcome"]: s[2] for s in series(samples, "gpu_exporter_gpu_processes")}
        check(outcomes == {"attributed": 5, "outside_pods": 1, "unknown_container": 0, "unreadable": 0},
              "5 processes attributed, the host process outside pods, none unknown or unreadable", str(outcomes))
        pods_seen = {(s[1].get("namespace"), s[1].get("pod")) for s in samples
                     if s[0].startswith("gpu_exporter_container_") and not s[0].endswith("_total")}
        check(pods_seen == {("ml", "trainer"), ("serve", "embed")}, "per-container series name only the two real pods",
              str(pods_seen))

        # Accounting (issue 37): the real containers' own counters, and they increase.
        def trainer_accounts(smp):
            return {(s[1].get("gpu"), s[1].get("consumer")): s[2]
                    for s in series(smp, "gpu_exporter_container_allocated_gpu_seconds_total",
                                    namespace="ml", pod="trainer")}
        def trainer_energy(smp):
            return sum(s[2] for s in series(smp, "gpu_exporter_container_energy_joules_total",
                                            namespace="ml", pod="trainer"))
        # The first sample only sets each GPU's baseline: the counters appear from the second on.
        acc = wait_for(lambda: (lambda smp: smp if trainer_accounts(smp) else None)(scrape(port)),
                       PATIENCE, "ml/trainer's accounting series")
        before = trainer_accounts(acc)
        check(all(c in ("holder", "not_holder") for _, c in before),
              "accounting: ml/trainer has allocated GPU-seconds on the GPUs it holds", str(before))
        energy_before = trainer_energy(acc)
        later = wait_for(lambda: (lambda smp: smp if all(trainer_accounts(smp).get(k, 0) > v for k, v in before.items())
                                  and trainer_energy(smp) > energy_before else None)(scrape(port)),
                         PATIENCE, "ml/trainer's allocated GPU-seconds and energy increase")
        check(trainer_energy(later) > energy_before,
              f"accounting: ml/trainer's energy rose from {energy_before:.3f} J to {trainer_energy(later):.3f} J")

        # 3. The pause process.
        s = [x for x in series(samples, "gpu_exporter_container_processes", namespace="ml", pod="trainer", gpu="1")]
        check(len(s) == 1 and s[0][1].get("container", "") == "" and s[0][1].get("pod_uid") == trainer.uid
              and s[0][1].get("app") == "trainer" and s[0][2] == 1,
              "the pause process maps to its sandbox: ml/trainer, container=\"\", its pod UID and labels", str(s))
        errs = series(samples, "gpu_exporter_process_attribution_errors_total", reason="unknown_container")
        check(all(e[2] == 0 for e in errs), "no unknown_container errors (the sandbox id is known)", str(errs))

        # 4. containerd stopped and started again.
        def errors(samples, reason):
            return value(samples, "gpu_exporter_cri_errors_total", reason=reason) or 0

        before = errors(samples, "unavailable") + errors(samples, "socket_missing")
        lab.stop_containerd()
        down = wait_for(lambda: (lambda s: s if value(s, "gpu_exporter_cri_up") == 0 else None)(alive() and scrape(port)),
                        PATIENCE, "gpu_exporter_cri_up 0 after containerd stopped")
        check(errors(down, "unavailable") + errors(down, "socket_missing") > before,
              "containerd down: gpu_exporter_cri_errors_total counts the failed listings "
              f"(unavailable {errors(down, 'unavailable')}, socket_missing {errors(down, 'socket_missing')})")
        def runtime_unavailable(s):
            return value(s, "gpu_exporter_process_attribution_errors_total", reason="runtime_unavailable") or 0

        # The series may go as soon as the directory is dropped (re-rendered), the count comes
        # with the next tick that meets pod processes without a runtime answer: wait for both.
        dropped = wait_for(
            lambda: (lambda s: s if not series(s, "gpu_exporter_container_processes") and runtime_unavailable(s) > 0
                     else None)(alive() and scrape(port)),
            CRI_TTL_MS / 1000 + ONE_REFRESH_S + 5, "per-container series dropped past --cri-ttl, runtime_unavailable counted")
        check(value(dropped, "gpu_exporter_cri_pods") == 0,
              f"past the TTL: no per-container series, runtime_unavailable counted ({runtime_unavailable(dropped):.0f}), "
              "0 pods in use")
        check(probe(port)[0] == 200 and exp.poll() is None, "the exporter keeps serving without containerd")
        lab.restart_containerd()
        back = wait_for(lambda: (lambda s: s if attributed(s, expected) else None)(alive() and scrape(port)),
                        PATIENCE, "attribution back after containerd restarted")
        check(value(back, "gpu_exporter_cri_up") == 1 and attributed(back, expected),
              "containerd started again: cri_up 1, every series back with its pod, container, UID and labels")
        check(trainer.state("main") == "CONTAINER_RUNNING", "the pods kept running through the restart")

        # 5. A pod deleted mid-run.
        embed.remove()
        afile.write_text(assignments(trainer_rows))  # the kubelet forgets the pod too
        t0 = time.monotonic()

        def names_embed(s):
            # The accounting counters of a gone pod stay (their last values) for the retention
            # time, so that a scrape every 30 s still sees its last charges (docs/accounting.md).
            return [x for x in s if (x[1].get("pod") == "embed" or x[1].get("pod_name") == "embed")
                    and not (x[0].startswith("gpu_exporter_container_") and x[0].endswith("_total"))]

        def listed_alone(s):
            # The series (kubelet and process side) and the CRI listing refresh independently:
            # wait for both, each within one refresh.
            return (not names_embed(s) and value(s, "gpu_exporter_cri_pods") == 1
                    and value(s, "gpu_exporter_cri_containers") == 1)

        gone = wait_for(lambda: (lambda s: s if listed_alone(s) else None)(alive() and scrape(port)),
                        ONE_REFRESH_S, f"serve/embed gone from every series and the CRI listing within one refresh "
                                       f"({ONE_REFRESH_S:.0f}s)")
        took = time.monotonic() - t0
        check(attributed(gone, [k for k in expected if k[1] == "trainer"]),
              f"serve/embed deleted: gone from every series after {took:.1f}s; ml/trainer still attributed")
        check(value(gone, "gpu_exporter_cri_pods") == 1 and value(gone, "gpu_exporter_cri_containers") == 1,
              "the CRI listing now has 1 pod, 1 container")
        # At the default interval the deletion is published on the refresh, not the next tick.
        gone30 = wait_for(lambda: (lambda s: s if not names_embed(s) else None)(scrape(port30)), ONE_REFRESH_S,
                          f"serve/embed gone at the 30 s interval within one refresh ({ONE_REFRESH_S:.0f}s)")
        check(exp30.poll() is None and attributed(gone30, [k for k in expected if k[1] == "trainer"]),
              f"at the default 30 s interval: serve/embed gone {time.monotonic() - t0:.1f}s after its deletion, "
              "ml/trainer still attributed")
    except (AssertionError, LabError) as e:
        failed = True
        print(e, file=sys.stderr)
        print("--- exporter log (tail) ---\n" + lab.read_log("exporter.log")[-3000:], file=sys.stderr)
        print("--- containerd log (tail) ---\n" + lab.containerd_log(30), file=sys.stderr)
    finally:
        problems = lab.cleanup()
    if problems:
        print(f"FAILED: cleanup had to force: {problems}", file=sys.stderr)
        failed = True
    if failed:
        return 1
    print(f"all {len(checks)} attribution checks passed against containerd + runc")
    return 0


if __name__ == "__main__":
    sys.exit(main())
