# Sourced by benchmarks/gpu_session.sh and gpu_session_2.sh (run from the repository root on a lent GPU machine, no
# network there): $OUT/r for results, $LOG, $PY, and $GD, the gpudoctor installed from this tree without its
# dependencies (the image has what smoke needs).
set -uo pipefail
OUT=${OUT:-/tmp/gd-out}; mkdir -p "$OUT/r"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
LOG="$OUT/session.log"
$PY -m pip install -q --no-deps --no-build-isolation --no-index --force-reinstall . >"$LOG" 2>&1 || { cat "$LOG"; exit 1; }
GD="$(dirname "$(command -v $PY)")/gpudoctor"
