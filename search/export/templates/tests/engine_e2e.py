"""One program across a tool gap through a whole vLLM engine on CPU (dummy weights, no
tokenizer), with or without the retention scheduler. Prints JSON: the second call's
cached prefix tokens. Run by test_retention.py in a fresh process per engine.

    python engine_e2e.py retention|stock WORKDIR
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # engine core in this process: sees the package
import conftest  # noqa: E402,F401 - makes the package importable by name
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

# CPU attention needs head_dim >= 32 and block sizes that are multiples of 32.
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
          "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
          "vocab_size": 8192, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
          "bos_token_id": 1, "eos_token_id": 2}


def main(mode: str, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.json").write_text(json.dumps(CONFIG))
    extra = {"scheduler_cls": f"{conftest.PACKAGE}.scheduler.RetentionScheduler"} if mode == "retention" else {}
    llm = LLM(model=str(work), load_format="dummy", skip_tokenizer_init=True, enable_prefix_caching=True,
              block_size=32, num_gpu_blocks_override=64, max_model_len=512, max_num_seqs=4, enforce_eager=True,
              async_scheduling=False, gpu_memory_utilization=0.1, **extra)

    def run(tokens: list[int], session: str | None = None) -> int:
        sp = SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False,
                            extra_args={"session_id": session} if session else None)
        out = llm.generate([TokensPrompt(prompt_token_ids=tokens)], sp, use_tqdm=False)
        return out[0].num_cached_tokens or 0

    prompt = list(range(1000, 1160))                     # 5 blocks of 32
    run(prompt, "A")
    for i in range(16):                                  # 16 x 6 blocks > the 64-block pool
        run(list(range(5000 + 200 * i, 5160 + 200 * i)))
    hit = run(prompt + [7] + list(range(3000, 3040)), "A")
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    print(json.dumps({"mode": mode, "scheduler": type(sched).__name__, "cached_tokens": hit,
                      "stats": getattr(sched, "stats", None)}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
