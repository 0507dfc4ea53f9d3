#!/usr/bin/env bash
# Create .venv with qwenquant and its pinned quantization stack (constraints/quant.txt).
#
# torch: a local CPU wheel (pip find-links) or PyPI's CUDA build on a machine with an NVIDIA GPU;
# set QWENQUANT_TORCH_INDEX to force an index (e.g. https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${QWENQUANT_VENV:-.venv}
# shellcheck source=scripts/progress.sh
. scripts/progress.sh

"$PY" - <<'PYEOF' || { echo "error: qwenquant needs Python >= 3.10" >&2; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)
PYEOF

if [ ! -x "$VENV/bin/python" ]; then
  with_heartbeat "creating $VENV" "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

torch_args=()
if [ -n "${QWENQUANT_TORCH_INDEX:-}" ]; then
  torch_args=(--index-url "$QWENQUANT_TORCH_INDEX")
elif ! command -v nvidia-smi >/dev/null 2>&1; then
  # No GPU: prefer a CPU build of torch (a local wheel when pip's find-links has one).
  if ! "${PIP[@]}" download --no-deps -d "$(mktemp -d)" "torch==2.13.0+cpu" >/dev/null 2>&1; then
    torch_args=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
fi
with_heartbeat "installing torch 2.13.0 ${torch_args[*]:-}(about 1 GB)" \
  "${PIP[@]}" install "${torch_args[@]}" "torch==2.13.0"
with_heartbeat "installing qwenquant and its pinned dependencies (constraints/quant.txt)" \
  "${PIP[@]}" install -c constraints/quant.txt -e ".[dev,sign]"
"$VENV/bin/qwenquant" --version >/dev/null
step "done: $VENV/bin/qwenquant"
