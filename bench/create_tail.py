#!/usr/bin/env python3
"""Where the slowest creates spend their time (issue 3, "Create tail").

Runs one gateway the way bench/create_bench.py does (pinned to --gw-cpu, load
generator and osr-sim on --load-cpu), with OSR_LOG_LEVEL=trace, drives C
concurrent creates for --duration seconds, then reads the gateway's trace
lines:

  [create] phases ID at T: start intent_run intent_ran intent_back provider
           handed update_run update_ran update_back replied (attempts N)
  [store] batch N at T in W us (cpu C us, runqueue R us)
  [store] sqlite checkpoint at T: C of N WAL frames in W us (passive|restart|writer...)
  [reaper] pass at T ended at T2 (N live|due, trim W us[, longest step S us])

(every time in µs, uv_hrtime; the phases relative to the request's parse)
and prints, for all creates and for the slowest 1 %, the median time spent
in each step between two stamps, and how many of the slowest overlapped a
reaper pass, a checkpoint or a store batch over 1 ms. Trace logging costs
time itself: this shows where a tail comes from, create_bench.py measures it.

With SQLite it also samples the size of the WAL file every --wal-every
seconds and prints the checkpoints by kind (frames in the WAL when each
ran, how long each took) and how many store transactions took over 1, 2, 5
and 10 ms.

Usage: bench/create_tail.py [--build DIR] [--store sqlite|pg] [--mode inproc|url]
       [-c 10] [--duration 4 | -n 20000] [--warmup 1] [--base-gateway EXE]
"""
import argparse
import os
import re
import statistics
import sys
import threading

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import create_bench  # noqa: E402

STEPS = ["start", "intent_run", "intent_ran", "intent_back", "provider", "handed", "update_run",
         "update_ran", "update_back", "replied"]
# What each step between two stamps is.
NAMES = {
    "start": "parse -> create start (loop: body, auth)",
    "intent_run": "intent queued -> its transaction starts (store queue)",
    "intent_ran": "intent transaction (worker)",
    "intent_back": "intent committed -> callback on the loop",
    "provider": "provider call",
    "handed": "binding update queued + token signed (loop)",
    "update_run": "update queued -> its transaction starts",
    "update_ran": "update transaction (worker)",
    "update_back": "update committed -> callback on the loop",
    "replied": "answer written",
}

PHASE = re.compile(r"phases (\S+) at (\d+):((?: -?\d+){10})")
BATCH = re.compile(r"batch (\d+)(?: relaxed)? at (\d+) in (\d+) us \(cpu (\d+) us, runqueue (\d+) us\)")
CKPT = re.compile(r"sqlite checkpoint at (\d+): (\d+) of (\d+) WAL frames in (\d+) us(?: \(([^),]+))?")
# "longest step" since the paged pass (engineer "reaper"); -1 in older builds' lines.
REAP = re.compile(r"pass at (\d+) ended at (\d+) \((\d+) (?:live|due), trim (\d+) us(?:, longest step (\d+) us)?\)")


def parse(path):
    creates, batches, ckpts, passes = [], [], [], []
    with open(path, errors="replace") as f:
        for ln in f:
            m = PHASE.search(ln)
            if m:
                rel = [int(x) for x in m.group(3).split()]
                creates.append((int(m.group(2)), rel))
                continue
            m = BATCH.search(ln)
            if m:
                t, w = int(m.group(2)), int(m.group(3))
                batches.append((t, t + w, int(m.group(1)), int(m.group(4)), int(m.group(5))))
                continue
            m = CKPT.search(ln)
            if m:
                t = int(m.group(1))
                ckpts.append((t, t + int(m.group(4)), int(m.group(3)), m.group(5) or "?"))
                continue
            m = REAP.search(ln)
            if m:
                passes.append((int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)),
                               int(m.group(5) or -1)))
    return creates, batches, ckpts, passes


def overlaps(t0, t1, spans):
    return any(a < t1 and b > t0 for a, b in spans)


def analyse(creates, batches, ckpts, passes, skip_us):
    out = []
    if not creates:
        return "no phase lines (was the gateway built from this tree, trace level on?)"
    t_first = min(t for t, _ in creates)
    creates = [(t, r) for t, r in creates if t >= t_first + skip_us]
    creates.sort(key=lambda x: x[1][-1])
    n = len(creates)
    slow = creates[int(n * 0.99):]
    out.append("%d creates after the warm-up; total (parse -> answer written) p50 %d us, p99 %d us, "
               "max %d us; slowest 1 %%: %d creates" % (
                   n, creates[n // 2][1][-1], creates[int(n * 0.99)][1][-1], creates[-1][1][-1], len(slow)))

    def steps(rel):
        prev, d = 0, []
        for v in rel:
            d.append(v - prev if v >= 0 and prev >= 0 else 0)
            prev = v
        return d

    out.append("")
    out.append("| step | median all µs | median slowest 1 % µs | mean slowest 1 % µs | share of slowest total |")
    out.append("|---|---|---|---|---|")
    all_d = [steps(r) for _, r in creates]
    slow_d = [steps(r) for _, r in slow]
    tot = sum(r[-1] for _, r in slow) or 1
    for i, k in enumerate(STEPS):
        sa = statistics.median(d[i] for d in all_d)
        ss = statistics.median(d[i] for d in slow_d)
        ms = statistics.mean(d[i] for d in slow_d)
        share = sum(d[i] for d in slow_d) / tot
        out.append("| %s | %d | %d | %.0f | %.0f %% |" % (NAMES[k], sa, ss, ms, 100 * share))
    bigb = [(a, b) for a, b, *_ in batches if b - a > 1000]
    reap = [(a, b) for a, b, *_ in passes]
    ck = [(a, b) for a, b, *_ in ckpts]
    spans = {"a reaper pass": reap, "a checkpoint": ck, "a store batch > 1 ms": bigb}
    out.append("")
    for what, sp in spans.items():
        ns = sum(overlaps(t, t + r[-1], sp) for t, r in slow)
        na = sum(overlaps(t, t + r[-1], sp) for t, r in creates)
        out.append("overlapping %s: slowest 1 %% %d of %d (%.0f %%), all creates %.0f %%" % (
            what, ns, len(slow), 100.0 * ns / max(1, len(slow)), 100.0 * na / max(1, n)))
    if batches:
        ws = sorted(b - a for a, b, *_ in batches)
        sizes = [s for _, _, s, _, _ in batches]
        out.append("store batches: %d, mean size %.1f, wall p50 %d us p99 %d us max %d us; over 1 ms: %d "
                   "(cpu %d us, runqueue %d us summed)" % (
                       len(ws), statistics.mean(sizes), ws[len(ws) // 2], ws[int(len(ws) * 0.99)], ws[-1],
                       len(bigb), sum(c for a, b, _, c, _ in batches if b - a > 1000),
                       sum(q for a, b, _, _, q in batches if b - a > 1000)))
    out.append("checkpoints: %d, longest %d us" % (len(ckpts), max((b - a for a, b, *_ in ckpts), default=0)))
    for kind in sorted(set(k for *_, k in ckpts)):
        us = sorted(b - a for a, b, _, k in ckpts if k == kind)
        fr = sorted(f for _, _, f, k in ckpts if k == kind)
        out.append("  %s: %d, wall p50 %d us p99 %d us max %d us; WAL frames p50 %d max %d" % (
            kind, len(us), us[len(us) // 2], us[int(len(us) * 0.99)], us[-1], fr[len(fr) // 2], fr[-1]))
    if batches:
        ws = [b - a for a, b, *_ in batches]
        out.append("store transactions (batches) over 1 / 2 / 5 / 10 ms: %s of %d" % (
            " / ".join(str(sum(w > t for w in ws)) for t in (1000, 2000, 5000, 10000)), len(ws)))
    if batches and ckpts:
        inb = [b - a for a, b, *_ in batches if overlaps(a, b, ck)]
        outb = [b - a for a, b, *_ in batches if not overlaps(a, b, ck)]
        if inb and outb:
            out.append("store batch wall, during a checkpoint / not: mean %.0f / %.0f us, p99 %d / %d us" % (
                statistics.mean(inb), statistics.mean(outb), sorted(inb)[int(len(inb) * 0.99)],
                sorted(outb)[int(len(outb) * 0.99)]))
    for a, b, live, trim, step in passes:
        out.append("reaper pass: %d us, %d live or due, malloc_trim %d us, longest step %s, creates answered "
                   "during it: %d" % (b - a, live, trim, "%d us" % step if step >= 0 else "not stamped",
                                      sum(1 for t, r in creates if a <= t + r[-1] <= b)))
    return "\n".join(out)


def thread_times(pid):
    """CPU time and run-queue wait of the gateway's threads by name
    (/proc/PID/task/TID/schedstat, ns), e.g. osr-store, osr-ckpt."""
    by = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                name = f.read().strip()
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                run, wait = (int(x) for x in f.read().split()[:2])
        except OSError:
            continue
        if int(tid) == pid:
            name = "loop"
        r = by.setdefault(name, [0, 0])
        r[0] += run
        r[1] += wait
    return "thread CPU ms (run-queue wait ms): " + ", ".join(
        "%s %.0f (%.0f)" % (k, v[0] / 1e6, v[1] / 1e6) for k, v in sorted(by.items()))


class WalSampler:
    """The WAL file's size every `every` s while the load runs."""

    def __init__(self, path, every):
        self.path, self.every, self.sizes, self.done = path, every, [], threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.done.wait(self.every):
            try:
                self.sizes.append(os.stat(self.path).st_size)
            except OSError:
                self.sizes.append(0)

    def stop(self):
        self.done.set()
        self.t.join()
        v = self.sizes or [0]
        step = max(1, len(v) // 20)
        return "WAL file size (KiB) every %.2f s: max %d, p50 %d; %s" % (
            self.every, max(v) >> 10, sorted(v)[len(v) // 2] >> 10,
            " ".join(str(x >> 10) for x in v[::step]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(here, "..", "build-release"))
    ap.add_argument("--base-gateway", help="profile this osr-gateway instead of BUILD's")
    ap.add_argument("--store", default="sqlite", choices=["sqlite", "pg"])
    ap.add_argument("--mode", default="inproc", choices=["inproc", "url"])
    ap.add_argument("-c", type=int, default=10)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("-n", type=int, help="drive this many creates instead of --duration (no warm-up)")
    ap.add_argument("--wal-every", type=float, default=0.1, help="WAL size sample period (s)")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--gw-cpu", type=int, default=1)
    ap.add_argument("--load-cpu", type=int, default=0)
    ap.add_argument("--log", help="analyse this gateway log instead of running one")
    ap.add_argument("--keep-log", help="copy the gateway's log here")
    a = ap.parse_args()
    if a.log:
        print(analyse(*parse(a.log), skip_us=0))
        return
    ns = argparse.Namespace(build=a.build, sim=None, load=None, warmup=a.warmup, gw_cpu=a.gw_cpu,
                            load_cpu=a.load_cpu, base_gateway=None, pg_params="")
    b = create_bench.Bench(ns)
    sim = b.start_sim() if a.mode == "url" else None
    if a.store == "pg":
        b.pg = b.start_pg()
    try:
        g = b.start_gw(a.store, a.mode, sim, exe=a.base_gateway, log_level="trace")
        wal = WalSampler(os.path.join(g.dir, "osr.db-wal"), a.wal_every) if a.store == "sqlite" else None
        r = b.gw_load(g, a.c, count=a.n) if a.n else b.gw_load(g, a.c, duration=a.duration)
        if wal:
            print(wal.stop())
        print("client: %.0f creates/s p50 %d us p99 %d us (load average %.2f)" % (
            r["rps"], r["p50_us"], r["p99_us"], os.getloadavg()[0]))
        print(thread_times(g.pid))
        g.stop()
        glog = os.path.join(g.dir, "gateway.log")
        if a.keep_log:
            create_bench.shutil.copyfile(glog, a.keep_log)
        print(analyse(*parse(glog), skip_us=0 if a.n else int(a.warmup * 1e6)))
        b.stop_gw(g)
        if sim is not None:
            s = b.load(sim.port, "/v1/resources", create_bench.SIM_BODY, a.c, duration=a.duration)
            print("osr-sim direct, same connections pattern as create_bench: %.0f/s p50 %d us p99 %d us" % (
                s["rps"], s["p50_us"], s["p99_us"]))
    finally:
        if sim is not None:
            sim.stop()
        if b.pg:
            b.pg.close()
        create_bench.shutil.rmtree(b.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
