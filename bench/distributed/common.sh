# Shared by the distributed benches (sourced, after `set -euo pipefail` and BUILD=...): C (ctrl with
# the build's plugins), TMP (removed on exit), MPI (2 ranks, 1 OpenMP thread each, no binding: other
# work shares the cores), $TMP/data (the quickstart's arithmetic SFT data), and:
#   qwen_model OUT LAYERS: a random Qwen2.5-0.5B-shaped model (hidden 896, 14 heads, 2 KV heads,
#     intermediate 4864; LAYERS of its 24, the tiny test tokenizer's vocabulary, so that it fits
#     beside other work) in OUT;
#   qwen_vocab_model OUT LAYERS TOKENIZER: the same shape with the tokenizer's real vocabulary
#     (151,936 rows for Qwen's, tied to the LM head as Qwen2.5-0.5B's);
#   machine: the "machine: ..." line (CPU, cores, memory, the time);
#   rank_env VAR[=VALUE]...: ENV, mpirun's -x list for each rank (OMP_NUM_THREADS, a copied build's
#     LD_LIBRARY_PATH, and the VARs);
#   sft_ini FILE MODEL STEPS BATCH [LINE...]: a CPU SFT run of STEPS steps at BATCH per device, the
#     output in $TMP/run, the LINEs added to [data] (e.g. "packing = true");
#   timed OUT_LOG COMMAND...: runs it under /usr/bin/time, each process appending a line
#     "rank-time USER_S SYSTEM_S PEAK_RSS_KB MINOR_FAULTS" to OUT_LOG with its own output;
#   cpu_times LOG / peak_rss LOG: those columns, one line per process;
#   ranks_rss LOG / ranks_cpu LOG STEPS: the same on one line, "a / b MiB" and CPU seconds a step;
#   seconds_since T0: wall seconds since T0 (from `date +%s.%N`);
#   last DIR KEY: KEY of DIR's last metrics.jsonl line;
#   load: the load average now (1, 5, 15 minutes).
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
C=("$BUILD/ctrl" --plugin-dir "$BUILD/plugins")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
MPI=(mpirun -np 2 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
[ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
bash "$SRC/scripts/make_quickstart_data.sh" "$TMP/data" 3 >/dev/null
qwen_model() {
  "${C[@]}" model init --arch qwen2 --hidden 896 --layers "$2" --heads 14 --kv-heads 2 --intermediate 4864 \
    --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$1" >/dev/null
}
qwen_vocab_model() {
  "${C[@]}" model init --arch qwen2 --hidden 896 --layers "$2" --heads 14 --kv-heads 2 --intermediate 4864 \
    --vocab 151936 --tie-embeddings --tokenizer "$3" --out "$1" >/dev/null
}
machine() {
  echo "machine: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(getconf _NPROCESSORS_ONLN) cores, $(free -g | awk '/^Mem:/ { print $2 }') GiB; $(date -u '+%Y-%m-%d %H:%M UTC')"
}
rank_env() {
  ENV=(-x OMP_NUM_THREADS)
  [ -n "${LD_LIBRARY_PATH:-}" ] && ENV+=(-x LD_LIBRARY_PATH)
  local v
  for v in "$@"; do ENV+=(-x "$v"); done
}
sft_ini() {
  local f=$1 model=$2 steps=$3 batch=$4
  shift 4
  {
    printf '[run]\noutput_dir = %s\ndevice = cpu\n[model]\npath = %s\n' "$TMP/run" "$model"
    printf '[data]\ntrain_file = %s\n' "$TMP/data/train.jsonl"
    [ $# -gt 0 ] && printf '%s\n' "$@"
    printf '[train]\nlearning_rate = 1e-4\nmax_steps = %s\nper_device_train_batch_size = %s\n' "$steps" "$batch"
    printf 'logging_steps = 1\nsave_strategy = no\ndtype = fp32\n'
  } >"$f"
}
timed() {
  local log=$1
  shift
  local cmd=() a
  for a in "$@"; do
    [ "$a" = "${C[0]}" ] && cmd+=(/usr/bin/time -a -o "$log" -f "rank-time %U %S %M %R")
    cmd+=("$a")
  done
  "${cmd[@]}" >>"$log" 2>&1
}
cpu_times() { awk '/^rank-time/ { printf "%.1f\n", $2 + $3 }' "$1"; }
peak_rss() { awk '/^rank-time/ { printf "%.0f\n", $4 / 1024 }' "$1"; }
last() { tail -1 "$1/metrics.jsonl" | sed "s/.*\"$2\": \([-0-9.e]*\).*/\1/"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
ranks_rss() { peak_rss "$1" | awk '{ printf "%s%s MiB", (NR > 1 ? " / " : ""), $1 }'; }
ranks_cpu() { cpu_times "$1" | awk -v s="$2" '{ printf "%s%.1f", (NR > 1 ? " / " : ""), $1 / s }'; }
seconds_since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.1f", t1 - t0 }'; }
