#!/usr/bin/env bash
# Second call on a lent GPU machine: real mistakes on a real GPU get the right verdict within the time
# limit, the test suite (editable install, as the README's test command does), and the check benchmark.
#   OUT=/tmp/out bash benchmarks/gpu_verify.sh
set -uo pipefail
OUT=${OUT:-/tmp/gd-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
LOG="$OUT/verify.log"
$PY -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
if ls .whl/*.whl >/dev/null 2>&1; then  # test-only packages the image lacks (jsonschema), carried as wheels
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/site
fi
GD="$(dirname "$(command -v $PY)")/gpudoctor"
verdict() {  # verdict LABEL ENV... -- ARGS...: exit code and the non-pass findings of one check run
  local label=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local t0=$EPOCHREALTIME
  env "${envs[@]}" timeout 120 "$@" >"$OUT/one.json" 2>"$OUT/one.err"; local rc=$?
  awk -v l="$label" -v rc=$rc -v a=$t0 -v b=$EPOCHREALTIME 'BEGIN{printf "%s: rc=%s in %.1f s\n", l, rc, b-a}'
  $PY -c '
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception:
    print("   stderr:", open(sys.argv[2]).read()[-400:]); raise SystemExit
for f in r.get("findings", []):
    if f["severity"] not in ("pass", "skip"):
        print("  ", f["severity"], f["id"], f["message"][:260])' "$OUT/one.json" "$OUT/one.err"
}
{
verdict "healthy, 1 GPU expected" -- $GD check --expect-gpus 1 --json
verdict "8 GPUs expected" -- $GD check --expect-gpus 8 --json
verdict "CUDA_VISIBLE_DEVICES=1" CUDA_VISIBLE_DEVICES=1 -- $GD check --expect-gpus 1 --json
verdict "CUDA_VISIBLE_DEVICES=GPU-bogus" CUDA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000 -- $GD check --expect-gpus 1 --json
verdict "bad alloc conf" "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:abc,expandable_segments:True" CUDA_LAUNCH_BLOCKING=1 -- $GD check --expect-gpus 1 --json --select allocator
verdict "NCCL_P2P_DISABLE + NCCL_DEBUG=INFO" NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=ib9 -- $GD check --expect-gpus 1 --json --select nccl
verdict "smoke: 2 local ranks, 1 GPU" -- $GD smoke --gpus 2 --json --size small --timeout 90
verdict "smoke: torchrun 2 ranks on 1 GPU" -- $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m gpudoctor smoke --json --size small --timeout 90
verdict "smoke: rank 0 hangs at step 5 (NCCL, GPU)" "GPUDOCTOR_SMOKE_FAULT=rank=0,at=step:5,do=hang" -- $GD smoke --gpus 1 --json --size small --timeout 30
} 2>&1 | tee -a "$LOG"
timeout ${PYTEST_TIMEOUT:-360} $PY -m pytest -q -p no:cacheprovider --worlds tests -k "not slurm" -ra >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -15 "$OUT/pytest.log"
[ "${BENCH:-1}" = 0 ] && exit 0
$PY benchmarks/bench_check.py --runs 11 >"$OUT/bench_check.md" 2>&1; echo "bench rc=$?"; cat "$OUT/bench_check.md"
