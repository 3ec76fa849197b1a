#!/usr/bin/env python3
"""N concurrent exec streams through one osr-dataplane to K osr-agents
(bench/README.md "10,000 concurrent exec streams").

  bench/exec_streams.py [--build build-release] [-n 10000] [--agents 4]
                        [--mux on|off] [--open-concurrency 1000]

Each stream is an HTTP/1.1 exec stream (POST /v1/sandboxes/{id}/exec, the
asyncio client of tests/integration/dataplane/execstreams.py) running `cat`
with stdin and osrInfo=true. All N are opened at once (at most
--open-concurrency connects in flight); a stream is open when its osrInfo
frame arrived (the agent started the process). With all N open the data
plane's descriptors (/proc/PID/fd) and RSS are read; then every stream
sends one line, must get it back byte-exact, closes stdin and must end with
a Success status. Streams are spread round-robin over K agents (one agent's
descriptor limit is the bound: each `cat` holds 3 pipe ends in its agent, so
one agent under `ulimit -n` 20,000 carries at most ~6,000).

Prints: success rate, time to open all, data plane descriptors (baseline,
peak, per stream), data plane RSS (baseline, peak, per stream), shared
connections (descriptors beyond one per stream), and the agents' descriptors.
The success rate and the descriptor/RSS counts do not depend on the
machine's load; the time to open all does."""
import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration", "dataplane"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
from execstreams import ExecStream  # noqa: E402
from osrtest import fd_count as fds, rss_kib  # noqa: E402


def wait_port(port):
    for _ in range(1200):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("the data plane did not come up")


def wait_file(path):
    for _ in range(1200):
        if os.path.exists(path):
            return
        time.sleep(0.05)
    sys.exit("no %s" % path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-release")
    ap.add_argument("-n", type=int, default=10000)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--mux", choices=("on", "off"), default="on")
    ap.add_argument("--open-concurrency", type=int, default=1000)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # children inherit it
    build = args.build
    mint = os.path.join(build, "tests", "integration", "dataplane", "dp-mint")
    d = tempfile.mkdtemp(prefix="osr-exec-streams-")
    keys = os.path.join(d, "keys")
    os.mkdir(keys)
    subprocess.run([mint, "genkey", keys, "k1"], check=True, stdout=subprocess.DEVNULL)
    q = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    per_agent = (args.n + args.agents - 1) // args.agents
    agents, socks = [], []
    for i in range(args.agents):
        sock = os.path.join(d, "a%d.sock" % i)
        agents.append(subprocess.Popen([os.path.join(build, "src", "osr-agent"), "--listen",
                                        "unix:" + sock, "--workdir", d, "--max-processes",
                                        str(per_agent + 16), "--log-level", "error"], **q))
        socks.append(sock)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    dp = subprocess.Popen([os.path.join(build, "src", "osr-dataplane"), "--listen",
                           "127.0.0.1:%d" % port, "--keys-dir", keys, "--max-conns",
                           str(args.n + 1000), "--exec-mux", args.mux, "--log-level", "error"], **q)
    procs = agents + [dp]
    try:
        wait_port(port)
        for sock in socks:
            wait_file(sock)
        toks = [subprocess.run([mint, "sign", keys, "k1", "s%d" % i, "unix:" + socks[i], "exec",
                                "none", "86400"], capture_output=True, text=True,
                               check=True).stdout.strip() for i in range(args.agents)]
        base_fd, base_rss = fds(dp.pid), rss_kib(dp.pid)
        print("load average before: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
        res = asyncio.run(run(args, port, toks, dp.pid, agents))
        n = args.n
        print("| streams | agents | mux | success | time to open all | dp descriptors (base -> peak) "
              "| per stream | dp RSS (base -> peak) | RSS per stream | agents' descriptors |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        print("| %d | %d | %s | %d / %d (%.2f %%) | %.2f s | %d -> %d | %.3f | %.1f -> %.1f MiB | %.2f KiB | %s |" % (
            n, args.agents, args.mux, res["ok"], n, 100.0 * res["ok"] / n, res["open_s"], base_fd,
            res["peak_fd"], (res["peak_fd"] - base_fd) / n, base_rss / 1024, res["peak_rss"] / 1024,
            (res["peak_rss"] - base_rss) / n, " + ".join(str(x) for x in res["agent_fds"])))
        print("opened: %d, failures: %s" % (res["opened"], res["why"]))
        print("load average after: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run(["rm", "-rf", d])


async def run(args, port, toks, dp_pid, agents):
    n = args.n
    sem = asyncio.Semaphore(args.open_concurrency)
    why = {}

    def fail(k):
        why[k] = why.get(k, 0) + 1

    async def open_one(i):
        async with sem:
            try:
                s = await ExecStream.open("127.0.0.1", port, "s%d" % (i % args.agents),
                                          toks[i % args.agents], ["cat"], stdin=True, info=True)
                if not await s.read_until(lambda s: s.info is not None or s.status is not None) \
                        or s.info is None:
                    fail("no start: %s" % ((s.status or {}).get("message", "eof")[:80]))
                    s.close()
                    return None
                return s
            except Exception as ex:  # counted, not fatal: the success rate is the result
                fail("open: %s" % type(ex).__name__)
                return None

    t0 = time.monotonic()
    streams = await asyncio.gather(*[open_one(i) for i in range(n)])
    open_s = time.monotonic() - t0
    live = [(i, s) for i, s in enumerate(streams) if s is not None]
    peak_fd, peak_rss = fds(dp_pid), rss_kib(dp_pid)
    agent_fds = [fds(a.pid) for a in agents]

    async def finish(i, s):
        line = b"hello-%d\n" % i
        try:
            s.send_stdin(line)
            if not await s.read_until(lambda s: len(s.out[1]) >= len(line)) or bytes(s.out[1]) != line:
                fail("echo")
                return 0
            s.close_stdin()
            await s.read_to_end()
            if s.exit_code() != 0 or bytes(s.out[1]) != line:
                fail("status %s" % (s.status or {}).get("message", "none")[:80])
                return 0
            return 1
        except Exception as ex:
            fail("finish: %s" % type(ex).__name__)
            return 0
        finally:
            s.close()

    ok = sum(await asyncio.gather(*[finish(i, s) for i, s in live]))
    return dict(ok=ok, opened=len(live), open_s=open_s, peak_fd=peak_fd, peak_rss=peak_rss,
                agent_fds=agent_fds, why=why)


if __name__ == "__main__":
    main()
