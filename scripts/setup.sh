#!/usr/bin/env bash
# Create .venv with rlft installed (CPU torch first: the pinned wheel installs without CUDA packages).
#   bash scripts/setup.sh          # CPU torch (what the demo and the tests need)
#   bash scripts/setup.sh --gpu    # a CUDA build of the same torch, from PyTorch's wheel index (cu128; another
#                                  # CUDA version with RLFT_CUDA=cu126 or cu130: the driver's "CUDA Version" in
#                                  # nvidia-smi must be at least the build's)
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=2.13.0
gpu=0
case "${1:-}" in
  "") ;;
  --gpu) gpu=1 ;;
  *) echo "usage: bash scripts/setup.sh [--gpu]" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [ "$gpu" = 1 ]; then
  cuda="${RLFT_CUDA:-cu128}"
  # the local version (+cu128) is pinned: a CPU build already installed (2.13.0+cpu) would satisfy torch==2.13.0
  .venv/bin/python -m pip install -q "torch==${TORCH}+${cuda}" --extra-index-url "https://download.pytorch.org/whl/${cuda}"
else
  .venv/bin/python -m pip install -q torch==${TORCH}
fi
.venv/bin/python -m pip install -q -e ".[dev,lang,lora,deepspeed,docs,tensorboard,wandb,mlflow,trackio,serve,verifiers,openenv,agents]"
if [ "$gpu" = 1 ]; then
  .venv/bin/python -c "import torch; print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: ' + (torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none visible (check nvidia-smi)'))"
fi
