# Shared by the shell tests (sourced): arguments CTRL_BINARY PLUGIN_DIR SOURCE_DIR, a temporary
# directory removed on exit, pass/fail counters, and a tiny model with synthetic data.
set -u
CTRL=$1
PLUGINS=$2
SRC=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
C=("$CTRL" --plugin-dir "$PLUGINS")

# tiny_setup SEED LAYERS: $TMP/data/{train,eval}.jsonl (arithmetic) and a random $TMP/model (hidden 32)
tiny_setup() {
  bash "$SRC/scripts/make_quickstart_data.sh" "$TMP/data" "$1" >/dev/null
  "${C[@]}" model init --arch qwen2 --hidden 32 --layers "$2" --heads 2 \
    --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/model" >/dev/null || bad "model init"
}

# Prints the counts and exits non-zero when anything failed.
finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
