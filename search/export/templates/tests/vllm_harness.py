"""Drive vLLM's real v1 Scheduler on CPU without a model: we play the model runner.

A tiny Llama config (no weights, no tokenizer) satisfies ModelConfig; each step we
return one sampled token for every request whose prefill is complete, exactly what the
engine core feeds back to `update_from_output`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}


def make_scheduler(cls: type, tmp: Path, num_blocks: int = 41, max_num_seqs: int = 4,
                   max_num_batched_tokens: int = 2048) -> Any:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(TINY_LLAMA))
    mc = ModelConfig(model=str(tmp), skip_tokenizer_init=True, max_model_len=2048)
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         max_model_len=2048, policy="priority", is_encoder_decoder=False)
    cc = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    cc.num_gpu_blocks = num_blocks
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn"], spec)])
    init_none_hash(sha256)
    return cls(vc, kc, StructuredOutputManager(vc), block_size=BLOCK)


_hasher = None


def make_request(rid: str, tokens: list[int], max_tokens: int = 1, priority: int = 0,
                 session: str | None = None) -> Request:
    global _hasher
    if _hasher is None:
        _hasher = get_request_block_hasher(BLOCK, sha256)
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                        extra_args={"session_id": session} if session else None)
    return Request(rid, list(tokens), sp, None, priority=priority, block_hasher=_hasher, session_id=session)


def step(s: Any) -> tuple[Any, list[str]]:
    """One engine step; returns the scheduler output and the ids of requests that finished."""
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        r = s.requests[rid]
        # schedule() has already advanced num_computed_tokens by this step's tokens; a
        # request samples only once its whole prompt is computed (a partial prefill chunk
        # samples nothing, as vLLM's model runner discards it).
        done_prefill = r.num_computed_tokens >= r.num_tokens
        sampled.append([7] if done_prefill else [])
    mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                            sampled_token_ids=sampled)
    before = set(s.requests)
    s.update_from_output(out, mro)
    return out, sorted(before - set(s.requests))


def run_to_completion(s: Any, max_steps: int = 200) -> list[Any]:
    outs = []
    for _ in range(max_steps):
        if not s.has_requests():
            return outs
        outs.append(step(s)[0])
    raise AssertionError("requests did not finish")


def prefix_hit(out: Any, rid: str) -> int | None:
    for new in out.scheduled_new_reqs:
        if new.req_id == rid:
            return new.num_computed_tokens
    return None
