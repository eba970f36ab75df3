"""The client's answer reader (sandbox.process.LineReader, sandbox.wire.parse_answer): it
reads before it polls (an answer is usually waiting, since the worker runs on the parent's
CPU while the parent writes), and must still assemble split lines, keep answers that arrive
together, enforce the deadline, and parse untrusted lines strictly and without tracebacks."""
from __future__ import annotations

import os
import threading
import time

import pytest

from sandbox.process import Closed, Deadline, LineReader, TooLarge
from sandbox.wire import Failed, Malformed, parse_answer


@pytest.fixture()
def reader():
    r, w = os.pipe()
    os.set_blocking(r, False)
    yield LineReader(r), w
    os.close(r)
    try:
        os.close(w)
    except OSError:
        pass


def _recv(rd: LineReader, timeout_s: float = 2.0) -> object:
    return parse_answer(rd.read_line(time.monotonic() + timeout_s))


def test_waiting_answer_is_read_without_polling(reader):
    rd, w = reader
    os.write(w, b"[1,42]\n")
    assert _recv(rd) == 42
    assert rd.polls == 0


def test_answers_arriving_together_are_kept_in_order(reader):
    rd, w = reader
    os.write(w, b'[1,"release"]\n[1,["protect",3.5]]\n[1,-7]\n')
    assert [_recv(rd), _recv(rd), _recv(rd)] == ["release", ["protect", 3.5], -7]


def test_split_line_is_assembled_after_polling(reader):
    rd, w = reader
    os.write(w, b"[1,")
    t = threading.Timer(0.05, lambda: os.write(w, b"17]\n"))
    t.start()
    try:
        assert _recv(rd) == 17
    finally:
        t.join()
    assert rd.polls >= 1


def test_missing_answer_still_hits_the_deadline(reader):
    rd, _ = reader
    t = time.monotonic()
    with pytest.raises(Deadline):
        _recv(rd, timeout_s=0.2)
    assert 0.15 < time.monotonic() - t < 1.5


def test_a_closed_pipe_is_not_a_timeout(reader):
    rd, w = reader
    os.close(w)
    with pytest.raises(Closed):
        _recv(rd)


def test_endless_unterminated_output_is_refused(reader):
    rd, w = reader
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
        with pytest.raises(TooLarge):
            _recv(rd)
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
def test_fast_paths_agree_with_json(line, want):
    got = parse_answer(line)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("line", [b'[1,["protect",1_0]]', b'[1,["protect",inf]]', b'[1,["protect", 01]]',
                                  b'[1,["protect",]]', b'[1,"release]', b'[2,1]', b'[true,1]', b'{"a":1}',
                                  b"[1," + b"[" * 100_000 + b"]" * 100_000 + b"]",       # RecursionError in json
                                  b'[1,[[[[[[1]]]]]]]'])                                  # deeper than any answer
def test_malformed_deep_or_huge_answers_are_a_reason(line):
    """float() would read 1_0 or inf; deep nesting would be a RecursionError traceback."""
    with pytest.raises(Malformed):
        parse_answer(line)


def test_a_failure_line_carries_its_reason():
    with pytest.raises(Failed, match="priority raised ValueError: x"):
        parse_answer(b'[0,"priority raised ValueError: x"]')
