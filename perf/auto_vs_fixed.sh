#!/usr/bin/env bash
# Measures QCCL_CODEC=auto against fixed choices: for each cell (ranks, hosts, emulated link, size)
# all_reduce_perf runs under qcclrun once per choice, the choices taking turns (round 1: every
# choice, round 2: every choice, ...) so that the machine's drift falls on all of them alike, and a
# Markdown row gives each choice's median time (of every round's out-of-place and in-place times),
# the fastest fixed choice, auto's time over it, and what auto ran (its INFO log line of the first
# round). A fixed codec runs through QCCL_CODEC=SPEC with QCCL_CODEC_MIN_BYTES=0, the plain-call path
# auto takes; `none` is uncompressed.
#
# Usage: perf/auto_vs_fixed.sh [--build DIR] [--rounds N] [--iters N] [--fixed LIST] [--auto SPEC]
#                              CELL...
#   CELL           RANKS[:HOSTS]@LINK@SIZE: LINK a qcclrun --netem rate (100mbit, 1gbit, 10gbit),
#                  each rank its own host without :HOSTS; or shm, no shaped link (every rank on one
#                  host, or with :HOSTS emulated hosts joined by unshaped veth pairs); SIZE as
#                  all_reduce_perf takes it (64K, 1M, 256M). Example: 8@100mbit@16M 4:2@10gbit@256M
#   --build DIR    the build folder (default build)
#   --rounds N     rounds of turns (default 3)
#   --iters N      timed calls per run, after one untimed warm-up (default 5)
#   --fixed LIST   fixed choices, space-separated (default "none q8")
#   --auto SPEC    auto's spec (default auto; auto:maxrelerr=0.2 for instance)
# Needs root where qcclrun emulates hosts (every cell but RANKS@shm@SIZE). Prints the table on
# stdout, each run's command on stderr. A relative --build is taken from the directory the script is
# started in.
set -euo pipefail

BUILD=build ROUNDS=3 ITERS=5 FIXED="none q8" AUTO=auto
CELLS=()
while (($#)); do
  case $1 in
    --build|--rounds|--iters|--fixed|--auto)
      (($# >= 2)) || { echo "auto_vs_fixed.sh: $1 needs a value" >&2; exit 2; } ;;
  esac
  case $1 in
    --build) BUILD=$2; [[ $BUILD == /* ]] || BUILD=$PWD/$BUILD; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --fixed) FIXED=$2; shift 2 ;;
    --auto) AUTO=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "auto_vs_fixed.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
    *) CELLS+=("$1"); shift ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $ITERS =~ ^[1-9][0-9]*$ ]] ||
  { echo "auto_vs_fixed.sh: --rounds and --iters take a count >= 1 (got '$ROUNDS', '$ITERS')" >&2; exit 2; }
read -ra fixed <<< "$FIXED"
((${#fixed[@]})) || { echo "auto_vs_fixed.sh: --fixed names no choice" >&2; exit 2; }
((${#CELLS[@]})) || { echo "auto_vs_fixed.sh: no cell given (--help shows the form: 4:2@1gbit@1M)" >&2; exit 2; }
cd "$(dirname "$0")/.."  # the default build folder is the repository's
QCCLRUN=$BUILD/tools/qcclrun PERF=$BUILD/perf/all_reduce_perf
for f in "$QCCLRUN" "$PERF"; do
  [[ -x $f ]] || { echo "auto_vs_fixed.sh: $f is missing: build first" >&2; exit 2; }
done
for cell in "${CELLS[@]}"; do
  [[ $cell =~ ^([0-9]+)(:([0-9]+))?@([0-9a-z]+)@([0-9]+[KMG]?)$ ]] ||
    { echo "auto_vs_fixed.sh: cell '$cell' is not RANKS[:HOSTS]@LINK@SIZE" >&2; exit 2; }
  [[ (${BASH_REMATCH[4]} == shm && -z ${BASH_REMATCH[3]}) || $EUID == 0 ]] ||
    { echo "auto_vs_fixed.sh: emulated hosts need root ($cell)" >&2; exit 2; }
done

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

median() {
  sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

choices=("${fixed[@]}" "$AUTO")
header="| ranks | link | size |"
rule="|---|---|---:|"
for c in "${choices[@]}"; do header+=" $c (ms) |"; rule+="---:|"; done
echo "$header best fixed | auto / best | auto ran |"
echo "$rule---|---:|---|"
for cell in "${CELLS[@]}"; do
  [[ $cell =~ ^([0-9]+)(:([0-9]+))?@([0-9a-z]+)@([0-9]+[KMG]?)$ ]]
  ranks=${BASH_REMATCH[1]} hosts=${BASH_REMATCH[3]} link=${BASH_REMATCH[4]} size=${BASH_REMATCH[5]}
  where=(-n "$ranks")
  [[ -n $hosts ]] && where+=(--nodes "$hosts")
  [[ $link != shm ]] && where+=(--netem "$link")
  ran="?"
  for ((round = 0; round < ROUNDS; ++round)); do
    for i in "${!choices[@]}"; do
      c=${choices[$i]}
      env=(-x "QCCL_CODEC=$c")
      [[ $c == auto* ]] && env+=(-x QCCL_DEBUG=INFO) || env+=(-x QCCL_CODEC_MIN_BYTES=0)
      [[ $c == none ]] && env=()
      cmd=("$QCCLRUN" "${where[@]}" "${env[@]}" -- "$PERF" -b "$size" -e "$size" -n "$ITERS" -w 1 -c 0)
      echo "auto_vs_fixed.sh: ${cmd[*]}" >&2
      if ! "${cmd[@]}" > "$TMP/out" 2>&1; then
        echo "auto_vs_fixed.sh: failed ($cell, $c):" >&2
        tail -5 "$TMP/out" >&2
        exit 1
      fi
      times=$(awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { print $7 / 1000; print $11 / 1000 }' "$TMP/out")
      [[ -n $times ]] || { echo "auto_vs_fixed.sh: no time in all_reduce_perf's output ($cell, $c)" >&2; exit 1; }
      echo "$times" >> "$TMP/times.$i"
      if [[ $c == auto* && $round == 0 ]]; then
        ran=$(grep -m1 -o 'QCCL_CODEC=auto: AllReduce of [^:]*: [^,]*' "$TMP/out" | sed 's/.*: //') || ran="?"
      fi
    done
  done
  if [[ -n $hosts ]]; then placed=" on $hosts hosts"
  elif [[ $link == shm ]]; then placed=" on one host"
  else placed=" (a host each)"; fi
  row="| $ranks$placed | $link | $size |"
  best="" best_t=""
  for i in "${!choices[@]}"; do
    t[$i]=$(median < "$TMP/times.$i")
    rm -f "$TMP/times.$i"
    row+=" $(awk -v v="${t[$i]}" 'BEGIN { printf(v >= 100 ? "%.0f" : "%.3g", v) }') |"
    [[ ${choices[$i]} == auto* ]] && continue
    if [[ -z $best_t ]] || awk -v a="${t[$i]}" -v b="$best_t" 'BEGIN { exit !(a < b) }'; then
      best=${choices[$i]} best_t=${t[$i]}
    fi
  done
  auto_t=${t[$((${#choices[@]} - 1))]}
  echo "$row $best | $(awk -v a="$auto_t" -v b="$best_t" 'BEGIN { printf "%.2f", a / b }') | $ran |"
done
