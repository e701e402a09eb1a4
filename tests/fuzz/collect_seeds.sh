#!/usr/bin/env bash
# Collects the fuzz targets' seed corpora from the test fixtures (and the few small hand-made seeds
# in tests/fuzz/seeds/) into OUT/<target>/. Nothing here is committed: the corpora are rebuilt from
# the fixtures on every build (CMake target fuzz_seeds).
# Usage: collect_seeds.sh SOURCE_DIR OUT
set -euo pipefail
src=$1 out=$2
fx=$src/tests/fixtures
sep=$'\n=====\n' # FUZZ_SEPARATOR (tests/fuzz/fuzz_common.h)
rm -rf "$out"
mkdir -p "$out"/{safetensors,model_config,adapter_config,tokenizer,tokenize_text,template,config,sft_rows,prompt_rows,pref_rows,serve_body,parquet,serve_wire}

# safetensors: small files made here (the fixtures' are hundreds of KB): an 8-byte little-endian
# header length, the JSON header, the data.
st_seed() { # FILE HEADER DATA_BYTES [PREFIX_BYTE]
  local len=${#2}
  {
    [ -n "${4:-}" ] && printf "\\x$4"
    printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((len & 255)) $((len >> 8 & 255)) $((len >> 16 & 255)) $((len >> 24)))"
    printf '\x00\x00\x00\x00%s' "$2"
    head -c "$3" /dev/zero
  } >"$1"
}
st_seed "$out/safetensors/f32" '{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}' 24
st_seed "$out/safetensors/bf16_f16" '{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[1,2],"data_offsets":[8,12]}}' 12
st_seed "$out/safetensors/scalar_empty" '{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]}}' 4
st_seed "$out/safetensors/other_dtypes" '{"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},"u":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}}' 11

for d in "$fx"/models/*/; do cp "$d/config.json" "$out/model_config/$(basename "$d").json"; done
for d in "$fx"/lora/*/; do cp "$d/adapter_config.json" "$out/adapter_config/$(basename "$d").json"; done

cp "$src"/tests/fuzz/seeds/tokenizer/* "$out/tokenizer/"

# tokenize_text: first byte picks the tokenizer (0 byte-level BPE, 1 SentencePiece-style).
i=0
while IFS= read -r line; do
  printf '\x00%s' "$line" >"$out/tokenize_text/bpe_$i"
  printf '\x01%s' "$line" >"$out/tokenize_text/sp_$i"
  i=$((i + 1))
done < <(head -n 40 "$fx/tokenizer/corpus.jsonl")

cp "$fx"/templates/*.jinja "$src"/tests/fuzz/seeds/template/*.jinja "$out/template/"

for f in "$src"/configs/*.ini "$fx"/trl_sft/*.ini; do cp "$f" "$out/config/$(basename "$(dirname "$f")")_$(basename "$f")"; done
{ cat "$src/configs/quickstart.ini"; printf '%s' "${sep}train.learning_rate=1e-4"$'\n'"data.max_length=64"; } \
  >"$out/config/quickstart_with_set"
# [peft]'s choices of modules and per-module ranks (core/config/settings_peft.c): lists, JSON, regexes --
# over the fixtures' model and data, which exist, so that the settings are read (paths are checked first)
peft_ini=$'[model]\npath = '"$fx"$'/models/qwen2\n[data]\ntrain_file = '"$fx"$'/sft_data/conversational_prompt_completion.jsonl\n[peft]\nenabled = true\n'
printf '%s%s' "$peft_ini" $'exclude_modules = k_proj\nlayers_to_transform = 0, 1\nlayers_pattern = layers\nrank_pattern = {"q_proj": 8, "down_proj": 2}\nalpha_pattern = {"v_proj": 3}\nlora_bias = true\n' >"$out/config/peft_choices"
printf '%s%s' "$peft_ini" $'target_modules_regex = .*\\.layers\\.[01]\\.self_attn\\.(q|v)_proj\nexclude_modules_regex = .*1\\.self_attn\\.v_proj\ninit_lora_weights = pissa\n' >"$out/config/peft_regex"
printf '%s%s' "$peft_ini" $'trainable_token_indices = 3, 17, 42\ntrainable_token_indices_lm_head = 5, 9\n' >"$out/config/peft_tokens"

# sft_rows: first byte picks the [data] configuration (tests/fuzz/fuzz_sft_rows.c); 0x10 also packs.
for f in "$fx"/sft_data/*.jsonl "$fx"/sft_data/messages_array.json "$fx"/trl_sft/messages.jsonl; do
  case $f in *.expected.jsonl) continue ;; esac
  for pick in 00 01 02 13; do
    { printf "\\x$pick"; cat "$f"; } >"$out/sft_rows/${pick}_$(basename "$f")"
  done
done

# pref_rows: the first byte's low 6 bits p pick the trainer (p % 3: dpo, kto, reward) and the [data]
# configuration (p / 3 % 4); 0x40 asks for padded batches (tests/fuzz/fuzz_pref_rows.c).
for f in "$fx"/pref/*.jsonl; do
  case $f in *.expected.jsonl) continue ;; esac
  case $(basename "$f") in kto_*) picks="01 04 47" ;; reward_*) picks="02 05 4b" ;; *) picks="00 03 46 09" ;; esac
  for pick in $picks; do
    { printf "\\x$pick"; cat "$f"; } >"$out/pref_rows/${pick}_$(basename "$f")"
  done
done

for f in "$fx"/sft_data/prompt_completion.jsonl "$fx"/sft_data/conversational_prompt_completion.jsonl \
  "$fx"/trl_sft/prompt_completion.jsonl; do
  cp "$f" "$out/prompt_rows/$(basename "$(dirname "$f")")_$(basename "$f")"
done
printf '[{"prompt": "2+2=", "answer": "4"}, {"prompt": [{"role": "user", "content": "hi"}], "x": [1]}]' \
  >"$out/prompt_rows/array.json"

# serve_body: first byte picks the endpoint (0 /generate, 1 /v1/completions, 2 /v1/chat/completions,
# 3 /update_weights: a safetensors body with parameters of tests/fixtures/trl_sft/model).
body() { printf "\\x$1%s" "$3" >"$out/serve_body/$2"; }
body 00 trl '{"prompts": ["Hello", "2+2="], "n": 2, "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 1}'
body 00 trl_ids '{"prompt_token_ids": [[1, 2, 3], [4, 5]], "max_tokens": 4, "repetition_penalty": 1.1, "min_p": 0.05, "top_k": -1}'
body 01 completions '{"model": "m", "prompt": "Once upon", "max_tokens": 8, "stream": true, "n": null}'
body 01 completions_list '{"prompt": ["a", "b"], "n": 1, "temperature": 0}'
body 02 chat '{"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 8, "stream": false}'
st_seed "$out/serve_body/weights_f32" '{"model.norm.weight":{"dtype":"F32","shape":[64],"data_offsets":[0,256]}}' 256 03
st_seed "$out/serve_body/weights_bf16" '{"__metadata__":{"format":"pt"},"model.layers.0.input_layernorm.weight":{"dtype":"BF16","shape":[64],"data_offsets":[0,128]}}' 128 03

# parquet: the parquet and Arrow readers' fixtures (pyarrow and datasets wrote them; a few KB each).
cp "$fx"/parquet/*.parquet "$fx"/arrow/*.arrow "$out/parquet/"
cp "$fx"/arrow/chat_dict/train/data-00000-of-00001.arrow "$out/parquet/save_to_disk.arrow"

# serve_wire: a chunked HTTP body (first byte even) and the pickled NCCL unique id (odd).
printf '\x00%s' $'5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n' >"$out/serve_wire/chunked"
{ printf '\x01'; cat "$fx/serve/nccl_unique_id.pickle"; } >"$out/serve_wire/nccl_unique_id"

echo "fuzz seeds: $(find "$out" -type f | wc -l) files in $out"
