#!/usr/bin/env bash
# The trainer on one GPU at a real size, in <= 5 minutes on one H200 (scripts/gpu_train_check.py:
# a random Qwen3-8B-shaped target in bf16, the paper's drafter, 100 steps with flex_attention
# compiled; tokens/s, MFU against the dense bf16 peak, peak memory against the memory plan).
#
#   scripts/gpu_train_check.sh [--wheels DIR] [-- ARGS for gpu_train_check.py]
#   scripts/gpu_train_check.sh --toy            # the CPU path at a tiny size (what CI runs)
#
# For a machine without network whose Python has torch (e.g. 3.12 and torch 2.11): the
# packages it lacks (msgspec, transformers, safetensors, tokenizers, accelerate, ...) are
# installed from DIR (default shared/wheels; carry their cp312 / py3 wheels there), without
# their dependencies, into a throwaway target folder: the system's torch is left as it is.
# The repository is used in place (PYTHONPATH), never pip-installed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WHEELS="$ROOT/shared/wheels"
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) WHEELS="$2"; shift 2 ;;
        --) shift; ARGS+=("$@"); break ;;
        *) ARGS+=("$1"); shift ;;
    esac
done

NEEDED="torch transformers safetensors tokenizers msgspec"
missing=()
for mod in $NEEDED; do
    "$PYTHON" -c "import $mod" 2>/dev/null || missing+=("$mod")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "${missing[0]}" = torch ]; then
        echo "gpu_train_check: $PYTHON has no torch; this check uses the machine's own" >&2
        exit 2
    fi
    if [ ! -d "$WHEELS" ]; then
        echo "gpu_train_check: missing ${missing[*]} and no wheel folder $WHEELS (--wheels DIR)" >&2
        exit 2
    fi
    SITE="$(mktemp -d "${TMPDIR:-/tmp}/fd-gpucheck-site.XXXXXX")"
    trap 'rm -rf "$SITE"' EXIT
    "$PYTHON" -m pip install -q --no-index --no-deps --find-links "$WHEELS" --target "$SITE" \
        "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
exec "$PYTHON" "$ROOT/scripts/gpu_train_check.py" "${ARGS[@]}"
