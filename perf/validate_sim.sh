#!/usr/bin/env bash
# Validates the simulator (qccl_sim) against measured runs: each point runs all_reduce_perf under
# qcclrun --netem (emulated hosts on this machine, each rank or block of ranks behind a shaped link)
# and qccl_sim with the same ranks, hosts, link, codec and size, and prints a Markdown table of the
# measured median, the prediction and their ratio. A point whose prediction is off by more than 15%
# is marked; the exit status is 1 when any is, 2 when the script cannot run (a bad option, a missing
# binary, no root, or `qccl_sim calibrate` failing).
#
# The model is measured before each block of points (one rate and topology), since this machine's
# speed drifts: `qccl_sim calibrate` for the CPU costs, and the transport's CPU cost per byte
# (cpu.wire) and per message (cpu.message) from two unshaped 2-host all-reduces (qcclrun -n 2
# --nodes 2), which are CPU-bound: 64 MiB in the default chunks (few, large messages) and 16 MiB
# in 8 KiB chunks (2,048 messages each way). What the model's other costs leave of their median
# times gives two equations in the two costs (their coefficients from qccl_sim itself). stderr shows
# each block's model.
#
# Usage: perf/validate_sim.sh [--build DIR] [--reps N] [--iters N] [--rates LIST] [--ranks LIST]
#                             [--codecs LIST] [--chunk SIZE] [--model FILE] [--quick]
#   --build DIR    the build folder (default build)
#   --reps N       measured runs per point; the median of their times is kept (default 3)
#   --iters N      timed calls per run (default 5)
#   --rates LIST   emulated link rates (default "100mbit 1gbit")
#   --ranks LIST   topologies as RANKS or RANKS:HOSTS (default "2 4 4:2 8 8:4")
#   --codecs LIST  codecs, space-separated (default "none fp16 q8 q4 sign:eta_s=0.01 int8 fft")
#   --chunk SIZE   the pipeline chunk in bytes, for the runs (QCCL_CHUNK_BYTES) and the simulator
#                  (--chunk) alike (default: the library's for the link)
#   --model FILE   qccl_sim's model, used as is (default: measured before each block; the built-in
#                  model with --measured)
#   --measured MD  take the measured medians from an earlier run's table (its rows for the same
#                  points) instead of measuring again: for comparing a changed model
#   --allow-missing  with --measured: skip the points the table has no row for
#   --quick        one rate (1gbit), topologies "2 4:2", codecs "none q8"
# Sizes: 4 MiB at 100 Mbit/s and below, 16 MiB above. Needs root (qcclrun --netem). Relative paths
# are taken from the directory the script is started in.
set -euo pipefail

# A path given on the command line is the caller's, resolved before the script moves to the repository.
from_caller() { if [[ $1 == /* ]]; then printf '%s\n' "$1"; else printf '%s\n' "$PWD/$1"; fi; }

BUILD=build REPS=3 ITERS=5 RATES="100mbit 1gbit" RANKS="2 4 4:2 8 8:4"
CODECS="none fp16 q8 q4 sign:eta_s=0.01 int8 fft" MODEL="" MEASURED="" ALLOW_MISSING=0 CHUNK=
while (($#)); do
  case $1 in
    --build|--reps|--iters|--rates|--ranks|--codecs|--model|--measured|--chunk)
      (($# >= 2)) || { echo "validate_sim.sh: $1 needs a value" >&2; exit 2; } ;;
  esac
  case $1 in
    --build) BUILD=$(from_caller "$2"); shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --codecs) CODECS=$2; shift 2 ;;
    --model) MODEL=$(from_caller "$2"); shift 2 ;;
    --measured) MEASURED=$(from_caller "$2"); shift 2 ;;
    --allow-missing) ALLOW_MISSING=1; shift ;;
    --quick) RATES=1gbit RANKS="2 4:2" CODECS="none q8"; shift ;;
    --chunk) CHUNK=$2; shift 2 ;;
    -h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "validate_sim.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
[[ $REPS =~ ^[1-9][0-9]*$ && $ITERS =~ ^[1-9][0-9]*$ ]] ||
  { echo "validate_sim.sh: --reps and --iters take a count >= 1 (got '$REPS', '$ITERS')" >&2; exit 2; }
cd "$(dirname "$0")/.."  # the default build folder is the repository's
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
  # Without the CPU costs there is no model to compare against: stop, with the tool's own reason.
  if ! "$SIM" calibrate -o "$TMP/model.txt" 2>"$TMP/calibrate.err"; then
    echo "validate_sim.sh: qccl_sim calibrate failed; its stderr:" >&2
    cat "$TMP/calibrate.err" >&2
    exit 2
  fi
  local large="" small="" t rep
  for ((rep = 0; rep < 3; ++rep)); do
    t=$("$QCCLRUN" -n 2 --nodes 2 -- "$PERF" -b 64M -e 64M -n 3 -w 1 -z 3 -a 3 -c 0 2>&1 |
        awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { print $7; exit }') || true
    large+=" $t"
    t=$("$QCCLRUN" -n 2 --nodes 2 -x QCCL_CHUNK_BYTES=8192 -- "$PERF" -b 16M -e 16M -n 3 -w 1 -z 3 -a 3 -c 0 2>&1 |
        awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { print $7; exit }') || true
    small+=" $t"
  done
  large=$(echo "$large" | median || true)
  small=$(echo "$small" | median || true)
  # The simulated time (us) of either run with the given cpu.wire and cpu.message, the rest of the
  # model as calibrated (the file's last value of a key wins).
  simulated() {  # WIRE MESSAGE SIZE CHUNK
    { cat "$TMP/model.txt"; echo "cpu.wire = $1"; echo "cpu.message = $2"; } > "$TMP/probe.txt"
    "$SIM" -m "$TMP/probe.txt" -n 2 -l 1000tbit -b "$3" --chunk "$4" | awk '!/^#/ && $8 ~ /^[0-9.]+$/ { print $8 }'
  }
  local l0 lw lm s0 sw sm
  l0=$(simulated 0 0 64M 256K) lw=$(simulated 1e-9 0 64M 256K) lm=$(simulated 0 1e-5 64M 256K)
  s0=$(simulated 0 0 16M 8K) sw=$(simulated 1e-9 0 16M 8K) sm=$(simulated 0 1e-5 16M 8K)
  # time = rest + a * wire + b * message for each run: solved for the two costs (none below 0)
  local v
  for v in "$large" "$small" "$l0" "$lw" "$lm" "$s0" "$sw" "$sm"; do
    if ! [[ $v =~ ^[0-9.]+$ ]]; then
      echo "validate_sim.sh: a calibration run failed (measured '$large' '$small', simulated '$l0' '$lw' '$lm'" \
           "'$s0' '$sw' '$sm'): the model keeps its cpu.wire and cpu.message" >&2
      return
    fi
  done
  awk -v L="$large" -v S="$small" -v l0="$l0" -v lw="$lw" -v lm="$lm" -v s0="$s0" -v sw="$sw" -v sm="$sm" 'BEGIN {
    a1 = (lw - l0) / 1e-9; b1 = (lm - l0) / 1e-5; c1 = L - l0;
    a2 = (sw - s0) / 1e-9; b2 = (sm - s0) / 1e-5; c2 = S - s0;
    det = a1 * b2 - a2 * b1;
    if (det == 0 || a1 <= 0 || b2 <= 0) {
      print "validate_sim.sh: the two calibration runs do not tell the costs apart" > "/dev/stderr"; exit
    }
    w = (c1 * b2 - c2 * b1) / det; m = (a1 * c2 - a2 * c1) / det;
    if (m < 0) { m = 0; w = c1 / a1 } if (w < 0) { w = 0; m = (c2 > 0) ? c2 / b2 : 0 }
    printf "cpu.wire = %.4g   # unshaped 2-host all-reduces: 64 MiB %.1f ms (%.1f of it other costs),\n",
           w, L / 1e3, l0 / 1e3
    printf "cpu.message = %.4g   # and 16 MiB in 8 KiB chunks %.1f ms (%.1f)\n", m, S / 1e3, s0 / 1e3 }' \
    >> "$TMP/model.txt"
  echo "model for the next block: $(grep -E '^cpu\.(wire|message|reduce)|^codec\.fft\.fft_encode' "$TMP/model.txt" |
                                      tail -4 | tr '\n' ';')" >&2
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
        line=$("$QCCLRUN" -n "$n" --netem "$rate" ${hosts:+--nodes "$hosts"} ${CHUNK:+-x QCCL_CHUNK_BYTES="$CHUNK"} -- \
                 "$PERF" -b "$size" -e "$size" -n "$ITERS" -w 2 -z 3 -a 3 -c 0 -o "$op" "${perf_codec[@]}" 2>&1 |
               awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { print $7; exit }') || true
        [[ -n $line ]] && times+=" $line"
      done
      measured=$(echo "$times" | median || true)
      sim=$("$SIM" -m "$TMP/model.txt" -n "$n" ${hosts:+--hosts "$hosts"} -l "netem:$rate" --machine-cores "$CORES" \
              ${CHUNK:+--chunk "$CHUNK"} -b "$size" -o "$op" "${sim_codec[@]}" | awk '!/^#/ && $8 ~ /^[0-9.]+$/ { print $8, $NF }' || true)
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
