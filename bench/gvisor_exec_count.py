#!/usr/bin/env python3
"""Where a gVisor exec goes, in counts that do not depend on the load: the
host system calls of the sentry (`perf stat -p <runsc sandbox pid>`: ptrace,
wait4, context switches) and of its gofer (every file lookup the sentry has
not cached) around each Start through osr-agent, in a sandbox
taken from the warm pool (pool of 1), and around each mode of
bench/gvisor_exec_probe inside the same kind of sandbox. Under the ptrace
platform every system call and page fault of a sandboxed process is a
ptrace stop of its stub (~5 host ptrace calls and one wait4): the counts
are the exec's work, the wall clock is that work times what a stop costs on
this machine at this load.

  bench/gvisor_exec_count.py --build build-release [--agent A1,A2] [-n 20]
                             [--probe MODE,MODE...] [--program "/bin/sh -c 'echo ready'"]

Per agent (default: the build's), one sandbox: Starts of `/bin/sh -c "echo
ready"` (three: the first in a fresh sandbox pays for new ptrace stubs),
`/usr/bin/busybox echo ready` (a static binary), a Start that fails in the
agent before spawning (bad cwd: the agent's own share) and GET /health;
one line each with the ms and the counts. With --probe, a second sandbox
runs each probe mode n times and prints the counts per iteration, the
baseline (`none`: the probe's own start and n sleeps) subtracted. Needs
root, runsc and perf (software events and tracepoints)."""
import argparse
import base64
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration", "local"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))

EVENTS = "syscalls:sys_enter_ptrace,syscalls:sys_enter_wait4,context-switches"


def sentry_pid(state, provider_id):
    for n in os.listdir(state):
        try:
            with open(os.path.join(state, n, "meta.json")) as f:
                m = json.load(f)
        except (OSError, ValueError):
            continue
        if m.get("provider_id") == provider_id:
            return m["pid"]
    raise RuntimeError("no meta.json for " + provider_id)


def gofer_pid(sandbox_dir):
    """The runsc-gofer serving the bundle in sandbox_dir (its file system
    server: every file lookup the sentry cannot answer from its caches is
    a round trip to it)."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"runsc-gofer") and sandbox_dir.encode() in argv:
            return int(p)
    return None


def counted(pid, fn, gofer=None):
    """Run fn() with perf counting the sentry's host calls (and the gofer's
    system calls); returns (fn's result, {"ptrace": N, "wait4": N, "cs": N,
    "gofer": N})."""
    p = subprocess.Popen(["perf", "stat", "-x,", "-e", EVENTS, "-p", str(pid)],
                         stderr=subprocess.PIPE, text=True)
    g = None
    if gofer is not None:
        g = subprocess.Popen(["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p", str(gofer)],
                             stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)  # attached
    try:
        r = fn()
    finally:
        time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate()
        gerr = ""
        if g is not None:
            g.send_signal(signal.SIGINT)
            _, gerr = g.communicate()
    names = {"sys_enter_ptrace": "ptrace", "sys_enter_wait4": "wait4", "context-switches": "cs",
             "sys_enter": "gofer"}
    cnt = {}
    for line in (err + "\n" + gerr).splitlines():
        f = line.split(",")
        if len(f) > 3 and f[0].isdigit():
            cnt[names.get(f[2].split(":")[-1], f[2])] = int(f[0])
    return r, cnt


class Box:
    """One gVisor sandbox from a warm pool of 1, through local_driver."""

    def __init__(self, T, TB, agent):
        self.state = tempfile.mkdtemp(prefix="osr-gvexec-", dir="/tmp")
        os.chmod(self.state, 0o711)
        self.d = T.Driver(self.state, agent_path=agent, warm_pool={"gvisor": 1})
        if not TB.wait_pool(self.state, "gvisor", 1):
            raise RuntimeError("the pool never filled")
        time.sleep(1)  # idle, as a pool sandbox is when taken
        self.token = "tok-" + os.urandom(8).hex()
        a = self.d.call("create", timeout=120, **{"class": "gvisor", "token": self.token,
                                                  "sandbox_id": "x-" + os.urandom(4).hex()})
        if a["status"] != "ok":
            raise RuntimeError("create: %r" % a)
        self.res = a["resource"]
        self.sb = T.Sandbox(self.res, self.token)
        self.pid = sentry_pid(self.state, self.res["provider_id"])
        self.gofer = gofer_pid(os.path.join(self.state, self.res["provider_id"]))

    def close(self):
        self.d.call("destroy", provider_id=self.res["provider_id"], timeout=120)
        self.d.close()
        if not [n for n in os.listdir(self.state) if n.startswith("l")]:
            shutil.rmtree(self.state, ignore_errors=True)


def bad_cwd_start(T, box):
    c = T.UnixHTTP(box.sb.sock)
    body = json.dumps({"process": {"cmd": "/bin/true", "cwd": "/nonexistent"}}).encode()
    c.request("POST", "/process.Process/Start", body=struct.pack(">BI", 0, len(body)) + body,
              headers={"Content-Type": "application/connect+json", "X-Access-Token": box.token})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status == 200


def health(T, box):
    c = T.UnixHTTP(box.sb.sock)
    c.request("GET", "/health")
    r = c.getresponse()
    r.read()
    c.close()
    return r.status < 300


def starts(T, TB, agent):
    box = Box(T, TB, agent)
    rows = [("sh -c 'echo ready' #1", lambda: TB.first_byte(box.sb)),
            ("sh -c 'echo ready' #2", lambda: TB.first_byte(box.sb)),
            ("sh -c 'echo ready' #3", lambda: TB.first_byte(box.sb)),
            ("busybox echo ready", lambda: TB.first_byte(box.sb, "/usr/bin/busybox", ("echo", "ready"))),
            ("Start, bad cwd", lambda: bad_cwd_start(T, box)),
            ("GET /health", lambda: health(T, box))]
    print("agent %s" % agent)
    print("| Start | ms | host ptrace | wait4 | context switches | gofer system calls | load |")
    print("|---|---|---|---|---|---|---|")
    try:
        for name, fn in rows:
            time.sleep(0.3)

            def timed():
                t = time.perf_counter()
                ok = fn()
                return ok, (time.perf_counter() - t) * 1000.0
            (ok, ms), c = counted(box.pid, timed, box.gofer)
            print("| %s | %s | %d | %d | %d | %d | %.1f |" % (
                name, "%.2f" % ms if ok else "failed", c.get("ptrace", -1), c.get("wait4", -1),
                c.get("cs", -1), c.get("gofer", -1), TB.loadavg()), flush=True)
    finally:
        box.close()


def probe(T, TB, agent, binary, modes, n, program=""):
    box = Box(T, TB, agent)
    try:
        with open(binary, "rb") as f:
            data = f.read()
        rc, _, err = box.sb.start("base64 -d > /tmp/probe && chmod +x /tmp/probe",
                                  stdin=base64.b64encode(data))
        if rc != 0:
            raise RuntimeError("upload: %r" % err)

        def run(mode):
            return box.sb.start("/tmp/probe %d %s %s" % (n, mode, program), timeout=600)
        (_, out, _), base = counted(box.pid, lambda: run("none"))
        print("probe in one sandbox, program %s, n=%d per mode, counts per iteration minus the "
              "baseline (probe start + %d sleeps: %d ptrace, %d wait4)" % (
                  program or "/usr/bin/busybox echo ready", n, n, base["ptrace"], base["wait4"]))
        print("| mode | host ptrace | wait4 | context switches | in-sandbox ms (first / p50 / min) | load |")
        print("|---|---|---|---|---|---|")
        for m in modes:
            (rc, out, err), c = counted(box.pid, lambda: run(m))
            f = out.decode().split()
            ms = "%s / %s / %s" % (f[3], f[5], f[7]) if rc == 0 and len(f) > 7 else "failed %r" % err
            per = {k: (c.get(k, 0) - base.get(k, 0)) / float(n) for k in ("ptrace", "wait4", "cs")}
            print("| %s | %.1f | %.1f | %.1f | %s | %.1f |" % (m, per["ptrace"], per["wait4"], per["cs"],
                                                             ms, TB.loadavg()), flush=True)
    finally:
        box.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-release")
    ap.add_argument("--agent", default=None, help="comma-separated osr-agent binaries (default: the build's)")
    ap.add_argument("-n", type=int, default=20, help="iterations per probe mode")
    ap.add_argument("--probe", default=None, metavar="MODES",
                    help="also run these gvisor_exec_probe modes (e.g. getppid,sig31,clone_exit,"
                         "fork_exit,vfork_exec,fork_exec,posix_spawn,prefork_exec,prefork_noexec)")
    ap.add_argument("--program", default="",
                    help="the probe's PROGRAM ARG... as a shell word list (default: its busybox echo)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ["OSR_LOCAL_DRIVER"] = os.path.join(build, "tests", "integration", "local", "local_driver")
    os.environ.setdefault("OSR_AGENT", os.path.join(build, "src", "osr-agent"))
    import test_local as T
    import tti_bench as TB
    why = T.runtime_problem("gvisor")
    if why:
        sys.exit("gvisor: " + why)
    agents = [os.path.abspath(a) for a in (args.agent or os.environ["OSR_AGENT"]).split(",")]
    for ag in agents:
        starts(T, TB, ag)
        print()
    if args.probe:
        probe(T, TB, agents[-1], os.path.join(build, "bench", "gvisor_exec_probe"),
              args.probe.split(","), args.n, args.program)


if __name__ == "__main__":
    main()
