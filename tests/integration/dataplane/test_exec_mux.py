"""Exec sessions multiplexed over shared h2c connections to the agent
(docs/dataplane.md "How exec upstreams are multiplexed"): the real
osr-dataplane in front of the real osr-agent, many concurrent HTTP/1.1 exec
streams from one asyncio client (execstreams.py).

ExecMux500: 500 concurrent sessions, each output byte-exact, each exit code
right, stdin round trips on half of them, and the data plane's descriptors
(/proc/PID/fd) grow by about one per session (its client's socket), not the
two or three of one upstream connection per stream and per control call.

ExecMuxIsolation: a session whose client stops reading stalls only its own
stream: others on the same shared connection (the descriptor count shows
there is one) finish byte-exact meanwhile, and the stalled one finishes
byte-exact once read. Killing the agent ends every session on the shared
connection with a Failure status, none hangs, and the next session opens a
fresh connection to the restarted agent.

Bounded in count; no timing assertions (timeouts only guard against hangs)."""
import asyncio
import http.client
import os
import shutil
import signal
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "lib"))
sys.path.insert(0, os.path.dirname(__file__))
import osrtest  # noqa: E402
import test_dataplane as tdp  # noqa: E402
from execstreams import ExecStream  # noqa: E402

SID = tdp.SID
HANG = 240  # seconds: a guard against hangs, not a measurement


class MuxEnv:
    """Keys, one osr-agent on a unix socket (room for many processes),
    osr-dataplane."""

    def __init__(self, dp_extra=(), tcp=False):
        self.tcp = tcp
        self.dir = tempfile.mkdtemp(prefix="osr-dpmux-")
        self.keys = os.path.join(self.dir, "keys")
        os.mkdir(self.keys)
        osrtest.sh([tdp.MINT, "genkey", self.keys, "k1"])
        with open(os.path.join(self.keys, "active"), "w") as f:
            f.write("k1\n")
        self.sock = os.path.join(self.dir, "agent.sock")
        self.agent = None
        self.start_agent()
        self.dp = osrtest.Proc([tdp.DP, "--listen", "127.0.0.1:0", "--keys-dir", self.keys]
                               + list(dp_extra))
        try:
            self.port = int(self.dp.wait_line("listening 127.0.0.1:0 ").split()[-1])
            self.dp.wait_line("ready")
        except Exception:
            self.close()
            raise
        self.tok = tdp.mint(self.keys, "k1", SID, self.ep, "exec")

    def start_agent(self):
        if self.tcp:
            self.agent = osrtest.Proc([tdp.AGENT, "--listen", "127.0.0.1:0", "--workdir", self.dir])
            self.agent_port = int(self.agent.wait_line("listening 127.0.0.1:0 ").split()[-1])
            self.ep = "http://127.0.0.1:%d" % self.agent_port
        else:
            if os.path.exists(self.sock):
                os.unlink(self.sock)
            self.agent = osrtest.Proc([tdp.AGENT, "--listen", "unix:" + self.sock, "--workdir",
                                       self.dir, "--max-processes", "2000"])
            self.ep = "unix:" + self.sock
        self.agent.wait_line("ready")

    def agent_conns(self):
        """Local ports of the data plane's TCP connections to the agent."""
        out = osrtest.sh(["ss", "-Htn", "state", "established", "dst",
                          "127.0.0.1:%d" % self.agent_port]).stdout.decode()
        return sorted(ln.split()[-2] for ln in out.splitlines() if ln.strip())

    def metric(self, name):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        for ln in text.splitlines():
            if ln.startswith(name + " "):
                return int(ln.split()[1])
        raise AssertionError("no %s in /metrics" % name)

    def fds(self):
        return len(os.listdir("/proc/%d/fd" % self.dp.p.pid))

    def open(self, argv, **kw):
        return ExecStream.open("127.0.0.1", self.port, SID, self.tok, argv, **kw)

    def close(self):
        rc = self.dp.stop()
        if self.agent is not None:
            self.agent.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, HANG))


def seq_out(k):
    return "".join("%d\n" % i for i in range(1, k + 1)).encode()


# Prints 1..$1, waits for one line of stdin, echoes it, exits with $2.
SCRIPT = 'seq 1 "$1"; read l; echo "got:$l"; exit "$2"'


class Base(unittest.TestCase):
    dp_extra = ()
    tcp = False

    def setUp(self):
        self.env = MuxEnv(self.dp_extra, self.tcp)

    def tearDown(self):
        rc = self.env.close()
        self.assertEqual(rc, 0, self.env.dp.stderr_text()[-3000:])


class ExecMux500(Base):
    N = 500

    def test_500_concurrent_streams(self):
        e = self.env
        n = self.N
        base = e.fds()

        async def main():
            ks = [1 + (i * 37) % 1500 for i in range(n)]
            codes = [i % 7 for i in range(n)]
            # All sessions open at once; each is live once its seq output is
            # complete (the process then waits for stdin).
            streams = await asyncio.gather(*[
                e.open(["/bin/sh", "-c", SCRIPT, "sh", str(ks[i]), str(codes[i])])
                for i in range(n)])
            want = [seq_out(k) for k in ks]
            ok = await asyncio.gather(*[
                s.read_until(lambda s, w=w: len(s.out[1]) >= len(w)) for s, w in zip(streams, want)])
            self.assertTrue(all(ok), "a stream ended before its output")
            peak = e.fds()
            # Every descriptor beyond the clients' is a shared connection.
            self.assertEqual(e.metric("osr_dataplane_exec_connections"), peak - base - n)
            # Input: a line round trips on every even session; odd ones get
            # only the end of stdin.
            for i, s in enumerate(streams):
                if i % 2 == 0:
                    s.send_stdin(b"ping-%d\n" % i)
                s.close_stdin()
            await asyncio.gather(*[s.read_to_end() for s in streams])
            for i, s in enumerate(streams):
                line = b"got:ping-%d\n" % i if i % 2 == 0 else b"got:\n"
                self.assertEqual(bytes(s.out[1]), want[i] + line, "stream %d" % i)
                self.assertEqual(bytes(s.out[2]), b"", "stream %d" % i)
                self.assertEqual(s.exit_code(), codes[i], (i, s.status))
                s.close()
            return peak

        peak = run(main())
        grown = peak - base
        # One descriptor per session (the client's socket) plus the shared
        # connections: 500 sessions fit in a few (nghttp2 allows 100 streams
        # per connection until the agent's SETTINGS arrive, 1024 after).
        # One upstream connection per session would be 2 per session here.
        self.assertGreaterEqual(grown, n)
        self.assertLessEqual(grown, n + n // 10, (base, peak))
        print("data plane descriptors: %d -> %d for %d sessions" % (base, peak, n))


class ExecMuxIsolation(Base):
    def test_slow_reader_stalls_only_its_stream(self):
        e = self.env
        big = 24 * 1024 * 1024
        small = 4 * 1024 * 1024

        async def main():
            base = e.fds()
            # A: far more output than every buffer on the way holds (the
            # client's socket buffer is small and the client reads nothing).
            a = await e.open(["/bin/sh", "-c", "head -c %d /dev/zero | tr '\\0' a" % big],
                             stdin=False, rcvbuf=16384)
            # B and C on the same shared connection, while A is not read.
            others = await asyncio.gather(*[
                e.open(["/bin/sh", "-c", "head -c %d /dev/zero | tr '\\0' %s" % (small, c)], stdin=False)
                for c in "bc"])
            during = e.fds()
            await asyncio.gather(*[s.read_to_end() for s in others])
            for s, c in zip(others, b"bc"):
                self.assertEqual(bytes(s.out[1]), bytes([c]) * small)
                self.assertEqual(s.exit_code(), 0, s.status)
                s.close()
            # A was never read and is complete once it is.
            await a.read_to_end()
            self.assertEqual(len(a.out[1]), big)
            self.assertEqual(bytes(a.out[1]), b"a" * big)
            self.assertEqual(a.exit_code(), 0, a.status)
            a.close()
            return base, during

        base, during = run(main())
        # Three client sockets and one shared upstream connection.
        self.assertLessEqual(during - base, 4, (base, during))

    def test_bulk_both_ways(self):
        """Stdin and output of several sessions at once, both ways at full
        speed through one shared connection. Both ends used to stop reading
        while their own output was queued, and this deadlocked the
        connection (net/http2_conn.c update_reading: clients keep reading)."""
        e = self.env
        n, size = 8, 8 * 1024 * 1024

        async def one(i):
            s = await e.open(["cat"])
            data = bytes([(i * 37 + k) % 256 for k in range(256)]) * (size // 256)

            async def writer():
                for k in range(0, size, 65536):
                    s.send_stdin(data[k:k + 65536])
                    await s.w.drain()
                s.close_stdin()
                await s.w.drain()

            await asyncio.gather(writer(), s.read_to_end())
            self.assertEqual(bytes(s.out[1]), data, i)
            self.assertEqual(s.exit_code(), 0, s.status)
            s.close()

        async def main():
            await asyncio.gather(*[one(i) for i in range(n)])

        run(main())

    def test_agent_killed_ends_sessions_with_an_error(self):
        e = self.env
        n = 20

        async def main():
            streams = await asyncio.gather(*[
                e.open(["/bin/sh", "-c", 'echo up; read l; echo "got:$l"']) for _ in range(n)])
            ok = await asyncio.gather(*[s.read_until(lambda s: bytes(s.out[1]) == b"up\n")
                                        for s in streams])
            self.assertTrue(all(ok))
            e.agent.stop(signal.SIGKILL)
            await asyncio.gather(*[s.read_to_end() for s in streams])
            for s in streams:
                # The session tries to re-attach on a fresh connection; with
                # the agent gone that connect fails (or, racing the agent's
                # exit, the stream ends early).
                self.assertIsNotNone(s.status, "no status")
                self.assertEqual(s.status.get("status"), "Failure", s.status)
                msg = s.status.get("message", "")
                self.assertTrue("cannot reach the sandbox" in msg or "ended early" in msg, s.status)
                s.close()
            # A fresh connection to the restarted agent serves the next one.
            e.start_agent()
            s = await e.open(["/bin/sh", "-c", "echo again"], stdin=False)
            await s.read_to_end()
            self.assertEqual(bytes(s.out[1]), b"again\n")
            self.assertEqual(s.exit_code(), 0, s.status)
            s.close()

        run(main())


class ExecMuxReattach(Base):
    """The shared connection dies while the agent lives (ss -K on the data
    plane's TCP connection to it): the sessions re-attach on a fresh
    connection with process.Connect from their output offset; the client
    sees one byte-exact output, its input still arrives, and the exit code."""
    tcp = True

    def test_connection_killed_sessions_continue(self):
        e = self.env
        n = 5
        script = 'seq 1 3000; read l; echo "got:$l"; seq 3001 6000; exit 3'

        async def main():
            streams = await asyncio.gather(*[e.open(["/bin/sh", "-c", script], info=True)
                                             for _ in range(n)])
            first = seq_out(3000)
            ok = await asyncio.gather(*[s.read_until(lambda s: len(s.out[1]) >= len(first))
                                        for s in streams])
            self.assertTrue(all(ok))
            before = e.agent_conns()
            self.assertEqual(len(before), 1, before)  # one shared connection
            cp = osrtest.sh(["ss", "-K", "dst", "127.0.0.1", "dport", "=", ":%d" % e.agent_port],
                            check=False)
            if cp.returncode != 0:
                self.skipTest("ss -K (SOCK_DESTROY) not available: %s" % cp.stderr[-200:])
            # Input only once the sessions are on their new connection (a call
            # in flight on the dying one would end its session instead).
            while True:
                now = e.agent_conns()
                if now and not set(now) & set(before):
                    break
                await asyncio.sleep(0.05)
            for i, s in enumerate(streams):
                s.send_stdin(b"x%d\n" % i)
                s.close_stdin()
            await asyncio.gather(*[s.read_to_end() for s in streams])
            for i, s in enumerate(streams):
                want = first + b"got:x%d\n" % i + "".join(
                    "%d\n" % k for k in range(3001, 6001)).encode()
                self.assertEqual(bytes(s.out[1]), want, (i, s.status))
                self.assertEqual(s.exit_code(), 3, s.status)
                self.assertIsNotNone(s.info)  # one info frame, from the start
                s.close()

        run(main())
        self.assertIn("re-attaching at offset", self.env.dp.stderr_text())
        self.assertEqual(self.env.metric("osr_dataplane_exec_reattaches_total"), 5)


class ExecMuxLimits(Base):
    """The caps: sessions per connection, connections per endpoint, and the
    idle close of a connection without sessions."""
    dp_extra = ("--exec-mux-conns", "1", "--exec-mux-sessions", "2", "--exec-mux-idle-ms", "300")

    def test_caps_and_idle_close(self):
        e = self.env

        async def main():
            base = e.fds()
            held = await asyncio.gather(*[e.open(["/bin/sh", "-c", "echo up; read l; true"])
                                          for _ in range(2)])
            ok = await asyncio.gather(*[s.read_until(lambda s: bytes(s.out[1]) == b"up\n") for s in held])
            self.assertTrue(all(ok))
            # Both sessions fill the one connection allowed: the next one is
            # refused with a typed status, nothing is started for it.
            extra = await e.open(["/bin/sh", "-c", "echo never"], stdin=False)
            await extra.read_to_end()
            self.assertEqual(bytes(extra.out[1]), b"")
            self.assertEqual(extra.status.get("reason"), "ServiceUnavailable", extra.status)
            self.assertEqual(extra.status.get("code"), 503, extra.status)
            self.assertIn("too many exec sessions", extra.status.get("message"), extra.status)
            extra.close()
            while e.fds() - base > 3:  # the refused client's socket closing
                await asyncio.sleep(0.05)
            self.assertEqual(e.fds() - base, 3)  # two clients + the shared connection
            for s in held:
                s.close_stdin()
            await asyncio.gather(*[s.read_to_end() for s in held])
            for s in held:
                self.assertEqual(s.exit_code(), 0, s.status)
                s.close()
            # Without sessions the shared connection closes (idle 300 ms,
            # swept every second): the descriptors go back to the baseline.
            while e.fds() != base:
                await asyncio.sleep(0.1)
            # And the next session gets a fresh one.
            s = await e.open(["/bin/sh", "-c", "echo again"], stdin=False)
            await s.read_to_end()
            self.assertEqual(bytes(s.out[1]), b"again\n")
            s.close()

        run(main())


class ExecMuxOff(Base):
    """--exec-mux off keeps the per-session HTTP/1.1 connections."""
    dp_extra = ("--exec-mux", "off")

    def test_off_uses_own_connections(self):
        e = self.env
        n = 20

        async def main():
            base = e.fds()
            streams = await asyncio.gather(*[
                e.open(["/bin/sh", "-c", SCRIPT, "sh", "3", "0"]) for _ in range(n)])
            await asyncio.gather(*[s.read_until(lambda s: len(s.out[1]) >= 6) for s in streams])
            peak = e.fds()
            for s in streams:
                s.send_stdin(b"x\n")
                s.close_stdin()
            await asyncio.gather(*[s.read_to_end() for s in streams])
            for s in streams:
                self.assertEqual(bytes(s.out[1]), b"1\n2\n3\ngot:x\n")
                self.assertEqual(s.exit_code(), 0)
                s.close()
            return peak - base

        grown = run(main())
        self.assertGreaterEqual(grown, 2 * n)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[1:], verbosity=2)
