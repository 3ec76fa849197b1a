"""Shared harness for OSR integration tests (stdlib only).

Each test file is a unittest module; tests/integration/<proto>/meson.build
registers one meson test per TestCase class:
    python3 test_x.py ClassName
run() below executes exactly that class and exits non-zero on any failure.

Processes started here are real: osr-testd (our server with test routes),
osr-testc (our client CLI), curl, nghttp, h2load, openssl, node. Everything
listens on 127.0.0.1/::1 with port 0 and reports the bound port on stdout.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

TESTD = os.environ.get("OSR_TESTD", "")
TESTC = os.environ.get("OSR_TESTC", "")
SOURCE_ROOT = os.environ.get("OSR_SOURCE_ROOT", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD_ROOT = os.environ.get("OSR_BUILD_ROOT", "")
TLS_BACKEND = os.environ.get("OSR_TLS_BACKEND", "boringssl")


def run(argv=None):
    """Run the TestCase classes named on the command line (all if none)."""
    argv = sys.argv if argv is None else argv
    main = sys.modules["__main__"]
    loader = unittest.TestLoader()
    if len(argv) > 1:
        suite = unittest.TestSuite(loader.loadTestsFromName(n, main) for n in argv[1:])
    else:
        suite = loader.loadTestsFromModule(main)
    res = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    sys.exit(0 if res.wasSuccessful() and res.testsRun > 0 else 1)


def rss_kib(pid):
    """Resident set size of a process, KiB (0 if /proc does not say)."""
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    return 0


def fd_count(pid):
    """Open descriptors of a process."""
    return len(os.listdir("/proc/%d/fd" % pid))


class Proc:
    """A child process whose stdout is read line by line in a thread."""

    def __init__(self, args, env=None, cwd=None, stdin=subprocess.DEVNULL):
        self.args = [str(a) for a in args]
        e = dict(os.environ)
        if env:
            e.update(env)
        self.p = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=stdin, env=e, cwd=cwd, start_new_session=True)
        self.lines = []
        self.err = []
        self.cv = threading.Condition()
        self._t = threading.Thread(target=self._pump, args=(self.p.stdout, self.lines), daemon=True)
        self._t2 = threading.Thread(target=self._pump, args=(self.p.stderr, self.err), daemon=True)
        self._t.start()
        self._t2.start()

    def _pump(self, f, sink):
        for raw in iter(f.readline, b""):
            with self.cv:
                sink.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def wait_line(self, prefix, timeout=10.0):
        """Wait for a stdout line starting with prefix; return it."""
        end = time.time() + timeout
        with self.cv:
            while True:
                for ln in self.lines:
                    if ln.startswith(prefix):
                        return ln
                if self.p.poll() is not None and not self._t.is_alive():
                    raise RuntimeError("%s exited (%s) before %r; stderr:\n%s" % (
                        self.args[0], self.p.returncode, prefix, "\n".join(self.err[-30:])))
                left = end - time.time()
                if left <= 0:
                    raise TimeoutError("no %r from %s; stderr:\n%s" % (prefix, self.args[0], "\n".join(self.err[-30:])))
                self.cv.wait(min(left, 0.2))

    def stderr_text(self):
        with self.cv:
            return "\n".join(self.err)

    def alive(self):
        return self.p.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        """Stop the process (and its group); return its exit code."""
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self._t.join(2)
        self._t2.join(2)
        return self.p.returncode

    def rss_kib(self):
        return rss_kib(self.p.pid)


class Testd:
    """osr-testd: our HTTP/1.1 + HTTP/2 + WebSocket + TLS server with test
    routes (see tests/peers/osr-testd.c). It prints 'listening <name> <port>'
    for each listener and 'ready' when all are up."""

    def __init__(self, *extra, tls=None, name="http", addr="127.0.0.1:0", env=None):
        args = [TESTD, "--listen", addr]
        if tls is not None:
            args += ["--tls-cert", tls.cert, "--tls-key", tls.key]
        args += list(extra)
        self.proc = Proc(args, env=env)
        self.proc.wait_line("ready", timeout=15)
        ln = self.proc.wait_line("listening ")
        self.port = int(ln.split()[-1])
        self.host = "127.0.0.1" if addr.startswith("127.") else addr.rsplit(":", 1)[0]

    def url(self, path="/", scheme="http"):
        return "%s://127.0.0.1:%d%s" % (scheme, self.port, path)

    def stop(self, sig=signal.SIGTERM):
        return self.proc.stop(sig)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        rc = self.stop()
        # Sanitizer reports make the server exit non-zero: surface them.
        if exc[0] is None and rc not in (0, -signal.SIGTERM):
            raise AssertionError("osr-testd exited with %s:\n%s" % (rc, self.proc.stderr_text()[-4000:]))


class Certs:
    """A throwaway CA and a server certificate for 'localhost'/127.0.0.1/::1,
    made with the openssl CLI in a temporary directory."""

    def __init__(self, names=("localhost",), ips=("127.0.0.1", "::1")):
        self.dir = tempfile.mkdtemp(prefix="osr-certs-")
        d = self.dir
        self.ca = os.path.join(d, "ca.pem")
        self.ca_key = os.path.join(d, "ca.key")
        self.cert = os.path.join(d, "server.pem")
        self.key = os.path.join(d, "server.key")
        sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", self.ca_key, "-out", self.ca, "-days", "2", "-subj", "/CN=OSR Test CA"])
        san = ",".join(["DNS:%s" % n for n in names] + ["IP:%s" % i for i in ips])
        ext = os.path.join(d, "ext.cnf")
        with open(ext, "w") as f:
            f.write("subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
                    "extendedKeyUsage=serverAuth\n" % san)
        csr = os.path.join(d, "server.csr")
        sh(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", self.key, "-out", csr, "-subj", "/CN=%s" % names[0]])
        sh(["openssl", "x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key,
            "-CAcreateserial", "-out", self.cert, "-days", "2", "-extfile", ext])

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def sh(args, timeout=60, check=True, input=None, env=None):
    """Run a command, return CompletedProcess with bytes stdout/stderr."""
    e = dict(os.environ)
    if env:
        e.update(env)
    cp = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        timeout=timeout, input=input, env=e)
    if check and cp.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (" ".join(map(str, args)), cp.returncode,
                                                         cp.stdout[-2000:].decode("utf-8", "replace"),
                                                         cp.stderr[-4000:].decode("utf-8", "replace")))
    return cp


def have(cmd):
    return shutil.which(cmd) is not None


def raw_exchange(port, data, host="127.0.0.1", timeout=5.0, read_until_close=True, chunks=None,
                 delay=0.0):
    """Send raw bytes (or a list of chunks with `delay` seconds between
    them) and return everything the server sent until it closed or the
    timeout passed."""
    s = socket.create_connection((host, port), timeout=timeout)
    out = b""
    try:
        for c in (chunks if chunks is not None else [data]):
            s.sendall(c)
            if delay:
                time.sleep(delay)
        end = time.time() + timeout
        while time.time() < end:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not b:
                break
            out += b
            if not read_until_close and b"\r\n\r\n" in out:
                break
    finally:
        s.close()
    return out


def node_modules():
    """Directory with the npm test peers (ws), installed by scripts/test.sh."""
    return os.path.join(SOURCE_ROOT, "tests", "node_modules")


def pattern(n, seed=0):
    """Deterministic n-byte payload, the same as osr-testd's /bytes route:
    a 251-byte block (prime length, so it never aligns with buffer sizes)
    with byte i = (i*31 + seed*7 + 11) mod 256, repeated."""
    blk = bytes(((i * 31 + seed * 7 + 11) & 0xFF) for i in range(251))
    return (blk * (n // 251 + 1))[:n]
