#!/usr/bin/env bash
# Wheels for a lent GPU machine whose image has torch but not the analysis stack (see
# tools/gpu_checks.sh). Run here, in the repository root; downloads into .whl/ (git-ignored
# through .git/info/exclude). The versions are the lock's; the image's own torch is used.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
mkdir -p .whl
pin() { grep -i "^$1==" requirements/lock.txt | head -1; }
platforms=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# What the image lacks (2026-11, torch 2.11 image): the analysis stack and its pure-Python needs.
names=(transformers huggingface-hub httpx2 httpcore2 truststore transformer-lens beartype fancy-einsum typeguard
       nnsight greenlet websocket-client zstandard pydantic pydantic-core annotated-types typing-inspection
       datasets dill multiprocess tokenizers typer)
specs=(); for n in "${names[@]}"; do specs+=("$(pin "$n")"); done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "${specs[@]}"
# transformers-stream-generator (a transformer-lens requirement) ships as a source archive only.
.venv/bin/python -m pip wheel -q --no-deps -w .whl "$(pin transformers-stream-generator)"
ls .whl
