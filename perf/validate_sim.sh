#!/usr/bin/env bash
# Validates the simulator (qccl_sim) against measured runs: each point runs all_reduce_perf under
# qcclrun --netem (emulated hosts on this machine, each rank or block of ranks behind a shaped link)
# and qccl_sim with the same ranks, hosts, link, codec and size, and prints a Markdown table of the
# measured median, the prediction and their ratio. A point whose prediction is off by more than 15%
# is marked; the exit status is 1 when any is.
#
# The model is measured before each block of points (one rate and topology), since this machine's
# speed drifts: `qccl_sim calibrate` for the CPU costs, and the transport's CPU cost per byte
# (cpu.wire) from an unshaped 2-host all-reduce of 64 MiB (qcclrun -n 2 --nodes 2), which is
# CPU-bound: what the model's other costs leave of its median time, per byte each rank sends and
# receives. stderr shows each block's model.
#
# Usage: perf/validate_sim.sh [--build DIR] [--reps N] [--iters N] [--rates LIST] [--ranks LIST]
#                             [--codecs LIST] [--model FILE] [--quick]
#   --build DIR    the build folder (default build)
#   --reps N       measured runs per point; the median of their times is kept (default 3)
#   --iters N      timed calls per run (default 5)
#   --rates LIST   emulated link rates (default "100mbit 1gbit")
#   --ranks LIST   topologies as RANKS or RANKS:HOSTS (default "2 4 4:2 8 8:4")
#   --codecs LIST  codecs, space-separated (default "none fp16 q8 q4 sign:eta_s=0.01 int8 fft")
#   --model FILE   qccl_sim's model, used as is (default: measured before each block; the built-in
#                  model with --measured)
#   --measured MD  take the measured medians from an earlier run's table (its rows for the same
#                  points) instead of measuring again: for comparing a changed model
#   --allow-missing  with --measured: skip the points the table has no row for
#   --quick        one rate (1gbit), topologies "2 4:2", codecs "none q8"
# Sizes: 4 MiB at 100 Mbit/s and below, 16 MiB above. Needs root (qcclrun --netem).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build REPS=3 ITERS=5 RATES="100mbit 1gbit" RANKS="2 4 4:2 8 8:4"
CODECS="none fp16 q8 q4 sign:eta_s=0.01 int8 fft" MODEL="" MEASURED="" ALLOW_MISSING=0
while (($#)); do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --codecs) CODECS=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --measured) MEASURED=$2; shift 2 ;;
    --allow-missing) ALLOW_MISSING=1; shift ;;
    --quick) RATES=1gbit RANKS="2 4:2" CODECS="none q8"; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "validate_sim.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
QCCLRUN=$BUILD/tools/qcclrun PERF=$BUILD/perf/all_reduce_perf SIM=$BUILD/sim/qccl_sim
needed=("$SIM")
[[ -z $MEASURED ]] && needed+=("$QCCLRUN" "$PERF")
for f in "${needed[@]}"; do
  [[ -x $f ]] || { echo "validate_sim.sh: $f is missing: build first" >&2; exit 2; }
done
[[ -n $MEASURED || $EUID == 0 ]] || { echo "validate_sim.sh: qcclrun --netem needs root" >&2; exit 2; }
[[ -z $MEASURED || -r $MEASURED ]] || { echo "validate_sim.sh: --measured $MEASURED cannot be read" >&2; exit 2; }
CORES=$(nproc)

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Writes $TMP/model.txt: the model the next block of points is simulated with.
measure_model() {
  if [[ -n $MODEL ]]; then cp "$MODEL" "$TMP/model.txt"; return; fi
  if [[ -n $MEASURED ]]; then : > "$TMP/model.txt"; return; fi  # the built-in model
  "$SIM" calibrate -o "$TMP/model.txt" 2>/dev/null
  echo "cpu.wire = 0   # measured below" >> "$TMP/model.txt"  # (the file's last value of a key wins)
  local times="" t rep
  for ((rep = 0; rep < 3; ++rep)); do
    t=$("$QCCLRUN" -n 2 --nodes 2 -- "$PERF" -b 64M -e 64M -n 3 -w 1 -z 3 -a 3 -c 0 2>&1 |
        awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { print $7; exit }') || true
    times+=" $t"
  done
  local measured rest
  measured=$(echo "$times" | median || true)
  rest=$("$SIM" -m "$TMP/model.txt" -n 2 -l 1000tbit -b 64M | awk '!/^#/ && $8 ~ /^[0-9.]+$/ { print $8 }')
  # each of the 2 ranks sends and receives 64 MiB
  awk -v m="$measured" -v r="$rest" 'BEGIN { w = (m - r) * 1e-6 / (2 * 64 * 1048576); if (w < 0) w = 0;
    printf "cpu.wire = %.4g   # unshaped 2-host all-reduce of 64 MiB: %.1f ms, %.1f of it other costs\n", w, m / 1e3, r / 1e3 }' \
    >> "$TMP/model.txt"
  echo "model for the next block: $(grep -E '^cpu\.(wire|reduce)|^codec\.fft\.fft_encode' "$TMP/model.txt" |
                                      tail -3 | tr '\n' ';')" >&2
}

median() { tr ' ' '\n' | { grep . || true; } | sort -g | awk '{v[NR] = $1} END {if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "| link | ranks | hosts | codec | size | measured (ms) | simulated (ms) | sim / measured | bound |"
echo "|---|---:|---:|---|---:|---:|---:|---:|---|"
status=0
for rate in $RATES; do
  bits=$(awk -v r="$rate" 'BEGIN { m = r; sub(/[a-z]+$/, "", m); u = r; sub(/^[0-9.]+/, "", u);
         f = (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : (u == "gbit") ? 1e9 : 1; print m * f }')
  size=$(awk -v b="$bits" 'BEGIN { print (b <= 1e8) ? "4M" : "16M" }')
  for topo in $RANKS; do
    measure_model
    n=${topo%%:*} hosts=""
    [[ $topo == *:* ]] && hosts=${topo##*:}
    for codec in $CODECS; do
      perf_codec=() sim_codec=() op=sum
      if [[ $codec != none ]]; then perf_codec=(--codec "$codec"); sim_codec=(-z "$codec"); fi
      [[ $codec == sign* ]] && op=avg  # Marsit averages
      times=""
      if [[ -n $MEASURED ]]; then  # | rate | ranks | hosts | codec | size | measured (ms) | ...
        times=$(awk -F'|' -v r="$rate" -v n="$n" -v h="${hosts:-$n}" -v c="$codec" -v s="$size" '
          { for (i = 2; i <= 7; ++i) gsub(/ /, "", $i) }
          $2 == r && $3 == n && $4 == h && $5 == c && $6 == s && $7 ~ /^[0-9.]+$/ { print $7 * 1e3; exit }' "$MEASURED")
      fi
      [[ -n $MEASURED && -z $times && $ALLOW_MISSING == 1 ]] && continue
      reps=$REPS
      [[ -n $MEASURED ]] && reps=0
      for ((rep = 0; rep < reps; ++rep)); do
        line=$("$QCCLRUN" -n "$n" --netem "$rate" ${hosts:+--nodes "$hosts"} -- \
                 "$PERF" -b "$size" -e "$size" -n "$ITERS" -w 2 -z 3 -a 3 -c 0 -o "$op" "${perf_codec[@]}" 2>&1 |
               awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { print $7; exit }') || true
        [[ -n $line ]] && times+=" $line"
      done
      measured=$(echo "$times" | median || true)
      sim=$("$SIM" -m "$TMP/model.txt" -n "$n" ${hosts:+--hosts "$hosts"} -l "netem:$rate" --machine-cores "$CORES" \
              -b "$size" -o "$op" "${sim_codec[@]}" | awk '!/^#/ && $8 ~ /^[0-9.]+$/ { print $8, $NF }' || true)
      sim_us=${sim% *} bound=${sim#* }
      [[ -n $sim ]] || sim_us=
      if [[ -z $measured || -z $sim_us ]]; then
        echo "| $rate | $n | ${hosts:-$n} | $codec | $size | ${measured:-failed} | ${sim_us:-failed} | — | |"
        status=1
        continue
      fi
      row=$(awk -v m="$measured" -v s="$sim_us" 'BEGIN { r = s / m; printf "%.1f | %.1f | %.2f%s", m / 1e3, s / 1e3, r,
                                                       (r > 1.15 || r < 0.85) ? " **off**" : "" }')
      [[ $row == *off* ]] && status=1
      echo "| $rate | $n | ${hosts:-$n} | $codec | $size | $row | $bound |"
    done
  done
done
exit $status
