#!/usr/bin/env bash
# A third-party plugin built OUT OF TREE: install ctrl into a temporary prefix, build
# examples/reward_plugin with pkg-config only, load it with --plugin-dir, see it listed, described
# and accepted by config check, and scoring completions in a GRPO run of the installed ctrl.
# usage: test_out_of_tree_plugin.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }

cmake --install "$BUILD" --prefix "$TMP/prefix" >"$TMP/install.log" 2>&1 || { cat "$TMP/install.log"; fail "cmake --install"; }
LIBDIR=$(ls -d "$TMP/prefix"/lib* | head -n1)
for f in "$TMP/prefix/bin/ctrl" "$TMP/prefix/include/ctrl/plugin.h" "$TMP/prefix/include/ctrl/reward.h" \
         "$LIBDIR/pkgconfig/ctrl.pc" "$LIBDIR/ctrl/plugins/length.so"; do
  [ -e "$f" ] || fail "installed tree lacks $f"
done
ls "$LIBDIR"/libctrl.so* >/dev/null 2>&1 || fail "installed tree lacks libctrl.so"

cp -r "$SRC/examples/reward_plugin" "$TMP/plugin"
export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
[ -f "$(pkg-config --variable=includedir ctrl)/ctrl/plugin.h" ] || fail "pkg-config's includedir lacks ctrl/plugin.h"
make -C "$TMP/plugin" >"$TMP/make.log" 2>&1 || { cat "$TMP/make.log"; fail "building the example plugin"; }
# Everything a plugin calls goes through the host table (ctrl/plugin_api.h): the example and every
# installed plugin import no ctrl_* symbol, so none can bind to libctrl by mistake.
for so in "$TMP/plugin/keyword.so" "$LIBDIR"/ctrl/plugins/*.so; do
  imports=$(nm -D --undefined-only "$so" | awk '{print $NF}' | grep '^ctrl_' || true)
  [ -z "$imports" ] || fail "$(basename "$so") imports from libctrl: $imports"
done
# A libctrl function the host table does not offer is not declared to a plugin: calling one does
# not compile, and libctrl's own headers cannot be mixed in after plugin_api.h.
printf '#include <ctrl/plugin_api.h>\nconst char *f(void) { return ctrl_error_message(); }\n' >"$TMP/direct.c"
if cc -std=c11 -Werror -c $(pkg-config --cflags ctrl) "$TMP/direct.c" -o "$TMP/direct.o" 2>/dev/null; then
  fail "a plugin calling ctrl_error_message() directly compiled"
fi
# Every installed header stands alone (C11, pedantic).
for h in "$TMP/prefix/include/ctrl/"*.h; do
  printf '#include <ctrl/%s>\n' "$(basename "$h")" >"$TMP/alone.c"
  cc -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only $(pkg-config --cflags ctrl) "$TMP/alone.c" ||
    fail "ctrl/$(basename "$h") does not compile on its own"
done
printf '#include <ctrl/plugin_api.h>\n#include <ctrl/status.h>\n' >"$TMP/mixed.c"
if cc -std=c11 -c $(pkg-config --cflags ctrl) "$TMP/mixed.c" -o "$TMP/mixed.o" 2>/dev/null; then
  fail "libctrl's status.h was accepted after plugin_api.h"
fi

CTRL="$TMP/prefix/bin/ctrl"
"$CTRL" --plugin-dir "$TMP/plugin" plugins >"$TMP/list.txt" 2>&1 || { cat "$TMP/list.txt"; fail "ctrl plugins"; }
grep -q "reward *keyword *1.0.0 .*keyword.so" "$TMP/list.txt" || { cat "$TMP/list.txt"; fail "keyword not listed"; }
# The installed plugins come from the install directory without any --plugin-dir.
grep -q "reward *length" "$TMP/list.txt" || { cat "$TMP/list.txt"; fail "installed plugins not found"; }
"$CTRL" --plugin-dir "$TMP/plugin" plugins describe reward/keyword >"$TMP/desc.txt" 2>&1 || fail "describe"
grep -q "max_matches" "$TMP/desc.txt" || fail "describe lacks options"

cat >"$TMP/run.ini" <<INI
[model]
path = $SRC/tests/fixtures/models/qwen2
attention = eager
[reward.kw]
plugin = keyword
keyword = \boxed
INI
if grep -q "attention *eager" "$TMP/list.txt"; then
  "$CTRL" --plugin-dir "$TMP/plugin" config check "$TMP/run.ini" >"$TMP/check.txt" 2>&1 || { cat "$TMP/check.txt"; fail "config check with the plugin"; }
  sed -i 's/^keyword = .*//' "$TMP/run.ini"
  if "$CTRL" --plugin-dir "$TMP/plugin" config check "$TMP/run.ini" >"$TMP/check.txt" 2>&1; then
    fail "a missing required plugin option was accepted"
  fi
  grep -q "keyword: required key is missing" "$TMP/check.txt" || { cat "$TMP/check.txt"; fail "message for the missing option"; }
fi
# The plugin scores completions in a real run: two GRPO steps of the installed ctrl on a tiny model,
# the keyword reward (every "a" scores) logged as rewards/kw/mean, and its mean matches the
# completions the run wrote.
if grep -q "trainer *grpo" "$TMP/list.txt"; then
  bash "$SRC/scripts/make_quickstart_data.sh" "$TMP/data" >/dev/null
  "$CTRL" model init --arch qwen2 --hidden 32 --layers 1 --heads 2 --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" \
    --out "$TMP/model" >/dev/null 2>&1 || fail "model init"
  cat >"$TMP/grpo.ini" <<INI
[run]
trainer = grpo
output_dir = $TMP/out
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train_prompts.jsonl
[train]
max_steps = 2
per_device_train_batch_size = 8
logging_steps = 1
save_strategy = no
[generation]
kv_cache_bytes = 4000000
log_completions = true
[grpo]
num_generations = 4
max_completion_length = 24
[reward.kw]
plugin = keyword
keyword = a
INI
  "$CTRL" --plugin-dir "$TMP/plugin" train "$TMP/grpo.ini" >"$TMP/train.log" 2>&1 || { tail -5 "$TMP/train.log"; fail "GRPO run with the plugin"; }
  grep -q '"rewards/kw/mean": ' "$TMP/out/metrics.jsonl" || fail "no rewards/kw/mean in the metrics"
  grep -q '"rewards":{"kw":[0-9]' "$TMP/out/completions.jsonl" || fail "the completions carry no keyword score"
fi
echo "1 passed, 0 failed"
