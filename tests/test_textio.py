"""User files that are not what they claim: one line naming file and line, never a traceback."""
from __future__ import annotations

import pytest

from simcore.config import ConfigError, load_yaml
from simcore.importers import import_trace
from simcore.workload import WorkloadError, load_programs, save_programs

GOOD = '{"program_id": "a", "calls": [{"prompt_tokens": 10, "output_tokens": 2, "tool": null}]}\n'


def test_non_utf8_workload_names_file_and_line(tmp_path):
    p = tmp_path / "w.jsonl"
    p.write_bytes(GOOD.encode() + b'{"program_id": "b\xff"}\n')
    with pytest.raises(WorkloadError, match=r"w\.jsonl:2: not UTF-8 text \(byte 0xff\)"):
        load_programs(p)


@pytest.mark.parametrize("line, phrase", [
    ('{"program_id": "b", "calls": [', "Expecting value at column 31"),
    ('{"program_id": "b', "Unterminated string starting at column 16"),
    ('{"program_id": "b\x01"}', "Invalid control character at column 18"),
])
def test_truncated_json_reads_as_one_phrase(tmp_path, line, phrase):
    p = tmp_path / "w.jsonl"
    p.write_text(GOOD + line + "\n", encoding="utf-8")
    with pytest.raises(WorkloadError) as e:
        load_programs(p)
    assert str(e.value) == f"{p}:2: malformed or truncated JSON ({phrase})"
    assert " at at " not in str(e.value)


def test_directory_and_missing_file(tmp_path):
    with pytest.raises(WorkloadError, match="is a directory"):
        load_programs(tmp_path)
    with pytest.raises(WorkloadError, match="no such workload file"):
        load_programs(tmp_path / "nope.jsonl")


def test_importer_reader_non_utf8(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"a": 1}\n\xc3\x28\n')
    with pytest.raises(WorkloadError, match=r"t\.jsonl:2: not UTF-8 text"):
        import_trace("mooncake", p)


def test_yaml_non_utf8(tmp_path):
    p = tmp_path / "cells.yaml"
    p.write_bytes(b"cells:\n  x: \xff\n")
    with pytest.raises(ConfigError, match=r"cells\.yaml:2: not UTF-8 text"):
        load_yaml(p)


def test_save_into_missing_folder(tmp_path):
    progs = load_programs(_write(tmp_path / "w.jsonl", GOOD))
    with pytest.raises(WorkloadError, match=r"out\.jsonl: cannot write"):
        save_programs(progs, tmp_path / "no-such-dir" / "out.jsonl")


def _write(p, text):
    p.write_text(text, encoding="utf-8")
    return p
