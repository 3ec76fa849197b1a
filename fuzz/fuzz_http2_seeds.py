#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_http2 (fuzz/corpus/fuzz_http2/): client
sides of real HTTP/2 sessions built frame by frame, plus malformed ones.

First byte of each seed (see fuzz_http2.c): odd = the harness prepends the
connection preface; bits 1..5 pick the feed piece size. Seeds that carry
their own preface use an even first byte.

    python3 fuzz/fuzz_http2_seeds.py            # rewrites the corpus
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "fuzz_http2")
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST, SETTINGS, PUSH, PING, GOAWAY, WU, CONT = range(10)


def frame(t, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", t, flags, sid) + payload


def settings(*pairs, ack=False):
    return frame(SETTINGS, 1 if ack else 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def hint(v, prefix, first=0):
    lim = (1 << prefix) - 1
    if v < lim:
        return bytes([first | v])
    out = [first | lim]
    v -= lim
    while v >= 128:
        out.append((v & 127) | 128)
        v >>= 7
    out.append(v)
    return bytes(out)


def lit(n, v, index=False):
    # literal with incremental indexing (0x40) or without (0x00), new name
    return (b"\x40" if index else b"\x00") + hint(len(n), 7) + n + hint(len(v), 7) + v


def block(path, method=b"GET", extra=(), index=False):
    f = [(b":method", method), (b":scheme", b"http"), (b":path", path), (b":authority", b"fuzz")]
    return b"".join(lit(n, v, index) for n, v in f + list(extra))


def get(sid, path, end=True, extra=(), index=False):
    return frame(HEADERS, 4 | (1 if end else 0), sid, block(path, extra=extra, index=index))


def post(sid, path, body, pieces=1):
    out = frame(HEADERS, 4, sid, block(path, b"POST", [(b"content-length", str(len(body)).encode())]))
    step = max(1, len(body) // pieces)
    chunks = [body[i:i + step] for i in range(0, len(body), step)] or [b""]
    for i, ch in enumerate(chunks):
        out += frame(DATA, 1 if i == len(chunks) - 1 else 0, sid, ch)
    return out


SETUP = settings((3, 100), (4, 65535))
ACK = settings(ack=True)

seeds = {
    # even first byte: the seed carries the preface itself
    "get": b"\x00" + PREFACE + SETUP + ACK + get(1, b"/hello"),
    "get_indexed": b"\x02" + PREFACE + SETUP + get(1, b"/a?b=c", index=True) + get(3, b"/a?b=d", index=True)
                   + frame(HEADERS, 5, 5, b"\xbe\xbf\x82\x84"),
    "post_body": b"\x01" + SETUP + post(1, b"/upload", b"x" * 60000, pieces=7),
    "post_two_windows": b"\x31" + SETUP + post(1, b"/upload", b"w" * 60000, pieces=4)
                        + post(3, b"/upload", b"v" * 30000, pieces=3),
    "post_chunked": b"\x03" + SETUP + frame(HEADERS, 4, 1, block(b"/p", b"POST"))
                    + b"".join(frame(DATA, 0, 1, b"y" * 100) for _ in range(30)) + frame(DATA, 1, 1, b""),
    "many_streams": b"\x05" + SETUP + b"".join(get(s, b"/s%d" % s) for s in range(1, 80, 2)),
    "stream_and_big": b"\x07" + SETUP + get(1, b"/stream") + get(3, b"/big")
                      + frame(WU, 0, 0, struct.pack(">I", 1 << 20)) + frame(WU, 0, 3, struct.pack(">I", 1 << 20)),
    "abort_and_reset": b"\x09" + SETUP + get(1, b"/abort") + get(3, b"/big")
                       + frame(RST, 0, 3, struct.pack(">I", 8)) + get(5, b"/hello"),
    "rapid_reset": b"\x0b" + SETUP + b"".join(get(s, b"/big") + frame(RST, 0, s, struct.pack(">I", 8))
                                            for s in range(1, 200, 2)),
    "ping_settings": b"\x0d" + SETUP + b"".join(frame(PING, 0, 0, b"%08d" % i) + settings((1, 4096 + i))
                                        for i in range(50)),
    "continuation": b"\x0f" + SETUP + frame(HEADERS, 1, 1, block(b"/c")[:20]) + frame(CONT, 0, 1, block(b"/c")[20:30])
                    + frame(CONT, 4, 1, block(b"/c")[30:]),
    "continuation_flood": b"\x11" + SETUP + frame(HEADERS, 0, 1, block(b"/c"))
                          + b"".join(frame(CONT, 0, 1, lit(b"x", b"y")) for _ in range(20)),
    "too_many_headers": b"\x13" + SETUP + get(1, b"/h", extra=[(b"x-%d" % i, b"v") for i in range(40)]),
    "long_path": b"\x15" + SETUP + get(1, b"/" + b"p" * 600) + get(3, b"/ok"),
    "missing_path": b"\x17" + SETUP + frame(HEADERS, 5, 1, lit(b":method", b"GET") + lit(b":scheme", b"http")),
    "connect": b"\x19" + SETUP + frame(HEADERS, 5, 1, lit(b":method", b"CONNECT") + lit(b":authority", b"h:1")),
    "bad_content_length": b"\x1b" + SETUP + frame(HEADERS, 4, 1, block(b"/p", b"POST", [(b"content-length", b"5")]))
                          + frame(DATA, 1, 1, b"0123456789"),
    "body_over_max": b"\x1d" + SETUP + post(1, b"/p", b"z" * 120000, pieces=10),
    "body_over_max_streamed": b"\x2d" + SETUP + frame(HEADERS, 4, 1, block(b"/p", b"POST"))
                              + b"".join(frame(DATA, 0, 1, b"q" * 16000) for _ in range(4))
                              + frame(WU, 0, 0, struct.pack(">I", 1 << 16))
                              + b"".join(frame(DATA, 0, 1, b"q" * 16000) for _ in range(4)),
    "padded_priority": b"\x1f" + SETUP + frame(HEADERS, 0x2d, 1, b"\x03" + b"\x00\x00\x00\x00\x10"
                                                + block(b"/pp") + b"\x00\x00\x00")
                       + frame(PRIORITY, 0, 3, b"\x00\x00\x00\x01\x10"),
    "padded_data": b"\x21" + SETUP + frame(HEADERS, 4, 1, block(b"/p", b"POST"))
                   + frame(DATA, 0x9, 1, b"\x05hello\x00\x00\x00\x00\x00"),
    "goaway_midway": b"\x23" + SETUP + get(1, b"/stream") + frame(GOAWAY, 0, 0, struct.pack(">II", 1, 0)),
    "window_overflow": b"\x25" + SETUP + frame(WU, 0, 0, struct.pack(">I", 0x7fffffff)),
    "data_stream0": b"\x27" + SETUP + frame(DATA, 0, 0, b"xx"),
    "bad_preface": b"\x00" + b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + SETUP,
    "http1": b"\x00GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "trailers": b"\x29" + SETUP + frame(HEADERS, 4, 1, block(b"/p", b"POST")) + frame(DATA, 0, 1, b"abc")
                + frame(HEADERS, 5, 1, lit(b"x-trailer", b"t")),
    "small_window": b"\x2b" + settings((4, 10)) + get(1, b"/big") + frame(WU, 0, 1, struct.pack(">I", 100))
                    + settings((4, 100000)),
}

os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print("wrote %d seeds to %s" % (len(seeds), OUT))
