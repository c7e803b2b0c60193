#!/usr/bin/env bash
# The first run on a GPU machine, in under 9 minutes on one H200, with nothing installed but the machine's PyTorch
# and the wheels in .whl/ (loguru: the one package of the core's that a bare CUDA image lacks; see docs/gpus.md):
# the GPU smoke test, the gpu-marked tests, then benchmarks.gpu (the Kaggle-like model, 200 steps each of fp32,
# TF32, bf16 and bf16 + compile) at two batch sizes. Every step has its own time limit, so one that hangs costs
# its limit, not the run. Output goes to the terminal and, where $OUT is set, to $OUT/first_gpu.log.
#
#     bash benchmarks/first_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
log="${OUT:-/tmp}/first_gpu.log"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="src:.:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
{
  date -u "+%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
  echo "== python -m benchmarks.gpu_smoke --quick"
  timeout 240 python3 -m benchmarks.gpu_smoke --quick; echo "rc $?"
  echo "== pytest -m gpu"
  timeout 60 python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider \
    tests/engine/test_device.py tests/engine/trained/test_metrics.py tests/engine/training/test_loop.py; echo "rc $?"
  echo "== python -m benchmarks.gpu --batches 8192 65536 --steps 200 --rows 2000000 --compile-mode default"
  timeout 150 python3 -m benchmarks.gpu --batches 8192 65536 --steps 200 --rows 2000000 --compile-mode default
  echo "rc $?"
} 2>&1 | tee "$log"
