#!/usr/bin/env bash
# perf/run_perf.sh: qccl's all-reduce against its peers, as docs/PERF.md reports it.
#
#   1. Shared memory, 2 and 4 ranks, 64 KiB to 256 MiB, float sum: qccl's all_reduce_perf, Open MPI's
#      MPI_Allreduce (ob1/vader) and Gloo's ring all-reduce (TCP on loopback), interleaved run by run
#      so that the noise of this shared 2-core machine falls on all three alike; every run is repeated
#      R times and the median busbw per size is kept. Ratios qccl/peer per size, their geometric mean
#      and their minimum are compared with the targets.
#   2. An emulated 1 Gbit/s network (qcclrun --netem 1gbit), 4 ranks: qccl's time per size against the
#      wire floor 2(n-1)/n * S / (125e6 B/s), uncompressed and with the codecs of NETEM_CODECS.
#   3. Fast links: an emulated 10 Gbit/s network, 2 and 4 ranks: qccl uncompressed and with the codecs
#      of FAST_CODECS, Open MPI (ob1, tcp BTL) and Gloo crossing the same shaped links
#      (perf/netem_peer.sh), interleaved; each time beside its wire floor and its CPU floor (the bytes
#      its steps and the kernel's socket copies touch, over this machine's memcpy bandwidth, measured
#      in the same run by codec_perf).
#
# It prints the generated Markdown (the part of docs/PERF.md between the run_perf.sh markers) to
# stdout, or to --out FILE, and with --update DOC replaces that part of DOC. Progress goes to stderr.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: perf/run_perf.sh [--quick] [--build DIR] [--out FILE] [--update DOC] [--repeats R]
                        [--qccl-z N] [--no-shm] [--no-netem] [--no-fast] [--raw DIR] [--plots DIR]
  --quick       fewer sizes, one repeat, small -n: a smoke test of the whole pipeline (minutes)
  --build DIR   the qccl build directory (default: the repository's build)
  --out FILE    write the generated Markdown to FILE (default: stdout)
  --update DOC  replace the text between "<!-- BEGIN run_perf.sh -->" and "<!-- END run_perf.sh -->"
                in DOC (e.g. docs/PERF.md) with the generated Markdown
  --repeats R   repeats of every run; the median is reported (default 3, --quick 1)
  --qccl-z N    all_reduce_perf's -z (default 2: blocking calls back to back, as MPI_Allreduce and
                gloo::allreduce are timed; 0 issues them non-blocking, then waits)
  --no-shm      skip the shared-memory part (1.)
  --no-netem    skip the 1 Gbit/s part (2.; it needs root and network namespaces, as 3. does)
  --no-fast     skip the 10 Gbit/s part (3.)
                (Open MPI's mpirun and the peers' baselines, perf/baselines, are needed by 1. and 3.
                only: --no-shm --no-fast runs without them)
  --raw DIR     keep every run's raw nccl-tests table in DIR (default: deleted at exit)
  --plots DIR   draw the sweeps into DIR (perf/plot_perf.py: busbw against size per library, the
                emulated network's time beside its floor) and show them in the Markdown, linked
                relative to the document (--update, --out) or to DIR
Relative paths are taken from the directory the script is started in.
EOF
}

# ---- Options --------------------------------------------------------------------------------------
readonly ORIG_ARGS="$*"
BUILD="" OUT="" UPDATE="" QUICK=0 REPEATS="" QCCL_Z=2 SHM=1 NETEM=1 FAST=1 RAW="" PLOTS=""
while (($#)); do
  case "$1" in
    --quick) QUICK=1 ;;
    --build) BUILD=${2:?--build needs a directory}; shift ;;
    --out) OUT=${2:?--out needs a file}; shift ;;
    --update) UPDATE=${2:?--update needs a file}; shift ;;
    --repeats) REPEATS=${2:?--repeats needs a number}; shift ;;
    --qccl-z) QCCL_Z=${2:?--qccl-z needs 0..3}; shift ;;
    --no-shm) SHM=0 ;;
    --no-netem) NETEM=0 ;;
    --no-fast) FAST=0 ;;
    --raw) RAW=${2:?--raw needs a directory}; shift ;;
    --plots) PLOTS=${2:?--plots needs a directory}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_perf.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[[ -z $REPEATS ]] && REPEATS=$((QUICK ? 1 : 3))
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "run_perf.sh: --repeats must be a positive integer" >&2; exit 2; }
[[ $QCCL_Z =~ ^[0-3]$ ]] || { echo "run_perf.sh: --qccl-z must be 0, 1, 2 or 3" >&2; exit 2; }

# Sweeps as segments "MINBYTES MAXBYTES FACTOR ITERS": -n shrinks as the size grows, so that small
# sizes are timed over enough operations (one scheduler hiccup is ~1 ms here, a 64 KiB all-reduce
# ~50 us) while the whole run stays near 12 minutes on this machine (about 3 of them the 256 MiB rows).
RANKS=(2 4)
NETEM_RANKS=4
NETEM_RATE=1gbit
NETEM_BYTES_PER_S=125000000  # 1e9 bit/s nominal
FAST_RANKS=(2 4)
FAST_RATE=10gbit
FAST_BYTES_PER_S=1250000000
if ((QUICK)); then
  SHM_SEGMENTS=("64K 1M 4 20" "4M 16M 4 5")
  NETEM_SEGMENTS=("4M 64M 4 2")
  NETEM_CODECS=(q8)
  FAST_SEGMENT="64M 64M 2 3"
  FAST_CODECS=(q8)
else
  SHM_SEGMENTS=("64K 1M 2 200" "2M 16M 2 20" "32M 256M 2 5")
  NETEM_SEGMENTS=("1M 16M 4 10" "64M 256M 4 3")
  NETEM_CODECS=(fp16 q8 q4)
  FAST_SEGMENT="4M 64M 4 10"
  # Marsit's sign codec averages (-o avg, k=0: sign rounds only); IntSGD's int8 keeps a state per size.
  FAST_CODECS=(fp16 q8 q4 int8 sign:eta_s=0.01,k=0)
fi
readonly RUN_TIMEOUT=900  # seconds; a hung run fails the script rather than stalling it

log() { printf '[run_perf %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf 'run_perf.sh: %s\n' "$*" >&2; exit 1; }

# ---- Binaries ---------------------------------------------------------------------------------------
# The paths given are the caller's: made absolute before the script moves to the repository.
for var in BUILD OUT UPDATE RAW PLOTS; do
  if [[ -n ${!var} && ${!var} != /* ]]; then printf -v "$var" '%s' "$PWD/${!var}"; fi
done
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
BUILD=${BUILD:-$REPO/build}
[[ -d $BUILD ]] || die "build directory '$BUILD' not found (configure with: cmake -S . -B $BUILD -G Ninja)"
BUILD=$(cd "$BUILD" && pwd)
# Command lines are built as strings and split on spaces (so that the doc can print them as run).
[[ $BUILD != *[[:space:]]* ]] || die "the build directory's path must not contain spaces: '$BUILD'"
QCCLRUN=$BUILD/tools/qcclrun
ALL_REDUCE_PERF=$BUILD/perf/all_reduce_perf
CODEC_PERF=$BUILD/perf/codec_perf
NETEM_PEER=$REPO/perf/netem_peer.sh
for bin in "$QCCLRUN" "$ALL_REDUCE_PERF" "$CODEC_PERF"; do
  [[ -x $bin ]] || die "$bin not found: build it with 'ninja -C $BUILD all_reduce_perf codec_perf qcclrun'"
done
# Checked before the peers' baselines are built (minutes), so that a run bound to fail fails at once.
if ((NETEM || FAST)) && ((EUID != 0)); then
  die "the emulated networks need root (qcclrun --netem); run as root or pass --no-netem --no-fast"
fi
if ((FAST)); then
  command -v nsenter >/dev/null || die "nsenter not found (Debian package util-linux): the 10 Gbit/s part needs it (or pass --no-fast)"
fi
# Open MPI and Gloo run beside qccl in the shared-memory and 10 Gbit/s parts only; the 1 Gbit/s part
# times qccl alone.
PEERS=$((SHM || FAST))
if ((PEERS)); then
  command -v mpirun >/dev/null \
    || die "mpirun not found (Debian package openmpi-bin): the shared-memory and 10 Gbit/s parts need it" \
           "(or pass --no-shm --no-fast)"
fi

# The baselines come from the main build once perf/CMakeLists.txt has add_subdirectory(baselines);
# until then they are built on their own in $BUILD/peer-baselines.
find_baselines() {
  local dir
  for dir in "$BUILD/perf/baselines" "$BUILD/peer-baselines"; do
    if [[ -x $dir/mpi_allreduce_perf && -x $dir/gloo_allreduce_perf ]]; then
      MPI_PERF=$dir/mpi_allreduce_perf GLOO_PERF=$dir/gloo_allreduce_perf
      return 0
    fi
  done
  return 1
}
if ((PEERS)) && ! find_baselines; then
  log "building the peer baselines in $BUILD/peer-baselines"
  if ! { cmake -S perf/baselines -B "$BUILD/peer-baselines" -G Ninja && ninja -C "$BUILD/peer-baselines"; } >&2; then
    die "could not build perf/baselines (needs libopenmpi-dev and libgloo-dev)"
  fi
  find_baselines || die "perf/baselines built without mpi_allreduce_perf or gloo_allreduce_perf (see cmake's output)"
fi

# ---- Scratch space and clean-up ---------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/run_perf.XXXXXX")
NETEM_STARTED=0
cleanup() {
  local status=$?
  # qcclrun removes its namespaces itself, even when signalled; --cleanup only catches a qcclrun that
  # was SIGKILLed, and touches only namespaces whose job is gone.
  if ((NETEM_STARTED)); then "$QCCLRUN" --cleanup >/dev/null 2>&1 || true; fi
  if [[ -n $RAW ]]; then
    { mkdir -p "$RAW" && cp -r "$WORK"/raw/. "$RAW"/; } 2>/dev/null || log "could not copy the raw tables to $RAW"
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT

# Benchmarks run in the background and are waited for, so that a signal reaches this script at once;
# it is passed on as SIGTERM, on which qcclrun stops its ranks and removes its namespaces, and timeout
# stops mpirun. (A background job would ignore SIGINT, so the signal is not just left to the group.)
CHILD=""
run_child() {
  local rc=0
  "$@" &
  CHILD=$!
  wait "$CHILD" || rc=$?
  CHILD=""
  return "$rc"
}
on_signal() {
  if [[ -n $CHILD ]]; then
    kill -TERM "$CHILD" 2>/dev/null || true
    wait "$CHILD" 2>/dev/null || true
  fi
  exit $((128 + $1))
}
trap 'on_signal 2' INT
trap 'on_signal 15' TERM
mkdir -p "$WORK/raw"
RESULTS=$WORK/results.tsv  # phase impl nranks repeat size busbw(GB/s) time(us) wrong [wire(B), qccl:CODEC]
: >"$RESULTS"

# ---- Running one benchmark ----------------------------------------------------------------------------
# The command line of IMPL with NRANKS ranks for one segment (printed into the doc, so kept readable).
command_for() {
  local impl=$1 nranks=$2 b=$3 e=$4 f=$5 n=$6 netem=${7:-}
  local sweep="-b $b -e $e -f $f -n $n -w 1"
  local launcher="$QCCLRUN -n $nranks --no-prefix --timeout $RUN_TIMEOUT${netem:+ --netem $netem}"
  case $impl in
    qccl|qccl:*)  # qccl:CODEC compresses with --codec CODEC (Marsit's sign codec averages)
      # -c 0: all_reduce_perf's check compares every element with a generator evaluated for every rank:
      # a 256 MiB row with 2 ranks took 74 s checked against 12 s unchecked here, which would take this
      # run from some 12 minutes past an hour. The same binary's checks run in ctest (tests/perf:
      # perf_all_reduce_3_ranks, and perf_all_reduce_codecs_3_ranks through the codecs).
      local codec="" op=sum
      [[ $impl == qccl:* ]] && codec=" --codec ${impl#qccl:}"
      [[ $impl == qccl:sign* ]] && op=avg
      echo "$launcher -- $ALL_REDUCE_PERF $sweep -c 0 -d float -o $op -z $QCCL_Z$codec" ;;
    mpi)
      if [[ -n $netem ]]; then  # the tcp BTL across the emulated hosts
        echo "$NETEM_PEER mpi -n $nranks --netem $netem --qcclrun $QCCLRUN --timeout $RUN_TIMEOUT --" \
             "$MPI_PERF $sweep -c 1"
      else
        echo "timeout -k 10 $RUN_TIMEOUT mpirun --allow-run-as-root --oversubscribe -np $nranks" \
             "--mca pml ob1 --mca btl self,vader $MPI_PERF $sweep -c 1"
      fi ;;
    gloo)
      # A fresh FileStore directory per run: Gloo's keys would otherwise outlive the job.
      local wrap=""
      [[ -n $netem ]] && wrap="$NETEM_PEER gloo -- "
      echo "$launcher -- $wrap$GLOO_PERF -s @STORE@ $sweep -c 1" ;;
  esac
}

# "64K" -> 65536 (nccl-tests' K/M/G are powers of 1024).
to_bytes() {
  local v=$1
  case $v in
    *K) echo $((${v%K} << 10)) ;;
    *M) echo $((${v%M} << 20)) ;;
    *G) echo $((${v%G} << 30)) ;;
    *) echo "$v" ;;
  esac
}

# The number of rows a sweep -b B -e E -f F prints.
count_sizes() {
  local s e rows=0
  s=$(to_bytes "$1") e=$(to_bytes "$2")
  for (( ; s <= e; s *= $3)); do rows=$((rows + 1)); done
  echo "$rows"
}

# Appends the rows of one nccl-tests table to $RESULTS and prints how many there were. Time comes from
# the out-of-place half, or from the in-place half when the other is N/A (gloo -A ring_chunked); busbw
# is recomputed from it, because the printed busbw has only two decimals (0.01 GB/s at 64 KiB). With a
# codec (qccl:CODEC), the wire bytes this rank sent follow (the column after #wrong).
collect() {
  local file=$1 phase=$2 impl=$3 nranks=$4 rep=$5
  awk -v p="$phase" -v i="$impl" -v n="$nranks" -v r="$rep" -v out="$RESULTS" '
    /^#/ || NF < 13 || $1 !~ /^[0-9]+$/ { next }
    { t = $6; w = $9
      if (t == "N/A") { t = $10; w = $13 }
      if (w == "N/A") w = -1
      if (t + 0 <= 0) next
      bw = $1 / (t * 1e-6) / 1e9 * 2 * (n - 1) / n
      printf "%s\t%s\t%s\t%s\t%s\t%.6g\t%s\t%s", p, i, n, r, $1, bw, t, w >>out
      if (i ~ /^qccl:/) printf "\t%s", $10 >>out
      printf "\n" >>out
      ++rows }
    END { print rows + 0 }' "$file"
}

# Runs one benchmark (retried once: a single flake should not cost a 10-minute measurement) and
# collects its table. Fails the script when a check finds wrong elements: Open MPI's and Gloo's runs
# check (-c 1), qccl's do not (-c 0, see command_for).
run_one() {
  local phase=$1 impl=$2 nranks=$3 rep=$4 seg=$5 netem=${6:-}
  local b e f n
  read -r b e f n <<<"$seg"
  local name="${phase}_${impl}_n${nranks}_r${rep}_${b}-${e}"
  local file="$WORK/raw/$name.txt" cmd attempt rows
  cmd=$(command_for "$impl" "$nranks" "$b" "$e" "$f" "$n" "$netem")
  for attempt in 1 2; do
    local store=""
    if [[ $impl == gloo ]]; then store=$(mktemp -d "$WORK/gloo_store.XXXXXX"); fi
    log "$name (attempt $attempt)"
    # shellcheck disable=SC2086  # the command line is split on purpose
    if run_child ${cmd//@STORE@/$store} >"$file" 2>&1; then
      [[ -n $store ]] && rm -rf "$store"
      rows=$(collect "$file" "$phase" "$impl" "$nranks" "$rep")
      local want
      want=$(count_sizes "$b" "$e" "$f")
      if ((rows != want)); then
        tail -n 20 "$file" >&2
        die "$name: $rows rows in its table (above), expected $want"
      fi
      return 0
    fi
    [[ -n $store ]] && rm -rf "$store"
    if grep -q 'Out of bounds values : [1-9]' "$file"; then
      tail -n 20 "$file" >&2
      die "$name: WRONG RESULTS (see above); not retried"
    fi
    log "$name failed; its last lines:"
    tail -n 15 "$file" >&2
  done
  die "$name failed twice; giving up (command: ${cmd//@STORE@/DIR})"
}

# ---- The measurement ----------------------------------------------------------------------------------
IMPLS=(qccl mpi gloo)
START=$(date +%s)
log "work dir $WORK; repeats $REPEATS; shared-memory segments: ${SHM_SEGMENTS[*]}"
for ((rep = 1; rep <= REPEATS && SHM; ++rep)); do
  for nranks in "${RANKS[@]}"; do
    for seg in "${SHM_SEGMENTS[@]}"; do
      # Rotate who goes first, so that no peer always runs right after another's memory traffic.
      for ((k = 0; k < ${#IMPLS[@]}; ++k)); do
        impl=${IMPLS[(k + rep - 1) % ${#IMPLS[@]}]}
        run_one shm "$impl" "$nranks" "$rep" "$seg"
      done
    done
  done
done
if ((NETEM)); then
  NETEM_STARTED=1
  for ((rep = 1; rep <= REPEATS; ++rep)); do
    for seg in "${NETEM_SEGMENTS[@]}"; do
      for impl in qccl "${NETEM_CODECS[@]/#/qccl:}"; do
        run_one netem "$impl" "$NETEM_RANKS" "$rep" "$seg" "$NETEM_RATE"
      done
    done
  done
fi
if ((FAST)); then
  NETEM_STARTED=1
  FAST_IMPLS=(qccl "${FAST_CODECS[@]/#/qccl:}" mpi gloo)
  for ((rep = 1; rep <= REPEATS; ++rep)); do
    # This machine's memory bandwidth now, for the CPU floors: memcpy's rate at 64 MiB (codec_perf).
    log "fast_memcpy_r$rep"
    run_child "$CODEC_PERF" -b 64M -e 64M -n 10 --codec none >"$WORK/raw/fast_memcpy_r$rep.txt" 2>&1 \
      || die "codec_perf failed (see $WORK/raw/fast_memcpy_r$rep.txt)"
    awk -v r="$rep" '!/^#/ && NF >= 5 && $1 ~ /^[0-9]+$/ { printf "memcpy\t-\t-\t%s\t%s\t%s\t-\t-\n", r, $1, $4; exit }' \
      "$WORK/raw/fast_memcpy_r$rep.txt" >>"$RESULTS"
    for nranks in "${FAST_RANKS[@]}"; do
      for ((k = 0; k < ${#FAST_IMPLS[@]}; ++k)); do
        impl=${FAST_IMPLS[(k + rep - 1) % ${#FAST_IMPLS[@]}]}
        run_one fast "$impl" "$nranks" "$rep" "$FAST_SEGMENT" "$FAST_RATE"
      done
    done
  done
fi
ELAPSED=$(($(date +%s) - START))
log "measured in ${ELAPSED}s"

PLOTTED=""
if [[ -n $PLOTS ]]; then
  mkdir -p "$PLOTS"
  # The python3 on PATH, or the system's when that one lacks matplotlib (a virtual environment's).
  python=python3
  python3 -c 'import matplotlib' 2>/dev/null || python=/usr/bin/python3
  PLOTTED=$("$python" "$REPO/perf/plot_perf.py" "$RESULTS" "$PLOTS" "$NETEM_RANKS" "$NETEM_BYTES_PER_S") \
    || die "perf/plot_perf.py failed (it needs python3-matplotlib)"
fi
# A Markdown picture of file NAME drawn into --plots, linked relative to the document; nothing when
# it was not drawn.
picture() {
  local file=$PLOTS/$1 doc
  grep -qxF "$file" <<<"$PLOTTED" || return 0
  doc=${UPDATE:-${OUT:-$file}}
  echo
  echo "![$2]($(realpath -m --relative-to="$(dirname "$doc")" "$file"))"
}

# ---- The report -----------------------------------------------------------------------------------------
# Versions and machine, for the record.
pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo unknown; }
commit=$(git -C "$REPO" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
[[ -n $(git -C "$REPO" status --porcelain 2>/dev/null) ]] && commit+=" (working tree with uncommitted changes)"
cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
# Either may be missing (mpirun when no part ran Open MPI): "unknown" then, not an exit under pipefail.
ompi=$(mpirun --version 2>/dev/null | awk 'NR == 1 { print $NF }' || true)
ucx=$(ucx_info -v 2>/dev/null | awk '/Version/ { print $NF; exit }' || true)
env_settings=$(env | grep -E '^(QCCL|UCX|OMPI_MCA)_' | sort | tr '\n' ' ' || true)

# The median of a space-separated list, for the reports' awk programs.
readonly AWK_MEDIAN='
    function median(list,   v, k, i, j, t) {
      k = split(list, v, " ")
      for (i = 2; i <= k; ++i) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
      return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
    }'

# Prints, for one nranks, the per-size table and the summary lines; and a "TARGET" line per target
# for the final table (read back by the caller). Medians over repeats are taken here.
shm_report() {
  awk -F'\t' -v n="$1" '
    '"$AWK_MEDIAN"'
    function human(b) { return b >= 1048576 ? b / 1048576 " MiB" : b / 1024 " KiB" }
    $1 == "shm" && $3 == n { bw[$2, $5] = bw[$2, $5] " " $6; if (!($5 in seen)) { seen[$5]; sizes[++ns] = $5 } }
    END {
      for (i = 2; i <= ns; ++i) for (j = i; j > 1 && sizes[j - 1] + 0 > sizes[j] + 0; --j) { t = sizes[j]; sizes[j] = sizes[j - 1]; sizes[j - 1] = t }
      print "| size | qccl busbw (GB/s) | Open MPI busbw (GB/s) | Gloo busbw (GB/s) | qccl / Open MPI | qccl / Gloo |"
      print "|---:|---:|---:|---:|---:|---:|"
      lm = lg = 0; minm = ming = 1e300
      for (i = 1; i <= ns; ++i) {
        s = sizes[i]; q = median(bw["qccl", s]); m = median(bw["mpi", s]); g = median(bw["gloo", s])
        rm = m > 0 ? q / m : 0; rg = g > 0 ? q / g : 0
        printf "| %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", human(s), q, m, g, rm, rg
        lm += log(rm > 0 ? rm : 1e-9); lg += log(rg > 0 ? rg : 1e-9)
        if (rm < minm) { minm = rm; minm_at = human(s) }
        if (rg < ming) { ming = rg; ming_at = human(s) }
      }
      gm = exp(lm / ns); gg = exp(lg / ns)
      printf "\nGeometric mean of qccl / Open MPI over the %d sizes: **%.2f** (minimum %.2f at %s); ", ns, gm, minm, minm_at
      printf "qccl / Gloo: **%.2f** (minimum %.2f at %s).\n", gg, ming, ming_at
      printf "TARGET\t%d ranks: geometric mean of busbw qccl / Open MPI\t>= 1.20\t%.2f\t%s\n", n, gm, (gm >= 1.2 ? "met" : "**not met**")
      printf "TARGET\t%d ranks: minimum over sizes of qccl / Open MPI\t>= 0.80\t%.2f (at %s)\t%s\n", n, minm, minm_at, (minm >= 0.8 ? "met" : "**not met**")
    }' "$RESULTS"
}

netem_report() {
  awk -F'\t' -v n="$NETEM_RANKS" -v rate="$NETEM_BYTES_PER_S" '
    '"$AWK_MEDIAN"'
    $1 == "netem" && $2 == "qccl" { us[$5] = us[$5] " " $7; bw[$5] = bw[$5] " " $6; if (!($5 in seen)) { seen[$5]; sizes[++ns] = $5 } }
    END {
      for (i = 2; i <= ns; ++i) for (j = i; j > 1 && sizes[j - 1] + 0 > sizes[j] + 0; --j) { t = sizes[j]; sizes[j] = sizes[j - 1]; sizes[j - 1] = t }
      print "| size | wire floor (ms) | qccl time (ms) | qccl busbw (GB/s) | measured / floor |"
      print "|---:|---:|---:|---:|---:|"
      for (i = 1; i <= ns; ++i) {
        s = sizes[i]; floor_ms = 2 * (n - 1) / n * s / rate * 1e3; t = median(us[s]) / 1e3
        printf "| %s MiB | %.1f | %.1f | %.3f | %.2f |\n", s / 1048576, floor_ms, t, median(bw[s]), t / floor_ms
        if (s == 67108864) { r64 = t / floor_ms; have64 = 1 }
      }
      if (have64) printf "TARGET\t%d ranks, 1 Gbit/s: 64 MiB time / wire floor\t<= 1.15\t%.2f\t%s\n", n, r64, (r64 <= 1.15 ? "met" : "**not met**")
    }' "$RESULTS"
}

# The emulated network's times per codec: per size, the median time of each and its speed-up over
# the uncompressed call.
codec_report() {
  awk -F'\t' -v codecs="${NETEM_CODECS[*]}" '
    '"$AWK_MEDIAN"'
    $1 == "netem" { us[$2, $5] = us[$2, $5] " " $7; if (!($5 in seen)) { seen[$5]; sizes[++ns] = $5 } }
    END {
      nc = split(codecs, c, " ")
      for (i = 2; i <= ns; ++i) for (j = i; j > 1 && sizes[j - 1] + 0 > sizes[j] + 0; --j) { t = sizes[j]; sizes[j] = sizes[j - 1]; sizes[j - 1] = t }
      printf "| size | uncompressed (ms) |"; for (k = 1; k <= nc; ++k) printf " %s (ms) | × |", c[k]; print ""
      printf "|---:|---:|"; for (k = 1; k <= nc; ++k) printf "---:|---:|"; print ""
      for (i = 1; i <= ns; ++i) {
        s = sizes[i]; base = median(us["qccl", s]) / 1e3
        printf "| %s MiB | %.1f |", s / 1048576, base
        for (k = 1; k <= nc; ++k) { t = median(us["qccl:" c[k], s]) / 1e3; printf " %.1f | %.2f |", t, (t > 0 ? base / t : 0) }
        print ""
      }
    }' "$RESULTS"
}

# The fast links, for N ranks: per size, every implementation's median time beside its two floors.
#   wire floor: what this rank must send over RATE: 2(n-1)/n * S uncompressed, the bytes it sent
#     (all_reduce_perf's wire column) with a codec.
#   CPU floor: the bytes the steps of this rank touch, over twice memcpy's rate (memcpy reads and writes
#     each byte), times the ranks that share a core. With seg = S / 4 / n values and w wire bytes per
#     value (wire / (2(n-1) seg), the codec's own), the uncompressed ring touches 44 (n-1) seg bytes: the
#     sums read two values and write one, and the kernel copies every byte sent and received once at
#     each end (send: user to socket, read and write; receive: socket to user); the compressed
#     scatter-reduce-allgather (fp16, bf16, q1..q8) touches seg [(n-1)(4+w) encoding its inputs,
#     8 loading its own, (n-1)(8+w) adding the decoded, (4+w) encoding the sum, n(4+w) decoding every
#     owner's bytes, 8(n-1)w in the kernel]. Other plans (IntSGD's int codecs, Marsit's sign) have no
#     CPU floor here, and Open MPI's and Gloo's algorithms are given the uncompressed ring's.
fast_report() {
  awk -F'\t' -v n="$1" -v rate="$FAST_BYTES_PER_S" -v cores="$(nproc)" -v impls="${FAST_IMPLS[*]}" '
    '"$AWK_MEDIAN"'
    function human(b) { return b >= 1048576 ? b / 1048576 " MiB" : b / 1024 " KiB" }
    $1 == "memcpy" { mcp = mcp " " $6 }
    $1 == "fast" && $3 == n {
      us[$2, $5] = us[$2, $5] " " $7; if (NF >= 9) wire[$2, $5] = wire[$2, $5] " " $9
      if (!($5 in seen)) { seen[$5]; sizes[++ns] = $5 } }
    END {
      m = median(mcp) * 1e9 * 2  # bytes touched per second
      per_core = n > cores ? n / cores : 1
      ni = split(impls, impl, " ")
      for (i = 2; i <= ns; ++i) for (j = i; j > 1 && sizes[j - 1] + 0 > sizes[j] + 0; --j) { t = sizes[j]; sizes[j] = sizes[j - 1]; sizes[j - 1] = t }
      for (i = 1; i <= ns; ++i) {
        s = sizes[i]; seg = s / 4 / n
        mpi = median(us["mpi", s]) / 1e3; gloo = median(us["gloo", s]) / 1e3
        printf "\n%s, %d ranks (memcpy %.2f GB/s in this run):\n\n", human(s), n, median(mcp)
        print "| implementation | time (ms) | wire floor (ms) | CPU floor (ms) | time / larger floor | Open MPI / it | Gloo / it |"
        print "|---|---:|---:|---:|---:|---:|---:|"
        for (k = 1; k <= ni; ++k) {
          name = impl[k]; t = median(us[name, s]) / 1e3
          if (t <= 0) continue
          cpu = -1
          if (name ~ /^qccl:/) {
            w_bytes = median(wire[name, s]); wire_ms = w_bytes / rate * 1e3
            codec = substr(name, 6)
            if (codec ~ /^(fp16|bf16|q[1-8])([:]|$)/) {
              w = w_bytes / (2 * (n - 1) * seg)
              cpu = seg * ((n - 1) * (4 + w) + 8 + (n - 1) * (8 + w) + (4 + w) + n * (4 + w) + 8 * (n - 1) * w)
            }
            label = "qccl " codec
          } else {
            wire_ms = 2 * (n - 1) / n * s / rate * 1e3
            cpu = 44 * (n - 1) * seg
            label = name == "qccl" ? "qccl uncompressed" : name == "mpi" ? "Open MPI" : "Gloo"
          }
          cpu_ms = cpu >= 0 ? cpu * per_core / m * 1e3 : -1
          bound = cpu_ms > wire_ms ? cpu_ms : wire_ms
          printf "| %s | %.1f | %.1f | %s | %.2f | %.2f | %.2f |\n", label, t, wire_ms,
                 (cpu_ms >= 0 ? sprintf("%.1f", cpu_ms) : "—"), t / bound, mpi / t, gloo / t
          if (s == 67108864) {
            if (n == 2 && name == "qccl") printf "TARGET\t2 ranks, 10 Gbit/s, 64 MiB: uncompressed time / wire floor\t<= 1.15\t%.2f\t%s\n", t / wire_ms, (t / wire_ms <= 1.15 ? "met" : "**not met**")
            if (n == 2 && name == "qccl:q8") printf "TARGET\t2 ranks, 10 Gbit/s, 64 MiB: q8 time\t<= 18 ms\t%.1f ms\t%s\n", t, (t <= 18 ? "met" : "**not met**")
            if (n == 2 && name == "qccl:q4") printf "TARGET\t2 ranks, 10 Gbit/s, 64 MiB: q4 time\t<= 14 ms\t%.1f ms\t%s\n", t, (t <= 14 ? "met" : "**not met**")
            if (n == 4 && (name == "qccl" || name == "qccl:q8")) printf "TARGET\t4 ranks, 10 Gbit/s, 64 MiB: %s faster than Open MPI and Gloo\tboth > 1\t%.2f, %.2f\t%s\n", label, mpi / t, gloo / t, (mpi / t > 1 && gloo / t > 1 ? "met" : "**not met**")
          }
        }
      }
    }' "$RESULTS"
}

# "64K-1M x4 -n 10; ..." for the doc.
describe_segments() {
  local seg b e f n out=""
  for seg in "$@"; do
    read -r b e f n <<<"$seg"
    out+="${out:+; }$b–$e ×$f, -n $n"
  done
  echo "$out"
}

# The commands, as run, for N ranks and a segment MIN MAX F ITERS.
example_cmd() { command_for "$@" | sed -e "s|$REPO/||g" -e "s|@STORE@|\$(mktemp -d)|"; }

generate() {
  local n report targets=""
  local quick_note=""
  ((QUICK)) && quick_note=" **Smoke test (--quick): one repeat of a few sizes on a busy machine; not a measurement.**"
  echo "Generated by \`perf/run_perf.sh${ORIG_ARGS:+ $ORIG_ARGS}\` on $(date -u '+%Y-%m-%d %H:%M UTC') in ${ELAPSED} s.${quick_note}"
  echo
  echo "- Machine: ${cpu:-unknown CPU}, $(nproc) cores, Linux $(uname -r); qccl commit ${commit}."
  if ((PEERS)); then
    echo "- Peers: Open MPI ${ompi:-unknown} (libopenmpi3 $(pkg_version libopenmpi3)), UCX ${ucx:-unknown}" \
         "(libucx0 $(pkg_version libucx0); not used by ob1), Gloo libgloo0 $(pkg_version libgloo0)."
    echo "- Median of ${REPEATS} repeat(s) per size; runs of the three libraries interleaved," \
         "first runner rotated per repeat."
  else
    echo "- Median of ${REPEATS} repeat(s) per size; qccl alone (no part with Open MPI and Gloo was run)."
  fi
  [[ -n $env_settings ]] && echo "- Environment: \`${env_settings% }\`."
  echo
  echo "## All-reduce vs Open MPI and Gloo (shared memory)"
  echo
  if ((SHM)); then
    local z_note=""
    ((QCCL_Z == 2)) && z_note=" (blocking calls back to back, as the peers' calls are)"
    echo "Float sum, out of place. Time = mean over ranks of each rank's wall time per operation over -n"
    echo "back-to-back operations (nccl-tests -a 1); busbw = S / time · 2(n−1)/n, recomputed from each"
    echo "table's time column. qccl runs with \`-z $QCCL_Z\`$z_note. Open MPI uses ob1 with the vader"
    echo "shared-memory BTL and its default process binding; Gloo has no shared-memory transport and runs"
    echo "over TCP on loopback (\`gloo::allreduce\`, RING). Sweeps (MIN–MAX ×F, -n ITERS): $(describe_segments "${SHM_SEGMENTS[@]}")."
    echo
    echo "For N ranks and each sweep MIN MAX F ITERS:"
    echo
    echo '```'
    example_cmd qccl N MIN MAX F ITERS
    example_cmd mpi N MIN MAX F ITERS
    example_cmd gloo N MIN MAX F ITERS
    echo '```'
    for n in "${RANKS[@]}"; do
      report=$(shm_report "$n")
      echo
      echo "### $n ranks"
      echo
      grep -v '^TARGET' <<<"$report"
      picture "perf_shm_n$n.png" "busbw against size, $n ranks: qccl, Open MPI, Gloo"
      targets+=$(grep '^TARGET' <<<"$report" || true)$'\n'
    done
  else
    echo "Not run (--no-shm)."
  fi
  echo
  echo "## All-reduce over an emulated 1 Gbit/s network"
  echo
  if ((NETEM)); then
    echo "$NETEM_RANKS ranks, each in its own network namespace behind a ${NETEM_RATE} full-duplex tbf-shaped link"
    echo "(\`qcclrun --netem\`, UCX over TCP). Wire floor = 2(n−1)/n · S / (125e6 B/s); one TCP stream"
    echo "reaches about 0.95 of the nominal rate (headers), so ~1.05 is the practical best. Time = median"
    echo "over repeats of the mean over ranks. Sweeps (MIN–MAX ×F, -n ITERS): $(describe_segments "${NETEM_SEGMENTS[@]}")."
    echo
    echo '```'
    example_cmd qccl "$NETEM_RANKS" MIN MAX F ITERS "$NETEM_RATE"
    echo '```'
    echo
    report=$(netem_report)
    grep -v '^TARGET' <<<"$report"
    echo
    echo "With the codecs (\`--codec ${NETEM_CODECS[*]}\`, one sweep each, the same runs interleaved; × is the"
    echo "speed-up over the uncompressed call):"
    echo
    codec_report
    picture perf_netem.png "qccl's time against size over the emulated network, per codec, beside the wire floor"
    targets+=$(grep '^TARGET' <<<"$report" || true)$'\n'
  else
    echo "Not run (--no-netem)."
  fi
  echo
  echo "## Fast links: all-reduce over an emulated 10 Gbit/s network"
  echo
  if ((FAST)); then
    echo "Each rank in its own network namespace behind a ${FAST_RATE} full-duplex tbf-shaped link, for qccl"
    echo "(uncompressed, and \`--codec\` ${FAST_CODECS[*]}), Open MPI (ob1, tcp BTL) and Gloo alike: the peers"
    echo "cross the same links through \`perf/netem_peer.sh\`. Runs interleaved, first runner rotated per"
    echo "repeat; time = median over repeats of the mean over ranks; sweep $(describe_segments "$FAST_SEGMENT")."
    echo "Wire floor: the bytes a rank sends (2(n−1)/n · S uncompressed; the wire column with a codec)"
    echo "over 1.25e9 B/s. CPU floor: the bytes the rank's steps and the kernel's socket copies touch, over"
    echo "twice this run's memcpy rate, times the ranks sharing a core (the formulas are in run_perf.sh,"
    echo "fast_report). \"Open MPI / it\" and \"Gloo / it\" are their times over this one's: above 1, it is faster."
    echo
    echo '```'
    example_cmd qccl N MIN MAX F ITERS "$FAST_RATE"
    example_cmd mpi N MIN MAX F ITERS "$FAST_RATE"
    example_cmd gloo N MIN MAX F ITERS "$FAST_RATE"
    echo '```'
    for n in "${FAST_RANKS[@]}"; do
      report=$(fast_report "$n")
      grep -v '^TARGET' <<<"$report"
      targets+=$(grep '^TARGET' <<<"$report" || true)$'\n'
    done
  else
    echo "Not run (--no-fast)."
  fi
  echo
  echo "### Targets"
  echo
  echo "| target | wanted | measured | |"
  echo "|---|---:|---:|---|"
  awk -F'\t' '$1 == "TARGET" { printf "| %s | %s | %s | %s |\n", $2, $3, $4, $5 }' <<<"$targets"
}

SECTION=$WORK/section.md
generate >"$SECTION"

if [[ -n $OUT ]]; then cp "$SECTION" "$OUT"; elif [[ -z $UPDATE ]]; then cat "$SECTION"; fi
if [[ -n $UPDATE ]]; then
  [[ -f $UPDATE ]] || die "--update: $UPDATE not found"
  begin='<!-- BEGIN run_perf.sh -->' end='<!-- END run_perf.sh -->'
  [[ $(grep -cxF "$begin" "$UPDATE") == 1 && $(grep -cxF "$end" "$UPDATE") == 1 ]] \
    || die "--update: $UPDATE must hold exactly one line '$begin' and one line '$end'"
  # Everything outside the markers is kept byte for byte; written beside DOC, then renamed.
  awk -v begin="$begin" -v end="$end" -v section="$SECTION" '
    $0 == end { skipping = 0 }
    !skipping { print }
    $0 == begin { while ((getline line < section) > 0) print line; skipping = 1 }' "$UPDATE" >"$UPDATE.tmp.$$"
  mv "$UPDATE.tmp.$$" "$UPDATE"
  log "updated $UPDATE"
fi
