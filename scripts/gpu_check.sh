#!/usr/bin/env bash
# GPU check for issue 8: GPU tests, then the Qwen2.5-0.5B-shape benchmark table. Finishes in < 8 minutes.
#
#   bash scripts/gpu_check.sh --prepare   # on a machine WITH PyPI (a developer's): download the wheels the
#                                         # GPU machine lacks into .whl/ (pydantic & co; ~2 MB, git-ignored)
#   bash scripts/gpu_check.sh [BENCH ARGS] # on the GPU machine: nvidia-smi, pytest tests/test_gpu.py
#                                         # tests/test_decode.py, then scripts/gpu_bench.py (args passed on)
#
# Through the session's device tool (the GPU machine has torch/transformers/pytest but not pydantic, and
# reaches no package index; .whl travels with `carry`):
#   run(command="PYTHONUNBUFFERED=1 bash scripts/gpu_check.sh --json $OUT/gpu_bench.json 2>&1 | tee $OUT/gpu_check.log",
#       carry=[".whl"], timeout_s=540)
# Time limits inside: pytest 200 s, benchmark 290 s (its own --time-budget skips decode runs past 240 s).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0"

if [[ "${1:-}" == "--prepare" ]]; then
  mkdir -p .whl
  # shellcheck disable=SC2086
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $WHEELS
  RC=$?
  ls -la .whl
  exit $RC
fi

T0=$(date +%s)
echo "=== gpu_check $(date -u +%FT%TZ) in $ROOT"
nvidia-smi || echo "nvidia-smi: not available"
if ! python3 -c "import pydantic" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
python3 - <<'EOF' || { echo "missing Python packages: run 'bash scripts/gpu_check.sh --prepare' where PyPI is reachable and carry .whl"; exit 3; }
import torch, transformers, pydantic, yaml, pytest
print(f"torch {torch.__version__} cuda {torch.version.cuda} available={torch.cuda.is_available()} "
      f"device={torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-'}; transformers {transformers.__version__}; "
      f"pydantic {pydantic.VERSION}")
EOF

echo "=== pytest tests/test_gpu.py tests/test_decode.py"
timeout 200 python3 -m pytest tests/test_gpu.py tests/test_decode.py -q -rs -p no:cacheprovider
PYTEST_RC=$?
echo "pytest exit code: $PYTEST_RC ($(( $(date +%s) - T0 )) s so far)"

echo "=== scripts/gpu_bench.py $*"
timeout 290 python3 scripts/gpu_bench.py --time-budget 240 "$@"
BENCH_RC=$?
echo "gpu_bench exit code: $BENCH_RC; total $(( $(date +%s) - T0 )) s"
exit $(( PYTEST_RC != 0 || BENCH_RC != 0 ))
