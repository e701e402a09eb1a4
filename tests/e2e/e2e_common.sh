# Shared by the shell tests (sourced): arguments CTRL_BINARY PLUGIN_DIR SOURCE_DIR, a temporary
# directory removed on exit, pass/fail counters, and a tiny model with synthetic data.
set -u
CTRL=$1
PLUGINS=$2
SRC=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
C=("$CTRL" --plugin-dir "$PLUGINS")

# tiny_setup SEED LAYERS: $TMP/data/{train,eval}.jsonl (arithmetic) and a random $TMP/model (hidden 32)
tiny_setup() {
  bash "$SRC/scripts/make_quickstart_data.sh" "$TMP/data" "$1" >/dev/null
  "${C[@]}" model init --arch qwen2 --hidden 32 --layers "$2" --heads 2 \
    --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/model" >/dev/null || bad "model init"
}

# tiny_teacher: a random $TMP/teacher (hidden 48, one layer) of tiny_setup's tokenizer, for gkd
tiny_teacher() {
  "${C[@]}" model init --arch qwen2 --hidden 48 --layers 1 --heads 2 --seed 9 \
    --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/teacher" >/dev/null || bad "teacher init"
}

# free_port: a TCP port for a test's server, below Linux's ephemeral range (32768-60999, where any
# concurrent test's outgoing connection may take a port first: a server then failed to bind and its
# client waited out its timeout) and with nothing listening on it now.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 12000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  echo "$p"
}

# server_greedy_same PORT MODEL N WHAT [BASE]: the `ctrl serve` on PORT completes "12+7=" greedily (N tokens)
# as `ctrl generate` does with the saved MODEL (the server has the trained weights); WHAT names the run.
# With BASE, MODEL is a saved adapter, applied over BASE.
server_greedy_same() {
  local port=$1 model=$2 n=$3 what=$4 local_ids server_ids
  local which=(--model "$model") && [ -n "${5:-}" ] && which=(--model "$5" --adapter "$model")
  echo '{"prompt": "12+7="}' >"$TMP/p.jsonl"
  "${C[@]}" generate "${which[@]}" --prompts "$TMP/p.jsonl" --temperature 0 --max-tokens "$n" \
    --out "$TMP/local.jsonl" >/dev/null 2>&1
  local_ids=$(sed 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/' "$TMP/local.jsonl")
  server_ids=$(curl -s -X POST "localhost:$port/generate" \
    -d '{"prompts": ["12+7="], "temperature": 0, "max_tokens": '"$n"'}' |
    sed 's/.*"completion_ids":\[\[\([0-9,]*\)\]\].*/\1/')
  [ -n "$local_ids" ] && [ "$local_ids" = "$server_ids" ] && ok ||
    bad "$what: the server generates '$server_ids', the saved model '$local_ids'"
}

# The MPI tests: skips (exit 77) without mpirun or libctrl_mpi.so; MPI=(mpirun -np 2 ...) and one
# OpenMP thread per rank. OpenMPI refuses root without --allow-run-as-root (CI containers run as
# root); no binding (2 ranks beside other tests on a small machine); no CMA single copy (blocked
# by containers' ptrace rules).
mpi_setup() {
  LIBDIR=$(dirname "$CTRL")
  if ! command -v mpirun >/dev/null; then echo "SKIP: mpirun not found (scripts/install-deps.sh installs OpenMPI)"; exit 77; fi
  if [ ! -e "$LIBDIR/libctrl_mpi.so" ]; then echo "SKIP: ctrl was built without MPI (no libctrl_mpi.so)"; exit 77; fi
  export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
  # OpenMPI's session directories in this test's own $TMP, not one /tmp/ompi.* tree shared by the
  # MPI tests ctest runs at the same time (a clean-clone CI run once failed test_mpi's stalled-rank
  # case with "orte_session_dir failed" while test_zero_mpi started).
  export TMPDIR="$TMP"
  MPI=(mpirun -np 2 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
  if [ "$(id -u)" = 0 ]; then MPI+=(--allow-run-as-root); fi
}

# The MPI tests on CUDA under the emulator (usage: ... EMU_LIBCTRL_CUDA EMU_LIBCTRL_MPI as $4 $5):
# mpi_setup, each rank its own emulated device, the emulated runtime and libctrl_mpi.so passed on;
# mpi_train NAME ARGS...: a 2-rank `ctrl train $TMP/run.ini` into $TMP/NAME (log $TMP/NAME.log).
cuda_emu_mpi_setup() {
  mpi_setup
  export CTRL_CUDA_LIBRARY=$1 CTRL_MPI_LIBRARY=$2 CTRL_EMU_DEVICES=2
  MPI+=(-x CTRL_CUDA_LIBRARY -x CTRL_MPI_LIBRARY -x CTRL_EMU_DEVICES -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
}
mpi_train() {
  local name=$1 && shift
  "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$name" "$@" >"$TMP/$name.log" 2>&1 ||
    { bad "$name: exited $?"; tail -20 "$TMP/$name.log"; }
}

# Training curves: column KEY of every metrics.jsonl line of DIR (curve_col DIR KEY), and two runs'
# columns equal line by line within TOLERANCE relative (+ ABSOLUTE, 1e-12 unless given) over at
# least 6 lines (CURVE_MIN=N: N) (curve_close DIR_A DIR_B KEY TOLERANCE [ABSOLUTE]; ok or bad, both
# printed on bad).
curve_col() { grep -o "\"$2\": [-0-9.e]*" "$1/metrics.jsonl" | sed 's/.*: //'; }
curve_close() {
  local n
  n=$(paste <(curve_col "$1" "$3") <(curve_col "$2" "$3") |
    awk -v tol="$4" -v abs="${5:-1e-12}" -v min="${CURVE_MIN:-6}" '{ d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1
         if (d > tol * m + abs) bad++; n++ }
         END { print (n >= min && !bad) ? "ok" : n " lines, " bad+0 " differ" }')
  [ "$n" = ok ] && ok || { bad "$1 vs $2: $3 differs ($n)"; paste <(curve_col "$1" "$3") <(curve_col "$2" "$3"); }
}

# [INI_DEVICE=cuda] tiny_ini FILE OUTPUT_DIR [RUN_LINE...] <<INI ... INI: a run on tiny_setup's model and
# data, on the CPU (or INI_DEVICE): [run] (output_dir, device, then RUN_LINEs such as "seed = 11"),
# [model], [data] and the [train] header; standard input follows it ([train]'s keys, then any other section).
tiny_ini() {
  local f=$1 out=$2
  shift 2
  {
    printf '[run]\noutput_dir = %s\ndevice = %s\n' "$out" "${INI_DEVICE:-cpu}"
    [ $# -gt 0 ] && printf '%s\n' "$@"
    printf '[model]\npath = %s\n[data]\ntrain_file = %s\n[train]\n' "$TMP/model" "$TMP/data/train.jsonl"
    cat
  } >"$f"
}

# cuda_run_ini FILE [LINE...]: tiny_ini's run on CUDA (output $TMP/dp): 6 steps of 2 rows at lr 3e-3
# (weight decay 0.1, clipping at 0.5), fp32, a log line every step and a checkpoint every 3, then the
# LINEs (other sections).
cuda_run_ini() {
  local f=$1
  shift
  printf 'learning_rate = 3e-3\nmax_steps = 6\nper_device_train_batch_size = 2\nlogging_steps = 1\nsave_steps = 3\nweight_decay = 0.1\nmax_grad_norm = 0.5\ndtype = fp32\n' |
    INI_DEVICE=cuda tiny_ini "$f" "$TMP/dp"
  if [ $# -gt 0 ]; then printf '%s\n' "$@" >>"$f"; fi
}

# zero3_ini FILE MODEL: the ZeRO-3 MPI tests' run of MODEL on make_quickstart_data.sh's rows in
# $TMP/data, on the CPU (output $TMP/dp): 6 steps of 2 rows x 2 accumulation at lr 3e-3 (2 warm-up
# steps, weight decay 0.1, clipping at 0.5), fp32, a log line every step and a checkpoint every 3.
zero3_ini() {
  printf '[run]\noutput_dir = %s\ndevice = cpu\n[model]\npath = %s\n[data]\ntrain_file = %s\n[train]\n' \
    "$TMP/dp" "$2" "$TMP/data/train.jsonl" >"$1"
  printf 'learning_rate = 3e-3\nwarmup_steps = 2\nmax_steps = 6\nper_device_train_batch_size = 2\n' >>"$1"
  printf 'gradient_accumulation_steps = 2\nlogging_steps = 1\nsave_steps = 3\nweight_decay = 0.1\n' >>"$1"
  printf 'max_grad_norm = 0.5\ndtype = fp32\n' >>"$1"
}

# online_ini TRAINER OUT STEPS [LINE...]: prints the INI of an online or distillation run on
# tiny_setup's model and data, on the CPU: [run] TRAINER, seed 3, output $TMP/OUT; [model] then
# INI_MODEL's lines (a [teacher] section); [data] the prompt files (INI_DATA=rows: the
# prompt-completion rows) then INI_DATA_EXTRA; [train] STEPS at lr 3e-3 constant, INI_BATCH (4)
# prompts x 2 accumulation (INI_TRAIN's lines between the two), a log line every INI_LOG (1)
# steps, then INI_SAVE (no checkpoints); [generation] an 8 MB KV pool then INI_GEN; the length
# reward [reward.len] with target INI_TARGET (8; set empty: no reward); then the LINEs (the
# trainer's section and its options, other sections).
online_ini() {
  local trainer=$1 out=$2 steps=$3 train=train_prompts eval=eval_prompts
  shift 3
  [ "${INI_DATA:-prompts}" = rows ] && train=train eval=eval
  # the evaluations: the first INI_EVAL_ROWS rows of the eval set (16; 0: all 250 -- 1,000 completions
  # an evaluation, ~25 s under the CUDA emulator, and no test reads more than their presence or a
  # comparison between two runs)
  local rows=${INI_EVAL_ROWS:-16}
  if [ "$rows" != 0 ]; then
    [ -f "$TMP/data/$eval$rows.jsonl" ] || head -"$rows" "$TMP/data/$eval.jsonl" >"$TMP/data/$eval$rows.jsonl"
    eval=$eval$rows
  fi
  printf '[run]\ntrainer = %s\noutput_dir = %s\nseed = 3\ndevice = cpu\n[model]\npath = %s\n' "$trainer" "$TMP/$out" "$TMP/model"
  ini_lines "${INI_MODEL:-}"
  printf '[data]\ntrain_file = %s\neval_file = %s\n' "$TMP/data/$train.jsonl" "$TMP/data/$eval.jsonl"
  ini_lines "${INI_DATA_EXTRA:-}"
  printf '[train]\nlearning_rate = 3e-3\nlr_scheduler_type = constant\nmax_steps = %s\n' "$steps"
  printf 'per_device_train_batch_size = %s\n' "${INI_BATCH:-4}"
  ini_lines "${INI_TRAIN:-}"
  printf 'gradient_accumulation_steps = 2\nlogging_steps = %s\n' "${INI_LOG:-1}"
  ini_lines "${INI_SAVE:-save_strategy = no}"
  printf '[generation]\nkv_cache_bytes = 8000000\n'
  ini_lines "${INI_GEN:-}"
  [ -z "${INI_TARGET-8}" ] || printf '[reward.len]\nplugin = length\ntarget_length = %s\n' "${INI_TARGET-8}"
  [ $# -eq 0 ] || printf '%s\n' "$@"
}
# ini_lines TEXT: TEXT and a newline, nothing when TEXT is empty
ini_lines() { [ -z "$1" ] || printf '%s\n' "$1"; }

# The evaluation split over the ranks (test_eval_ranks_mpi.sh, test_eval_online_mpi.sh):
# same_evals A B LINES: the eval lines of $TMP/A and $TMP/B (LINES of them) hold the same keys in the
# same order, the values within 1e-6 relative (+ 1e-9)
same_evals() {
  local r
  evals() { grep '"eval_' "$TMP/$1/metrics.jsonl" | tr -d '{}' | tr ',' '\n'; }
  r=$(paste -d'|' <(evals "$1") <(evals "$2") | awk -F'|' -v want="$3" '
      { split($1, x, ": "); split($2, y, ": "); n++
        if (x[1] != y[1]) { bad++; next }
        if (x[1] ~ /"step"/) lines++
        d = x[2] - y[2]; if (d < 0) d = -d; m = x[2] < 0 ? -x[2] : x[2]
        if (d > 1e-6 * m + 1e-9) bad++
        if (x[2] != y[2]) differ++ }
      END { if (bad || lines != want) print "FAIL: " bad + 0 " of " n " values differ, " lines + 0 " lines"
            else print "ok: " n " values, " differ + 0 " not printed identically" }')
  echo "  $1 vs $2: $r"
  case $r in ok*) ok ;; *) bad "$1 vs $2: the evaluations differ"; paste <(evals "$1") <(evals "$2") | head -40 ;; esac
}
# eval_split NAME MINE ALL: each of NAME's 2 evaluations logged rank 0's share, MINE of ALL batches (ALL summed
# over the ranks: a rank evaluating every batch, or one counted twice, shows)
eval_split() {
  [ "$(grep -c "eval: .*; rank 0 evaluated $2 of the $3 batches of 2 ranks)" "$TMP/$1.log")" = 2 ] && ok ||
    bad "$1: not rank 0's share $2 of $3 batches: $(grep 'eval: ' "$TMP/$1.log" | head -2)"
}
# run1 NAME COMMAND...: COMMAND, its output in $TMP/NAME.log
run1() {
  local name=$1 && shift
  "$@" >"$TMP/$name.log" 2>&1 && ok || { bad "$name: exited $?"; tail -5 "$TMP/$name.log"; }
}

# Prints the counts and exits non-zero when anything failed.
finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
