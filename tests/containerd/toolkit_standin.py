#!/usr/bin/env python3
"""A stand-in for the NVIDIA Container Toolkit's runtime (nvidia-container-runtime), for tests.

Like the real one it is an OCI runtime wrapper around runc, named by a containerd runtime handler
(the pod's runtimeClassName): on `create` it edits the bundle's config.json of every container whose
environment asks for GPUs (NVIDIA_VISIBLE_DEVICES set, not void/none), then runs runc. The edit is
what the toolkit does to inject the driver (in its CDI mode):
  - a read-only bind mount of the driver library (here the C NVML stand-in built from
    tests/nvml_abi/nvml_standin.c) at LIB_DIR/libnvidia-ml.so.1 inside the container;
  - a createContainer hook (`update-ldcache`) that writes /etc/ld.so.conf.d/00-nvcr-standin.conf
    naming LIB_DIR into the container's root filesystem and runs ldconfig inside it, so that
    dlopen("libnvidia-ml.so.1") finds the library through the image's /etc/ld.so.conf and
    /etc/ld.so.cache.
Unlike the real one it reads its settings from the environment (the wrapper script lab.py's caller
writes sets them): STANDIN_RUNC (runc's path), STANDIN_LIB (the library on the host), STANDIN_LIB_DIR
(where it goes in the container; default /usr/lib64, where RHEL-family hosts keep it and which is
not on Debian's default search path, so only the ld cache can find it), STANDIN_LOG (a log file).

Usage as a runtime: toolkit_standin.py [runc arguments...]
Usage as the hook:  toolkit_standin.py update-ldcache --folder DIR   (OCI state JSON on stdin)
"""

import json
import os
import subprocess
import sys
from pathlib import Path


def log(msg: str):
    path = os.environ.get("STANDIN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(msg + "\n")


def wants_gpus(spec: dict) -> bool:
    for kv in spec.get("process", {}).get("env", []):
        key, _, value = kv.partition("=")
        if key == "NVIDIA_VISIBLE_DEVICES":
            return value not in ("", "void", "none")
    return False


def inject(bundle: Path):
    cfg_path = bundle / "config.json"
    spec = json.loads(cfg_path.read_text())
    if not wants_gpus(spec):
        return
    lib = os.environ["STANDIN_LIB"]
    lib_dir = os.environ.get("STANDIN_LIB_DIR", "/usr/lib64")
    spec.setdefault("mounts", []).append({
        "destination": f"{lib_dir}/libnvidia-ml.so.1",
        "type": "bind",
        "source": lib,
        "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
    })
    hook_env = [f"{k}={os.environ[k]}" for k in ("STANDIN_LOG", "PATH") if k in os.environ]
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append({
        "path": sys.executable,
        "args": [sys.executable, str(Path(__file__).resolve()), "update-ldcache", "--folder", lib_dir],
        "env": hook_env,
        "timeout": 30,
    })
    tmp = cfg_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(spec))
    tmp.replace(cfg_path)
    log(f"injected {lib} at {lib_dir}/libnvidia-ml.so.1 into {bundle.name}")


def update_ldcache(folders: list[str]):
    state = json.load(sys.stdin)
    bundle = Path(state["bundle"])
    spec = json.loads((bundle / "config.json").read_text())
    root = Path(spec["root"]["path"])
    if not root.is_absolute():
        root = bundle / root
    conf = root / "etc/ld.so.conf.d/00-nvcr-standin.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("".join(f"{d}\n" for d in folders))
    # ldconfig runs in the container's mount namespace (where the bind mount is), chrooted into
    # its root: the image's own /sbin/ldconfig, /etc/ld.so.conf and ld.so.conf.d. runc runs
    # createContainer hooks inside that namespace already (before pivot_root); a runtime that
    # runs them outside needs nsenter.
    cmd = ["chroot", str(root), "/sbin/ldconfig"]
    if not all((root / d.lstrip("/") / "libnvidia-ml.so.1").exists() for d in folders):
        cmd = ["nsenter", f"--mount=/proc/{state['pid']}/ns/mnt", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    log(f"update-ldcache {folders} in {root}: rc={r.returncode} {r.stdout}{r.stderr}".strip())
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        sys.exit(r.returncode)


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["update-ldcache"]:
        folders = [argv[i + 1] for i, a in enumerate(argv) if a == "--folder"]
        update_ldcache(folders)
        return
    if "create" in argv:
        rest = argv[argv.index("create") + 1:]
        for i, a in enumerate(rest):
            if a in ("--bundle", "-b") and i + 1 < len(rest):
                inject(Path(rest[i + 1]))
            elif a.startswith("--bundle="):
                inject(Path(a.split("=", 1)[1]))
    runc = os.environ.get("STANDIN_RUNC", "runc")
    os.execvp(runc, [runc, *argv])


if __name__ == "__main__":
    main()
