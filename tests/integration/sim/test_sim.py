"""osr-sim, the SIMULATED provider process, driven over HTTP (urllib and curl):
create/list/get/delete, label filters, failure injection statistics for a
seeded PRNG, capacity, boot failures, --state-file across restarts (clean
stop and kill -9), flags; and the sim adapter's url mode against a real
osr-sim (the adapter contract test run with OSR_TEST_SIM_URL)."""
import json
import os
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import osrtest

BUILD = os.environ.get("OSR_BUILD_ROOT", "")
SIM = os.environ.get("OSR_SIM") or os.path.join(BUILD, "src", "osr-sim")
CONTRACT = os.path.join(BUILD, "tests", "unit", "adapters", "unit_adapters_test_sim")


class Sim:
    def __init__(self, *args):
        self.args = [SIM, "--listen", "127.0.0.1:0"] + [str(a) for a in args]
        self.proc = osrtest.Proc(self.args)
        self.port = int(self.proc.wait_line("listening ", timeout=20).split()[-1])
        self.proc.wait_line("ready", timeout=20)
        self.url = "http://127.0.0.1:%d" % self.port

    def call(self, method, path, body=None, raw=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        r = urllib.request.Request(self.url + path, data=data, method=method,
                                   headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(r, timeout=30) as resp:
                b = resp.read().decode()
                return resp.status, (json.loads(b) if b else None)
        except urllib.error.HTTPError as e:
            b = e.read().decode()
            return e.code, (json.loads(b) if b else None)

    def create(self, sid, tenant="acme", **kw):
        body = {"sandbox_id": sid, "tenant": tenant, "isolation": "gvisor"}
        body.update(kw)
        return self.call("POST", "/v1/resources", body)

    def resources(self, q=""):
        st, j = self.call("GET", "/v1/resources" + q)
        assert st == 200, (st, j)
        return j["resources"]

    def stop(self, sig=signal.SIGTERM):
        return self.proc.stop(sig)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        rc = self.stop()
        if exc[0] is None and rc not in (0, -signal.SIGTERM, -signal.SIGKILL):
            raise AssertionError("osr-sim exited with %s:\n%s" % (rc, self.proc.stderr_text()[-3000:]))


class Api(unittest.TestCase):
    def test_lifecycle(self):
        with Sim("--latency-ms", "5") as s:
            st, r = s.create("sbxaaaa", caps={"vcpus": 2, "memoryMiB": 1024, "ports": [8080]},
                             region="eu")
            self.assertEqual(st, 201, r)
            self.assertEqual(r["sandbox_id"], "sbxaaaa")
            self.assertEqual(r["tenant"], "acme")
            self.assertEqual(r["labels"], {"osr.dev/sandbox-id": "sbxaaaa", "osr.dev/tenant": "acme"})
            self.assertEqual(r["state"], "running")
            self.assertEqual(r["isolation"], "gvisor")
            self.assertEqual(r["region"], "eu")
            self.assertEqual(r["agent_endpoint"], "sim://" + r["id"])
            self.assertEqual(r["granted"]["vcpus"], 2)
            self.assertEqual(r["granted"]["ports"], [8080])
            st, r2 = s.create("sbxbbbb", tenant="other")
            self.assertEqual(st, 201)
            self.assertNotEqual(r["id"], r2["id"])

            self.assertEqual(sorted(x["sandbox_id"] for x in s.resources()), ["sbxaaaa", "sbxbbbb"])
            # Label filters: presence, and key=value (percent-encoded too).
            self.assertEqual(len(s.resources("?label=osr.dev/sandbox-id")), 2)
            self.assertEqual([x["id"] for x in s.resources("?label=osr.dev/sandbox-id=sbxbbbb")], [r2["id"]])
            self.assertEqual([x["id"] for x in s.resources("?label=osr.dev%2Ftenant%3Dacme")], [r["id"]])
            self.assertEqual(s.resources("?label=nope"), [])

            st, g = s.call("GET", "/v1/resources/" + r["id"])
            self.assertEqual((st, g["sandbox_id"]), (200, "sbxaaaa"))
            st, _ = s.call("DELETE", "/v1/resources/" + r["id"])
            self.assertEqual(st, 204)
            st, e = s.call("GET", "/v1/resources/" + r["id"])
            self.assertEqual((st, e["error"]), (404, "not_found"))
            st, e = s.call("DELETE", "/v1/resources/" + r["id"])
            self.assertEqual((st, e["error"]), (404, "not_found"))
            self.assertEqual([x["id"] for x in s.resources()], [r2["id"]])
            st, h = s.call("GET", "/healthz")
            self.assertEqual((st, h["resources"]), (200, 1))

    def test_pages(self):
        with Sim("--latency-ms", "0") as s:
            made = [s.create("sbxpage%d" % i)[1]["id"] for i in range(5)]
            st, pg = s.call("GET", "/v1/resources?label=osr.dev/sandbox-id&limit=2")
            self.assertEqual((st, [x["id"] for x in pg["resources"]], pg["next"]), (200, made[:2], made[1]))
            # A resource of an earlier page goes away: the next page is unchanged.
            self.assertEqual(s.call("DELETE", "/v1/resources/" + made[0])[0], 204)
            st, pg = s.call("GET", "/v1/resources?limit=2&after=" + made[1])
            self.assertEqual((st, [x["id"] for x in pg["resources"]], pg["next"]), (200, made[2:4], made[3]))
            st, pg = s.call("GET", "/v1/resources?limit=2&after=" + made[3])
            self.assertEqual((st, [x["id"] for x in pg["resources"]], pg["next"]), (200, made[4:], None))
            st, pg = s.call("GET", "/v1/resources?limit=10000")
            self.assertEqual((st, len(pg["resources"]), pg["next"]), (200, 4, None))
            for q in ("limit=0", "limit=10001", "limit=x", "limit=", "limit=2&after=nope", "limit=1&after=sim-"):
                st, e = s.call("GET", "/v1/resources?" + q)
                self.assertEqual((st, e["error"]), (400, "invalid"), q)

    def test_bad_requests(self):
        with Sim("--latency-ms", "0") as s:
            for raw in (b"{", b"[]", b'{"tenant":"x"}', b'{"sandbox_id":""}', b'{"sandbox_id":5}',
                        b'{"sandbox_id":"x","caps":{"ports":[70000]}}'):
                st, e = s.call("POST", "/v1/resources", raw=raw)
                self.assertEqual((st, e["error"]), (400, "invalid"), raw)
            st, e = s.call("POST", "/v1/resources", raw=b"x" * (2 << 20))
            self.assertEqual(st, 413)
            st, _ = s.call("PUT", "/v1/resources")
            self.assertEqual(st, 405)
            st, _ = s.call("GET", "/v1/nothing")
            self.assertEqual(st, 404)
            self.assertEqual(s.resources(), [])

    def test_http2_and_curl(self):
        with Sim("--latency-ms", "1") as s:
            cp = osrtest.sh(["curl", "-sS", "--http2-prior-knowledge", "-XPOST", "-d",
                             '{"sandbox_id":"h2sbx","tenant":"t"}', "-w", "\n%{http_code} %{http_version}",
                             s.url + "/v1/resources"])
            body, _, tail = cp.stdout.decode().rpartition("\n")
            self.assertEqual(tail, "201 2")
            self.assertEqual(json.loads(body)["sandbox_id"], "h2sbx")

    def test_latency_is_applied(self):
        with Sim("--latency-ms", "300") as s:
            t0 = time.monotonic()
            st, _ = s.create("slowsbx")
            self.assertEqual(st, 201)
            # A lower bound only (no timed upper bound: the machine may be slow).
            self.assertGreaterEqual(time.monotonic() - t0, 0.29)


class Failures(unittest.TestCase):
    def fraction(self, *args, n=300):
        fails, errs = 0, set()
        with Sim("--latency-ms", "0", *args) as s:
            for i in range(n):
                st, r = s.create("f%d" % i)
                if st != 201:
                    fails += 1
                    errs.add((st, r["error"]))
            left = len(s.resources())
        return fails, errs, left

    def test_failure_rate_seeded(self):
        f1, errs, left = self.fraction("--failure-rate", "0.3", "--seed", "5")
        # Binomial(300, 0.3): sd ~7.9; 60..120 is > 3.8 sd either side, and
        # the seed makes the outcome reproducible.
        self.assertTrue(60 <= f1 <= 120, f1)
        self.assertEqual(errs, {(503, "unavailable")})
        self.assertEqual(left, 300 - f1)
        f2, _, _ = self.fraction("--failure-rate", "0.3", "--seed", "5")
        self.assertEqual(f1, f2)
        f0, _, _ = self.fraction("--failure-rate", "0", n=50)
        self.assertEqual(f0, 0)

    def test_error_kinds(self):
        for name, status in (("capacity", 507), ("rate_limited", 429), ("timeout", 504),
                             ("unavailable", 503), ("auth", 401), ("invalid", 400)):
            fails, errs, left = self.fraction("--failure-rate", "1", "--error", name, n=3)
            self.assertEqual((fails, errs, left), (3, {(status, name)}, 0), name)

    def test_capacity(self):
        with Sim("--latency-ms", "0", "--capacity", "3") as s:
            ids = [s.create("c%d" % i)[1]["id"] for i in range(3)]
            st, e = s.create("c3")
            self.assertEqual((st, e["error"]), (507, "capacity"))
            self.assertEqual(s.call("DELETE", "/v1/resources/" + ids[0])[0], 204)
            self.assertEqual(s.create("c3")[0], 201)

    def test_boot_failure(self):
        with Sim("--latency-ms", "400", "--boot-failure-rate", "1") as s:
            out = {}

            def create():
                out["r"] = s.create("bootsbx")

            import threading
            t = threading.Thread(target=create)
            t.start()
            # While it boots, the labelled resource exists ("starting")...
            seen = []
            end = time.time() + 10
            while not seen and time.time() < end:
                seen = s.resources()
                time.sleep(0.02)
            t.join(30)
            self.assertEqual([x["state"] for x in seen], ["starting"])
            self.assertEqual(out["r"][0], 503)
            self.assertEqual(out["r"][1]["error"], "boot_failed")
            # ... and is gone after the boot failed.
            self.assertEqual(s.resources(), [])


class StateFile(unittest.TestCase):
    def test_survives_restart(self):
        d = tempfile.mkdtemp(prefix="osr-sim-state-")
        path = os.path.join(d, "state.json")
        with Sim("--latency-ms", "0", "--state-file", path) as s:
            ids = [s.create("st%d" % i, tenant="t%d" % i)[1]["id"] for i in range(3)]
            s.call("DELETE", "/v1/resources/" + ids[1])
        # Clean stop: written at exit.
        with Sim("--latency-ms", "0", "--state-file", path) as s:
            got = s.resources()
            self.assertEqual([x["id"] for x in got], [ids[0], ids[2]])
            self.assertEqual([x["tenant"] for x in got], ["t0", "t2"])
            # New ids never collide with restored ones.
            st, r = s.create("st3")
            self.assertNotIn(r["id"], ids)
            new_id = r["id"]
            # kill -9: the asynchronous write after each change has it.
            end = time.time() + 10
            while time.time() < end:
                with open(path) as f:
                    try:
                        if new_id in [x["id"] for x in json.load(f)]:
                            break
                    except ValueError:
                        pass
                time.sleep(0.05)
            s.stop(signal.SIGKILL)
        with Sim("--state-file", path) as s:
            self.assertEqual([x["id"] for x in s.resources()], [ids[0], ids[2], new_id])
        with open(path, "w") as f:
            f.write("{not json")
        cp = subprocess.run([SIM, "--listen", "127.0.0.1:0", "--state-file", path],
                            capture_output=True, timeout=20)
        self.assertNotEqual(cp.returncode, 0)
        self.assertIn(b"state file", cp.stderr)
        subprocess.run(["rm", "-rf", d])


class Flags(unittest.TestCase):
    def test_help_and_errors(self):
        cp = subprocess.run([SIM, "--help"], capture_output=True, timeout=20)
        self.assertEqual(cp.returncode, 0)
        for flag in ("--listen", "--latency-ms", "--jitter-ms", "--failure-rate", "--boot-failure-rate",
                     "--capacity", "--error", "--seed", "--state-file", "--log-level"):
            self.assertIn(flag.encode(), cp.stdout)
        self.assertIn(b"SIMULATED", cp.stdout)
        for args, msg in ((["--bogus", "1"], b"unknown option --bogus"),
                          (["--failure-rate"], b"needs a value"),
                          (["--failure-rate", "2"], b"failure_rate"),
                          (["--latency-ms", "soon"], b"--latency-ms"),
                          (["--error", "oops"], b"error"),
                          (["--log-level", "loud"], b"--log-level")):
            cp = subprocess.run([SIM] + args, capture_output=True, timeout=20)
            self.assertEqual(cp.returncode, 2, args)
            self.assertIn(msg, cp.stderr, args)


class UrlMode(unittest.TestCase):
    """The adapter contract test in url mode, against a real osr-sim."""

    def test_contract_against_osr_sim(self):
        # A short server idle timeout makes osr-sim close the adapter's
        # keep-alive connection between operations: the contract test's
        # reconnect case then really reconnects.
        with Sim("--latency-ms", "20", "--idle-timeout-ms", "150") as s:
            cp = subprocess.run([CONTRACT], env=dict(os.environ, OSR_TEST_SIM_URL=s.url),
                                capture_output=True, timeout=120)
            out = cp.stdout.decode() + cp.stderr.decode()
            self.assertEqual(cp.returncode, 0, out)
            self.assertIn("contract, url mode: " + s.url, out)
            self.assertIn("PASSED", out)
            # The contract test cleans up after itself (cancelled creates
            # never reached the server or were finished and listed).
            left = [x for x in s.resources() if not x["sandbox_id"].startswith("sbx-cancel")]
            self.assertEqual(left, [])

    def test_contract_answers_off_the_loop(self):
        # offload_bytes 0: every answer of osr-sim, not only large list
        # pages, is parsed on the thread pool (rest.h on_work), so the whole
        # contract (pages, close with calls in flight, concurrency,
        # reconnects) runs through that path.
        with Sim("--latency-ms", "20", "--idle-timeout-ms", "150") as s:
            env = dict(os.environ, OSR_TEST_SIM_URL=s.url, OSR_TEST_SIM_OFFLOAD="0")
            cp = subprocess.run([CONTRACT], env=env, capture_output=True, timeout=120)
            out = cp.stdout.decode() + cp.stderr.decode()
            self.assertEqual(cp.returncode, 0, out)
            self.assertIn("contract, url mode: " + s.url + ", offload_bytes 0", out)
            self.assertIn("PASSED", out)
            left = [x for x in s.resources() if not x["sandbox_id"].startswith("sbx-cancel")]
            self.assertEqual(left, [])


if __name__ == "__main__":
    osrtest.run()
