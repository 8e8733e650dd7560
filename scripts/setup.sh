#!/usr/bin/env bash
# Create .venv and install loopnas with its test extras, on the torch build that fits the machine.
#
#   LOOPNAS_TORCH=cpu    the CPU build: the default without an NVIDIA GPU. On Linux a bare `torch`
#                        requirement would pull the multi-GB CUDA build, so it comes from a wheel
#                        pip already has locally (find-links), else from PyTorch's CPU index.
#   LOOPNAS_TORCH=cuda   PyPI's Linux build, which is the CUDA one and brings triton: the default
#                        where nvidia-smi lists a GPU. fla's kernels need it.
#   LOOPNAS_TORCH_VERSION  default 2.13.0.
#
# macOS (and Windows) wheels of torch are CPU builds; triton is not installed there (Linux only),
# so the fla backend is unavailable and backend="auto" picks the torch one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=${LOOPNAS_TORCH_VERSION:-2.13.0}
CPU_INDEX=https://download.pytorch.org/whl/cpu

if [ -z "${LOOPNAS_TORCH:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
    LOOPNAS_TORCH=cuda
  else
    LOOPNAS_TORCH=cpu
  fi
fi
case "$LOOPNAS_TORCH" in
  cpu|cuda) ;;
  *) echo "setup.sh: LOOPNAS_TORCH must be cpu or cuda (got '$LOOPNAS_TORCH')" >&2; exit 2 ;;
esac
OS=$(uname -s)
if [ "$LOOPNAS_TORCH" = cuda ] && [ "$OS" != Linux ]; then
  echo "setup.sh: LOOPNAS_TORCH=cuda needs Linux (torch's CUDA wheels and triton are Linux only)" >&2
  exit 2
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip_install() { .venv/bin/python -m pip install -q "$@"; }
pip_install --upgrade pip

# A torch of the other build already in .venv would satisfy the pin: replace it.
installed=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null || true)
if [ -n "$installed" ] && [ "$OS" = Linux ]; then
  have=cuda
  [[ "$installed" == *+cpu ]] && have=cpu
  [ "$have" = "$LOOPNAS_TORCH" ] || .venv/bin/python -m pip uninstall -q -y torch
fi

echo "setup.sh: torch $VERSION, $LOOPNAS_TORCH build ($OS)"
if [ "$OS" != Linux ] || [ "$LOOPNAS_TORCH" = cuda ]; then
  pip_install "torch==$VERSION"
else
  # a local CPU wheel (pip's find-links) without its dependencies, which then come from PyPI;
  # else PyTorch's CPU index
  if pip_install --no-index --no-deps "torch==$VERSION" 2>/dev/null; then
    pip_install "torch==$VERSION"
  else
    pip_install "torch==$VERSION" --index-url "$CPU_INDEX" --extra-index-url https://pypi.org/simple
  fi
fi
pip_install -e ".[test]"
