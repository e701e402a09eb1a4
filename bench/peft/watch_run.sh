# Sourced by bench/peft/memory.sh and lora_sft_long.sh: watch_run TPID METRICS STEPS waits for the
# background `/usr/bin/time ... ctrl train` TPID and, once METRICS (its metrics.jsonl) logs steps,
# samples its child's /proc every 0.05 s; it sets max (the largest VmRSS seen while training, KiB),
# cpu1 and cpun (user + system CPU ticks when step 1 and step STEPS are logged) and returns the
# run's exit status.
watch_run() {
  local tpid=$1 metrics=$2 steps=$3 pid r logged ticks
  max=0 cpu1='' cpun=''
  while kill -0 "$tpid" 2>/dev/null; do
    pid=$(pgrep -P "$tpid" | head -1 || true)
    if [ -n "$pid" ] && [ -s "$metrics" ]; then
      r=$(awk '/VmRSS/ {print $2}' /proc/$pid/status 2>/dev/null || echo 0)
      [ "${r:-0}" -gt "$max" ] && max=$r
      logged=$(grep -c '"step"' "$metrics" || true)
      ticks=$(awk '{print $14 + $15}' /proc/$pid/stat 2>/dev/null || true)
      [ -z "$cpu1" ] && [ "$logged" -ge 1 ] && cpu1=$ticks
      [ -z "$cpun" ] && [ "$logged" -ge "$steps" ] && cpun=$ticks
    fi
    sleep 0.05
  done
  wait "$tpid"
}
