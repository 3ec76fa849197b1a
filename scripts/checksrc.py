#!/usr/bin/env python3
"""checksrc: house rules the compiler does not enforce (STYLE.md, Enforcement).

Bans in src/ and adapters/: sprintf, vsprintf, strcpy, strcat, gets, atoi,
atol, atof, and raw malloc/calloc/realloc/free/strdup outside src/util/mem.c
(all allocation goes through osr_mem). Library code free()s memory that
jansson returns (json_dumps) only through the hooks installed by
osr_mem_install_deps, so it must use `free` via a marked line:
    free(s); /* checksrc: jansson */
Exit 1 and print file:line for each violation.
"""
import os
import re
import sys

root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
banned = re.compile(r"(?<![\w.>])(sprintf|vsprintf|strcpy|strcat|gets|atoi|atol|atof)\s*\(")
raw_alloc = re.compile(r"(?<![\w.>])(malloc|calloc|realloc|free|strdup|strndup)\s*\(")
comment = re.compile(r"/\*.*?\*/|//.*$")
bad = 0
for top in ("src", "adapters"):
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        for fn in files:
            if not fn.endswith((".c", ".h")):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            # Blank out comments (keeping line breaks) and string literals.
            text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n") if "checksrc:" not in m.group(0)
                          else m.group(0), text, flags=re.S)
            text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
            for no, line in enumerate(text.split("\n"), 1):
                if "checksrc:" in line:
                    continue
                code = comment.sub("", line)
                m = banned.search(code)
                if m:
                    print("%s:%d: banned function %s()" % (rel, no, m.group(1)))
                    bad += 1
                if rel != os.path.join("src", "util", "mem.c"):
                    m = raw_alloc.search(code)
                    if m:
                        print("%s:%d: raw %s(): use osr_mem (src/util/mem.h)" % (rel, no, m.group(1)))
                        bad += 1
print("checksrc: %d violation(s)" % bad)
sys.exit(1 if bad else 0)
