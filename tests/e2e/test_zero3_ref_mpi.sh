#!/usr/bin/env bash
# DPO's and KTO's live reference under ZeRO-3 (issue 19; core/train/zero_ref.c): with
# `[memory] strategies = zero3` on 2 ranks the reference is sliced as the policy (each rank reads
# its slices; each layer gathered around its forward use, released after), as TRL prepares the
# reference with the policy's DeepSpeed ZeRO-3 config. On TRL's fixtures' rows (tests/fixtures/
# trl_dpo, trl_kto), 2 ranks x 2 rows, 6 steps: zero3 follows plain data parallel (loss, rewards/*,
# logps/*, KTO's kl; DPO's evaluation before and after training, the reference gathered whole for
# it) within test_dpo_mpi's 1e-5 relative (+ 1e-7); the log shows the reference's resident
# parameters per rank at most ~1/2 of its bytes between uses and below the whole during its
# forwards; a zero3 DPO run resumed from checkpoint-3 ends on the same curve; DPO in bf16 (the
# rounded weight copy) as data parallel in bf16; with precompute_ref_log_probs the pass before
# training uses the reference sliced (the policy is only slices then) and follows data parallel too;
# with LoRA or QLoRA the pass runs the policy's sliced base, adapters off, through zero3's hooks.
# Skipped (77) only when mpirun or the MPI backend (libctrl_mpi.so) is absent.
# usage: test_zero3_ref_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
FIX="$SRC/tests/fixtures"
# ini NAME FIXTURE_DIR INI: 6 steps of 2 rows a rank
ini() {
  sed -e "s|@DIR@/|$FIX/$2/|; s|@DIR@|$FIX/$2|; s|@SFT@|$FIX/trl_sft|; s|@OUT@|$TMP/$1|" \
    -e "s/^max_steps = 20/max_steps = 6/" -e "s/^per_device_train_batch_size = .*/per_device_train_batch_size = 2/" \
    "$FIX/$2/$3" >"$TMP/$1.ini"
}
# two NAME [--set ...]: plain data parallel (NAME-dp) and zero3 (NAME-z3) on 2 ranks
two() {
  local name=$1 && shift
  "${MPI[@]}" "${C[@]}" train "$TMP/$name.ini" --set run.output_dir="$TMP/$name-dp" "$@" >"$TMP/$name-dp.log" 2>&1 &&
    ok || { bad "$name: data parallel"; tail -5 "$TMP/$name-dp.log"; }
  "${MPI[@]}" "${C[@]}" train "$TMP/$name.ini" --set run.output_dir="$TMP/$name-z3" --set memory.strategies=zero3 "$@" \
    >"$TMP/$name-z3.log" 2>&1 && ok || { bad "$name: zero3"; tail -5 "$TMP/$name-z3.log"; }
}
# close NAME KEY...: zero3's training lines against plain data parallel's
close() {
  local name=$1 && shift
  for key in "$@"; do curve_close "$TMP/$name-dp" "$TMP/$name-z3" "$key" 1e-5 1e-7; done
}
# sliced NAME: the reference's log lines -- resident between uses at most 0.55 of its bytes (1/2
# plus the final norm and the slices' partial pages), during its forwards above that and below the
# whole (one layer gathered at a time) -- and the data parallel run's reference whole (no such line)
sliced() {
  local line peak
  line=$(grep -o "the reference model sliced as the policy: parameters resident at most [0-9]* of its [0-9]* bytes" "$TMP/$1-z3.log")
  peak=$(grep -o "the reference model's parameters resident per rank: at most [0-9]* bytes during its forwards of the first step, [0-9]* after them, of its [0-9]*" "$TMP/$1-z3.log")
  echo "$line" | awk '{ r = $(NF - 4); w = $(NF - 1); exit !(w > 0 && r <= 0.55 * w) }' && ok ||
    bad "$1: the reference's resident bytes: '$line'"
  echo "$peak" | awk '{ p = $10; a = $19; w = $NF; exit !(w > 0 && a <= 0.55 * w && p > a && p < w) }' && ok ||
    bad "$1: the reference's bytes in its forwards: '$peak'"
  grep -q "reference live (zero3: sliced over the ranks)" "$TMP/$1-z3.log" && ok || bad "$1: not described as sliced"
  ! grep -q "the reference model sliced" "$TMP/$1-dp.log" && ok || bad "$1: data parallel's reference sliced"
}

# 1. DPO (sigmoid) with an evaluation before and after, checkpoints at 3 and 6.
ini dpo trl_dpo sigmoid_eval.ini
two dpo --set train.save_strategy=steps --set train.save_steps=3
close dpo loss rewards/chosen rewards/rejected rewards/margins rewards/accuracies logps/chosen logps/rejected
# the evaluations (before and after training: 2 lines)
for key in eval_loss eval_rewards/margins eval_logps/chosen eval_logps/rejected; do
  paste <(curve_col "$TMP/dpo-dp" "$key") <(curve_col "$TMP/dpo-z3" "$key") | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; if (d > 1e-5 * a + 1e-7) bad = 1 }
    END { exit (bad || n != 2) }' && ok || bad "dpo zero3: $key differs from data parallel's"
done
curve_close "$TMP/dpo-dp" "$TMP/dpo-z3" grad_norm 1e-4 1e-7
sliced dpo

# 2. Resumed from checkpoint-3 with zero3 on 2 ranks: steps 4..6 and the last evaluation as before.
mkdir -p "$TMP/res" && cp -r "$TMP/dpo-z3/checkpoint-3" "$TMP/res/"
grep -E '"step": [0-3],' "$TMP/dpo-z3/metrics.jsonl" >"$TMP/res/metrics.jsonl"
"${MPI[@]}" "${C[@]}" train "$TMP/dpo.ini" --set run.output_dir="$TMP/res" --set memory.strategies=zero3 \
  --set train.save_strategy=steps --set train.save_steps=3 --set train.resume_from_checkpoint=last >"$TMP/res.log" 2>&1 &&
  ok || { bad "dpo zero3 resume"; tail -5 "$TMP/res.log"; }
curve() { sed 's/, "tokens_per_second": [0-9.]*//; s/, "train_runtime": [0-9.]*//' "$1/metrics.jsonl" | grep -v runtime; }
diff <(curve "$TMP/dpo-z3") <(curve "$TMP/res") >"$TMP/diff" && ok || { bad "dpo zero3 resumed curve differs"; head "$TMP/diff"; }

# 3. In bf16 through the rounded weight copy (CTRL_NO_AVX512BF16: each gathered layer's part of the
#    reference's copy rounded after its gather; [train] bf16_fallback = rounded): the same as data
#    parallel in bf16.
ini dpob trl_dpo sigmoid.ini
MPI+=(-x CTRL_NO_AVX512BF16=1)
two dpob --set train.dtype=bf16 --set train.bf16_fallback=rounded
close dpob loss rewards/chosen rewards/rejected logps/chosen logps/rejected
MPI=("${MPI[@]:0:$((${#MPI[@]} - 2))}")

# 4. precompute_ref_log_probs: the pass before training runs the reference sliced and hooked (the
#    policy holds only its slices then, its gathers not yet hooked): the first steps' rewards are 0
#    as data parallel's, the curve the same; resumed from checkpoint-3 in a fresh output_dir (no
#    stored log-probs: computed again from the reference loaded sliced) it repeats the curve.
ini dpop trl_dpo sigmoid_sft_precompute_ga.ini
two dpop --set train.save_strategy=steps --set train.save_steps=3
close dpop loss logps/chosen logps/rejected
# (data parallel's pass runs the policy model itself, zero3's a separate reference model: their sums
# agree to fp32 rounding, ~2e-6 at log-probs of -23, so beta 0.5 x that absolute on the rewards)
for key in rewards/chosen rewards/rejected rewards/margins; do curve_close "$TMP/dpop-dp" "$TMP/dpop-z3" "$key" 1e-5 2e-6; done
mkdir -p "$TMP/resp" && cp -r "$TMP/dpop-z3/checkpoint-3" "$TMP/resp/"
grep -E '"step": [0-3],' "$TMP/dpop-z3/metrics.jsonl" >"$TMP/resp/metrics.jsonl"
"${MPI[@]}" "${C[@]}" train "$TMP/dpop.ini" --set run.output_dir="$TMP/resp" --set memory.strategies=zero3 \
  --set train.save_strategy=steps --set train.save_steps=3 --set train.resume_from_checkpoint=last >"$TMP/resp.log" 2>&1 &&
  ok || { bad "dpo precompute zero3 resume"; tail -5 "$TMP/resp.log"; }
grep -q "reference model sliced as the policy" "$TMP/resp.log" && ok || bad "dpo precompute resume: reference not sliced"
diff <(curve "$TMP/dpop-z3") <(curve "$TMP/resp") >"$TMP/diff" && ok || { bad "dpo precompute zero3 resumed curve differs"; head "$TMP/diff"; }
# ... with LoRA and QLoRA: the pass runs once the run is set up, through the policy's frozen base with
# its adapters off (as data parallel's), its layers gathered by zero3's hooks -- so the policy reads
# its base sliced (QLoRA: its NF4 super-blocks) and no reference is loaded: data parallel's curve.
# QLoRA's runs go into the output_dirs LoRA's left their stored log-probs in: they are not read back
# (they were made from other weights: the unquantized base). Resumed from checkpoint-3 in a fresh
# output_dir (no stored log-probs), QLoRA's pass runs the same quantized base again: the same curve
# (a reference loaded for it would be the unquantized weights).
ini dpopl trl_dpo sigmoid_sft_precompute_ga.ini
for q in none nf4; do
  two dpopl --set peft.enabled=true --set peft.quantization=$q --set train.save_strategy=steps --set train.save_steps=3
  grep -q "precomputing the reference log-probs" "$TMP/dpopl-dp.log" &&
    grep -q "precomputing the reference log-probs" "$TMP/dpopl-z3.log" && ok || bad "dpo lora ($q): stored log-probs of other weights read"
  close dpopl loss logps/chosen logps/rejected
  for key in rewards/chosen rewards/rejected; do curve_close "$TMP/dpopl-dp" "$TMP/dpopl-z3" "$key" 1e-5 2e-6; done
  grep -q "zero3 + Q\{0,1\}LoRA: each rank read its slices of the frozen" "$TMP/dpopl-z3.log" &&
    ! grep -q "the reference model" "$TMP/dpopl-z3.log" && ok ||
    bad "dpo lora ($q) precompute zero3: the base not read sliced, or a reference loaded"
done
rm -rf "$TMP/resq" && mkdir -p "$TMP/resq" && cp -r "$TMP/dpopl-z3/checkpoint-3" "$TMP/resq/"
grep -E '"step": [0-3],' "$TMP/dpopl-z3/metrics.jsonl" >"$TMP/resq/metrics.jsonl"
"${MPI[@]}" "${C[@]}" train "$TMP/dpopl.ini" --set run.output_dir="$TMP/resq" --set memory.strategies=zero3 \
  --set peft.enabled=true --set peft.quantization=nf4 --set train.save_strategy=steps --set train.save_steps=3 \
  --set train.resume_from_checkpoint=last >"$TMP/resq.log" 2>&1 && ok || { bad "qlora precompute zero3 resume"; tail -5 "$TMP/resq.log"; }
grep -q "precomputing the reference log-probs" "$TMP/resq.log" && ok || bad "qlora precompute resume: not computed again"
diff <(curve "$TMP/dpopl-z3") <(curve "$TMP/resq") >"$TMP/diff" && ok || { bad "qlora precompute zero3 resumed curve differs"; head "$TMP/diff"; }

# 5. KTO with its live reference (KL estimate from mismatched pairs).
ini kto trl_kto kto.ini
two kto
close kto loss kl rewards/chosen rewards/rejected logps/chosen logps/rejected
sliced kto
finish
