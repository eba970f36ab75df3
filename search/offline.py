"""The embedded offline mutator: an LLM stand-in that needs no API key or server.

It answers OpenEvolve prompts with real SEARCH/REPLACE edits inside the EVOLVE block of
the current program, drawn from a small grammar of policy edits:
  - rewrite the decision as an accumulator (`score = ...` / `tau = ...`) so terms can be added;
  - add a term built from observable PCB fields and signals (sqrt/log of attained service,
    context length, KV residency, turns, age, KV utilisation, observed tool gaps);
  - remove a term; transform attained service (linear <-> sqrt <-> log1p);
  - swap a decision line for an alternative form (routing keys and fallbacks, retention values);
  - scale a numeric constant.
Choices come from a `random.Random` seeded by the run seed, the iteration and the parent's
source, so a run (and a resumed run) proposes exactly the same edits. It implements
OpenEvolve's `LLMInterface`, so it can also be plugged in through `init_client`.
"""
from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from openevolve.llm.base import LLMInterface

START, END = "# EVOLVE-BLOCK-START", "# EVOLVE-BLOCK-END"

# Terms added to a scheduling score (lower runs first). Constants are starting points only.
_SCHED_TERMS = [
    ("favour short prefills", "score += pcb.context_tokens * {k}", (0.01, 0.03, 0.1)),
    ("favour calls whose KV is still cached",
     "score -= pcb.context_tokens * {k} if pcb.kv_resident else 0.0", (0.03, 0.1, 0.3)),
    ("favour protected (retained) contexts",
     "score -= pcb.kv_resident_tokens * {k} if pcb.kv_protected else 0.0", (0.05, 0.1, 0.2)),
    ("penalise long programs by turns completed", "score += pcb.turns_completed * {k}", (50.0, 200.0, 500.0)),
    ("age programs so none starves", "score -= (now - pcb.arrival_s) * {k}", (1.0, 10.0, 50.0)),
    ("favour programs waiting since release",
     "score -= (now - pcb.release_s) * {k} if pcb.release_s is not None else 0.0", (10.0, 100.0, 500.0)),
    ("concave attained-service term", "score += math.sqrt(max(0.0, pcb.attained_service_s)) * {k}",
     (300.0, 1000.0, 3000.0)),
    ("log attained-service term", "score += math.log1p(max(0.0, pcb.attained_service_s)) * {k}",
     (300.0, 1000.0, 3000.0)),
    ("penalise long outputs seen so far",
     "score += sum(pcb.completed_output_tokens) * {k}", (0.5, 2.0, 5.0)),
]
# Factors applied to a retention window tau (seconds).
_RET_TERMS = [
    ("shrink the window under KV pressure",
     "tau *= max({k}, 1.0 - (self.signals.kv_utilization or 0.0))", (0.2, 0.3, 0.5)),
    ("scale the window with context length", "tau *= max(0.5, pcb.context_tokens / {k})",
     (10000.0, 20000.0, 40000.0)),
    ("stretch the window to the longest observed tool gap",
     "tau = max(tau, {k} * max(pcb.returned_tool_durations)) if pcb.returned_tool_durations else tau",
     (0.5, 1.0, 1.5)),
    ("protect long-running programs longer", "tau *= 1.0 + pcb.turns_completed * {k}", (0.01, 0.05, 0.1)),
]
# Whole-line alternatives: (regex of a line in the block, replacement lines with {k}).
_ALTERNATIVES = [
    (r"^\s*key = \(.*\)\s*$", [
        "key = (inst.running + inst.waiting, inst.kv_utilization, inst.index)",
        "key = (inst.kv_utilization, inst.running + inst.waiting, inst.index)",
        "key = (inst.running + {k} * inst.waiting + 10.0 * inst.kv_utilization, inst.index)",
        "key = (inst.running + inst.waiting - ({k} if inst.holds_program_kv else 0.0), inst.kv_utilization, inst.index)",
        "key = (inst.waiting, -inst.free_tokens, inst.index)",
    ], (0.5, 2.0, 4.0)),
    (r"^\s*if overloaded.*:\s*$", [
        "if overloaded or home.kv_utilization > self.MAX_KV_UTILIZATION:",
        "if overloaded:",
        "if overloaded or (home.kv_utilization > self.MAX_KV_UTILIZATION and not home.holds_program_kv):",
        "if overloaded or home.free_tokens < pcb.context_tokens * {k}:",
    ], (0.5, 1.0, 2.0)),
    (r"^\s*return \(\"protect\", now \+ tau.*\)\s*$", [
        'return ("protect", now + tau)',
        'return ("protect", now + tau, float(pcb.context_tokens))',
        'return ("protect", now + tau, float(pcb.kv_resident_tokens) / (1.0 + pcb.turns_completed))',
        'return ("protect", now + tau, {k} * pcb.attained_service_s)',
    ], (1.0, 10.0)),
]
_SERVICE_FORMS = ["pcb.attained_service_s", "math.sqrt(max(0.0, pcb.attained_service_s))",
                  "math.log1p(max(0.0, pcb.attained_service_s))"]
_NUM = re.compile(r"(?<![\w.])(\d+\.\d+|\d+)(?![\w.])")


def _fmt(x: float) -> str:
    """Four significant digits, never in exponent form (the constant mutator edits digits)."""
    s = f"{x:.4g}"
    if "e" in s:
        s = f"{float(s):.1f}" if abs(x) >= 1 else f"{float(s):.8f}".rstrip("0")
    return s if "." in s else s + ".0"


def _block(code: str) -> tuple[list[str], int, int]:
    lines = code.split("\n")
    try:
        a = next(i for i, l in enumerate(lines) if l.strip() == START)
        b = next(i for i, l in enumerate(lines) if l.strip() == END and i > a)
    except StopIteration:
        return lines, -1, -1
    return lines, a + 1, b


def _diff(search: list[str], replace: list[str]) -> str:
    return ("<<<<<<< SEARCH\n" + "\n".join(search) + "\n=======\n" + "\n".join(replace)
            + "\n>>>>>>> REPLACE")


class OfflineMutator(LLMInterface):
    """Proposes one to two grammar edits per call; deterministic given (seed, iteration, parent)."""

    def __init__(self, model_cfg: Any = None, seed: int = 0) -> None:
        self.model = "offline-mutator"
        self.seed = int(getattr(model_cfg, "random_seed", None) or seed)
        self.last_usage = None

    async def generate(self, prompt: str, **kwargs: Any) -> str:
        return await self.generate_with_context("", [{"role": "user", "content": prompt}], **kwargs)

    async def generate_with_context(self, system_message: str, messages: list[dict[str, str]],
                                    **kwargs: Any) -> str:
        code = kwargs.get("parent_code")
        if code is None:
            m = re.search(r"# Current Program\n```\w*\n(.*?)\n```", messages[-1]["content"], re.DOTALL)
            code = m.group(1) if m else ""
        key = f"{self.seed}|{kwargs.get('iteration', '')}|{code}".encode()
        rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
        return self.propose(code, rng)

    # ------------------------------------------------------------------ grammar
    def propose(self, code: str, rng: random.Random) -> str:
        lines, a, b = _block(code)
        if a < 0:
            return "The program has no EVOLVE block; no change proposed."
        edits = []
        for _ in range(1 + (rng.random() < 0.35)):
            e = self._one_edit(lines, a, b, rng, {ln for _, (s, _) in edits for ln in s})
            if e:
                edits.append(e)
        if not edits:
            return "No applicable edit found."
        return "\n\n".join(f"{why}\n{_diff(s, r)}" for why, (s, r) in edits)

    def _one_edit(self, lines: list[str], a: int, b: int, rng: random.Random, used: set[str]):
        ops = [self._accumulate, self._add_term, self._add_term, self._remove_term,
               self._transform_service, self._alternative, self._constant, self._constant]
        rng.shuffle(ops)
        for op in ops:
            e = op(lines, a, b, rng)
            if e and not (set(e[1][0]) & used):
                return e
        return None

    @staticmethod
    def _single_priority_term(lines: list[str], a: int, b: int) -> bool:
        """A priority that is one term of attained service: scaling it or taking its sqrt/log
        keeps every order, so such edits change no decision (a wasted evaluation)."""
        block = "\n".join(lines[a:b])
        return ("def priority" in block and not re.search(r"score [+-]= ", block)
                and not re.search(r"(return int\(round\(|score = ).*[+-]", block))

    @staticmethod
    def _find(lines: list[str], a: int, b: int, pattern: str) -> list[int]:
        rx = re.compile(pattern)
        return [i for i in range(a, b) if rx.search(lines[i])]

    def _accumulate(self, lines, a, b, rng):
        """Rewrite `return f(x)` as an accumulator plus a first term (a bare rewrite would
        change nothing, and an evaluation spent on a no-op is wasted)."""
        forms = [(r"^\s*return int\(round\((.+)\)\)\s*$", "score", "return int(round(score))", _SCHED_TERMS,
                  "Turn the priority into a score of several terms"),
                 (r"^\s*return \(\"protect\", now \+ ([^,]+)\)\s*$", "tau", 'return ("protect", now + tau)', _RET_TERMS,
                  "Make the protection window tau adaptive")]
        for pattern, var, ret, terms, why in forms:
            for i in self._find(lines, a, b, pattern):
                expr = re.match(pattern, lines[i]).group(1)
                if expr.strip() == var:
                    continue
                ind = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
                what, tmpl, ks = rng.choice(terms)
                term = tmpl.format(k=_fmt(rng.choice(ks)))
                return (f"{why}: {what}.", ([lines[i]], [f"{ind}{var} = {expr}", f"{ind}{term}", f"{ind}{ret}"]))
        return None

    def _add_term(self, lines, a, b, rng):
        ret = self._find(lines, a, b, r"^\s*return int\(round\(score\)\)\s*$")
        terms, anchor = _SCHED_TERMS, ret
        if not ret:
            anchor = self._find(lines, a, b, r"^\s*return \(\"protect\", now \+ tau\)\s*$")
            terms = _RET_TERMS
        if not anchor:
            return None
        i = anchor[0]
        ind = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        present = "\n".join(lines[a:b])
        fresh = [t for t in terms if t[1].split("{k}")[0] not in present]
        if not fresh:
            return None
        why, tmpl, ks = rng.choice(fresh)
        new = f"{ind}{tmpl.format(k=_fmt(rng.choice(ks)))}"
        return (f"Add a term: {why}.", ([lines[i - 1], lines[i]], [lines[i - 1], new, lines[i]]))

    def _remove_term(self, lines, a, b, rng):
        idx = self._find(lines, a, b, r"^\s*(score [+-]= |tau \*= |tau = max\(tau)")
        if not idx:
            return None
        i = rng.choice(idx)
        return ("Drop a term that may not pay for itself.", ([lines[i - 1], lines[i]], [lines[i - 1]]))

    def _alternative(self, lines, a, b, rng):
        spots = [(i, alts, ks) for pattern, alts, ks in _ALTERNATIVES for i in self._find(lines, a, b, pattern)]
        if not spots:
            return None
        i, alts, ks = rng.choice(spots)
        ind = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        options = [ind + alt.format(k=_fmt(rng.choice(ks))) for alt in alts]
        options = [o for o in options if o.strip() != lines[i].strip()]
        return ("Try a different form of this decision.", ([lines[i]], [rng.choice(options)]))

    def _transform_service(self, lines, a, b, rng):
        if self._single_priority_term(lines, a, b):
            return None
        cands = []
        for i in range(a, b):
            if "score = " in lines[i] or "return int(round(" in lines[i]:
                for form in reversed(_SERVICE_FORMS):  # wrapped forms contain the plain one
                    if form in lines[i]:
                        cands.append((i, form))
                        break
        if not cands:
            return None
        i, form = rng.choice(cands)
        other = rng.choice([f for f in _SERVICE_FORMS if f != form])
        return (f"Reshape the attained-service term ({other.split('(')[0]}).",
                ([lines[i]], [lines[i].replace(form, other, 1)]))

    def _constant(self, lines, a, b, rng):
        if self._single_priority_term(lines, a, b):
            return None
        spots = []
        for i in range(a, b):
            s = lines[i]
            if s.lstrip().startswith("#") or "def " in s or "EVOLVE" in s:
                continue
            for m in _NUM.finditer(s):
                if m.group(0) not in ("0", "0.0", "1", "1.0"):
                    spots.append((i, m))
        if not spots:
            return None
        i, m = rng.choice(spots)
        v = float(m.group(0))
        factor = rng.choice([0.5, 0.7, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0])
        nv = v * factor
        s = lines[i]
        # integer literals stay integers (they may be counts or indices)
        lit = _fmt(nv) if "." in m.group(0) else str(max(1, int(round(nv))))
        new = s[: m.start()] + lit + s[m.end():]
        if new == s:
            return None
        return (f"Tune a constant ({m.group(0)} -> x{factor:g}).", ([s], [new]))
