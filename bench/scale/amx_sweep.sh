#!/usr/bin/env bash
# A sweep of the AMX bf16 GEMM's tuning switches (issue 21) on a CPU with AMX: for each configuration
# (the tile variant CTRL_AMX_TILE and the blocking CTRL_AMX_BLOCKS="kc,mc,nc", kernels/cpu/gemm_bf16.c)
# the twelve projections of the 0.5B shape, ctrl's AMX path against torch's bf16 matmul (oneDNN),
# interleaved, median of ROUNDS, one thread (bench/scale/bench_gemm.py --check --no-sgemm
# --no-avx512), each shape's product also checked against fp64 on the bf16-rounded inputs (a wrong
# kernel prints FAIL and the configuration is marked FAIL). Then, on the default configuration, the
# products as the model runs them (--model). Last, a summary: per configuration the worst and the
# geometric mean of ctrl / torch, and per shape the best configuration.
# Run after bench/gpu.sh has built $BUILD (default build-gpu), from anywhere:
#   bash bench/scale/amx_sweep.sh
# CONFIGS="tile:kc,mc,nc ..." replaces the list below; ROUNDS (3), TOKENS (1024), BUDGET_S (150: no
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
DEFAULT="0:512,256,8192"
CONFIGS=${CONFIGS:-"$DEFAULT 1:512,256,8192 2:512,256,8192 3:512,256,8192
 1:1024,256,8192 3:1024,256,8192 1:1024,128,8192 3:1024,128,8192 1:256,256,8192 3:256,256,8192
 1:512,512,8192 3:512,512,8192 1:512,1024,8192 1:1024,1024,8192 1:512,256,1024 3:512,256,1024
 1:1024,256,1024 3:1024,256,1024 1:1024,128,512 3:1024,512,1024"}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 flags /proc/cpuinfo |
  tr ' ' '\n' | grep -E '^(avx512_bf16|amx_bf16|amx_tile)$' | tr '\n' ' '); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$LOG"
for c in $CONFIGS; do
  if [ "$SECONDS" -ge "$BUDGET" ]; then echo "skipped (budget ${BUDGET}s): $c"; continue; fi
  t=${c%%:*} b=${c#*:}
  echo "=== config $c (tile $t, blocks $b; ${SECONDS}s)"
  CTRL_AMX_TILE=$t CTRL_AMX_BLOCKS=$b timeout 60 "$PY" bench/scale/bench_gemm.py --tokens "$TOKENS" \
    --rounds "$ROUNDS" --threads 1 --no-sgemm --no-avx512 --check 2>&1 | sed "s|^|$c |" | tee -a "$LOG" |
    cut -d' ' -f2-
  [ "${PIPESTATUS[0]}" -eq 0 ] || echo "$c FAILED (exit ${PIPESTATUS[0]})" | tee -a "$LOG"
done
if [ "$SECONDS" -lt "$BUDGET" ]; then
  echo "=== as the model runs them (default configuration; ${SECONDS}s)"
  timeout 60 "$PY" bench/scale/bench_gemm.py --tokens "$TOKENS" --rounds "$ROUNDS" --threads 1 --no-sgemm \
    --no-avx512 --model
fi
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
