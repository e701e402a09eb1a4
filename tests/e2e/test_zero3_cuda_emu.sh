#!/usr/bin/env bash
# ZeRO-3 on CUDA in bf16 ([train] dtype = bf16, DeepSpeed's bf16 + ZeRO-3), 2 ranks under the CUDA
# emulator (issue 19; core/train/zero_device.c): each rank keeps the fp32 master slices of the layers
# apart and their bf16 values (2 bytes a parameter), all-gathers a layer's bf16 values over NCCL
# before its forward and its backward (widened into device memory mapped for the use, unmapped
# after: the emulator faults on a touch of unmapped memory), reduce-scatters the fp32 gradients into
# its slices' sums, steps AdamW on its fp32 slices and refreshes its bf16 slices. Its curve is plain
# data parallel's on CUDA in bf16 within bf16's tolerance (the layers' norm weights and biases enter
# the forward as bf16 values, as DeepSpeed's bf16 module holds them, where data parallel keeps them
# fp32 as torch.autocast does), the final model and its checkpoint hold the fp32 masters, a 2-rank
# resume repeats the curve exactly, and what each rank holds on its device is logged and checked;
# stage3_param_persistence_threshold (auto, 1e9) changes no number, and its checkpoint resumes.
# GRPO with zero3 on CUDA (the whole model gathered on every rank for each generation phase and
# released after, TRL's ds3_gather_for_generation = true) samples the completions of plain data
# parallel on CUDA and follows its rewards and gradient norms; so does PPO (its value model sliced on
# the devices too, its checkpoint resumed exactly); and with false (one layer
# gathered at a time for each decoding pass) those of the whole gather's run.
# usage: test_zero3_cuda_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA EMU_LIBCTRL_MPI
source "$(dirname "$0")/e2e_common.sh"
cuda_emu_mpi_setup "$4" "$5"
tiny_setup 7 3
cat >"$TMP/run.ini" <<INI
[run]
output_dir = $TMP/dp
device = cuda
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
[train]
learning_rate = 3e-3
max_steps = 6
per_device_train_batch_size = 2
gradient_accumulation_steps = 1
logging_steps = 1
save_steps = 3
weight_decay = 0.1
max_grad_norm = 0.5
dtype = bf16
INI
run() { mpi_train "$@"; }
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl"; }
run dp --set train.save_strategy=no
run z3 --set memory.strategies=zero3 --set memory.reduce_bucket_size=1
# the same curve as data parallel in bf16, within bf16's precision (norm weights and biases as bf16)
curve_close "$TMP/dp" "$TMP/z3" loss 1e-3
curve_close "$TMP/dp" "$TMP/z3" grad_norm 1e-2
# not the fp32 curve: the run computed in bf16
run f32 --set train.save_strategy=no --set train.dtype=fp32 --set train.max_steps=1
[ "$(curve_col "$TMP/f32" loss)" != "$(curve_col "$TMP/z3" loss | head -1)" ] && ok || bad "zero3 bf16: the fp32 loss"
grep -q "zero3 on the device in bf16" "$TMP/z3.log" && ok || bad "zero3 bf16: no bf16 line: $(grep zero3 "$TMP/z3.log")"
# what a rank holds on its device between steps: the final norm, half the embeddings and head, none of
# the layers' fp32 pieces but those they share with the ends; half of the layers' fp32 masters and a quarter of their
# bytes as bf16 (half the layers, 2 bytes a parameter), give or take a piece a slice
d3() { grep -o "zero3 on the device: per rank between steps at most [0-9]* of the model's [0-9]* bytes of parameters (layers, embeddings and head [0-9]* bytes" "$1"; }
b3() { grep -o "zero3 on the device in bf16: per rank between steps [0-9]* bytes of the layers' fp32 master slices and [0-9]* of the bf16 copy's [0-9]* bytes (its slices); the most of it mapped in the first step [0-9]*" "$1"; }
read -r pm p lay < <(d3 "$TMP/z3.log" | grep -o '[0-9][0-9]*' | sed -n '2p;3p;4p' | tr '\n' ' ')
read -r master b16 b16all b16peak < <(b3 "$TMP/z3.log" | grep -o '[0-9][0-9]*' | sed -n '3p;5p;7p;8p' | tr '\n' ' ')
piece=$(grep -o "pieces of [0-9]* bytes" "$TMP/z3.log" | grep -o '[0-9][0-9]*')
echo "zero3 bf16 on CUDA, per rank between steps: parameters $pm of $p bytes (layers $lay), fp32 masters $master, bf16 slices $b16 of $b16all (at most $b16peak in the step); pieces of $piece bytes"
# (the sliced bytes count the embeddings and the head, 2 x 1024 x 32 fp32 floats: half of each pinned
# as fp32, stepped there; the layers' fp32 masters and bf16 values apart)
outer=262144 && lay=$((lay - outer))
[ -n "$piece" ] && [ -n "$b16peak" ] && [ $((2 * master)) -le $((lay + 64)) ] && [ $((2 * master)) -ge $((lay - 64)) ] &&
  [ $((pm - (p - lay - outer) - outer / 2)) -le $((4 * piece)) ] && [ $((4 * b16)) -le $((lay + 4 * 4 * piece)) ] && [ "$b16peak" -gt "$b16" ] && ok ||
  bad "zero3 bf16 device bytes: '$(d3 "$TMP/z3.log")' '$(b3 "$TMP/z3.log")'"
# the products read the gathered layers' weight matrices as bf16 where the gather puts them (2 bytes a
# parameter in use, only the norm weights and biases widened to fp32): the same curve as with every
# layer widened whole to fp32 (CTRL_TEST_ZERO3_WIDEN), with fewer fp32 pieces mapped in the step
grep -q "zero3 in bf16: the products read the 21 weight matrices of the gathered layers as bf16" "$TMP/z3.log" && ok ||
  bad "zero3 bf16: the matrices not read as bf16: $(grep -o "zero3 in bf16: .*" "$TMP/z3.log")"
mpi0=("${MPI[@]}") && export CTRL_TEST_ZERO3_WIDEN=1 && MPI+=(-x CTRL_TEST_ZERO3_WIDEN)
run z3w --set memory.strategies=zero3 --set memory.reduce_bucket_size=1 --set train.save_strategy=no --set train.max_steps=2
MPI=("${mpi0[@]}") && unset CTRL_TEST_ZERO3_WIDEN
peak() { grep -o "the most mapped in the first step: parameters [0-9]*" "$1" | grep -o '[0-9]*$'; }
echo "zero3 bf16 on CUDA: fp32 parameters mapped at most in the step $(peak "$TMP/z3.log") bytes, $(peak "$TMP/z3w.log") with the layers widened whole"
[ "$(curve_col "$TMP/z3w" loss)" = "$(curve_col "$TMP/z3" loss | head -2)" ] && [ -n "$(peak "$TMP/z3.log")" ] &&
  [ "$(peak "$TMP/z3.log")" -lt "$(peak "$TMP/z3w.log")" ] && ok || bad "zero3 bf16 matrices as bf16: '$(peak "$TMP/z3.log")' vs '$(peak "$TMP/z3w.log")'"
# the final model holds the fp32 masters, not their bf16 values (whose low 16 bits are zero)
low=$(tail -c 4096 "$TMP/z3/model.safetensors" | od -A n -v -t u2 | tr -s ' ' '\n' | grep . | awk 'NR % 2 && $1 != 0 { n++ } END { print n + 0 }')
[ "${low:-0}" -gt 100 ] && ok || bad "zero3 bf16: the saved model holds bf16 values ($low of 1024 floats with low bits)"
# its checkpoint resumes the same curve on 2 ranks
mkdir -p "$TMP/r3" && cp -r "$TMP/z3/checkpoint-3" "$TMP/r3/"
grep '"step": [1-3],' "$TMP/z3/metrics.jsonl" >"$TMP/r3/metrics.jsonl"
run r3 --set memory.strategies=zero3 --set memory.reduce_bucket_size=1 --set train.resume_from_checkpoint=last
diff <(curve "$TMP/z3") <(curve "$TMP/r3") >"$TMP/diff" && ok || { bad "zero3 bf16 on CUDA: resumed curve differs"; cat "$TMP/diff"; }
cmp -s "$TMP/z3/model.safetensors" "$TMP/r3/model.safetensors" && ok || bad "zero3 bf16: the resumed model differs"
# stage3_param_persistence_threshold in bf16: the persistent tensors (auto: the norms and biases; 1e9:
# every tensor of the layers) hold their bf16 values widened where a gathered layer's are (their
# matrices' bf16 values whole beside them), the fp32 masters while the model is gathered whole (the
# saves): the curve and the saved model of the run without, bit for bit; a checkpoint resumes the same
for t in auto 1e9; do
  run "p$t" --set memory.strategies=zero3 --set memory.reduce_bucket_size=1 --set memory.stage3_param_persistence_threshold=$t
  diff <(curve "$TMP/z3") <(curve "$TMP/p$t") >"$TMP/diff" && cmp -s "$TMP/z3/model.safetensors" "$TMP/p$t/model.safetensors" &&
    ok || { bad "zero3 bf16 on CUDA at threshold $t: another curve or model"; cat "$TMP/diff"; }
done
grep -q "persistent (stage3_param_persistence_threshold = 1000000000 elements: 38 tensors" "$TMP/p1e9.log" && ok ||
  bad "zero3 bf16 at 1e9: $(grep -o "persistent (stage3.*" "$TMP/p1e9.log")"
mkdir -p "$TMP/pr" && cp -r "$TMP/p1e9/checkpoint-3" "$TMP/pr/" && grep '"step": [1-3],' "$TMP/z3/metrics.jsonl" >"$TMP/pr/metrics.jsonl"
run pr --set memory.strategies=zero3 --set memory.reduce_bucket_size=1 --set memory.stage3_param_persistence_threshold=1e9 \
  --set train.resume_from_checkpoint=last
diff <(curve "$TMP/z3") <(curve "$TMP/pr") >"$TMP/diff" && cmp -s "$TMP/z3/model.safetensors" "$TMP/pr/model.safetensors" &&
  ok || { bad "zero3 bf16 on CUDA at threshold 1e9: resumed curve or model differs"; cat "$TMP/diff"; }
# ... and an evaluation layer by layer (its gathers send the fp32 masters: so do the persistent tensors
# for its length) the same eval_loss
head -16 "$TMP/data/eval.jsonl" >"$TMP/data/eval16.jsonl"
for t in 0 1e9; do
  run "e$t" --set memory.strategies=zero3 --set data.eval_file="$TMP/data/eval16.jsonl" --set train.eval_steps=1 \
    --set train.max_steps=2 --set train.save_strategy=no --set memory.stage3_param_persistence_threshold=$t
done
[ "$(grep -c eval_loss "$TMP/e0/metrics.jsonl")" = 2 ] && [ "$(curve "$TMP/e0")" = "$(curve "$TMP/e1e9")" ] && ok ||
  bad "zero3 bf16 on CUDA, evaluation at threshold 1e9: $(curve_col "$TMP/e1e9" eval_loss | tr '\n' ' ') vs $(curve_col "$TMP/e0" eval_loss | tr '\n' ' ')"
# GRPO (its own share of the generation batch per rank, sampled on the device): zero3 on CUDA gathers the
# whole model for the generation phase (in bf16 too: the fp32 masters), scores and trains layer by layer
for dt in fp32 bf16; do
  INI_BATCH=2 INI_TRAIN="dtype = $dt" online_ini grpo g 2 "[grpo]" "num_generations = 4" "max_completion_length = 8" |
    sed 's/^device = cpu/device = cuda/; /^eval_file/d' >"$TMP/grpo.ini" # no evaluation: slow here
  for name in g$dt gz$dt; do
    z=() && [ $name = gz$dt ] && z=(--set memory.strategies=zero3)
    "${MPI[@]}" "${C[@]}" train "$TMP/grpo.ini" --set run.output_dir="$TMP/$name" "${z[@]}" >"$TMP/$name.log" 2>&1 ||
      { bad "grpo $name: exited $?"; tail -20 "$TMP/$name.log"; }
  done
done
grep -q "zero3 on the device in bf16" "$TMP/gzbf16.log" && ok || bad "grpo zero3 bf16: $(grep zero3 "$TMP/gzbf16.log")"
# fp32: the same completions' rewards and the same gradient norms (the slices' sums of squares added)
[ -n "$(curve_col "$TMP/gfp32" reward)" ] && [ "$(curve_col "$TMP/gfp32" reward)" = "$(curve_col "$TMP/gzfp32" reward)" ] && ok ||
  bad "grpo zero3 on cuda: reward $(curve_col "$TMP/gzfp32" reward | tr '\n' ' ') vs $(curve_col "$TMP/gfp32" reward | tr '\n' ' ')"
n=$(paste <(curve_col "$TMP/gfp32" grad_norm) <(curve_col "$TMP/gzfp32" grad_norm) |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad++; n++ } END { print n + 0, bad + 0 }')
[ "$n" = "2 0" ] && ok || bad "grpo zero3 on cuda: grad_norm ($n)"
# bf16: the first generation phase samples data parallel's completions (the same bf16 products)
[ -n "$(curve_col "$TMP/gbf16" reward)" ] && [ "$(curve_col "$TMP/gbf16" reward | head -1)" = "$(curve_col "$TMP/gzbf16" reward | head -1)" ] && ok ||
  bad "grpo zero3 bf16 on cuda: reward $(curve_col "$TMP/gzbf16" reward | tr '\n' ' ') vs $(curve_col "$TMP/gbf16" reward | tr '\n' ' ')"
# PPO (the value model sliced on the devices as the policy, online_ppo.c, its reference sliced too): the
# same scores and norms, the value model's gradient norm and loss within 1e-5
INI_BATCH=2 INI_TARGET=6 INI_TRAIN="dtype = fp32" online_ini ppo p 2 "[ppo]" "response_length = 8" "num_ppo_epochs = 1" |
  sed 's/^device = cpu/device = cuda/; /^eval_file/d' >"$TMP/ppo.ini"
for name in p pz; do
  z=(--set train.save_strategy=steps --set train.save_steps=1)
  [ $name = pz ] && z+=(--set memory.strategies=zero3)
  "${MPI[@]}" "${C[@]}" train "$TMP/ppo.ini" --set run.output_dir="$TMP/$name" "${z[@]}" >"$TMP/$name.log" 2>&1 ||
    { bad "ppo $name: exited $?"; tail -20 "$TMP/$name.log"; }
done
[ -n "$(curve_col "$TMP/p" objective/scores)" ] && [ "$(curve_col "$TMP/p" objective/scores)" = "$(curve_col "$TMP/pz" objective/scores)" ] && ok ||
  bad "ppo zero3 on cuda: scores $(curve_col "$TMP/pz" objective/scores | tr '\n' ' ') vs $(curve_col "$TMP/p" objective/scores | tr '\n' ' ')"
n=$(paste <(curve_col "$TMP/p" grad_norm) <(curve_col "$TMP/pz" grad_norm) |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad++; n++ } END { print n + 0, bad + 0 }')
[ "$n" = "2 0" ] && ok || bad "ppo zero3 on cuda: grad_norm ($n)"
CURVE_MIN=2 curve_close "$TMP/p" "$TMP/pz" value_model/grad_norm 1e-5
CURVE_MIN=2 curve_close "$TMP/p" "$TMP/pz" loss/value_avg 1e-5
# each rank holds about half of the value model on its device; data parallel keeps it whole
read -r vres vall < <(grep -o "zero3: the value model sliced as the policy: parameters resident at most [0-9]* of its [0-9]* bytes per rank on its device" "$TMP/pz.log" |
  sed -E 's/.* at most ([0-9]+) of its ([0-9]+) bytes.*/\1 \2/')
echo "ppo zero3 on cuda: the value model's parameters on a rank's device $vres of $vall bytes"
[ -n "$vall" ] && [ $((2 * vres)) -le $((vall + vall / 4)) ] && grep -q "its own adamw optimizer stepping on the device, over its slices (zero3)" "$TMP/pz.log" &&
  ! grep -q "value model sliced" "$TMP/p.log" && ok || bad "ppo zero3 on cuda: the value model not sliced on the device: '$vres' '$vall'"
# its checkpoint (the value model gathered whole on the devices, written by rank 0; its optimizer state
# one file per rank) resumes the same curve to the same value model bytes
mkdir -p "$TMP/pzr" && cp -r "$TMP/pz/checkpoint-1" "$TMP/pzr/" && grep '"step": 1,' "$TMP/pz/metrics.jsonl" >"$TMP/pzr/metrics.jsonl"
"${MPI[@]}" "${C[@]}" train "$TMP/ppo.ini" --set run.output_dir="$TMP/pzr" --set memory.strategies=zero3 --set train.save_strategy=steps \
  --set train.save_steps=1 --set train.resume_from_checkpoint=last >"$TMP/pzr.log" 2>&1 || { bad "ppo pzr: exited $?"; tail -20 "$TMP/pzr.log"; }
for k in loss grad_norm value_model/grad_norm loss/value_avg objective/scores; do
  [ "$(curve_col "$TMP/pz" $k)" = "$(curve_col "$TMP/pzr" $k)" ] || bad "ppo zero3 on cuda resumed: $k differs"
done
cmp -s "$TMP/pz/checkpoint-2/value_model.safetensors" "$TMP/pzr/checkpoint-2/value_model.safetensors" && ok ||
  bad "ppo zero3 on cuda resumed: the value model differs"
# the value model written whole: data parallel's after the first step, within 1e-4 (its floats past the header)
vfloats() { tail -c +$((9 + $(head -c 8 "$1" | od -A n -t u8))) "$1" | od -A n -v -t f4 -w4; }
vd=$(paste <(vfloats "$TMP/p/checkpoint-1/value_model.safetensors") <(vfloats "$TMP/pz/checkpoint-1/value_model.safetensors") |
  awk 'NF == 2 { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ } END { printf "%d %g\n", n, m + 0 }')
[ "${vd%% *}" -gt 1000 ] && awk -v m="${vd#* }" 'BEGIN { exit !(m < 1e-4) }' && ok || bad "ppo zero3 on cuda: the saved value model vs data parallel's: $vd"
# ... its reference sliced on the devices as the policy (kind_online.c), data parallel's whole
grep -q "zero3: the reference model sliced as the policy: parameters resident at most [0-9]* of its [0-9]* bytes per rank on its device" "$TMP/pz.log" &&
  ! grep -q "reference model sliced" "$TMP/p.log" && ok || bad "ppo zero3 on cuda: the reference not sliced on the device"
# ds3_gather_for_generation = false (core/train/zero_generate.c): each decoding pass gathers one layer
# at a time into device memory mapped for it (the fp32 masters, in bf16 too, as the whole gather sends)
# and unmaps it after, the ranks in lockstep: the completions, rewards and gradient norms of the whole
# gather's run bit for bit (the same products on the same weights), with less device memory mapped for
# the parameters during generation than the whole model
for dt in fp32 bf16; do
  INI_BATCH=2 INI_TRAIN="dtype = $dt" online_ini grpo g 2 "[grpo]" "num_generations = 4" "max_completion_length = 8" |
    sed 's/^device = cpu/device = cuda/; /^eval_file/d' >"$TMP/grpo.ini"
  "${MPI[@]}" "${C[@]}" train "$TMP/grpo.ini" --set run.output_dir="$TMP/gl$dt" --set memory.strategies=zero3 \
    --set generation.ds3_gather_for_generation=false >"$TMP/gl$dt.log" 2>&1 || { bad "grpo gl$dt: exited $?"; tail -20 "$TMP/gl$dt.log"; }
  for k in reward grad_norm loss; do
    [ -n "$(curve_col "$TMP/gz$dt" $k)" ] && [ "$(curve_col "$TMP/gz$dt" $k)" = "$(curve_col "$TMP/gl$dt" $k)" ] && ok ||
      bad "grpo zero3 $dt layer by layer on cuda: $k $(curve_col "$TMP/gl$dt" $k | tr '\n' ' ') vs $(curve_col "$TMP/gz$dt" $k | tr '\n' ' ')"
  done
  line=$(grep -o "zero3 generation one layer at a time (ds3_gather_for_generation = false): parameters device memory mapped at most [0-9]* of the model's [0-9]* bytes" "$TMP/gl$dt.log")
  read -r res model < <(echo "$line" | grep -o '[0-9][0-9]*' | sed -n '3p;4p' | tr '\n' ' ')
  whole=$(grep -o "ds3_gather_for_generation = true): parameters device memory mapped at most [0-9]*" "$TMP/gz$dt.log" | grep -o '[0-9]*$')
  echo "grpo zero3 $dt on cuda, device memory mapped for the parameters during generation: layer by layer at most $res, whole $whole of $model bytes"
  [ -n "$res" ] && [ -n "$whole" ] && [ "$res" -gt 0 ] && [ "$res" -lt "$whole" ] && ok || bad "grpo zero3 $dt layer by layer: '$line', whole '$whole'"
done
finish
