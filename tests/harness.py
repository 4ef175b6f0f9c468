"""The pieces the Python test and benchmark drivers share (tests/e2e/e2e.py, benches/fleet/fleet.py):
a log line with a prefix, the failure exception, free loopback ports, HTTP GET, polling with a
deadline, and the started processes (stopped TERM, then KILL). Standard library only.

Importing it: `sys.path.insert(0, str(ROOT / "tests"))`, then `import harness`.
"""

import os
import socket
import subprocess
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


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        """TERMs every process still running at once, then waits up to grace_s for each in turn
        before KILLing it."""
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            self._reap(p, grace_s)

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
