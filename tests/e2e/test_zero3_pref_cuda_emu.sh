#!/usr/bin/env bash
# ZeRO-3 on CUDA with the preference trainers (the sequence kind), 2 ranks under the CUDA emulator
# (issue 19; core/train/zero_device.c): DPO (its reference a frozen whole copy on each rank's device
# beside the sliced policy; with LoRA the policy itself with its adapters disabled, no copy; TR-DPO's
# sync mixing that reference with the policy gathered whole), KTO and
# the reward trainer (a sequence classifier: the causal LM's trunk under a fresh score, which lies
# outside the layers and stays whole) follow plain data parallel on CUDA: loss and the trainers'
# metrics within 1e-6, gradient norm 1e-5, as test_zero_mpi's DPO on the CPU.
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
ini kto kto.ini kto
pair kto logps/chosen
# precompute_ref_log_probs: the pass before training runs a reference loaded whole on the device (the
# policy holds only its slices then, unhooked): the rewards start at 0 as data parallel's
ini dpo sigmoid_sft_precompute_ga.ini dpop
pair dpop rewards/chosen rewards/margins logps/chosen
ini reward grad_accum.ini rm
pair rm accuracy
# TR-DPO (sync_ref_model, a sync every 2 steps): the whole reference mixed with the policy gathered whole
ini dpo sigmoid_tr_dpo.ini trdpo
sed -i "s/^ref_model_sync_steps = .*/ref_model_sync_steps = 2/" "$TMP/trdpo.ini"
pair trdpo rewards/chosen rewards/margins logps/chosen
[ "$(grep -c 'sync_ref_model: reference mixed with the policy (alpha [0-9.]*) after step [24], the policy gathered whole' "$TMP/trdpo3.log")" = 2 ] &&
  ok || bad "trdpo zero3 on CUDA: not 2 syncs of the gathered policy: $(grep sync_ref_model "$TMP/trdpo3.log")"
# DPO with LoRA: the reference is the policy with its adapters disabled (no second model)
ini dpo sigmoid.ini dpol
EXTRA=(--set peft.enabled=true --set peft.target_modules=all-linear --set peft.init_lora_weights=false)
pair dpol rewards/margins
finish
