#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_token (fuzz/corpus/fuzz_token/).

First byte of each seed (see fuzz_token.c): 0 = a token as received,
1 = a msgpack payload the harness wraps and signs with its key "ka",
2 = base64url text. Tokens of mode 0 are signed with the harness's seed
(bytes 1..32) so they verify; this needs the `cryptography` module (only
to regenerate the corpus, never in a build).

    python3 fuzz/fuzz_token_seeds.py            # rewrites the corpus
"""
import base64
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "fuzz_token")
SEED = bytes(range(1, 33))
NOW = 1700000000


def mp(v):
    """Just enough msgpack: str, int, list, dict (in insertion order)."""
    if isinstance(v, str):
        b = v.encode()
        if len(b) < 32:
            return bytes([0xa0 | len(b)]) + b
        if len(b) < 256:
            return b"\xd9" + bytes([len(b)]) + b
        return b"\xda" + struct.pack(">H", len(b)) + b
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if 0 <= v < 65536:
            return b"\xcd" + struct.pack(">H", v)
        if 0 <= v < 2 ** 32:
            return b"\xce" + struct.pack(">I", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, list):
        return bytes([0x90 | len(v)]) + b"".join(mp(x) for x in v)
    if isinstance(v, dict):
        return bytes([0x80 | len(v)]) + b"".join(mp(k) + mp(x) for k, x in v.items())
    raise TypeError(v)


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=")


def claims(**over):
    c = {"sid": "abcdefghij0123456789", "ten": "acme", "prv": "sim", "ep": "http://127.0.0.1:9000",
         "scp": 7, "prt": [0], "iat": NOW, "exp": NOW + 3600, "kid": "ka",
         "jti": "0123456789abcdef0123456789abcdef"}
    for k, v in over.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    return c


def token(payload):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    signed = b"osr1." + b64(payload)
    sig = Ed25519PrivateKey.from_private_bytes(SEED).sign(signed)
    return signed + b"." + b64(sig)


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.unlink(os.path.join(OUT, f))
    seeds = {}
    good = mp(claims())
    ports = mp(claims(prt=[80, 443, 8080], scp=4))
    noports = mp(claims(prt=None, scp=3))
    t = token(good)
    seeds["tok_good"] = b"\x00" + t
    seeds["tok_ports"] = b"\x00" + token(ports)
    seeds["tok_expired"] = b"\x00" + token(mp(claims(iat=NOW - 7200, exp=NOW - 3600)))
    seeds["tok_unknown_kid"] = b"\x00" + token(mp(claims(kid="kz")))
    seeds["tok_bad_sig"] = b"\x00" + t[:-3] + (b"AAA" if t[-3:] != b"AAA" else b"BBB")
    seeds["tok_truncated"] = b"\x00" + t[: len(t) // 2]
    seeds["tok_shape"] = b"\x00osr1.AAAA.AAAA.AAAA"
    seeds["mp_good"] = b"\x01" + good
    seeds["mp_ports"] = b"\x01" + ports
    seeds["mp_noports"] = b"\x01" + noports
    seeds["mp_long_ep"] = b"\x01" + mp(claims(ep="unix:/run/osr/" + "x" * 230))
    seeds["mp_dup"] = b"\x01" + good[:1] + good[1:] + mp("sid") + mp("abc")
    seeds["mp_unknown"] = b"\x01" + mp(claims(adm=1))
    seeds["mp_missing"] = b"\x01" + mp(claims(jti=None))
    seeds["mp_deep"] = b"\x01" + mp(claims(prt=[[80]]))
    seeds["mp_lying_array"] = b"\x01\xdd\xff\xff\xff\xff"
    seeds["mp_lying_map"] = b"\x01\x81\xa3prt\xdc\xff\xff"
    seeds["b64_good"] = b"\x02" + b64(good)
    seeds["b64_std"] = b"\x02Zm9v+/8="
    seeds["b64_tail"] = b"\x02Zh"
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(seeds), OUT))


if __name__ == "__main__":
    main()
