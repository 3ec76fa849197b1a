#!/usr/bin/env python3
"""1 GiB exec stdout through osr-dataplane -> osr-agent for two builds (A/B),
interleaved with the same command's stdout pipe read directly, per round.

  bench/exec_ab.py BUILD_BEFORE BUILD_AFTER [ROUNDS] [BYTES]
  bench/exec_ab.py --profile callgrind|strace BUILD [BYTES]

  bench/exec_ab.py --pin BUILD [ROUNDS] [BYTES]

--pin runs BYTES (default 512 MiB) of exec stdout per placement and round:
osr-agent and osr-dataplane on the same CPU or on different ones (the
reader on the other), everything on one CPU, unpinned, and the same-CPU
case with both daemons SCHED_BATCH (chrt -b: a woken task does not preempt
the running one): the bimodality experiment of bench/README.md. Every
placement sets both daemons' policy explicitly (chrt -o otherwise), so the
rows other than the last run the agent SCHED_OTHER although osr-agent
defaults to SCHED_BATCH now (--sched, docs/agent.md).
--profile runs osr-dataplane of BUILD under `valgrind --tool=callgrind` or
`strace -c -f` (the agent runs plain) for one exec stdout of BYTES (default
64 MiB), then prints its instructions (and per byte) or system calls.

Each build needs src/osr-agent and src/osr-dataplane; dp-mint and the
reader, bench/exec_read (C, the same for every path, pinned to CPU 0; the
pipe row's `head` to CPU 1), are taken from BUILD_AFTER (or BUILD_BEFORE).
The exec sessions are the WebSocket console (v5.channel.k8s.io). For
instruction counts run the two daemons under `valgrind --tool=callgrind`
(bench/README.md "Exec streams")."""
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dataplane_bench as db  # noqa: E402


def find_tool(builds, rel):
    for b in reversed(builds):
        m = os.path.join(b, rel)
        if os.path.exists(m):
            return m
    sys.exit("%s not found in %s" % (rel, " or ".join(builds)))


def find_mint(builds):
    return find_tool(builds, os.path.join("tests", "integration", "dataplane", "dp-mint"))


def console(reader, port, tok, nbytes, cpu=0):
    """MB/s of one exec stdout through the console, read by bench/exec_read."""
    return db.exec_read(reader, cpu, ["ws", "127.0.0.1:%d" % port, "/v1/sandboxes/s1/exec?"
                                      + db.exec_cmd_query(nbytes), nbytes,
                                      "X-Access-Token: " + tok])


def start(build, mint, wrap=()):
    d = tempfile.mkdtemp(prefix="osr-exec-ab-")
    os.mkdir(os.path.join(d, "keys"))
    subprocess.run([mint, "genkey", os.path.join(d, "keys"), "k1"], check=True,
                   stdout=subprocess.DEVNULL)
    sock = os.path.join(d, "a.sock")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    q = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pa = subprocess.Popen([os.path.join(build, "src", "osr-agent"), "--listen", "unix:" + sock,
                           "--log-level", "error"], **q)
    pd = subprocess.Popen(list(wrap) + [os.path.join(build, "src", "osr-dataplane"), "--listen",
                           "127.0.0.1:%d" % port, "--keys-dir", os.path.join(d, "keys"),
                           "--log-level", "error"], **q)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            time.sleep(0.05)
    for _ in range(600):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    tok = subprocess.run([mint, "sign", os.path.join(d, "keys"), "k1", "s1", "unix:" + sock, "exec",
                          "none", "86400"], capture_output=True, text=True, check=True).stdout.strip()
    return port, tok, (pa, pd)


def profile(tool, build, nbytes):
    mint = find_mint([build])
    reader = find_tool([build], os.path.join("bench", "exec_read"))
    d = tempfile.mkdtemp(prefix="osr-exec-prof-")
    out = os.path.join(d, tool + ".out")
    wrap = (["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out]
            if tool == "callgrind" else ["strace", "-c", "-f", "-o", out])
    port, tok, (pa, pd) = start(build, mint, wrap)
    if tool == "callgrind":
        time.sleep(3)  # valgrind starts slowly; start() waited for the port already
    try:
        mbs = console(reader, port, tok, nbytes)
    finally:
        dp = db.traced_child(pd.pid) if tool == "strace" else pd.pid
        os.kill(dp, 15)
        pd.wait()
        pa.terminate()
        pa.wait()
    print("%d bytes of exec stdout, %.0f MB/s under %s" % (nbytes, mbs, tool))
    if tool == "callgrind":
        txt = subprocess.run(["callgrind_annotate", out], capture_output=True, text=True).stdout
        lines = txt.splitlines()
        for i, ln in enumerate(lines):
            if "PROGRAM TOTALS" in ln:
                ir = int(ln.split()[0].replace(",", ""))
                print("osr-dataplane: %d instructions, %.2f per byte" % (ir, ir / nbytes))
                print("\n".join(lines[i + 1:i + 25]))
                break
    else:
        print(open(out).read())


PLACEMENTS = {  # name: (agent CPU, data plane CPU, reader CPU, SCHED_BATCH)
    "agent+dp same CPU": ("0", "0", {1}, False),
    "agent, dp apart": ("0", "1", {1}, False),
    "all on CPU 0": ("0", "0", {0}, False),
    "unpinned": ("0-1", "0-1", {0, 1}, False),
    "same CPU, SCHED_BATCH": ("0", "0", {1}, True),
}


def pin(build, rounds, nbytes):
    mint = find_mint([build])
    reader = find_tool([build], os.path.join("bench", "exec_read"))
    port, tok, (pa, pd) = start(build, mint)
    res = {k: [] for k in PLACEMENTS}
    q = dict(stdout=subprocess.DEVNULL, check=True)
    try:
        print("load average:", open("/proc/loadavg").read().strip())
        for r in range(rounds):
            for k, (ca, cd, cr, batch) in PLACEMENTS.items():
                for pid, cpu in ((pa.pid, ca), (pd.pid, cd)):
                    subprocess.run(["taskset", "-pc", cpu, str(pid)], **q)
                    subprocess.run(["chrt", "-b" if batch else "-o", "-p", "0", str(pid)], **q)
                res[k].append(console(reader, port, tok, nbytes, ",".join(map(str, sorted(cr)))))
            print("round %d: %s" % (r + 1, ", ".join("%s %.0f" % (k, v[-1]) for k, v in res.items())),
                  flush=True)
        print("load average:", open("/proc/loadavg").read().strip())
        print("| placement | MB/s (median) | runs |\n|---|---|---|")
        for k, v in res.items():
            print("| %s | %.0f | %s |" % (k, statistics.median(v), ", ".join("%.0f" % x for x in v)))
    finally:
        pa.terminate()
        pd.terminate()
        pa.wait()
        pd.wait()


def reader_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--pin":
        return pin(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 3,
                   int(sys.argv[4]) if len(sys.argv) > 4 else 512 << 20)
    if len(sys.argv) >= 3 and sys.argv[1] == "--profile":
        return profile(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 64 << 20)
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    builds = sys.argv[1:3]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    nbytes = int(sys.argv[4]) if len(sys.argv) > 4 else 1 << 30
    mint = find_mint(builds)
    reader = find_tool(builds, os.path.join("bench", "exec_read"))
    paths = {"before": start(builds[0], mint), "after": start(builds[1], mint)}
    res = {}
    try:
        print("load average:", open("/proc/loadavg").read().strip())
        cpu = {}
        for r in range(rounds):
            res.setdefault("pipe", []).append(db.pipe_stdout(reader, 1, 0, nbytes))
            for k, (port, tok, ps) in paths.items():
                c0 = [db.cpu_s([p.pid]) for p in ps] + [reader_cpu()]
                res.setdefault(k, []).append(console(reader, port, tok, nbytes))
                c1 = [db.cpu_s([p.pid]) for p in ps] + [reader_cpu()]
                cpu.setdefault(k, []).append([b - a for a, b in zip(c0, c1)])
            print("round %d: %s" % (r + 1, ", ".join("%s %.0f MB/s" % (k, v[-1])
                                                      for k, v in res.items())), flush=True)
            print("  CPU s (agent / data plane / reader): %s" % ", ".join(
                "%s %s" % (k, " / ".join("%.2f" % x for x in v[-1])) for k, v in cpu.items()),
                flush=True)
        print("load average:", open("/proc/loadavg").read().strip())
        pm = statistics.median(res["pipe"])
        print("| exec stdout | MB/s | × pipe |\n|---|---|---|")
        for k, v in res.items():
            print("| %s | %.0f | %.2f |" % (k, statistics.median(v), statistics.median(v) / pm))
    finally:
        for _, _, ps in paths.values():
            for p in ps:
                p.terminate()
                p.wait()


if __name__ == "__main__":
    main()
