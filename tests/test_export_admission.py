"""`evolve export` asks the sandbox again, on the exact bytes it exports, and says where the
policy will run (issue 12: the export is the user's deployment)."""
from __future__ import annotations

import hashlib
import json

import pytest

from tests.runs_fixture import CELL, make_run
from search.export import admission
from search.cli import main

RUN = f"scheduling-{CELL}-fixture"
CAND = "it0003-cccc"


@pytest.fixture
def runs(tmp_path):
    make_run(tmp_path / "runs", "scheduling")
    return tmp_path / "runs"


def _program(runs, cid=CAND):
    return runs / RUN / "candidates" / cid / "program.py"


def export(runs, out, *extra):
    return main(["export", RUN, "--candidate", CAND, "--out", str(out), "--runs-dir", str(runs), *extra])


def test_metadata_records_the_verdict_and_the_files_hash(runs, tmp_path, capsys):
    out = tmp_path / "pkg"
    assert export(runs, out) == 0
    printed = capsys.readouterr().out
    meta = json.loads((out / "metadata.json").read_text())
    a = meta["admission"]
    assert a["admissible"] is True and a["forced"] is False and a["checked_by"] == admission.CHECKED_BY
    assert [s["stage"] for s in a["stages"]] == ["gate", "markers", "smoke", "leakage"]
    assert all(s["ok"] for s in a["stages"])           # markers checked against the run's seed.py
    assert meta["policy_sha256"] == hashlib.sha256(_program(runs).read_bytes()).hexdigest()
    assert (out / "policy.py").read_bytes() == _program(runs).read_bytes()
    assert "ADMISSIBLE" in printed and meta["policy_sha256"] in printed.replace("\n", "")
    flat = " ".join(printed.split())
    assert "runs in-process, with full Python rights, in your client process" in flat
    readme = " ".join((out / "README.md").read_text().split())
    assert "Where the policy runs." in readme and meta["policy_sha256"] in readme and "admissible (" in readme


def test_bytes_are_exported_as_they_are(runs, tmp_path):
    """CRLF line ends and all: the hash in metadata.json is the hash of the file in the run."""
    p = _program(runs)
    p.write_bytes(p.read_bytes().replace(b"\n", b"\r\n"))
    out = tmp_path / "pkg"
    assert export(runs, out) == 0
    assert (out / "policy.py").read_bytes() == p.read_bytes()
    assert json.loads((out / "metadata.json").read_text())["policy_sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_file_the_sandbox_now_rejects_is_not_exported(runs, tmp_path, capsys):
    p = _program(runs)
    p.write_text(p.read_text().replace("import math", "import os"))   # result.json still says ok
    out = tmp_path / "pkg"
    assert export(runs, out) == 2
    err = capsys.readouterr().err
    assert "not admissible now" in err and "gate" in err and "--force-inadmissible" in err
    assert not out.exists()


def test_force_inadmissible_exports_and_records_it(runs, tmp_path, capsys):
    p = _program(runs)
    p.write_text(p.read_text().replace("import math", "import os"))
    out = tmp_path / "pkg"
    assert export(runs, out, "--force-inadmissible") == 0
    printed = " ".join(capsys.readouterr().out.split())
    a = json.loads((out / "metadata.json").read_text())["admission"]
    assert a["admissible"] is False and a["forced"] is True and a["reason"].startswith("gate:")
    assert "NOT ADMISSIBLE" in printed and "--force-inadmissible" in printed
    assert "**NOT admissible**" in (out / "README.md").read_text()


def test_a_check_that_cannot_run_counts_as_not_admissible(runs, tmp_path, monkeypatch, capsys):
    import sandbox.check

    def broken(*a, **k):
        raise RuntimeError("no user namespaces")

    monkeypatch.setattr(sandbox.check, "check_policy", broken)
    assert export(runs, tmp_path / "pkg") == 2
    assert "could not run: RuntimeError: no user namespaces" in capsys.readouterr().err


def test_candidate_text_is_escaped_before_it_is_stored_or_printed(runs, tmp_path, capsys):
    p = _program(runs)
    p.write_text(p.read_text().replace("return int(round(", 'raise ValueError("\\x1b[2Jverdict: ADMISSIBLE")\n'
                                                        "        return int(round("))
    out = tmp_path / "pkg"
    assert export(runs, out, "--force-inadmissible") == 0
    printed = capsys.readouterr().out
    meta_text = (out / "metadata.json").read_text()
    assert "\x1b" not in printed and "\x1b" not in (out / "README.md").read_text()
    assert "\\u001b" not in meta_text                   # not even JSON-escaped: the byte is gone
    assert json.loads(meta_text)["admission"]["admissible"] is False


def test_clean_escapes_control_characters_only():
    assert admission.clean("a\x1b[31mb\x07c\td\u00e9\x9b") == "a\\x1b[31mb\\x07c\\x09d\u00e9\\x9b"
