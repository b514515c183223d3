"""A reader of nccl-tests' text output (all_reduce_perf and the other *_perf tools), written from
that format as nccl-tests defines it: its README ("Arguments", "Performance"),
doc/PERFORMANCE.md (algbw, busbw) and the printing code of src/common.cu and src/util.cu
(writeResultHeader, writeBenchmarkLinePreamble, writeBenchmarkLineBody, writeResultFooter).

The format, as read here:
- every line of comment starts with "#"; among them the column header
  "#  size  count  type  redop  root  time algbw busbw #wrong  time algbw busbw #wrong", a units
  line, and last the summary "# Out of bounds values : N OK|FAILED" and
  "# Avg bus bandwidth    : X";
- every other non-empty line is a data row of whitespace-separated fields: size (bytes), count
  (elements), type, redop, root, then two groups, out-of-place and in-place, of time (us),
  algbw (GB/s), busbw (GB/s) and #wrong ("N/A" when not checked). Fields after the 13th
  (a timestamp, or a tool's own columns) are kept as `extra` and not interpreted.

Standard library only.
"""
import re

COLUMNS = ["size", "count", "type", "redop", "root",
           "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"]


class FormatError(ValueError):
    pass


def _number(text, what, line_no):
    try:
        return float(text)
    except ValueError:
        raise FormatError(f"line {line_no}: {what} is not a number: {text!r}")


def _group(fields, at, line_no):
    wrong = fields[at + 3]
    return {
        "time": _number(fields[at], "time", line_no),
        "algbw": _number(fields[at + 1], "algbw", line_no),
        "busbw": _number(fields[at + 2], "busbw", line_no),
        "wrong": None if wrong == "N/A" else _number(wrong, "#wrong", line_no),
    }


def parse(text):
    """Returns {"header": [column names], "comments": [lines], "rows": [row dicts],
    "out_of_bounds": (count, "OK"|"FAILED"), "avg_busbw": float, "last_lines": [the last two
    non-empty lines]}. Raises FormatError on a line that is neither a comment nor a row."""
    out = {"header": None, "comments": [], "rows": [], "out_of_bounds": None,
           "avg_busbw": None}
    nonempty = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        nonempty.append(line)
        if line.startswith("#"):
            out["comments"].append(line)
            body = line[1:].split()
            if body[:5] == COLUMNS[:5] and out["header"] is None:
                out["header"] = body
            m = re.match(r"#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)\s*$", line)
            if m:
                out["out_of_bounds"] = (int(m.group(1)), m.group(2))
            m = re.match(r"#\s*Avg bus bandwidth\s*:\s*(\S+)", line)
            if m:
                out["avg_busbw"] = _number(m.group(1), "Avg bus bandwidth", n)
            continue
        fields = line.split()
        if len(fields) < 13:
            raise FormatError(f"line {n}: {len(fields)} fields, a row has at least 13: {line!r}")
        out["rows"].append({
            "size": int(fields[0]),
            "count": int(fields[1]),
            "type": fields[2],
            "redop": fields[3],
            "root": int(fields[4]),
            "out_of_place": _group(fields, 5, n),
            "in_place": _group(fields, 9, n),
            "extra": fields[13:],
            "line": n,
        })
    out["last_lines"] = nonempty[-2:]
    return out
