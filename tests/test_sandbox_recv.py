"""The client's answer reader: it reads before it polls (an answer is usually waiting, since
the worker runs on the parent's CPU while the parent writes), and must still assemble split
lines, keep answers that arrive together, and enforce the decision deadline."""
from __future__ import annotations

import os
import select
import threading
import time

import pytest

from sandbox import SandboxViolation
from sandbox.client import WorkerProcess


class _CountingPoll:
    def __init__(self, fd: int) -> None:
        self._p = select.poll()
        self._p.register(fd, select.POLLIN)
        self.calls = 0

    def poll(self, ms: float) -> list:
        self.calls += 1
        return self._p.poll(ms)


class _ExitedProc:
    returncode = 0  # kill() leaves an exited process alone
    pid = -1


@pytest.fixture()
def reader():
    r, w = os.pipe()
    os.set_blocking(r, False)
    wp = WorkerProcess.__new__(WorkerProcess)  # only the reading side is exercised
    wp._in, wp._buf, wp.dead, wp.proc = r, bytearray(), None, _ExitedProc()
    wp._poll_in = _CountingPoll(r)
    yield wp, w
    os.close(r)
    os.close(w)


def _recv(wp: WorkerProcess, timeout_s: float = 2.0) -> object:
    return wp._recv(time.monotonic() + timeout_s, timeout_s, "priority")


def test_waiting_answer_is_read_without_polling(reader):
    wp, w = reader
    os.write(w, b"[1,42]\n")
    assert _recv(wp) == 42
    assert wp._poll_in.calls == 0


def test_answers_arriving_together_are_kept_in_order(reader):
    wp, w = reader
    os.write(w, b'[1,"release"]\n[1,["protect",3.5]]\n[1,-7]\n')
    assert [_recv(wp), _recv(wp), _recv(wp)] == ["release", ["protect", 3.5], -7]


def test_split_line_is_assembled_after_polling(reader):
    wp, w = reader
    os.write(w, b"[1,")
    t = threading.Timer(0.05, lambda: os.write(w, b"17]\n"))
    t.start()
    try:
        assert _recv(wp) == 17
    finally:
        t.join()
    assert wp._poll_in.calls >= 1


def test_missing_answer_still_hits_the_deadline(reader):
    wp, _ = reader
    t = time.monotonic()
    with pytest.raises(SandboxViolation, match=r"^decision deadline of 0.2 s exceeded while priority$"):
        _recv(wp, timeout_s=0.2)
    assert 0.15 < time.monotonic() - t < 1.5


def test_endless_unterminated_output_is_refused(reader):
    wp, w = reader
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"9" * 4096)
    except BlockingIOError:
        pass  # the pipe is full: each read finds data, so only the size cap can stop it
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            try:
                os.write(w, b"9" * 4096)
            except BlockingIOError:
                time.sleep(0.001)
            except OSError:
                return

    th = threading.Thread(target=flood, daemon=True)
    th.start()
    try:
        with pytest.raises(SandboxViolation, match="answer larger than"):
            _recv(wp)
    finally:
        stop.set()
        th.join()


@pytest.mark.parametrize("line,want", [
    (b'[1,"release"]', "release"), (b'[1,"evict"]', "evict"), (b'[1,"none"]', "none"),
    (b'[1,["protect",12.25]]', ["protect", 12.25]), (b'[1,["protect",-1e+22]]', ["protect", -1e22]),
    (b'[1,["protect",3]]', ["protect", 3.0]),
    # not in the fast path's shape: the JSON parser decides, exactly as before
    (b'[1,["protect",1.5,2.0]]', ["protect", 1.5, 2.0]), (b'[1, "release"]', "release"),
])
def test_fast_paths_agree_with_json(reader, line, want):
    wp, w = reader
    os.write(w, line + b"\n")
    got = _recv(wp)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("line", [b'[1,["protect",1_0]]', b'[1,["protect",inf]]', b'[1,["protect", 01]]',
                                  b'[1,["protect",]]', b'[1,"release]'])
def test_fast_paths_refuse_what_json_refuses(reader, line):
    """float() would read 1_0 or inf; an answer must still be strict JSON."""
    wp, w = reader
    os.write(w, line + b"\n")
    with pytest.raises(SandboxViolation, match="malformed answer"):
        _recv(wp)
