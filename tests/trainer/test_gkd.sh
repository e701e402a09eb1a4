#!/usr/bin/env bash
# The gkd trainer end to end (the distill kind, a [teacher] model, colocated generation): the
# student's divergence from a teacher falls with on-policy sampling (lmbda), seq_kd samples from the
# teacher, forward / reverse KL and a bf16 teacher run, TRL's metric names are logged, and bad
# settings are refused naming the key. usage: test_gkd.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/../e2e/e2e_common.sh"
tiny_setup 5 1
tiny_teacher

# gkd_ini OUT STEPS [extra lines...]
gkd_ini() {
  local out=$1 steps=$2
  shift 2
  INI_DATA=rows INI_TARGET= INI_BATCH=8 INI_LOG=5 INI_MODEL=$'[teacher]\npath = '"$TMP/teacher" \
    INI_TRAIN="per_device_eval_batch_size = 64" INI_SAVE=$'eval_steps = 1000\nsave_strategy = no' \
    online_ini gkd "$out" "$steps" "$@"
}
# first / last eval_loss of a metrics file
eval_loss() { grep -o '"eval_loss": [0-9.e+-]*' "$1" | sed -n "$2" | cut -d' ' -f2; }

# 1. On-policy GKD learns: the held-out divergence falls; TRL's and the kind's metrics are there.
gkd_ini on 30 "[gkd]" "lmbda = 0.5" "max_new_tokens = 6" >"$TMP/on.ini"
if "${C[@]}" train "$TMP/on.ini" >"$TMP/on.log" 2>&1; then ok; else bad "gkd run"; tail -5 "$TMP/on.log"; fi
M=$TMP/on/metrics.jsonl
for k in loss grad_norm learning_rate num_tokens on_policy timing/generation_s timing/teacher_s timing/train_s \
  eval_loss eval_exact_match eval_mean_token_accuracy eval_teacher_exact_match; do
  grep -q "\"$k\": " "$M" && ok || bad "metric $k missing from $M"
done
a=$(eval_loss "$M" 1p) b=$(eval_loss "$M" '$p')
awk -v a="$a" -v b="$b" 'BEGIN { exit !(b < 0.8 * a) }' && ok || bad "gkd did not learn: eval_loss $a -> $b"
echo "gkd held-out divergence: $a -> $b"

# 2. seq_kd (teacher-sampled completions), forward and reverse KL on the dataset's, a bf16 teacher.
for v in "seqkd:lmbda = 0|seq_kd = true" "fkl:lmbda = 0|beta = 0" "rkl:lmbda = 0|beta = 1" "bf16:lmbda = 0"; do
  name=${v%%:*} opts=${v#*:}
  extra=()
  [ "$name" = bf16 ] && extra=(--set teacher.dtype=bf16)
  gkd_ini "$name" 4 "[gkd]" "max_new_tokens = 4" "${opts%%|*}" "$([ "${opts#*|}" != "$opts" ] && echo "${opts#*|}")" \
    >"$TMP/$name.ini"
  if "${C[@]}" train "$TMP/$name.ini" "${extra[@]}" >"$TMP/$name.log" 2>&1; then ok; else
    bad "gkd $name run"
    tail -3 "$TMP/$name.log"
  fi
done

# Resuming from checkpoint-2 reproduces steps 3 and 4 of an uninterrupted on-policy run.
metric() { # FILE STEP NAME
  awk -v s="$2" -v k="\"$3\": " 'index($0, "{\"step\": " s ",") == 1 && index($0, k) {
    v = substr($0, index($0, k) + length(k)); sub(/[,}].*/, "", v); print v; exit }' "$1"
}
gkd_ini full 4 "[gkd]" "max_new_tokens = 4" | sed 's/^save_strategy = no/save_steps = 2/; s/^logging_steps = 5/logging_steps = 1/' \
  >"$TMP/full.ini"
sed "s|$TMP/full|$TMP/part|; s/^max_steps = 4/max_steps = 2/" "$TMP/full.ini" >"$TMP/part.ini"
sed 's/^max_steps = 2$/max_steps = 4/' "$TMP/part.ini" >"$TMP/resume.ini"
"${C[@]}" train "$TMP/full.ini" >/dev/null 2>&1 && ok || bad "full run"
"${C[@]}" train "$TMP/part.ini" >/dev/null 2>&1 && ok || bad "partial run"
"${C[@]}" train "$TMP/resume.ini" --set train.resume_from_checkpoint=last >"$TMP/resume.log" 2>&1 && ok ||
  { bad "resume"; tail -3 "$TMP/resume.log"; }
for s in 3 4; do
  a=$(metric "$TMP/full/metrics.jsonl" $s loss) b=$(metric "$TMP/part/metrics.jsonl" $s loss)
  [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "step $s loss after resume: $b, uninterrupted $a"
done

# LoRA on the student (its head frozen: the divergence's gradient stops at the hidden states) with
# activation checkpointing, on-policy, the engine asleep between generations.
INI_GEN="sleep = 1" gkd_ini lora 3 "[gkd]" "max_new_tokens = 4" "lmbda = 1" "[peft]" "enabled = true" "[memory]" \
  "strategies = checkpointing" >"$TMP/lora.ini"
if "${C[@]}" train "$TMP/lora.ini" >"$TMP/lora.log" 2>&1; then ok; else bad "gkd lora run"; tail -3 "$TMP/lora.log"; fi
grep -q "LoRA adapter" "$TMP/lora.log" && ok || bad "gkd lora saved no adapter"

# The teacher and the divergence head on the CUDA backend (the emulator where it is built; lmbda = 0 here:
# sampling on the device is test_cuda_online's) give the CPU run's losses and gradient norms (in fp32: in bf16
# the backends round different products -- attention on CUDA, the head where the CPU has AVX-512 BF16).
EMU=$(dirname "$CTRL")/cuda-emu/libctrl_cuda.so
if [ -f "$EMU" ] && [ -f "$(dirname "$CTRL")/plugins-emu/gkd.so" ]; then
  gkd_ini dev_cpu 3 "[gkd]" "lmbda = 0" "beta = 0.3" | sed 's/^logging_steps = 5/logging_steps = 1/' >"$TMP/dev_cpu.ini"
  sed "s|$TMP/dev_cpu|$TMP/dev_cuda|; s/^device = cpu/device = cuda/" "$TMP/dev_cpu.ini" >"$TMP/dev_cuda.ini"
  "${C[@]}" train "$TMP/dev_cpu.ini" --set train.dtype=fp32 >/dev/null 2>&1 && ok || bad "cpu run"
  if CTRL_CUDA_LIBRARY=$EMU "$CTRL" --plugin-dir "$(dirname "$CTRL")/plugins-emu" train "$TMP/dev_cuda.ini" \
    --set train.dtype=fp32 >"$TMP/dev_cuda.log" 2>&1; then ok; else bad "cuda (emulated) run"; tail -3 "$TMP/dev_cuda.log"; fi
  for s in 1 3; do
    for k in loss grad_norm; do
      a=$(metric "$TMP/dev_cpu/metrics.jsonl" $s $k) b=$(metric "$TMP/dev_cuda/metrics.jsonl" $s $k)
      # 1e-4 relative, and one unit of the metrics' sixth decimal (grad_norm ~4e-3 prints 4 digits)
      awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-4 * (a < 0 ? -a : a) + 1.01e-6) }' &&
        ok || bad "step $s $k on cuda $b, on the cpu $a"
    done
  done
else
  echo "skipped the CUDA check: no emulator build beside $CTRL"
fi

# 3. Server mode: the student samples through ctrl serve, which gets the weights after every step
#    and then generates what the saved student does.
PORT=$(free_port)
"${C[@]}" serve --model "$TMP/model" --port "$PORT" >"$TMP/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
INI_GEN=$(printf 'mode = server\nserver_url = http://127.0.0.1:%s' "$PORT") gkd_ini srv 3 "[gkd]" "lmbda = 1" \
  "max_new_tokens = 4" >"$TMP/srv.ini"
if "${C[@]}" train "$TMP/srv.ini" >"$TMP/srv.log" 2>&1; then ok; else
  bad "server-mode run"
  tail -5 "$TMP/srv.log"
fi
grep -q "samples through ctrl serve at" "$TMP/srv.log" && ok || bad "server mode did not say where it samples"
server_greedy_same "$PORT" "$TMP/srv" 8 "gkd server mode"

# 4. Refusals naming the key.
refuse() { # NAME PATTERN INI-LINES... : the run fails with PATTERN in its message
  local name=$1 pat=$2
  shift 2
  gkd_ini "r_$name" 2 "$@" >"$TMP/r_$name.ini"
  if "${C[@]}" train "$TMP/r_$name.ini" >"$TMP/r_$name.log" 2>&1; then bad "$name accepted"; else
    grep -q -- "$pat" "$TMP/r_$name.log" && ok || { bad "$name: no '$pat' in:"; tail -2 "$TMP/r_$name.log"; }
  fi
}
refuse unknown_key "lmbd" "[gkd]" "lmbd = 0.5"
refuse beta_range "beta" "[gkd]" "beta = 1.5"
INI_GEN="temperature = 0.7" refuse gen_temperature "\[generation\] temperature" "[gkd]" "lmbda = 1"
INI_DATA_EXTRA="packing = true" refuse packing "\[data\] packing" "[gkd]" "lmbda = 1"
# no teacher; a teacher of another vocabulary; a teacher for a trainer without one; a bad dtype
gkd_ini r_none 2 | sed '/^\[teacher\]$/,/^path/d' >"$TMP/r_none.ini"
"${C[@]}" train "$TMP/r_none.ini" >"$TMP/r_none.log" 2>&1 && bad "no teacher accepted" ||
  { grep -q "\[teacher\] path" "$TMP/r_none.log" && ok || bad "no teacher: $(tail -1 "$TMP/r_none.log")"; }
gkd_ini r_vocab 2 | sed "s|^path = $TMP/teacher|path = $SRC/tests/fixtures/models/llama|" >"$TMP/r_vocab.ini"
"${C[@]}" train "$TMP/r_vocab.ini" >"$TMP/r_vocab.log" 2>&1 && bad "other vocabulary accepted" ||
  { grep -q "\[teacher\] path: the teacher's vocab_size is 128" "$TMP/r_vocab.log" && ok ||
    bad "vocab: $(tail -1 "$TMP/r_vocab.log")"; }
cp -r "$TMP/teacher" "$TMP/teacher_tok"
sed -i 's/"<|im_start|>"/"<|im_begin|>"/g' "$TMP/teacher_tok/tokenizer.json"
gkd_ini r_tok 2 | sed "s|^path = $TMP/teacher|path = $TMP/teacher_tok|" >"$TMP/r_tok.ini"
"${C[@]}" train "$TMP/r_tok.ini" >"$TMP/r_tok.log" 2>&1 && bad "another tokenizer accepted" ||
  { grep -q "\[teacher\] path: its tokenizer is not the student's" "$TMP/r_tok.log" && ok ||
    bad "tokenizer: $(tail -1 "$TMP/r_tok.log")"; }
gkd_ini r_sft 2 | sed 's/^trainer = gkd/trainer = sft/' >"$TMP/r_sft.ini"
"${C[@]}" train "$TMP/r_sft.ini" >"$TMP/r_sft.log" 2>&1 && bad "teacher with sft accepted" ||
  { grep -q "\[teacher\] path: trainer sft has no teacher" "$TMP/r_sft.log" && ok || bad "sft: $(tail -1 "$TMP/r_sft.log")"; }
"${C[@]}" config check "$TMP/on.ini" --set teacher.dtype=fp16 >"$TMP/r_dt.log" 2>&1 && bad "fp16 teacher accepted" ||
  { grep -q "dtype" "$TMP/r_dt.log" && ok || bad "dtype: $(tail -1 "$TMP/r_dt.log")"; }
finish
