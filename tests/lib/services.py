"""Real PostgreSQL and Redis servers for tests, started on loopback in a
temporary directory and removed afterwards.

    with services.PgServer() as pg:      # pg.url  = postgres://osr@127.0.0.1:PORT/osr
        ...                              # pg.stop() / pg.start() to simulate an outage
    with services.RedisServer() as r:    # r.url   = redis://127.0.0.1:PORT
        ...

PostgreSQL refuses to run as root, so as root the cluster is created and run
as the `postgres` system user (installed with the postgresql package).
"""
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _wait_port(port, timeout=20.0, proc=None):
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("server exited with %s" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError("port %d did not open" % port)


def _pg_bin():
    cands = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not cands:
        raise RuntimeError("PostgreSQL server binaries not found: run scripts/install-deps.sh")
    return os.path.dirname(cands[-1])


class PgServer:
    def __init__(self, db="osr", user="osr"):
        self.bin = _pg_bin()
        self.dir = tempfile.mkdtemp(prefix="osr-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.db, self.user = db, user
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run([os.path.join(self.bin, "initdb"), "-D", self.data, "-U", user, "-A", "trust",
                   "--no-sync", "-E", "UTF8", "--locale=C"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("listen_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\n"
                    "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n"
                    % (self.port, self.dir))
        self.proc = None
        self.start()
        self._run([os.path.join(self.bin, "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", user, db])
        self.url = "postgres://%s@127.0.0.1:%d/%s" % (user, self.port, db)

    def _run(self, args):
        if self.as_root:
            args = ["runuser", "-u", "postgres", "--"] + args
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def start(self):
        args = [os.path.join(self.bin, "postgres"), "-D", self.data]
        if self.as_root:
            args = ["runuser", "-u", "postgres", "--"] + args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        _wait_port(self.port, proc=self.proc)
        # Accepting TCP is not yet accepting queries: wait for pg_isready.
        end = time.time() + 20
        while time.time() < end:
            r = subprocess.run([os.path.join(self.bin, "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise TimeoutError("postgres not ready")

    def stop(self, fast=True):
        if self.proc is not None and self.proc.poll() is None:
            import signal
            os.killpg(self.proc.pid, signal.SIGINT if fast else signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def psql(self, sql):
        args = [os.path.join(self.bin, "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user,
                "-d", self.db, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql]
        return subprocess.run(args, check=True, capture_output=True, text=True, timeout=60).stdout

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RedisServer:
    def __init__(self):
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found: run scripts/install-deps.sh")
        self.exe = exe
        self.dir = tempfile.mkdtemp(prefix="osr-redis-")
        self.port = free_port()
        self.url = "redis://127.0.0.1:%d" % self.port
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen([self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir, "--daemonize", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _wait_port(self.port, proc=self.proc)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def cli(self, *args):
        return subprocess.run(["redis-cli", "-p", str(self.port)] + list(args), check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
