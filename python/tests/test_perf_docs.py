"""docs/PERFORMANCE.md's generated tables against docs/runs/*.json (scripts/perf-tables.py).

CPU only: the generator's --check passes on the checkout, every run file carries the fields a
run must record, and --check fails (exit 1, with a message) when a run file or the document
drifts.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "perf-tables.py"
RUNS = REPO_ROOT / "docs" / "runs"
REQUIRED = {
    "date": str,
    "sequence": int,
    "title": str,
    "machine": str,
    "command": str,
    "commit": str,
    "peer": str,
    "measured": str,
    "results": list,
    "notes": list,
}


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "scripts" / "perf-tables.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )


def _copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts" / "perf-tables.py")
    shutil.copytree(REPO_ROOT / "docs" / "runs", root / "docs" / "runs")
    shutil.copy(REPO_ROOT / "docs" / "PERFORMANCE.md", root / "docs" / "PERFORMANCE.md")
    return root


def test_generated_tables_are_current():
    r = _check(REPO_ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_run_file_records_date_machine_command_commit_and_peer():
    files = sorted(RUNS.glob("*.json"))
    assert files
    sequences = set()
    for f in files:
        m = re.match(r"^(\d{4}-\d{2}-\d{2})-[a-z0-9][a-z0-9-]*\.json$", f.name)
        assert m, f.name
        run = json.loads(f.read_text(encoding="utf-8"))
        for key, kind in REQUIRED.items():
            assert isinstance(run.get(key), kind), (f.name, key)
            if kind is str:
                assert run[key].strip(), (f.name, key)
        assert run["date"] == m.group(1), f.name
        assert run["sequence"] not in sequences, f.name
        sequences.add(run["sequence"])
        assert run["results"], f.name
        for row in run["results"]:
            assert isinstance(row, dict) and row, f.name
            assert "table" in row or "family" in row, (f.name, row)
            if "family" in row:
                assert row.get("platform") and row.get("shape"), (f.name, row)


def test_check_fails_when_a_run_file_changes_a_current_figure(tmp_path):
    root = _copy_tree(tmp_path)
    assert _check(root).returncode == 0
    # Change one figure of the newest run that has current-table rows (its rows are current).
    runs = []
    for f in (root / "docs" / "runs").glob("*.json"):
        run = json.loads(f.read_text(encoding="utf-8"))
        if any("family" in row for row in run["results"]):
            runs.append((run["sequence"], f, run))
    _, f, run = max(runs, key=lambda x: x[0])
    row = [row for row in run["results"] if "family" in row][-1]
    # A figure the current tables show: "anyreduce" where the row has it (a grid shows it and
    # its ratios only, docs/PERFORMANCE.md), else the row's first column.
    cols = [k for k in row if k not in ("family", "platform", "shape", "table", "note")]
    key = "anyreduce" if "anyreduce" in cols else cols[0]
    row[key] = "999.99"
    f.write_text(json.dumps(run, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    r = _check(root)
    assert r.returncode == 1
    assert "perf-tables.py" in r.stderr


def test_check_fails_when_a_run_file_lacks_a_required_field(tmp_path):
    root = _copy_tree(tmp_path)
    f = sorted((root / "docs" / "runs").glob("*.json"))[0]
    run = json.loads(f.read_text(encoding="utf-8"))
    del run["peer"]
    f.write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    r = _check(root)
    assert r.returncode == 1
    assert '"peer" is missing' in r.stderr


def test_check_fails_when_the_document_is_edited_by_hand(tmp_path):
    root = _copy_tree(tmp_path)
    doc = root / "docs" / "PERFORMANCE.md"
    text = doc.read_text(encoding="utf-8")
    doc.write_text(text.replace("## Runs\n", "## Runs\n\nedited by hand\n", 1), encoding="utf-8")
    r = _check(root)
    assert r.returncode == 1
