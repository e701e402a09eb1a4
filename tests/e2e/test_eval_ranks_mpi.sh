#!/usr/bin/env bash
# Evaluation split over the ranks (issue 19; core/train/data_parallel.h: train_dp_eval_mine,
# train_dp_eval_reduce). With `mpirun -np 2` each rank evaluates its batches of
# per_device_eval_batch_size rows -- batch i on rank i % 2, as Accelerate shards the HF Trainer's
# eval dataloader -- and the sums are reduced over the ranks, so that every eval_ value is one
# process's evaluating the whole set: the same keys in the same order, the values within 1e-6
# relative (+ 1e-9; the fp32/fp64 sums are only added in another order, and the printed values are
# expected identical: the test prints how many are not). Both runs evaluate the same weights
# (learning_rate 1e-30: no step changes a weight in fp32; DPO, KTO and GKD evaluate before the first step too). Uneven shares: SFT's 17
# rows in batches of 4 (rank 0 three batches, rank 1 two, the last one row); DPO's 20 pairs in
# batches of 8 (8 + 4 against 8), and in one batch of 32 (rank 1 evaluates nothing); KTO's 10 rows
# in batches of 2, some batches all desirable or all undesirable (the ranks report different metric
# names, merged by name); GKD's 9 rows in batches of 2. zero3 on 2 ranks for SFT, DPO (both batch
# sizes), KTO, the reward trainer (its classifier read sliced) and GKD too: the forwards gather each layer around its use, every rank running as many
# (a rank short of a batch runs a padding one, its values dropped), and the run logs no whole gather.
# Skipped (77) only when mpirun or the MPI backend (libctrl_mpi.so) is absent.
# usage: test_eval_ranks_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
FIX="$SRC/tests/fixtures"

# same_evals, eval_split and run1: e2e_common.sh
# both NAME INI Z3 MINE ALL [--set ...]: INI on one process (NAME-one) and on 2 ranks (NAME-two; with
# Z3 = z3 also under zero3, NAME-z3): the 2-rank runs' evaluations (2 each) one process's, rank 0's
# share MINE of ALL batches
both() {
  local name=$1 ini=$2 z3=$3 mine=$4 all=$5 && shift 5
  run1 "$name-one" "${C[@]}" train "$ini" --set run.output_dir="$TMP/$name-one" "$@"
  local runs=(two) && [ "$z3" = z3 ] && runs+=(z3)
  for r in "${runs[@]}"; do
    local z=() && [ "$r" = z3 ] && z=(--set memory.strategies=zero3)
    run1 "$name-$r" "${MPI[@]}" "${C[@]}" train "$ini" --set run.output_dir="$TMP/$name-$r" "$@" "${z[@]}"
    same_evals "$name-one" "$name-$r" 2
    eval_split "$name-$r" "$mine" "$all"
  done
  # zero3 evaluates with the layers gathered around each use, every rank running as many forwards (a
  # rank short of a batch runs a padding one): the whole model never gathered
  [ "$z3" = z3 ] && { grep -q "zero3: the whole model gathered on every rank 0 time(s)" "$TMP/$name-z3.log" && ok ||
    bad "$name zero3: the whole model gathered ($(grep -o 'on every rank [0-9]* time' "$TMP/$name-z3.log"))"; }
  return 0
}

# 1. SFT (the token kind): 17 eval rows in batches of 4, evaluations after steps 1 and 2, on tiny_setup's
#    model trained 40 steps first (its token accuracy ~0.3, not 0).
tiny_setup 7 2
tiny_ini "$TMP/pre.ini" "$TMP/pre" <<INI
learning_rate = 1e-2
max_steps = 40
per_device_train_batch_size = 8
logging_steps = 10
save_strategy = no
dtype = fp32
INI
run1 pre "${C[@]}" train "$TMP/pre.ini"
head -17 "$TMP/data/eval.jsonl" >"$TMP/data/eval17.jsonl"
tiny_ini "$TMP/sft.ini" "$TMP/sft" <<INI
learning_rate = 1e-30
max_steps = 2
per_device_train_batch_size = 2
per_device_eval_batch_size = 4
eval_steps = 1
logging_steps = 1
save_strategy = no
dtype = fp32
INI
sft=(--set model.path="$TMP/pre" --set data.eval_file="$TMP/data/eval17.jsonl")
both sft "$TMP/sft.ini" z3 3 5 "${sft[@]}"
grep -q "eval: loss .*(17 examples)" "$TMP/sft-one.log" && ok || bad "sft: one process's eval line has a note"
[ "$(grep -c '"eval_loss"' "$TMP/sft-two/metrics.jsonl")" = 2 ] && ok || bad "sft: rank 0 did not write 2 eval lines"

# 2. DPO (the sequence kind, a live reference) on TRL's fixture: 20 pairs in batches of 8, and in one
#    batch of 32 (rank 1 has none); an evaluation before and after the one step.
sed -e "s|@DIR@/|$FIX/trl_dpo/|; s|@DIR@|$FIX/trl_dpo|; s|@SFT@|$FIX/trl_sft|; s|@OUT@|$TMP/dpo|" \
  -e "s/^max_steps = 20/max_steps = 1/; s/^learning_rate = .*/learning_rate = 1e-30/" \
  "$FIX/trl_dpo/sigmoid_eval.ini" >"$TMP/dpo.ini"
both dpo "$TMP/dpo.ini" z3 2 3
both dpo32 "$TMP/dpo.ini" z3 1 1 --set train.per_device_eval_batch_size=32

# 3. KTO (unpaired, its per-batch KL estimate): 10 rows in batches of 2.
head -10 "$FIX/trl_kto/rows.jsonl" >"$TMP/kto10.jsonl"
sed -e "s|@DIR@/|$FIX/trl_kto/|; s|@DIR@|$FIX/trl_kto|; s|@SFT@|$FIX/trl_sft|; s|@OUT@|$TMP/kto|" \
  -e "s/^max_steps = 20/max_steps = 1/; s/^learning_rate = .*/learning_rate = 1e-30/" \
  "$FIX/trl_kto/kto.ini" >"$TMP/kto.ini"
kto=(--set data.eval_file="$TMP/kto10.jsonl" --set train.per_device_eval_batch_size=2)
both kto "$TMP/kto.ini" z3 3 5 "${kto[@]}"

# 4. The reward trainer (the sequence kind without a reference; a fresh score head on the trained model,
#    so its rewards, margins and accuracy are not 0 or constant): 13 pairs in batches of 3.
R="$FIX/trl_reward"
tail -13 "$R/pairs.jsonl" >"$TMP/rm13.jsonl"
sed -e "s|@DIR@|$R|g; s|@MODEL@|$TMP/pre|; s|@OUT@|$TMP/rm|" \
  -e "s/^max_steps = 20/max_steps = 1/; s/^learning_rate = .*/learning_rate = 1e-30/" "$R/margin_center.ini" >"$TMP/rm.ini"
rm=(--set data.eval_file="$TMP/rm13.jsonl" --set train.per_device_eval_batch_size=3)
both rm "$TMP/rm.ini" z3 3 5 "${rm[@]}"
# under zero3 each rank read its slices of the classifier (the fresh score seeded alike on every rank)
grep -q "zero3: each rank read its slices of the classifier's layers" "$TMP/rm-z3.log" && ok || bad "rm zero3: not read sliced"
# with LoRA (PEFT's SEQ_CLS: the score trained beside the adapters) the frozen base read sliced too: what
# each rank holds after attach is what a whole read gives it (digests), the same evaluations
for w in rml rmlw; do
  run1 "$w" env $([ $w = rmlw ] && echo CTRL_TEST_ZERO3_WHOLE_LORA=1) CTRL_TEST_ZERO3_DIGEST=1 "${MPI[@]}" "${C[@]}" \
    train "$TMP/rm.ini" --set run.output_dir="$TMP/$w" "${rm[@]}" --set peft.enabled=true --set memory.strategies=zero3
done
same_evals rmlw rml 2
dg=$(grep -o "zero3: the model gathered whole after attach: digest [0-9a-f]*" "$TMP/rml.log")
[ -n "$dg" ] && [ "$dg" = "$(grep -o "zero3: the model gathered whole after attach: digest [0-9a-f]*" "$TMP/rmlw.log")" ] &&
  grep -q "zero3 + LoRA: each rank read its slices of the frozen base" "$TMP/rml.log" && ok ||
  bad "rm lora zero3: not read sliced, or its slices differ from the whole read's: '$dg'"

# 5. GKD (the distill kind): 9 rows in batches of 2, no generation (lmbda 0).
tiny_teacher
head -9 "$TMP/data/eval.jsonl" >"$TMP/data/eval9.jsonl"
INI_DATA=rows INI_TARGET= INI_MODEL=$'[teacher]\npath = '"$TMP/teacher" INI_TRAIN="dtype = fp32" INI_BATCH=2 \
  online_ini gkd gkd 1 "[gkd]" "lmbda = 0" |
  sed "s|^eval_file = .*|eval_file = $TMP/data/eval9.jsonl|; s/^learning_rate = .*/learning_rate = 1e-30/" >"$TMP/gkd.ini"
gkd=(--set model.path="$TMP/pre" --set train.per_device_eval_batch_size=2)
both gkd "$TMP/gkd.ini" z3 3 5 "${gkd[@]}"
finish
