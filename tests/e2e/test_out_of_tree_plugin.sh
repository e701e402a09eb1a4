#!/usr/bin/env bash
# A third-party plugin built OUT OF TREE: install ctrl into a temporary prefix, build
# examples/reward_plugin with pkg-config only, load it with --plugin-dir, see it listed, described
# and accepted by config check.
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

CTRL="$TMP/prefix/bin/ctrl"
"$CTRL" --plugin-dir "$TMP/plugin" plugins >"$TMP/list.txt" 2>&1 || { cat "$TMP/list.txt"; fail "ctrl plugins"; }
grep -q "reward *keyword *1.0.0 .*keyword.so" "$TMP/list.txt" || { cat "$TMP/list.txt"; fail "keyword not listed"; }
# The installed plugins come from the install directory without any --plugin-dir.
grep -q "reward *length" "$TMP/list.txt" || { cat "$TMP/list.txt"; fail "installed plugins not found"; }
"$CTRL" --plugin-dir "$TMP/plugin" plugins describe reward/keyword >"$TMP/desc.txt" 2>&1 || fail "describe"
grep -q "max_matches" "$TMP/desc.txt" || fail "describe lacks options"

cat >"$TMP/run.ini" <<'INI'
[model]
path = m
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
echo "1 passed, 0 failed"
