"""BFCL v4 multi-turn (`bfcl-eval` package data) -> programs.

SRC is a question file (e.g. BFCL_v4_multi_turn_base.json, one JSON object per line with
`id`, `question` = list of turns of user messages, `involved_classes`); the ground truth
comes from the matching possible-answer file (`ground_truth` = per turn, the list of call
strings), found next to SRC as `possible_answer_<name>` or `possible_answer/<name>`, or
given with --answers.

BFCL records no tokens and no timings, so the program is built from the data by a stated
model (parameters in configs/workloads/importers.yaml):
  calls    = one LLM call per ground-truth function call, in order (a turn without calls
             adds only its user message to the context)
  prompt   = system_prompt_tokens + tool schemas of the involved classes + the user
             messages so far + every earlier call's output and tool result
  output   = tokens of the ground-truth call string + call_overhead_tokens
  tool     = the called function; duration tool_s (simulated, in-process), plus
             turn_gap_s after the last call of a turn (the harness issues the next turn)
Tool schemas: counted from the bfcl-eval `multi_turn_func_doc` folder if --func-docs
names it, left out with --func-docs none, else taken from the per-class token table in
importers.yaml (measured on bfcl-eval 2026.3.23). Token counts use the offline cl100k
tokenizer. BFCL has no arrival times.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simcore.importers._common import check_file, count_tokens, fail, importer_params, read_jsonl, req
from simcore.workload import Call, Program


def _answers_path(src: Path, answers: str | Path | None) -> Path:
    if answers:
        return Path(answers)
    for cand in (src.with_name(f"possible_answer_{src.name}"), src.parent / "possible_answer" / src.name):
        if cand.is_file():
            return cand
    raise fail(src, None, f"no possible-answer file found (looked for possible_answer_{src.name} "
                          f"and possible_answer/{src.name}); pass --answers PATH")


def _doc_tokens(func_docs: str | Path | None, params: dict) -> dict[str, int]:
    if func_docs is not None and str(func_docs).lower() == "none":
        return {}
    table = {str(k): int(v) for k, v in (params.get("func_doc_tokens") or {}).items()}
    if func_docs is None:
        return table
    folder = Path(func_docs)
    if not folder.is_dir():
        raise fail(folder, None, "--func-docs must be bfcl-eval's multi_turn_func_doc folder or 'none'")
    out = {}
    for cls, fname in (params.get("func_doc_files") or {}).items():
        f = folder / str(fname)
        if not f.is_file():
            continue
        total = 0
        for line, doc in read_jsonl(f):
            total += count_tokens(json.dumps(doc))
        out[str(cls)] = total
    return out


def load(path: Path, answers: str | Path | None = None, func_docs: str | Path | None = None,
         **_: Any) -> list[Program]:
    params = importer_params().get("bfcl", {}) or {}
    check_file(path)
    apath = _answers_path(path, answers)
    truth: dict[str, tuple[int, list]] = {}
    for line, row in read_jsonl(apath):
        rid = str(req(row, "id", (str, int), apath, line))
        gt = req(row, "ground_truth", list, apath, line)
        if not all(isinstance(t, list) and all(isinstance(c, str) for c in t) for t in gt):
            raise fail(apath, line, "field 'ground_truth' must be a list of turns of call strings")
        truth[rid] = (line, gt)
    docs = _doc_tokens(func_docs, params)
    sys_tok = int(params.get("system_prompt_tokens", 0))
    overhead = int(params.get("call_overhead_tokens", 0))
    result_tok = int(params.get("result_tokens", 0))
    tool_s, turn_gap = float(params.get("tool_s", 0.0)), float(params.get("turn_gap_s", 0.0))
    programs = []
    for line, row in read_jsonl(path):
        rid = str(req(row, "id", (str, int), path, line))
        turns = req(row, "question", list, path, line)
        classes = row.get("involved_classes") or []
        if rid not in truth:
            raise fail(path, line, f"'{rid}' has no ground truth in {apath}")
        gt = truth[rid][1]
        if len(gt) != len(turns):
            raise fail(path, line, f"'{rid}' has {len(turns)} turns but {len(gt)} ground-truth turns in {apath}")
        user_tok = []
        for t in turns:
            if not isinstance(t, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in t):
                raise fail(path, line, "each turn in 'question' must be a list of messages with 'content'")
            user_tok.append(sum(count_tokens(m["content"]) for m in t))
        flat = [(ti, c) for ti, t in enumerate(gt) for c in t]
        if not flat:
            raise fail(apath, truth[rid][0], f"'{rid}' has no ground-truth calls")
        unknown = [c for c in classes if c not in docs]
        if docs and unknown:
            raise fail(path, line, f"no tool-schema size for class(es) {', '.join(map(str, unknown))}")
        prompt = sys_tok + sum(docs.get(c, 0) for c in classes) + sum(user_tok[: flat[0][0] + 1])
        calls = []
        for k, (ti, call) in enumerate(flat):
            out = count_tokens(call) + overhead
            name = call.split("(", 1)[0].strip() or "call"
            if k == len(flat) - 1:
                calls.append(Call(prompt, max(1, out)))
                break
            nti = flat[k + 1][0]
            dur = tool_s + (turn_gap if nti != ti else 0.0)
            calls.append(Call(prompt, max(1, out), name, dur))
            prompt += out + result_tok + sum(user_tok[ti + 1: nti + 1])
        programs.append(Program(rid, tuple(calls), {"source": "bfcl", "turns": len(turns)}))
    if not programs:
        raise fail(path, None, "no programs in the question file")
    return programs
