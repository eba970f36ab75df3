"""Search markers: a candidate may differ from its seed only inside the EVOLVE blocks.

OpenEvolve 0.4.0 does not enforce `# EVOLVE-BLOCK-START` / `# EVOLVE-BLOCK-END`; an LLM
that rewrites the class header, the imports or the interface would otherwise slip
through. We split both files at the marker lines and require the text outside the blocks
to be identical (trailing whitespace on a line and trailing blank lines are ignored,
because diff application routinely changes them).
"""
from __future__ import annotations

import re

from .errors import SandboxViolation

START = "# EVOLVE-BLOCK-START"
END = "# EVOLVE-BLOCK-END"
_MARK = re.compile(r"^\s*#\s*EVOLVE-BLOCK-(START|END)\b.*$")


def _segments(text: str, what: str) -> list[str]:
    """Text outside the blocks: [before first block, between blocks..., after last]."""
    outside: list[list[str]] = [[]]
    inside = False
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _MARK.match(line)
        if m is None:
            if not inside:
                outside[-1].append(line.rstrip())
            continue
        kind = m.group(1)
        if kind == "START":
            if inside:
                raise SandboxViolation(f"{what}: line {lineno}: nested {START}")
            inside = True
            outside[-1].append(START)  # the marker itself must also be kept, indentation aside
        else:
            if not inside:
                raise SandboxViolation(f"{what}: line {lineno}: {END} without {START}")
            inside = False
            outside.append([END])
    if inside:
        raise SandboxViolation(f"{what}: {START} is never closed by {END}")
    segs = []
    for seg in outside:
        while seg and seg[-1] == "":
            seg.pop()
        segs.append("\n".join(seg))
    return segs


def check_markers(candidate: str, seed: str) -> None:
    """Raise SandboxViolation unless `candidate` equals `seed` outside the EVOLVE blocks."""
    seed_segs = _segments(seed, "seed")
    if len(seed_segs) < 2:
        raise SandboxViolation(f"seed has no {START} / {END} block")
    cand_segs = _segments(candidate, "candidate")
    if len(cand_segs) != len(seed_segs):
        raise SandboxViolation(f"candidate has {len(cand_segs) - 1} EVOLVE blocks, the seed has "
                               f"{len(seed_segs) - 1}; keep the markers as they are")
    for i, (c, s) in enumerate(zip(cand_segs, seed_segs)):
        if c != s:
            cl, sl = c.splitlines(), s.splitlines()
            j = next((k for k in range(min(len(cl), len(sl))) if cl[k] != sl[k]), min(len(cl), len(sl)))
            where = "before the first EVOLVE block" if i == 0 else (
                "after the last EVOLVE block" if i == len(seed_segs) - 1 else f"between EVOLVE blocks {i} and {i + 1}")
            got = cl[j].strip() if j < len(cl) else "<missing line>"
            want = sl[j].strip() if j < len(sl) else "<no line>"
            raise SandboxViolation(f"candidate changes code outside the EVOLVE blocks ({where}): "
                                   f"got {got[:80]!r}, the seed has {want[:80]!r}")
