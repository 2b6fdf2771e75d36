#!/usr/bin/env bash
# GPU check in under eight minutes, install included: synthesize with every engine in-process on the
# profile's providers (CUDA first) and print the providers in use, RTF and VRAM, then the instances
# sweep: Kokoro and Piper with 1/2/4 sessions (VOXMUX_INSTANCES) under 1-32 concurrent requests,
# throughput and first audio p50/p95 per cell (bench/gpu_check.py).
#
#   bench/gpu_check.sh                               # gpu profile; see "Python" below
#   bench/gpu_check.sh --profile legacy-gpu          # with ORT_GPU='onnxruntime-gpu==1.18.1 numpy<2'
#   bench/gpu_check.sh --json --out var/gpu-check    # any gpu_check.py option passes through
#
# Python: $PYTHON if set, used as it is; else the first of python3/python on PATH whose onnxruntime
# has CUDAExecutionProvider (a docker/gpu container, a venv you prepared); else a venv in
# var/gpu-venv with VoxMux and the `gpu` extra (onnxruntime swapped for onnxruntime-gpu), made once
# and reused. ORT_GPU='<pip requirements>' installs those instead, into a venv of its own. Exit status: gpu_check.py's (0 ok, 1 CUDA fell back to CPU, 2 a model failed),
# 124 when the time budget (GPU_CHECK_BUDGET seconds, default 470) ran out. The instances sweep, which
# runs last, starts no cell within 60 s of the budget's end (GPU_CHECK_END, set here), so the results
# are written even when it has to leave cells out (listed as `cells_left_out`).
#
# Offline, on a machine without network whose Python already has numpy, onnx, jinja2 and the CUDA
# libraries as nvidia-* wheels (a PyTorch install): WHEELHOUSE=DIR installs every wheel in DIR with
# no index and no dependency resolution (pip --no-index --no-deps, or bench/gpu_bundle.py's unzip
# where that Python has no pip) into GPU_CHECK_TARGET (default var/gpu-target; reinstalled when the
# wheel list changes), which goes first on PYTHONPATH: its onnxruntime-gpu shadows a CPU onnxruntime
# of that Python, and the rest of its packages stay in use. LD_LIBRARY_PATH gets the lib folders of
# its nvidia-* packages (CUDA 13, cuDNN 9), which onnxruntime-gpu's CUDA provider loads. Without
# pyopenjtalk-plus and jieba in DIR, Kokoro reads English (gpu_check.py --text-lang). DIR comes
# from bench/gpu_bundle.py (slimmed onnxruntime-gpu, parts to carry):
#
#   WHEELHOUSE=/tmp/stage/wheels bench/gpu_check.sh --out "$OUT"     # PYTHON picks the base Python
#
# One device call of about eight minutes for the instances sweep (the fp16 graph only, no batching):
#
#   WHEELHOUSE=... bench/gpu_check.sh --text-lang en --precisions fp16 --piper-batch none --out "$OUT"
set -euo pipefail
cd "$(dirname "$0")/.."

budget=${GPU_CHECK_BUDGET:-470}
start=$SECONDS
left() { local n=$((budget - (SECONDS - start))); echo $((n > 1 ? n : 1)); }
has_cuda() {
  "$1" -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())' \
    >/dev/null 2>&1
}

if [[ -n "${WHEELHOUSE:-}" ]]; then
  PYTHON=${PYTHON:-$(command -v python3)}
  target=${GPU_CHECK_TARGET:-var/gpu-target}
  wheels=$(cd "$WHEELHOUSE" && stat -c '%n %s %Y' -- *.whl)
  if [[ "$(cat "$target/.wheelhouse" 2>/dev/null)" != "$wheels" ]]; then
    echo "gpu_check: installing $(wc -l <<<"$wheels") wheels from $WHEELHOUSE into $target ($(left) s left)"
    rm -rf "$target" && mkdir -p "$target"
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
      timeout "$(left)" "$PYTHON" -m pip install --quiet --no-index --no-deps \
        --disable-pip-version-check --no-warn-script-location --target "$target" "$WHEELHOUSE"/*.whl
    else
      timeout "$(left)" "$PYTHON" bench/gpu_bundle.py install "$WHEELHOUSE" "$target"
    fi
    printf '%s\n' "$wheels" >"$target/.wheelhouse"
  fi
  cuda_libs=$("$PYTHON" bench/gpu_bundle.py cuda-libs --exclude "$target")
  [[ -z $cuda_libs ]] || export LD_LIBRARY_PATH=$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  PYTHONPATH=$(cd "$target" && pwd)${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONPATH
  "$PYTHON" -c 'import onnxruntime as o; print("gpu_check: onnxruntime", o.__version__, "from",
    o.__file__.rsplit("/", 2)[0], "providers", ",".join(o.get_available_providers()))'
fi
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
GPU_CHECK_END=$(($(date +%s) + $(left)))
export GPU_CHECK_END
exec timeout "$(left)" "$PYTHON" bench/gpu_check.py "$@"
