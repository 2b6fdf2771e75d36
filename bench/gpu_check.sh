#!/usr/bin/env bash
# GPU check in under five minutes, install included: synthesize with every engine in-process on the
# profile's providers (CUDA first) and print the providers in use, RTF and VRAM (bench/gpu_check.py).
#
#   bench/gpu_check.sh                               # gpu profile; see "Python" below
#   bench/gpu_check.sh --profile legacy-gpu          # with ORT_GPU='onnxruntime-gpu==1.18.1 numpy<2'
#   bench/gpu_check.sh --json --out var/gpu-check    # any gpu_check.py option passes through
#
# Python: $PYTHON if set, used as it is; else the first of python3/python on PATH whose onnxruntime
# has CUDAExecutionProvider (a docker/gpu container, a venv you prepared); else a venv in
# var/gpu-venv with VoxMux and the `gpu` extra (onnxruntime swapped for onnxruntime-gpu), made once
# and reused. ORT_GPU='<pip requirements>' installs those instead, into a venv of its own. Exit status: gpu_check.py's (0 ok, 1 CUDA fell back to CPU, 2 a model failed),
# 124 when the time budget (GPU_CHECK_BUDGET seconds, default 290) ran out.
set -euo pipefail
cd "$(dirname "$0")/.."

budget=${GPU_CHECK_BUDGET:-290}
start=$SECONDS
left() { local n=$((budget - (SECONDS - start))); echo $((n > 1 ? n : 1)); }
has_cuda() {
  "$1" -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())' \
    >/dev/null 2>&1
}

if [[ -z "${PYTHON:-}" && -z "${ORT_GPU:-}" ]]; then
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null && has_cuda "$candidate"; then
      PYTHON=$(command -v "$candidate")
      break
    fi
  done
fi
if [[ -z "${PYTHON:-}" ]]; then
  default_venv=var/gpu-venv
  [[ -z "${ORT_GPU:-}" ]] || default_venv+="-$(printf '%s' "$ORT_GPU" | tr -cs 'A-Za-z0-9.' '-')"
  venv=${GPU_CHECK_VENV:-$default_venv}
  PYTHON=$venv/bin/python
  if ! has_cuda "$PYTHON"; then
    spec=${ORT_GPU:-$(python3 -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["gpu"]))')}
    read -ra packages <<<"$spec"
    echo "gpu_check: installing VoxMux and ${packages[*]} into $venv ($(left) s left)"
    [[ -x $PYTHON ]] || python3 -m venv "$venv"
    timeout "$(left)" "$PYTHON" -m pip install --quiet --upgrade pip
    timeout "$(left)" "$PYTHON" -m pip install --quiet -e .
    # onnxruntime (a dependency) and onnxruntime-gpu share one module: keep only the GPU build.
    "$PYTHON" -m pip uninstall --quiet -y onnxruntime onnxruntime-gpu
    timeout "$(left)" "$PYTHON" -m pip install --quiet "${packages[@]}"
  fi
fi

echo "gpu_check: $PYTHON ($(left) s left)"
exec timeout "$(left)" "$PYTHON" bench/gpu_check.py "$@"
