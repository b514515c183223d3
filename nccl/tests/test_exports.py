#!/usr/bin/env python3
"""Every function nccl.h declares is exported by libanyreduce_nccl.so (found with dlsym), each
pnccl* twin at the address of its nccl* function (an alias, as NCCL's own), and the library
exports nothing else but its own anyrNccl* additions.

The header is read independently of the build's generator (nccl/gen_nccl_api.py): with clang's
AST (every FunctionDecl whose name starts with nccl or pnccl) where clang is installed, else
with a plain scan of the header's text for "name(" after a type, which says so.

Usage: test_exports.py --header nccl.h --library libanyreduce_nccl.so [--include DIR ...]
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

NAME = re.compile(r"^p?nccl\w+$")


def declared_by_clang(header, includes):
    clang = shutil.which("clang")
    if clang is None:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".c", delete=False) as f:
        f.write('#include "%s"\n' % os.path.abspath(header))
        src = f.name
    try:
        cmd = [clang, "-x", "c", "-fsyntax-only", "-Xclang", "-ast-dump=json"]
        for inc in includes:
            cmd += ["-I", inc]
        out = subprocess.run(cmd + [src], check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as e:
        print("clang could not parse the header:", e.stderr[-2000:], file=sys.stderr)
        return None
    finally:
        os.unlink(src)
    ast = json.loads(out)
    return sorted({d["name"] for d in ast.get("inner", [])
                   if d.get("kind") == "FunctionDecl" and NAME.match(d.get("name", ""))})


def declared_by_scan(header):
    with open(header, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("#"))
    return sorted(set(re.findall(r"[\w\*]\s+\**\s*(p?nccl\w+)\s*\(", text)))


def exported(library):
    nm = shutil.which("nm")
    if nm is None:
        return None
    out = subprocess.run([nm, "-D", "--defined-only", library], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtWwiV":
            names.add(parts[2].split("@")[0])
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--header", required=True)
    ap.add_argument("--library", required=True)
    ap.add_argument("--include", action="append", default=[])
    a = ap.parse_args()
    includes = [os.path.dirname(os.path.abspath(a.header))] + \
        [d for inc in a.include for d in inc.split(";") if d]
    names = declared_by_clang(a.header, includes)
    how = "clang's AST"
    if names is None:
        names = declared_by_scan(a.header)
        how = "a text scan (clang is not installed)"
    print(f"{a.header}: {len(names)} functions ({how})")
    failures = []
    if len(names) < 20 or "ncclAllReduce" not in names or "ncclGetVersion" not in names:
        failures.append(f"the header's functions were not found: {names}")
    lib = ctypes.CDLL(a.library, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    address = {}
    for n in names:
        try:
            address[n] = ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
        except AttributeError:
            failures.append(f"{n} is declared in the header and not exported")
    for n in names:
        if n.startswith("pnccl") and n[1:] in address and n in address:
            if address[n] != address[n[1:]]:
                failures.append(f"{n} is not an alias of {n[1:]}")
    exports = exported(a.library)
    if exports is None:
        print("nm is not installed: the check for other exports is skipped")
    else:
        extra = sorted(e for e in exports if e not in names and not e.startswith("anyrNccl")
                       and e not in ("_init", "_fini"))
        if extra:
            failures.append(f"exported beyond nccl.h: {extra}")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(names) - len([f for f in failures if 'not exported' in f])} of {len(names)} "
          "functions exported")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
