"""An asyncio client of the data plane's HTTP/1.1 exec streams (docs/dataplane.md
"Exec streams"): POST .../exec with a chunked request body of input frames, a
chunked response body of output frames. One event loop holds thousands of
streams at once, so test_exec_mux.py and bench/exec_streams.py use it to open
many concurrent sessions from one process."""
import asyncio
import json
import struct
import urllib.parse


class ExecStream:
    """One session. Frames are (channel, payload); channel 3 is the status."""

    def __init__(self, reader, writer):
        self.r = reader
        self.w = writer
        self.out = {1: bytearray(), 2: bytearray()}
        self.status = None
        self.info = None
        self._chunk_left = 0
        self._eof = False
        self.http_status = None

    @classmethod
    async def open(cls, host, port, sid, token, argv, stdin=True, info=False, rcvbuf=None):
        q = [("command", a) for a in argv] + [("stdin", "true" if stdin else "false"),
                                               ("access_token", token)]
        if info:
            q.append(("osrInfo", "true"))
        r, w = await asyncio.open_connection(host, port, limit=1 << 20)
        if rcvbuf is not None:
            import socket
            w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        path = "/v1/sandboxes/%s/exec?%s" % (sid, urllib.parse.urlencode(q))
        w.write(("POST %s HTTP/1.1\r\nHost: dp\r\nTransfer-Encoding: chunked\r\n\r\n" % path).encode())
        await w.drain()
        # The response head is read with the first frame, not here: over
        # HTTP/1.1 it may go out only with the first output (a `cat` that
        # waits for input sends none), and input may be sent before.
        return cls(r, w)

    async def _head(self):
        head = await self.r.readuntil(b"\r\n\r\n")
        self.http_status = int(head.split(b"\r\n", 1)[0].split()[1])
        if self.http_status != 200:
            raise RuntimeError("exec answered %r" % head[:200])
        if b"transfer-encoding: chunked" not in head.lower():
            raise RuntimeError("exec response not chunked: %r" % head[:200])

    async def _read(self, n):
        """n bytes of the response body (across chunks), or b'' at its end."""
        if self.http_status is None:
            await self._head()
        out = bytearray()
        while len(out) < n:
            if self._eof:
                return b""
            if self._chunk_left == 0:
                ln = await self.r.readuntil(b"\r\n")
                size = int(ln.split(b";")[0], 16)
                if size == 0:
                    await self.r.readuntil(b"\r\n")
                    self._eof = True
                    continue
                self._chunk_left = size
            k = min(n - len(out), self._chunk_left)
            out += await self.r.readexactly(k)
            self._chunk_left -= k
            if self._chunk_left == 0:
                await self.r.readexactly(2)
        return bytes(out)

    async def frame(self):
        """The next frame, recorded into out/status/info; None at the end."""
        h = await self._read(5)
        if not h:
            return None
        n, ch = struct.unpack(">IB", h)
        payload = await self._read(n - 1) if n > 1 else b""
        if ch in (1, 2):
            self.out[ch] += payload
        elif ch == 3:
            self.status = json.loads(payload)
        elif ch == 5:
            self.info = json.loads(payload)
        return ch, payload

    async def read_until(self, pred):
        """Read frames until pred(self) holds; False if the stream ended first."""
        while not pred(self):
            if await self.frame() is None:
                return False
        return True

    async def read_to_end(self):
        while await self.frame() is not None:
            pass

    def send_stdin(self, data):
        f = struct.pack(">IB", len(data) + 1, 0) + data
        self.w.write(b"%x\r\n" % len(f) + f + b"\r\n")

    def close_stdin(self):
        """The end of the request body closes stdin."""
        self.w.write(b"0\r\n\r\n")

    def close(self):
        self.w.close()

    def exit_code(self):
        """0 for Success, N for NonZeroExitCode, None for any other status."""
        st = self.status or {}
        if st.get("status") == "Success":
            return 0
        if st.get("reason") == "NonZeroExitCode":
            return int(st["details"]["causes"][0]["message"])
        return None
