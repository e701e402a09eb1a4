#!/usr/bin/env bash
# What zero3 on CUDA refused before (issue 19): GKD (its teacher sliced on the devices beside the sliced
# student) and server mode (each push gathers the whole model on the devices), 2 ranks under the CUDA
# emulator as tests/e2e/test_zero_cuda_emu.sh runs them, against plain data parallel on CUDA: the same
# curves, evaluations, pushes and served weights (docs/distributed.md, "zero3 on CUDA").
# usage: test_zero3_trainers_cuda_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA EMU_LIBCTRL_MPI
source "$(dirname "$0")/e2e_common.sh"
cuda_emu_mpi_setup "$4" "$5"
tiny_setup 7 4
head -16 "$TMP/data/eval.jsonl" >"$TMP/data/eval16.jsonl" # evaluations on the emulator: few rows
# GKD under zero3 on CUDA: the student sliced (gathered whole on its device for its on-policy samples),
# the teacher sliced on the devices as the student (as the CPU slices it on the host). lmbda 0.5 with seq_kd
# (the student's, the teacher's and the dataset's micro-batches), 3 steps, evaluations before and after:
# plain data parallel on CUDA's curve and evaluations, and the CPU's zero3 run (its teacher sliced on the
# host); with LoRA on the student (2 steps, no seq_kd) data parallel's LoRA curve on CUDA.
tiny_teacher
INI_DATA=rows INI_TARGET= INI_MODEL=$'[teacher]\npath = '"$TMP/teacher" INI_TRAIN="dtype = fp32" INI_BATCH=2 \
  online_ini gkd gkd 3 "[gkd]" "lmbda = 0.5" "seq_kd = true" "max_new_tokens = 4" |
  sed -e 's/^device = cpu/device = cuda/' -e "s#^eval_file = .*#eval_file = $TMP/data/eval16.jsonl#" >"$TMP/gkd.ini"
gkd() { # gkd NAME SETTINGS...
  local name=$1 && shift
  "${MPI[@]}" "${C[@]}" train "$TMP/gkd.ini" --set run.output_dir="$TMP/$name" "$@" >"$TMP/$name.log" 2>&1 ||
    { bad "gkd $name: exited $?"; tail -20 "$TMP/$name.log"; }
}
gkd gd
gkd gz --set memory.strategies=zero3
gkd gc --set memory.strategies=zero3 --set run.device=cpu
for key in loss grad_norm on_policy; do CURVE_MIN=3 curve_close "$TMP/gd" "$TMP/gz" $key 1e-6; done
CURVE_MIN=2 curve_close "$TMP/gd" "$TMP/gz" eval_loss 1e-6
CURVE_MIN=3 curve_close "$TMP/gc" "$TMP/gz" loss 1e-5
grep -q '"on_policy": 0.5' "$TMP/gz/metrics.jsonl" && ok || bad "gkd zero3 on cuda: no step mixes on-policy micro-batches"
# the teacher sliced on the devices as the student: at most 0.6 of its bytes mapped on a rank's device
# between uses (the emulator's 4 KiB pieces), below the whole during its forwards
grep -m1 "zero3: the teacher sliced" "$TMP/gz.log"
grep -m1 "zero3: the teacher's parameters resident per rank" "$TMP/gz.log"
read -r R W < <(sed -n 's/.*zero3: the teacher sliced over the ranks as the student: parameters resident at most \([0-9]*\) of its \([0-9]*\) bytes per rank on its device.*/\1 \2/p' "$TMP/gz.log")
read -r P A < <(sed -n "s/.*zero3: the teacher's parameters resident per rank: at most \([0-9]*\) bytes during its forwards of the first step, \([0-9]*\) after them.*on the device.*/\1 \2/p" "$TMP/gz.log")
[ -n "$R" ] && [ -n "$A" ] && [ $((R * 10)) -le $((W * 6)) ] && [ $((A * 10)) -le $((W * 6)) ] && [ "$P" -gt "$A" ] &&
  [ "$P" -lt "$W" ] && grep -q "zero3 on the device: per rank between steps" "$TMP/gz.log" && ok ||
  bad "gkd zero3 on cuda: the teacher not sliced on the device (R=$R A=$A P=$P W=$W)"
grep -q "zero3: the teacher sliced over the ranks as the student" "$TMP/gc.log" && ok || bad "gkd zero3 on the cpu: the teacher not sliced"
lora=(--set peft.enabled=true --set gkd.seq_kd=false --set train.max_steps=2)
gkd gl "${lora[@]}"
gkd glz "${lora[@]}" --set memory.strategies=zero3
for key in loss grad_norm; do CURVE_MIN=2 curve_close "$TMP/gl" "$TMP/glz" $key 1e-6; done
CURVE_MIN=2 curve_close "$TMP/gl" "$TMP/glz" eval_loss 1e-6
grep -q "zero3 on the device: per rank between steps" "$TMP/glz.log" && grep -q "LoRA adapter" "$TMP/glz.log" && ok ||
  bad "gkd lora zero3 on cuda: not sliced on the device, or no adapter saved"
# Server mode under zero3 on CUDA: each push maps and gathers the whole model on every rank's device over
# NCCL (fp32), rank 0 sends the host copy refreshed from it. One `ctrl serve` of the initial model for
# every run: each run's first push (before its first generation) puts its start weights back. GRPO (with
# and without LoRA) and GKD (lmbda 1), 2 steps each: data parallel on CUDA's curve, 1 + 2 pushes a run, and
# the server then generating what the saved zero3 model does.
P=$(free_port)
"${C[@]}" serve --model "$TMP/model" --port "$P" >"$TMP/serve.log" 2>&1 &
SP=$!
trap 'kill $SP 2>/dev/null; rm -rf "$TMP"' EXIT
pushes() { curl -s "localhost:$P/health" | sed -n 's/.*"weight_updates":\([0-9]*\).*/\1/p'; }
srv=(--set generation.mode=server --set generation.server_url="http://127.0.0.1:$P")
served() { # served INI NAME SETTINGS...: NAME's run through the server, its pushes counted
  local ini=$1 name=$2 before
  shift 2
  before=$(pushes)
  "${MPI[@]}" "${C[@]}" train "$ini" --set run.output_dir="$TMP/$name" "${srv[@]}" "$@" >"$TMP/$name.log" 2>&1 ||
    { bad "server mode $name: exited $?"; tail -20 "$TMP/$name.log"; }
  [ "$(($(pushes) - ${before:-0}))" = 3 ] && ok || bad "server mode $name: $(($(pushes) - ${before:-0})) pushes, want 3"
}
INI_TRAIN="dtype = fp32" online_ini grpo g 2 "[grpo]" "num_generations = 4" "max_completion_length = 12" |
  sed -e 's/^device = cpu/device = cuda/' -e '/^eval_file = /d' >"$TMP/grpo-s.ini"
served "$TMP/grpo-s.ini" sd
served "$TMP/grpo-s.ini" sz --set memory.strategies=zero3
for key in reward loss grad_norm; do CURVE_MIN=2 curve_close "$TMP/sd" "$TMP/sz" $key 1e-6 1e-9; done
grep -q "zero3 on the device: per rank between steps" "$TMP/sz.log" && ok || bad "grpo server mode: zero3 not on the device"
server_greedy_same "$P" "$TMP/sz" 8 "grpo zero3 server mode on cuda"
# with LoRA (its frozen base sliced on the devices too): each push folds the adapters into the gathered
# base's host copy; the server then completes as the saved adapter over the base does
plora=(--set peft.enabled=true --set peft.r=4 --set peft.lora_alpha=8)
served "$TMP/grpo-s.ini" ld "${plora[@]}"
served "$TMP/grpo-s.ini" lz "${plora[@]}" --set memory.strategies=zero3
for key in reward loss grad_norm; do CURVE_MIN=2 curve_close "$TMP/ld" "$TMP/lz" $key 1e-6 1e-9; done
grep -q "zero3 on the device: per rank between steps" "$TMP/lz.log" && ok || bad "grpo lora server mode: zero3 not on the device"
server_greedy_same "$P" "$TMP/lz" 8 "grpo lora zero3 server mode on cuda" "$TMP/model"
sed -e '/^eval_file = /d' -e '/^seq_kd = /d' -e 's/^lmbda = .*/lmbda = 1/' -e 's/^max_steps = .*/max_steps = 2/' \
  "$TMP/gkd.ini" >"$TMP/gkd-s.ini"
served "$TMP/gkd-s.ini" kd
served "$TMP/gkd-s.ini" kz --set memory.strategies=zero3
for key in loss grad_norm; do CURVE_MIN=2 curve_close "$TMP/kd" "$TMP/kz" $key 1e-6; done
server_greedy_same "$P" "$TMP/kz" 8 "gkd zero3 server mode on cuda"
finish
