#!/usr/bin/env bash
# Packing end to end on the CPU: a tiny model trains on packed rows with each strategy (bfd,
# bfd_split, wrapped) and an eval_fraction hold-out (packed too, as packing says), the loss falls
# and eval metrics are written; wrapped blocks as padded rows to a multiple of 8 train too; with bfd,
# padding_free = false changes nothing (TRL forces padding-free batches); bad packing options are
# config errors naming the key.
# usage: test_packing.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
tiny_setup 11 1
cat >"$TMP/run.ini" <<INI
[run]
output_dir = $TMP/out
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
eval_fraction = 0.05
max_length = 64
packing = true
[train]
learning_rate = 3e-3
max_steps = 40
per_device_train_batch_size = 2
logging_steps = 10
INI

loss_at() { sed -n "$2p" "$1/metrics.jsonl" | sed 's/.*"loss": \([0-9.]*\).*/\1/'; }

for strategy in bfd bfd_split wrapped; do
  out="$TMP/$strategy"
  if "${C[@]}" train "$TMP/run.ini" --set data.packing_strategy=$strategy --set run.output_dir="$out" \
    >"$TMP/log.$strategy" 2>&1; then ok; else
    bad "$strategy: train exited $?"
    tail -5 "$TMP/log.$strategy"
    continue
  fi
  # the packing report: examples into rows of 64 for the train and the eval set
  grep -q "train: [0-9]* examples packed ($strategy) into [0-9]* rows of 64" "$TMP/log.$strategy" && ok ||
    bad "$strategy: no packing report"
  grep -q "eval: [0-9]* examples packed ($strategy)" "$TMP/log.$strategy" && ok || bad "$strategy: eval not packed"
  first=$(loss_at "$out" 1)
  last=$(loss_at "$out" 4)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a * 0.8) }' && ok || bad "$strategy: loss did not fall: $first -> $last"
  grep -q '"eval_exact_match"' "$out/metrics.jsonl" && ok || bad "$strategy: no eval metrics"
  echo "$strategy: loss $first -> $last; $(grep -o 'fill rate [0-9.]*' "$TMP/log.$strategy" | head -1)"
done

# wrapped blocks as padded rows, padded to a multiple of 8; the eval set unpacked (and truncated)
"${C[@]}" train "$TMP/run.ini" --set data.packing_strategy=wrapped --set data.padding_free=false \
  --set data.pad_to_multiple_of=8 --set data.eval_packing=false --set run.output_dir="$TMP/padded" \
  >"$TMP/log.padded" 2>&1 && ok || { bad "padded wrapped rows: exit $?"; tail -5 "$TMP/log.padded"; }
grep -q "eval: [0-9]* examples packed" "$TMP/log.padded" && bad "eval_packing = false still packs" || ok
grep -q '"eval_exact_match"' "$TMP/padded/metrics.jsonl" && ok || bad "padded: no eval metrics"

# bfd with padding_free = false: the same batches (TRL forces padding-free), so the same metrics
"${C[@]}" train "$TMP/run.ini" --set data.padding_free=false --set run.output_dir="$TMP/bfd_padded" >/dev/null 2>&1
same() { sed 's/, "tokens_per_second": [0-9.e+-]*//' "$1/metrics.jsonl"; }
[ "$(same "$TMP/bfd" | grep -c '"loss"')" -eq 4 ] && cmp -s <(same "$TMP/bfd") <(same "$TMP/bfd_padded") &&
  ok || bad "bfd with padding_free = false differs"

# bad options name the key
"${C[@]}" train "$TMP/run.ini" --set data.packing_strategy=first_fit >"$TMP/log.bad" 2>&1
grep -q "packing_strategy" "$TMP/log.bad" && ok || { bad "unknown strategy not reported"; cat "$TMP/log.bad"; }
"${C[@]}" train "$TMP/run.ini" --set data.eval_fraction=0.9 >"$TMP/log.bad" 2>&1
grep -q "eval_fraction" "$TMP/log.bad" && ok || { bad "eval_fraction out of range not reported"; cat "$TMP/log.bad"; }

finish
