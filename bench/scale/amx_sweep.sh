#!/usr/bin/env bash
# A sweep of the AMX bf16 GEMM's tuning switches (issue 21) on a CPU with AMX: for each configuration
# (the tile variant CTRL_AMX_TILE and the blocking CTRL_AMX_BLOCKS="kc,mc,nc", kernels/cpu/gemm_bf16.c)
# the twelve projections of the 0.5B shape, ctrl's AMX path against torch's bf16 matmul (oneDNN),
# interleaved, median of ROUNDS, one thread (bench/scale/bench_gemm.py --check --no-sgemm
# --no-avx512), each shape's product also checked against fp64 on the bf16-rounded inputs (a wrong
# kernel prints FAIL and the configuration is marked FAIL). First the eight tile variants on the
# default blocking, then a dozen blockings on the best variant (by the geometric mean of ctrl / torch);
# the products as the model runs them (--model) on the default configuration first, and on the best
# one at the end.
# Last, a summary: per configuration the worst and the geometric mean of ctrl / torch, and per shape
# the best configuration.
# Run after bench/gpu.sh has built $BUILD (default build-gpu), from anywhere:
#   bash bench/scale/amx_sweep.sh
# CONFIGS="tile:kc,mc,nc ..." replaces the two lists below; ROUNDS (3), TOKENS (1024), BUDGET_S (150: no
# configuration starts past it), PYTHON (python3), SWEEP_LOG (where the raw lines go).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-gpu}
export BUILD
PY=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
TOKENS=${TOKENS:-1024}
BUDGET=${BUDGET_S:-150}
LOG=${SWEEP_LOG:-$BUILD/amx_sweep.log}
# the Debian libraries bench/gpu.sh unpacked for the build, where it did
A=/opt/ctrl-deps/usr/lib/x86_64-linux-gnu
[ -d $A ] && export LD_LIBRARY_PATH=$A:$A/openblas-openmp:${LD_LIBRARY_PATH:-}
export OMP_WAIT_POLICY=PASSIVE
# one configuration: its twelve rows, printed and kept in $LOG (each line prefixed with it)
config() {
  local c=$1 t=${1%%:*} b=${1#*:}
  if [ "$SECONDS" -ge "$BUDGET" ]; then echo "skipped (budget ${BUDGET}s): $c"; return 1; fi
  echo "=== config $c (tile $t, blocks $b; ${SECONDS}s)"
  CTRL_AMX_TILE=$t CTRL_AMX_BLOCKS=$b timeout 60 "$PY" bench/scale/bench_gemm.py --tokens "$TOKENS" \
    --rounds "$ROUNDS" --threads 1 --no-sgemm --no-avx512 --check 2>&1 | sed "s|^|$c |" | tee -a "$LOG" |
    cut -d' ' -f2-
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || echo "$c FAILED (exit $rc)" | tee -a "$LOG"
}
# the configuration with the best geometric mean of ctrl / torch so far among those whose check passed
best() {
  "$PY" - "$LOG" <<'PYEOF'
import collections, math, re, sys
rows, bad = collections.defaultdict(list), set()
for line in open(sys.argv[1]):
    cfg, _, rest = line.partition(" ")
    m = re.match(r"\S+ \S+\s+\d+\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)x", rest)
    if m:
        rows[cfg].append(float(m.group(1)))
    if "FAIL" in rest:
        bad.add(cfg)
ok = [(math.exp(sum(map(math.log, v)) / len(v)), c) for c, v in rows.items() if c not in bad and len(v) == 12]
print(max(ok)[1] if ok else "0:512,256,8192")
PYEOF
}
# the products as the model runs them (bench_gemm.py --model) on one configuration
model() {
  echo "=== as the model runs them ($1; ${SECONDS}s)"
  CTRL_AMX_TILE=${1%%:*} CTRL_AMX_BLOCKS=${1#*:} timeout 60 "$PY" bench/scale/bench_gemm.py --tokens "$TOKENS" \
    --rounds "$ROUNDS" --threads 1 --no-sgemm --no-avx512 --model
}
DEFAULT="0:512,256,8192"
: >"$LOG"
[ -n "${CONFIGS:-}" ] || model "$DEFAULT"
if [ -n "${CONFIGS:-}" ]; then
  for c in $CONFIGS; do config "$c"; done
else
  # 1. the tile variants on the default blocking; 2. the blocking on the best variant
  for t in 0 1 2 3 4 5 6 7; do config "$t:512,256,8192"; done
  T=$(best)
  T=${T%%:*}
  echo "=== best tile variant so far: $T"
  for b in 1024,256,8192 1024,128,8192 256,256,8192 512,128,8192 512,512,8192 1024,512,8192 1024,1024,8192 \
    512,256,1024 1024,256,1024 1024,128,512 2432,128,8192 256,64,2048; do
    config "$T:$b"
  done
fi
B=$(best)
if [ "$B" != "$DEFAULT" ] && [ "$SECONDS" -lt "$BUDGET" ]; then model "$B"; fi
echo "=== summary (${SECONDS}s): ctrl / torch per configuration, then the best configuration per shape"
"$PY" - "$LOG" <<'PYEOF'
import collections, math, re, sys
rows = collections.defaultdict(dict)  # config -> shape -> ratio
bad = set()
for line in open(sys.argv[1]):
    cfg, _, rest = line.partition(" ")
    m = re.match(r"(\S+ \S+)\s+\d+\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)x", rest)
    if m:
        rows[cfg][m.group(1)] = float(m.group(2))
    if "FAIL" in rest:
        bad.add(cfg)
for cfg, r in rows.items():
    v = list(r.values())
    print(f"{cfg:18s} min {min(v):.2f}x  geomean {math.exp(sum(map(math.log, v)) / len(v)):.3f}x  "
          f"shapes >= 0.9x: {sum(x >= 0.9 for x in v)}/{len(v)}  check {'FAIL' if cfg in bad else 'ok'}")
shapes = list(next(iter(rows.values())).keys()) if rows else []
for s in shapes:
    best = max((r[s], c) for c, r in rows.items() if s in r and c not in bad)
    print(f"best {s:18s} {best[0]:.2f}x  {best[1]}")
PYEOF
