#!/usr/bin/env bash
# The GPU checks of issue 42 (item 6), for one call of a lent machine:
#   tools/gpu_checks.sh checks   tests/test_cuda.py, then real_shape.py at 4 layers x 256 tokens (about 5 min)
#   tools/gpu_checks.sh wide     discovery on the wide deep Mamba-1 toy at 64 x 8,192 (Falcon-Mamba-7B's shape)
#   tools/gpu_checks.sh all      wide, then test_cuda.py, then real_shape.py in the time left (GPU_SECONDS, default 580)
# Needs the wheels of tools/gpu_wheels.sh in .whl/ (carry it). Logs and JSON go to $OUT.
# On 2026-11-27 an H100 ran `checks` in about 6 minutes; `wide` had not finished after 300 s
# beside test_cuda.py (HF's PyTorch scan, no mamba-ssm): give it the whole call.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu}; mkdir -p "$OUT"
PY=${PY:-python3}  # a dry run here: PY=.venv/bin/python SKIP_PIP=1 WIDE_LAYERS=8 WIDE_WIDTH=512 WIDE_DEVICE=cpu
[ -n "${SKIP_PIP:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true; } | tee "$OUT/gpu.txt"
$PY -c "import torch, transformers, nnsight; print('torch', torch.__version__, 'transformers', transformers.__version__, 'nnsight', nnsight.__version__)" | tee -a "$OUT/gpu.txt"
wide() {  # its stage bar in discover.log; every 60 s the Python stacks in stacks.txt (where the time goes)
    timeout "${WIDE_SECONDS:-540}" $PY -c "import faulthandler, runpy, sys
sys.path.insert(0, 'benchmarks')
faulthandler.dump_traceback_later(60, repeat=True, file=open('$OUT/stacks.txt', 'w'))
sys.argv = ['discover_scale.py', '--layers', '${WIDE_LAYERS:-64}', '--families', 'mamba', '--width', '${WIDE_WIDTH:-8192}', '--prompts', '32', '--no-remote',
            '--device', '${WIDE_DEVICE:-cuda}', '--threads', '4', '--progress', '--json', '$OUT/discover_64x8192.json']
runpy.run_path('benchmarks/discover_scale.py', run_name='__main__')" 2>&1 | tee "$OUT/discover.log" | tr '\r' '\n' | tail -12
    nvidia-smi --query-gpu=memory.used --format=csv >> "$OUT/gpu.txt" 2>/dev/null || true
}
case "${1:-checks}" in
checks)
    timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log" | tail -5
    timeout 300 python3 benchmarks/real_shape.py --device cuda --layers 4 --seq-len 256 --prompts 2 --verbose \
        --json "$OUT/real_shape_cuda.json" 2>&1 | tee "$OUT/real_shape.log" | grep -v '^  '
    ;;
wide)
    wide
    ;;
all)
    began=$SECONDS
    wide
    timeout 120 $PY -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log" | tail -5
    left=$(( ${GPU_SECONDS:-580} - (SECONDS - began) ))
    echo "real_shape: ${left} s left"
    [ "$left" -gt 30 ] && timeout "$left" $PY benchmarks/real_shape.py --device cuda --layers 4 --seq-len 256 --prompts 2 \
        --verbose --json "$OUT/real_shape_cuda.json" 2>&1 | tee "$OUT/real_shape.log" | grep -v '^  '
    ;;
*) echo "usage: tools/gpu_checks.sh checks|wide|all" >&2; exit 2 ;;
esac
