#!/usr/bin/env bash
# One call on a lent GPU machine (no network there): install gpudoctor without its dependencies (the
# image has them), record a facts snapshot, run check, the smoke run in a few variants and the check
# benchmark, and the test suite. At most 8 files land in $OUT (the device tool's limit).
#   OUT=/tmp/out bash benchmarks/gpu_session.sh
set -uo pipefail
OUT=${OUT:-/tmp/gd-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
LOG="$OUT/session.log"
$PY -m pip install -q --no-deps --no-build-isolation --no-index --force-reinstall . >"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
GD="$(dirname "$(command -v $PY)")/gpudoctor"
{ nvidia-smi; $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version())"; } >>"$LOG" 2>&1
$GD snapshot -o "$OUT/facts.json"; echo "snapshot rc=$?" | tee -a "$LOG"
$GD check --expect-gpus 1 >>"$LOG" 2>&1; echo "check rc=$?" | tee -a "$LOG"
$GD check --expect-gpus 1 --json >"$OUT/check.json" 2>>"$LOG"; echo "check --json rc=$?" | tee -a "$LOG"

smoke() {  # smoke NAME ARGS...: the JSON report to $OUT/smoke-NAME.json, wall time and RSS to the log
  local name=$1; shift
  /usr/bin/time -f "$name: wall %e s, max RSS %M KB" $GD smoke --gpus 1 --json "$@" >"$OUT/smoke-$name.json" 2>>"$LOG"
  echo "smoke $name rc=$?" | tee -a "$LOG"; tail -1 "$LOG"
  $PY - "$OUT/smoke-$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m, t, s = r.get("mfu") or {}, r.get("throughput") or {}, r.get("step_time_s") or {}
print(f"  ok={r['ok']} wall={r['wall_s']} model={(r.get('run') or {}).get('model', {}).get('name')} tokens/s={t.get('tokens_per_s')} "
      f"p50={s.get('p50')} mfu_spec={m.get('vs_spec')} mfu_matmul={m.get('vs_measured_matmul')} matmul={m.get('measured_matmul_tflops_median')} "
      f"peak_mem={(r.get('memory') or {}).get('peak_bytes_max')} loss={(r.get('loss') or {}).get('first')}->{(r.get('loss') or {}).get('last')}")
for row in r.get("ranks") or []:  # issue 17: the parts, their cost, and what NVML said
    stages = row.get("stage_seconds") or {}
    parts = {k: row.get(k) for k in ("matmul_tflops", "ffn_gemm_tflops", "memory_copy_gbps", "h2d_gbps", "d2h_gbps")}
    print(f"  rank {row['rank']} parts={parts} part_benchmarks_s={stages.get('part benchmarks')} "
          f"condition={json.dumps(row.get('condition'))[:400]}")
print(f"  expectations_below={(r.get('expectations') or {}).get('below')} exclude={r.get('exclude')}")
for f in r.get("findings", []):
    if f.get("severity") != "pass":
        print("  ", f.get("severity"), f.get("id"), (f.get("message") or "")[:300])
PY
}
smoke large
smoke medium --size medium
smoke compile --compile
smoke baseline --save-baseline "$OUT/baseline-h.json"   # issue 17: a known-good node's figures
$PY benchmarks/bench_check.py --runs 5 >"$OUT/bench_check.md" 2>&1; echo "bench rc=$?"; cat "$OUT/bench_check.md"
timeout 240 $PY -P -m pytest -q -p no:cacheprovider --continue-on-collection-errors tests -k "not slurm" >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -25 "$OUT/pytest.log"
