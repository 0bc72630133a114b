#!/usr/bin/env bash
# The second call of issue 28's GPU session (after benchmarks/gpu_session.sh): the default run and --quick again
# after their time cuts (torch._dynamo imported beside the first phases, no straggler probe on one rank, --quick
# without torch.optim), and the matmul methods with 4096^3 measured again at the end.
#   OUT=/tmp/out bash benchmarks/gpu_session_2.sh
source benchmarks/gpu_session_setup.sh
/usr/bin/time -f "gpudoctor --version: wall %e s" $GD --version 2>>"$LOG"
run() {  # run NAME ARGS...
  local name=$1; shift
  /usr/bin/time -f "$name: wall %e s" $GD smoke --json "$@" >"$OUT/r/smoke-$name.json" 2>>"$LOG"
  echo "smoke $name rc=$?" >>"$LOG"
  $PY - "$OUT/r/smoke-$name.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
r = json.load(open(sys.argv[1]))
m = r.get("mfu") or {}
bad = [(f["severity"], f["id"], f["message"][:200]) for f in r["findings"] if f["severity"] in ("warn", "fail", "error")]
print(sys.argv[1].rsplit("/", 1)[1], "ok", r["ok"], "wall", r["wall_s"], "started", r["launch"].get("ranks_started_s"),
      "mfu", m.get("vs_spec"), "matmul", m.get("measured_matmul_tflops_median"), (m.get("matmul") or {}).get("best_shape"),
      "optimizer", (r.get("run") or {}).get("optimizer"), "loss", (r.get("loss") or {}).get("first"), (r.get("loss") or {}).get("last"), bad)
print("  stages", (r.get("ranks") or [{}])[0].get("stage_seconds"))
PY
}
for name in ${RUNS:-default1 default2 quick1 quick2}; do  # RUNS="default1 quick1": fewer
  case $name in quick*) run "$name" --quick ;; *) run "$name" ;; esac
done
grep "wall" "$LOG"
[ "${MATMUL:-1}" = 1 ] || exit 0
timeout 100 $PY benchmarks/matmul_methods.py >"$OUT/r/matmul.jsonl" 2>>"$LOG"; echo "matmul rc=$?"; cut -c1-400 "$OUT/r/matmul.jsonl"
