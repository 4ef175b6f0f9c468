#!/usr/bin/env python3
"""Connection flood for scripts/soak.sh: a hostile client on the node network, from its own
loopback address (127.0.0.2 by default), against the exporter on loopback.

It keeps, for the whole run, and renews each one the moment the server closes it:
  - --idle sockets that send nothing,
  - --slowloris sockets that trickle a request head a byte a second,
  - --hello sockets that send the first bytes of a TLS ClientHello and stop (on a plain HTTP
    port these are malformed requests, answered 400 at once: a reconnect storm),
and every --burst-every seconds opens --burst more silent sockets for --burst-for seconds (past
the exporter's connection limit, so that it evicts).

Standard library only; one thread, non-blocking sockets. Prints one JSON summary line at the
end: sockets opened, closed by the server, the most held at once.
"""
import argparse
import errno
import json
import resource
import selectors
import socket
import sys
import time

HALF_CLIENT_HELLO = bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03])
SLOW_HEAD = b"GET /metrics HTTP/1.1\r\nHost: gpu-exporter\r\nX-Padding: " + b"a" * 200


class Flood:
    def __init__(self, args):
        self.args = args
        self.sel = selectors.DefaultSelector()
        self.stats = {"opened": 0, "closed_by_server": 0, "connect_errors": 0, "max_held": 0}
        self.held = 0

    def open(self, kind, until=None):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((self.args.source, 0))
            rc = s.connect_ex((self.args.host, self.args.port))
        except OSError:
            s.close()
            self.stats["connect_errors"] += 1
            return False
        if rc not in (0, errno.EINPROGRESS):
            s.close()
            self.stats["connect_errors"] += 1
            return False
        state = {"kind": kind, "until": until, "sent": 0, "next": time.monotonic(), "connected": False}
        self.sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, state)
        self.stats["opened"] += 1
        self.held += 1
        self.stats["max_held"] = max(self.stats["max_held"], self.held)
        return True

    def close(self, s, by_server):
        self.sel.unregister(s)
        s.close()
        self.held -= 1
        if by_server:
            self.stats["closed_by_server"] += 1

    def run(self):
        a = self.args
        for _ in range(a.idle):
            self.open("idle")
        for _ in range(a.slowloris):
            self.open("slowloris")
        for _ in range(a.hello):
            self.open("hello")
        start = time.monotonic()
        deadline = start + a.duration
        next_burst = start + a.burst_every if a.burst else float("inf")
        next_tick = start
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            if now >= next_burst:
                for _ in range(a.burst):
                    self.open("burst", until=now + a.burst_for)
                next_burst = now + a.burst_every
            for key, events in self.sel.select(timeout=0.2):
                s, st = key.fileobj, key.data
                if events & selectors.EVENT_WRITE and not st["connected"]:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        self.stats["connect_errors"] += 1
                        self.close(s, False)
                        self.open(st["kind"], st["until"])
                        continue
                    st["connected"] = True
                    self.sel.modify(s, selectors.EVENT_READ, st)
                    if st["kind"] == "hello":
                        try:
                            s.send(HALF_CLIENT_HELLO)
                        except OSError:
                            pass
                if events & selectors.EVENT_READ:
                    try:
                        data = s.recv(4096)
                    except OSError:
                        data = b""
                    if not data:
                        kind, until = st["kind"], st["until"]
                        self.close(s, True)
                        # Renew at once, as an attacker would (bursts only while they last).
                        if until is None or time.monotonic() < until:
                            self.open(kind, until)
            now = time.monotonic()
            if now < next_tick:
                continue
            # Trickling and burst expiry, five times a second.
            next_tick = now + 0.2
            for key in list(self.sel.get_map().values()):
                s, st = key.fileobj, key.data
                if st["until"] is not None and now >= st["until"]:
                    self.close(s, False)
                elif st["kind"] == "slowloris" and st["connected"] and now >= st["next"]:
                    try:
                        s.send(SLOW_HEAD[st["sent"] % len(SLOW_HEAD):][:1])
                        st["sent"] += 1
                    except OSError:
                        pass
                    st["next"] = now + 1.0
        for key in list(self.sel.get_map().values()):
            self.close(key.fileobj, False)
        return self.stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--source", default="127.0.0.2", help="the attacker's loopback address")
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--idle", type=int, default=300)
    ap.add_argument("--slowloris", type=int, default=100)
    ap.add_argument("--hello", type=int, default=50)
    ap.add_argument("--burst", type=int, default=1500)
    ap.add_argument("--burst-every", type=float, default=60.0)
    ap.add_argument("--burst-for", type=float, default=10.0)
    args = ap.parse_args()
    need = args.idle + args.slowloris + args.hello + args.burst + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            print(f"soak_flood: needs {need} descriptors, the hard limit is {hard}", file=sys.stderr)
            return 2
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    stats = Flood(args).run()
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
