#!/usr/bin/env bash
# The online trainers over 2 ranks on CUDA, under the CUDA emulator (the emulated runtime, NCCL and
# libctrl_mpi.so, each rank its own emulated device: as tests/e2e/test_zero_cuda_emu.sh runs them):
# `mpirun -np 2 ctrl train` with [run] device = cuda follows the same 2-rank run on the CPU, step for
# step, loss and grad_norm within 1e-5 relative, the trainers' metrics within 1e-4 relative or 1e-6
# absolute (as tests/e2e/test_online_mpi.sh compares 1 and 2 ranks on the CPU).
#   grpo: each rank samples and scores its prompts on its device, the policy's device gradients
#     averaged over NCCL.
#   grpo with LoRA and with QLoRA in server mode (one ctrl serve on the CPU): each push is the device
#     model's host copy with the adapters folded in, the NF4 base dequantized from the host's store.
#   ppo: the value model on each rank's device beside the policy, its device gradients averaged over
#     NCCL as the policy's (ncclAllReduce), both AdamW steps on the device.
#   grpo's evaluation: each rank samples and scores its eval batches on its device; the eval_ lines
#     one CUDA process's.
# usage: test_online_cuda_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA EMU_LIBCTRL_MPI
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
export CTRL_CUDA_LIBRARY=$4 CTRL_MPI_LIBRARY=$5 CTRL_EMU_DEVICES=2
MPI+=(-x CTRL_CUDA_LIBRARY -x CTRL_MPI_LIBRARY -x CTRL_EMU_DEVICES -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
tiny_setup 7 2

# pair NAME TRAINER [LINE...]: online_ini's run of TRAINER (STEPS steps, 6 unless set; fp32, no eval set, 2 prompts per
# micro-batch) on 2 ranks on the CPU, then on 2 ranks on their devices
pair() {
  local name=$1 trainer=$2
  shift 2
  INI_BATCH=2 INI_TRAIN="dtype = fp32" online_ini "$trainer" "${name}-cpu" "${STEPS:-6}" "$@" | sed '/^eval_file = /d' >"$TMP/$name.ini"
  "${MPI[@]}" "${C[@]}" train "$TMP/$name.ini" >"$TMP/$name-cpu.log" 2>&1 && ok ||
    { bad "$name: 2 ranks on the CPU"; tail -20 "$TMP/$name-cpu.log"; }
  "${MPI[@]}" "${C[@]}" train "$TMP/$name.ini" --set run.output_dir="$TMP/${name}-cuda" --set run.device=cuda \
    >"$TMP/$name-cuda.log" 2>&1 && ok || { bad "$name: 2 ranks on CUDA"; tail -20 "$TMP/$name-cuda.log"; }
  grep -q "optimizer adamw: steps on the device" "$TMP/$name-cuda.log" && ok ||
    bad "$name: $(grep optimizer "$TMP/$name-cuda.log")"
}
# same NAME RELATIVE ABSOLUTE KEY...: each KEY's curve on the devices follows the CPU's
same() {
  local name=$1 rel=$2 abs=$3 k
  shift 3
  for k in "$@"; do curve_close "$TMP/${name}-cpu" "$TMP/${name}-cuda" "$k" "$rel" "$abs"; done
}

pair grpo grpo "[grpo]" "num_generations = 4" "max_completion_length = 8"
same grpo 1e-5 1e-7 loss grad_norm
same grpo 1e-4 1e-6 reward rewards/len/mean

# GRPO with LoRA and with QLoRA in server mode: each push sends the device model's host copy with the
# adapters folded in (the NF4 base dequantized from the host's store); one ctrl serve on the CPU (every
# run pushes its initial weights first)
PORT=$(free_port)
"${C[@]}" serve --model "$TMP/model" --port "$PORT" >"$TMP/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
lora=("[grpo]" "num_generations = 4" "max_completion_length = 8" "[peft]" "enabled = true" "r = 4" "lora_alpha = 8")
gen=$(printf 'mode = server\nserver_url = http://127.0.0.1:%s' "$PORT")
INI_GEN=$gen pair lsrv grpo "${lora[@]}"
same lsrv 1e-5 1e-7 loss grad_norm
same lsrv 1e-4 1e-6 reward
INI_GEN=$gen pair qsrv grpo "${lora[@]}" "quantization = nf4"
same qsrv 1e-5 1e-7 loss grad_norm
same qsrv 1e-4 1e-6 reward
kill $SERVER 2>/dev/null

INI_TARGET=6 STEPS=12 pair ppo ppo "[ppo]" "response_length = 8" "num_ppo_epochs = 2" "kl_estimator = k3"
grep -q "value model: .*stepping on the device" "$TMP/ppo-cuda.log" && ok || bad "ppo: $(grep "value model" "$TMP/ppo-cuda.log")"
same ppo 1e-5 1e-7 loss grad_norm value_model/grad_norm
same ppo 1e-4 1e-6 loss/value_avg objective/scores objective/kl objective/rlhf_reward policy/approxkl_avg loss/policy_avg
# GRPO's evaluation on 2 emulated devices (ctrl_online_evaluate): 5 eval prompts in batches of one (rank
# 0 samples 3 on its device, rank 1 2), the reward sums reduced: the eval_ lines before and after the
# step (learning rate 1e-30: the same weights) one CUDA process's
head -5 "$TMP/data/eval_prompts.jsonl" >"$TMP/ev5.jsonl"
INI_BATCH=2 INI_TRAIN=$'dtype = fp32\neval_steps = 1\nper_device_eval_batch_size = 2' \
  online_ini grpo gev 1 "[grpo]" "num_generations = 2" "max_completion_length = 8" |
  sed "s/^device = cpu/device = cuda/; s|^eval_file = .*|eval_file = $TMP/ev5.jsonl|; s/^learning_rate = .*/learning_rate = 1e-30/" >"$TMP/gev.ini"
run1 gev-one "${C[@]}" train "$TMP/gev.ini" --set run.output_dir="$TMP/gev-one"
run1 gev-two "${MPI[@]}" "${C[@]}" train "$TMP/gev.ini" --set run.output_dir="$TMP/gev-two" \
  --set train.per_device_train_batch_size=1
grep -q "device cuda:0: CUDA device 0 (ctrl CUDA emulator" "$TMP/gev-two.log" && ok || bad "gev: not on the emulated devices"
same_evals gev-one gev-two 2
eval_split gev-two 3 5
finish
