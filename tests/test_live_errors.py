"""Every unusable server or input is one line on stderr and exit code 2, never a traceback."""
from __future__ import annotations

import pytest

from tests.fakes.openai_stream import FakeServer, dead_url
from search.cli import main
from simcore.workload import Call, Program, save_programs


@pytest.fixture
def wl(tmp_path):
    p = tmp_path / "wl.jsonl"
    save_programs([Program("a", (Call(64, 4, "bash", 0.01), Call(96, 3)))], p)
    return p


def one_line_error(capsys, rc: int, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    joined = " ".join(lines)
    assert "Traceback" not in err
    assert joined.startswith("error:"), err
    for n in needles:
        assert n in joined, (n, err)
    return joined


def replay(wl, url, tmp_path, *extra):
    return main(["replay", str(wl), "--server", url, "--rate", "5", "--out", str(tmp_path / "out"), "--quiet", *extra])


def test_unreachable_server(capsys, wl, tmp_path):
    url = dead_url()
    one_line_error(capsys, replay(wl, url, tmp_path), "cannot reach the server", url.split("//")[1])


@pytest.mark.parametrize("cmd", ["replay", "profile"])
def test_model_not_served(capsys, wl, tmp_path, cmd):
    with FakeServer(model="served-model") as url:
        if cmd == "replay":
            rc = replay(wl, url, tmp_path, "--model", "other-model")
        else:
            rc = main(["profile", "--server", url, "--model", "other-model", "--out", str(tmp_path / "p")])
    one_line_error(capsys, rc, "model 'other-model' is not served", "served-model")


def test_server_without_streaming(capsys, wl, tmp_path):
    with FakeServer(streaming=False) as url:
        one_line_error(capsys, replay(wl, url, tmp_path), "not Server-Sent Events", "streaming")


def test_server_without_token_id_prompts(capsys, wl, tmp_path):
    with FakeServer(token_prompts=False) as url:
        one_line_error(capsys, replay(wl, url, tmp_path), "does not accept token-id prompts")


def test_server_without_generated_token_ids(capsys, wl, tmp_path):
    with FakeServer(token_ids=False) as url:
        one_line_error(capsys, replay(wl, url, tmp_path), "no generated token ids", "return_token_ids")


def test_workload_longer_than_max_model_len(capsys, tmp_path):
    p = tmp_path / "long.jsonl"
    save_programs([Program("short", (Call(64, 4),)), Program("big", (Call(64, 4, "bash", 0.0), Call(4000, 200)))], p)
    with FakeServer(max_model_len=2048) as url:
        rc = replay(p, url, tmp_path)
        assert not (tmp_path / "out").exists()      # refused before any call is sent
    one_line_error(capsys, rc, "program 'big' call 1", "4200", "max model length 2048")


def test_token_ids_outside_the_vocabulary(capsys, wl, tmp_path):
    with FakeServer(vocab=500) as url:
        one_line_error(capsys, replay(wl, url, tmp_path, "--token-range", "100:1000"), "--token-range")


def test_not_an_openai_server(capsys, wl, tmp_path):
    with FakeServer() as url:
        one_line_error(capsys, replay(wl, url + "/nothing-here", tmp_path), "not an OpenAI-compatible server")


def test_replay_needs_a_rate(capsys, wl):
    one_line_error(capsys, main(["replay", str(wl), "--server", "http://127.0.0.1:1", "--quiet"]), "--rate")


def test_validate_of_a_priority_cell_needs_the_exported_policy(capsys, tmp_path):
    # rtx70b cells schedule FCFS by default; a priority policy from a cell must come from an export
    with FakeServer() as url:
        rc = main(["validate", "--cell", "rtx70b_swe10_0.1", "--server", url, "--policy", str(tmp_path / "none"),
                   "--out", str(tmp_path / "v")])
    one_line_error(capsys, rc, "no such export directory")
