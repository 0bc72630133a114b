#!/usr/bin/env bash
# One call on a lent GPU machine (no network there) for issue 28: install gpudoctor without its dependencies (the
# image has what smoke needs), then the default smoke run and --quick twice each (wall time, phases, MFU), the
# matmul instrument against other ways of measuring it, NCCL's real log of a one-rank communicator, a run beside a
# process holding most of the GPU's memory, and a short --soak. Everything lands in $OUT/results.tgz and the log.
#   OUT=/tmp/out bash benchmarks/gpu_session.sh
source benchmarks/gpu_session_setup.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  nproc; } >>"$LOG" 2>&1
for what in "import torch" "import torch, torch._dynamo"; do
  /usr/bin/time -f "$what: wall %e s, user %U s" $PY -c "$what" 2>>"$LOG"
done
tail -2 "$LOG"

smoke() {  # smoke NAME ARGS...: the JSON report to $OUT/r/smoke-NAME.json, wall time to the log, a summary
  local name=$1; shift
  /usr/bin/time -f "$name: wall %e s, max RSS %M KB" $GD smoke --json "$@" >"$OUT/r/smoke-$name.json" 2>>"$LOG"
  echo "smoke $name rc=$?" | tee -a "$LOG"; tail -1 "$LOG"
  $PY - "$OUT/r/smoke-$name.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
r = json.load(open(sys.argv[1]))
m, t = r.get("mfu") or {}, r.get("throughput") or {}
print(f"  ok={r['ok']} wall={r['wall_s']} launch={ {k: r['launch'].get(k) for k in ('ranks_forked', 'ranks_started_s')} } "
      f"model={((r.get('run') or {}).get('model') or {}).get('name')} tokens/s={t.get('tokens_per_s')} "
      f"mfu_spec={m.get('vs_spec')} mfu_matmul={m.get('vs_measured_matmul')} matmul={m.get('measured_matmul_tflops_median')} "
      f"matmul_how={ (m.get('matmul') or {}).get('best_shape') } loss={(r.get('loss') or {}).get('first')}->{(r.get('loss') or {}).get('last')}")
for row in r.get("ranks") or []:
    print(f"  rank {row['rank']} stages={row.get('stage_seconds')}")
print(f"  nccl_transport={r.get('nccl_transport')}")
for f in r.get("findings", []):
    if f.get("severity") != "pass" or f.get("id") in ("GD-SMOKE-025", "GD-SMOKE-026", "GD-SMOKE-021", "GD-SMOKE-023"):
        print("  ", f.get("severity"), f.get("id"), (f.get("message") or "")[:300])
PY
}
smoke default1
grep -q '"ok": true' "$OUT/r/smoke-default1.json" || GPUDOCTOR_SMOKE_NO_FORK=1 smoke default1-nofork
smoke default2
GPUDOCTOR_SMOKE_NO_FORK=1 smoke nofork   # the ranks started as new interpreters, as before issue 28
smoke quick1 --quick
smoke quick2 --quick
timeout 120 $PY benchmarks/matmul_methods.py >"$OUT/r/matmul.jsonl" 2>>"$LOG"; echo "matmul rc=$?" | tee -a "$LOG"
cat "$OUT/r/matmul.jsonl" | cut -c1-600
timeout 60 $PY benchmarks/nccl_log_one_rank.py "$OUT/r/nccl-one-rank.log" >>"$LOG" 2>&1; echo "nccl log rc=$?" | tee -a "$LOG"
grep -c . "$OUT/r/nccl-one-rank.log"; grep -i "using network\|via\|NVLS\|NET/" "$OUT/r/nccl-one-rank.log" | head -8

# Another process holds all but 18 GiB of the GPU (issue 28, item 4): smoke must say so and run what fits.
HOLD=$($PY -c "import torch; f, t = torch.cuda.mem_get_info(); print(max(1, int((f - 18 * 2**30) / 2**30)))")
$PY -c "import torch, time, sys; x = torch.empty($HOLD * 2**30, dtype=torch.uint8, device='cuda'); open('/tmp/held', 'w').write('1'); time.sleep(300)" &
HOLDER=$!
for _ in $(seq 1 100); do [ -s /tmp/held ] && break; sleep 0.2; done
echo "holder pid $HOLDER holds $HOLD GiB" | tee -a "$LOG"
smoke held
kill $HOLDER; wait $HOLDER 2>/dev/null

smoke soak --soak 20
tar czf "$OUT/results.tgz" -C "$OUT" r && ls -la "$OUT"
