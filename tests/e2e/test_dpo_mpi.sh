#!/usr/bin/env bash
# DPO over MPI (the sequence kind under data parallel): `mpirun -np 2` with
# per_device_train_batch_size 2 follows one process with batch 4 on the DPO curve fixture's pairs
# (tests/fixtures/trl_dpo): loss, grad_norm and the per-pair metrics (rewards/*, logps/*), gathered
# over the ranks as TRL gathers them, within 1e-5 relative (plus 1e-7 for values near zero).
# Skipped (77) only when mpirun or the MPI backend (libctrl_mpi.so) is absent.
# usage: test_dpo_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
LIBDIR=$(dirname "$CTRL")
if ! command -v mpirun >/dev/null; then echo "SKIP: mpirun not found"; exit 77; fi
if [ ! -e "$LIBDIR/libctrl_mpi.so" ]; then echo "SKIP: ctrl was built without MPI (no libctrl_mpi.so)"; exit 77; fi
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
MPI=(mpirun -np 2 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
[ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
FIX="$SRC/tests/fixtures"
for n in one two; do
  sed -e "s|@DIR@|$FIX/trl_dpo|; s|@SFT@|$FIX/trl_sft|; s|@OUT@|$TMP/$n|; s/^max_steps = 20/max_steps = 6/" \
    "$FIX/trl_dpo/sigmoid.ini" >"$TMP/$n.ini"
done
sed -i 's/^per_device_train_batch_size = 4/per_device_train_batch_size = 2/' "$TMP/two.ini"
"${C[@]}" train "$TMP/one.ini" >"$TMP/one.log" 2>&1 && ok || { bad "one process, batch 4"; tail -3 "$TMP/one.log"; }
"${MPI[@]}" "${C[@]}" train "$TMP/two.ini" >"$TMP/two.log" 2>&1 && ok || { bad "two ranks"; tail -3 "$TMP/two.log"; }
# every training line's KEY
col() { grep -o "\"$2\": [-0-9.e]*" "$TMP/$1/metrics.jsonl" | awk '{print $2}'; }
for key in loss grad_norm rewards/chosen rewards/rejected rewards/margins rewards/accuracies logps/chosen \
  logps/rejected; do
  if paste <(col one "$key") <(col two "$key") | awk -v key="$key" '
      { n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
        if (d > 1e-5 * a + 1e-7) { print "  " key " line " NR ": " $1 " vs " $2; bad = 1 } }
      END { exit (bad || n != 6) }'; then
    ok
  else
    bad "2 ranks x 2 pairs differ from 1 x 4 on $key"
  fi
done
finish
