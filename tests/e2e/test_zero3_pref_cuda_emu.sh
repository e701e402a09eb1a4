#!/usr/bin/env bash
# ZeRO-3 on CUDA with the preference trainers (the sequence kind), 2 ranks under the CUDA emulator
# (issue 19; core/train/zero_device.c): DPO (its reference frozen and sliced on the devices as the
# policy, each unit's pieces mapped and gathered around its forward use -- about half of it mapped on a
# rank's device between uses --; with LoRA the policy itself with its adapters disabled, no copy, and
# QLoRA's precomputed reference run through the policy's sliced NF4 base;
# TR-DPO's sync mixing each rank's slices of the reference with the policy's on the device), KTO and
# the reward trainer (a sequence classifier: the causal LM's trunk under a fresh score, which lies
# outside the layers and stays whole) follow plain data parallel on CUDA: loss and the trainers'
# metrics within 1e-6, gradient norm 1e-5, as test_zero_mpi's DPO on the CPU; DPO also the CPU's zero3
# run (its reference sliced on the host), 1e-5.
# usage: test_zero3_pref_cuda_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA EMU_LIBCTRL_MPI
source "$(dirname "$0")/e2e_common.sh"
cuda_emu_mpi_setup "$4" "$5"
FIX="$SRC/tests/fixtures"
tiny_setup 7 2 # the reward trainer's model
# ini KIND INI_FILE OUT: a fixture's run on CUDA, 4 steps of 2 rows a rank
ini() {
  sed -e "s|@DIR@/|$FIX/trl_$1/|; s|@DIR@|$FIX/trl_$1|; s|@SFT@|$FIX/trl_sft|; s|@MODEL@|$TMP/model|; s|@OUT@|$TMP/$3|" \
    -e "s/^max_steps = 20/max_steps = 4/; s/^device = cpu/device = cuda/; /^gradient_accumulation_steps/d" \
    -e "s/^per_device_train_batch_size = .*/per_device_train_batch_size = 2/" "$FIX/trl_$1/$2" >"$TMP/$3.ini"
}
pair() { # pair NAME KEYS...: NAME (plain data parallel) and NAME3 (zero3) on CUDA, their curves compared
  local name=$1 && shift
  for out in $name ${name}3; do
    z=() && [ $out = ${name}3 ] && z=(--set memory.strategies=zero3 --set memory.reduce_bucket_size=1)
    "${MPI[@]}" "${C[@]}" train "$TMP/$name.ini" --set run.output_dir="$TMP/$out" "${z[@]}" "${EXTRA[@]}" >"$TMP/$out.log" 2>&1 ||
      { bad "$out: exited $?"; tail -20 "$TMP/$out.log"; }
  done
  for key in loss "$@"; do CURVE_MIN=4 curve_close "$TMP/$name" "$TMP/${name}3" "$key" 1e-6 1e-9; done
  CURVE_MIN=4 curve_close "$TMP/$name" "$TMP/${name}3" grad_norm 1e-5
  grep -q "zero3 on the device: per rank between steps" "$TMP/${name}3.log" && ok || bad "$name zero3: not on the device"
}
EXTRA=()
ini dpo sigmoid.ini dpo
pair dpo rewards/margins logps/chosen logps/rejected
"${MPI[@]}" "${C[@]}" train "$TMP/dpo.ini" --set run.output_dir="$TMP/dpoc" --set memory.strategies=zero3 \
  --set memory.reduce_bucket_size=1 --set run.device=cpu >"$TMP/dpoc.log" 2>&1 || { bad "dpoc: exited $?"; tail -20 "$TMP/dpoc.log"; }
# (the margins, a difference of two rewards, cancel: 1e-7 absolute beside the 1e-5 relative)
for key in loss logps/chosen logps/rejected; do CURVE_MIN=4 curve_close "$TMP/dpoc" "$TMP/dpo3" "$key" 1e-5 1e-9; done
CURVE_MIN=4 curve_close "$TMP/dpoc" "$TMP/dpo3" rewards/margins 1e-5 1e-7
# the reference's device memory per rank (the emulator's pieces are 4 KiB): at most 0.6 of its bytes
# mapped between uses (its slices, the final norm, the pieces at the slices' ends), below the whole
# during its forwards (a unit gathered at a time, the next prefetched)
grep -m1 "zero3: the reference model sliced as the policy" "$TMP/dpo3.log"
grep -m1 "zero3: the reference model's parameters resident per rank" "$TMP/dpo3.log"
read -r R W < <(sed -n 's/.*sliced as the policy: parameters resident at most \([0-9]*\) of its \([0-9]*\) bytes per rank on its device.*/\1 \2/p' "$TMP/dpo3.log")
read -r P A W2 < <(sed -n "s/.*the reference model's parameters resident per rank: at most \([0-9]*\) bytes during its forwards of the first step, \([0-9]*\) after them, of its \([0-9]*\) bytes.*on the device.*/\1 \2 \3/p" "$TMP/dpo3.log")
[ -n "$R" ] && [ -n "$A" ] && [ "$W" = "$W2" ] && [ $((R * 10)) -le $((W * 6)) ] && [ $((A * 10)) -le $((W * 6)) ] &&
  [ "$P" -gt "$A" ] && [ "$P" -lt "$W" ] && ok || bad "dpo zero3 on cuda: the reference not sliced on the device (R=$R A=$A P=$P W=$W)"
ini kto kto.ini kto
pair kto logps/chosen
# precompute_ref_log_probs: the pass before training runs a reference loaded whole on the device (the
# policy holds only its slices then, unhooked): the rewards start at 0 as data parallel's
ini dpo sigmoid_sft_precompute_ga.ini dpop
pair dpop rewards/chosen rewards/margins logps/chosen
# ... with QLoRA: the pass runs once the run is set up, through the policy's NF4 base with its adapters
# off, gathered by zero3's hooks, so no device ever held the whole model (it did before: the pass ran
# the policy whole, ahead of zero3)
ini dpo sigmoid_sft_precompute_ga.ini dpopq
EXTRA=(--set peft.enabled=true --set peft.target_modules=all-linear --set peft.quantization=nf4)
pair dpopq rewards/chosen rewards/margins logps/chosen
grep -q "zero3 on cuda: each rank put its slices of the parameters on its device from the host (the move to the device copied none" "$TMP/dpopq3.log" &&
  grep -q "zero3 + QLoRA: each rank read its slices of the frozen embeddings" "$TMP/dpopq3.log" && ok ||
  bad "dpopq zero3 on cuda: the QLoRA base read or moved whole"
EXTRA=()
ini reward grad_accum.ini rm
pair rm accuracy
# TR-DPO (sync_ref_model, a sync every 2 steps): each rank mixes its slices of the reference with the
# policy's on its device (no gather)
ini dpo sigmoid_tr_dpo.ini trdpo
sed -i "s/^ref_model_sync_steps = .*/ref_model_sync_steps = 2/" "$TMP/trdpo.ini"
pair trdpo rewards/chosen rewards/margins logps/chosen
[ "$(grep -c 'sync_ref_model: reference mixed with the policy (alpha [0-9.]*) after step [24], each rank its zero3 slices' "$TMP/trdpo3.log")" = 2 ] &&
  ok || bad "trdpo zero3 on CUDA: not 2 syncs of the sliced reference: $(grep sync_ref_model "$TMP/trdpo3.log")"
# DPO with LoRA: the reference is the policy with its adapters disabled (no second model)
ini dpo sigmoid.ini dpol
EXTRA=(--set peft.enabled=true --set peft.target_modules=all-linear --set peft.init_lora_weights=false)
pair dpol rewards/margins
finish
