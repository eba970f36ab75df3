"""Diagnostic step tracer for vLLM 0.32 (CPU or GPU), loaded through PYTHONPATH by
scripts/validate_vllm_cpu.sh when TRACE=1; never imported by the project itself.

With VLLM_STEP_TRACE_DIR set, every vLLM process that imports the engine core or the model
runner appends JSON lines to $VLLM_STEP_TRACE_DIR/steps-<pid>.jsonl, on the host's
CLOCK_MONOTONIC (the replay's clock_origin_monotonic_s is on the same clock):

  {"k": "step", "t0", "ts", "tu", "t1", "pre": [[new, computed], ...], "ndec", "kv", "run", "wait"}
      one EngineCore.step: t0 start, ts schedule() returned, tu the model's output is back,
      t1 update_from_output() returned; the prefill chunks and the decodes it scheduled
      (ndec sequences with kv tokens in all), running and waiting after scheduling;
  {"k": "pre", "t0", "t1", "n"}             the engine core's input thread preprocessing a request;
  {"k": "execute_model" | "sample_tokens", "t0", "t1"}   the worker's model runner.

Costs a few microseconds per step (one json.dumps; a write every 64 records or 0.2 s).
"""
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time

OUT = os.environ.get("VLLM_STEP_TRACE_DIR")
_lock = threading.Lock()
_state = {"f": None, "buf": [], "last": 0.0}


def emit(rec):
    with _lock:
        if _state["f"] is None:
            _state["f"] = open(os.path.join(OUT, f"steps-{os.getpid()}.jsonl"), "a")
        _state["buf"].append(json.dumps(rec))
        now = time.monotonic()
        if len(_state["buf"]) >= 64 or now - _state["last"] > 0.2:
            _state["f"].write("\n".join(_state["buf"]) + "\n")
            _state["f"].flush()
            _state["buf"].clear()
            _state["last"] = now


def _patch_core(mod):
    EC = mod.EngineCore
    orig_step, orig_pre = EC.step, EC.preprocess_add_request

    def step(self):
        sch = self.scheduler
        t0 = time.monotonic()
        orig_schedule, orig_update = sch.schedule, sch.update_from_output
        info = {}

        def schedule(*a, **k):
            out = orig_schedule(*a, **k)
            info["ts"] = time.monotonic()
            pre, ndec, kv = [], 0, 0
            for rid, n in out.num_scheduled_tokens.items():
                r = sch.requests.get(rid)
                if r is None:
                    continue
                before = r.num_computed_tokens - n     # vLLM advances it when it schedules
                if n == 1 and r.num_output_tokens > 0 and before == r.num_tokens - 1:
                    ndec += 1
                    kv += before + 1
                else:
                    pre.append((n, before))
            info.update(pre=pre, ndec=ndec, kv=kv, run=len(sch.running), wait=len(sch.waiting))
            return out

        def update(*a, **k):
            info["tu"] = time.monotonic()
            return orig_update(*a, **k)

        sch.schedule, sch.update_from_output = schedule, update
        try:
            res = orig_step(self)
        finally:
            del sch.schedule, sch.update_from_output
        t1 = time.monotonic()
        if "ts" in info and (info["pre"] or info["ndec"]):
            emit({"k": "step", "t0": t0, "ts": info["ts"], "tu": info.get("tu", t1), "t1": t1, "pre": info["pre"],
                  "ndec": info["ndec"], "kv": info["kv"], "run": info["run"], "wait": info["wait"]})
        return res

    def pre(self, request):
        t0 = time.monotonic()
        r = orig_pre(self, request)
        emit({"k": "pre", "t0": t0, "t1": time.monotonic(), "n": len(request.prompt_token_ids or ())})
        return r

    EC.step, EC.preprocess_add_request = step, pre


def _patch_runner(mod):
    R = mod.GPUModelRunner
    for name in ("execute_model", "sample_tokens"):
        def make(orig, name):
            def f(self, *a, **k):
                t0 = time.monotonic()
                r = orig(self, *a, **k)
                emit({"k": name, "t0": t0, "t1": time.monotonic()})
                return r
            return f
        setattr(R, name, make(getattr(R, name), name))


PATCHES = {"vllm.v1.engine.core": _patch_core, "vllm.v1.worker.gpu_model_runner": _patch_runner}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        orig_exec = spec.loader.exec_module

        def exec_module(module):
            orig_exec(module)
            PATCHES[name](module)
        spec.loader.exec_module = exec_module
        return spec


if OUT:
    sys.meta_path.insert(0, _Finder())
