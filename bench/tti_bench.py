#!/usr/bin/env python3
"""Time to interactive (TTI) of the local provider, as the computesdk
benchmarks measure it: from create() to the first byte of a command's
output, per isolation class, cold and from the warm pool, sequential and as
a burst of concurrent creates. Reports median, p95, p99 and success rate.

  bench/tti_bench.py --build build-release [--classes container,gvisor]
                     [-n 100] [--burst 100] [--warm N] [--repeat R]
                     [--client-cpu C] [--breakdown]
  bench/tti_bench.py --build B --classes gvisor --exec-ab AGENT1,AGENT2 -n 60

--exec-ab compares osr-agent binaries on the exec path alone: one running
sandbox per agent (same driver and adapter), then n rounds of `echo ready`
(Start -> first byte) against each in turn; interleaving keeps the machine's
load out of the comparison. It prints p50, p25 and min per agent.

With --repeat R every (class, pool, run) is measured R times, interleaved
(all classes and modes once, then again), and the table reports the median
of the R p50/p95/p99 values with the range of the p50s: on a shared machine
one run's median moves by +-30 % with the load, which is printed per run.
--breakdown adds, per sequential row, the p50 of each part of a sample:
the create's answer, connect, request -> response headers (the agent sends
them once the command's exec returned), headers -> first byte; then, in the
same sandbox, the same command again and the exec of a static binary (the
agent's own --version): the measured floor of an exec there. The extra
execs come after the TTI sample is taken.
--client-cpu pins this process (the client side: the JSON pipe to the
driver, the HTTP client) to one CPU, as `taskset -c C` would; the driver and
the sandboxes it starts are not pinned (pinning would change what a sandbox
sees: gVisor sizes its sentry by the CPUs it may use).

It drives the adapter through tests/integration/local/local_driver (one
process = one "gateway"), runs `echo ready` through the osr-agent of each new
sandbox over its unix socket, and destroys every sandbox it made (at the end
of each run, all at once: each row says how long that took). Interrupted (Ctrl-C, SIGTERM, SIGHUP) it destroys
what it made before exiting; killed (SIGKILL) its driver, in its own session,
sees its stdin close and destroys everything itself (--destroy-at-exit), so
no sandbox, mount or cgroup outlives the bench. Needs root (cgroups, tmpfs
mounts, runsc)."""
import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration", "local"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def first_byte(sb, cmd="/bin/sh", args=("-c", "echo ready"), parts=None):
    """Start `echo ready` and return when the first output byte arrives.
    With `parts` (a list), append the ms of: connect, request -> response
    headers (the agent answers once the command's exec returned), headers ->
    first output byte."""
    import base64
    import struct
    import test_local as T
    c = T.UnixHTTP(sb.sock, timeout=60)
    t0 = time.perf_counter()
    c.connect()
    t1 = time.perf_counter()
    body = json.dumps({"process": {"cmd": cmd, "args": list(args)}}).encode()
    c.request("POST", "/process.Process/Start", body=struct.pack(">BI", 0, len(body)) + body,
              headers={"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1",
                       "X-Access-Token": sb.token})
    r = c.getresponse()
    t2 = time.perf_counter()
    ok = False
    while r.status == 200:
        h = r.read(5)
        if len(h) < 5:
            break
        flags, n = struct.unpack(">BI", h)
        m = json.loads(r.read(n)) if n else {}
        if flags & 2:
            break
        d = m.get("event", {}).get("data", {})
        if d.get("stdout") and base64.b64decode(d["stdout"]):
            ok = True
            break
    c.close()
    if parts is not None:
        t3 = time.perf_counter()
        parts.extend([(t1 - t0) * 1000.0, (t2 - t1) * 1000.0, (t3 - t2) * 1000.0])
    return ok


# --breakdown columns: the create's answer, then first_byte's parts, then the
# same command again, then a static binary's exec (the agent's own --version):
# what an exec costs in that sandbox once its caches are warm, and its floor.
PARTS = ["create", "connect", "to headers", "to byte", "2nd sh", "static"]


def one(d, cls, results, lock, breakdown=None):
    import test_local as T
    tok = "tok-" + os.urandom(8).hex()
    t0 = time.perf_counter()
    a = d.call("create", timeout=120, **{"class": cls, "sandbox_id": "b-" + os.urandom(4).hex(),
                                         "token": tok})
    parts = [(time.perf_counter() - t0) * 1000.0]
    ok = False
    if a["status"] == "ok":
        sb = T.Sandbox(a["resource"], tok)
        try:
            ok = first_byte(sb, parts=parts)
        except Exception:  # noqa: BLE001 - a failed sample is counted, not fatal
            ok = False
    ms = (time.perf_counter() - t0) * 1000.0
    if ok and breakdown is not None:
        for cmd, args in (("/bin/sh", ("-c", "echo ready")), ("/opt/osr/osr-agent", ("--version",))):
            time.sleep(0.02)
            t = time.perf_counter()
            first_byte(sb, cmd, args)
            parts.append((time.perf_counter() - t) * 1000.0)
        with lock:
            breakdown.append(parts)
    with lock:
        results.append((ok, ms, a.get("status"), a.get("resource", {}).get("provider_id")))


def destroy_all(d, results):
    """Destroy the sandboxes of `results`, all at once (the driver runs them
    concurrently), and wait for every answer."""
    t0 = time.perf_counter()
    tags = [d.send("destroy", provider_id=pid) for _, _, _, pid in results if pid]
    for t in tags:
        d.wait(t, timeout=120)
    return len(tags), (time.perf_counter() - t0) * 1000.0


def remove_state(state):
    """Remove a state directory the driver has emptied; warn if it has not."""
    import shutil
    left = [n for n in os.listdir(state) if n.startswith("l")] if os.path.isdir(state) else []
    if left:
        print("warning: %d sandboxes left in %s" % (len(left), state), file=sys.stderr)
    else:
        shutil.rmtree(state, ignore_errors=True)


def print_breakdown(cls, mode, rows):
    cols = list(zip(*rows))
    print("  breakdown %s %s (n=%d, p50 ms): %s" % (cls, mode, len(rows), ", ".join(
        "%s %.2f" % (name, statistics.median(c)) for name, c in zip(PARTS, cols))), flush=True)


def run(d, cls, n, concurrent, breakdown=None):
    results, lock = [], threading.Lock()
    if concurrent:
        ts = [threading.Thread(target=one, args=(d, cls, results, lock), daemon=True)
              for _ in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
    else:
        for _ in range(n):
            one(d, cls, results, lock, breakdown)
    nd, dms = destroy_all(d, results)
    good = [ms for ok, ms, _, _ in results if ok]
    errs = sorted({st for ok, _, st, _ in results if not ok})
    return {"n": n, "ok": len(good), "success": len(good) / float(n) if n else 0.0,
            "p50": statistics.median(good) if good else float("nan"), "p95": pct(good, 95),
            "p99": pct(good, 99), "errors": errs, "destroyed": (nd, dms)}


def wait_pool(state, cls, want, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        have = 0
        for n in os.listdir(state):
            try:
                with open(os.path.join(state, n, "meta.json")) as f:
                    m = json.load(f)
                have += bool(m["warm"] and m["ready"] and m["class"] == cls)
            except (OSError, ValueError):
                pass
        if have >= want:
            return True
        time.sleep(0.02)
    return False


def exec_ab(T, cls, agents, n):
    ds, sbs = [], []
    try:
        for ag in agents:
            st = tempfile.mkdtemp(prefix="osr-tti-ab-", dir="/tmp")
            os.chmod(st, 0o711)
            d = T.Driver(st, agent_path=os.path.abspath(ag), destroy_at_exit=True)
            ds.append((d, st))
            tok = "tok-" + os.urandom(8).hex()
            a = d.call("create", timeout=120, **{"class": cls, "sandbox_id": "ab-" + os.urandom(4).hex(),
                                                 "token": tok})
            if a["status"] != "ok":
                raise RuntimeError("create with %s: %s" % (ag, a))
            sbs.append((d, T.Sandbox(a["resource"], tok), a["resource"]["provider_id"]))
        res = [[] for _ in agents]
        load0 = loadavg()
        for _ in range(n):
            for k, (_, sb, _) in enumerate(sbs):
                t0 = time.perf_counter()
                if first_byte(sb):
                    res[k].append((time.perf_counter() - t0) * 1000.0)
                time.sleep(0.02)
        load = (load0 + loadavg()) / 2
        print("| class | agent | n ok | p50 ms | p25 ms | min ms | load |")
        print("|---|---|---|---|---|---|---|")
        for ag, r in zip(agents, res):
            r.sort()
            print("| %s | %s | %d/%d | %.2f | %.2f | %.2f | %.1f |" % (
                cls, ag, len(r), n, statistics.median(r) if r else float("nan"),
                r[len(r) // 4] if r else float("nan"), r[0] if r else float("nan"), load))
    finally:
        # Also on an interrupt: the drivers destroy what they made at exit.
        for d, st in ds:
            d.hangup()
            remove_state(st)


def agent_linkage(path):
    """'static' or 'dynamic': whether the ELF file asks for a program interpreter."""
    try:
        with open(path, "rb") as f:
            head = f.read(8192)
    except OSError:
        return "?"
    return "dynamic" if b"/lib64/ld-linux" in head else "static"


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def measure(T, args, cls, mode):
    """One driver (= one gateway) for `cls` in `mode`: the sequential run,
    then the burst. Returns [(kind, result)]."""
    out = []
    state = tempfile.mkdtemp(prefix="osr-tti-", dir="/tmp")
    os.chmod(state, 0o711)
    cfg = {"warm_pool": {cls: args.warm}} if mode == "warm" else {}
    cpus = os.sched_getaffinity(0)
    d = T.Driver(state, destroy_at_exit=True, **cfg)
    try:
        out = measure_with(T, args, cls, mode, d, state)
    except BaseException:
        # Interrupted (or failed): the driver destroys everything of its
        # state dir once its stdin is closed, after the creates in flight
        # have answered.
        print("interrupted: destroying the sandboxes in %s" % state, file=sys.stderr, flush=True)
        os.sched_setaffinity(0, cpus)
        d.hangup()
        remove_state(state)
        raise
    os.sched_setaffinity(0, cpus)
    d.close()
    remove_state(state)
    return out


def measure_with(T, args, cls, mode, d, state):
    out = []
    if args.client_cpu is not None:
        # The driver was forked unpinned; from here on this thread and the
        # threads it starts (the burst's clients) run on one CPU.
        os.sched_setaffinity(0, {args.client_cpu})
    for kind, n, conc in (("sequential", args.n, False), ("burst", args.burst, True)):
        if n <= 0:
            continue
        load0 = loadavg()
        bd = [] if args.breakdown else None
        if mode == "warm" and not wait_pool(state, cls, 1):
            out.append((kind, {"n": n, "ok": 0, "success": 0.0, "p50": float("nan"),
                               "p95": float("nan"), "p99": float("nan"),
                               "errors": ["pool never filled"], "load": load0}))
            continue
        if mode == "warm" and not conc:
            # Sequential warm: let the pool refill between creates.
            results, lock = [], threading.Lock()
            for _ in range(n):
                wait_pool(state, cls, 1, timeout=30)
                one(d, cls, results, lock, bd)
            nd, dms = destroy_all(d, results)
            good = [ms for ok, ms, _, _ in results if ok]
            r = {"n": n, "ok": len(good), "success": len(good) / float(n),
                 "p50": statistics.median(good) if good else float("nan"),
                 "p95": pct(good, 95), "p99": pct(good, 99),
                 "errors": sorted({st for ok, _, st, _ in results if not ok}),
                 "destroyed": (nd, dms)}
        else:
            r = run(d, cls, n, conc, bd if not conc else None)
        r["load"] = (load0 + loadavg()) / 2
        out.append((kind, r))
        nd, dms = r.get("destroyed", (0, 0.0))
        print("%-9s %-4s %-10s n=%-4d ok=%-4d p50=%8.1f ms  p95=%8.1f ms  p99=%8.1f ms  load %.1f  "
              "(%d destroyed at once in %.0f ms)  %s" % (
                  cls, mode, kind, r["n"], r["ok"], r["p50"], r["p95"], r["p99"], r["load"], nd,
                  dms, ",".join(r["errors"])), flush=True)
        if bd:
            print_breakdown(cls, mode, bd)
    return out


def interrupt(signum, frame):
    raise KeyboardInterrupt("signal %d" % signum)


def main():
    # SIGTERM and SIGHUP unwind like Ctrl-C, through the clean-up in measure().
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--classes", default="container,gvisor")
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--burst", type=int, default=100)
    ap.add_argument("--warm", type=int, default=1, help="warm pool size for the warm runs")
    ap.add_argument("--modes", default="cold,warm", help="cold, warm or both")
    ap.add_argument("--repeat", type=int, default=1, help="measure every row this many times")
    ap.add_argument("--client-cpu", type=int, default=None, help="pin the client to this CPU")
    ap.add_argument("--breakdown", action="store_true",
                    help="sequential runs: also print the p50 of every part (see PARTS)")
    ap.add_argument("--exec-ab", default=None, metavar="AGENT1,AGENT2",
                    help="compare agent binaries on the exec path (see the top of the file)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ["OSR_LOCAL_DRIVER"] = os.path.join(build, "tests", "integration", "local", "local_driver")
    os.environ.setdefault("OSR_AGENT", os.path.join(build, "src", "osr-agent"))
    import test_local as T
    classes = []
    for cls in args.classes.split(","):
        why = T.runtime_problem(cls)
        if why:
            print("%s: skipped (%s)" % (cls, why), file=sys.stderr)
            continue
        classes.append(cls)
    print("agent %s (%s)" % (os.environ["OSR_AGENT"], agent_linkage(os.environ["OSR_AGENT"])), flush=True)
    if args.exec_ab:
        for cls in classes:
            exec_ab(T, cls, args.exec_ab.split(","), args.n)
        return
    rows = {}  # (cls, mode, kind) -> [result per repetition]
    for _ in range(args.repeat):
        for cls in classes:
            for mode in args.modes.split(","):
                for kind, r in measure(T, args, cls, mode):
                    rows.setdefault((cls, mode, kind), []).append(r)
    print()
    print("| class | pool | run | n | success | p50 ms | p95 ms | p99 ms | p50 range | load | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (cls, mode, kind), rs in rows.items():
        med = lambda k: statistics.median([r[k] for r in rs])  # noqa: E731
        p50s = [r["p50"] for r in rs]
        print("| %s | %s | %s | %d x %d | %.0f %% | %.1f | %.1f | %.1f | %.1f-%.1f | %.1f | %s |" % (
            cls, mode, kind, len(rs), rs[0]["n"], 100 * min(r["success"] for r in rs), med("p50"),
            med("p95"), med("p99"), min(p50s), max(p50s), med("load"),
            ", ".join(sorted({e for r in rs for e in r["errors"]})) or "-"))


if __name__ == "__main__":
    main()
