"""A small parser for include/anyreduce/anyreduce.h, enough to check the Python mirror of it:
function prototypes, enums, structs, #defines and the *_INITIALIZER macros."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

SIZE_T_MAX = (1 << 64) - 1


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def norm_type(decl: str) -> str:
    """'const anyrComm_t' -> 'anyrComm_t'; 'char *' -> 'char*'; whitespace normalized."""
    decl = re.sub(r"\bconst\b", " ", decl)
    decl = re.sub(r"\s*\*\s*", "*", decl)
    return " ".join(decl.split())


@dataclass
class Prototype:
    name: str
    restype: str
    params: List[Tuple[str, str]]  # (normalized C type, parameter name)


@dataclass
class Header:
    text: str
    code: str  # without comments

    @classmethod
    def load(cls, path: Path) -> "Header":
        text = path.read_text()
        return cls(text, strip_comments(text))

    # -- functions ---------------------------------------------------------------------------

    def prototypes(self) -> Dict[str, Prototype]:
        out: Dict[str, Prototype] = {}
        for m in re.finditer(r"ANYR_API\s+([^;(]*?)\b(anyr\w+)\s*\(([^)]*)\)\s*;", self.code, re.S):
            restype, name, params = norm_type(m.group(1)), m.group(2), m.group(3)
            plist: List[Tuple[str, str]] = []
            for p in params.split(","):
                p = " ".join(p.split())
                if not p or p == "void":
                    continue
                pm = re.match(r"(.*?)(\w+)$", p)
                assert pm, f"cannot parse parameter {p!r} of {name}"
                plist.append((norm_type(pm.group(1)), pm.group(2)))
            out[name] = Prototype(name, restype, plist)
        return out

    def declared_function_names(self) -> List[str]:
        """Every `ANYR_API ... anyrXxx(` in the header, by a deliberately simple regex."""
        return re.findall(r"ANYR_API\b[^;(]*?\b(anyr\w+)\s*\(", self.code, re.S)

    # -- enums -------------------------------------------------------------------------------

    def enums(self) -> Dict[str, List[Tuple[str, int]]]:
        out: Dict[str, List[Tuple[str, int]]] = {}
        for m in re.finditer(r"typedef\s+enum\s*\{(.*?)\}\s*(\w+)\s*;", self.code, re.S):
            entries: List[Tuple[str, int]] = []
            nxt = 0
            for item in m.group(1).split(","):
                item = item.strip()
                if not item:
                    continue
                if "=" in item:
                    k, v = (s.strip() for s in item.split("=", 1))
                    nxt = int(v, 0)
                else:
                    k = item
                entries.append((k, nxt))
                nxt += 1
            out[m.group(2)] = entries
        return out

    # -- structs -----------------------------------------------------------------------------

    def structs(self) -> Dict[str, List[Tuple[str, str, Optional[str]]]]:
        """typedef name -> [(field name, normalized C type, array length expr or None)]."""
        out: Dict[str, List[Tuple[str, str, Optional[str]]]] = {}
        for m in re.finditer(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", self.code, re.S):
            fields = []
            for decl in m.group(1).split(";"):
                decl = " ".join(decl.split())
                if not decl:
                    continue
                fm = re.match(r"(.*?)(\w+)\s*(?:\[(.*?)\])?$", decl)
                assert fm, f"cannot parse field {decl!r}"
                fields.append((fm.group(2), norm_type(fm.group(1)), fm.group(3)))
            out[m.group(2)] = fields
        return out

    # -- macros ------------------------------------------------------------------------------

    def defines(self) -> Dict[str, str]:
        out: Dict[str, str] = {}
        joined = self.text.replace("\\\n", " ")
        for m in re.finditer(r"^\s*#define\s+(\w+)(?!\()\s+(.+)$", joined, re.M):
            out[m.group(1)] = " ".join(strip_comments(m.group(2)).split())
        return out

    def eval(self, expr: str, extra: Optional[Dict[str, int]] = None) -> int:
        """Evaluate a constant C expression of the header (macros, enumerators, casts)."""
        defines = self.defines()
        names: Dict[str, int] = {}
        for entries in self.enums().values():
            names.update(dict(entries))
        names.update(extra or {})

        def ev(e: str, depth: int = 0) -> int:
            assert depth < 20, f"macro recursion in {e!r}"
            size_t = "(size_t)" in e.replace(" ", "")
            e = re.sub(r"\(\s*size_t\s*\)", "", e)
            e = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", e)

            def sub(m: "re.Match[str]") -> str:
                w = m.group(0)
                if w in names:
                    return str(names[w])
                if w in defines:
                    return "(" + str(ev(defines[w], depth + 1)) + ")"
                if w == "NULL":
                    return "0"
                raise KeyError(f"unknown identifier {w!r} in {expr!r}")

            e = re.sub(r"\b[A-Za-z_]\w*\b", sub, e)
            v = int(eval(e, {"__builtins__": {}}, {}))  # noqa: S307 -- digits and operators only
            return v & SIZE_T_MAX if size_t else v

        return ev(expr)

    def initializer(self, macro: str) -> List[str]:
        body = self.defines()[macro]
        inner = body[body.index("{") + 1: body.rindex("}")]
        return [p.strip() for p in inner.split(",")]
