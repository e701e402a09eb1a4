# Sourced by the adamw_8bit e2e tests (after e2e_common.sh and tiny_setup): writes $TMP/run.ini, an
# 8-step SFT run of the tiny model with [train] optimizer = adamw_8bit (min_8bit_size 256, so the
# tiny model's matrices get 8-bit state), a checkpoint every 4 steps.
# usage: adamw8bit_ini OUTPUT_DIR DEVICE BATCH WEIGHT_DECAY [EXTRA [train] LINE...]
adamw8bit_ini() {
  local out=$1 device=$2 batch=$3 wd=$4
  shift 4
  {
    printf '[run]\noutput_dir = %s\ndevice = %s\n[model]\npath = %s\n' "$out" "$device" "$TMP/model"
    printf '[data]\ntrain_file = %s\n' "$TMP/data/train.jsonl"
    printf '[train]\noptimizer = adamw_8bit\nlearning_rate = 3e-3\nweight_decay = %s\nmax_steps = 8\n' "$wd"
    printf 'per_device_train_batch_size = %s\nlogging_steps = 1\nsave_steps = 4\n' "$batch"
    [ $# -gt 0 ] && printf '%s\n' "$@"
    printf '[adamw_8bit]\nmin_8bit_size = 256\n'
  } >"$TMP/run.ini"
}
