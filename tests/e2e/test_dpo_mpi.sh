#!/usr/bin/env bash
# DPO and KTO over MPI (the sequence kind under data parallel): `mpirun -np 2` with
# per_device_train_batch_size 2 follows one process with batch 4 on the curve fixtures' rows
# (tests/fixtures/trl_dpo, trl_kto): loss, grad_norm and every metric -- gathered over the ranks as
# TRL gathers them over its processes: the per-pair means, the token-weighted ones (logits/*,
# entropy, mean_token_accuracy) as summed values over summed tokens, KTO's per-label means and its
# KL estimate (the mean of the ranks' estimates) -- within 1e-5 relative (plus 1e-7 near zero; 1e-6
# for the rewards and KL, beta times a difference of two log-probs of magnitude ~10-100, whose fp32
# sums round differently at another batch shape: an AMX host's sgemm gave 2.4e-7 apart on -7.2e-3).
# Skipped (77) only when mpirun or the MPI backend (libctrl_mpi.so) is absent.
# usage: test_dpo_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
FIX="$SRC/tests/fixtures"
# every training line's KEY
col() { grep -o "\"$2\": [-0-9.e]*" "$TMP/$1/metrics.jsonl" | awk '{print $2}'; }
# [FLOOR=ABS] compare NAME KEY...: 2 ranks x 2 rows against 1 x 4, 6 steps
compare() {
  local name=$1
  shift
  for key in "$@"; do
    if paste <(col "$name-one" "$key") <(col "$name-two" "$key") | awk -v key="$key" -v floor="${FLOOR:-1e-7}" '
        { n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
          if (d > 1e-5 * a + floor) { print "  " key " line " NR ": " $1 " vs " $2; bad = 1 } }
        END { exit (bad || n != 6) }'; then
      ok
    else
      bad "$name: 2 ranks x 2 rows differ from 1 x 4 on $key"
    fi
  done
}
# run NAME FIXTURE_DIR INI [DATA_DIR]: one process with batch 4, then 2 ranks with batch 2
run() {
  for n in one two; do
    sed -e "s|@DIR@/|${4:-$FIX/$2}/|; s|@DIR@|$FIX/$2|; s|@SFT@|$FIX/trl_sft|; s|@OUT@|$TMP/$1-$n|" \
      -e "s/^max_steps = 20/max_steps = 6/" \
      -e "s/^per_device_train_batch_size = .*/per_device_train_batch_size = $([ $n = one ] && echo 4 || echo 2)/" \
      "$FIX/$2/$3" >"$TMP/$1-$n.ini"
  done
  "${C[@]}" train "$TMP/$1-one.ini" >"$TMP/$1-one.log" 2>&1 && ok || { bad "$1: one process"; tail -3 "$TMP/$1-one.log"; }
  "${MPI[@]}" "${C[@]}" train "$TMP/$1-two.ini" >"$TMP/$1-two.log" 2>&1 && ok ||
    { bad "$1: two ranks"; tail -3 "$TMP/$1-two.log"; }
}
run dpo trl_dpo sigmoid.ini
compare dpo loss grad_norm rewards/accuracies logps/chosen logps/rejected logits/chosen logits/rejected entropy \
  mean_token_accuracy
FLOOR=1e-6 compare dpo rewards/chosen rewards/rejected rewards/margins
# KTO with the precomputed reference and gradient accumulation (the KL estimate is not clamped to 0).
# TRL pairs each row with the previous row's completion within chunks of per_device_train_batch_size
# rows, so batch 4 and batch 2 pair differently; with every 4 consecutive rows sharing one
# completion the KL sequences are the same either way, and 2 ranks must follow 1 x 4 exactly.
mkdir -p "$TMP/kto-rows"
awk '{ if (match($0, /"completion": "[^"]*"/)) { if (NR % 4 == 1) c = substr($0, RSTART, RLENGTH)
       $0 = substr($0, 1, RSTART - 1) c substr($0, RSTART + RLENGTH) } print }' \
  "$FIX/trl_kto/rows.jsonl" >"$TMP/kto-rows/rows.jsonl"
run kto trl_kto kto_weights_precompute_ga.ini "$TMP/kto-rows"
compare kto loss grad_norm logps/chosen logps/rejected logits/chosen logits/rejected entropy
FLOOR=1e-6 compare kto kl rewards/chosen rewards/rejected
finish
