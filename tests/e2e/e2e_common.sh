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

# The MPI tests: skips (exit 77) without mpirun or libctrl_mpi.so; MPI=(mpirun -np 2 ...) and one
# OpenMP thread per rank. OpenMPI refuses root without --allow-run-as-root (CI containers run as
# root); no binding (2 ranks beside other tests on a small machine); no CMA single copy (blocked
# by containers' ptrace rules).
mpi_setup() {
  LIBDIR=$(dirname "$CTRL")
  if ! command -v mpirun >/dev/null; then echo "SKIP: mpirun not found (scripts/install-deps.sh installs OpenMPI)"; exit 77; fi
  if [ ! -e "$LIBDIR/libctrl_mpi.so" ]; then echo "SKIP: ctrl was built without MPI (no libctrl_mpi.so)"; exit 77; fi
  export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
  MPI=(mpirun -np 2 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
  if [ "$(id -u)" = 0 ]; then MPI+=(--allow-run-as-root); fi
}

# Prints the counts and exits non-zero when anything failed.
finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
