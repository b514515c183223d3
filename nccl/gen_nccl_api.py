#!/usr/bin/env python3
"""Writes the list of the functions an nccl.h declares, as X-macro lines, for the build.

Usage: gen_nccl_api.py --header PATH/nccl.h --out FILE [--hooked NAME,...] [--omit NAME,...]

The output is included by files that define the macros first:
  ANYRN_FN_PLAIN(ret, name, params, args)   a function the includer defines generically
  ANYRN_FN_HOOKED(ret, name, params, args)  a function the includer defines by hand (--hooked)
  ANYRN_FN_ALIAS(ret, twin, name, params)   twin is the profiling twin (pnccl*) of name
(an undefined macro expands to nothing). params is the parenthesized parameter list with
every parameter named, args the parenthesized argument list that forwards them. It also
defines ANYRN_HAS_<name> for every function, so that a hand-written definition can be left out
where an older header lacks the function, and ANYRN_HEADER_VERSION ("2.28.9"). --omit leaves
functions out with their pnccl twins (the tests' double: a function an older library lacks).

The header is read as text: comments, preprocessor lines (with their continuations) and
__attribute__((...)) are dropped, then every top-level declaration "RET NAME(PARAMS);" whose
name starts with nccl or pnccl is taken. A declaration this reader cannot take apart stops the
build (exit status 1) rather than leaving the function out.
"""
import argparse
import os
import re
import sys

DECL = re.compile(r"([A-Za-z_][\w\s\*]*?)\b((?:p)?nccl\w*)\s*\(([^()]*)\)\s*;")
TYPE_WORDS = {
    "void", "char", "short", "int", "long", "float", "double", "signed", "unsigned", "const",
    "volatile", "size_t", "struct", "enum",
}


def strip_attributes(text):
    out, i = [], 0
    while True:
        j = text.find("__attribute__", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k = text.find("(", j)
        depth = 0
        while k < len(text):
            if text[k] == "(":
                depth += 1
            elif text[k] == ")":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1


def clean(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"\\\n", " ", text)
    text = "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("#"))
    text = re.sub(r'extern\s+"C"\s*\{', " ", text)
    return strip_attributes(text)


def split_params(raw, name):
    raw = " ".join(raw.split())
    if raw in ("", "void"):
        return [], []
    params, args = [], []
    for i, p in enumerate(x.strip() for x in raw.split(",")):
        if not p:
            raise ValueError(f"{name}: empty parameter in ({raw})")
        m = re.match(r"^(.*?)([A-Za-z_]\w*)\s*(\[\s*\])?$", p)
        unnamed = (m is None or p.endswith("*") or m.group(2) in TYPE_WORDS
                   or not m.group(1).strip())
        if unnamed:
            arg = f"a{i}"
            params.append(f"{p} {arg}")
        else:
            arg = m.group(2)
            params.append(p)
        args.append(arg)
    return params, args


def parse(header_text):
    text = clean(header_text)
    found = {}
    for m in DECL.finditer(text):
        ret = " ".join(m.group(1).split())
        # The return type is what follows the previous declaration, block or typedef.
        ret = re.split(r"[;{}]", ret)[-1].strip()
        name = m.group(2)
        if not ret or ret.startswith("typedef") or "(" in ret:
            continue
        params, args = split_params(m.group(3), name)
        if name in found:
            continue
        found[name] = (ret, params, args)
    return found


def version_of(header_text):
    parts = []
    for key in ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"):
        m = re.search(r"#define\s+%s\s+(\d+)" % key, header_text)
        parts.append(m.group(1) if m else "?")
    return ".".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--header", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hooked", default="", help="';'- or ','-separated names")
    ap.add_argument("--omit", default="", help="';'- or ','-separated names")
    a = ap.parse_args()
    with open(a.header, encoding="utf-8", errors="replace") as fh:
        header_text = fh.read()
    try:
        funcs = parse(header_text)
    except ValueError as e:
        print(f"gen_nccl_api: {a.header}: {e}", file=sys.stderr)
        return 1
    # Every name the header mentions as "nccl...(" at the start of a declaration must have been
    # taken: a declaration the reader missed fails the build here.
    mentioned = set(re.findall(r"^\s*[A-Za-z_][\w\s\*]*?\b((?:p)?nccl\w*)\s*\(",
                               clean(header_text), flags=re.M))
    missed = sorted(n for n in mentioned if n not in funcs)
    if missed:
        print(f"gen_nccl_api: {a.header}: could not read the declarations of {', '.join(missed)}",
              file=sys.stderr)
        return 1
    if "ncclGetVersion" not in funcs:
        print(f"gen_nccl_api: {a.header}: no ncclGetVersion: not an nccl.h", file=sys.stderr)
        return 1
    hooked = {h for h in re.split(r"[;,]", a.hooked) if h}
    for omit in (o for o in re.split(r"[;,]", a.omit) if o):
        funcs.pop(omit, None)
        funcs.pop("p" + omit, None)
    lines = [
        f"// Generated by nccl/gen_nccl_api.py from {a.header} (NCCL {version_of(header_text)}):",
        "// every function that header declares. Do not edit; see the script for the macros.",
        f'#define ANYRN_HEADER_VERSION "{version_of(header_text)}"',
        "#ifndef ANYRN_FN_PLAIN",
        "#define ANYRN_FN_PLAIN(ret, name, params, args)",
        "#endif",
        "#ifndef ANYRN_FN_HOOKED",
        "#define ANYRN_FN_HOOKED(ret, name, params, args)",
        "#endif",
        "#ifndef ANYRN_FN_ALIAS",
        "#define ANYRN_FN_ALIAS(ret, twin, name, params)",
        "#endif",
    ]
    for name in funcs:
        lines.append(f"#ifndef ANYRN_HAS_{name}")
        lines.append(f"#define ANYRN_HAS_{name} 1")
        lines.append("#endif")
    aliases = []
    for name, (ret, params, args) in funcs.items():
        base = name[1:] if name.startswith("pnccl") else None
        p = "(" + ", ".join(params) + ")"
        if base is not None and base in funcs:
            aliases.append(f"ANYRN_FN_ALIAS({ret}, {name}, {base}, {p})")
            continue
        kind = "ANYRN_FN_HOOKED" if name in hooked else "ANYRN_FN_PLAIN"
        lines.append(f"{kind}({ret}, {name}, {p}, ({', '.join(args)}))")
    lines.extend(aliases)
    lines.extend(["#undef ANYRN_FN_PLAIN", "#undef ANYRN_FN_HOOKED", "#undef ANYRN_FN_ALIAS", ""])
    text = "\n".join(lines)
    old = None
    if os.path.exists(a.out):
        with open(a.out, encoding="utf-8") as fh:
            old = fh.read()
    if old != text:
        # Make does not create an output's folder (Ninja does).
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
