#!/usr/bin/env bash
# ZeRO-3 on CUDA with LoRA, 2 ranks under the CUDA emulator (issue 19; core/train/zero_device.c): the
# frozen base of each layer is sliced as the trainable layers are (each rank keeps its half on its
# device, the rest of a layer mapped, gathered over NCCL and unmapped around each use: the emulator
# faults on a touch of unmapped memory), gathered with the layer's adapters, never reduced nor stepped;
# the adapters are reduce-scattered and stepped on each rank's slices; each rank's host reads only its
# slices of the frozen base's layers (QLoRA: keeps its super-blocks of each NF4 weight) as the whole
# read's curve. The curve is plain data
# parallel's with LoRA on CUDA (fp32: 1e-6; bf16, the base gathered as bf16 values: bf16's
# tolerance), the saves write the adapter alone (its layers' adapter slices all-gathered, the base
# never), a 2-rank resume of checkpoint-3 repeats the curve and the adapter exactly, and the per-rank
# device bytes the run logs hold about half the layers (base and adapters). DoRA (each layer's weight
# norms computed after its gather) follows data parallel's DoRA curve on CUDA and on the CPU.
# QLoRA and QDoRA: the device's NF4 store sliced (each rank's super-blocks of every weight on its
# device, a layer's gathered around its use), data parallel's QLoRA / QDoRA curves on CUDA (fp32; QLoRA in bf16
# too; QDoRA in bf16 with every tensor persistent as without; QDoRA with init_lora_weights = false read
# sliced as the whole read), a QLoRA checkpoint resumes exactly; GRPO over it
# generating layer by layer samples data parallel's completions.
# usage: test_zero3_lora_cuda_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA EMU_LIBCTRL_MPI
source "$(dirname "$0")/e2e_common.sh"
cuda_emu_mpi_setup "$4" "$5"
tiny_setup 7 3
cuda_run_ini "$TMP/run.ini" "[peft]" "enabled = true" "target_modules = all-linear"
run() { mpi_train "$@"; }
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl"; }
z3=(--set memory.strategies=zero3 --set memory.reduce_bucket_size=1)
run dp --set train.save_strategy=no
run z3 "${z3[@]}"
curve_close "$TMP/dp" "$TMP/z3" loss 1e-6
curve_close "$TMP/dp" "$TMP/z3" grad_norm 1e-5
# whole() NAME ARGS...: a run reading the frozen base whole on every rank's host (CTRL_TEST_ZERO3_WHOLE_LORA)
whole() { local m0=("${MPI[@]}") && export CTRL_TEST_ZERO3_WHOLE_LORA=1 && MPI+=(-x CTRL_TEST_ZERO3_WHOLE_LORA) &&
  run "$@"; MPI=("${m0[@]}") && unset CTRL_TEST_ZERO3_WHOLE_LORA; }
# each rank's host read its slices of the frozen base's layers only (the frozen embeddings and head
# whole, as the device keeps them), as zero.Init: the curve and adapter of the whole read's, bit for bit
whole z3w "${z3[@]}"
grep -q "zero3 + LoRA: each rank read its slices of the frozen base from .* (each layer's, the embeddings' and an untied head's; the final norm whole)" "$TMP/z3.log" &&
  [ "$(curve "$TMP/z3")" = "$(curve "$TMP/z3w")" ] && cmp -s "$TMP/z3/adapter_model.safetensors" "$TMP/z3w/adapter_model.safetensors" && ok ||
  bad "zero3 LoRA on cuda: not read sliced, or not the whole read's curve: $(grep -o "zero3 + LoRA: .*" "$TMP/z3.log")"
# the saves: the adapter alone, its layers' adapter slices all-gathered, the frozen base never
for f in adapter_model.safetensors adapter_config.json checkpoint-3/adapter_model.safetensors \
  checkpoint-3/optimizer.rank-0.safetensors checkpoint-3/optimizer.rank-1.safetensors; do
  [ -f "$TMP/z3/$f" ] && ok || bad "zero3 LoRA on cuda: no $f"
done
[ ! -e "$TMP/z3/model.safetensors" ] && [ ! -e "$TMP/z3/checkpoint-3/model.safetensors" ] && ok || bad "zero3 LoRA on cuda: the base was written"
for what in "the adapter" "checkpoint-3's adapter"; do
  grep -q "zero3: $what saved from the adapters alone, 3 layers' adapter slices all-gathered (the frozen base never gathered)" "$TMP/z3.log" && ok ||
    bad "zero3 LoRA on cuda: no adapter-save line for $what: $(grep -o "zero3: .* saved .*" "$TMP/z3.log")"
done
# the adapter saved holds data parallel's weights (its final save)
floats() { tail -c +$((9 + $(head -c 8 "$1" | od -A n -t u8))) "$1" | od -A n -v -t f4 -w4; } # past the header
maxdiff() { # the largest difference between two safetensors files' floats (the same header)
  paste <(floats "$1") <(floats "$2") | awk 'NF == 2 { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d } END { printf "%g\n", m + 0 }'
}
[ -f "$TMP/dp/adapter_model.safetensors" ] && [ "$(stat -c %s "$TMP/dp/adapter_model.safetensors")" = "$(stat -c %s "$TMP/z3/adapter_model.safetensors")" ] &&
  awk -v m="$(maxdiff "$TMP/dp/adapter_model.safetensors" "$TMP/z3/adapter_model.safetensors")" 'BEGIN { exit !(m < 1e-4) }' && ok ||
  bad "zero3 LoRA on cuda: the adapter differs from data parallel's ($(maxdiff "$TMP/dp/adapter_model.safetensors" "$TMP/z3/adapter_model.safetensors"))"
# its checkpoint resumes the same curve and adapter on 2 ranks
mkdir -p "$TMP/r3" && cp -r "$TMP/z3/checkpoint-3" "$TMP/r3/"
grep '"step": [1-3],' "$TMP/z3/metrics.jsonl" >"$TMP/r3/metrics.jsonl"
run r3 "${z3[@]}" --set train.resume_from_checkpoint=last
diff <(curve "$TMP/z3") <(curve "$TMP/r3") >"$TMP/diff" && cmp -s "$TMP/z3/adapter_model.safetensors" "$TMP/r3/adapter_model.safetensors" &&
  ok || { bad "zero3 LoRA on cuda: resumed curve or adapter differs"; cat "$TMP/diff"; }
# what a rank holds on its device between steps: what lies outside the layers whole, about half of the
# layers' bytes (the frozen base's and the adapters'), give or take the pieces the slices share; the
# frozen embeddings and head are sliced too (session #18; whole on every device before), so only the
# final norm (32 floats) lies outside the sliced bytes
d3() { grep -o "zero3 on the device: per rank between steps at most [0-9]* of the model's [0-9]* bytes of parameters (layers, embeddings and head [0-9]* bytes, sliced over 2 ranks)" "$1"; }
read -r pm p lay < <(d3 "$TMP/z3.log" | grep -o '[0-9][0-9]*' | sed -n '2p;3p;4p' | tr '\n' ' ')
piece=$(grep -o "pieces of [0-9]* bytes" "$TMP/z3.log" | grep -o '[0-9][0-9]*')
echo "zero3 LoRA on CUDA, per rank between steps: parameters $pm of $p bytes (layers, base and adapters, $lay); pieces of $piece bytes"
slop=$((12 * ${piece:-0}))
[ -n "$piece" ] && [ "$lay" -gt $((p / 2)) ] && [ $((p - lay)) -le 1024 ] && [ $((2 * (pm - (p - lay)) - lay)) -le $((2 * slop)) ] &&
  [ $((2 * (pm - (p - lay)) - lay)) -ge $((-2 * slop)) ] && ok || bad "zero3 LoRA device bytes: '$(d3 "$TMP/z3.log")'"
# bf16: the base's slices held as bf16 values (2 bytes a parameter) and gathered as such, the
# adapters' fp32 master slices apart; data parallel's bf16 curve within bf16's precision
run dpb --set train.save_strategy=no --set train.dtype=bf16
run z3b "${z3[@]}" --set train.save_strategy=no --set train.dtype=bf16
curve_close "$TMP/dpb" "$TMP/z3b" loss 1e-3
curve_close "$TMP/dpb" "$TMP/z3b" grad_norm 1e-2
# in bf16 no fp32 piece of the layers stays mapped between steps (the base's slices are bf16 values, the
# adapters' masters apart), and the bf16 slices are about a quarter of the layers' fp32 bytes; the
# frozen embeddings and head (E bytes: the model's untied pair) stay fp32, half of them on each rank
b3() { grep -o "zero3 on the device in bf16: per rank between steps [0-9]* bytes of the layers' fp32 master slices and [0-9]* of the bf16 copy's" "$1"; }
read -r pmb < <(d3 "$TMP/z3b.log" | grep -o '[0-9][0-9]*' | sed -n '2p')
read -r master b16 < <(b3 "$TMP/z3b.log" | grep -o '[0-9][0-9]*' | sed -n '3p;5p' | tr '\n' ' ')
cfg() { tr ',' '\n' <"$TMP/model/config.json" | sed -n "s/.*\"$1\":[[:space:]]*//p"; }
pair=2 && [ "$(cfg tie_word_embeddings)" = true ] && pair=1
E=$(($(cfg vocab_size) * $(cfg hidden_size) * 4 * pair))
echo "zero3 LoRA bf16 on CUDA, per rank between steps: parameters $pmb, adapters' fp32 masters $master, bf16 slices $b16 (embeddings and head $E bytes)"
fp=$((pmb - (p - lay) - E / 2)) q4=$((4 * b16 - (lay - E)))
[ -n "$b16" ] && [ "$fp" -le $((2 * piece)) ] && [ "$fp" -ge $((-2 * piece)) ] && [ "$q4" -le $((4 * 2 * 4 * piece)) ] &&
  [ "$q4" -ge $((-4 * 2 * 4 * piece)) ] && ok || bad "zero3 LoRA bf16 device bytes: '$(d3 "$TMP/z3b.log")' '$(b3 "$TMP/z3b.log")' (E $E)"
# QLoRA ([peft] quantization = nf4): the device's copy of the NF4 store sliced as the CPU slices the
# host's (core/train/zero_nf4.c): each rank keeps its super-blocks of every weight in device memory and
# a layer's are all-gathered over NCCL into device buffers around each use, freed after it (the
# emulator faults on a freed buffer's read). The products read the bytes data parallel's whole store
# holds: its curve (loss 1e-6, gradient norm 1e-5), not plain LoRA's
run dpq --set train.save_strategy=no --set peft.quantization=nf4
run z3q "${z3[@]}" --set peft.quantization=nf4
curve_close "$TMP/dpq" "$TMP/z3q" loss 1e-6
curve_close "$TMP/dpq" "$TMP/z3q" grad_norm 1e-5
# each rank quantized the NF4 weights one at a time and kept its super-blocks (read sliced): the whole read's curve
whole z3qw "${z3[@]}" --set peft.quantization=nf4 --set train.save_strategy=no
grep -q "zero3 + QLoRA: each rank read its slices of the frozen embeddings (and an untied head) from .* and kept its slices of each NF4 weight" "$TMP/z3q.log" &&
  [ "$(curve "$TMP/z3q")" = "$(curve "$TMP/z3qw")" ] && ok ||
  bad "zero3 QLoRA on cuda: not read sliced, or not the whole read's curve: $(grep -o "zero3 + QLoRA: .*" "$TMP/z3q.log")"
[ "$(curve_col "$TMP/dpq" loss | tail -1)" != "$(curve_col "$TMP/dp" loss | tail -1)" ] && ok || bad "zero3 QLoRA on cuda: plain LoRA's curve"
# each rank holds about half of the NF4 bytes on its device, and between steps nothing more
read -r lo hi whole < <(grep -o "zero3: the NF4 base sliced over 2 ranks: each rank holds [0-9]* to [0-9]* of its [0-9]* bytes" "$TMP/z3q.log" |
  sed -E 's/.* holds ([0-9]+) to ([0-9]+) of its ([0-9]+) bytes/\1 \2 \3/')
held=$(grep -o "zero3: the NF4 base between steps: at most [0-9]* of its [0-9]* bytes held per rank in device memory" "$TMP/z3q.log" |
  sed -E 's/.* at most ([0-9]+) of .*/\1/')
echo "zero3 QLoRA on CUDA: NF4 bytes per rank $lo to $hi of $whole; between steps $held"
[ -n "$whole" ] && [ "$held" = "$hi" ] && [ $((lo + hi)) = "$whole" ] && [ "$hi" -le $((whole / 2 + 2 * (8192 + 256 + 4))) ] && ok ||
  bad "zero3 QLoRA device bytes: $lo $hi $whole $held"
# the move to the device copied none of the NF4 weights: each rank put its pieces there alone
grep -q "zero3: the NF4 base's slices put in .* memory; the device never held the whole store" "$TMP/z3q.log" && ok ||
  bad "zero3 QLoRA: $(grep "NF4 base's slices put" "$TMP/z3q.log")"
# its checkpoint resumes the same curve and adapter on 2 ranks (the NF4 slices cut again at the start)
mkdir -p "$TMP/r3q" && cp -r "$TMP/z3q/checkpoint-3" "$TMP/r3q/"
grep '"step": [1-3],' "$TMP/z3q/metrics.jsonl" >"$TMP/r3q/metrics.jsonl"
run r3q "${z3[@]}" --set peft.quantization=nf4 --set train.resume_from_checkpoint=last
diff <(curve "$TMP/z3q") <(curve "$TMP/r3q") >"$TMP/diff" && cmp -s "$TMP/z3q/adapter_model.safetensors" "$TMP/r3q/adapter_model.safetensors" &&
  ok || { bad "zero3 QLoRA on cuda: resumed curve or adapter differs"; cat "$TMP/diff"; }
# bf16 (the products multiply the dequantized tiles in bf16): data parallel's bf16 QLoRA curve
run dpqb --set train.save_strategy=no --set peft.quantization=nf4 --set train.dtype=bf16
run z3qb "${z3[@]}" --set train.save_strategy=no --set peft.quantization=nf4 --set train.dtype=bf16
curve_close "$TMP/dpqb" "$TMP/z3qb" loss 1e-3
curve_close "$TMP/dpqb" "$TMP/z3qb" grad_norm 1e-2
# QDoRA in bf16 with every tensor of the layers persistent (stage3_param_persistence_threshold = 1e9: the
# base's norms, the adapters and DoRA's magnitudes whole as their bf16 values; the adapter saves, which
# gather the fp32 masters, give them back): the curve and adapter at 0, bit for bit
for t in 0 1e9; do
  run "qd$t" "${z3[@]}" --set peft.quantization=nf4 --set peft.use_dora=true --set train.dtype=bf16 \
    --set train.max_steps=4 --set train.save_steps=2 --set memory.stage3_param_persistence_threshold=$t
done
[ -n "$(curve_col "$TMP/qd0" loss)" ] && [ "$(curve "$TMP/qd0")" = "$(curve "$TMP/qd1e9")" ] &&
  cmp -s "$TMP/qd0/adapter_model.safetensors" "$TMP/qd1e9/adapter_model.safetensors" && ok ||
  bad "zero3 QDoRA bf16 on cuda, every tensor persistent: another curve or adapter"
# QDoRA: its base weights' row norms read once from the host's NF4 store before it is sliced
run dpqd --set train.save_strategy=no --set peft.quantization=nf4 --set peft.use_dora=true
run z3qd "${z3[@]}" --set train.save_strategy=no --set peft.quantization=nf4 --set peft.use_dora=true
curve_close "$TMP/dpqd" "$TMP/z3qd" loss 1e-6
curve_close "$TMP/dpqd" "$TMP/z3qd" grad_norm 1e-5
[ "$(curve_col "$TMP/dpqd" loss | tail -1)" != "$(curve_col "$TMP/dpq" loss | tail -1)" ] && ok || bad "zero3 QDoRA on cuda: QLoRA's curve"
# ... with init_lora_weights = false (B != 0: each magnitude ||W + s B A|| computed as its NF4 weight
# loads whole, before the cut): read sliced, the whole read's curve bit for bit
qf=(--set train.save_strategy=no --set peft.quantization=nf4 --set peft.use_dora=true --set peft.init_lora_weights=false)
run z3qf "${z3[@]}" "${qf[@]}"
whole z3qfw "${z3[@]}" "${qf[@]}"
grep -q "zero3 + QLoRA: each rank read its slices of the frozen embeddings" "$TMP/z3qf.log" && [ -n "$(curve_col "$TMP/z3qf" loss)" ] &&
  [ "$(curve "$TMP/z3qf")" = "$(curve "$TMP/z3qfw")" ] && ok || bad "zero3 QDoRA init false on cuda: not read sliced, or not the whole read's curve"
# GRPO over the QLoRA base: generating with ds3_gather_for_generation = false gathers each layer's NF4
# weights for each decoding pass (the whole gather reads the same per-layer gathers); the completions
# sampled are plain data parallel's (equal rewards), the gradient norms within 1e-5
INI_BATCH=2 INI_TRAIN="dtype = fp32" online_ini grpo g 2 "[grpo]" "num_generations = 4" "max_completion_length = 8" |
  sed 's/^device = cpu/device = cuda/; /^eval_file/d' >"$TMP/grpo.ini"
printf '[peft]\nenabled = true\ntarget_modules = all-linear\nquantization = nf4\n' >>"$TMP/grpo.ini"
for name in gq gzq; do
  z=() && [ $name = gzq ] && z=(--set memory.strategies=zero3 --set generation.ds3_gather_for_generation=false)
  "${MPI[@]}" "${C[@]}" train "$TMP/grpo.ini" --set run.output_dir="$TMP/$name" "${z[@]}" >"$TMP/$name.log" 2>&1 ||
    { bad "grpo $name: exited $?"; tail -20 "$TMP/$name.log"; }
done
[ -n "$(curve_col "$TMP/gq" reward)" ] && [ "$(curve_col "$TMP/gq" reward)" = "$(curve_col "$TMP/gzq" reward)" ] && ok ||
  bad "grpo zero3 QLoRA on cuda: reward $(curve_col "$TMP/gzq" reward | tr '\n' ' ') vs $(curve_col "$TMP/gq" reward | tr '\n' ' ')"
CURVE_MIN=2 curve_close "$TMP/gq" "$TMP/gzq" grad_norm 1e-5
# DoRA: each layer's weight norms ||W + s B A|| computed once the layer is gathered (its base whole),
# recomputed after each step; data parallel's DoRA curve on CUDA and on the CPU
for dev in cuda cpu; do
  run dd$dev --set run.device=$dev --set peft.use_dora=true --set train.save_strategy=no
  run zd$dev "${z3[@]}" --set run.device=$dev --set peft.use_dora=true --set train.save_strategy=no
  curve_close "$TMP/dd$dev" "$TMP/zd$dev" loss 1e-6
  curve_close "$TMP/dd$dev" "$TMP/zd$dev" grad_norm 1e-5
done
# not the plain LoRA curve: the magnitudes trained (from the second step on)
[ "$(curve_col "$TMP/ddcuda" loss | tail -1)" != "$(curve_col "$TMP/dp" loss | tail -1)" ] && ok || bad "zero3 DoRA: LoRA's curve"
finish
