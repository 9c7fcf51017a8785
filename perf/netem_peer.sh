#!/usr/bin/env bash
# perf/netem_peer.sh: the peer baselines (perf/baselines) over qcclrun's emulated network, so that Open
# MPI and Gloo cross the same shaped links as qccl (perf/run_perf.sh's fast-link section).
#
#   netem_peer.sh gloo -- GLOO_PERF ARGS...
#       Under `qcclrun --netem RATE`: runs gloo_allreduce_perf with its TCP device on this rank's
#       emulated link (-H, the address of the interface qcclrun names in QCCL_SOCKET_IFNAME).
#   netem_peer.sh mpi -n N --netem RATE [--qcclrun PATH] [--timeout SEC] -- MPI_PERF ARGS...
#       Builds N emulated hosts with qcclrun (each held by a sleeping rank), then runs
#       `mpirun -np N MPI_PERF ARGS...` with every MPI rank moved into its host's network namespace
#       (nsenter) and Open MPI's tcp BTL on that host's link. mpirun itself runs in host 0's namespace,
#       its PMIx server listening on host 0's link, because a rank in another namespace cannot reach
#       a loopback address. The emulated hosts are removed when mpirun ends, whatever its status.
#   netem_peer.sh rank DIR -- COMMAND...   (internal: one MPI rank, started by mpirun)
#
# Needs root (network namespaces), nsenter (util-linux) and ip (iproute2).
set -euo pipefail

die() { printf 'netem_peer.sh: %s\n' "$*" >&2; exit 2; }

mode=${1:-}
(($#)) && shift
case $mode in
  gloo)
    [[ ${1:-} == -- ]] && shift
    (($#)) || die "gloo: no command"
    [[ -n ${QCCL_SOCKET_IFNAME:-} ]] || die "gloo: QCCL_SOCKET_IFNAME is not set (run under qcclrun --netem)"
    addr=$(ip -4 -o addr show dev "$QCCL_SOCKET_IFNAME" | awk '{ split($4, a, "/"); print a[1]; exit }')
    [[ -n $addr ]] || die "gloo: $QCCL_SOCKET_IFNAME has no IPv4 address"
    exec "$@" -H "$addr"
    ;;
  rank)
    dir=${1:?rank: no directory}
    shift
    [[ ${1:-} == -- ]] && shift
    rank=${OMPI_COMM_WORLD_RANK:?rank: OMPI_COMM_WORLD_RANK is not set (started by mpirun?)}
    read -r pid ifname <"$dir/$rank" || die "rank $rank: no emulated host in $dir"
    export OMPI_MCA_btl_tcp_if_include=$ifname
    exec nsenter --net="/proc/$pid/ns/net" -- "$@"
    ;;
  mpi)
    nranks="" rate="" qcclrun=qcclrun timeout=900
    while (($#)); do
      case $1 in
        -n) nranks=${2:?-n needs a number}; shift ;;
        --netem) rate=${2:?--netem needs a rate}; shift ;;
        --qcclrun) qcclrun=${2:?--qcclrun needs a path}; shift ;;
        --timeout) timeout=${2:?--timeout needs seconds}; shift ;;
        --) shift; break ;;
        *) die "mpi: unknown argument '$1'" ;;
      esac
      shift
    done
    [[ $nranks =~ ^[1-9][0-9]*$ ]] || die "mpi: -n N is required (a positive number), got '$nranks'"
    [[ -n $rate ]] || die "mpi: --netem RATE is required"
    (($#)) || die "mpi: no command"
    dir=$(mktemp -d "${TMPDIR:-/tmp}/netem_peer.XXXXXX")
    holder="" job=""
    # Both run in the background and are waited for, so that a signal reaches this script at once
    # (bash runs a trap only after the foreground command) and is passed on: timeout stops mpirun,
    # qcclrun removes its namespaces.
    cleanup() {
      local status=$?
      local pid
      for pid in $job $holder; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
      done
      rm -rf "$dir"
      exit "$status"
    }
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    # Each holder rank records its pid (whose namespace the MPI rank enters) and its link's name.
    "$qcclrun" -n "$nranks" --netem "$rate" --no-prefix --timeout "$timeout" -- \
      sh -c 'echo "$$ $QCCL_SOCKET_IFNAME" >"$0/$QCCL_RANK.tmp" && mv "$0/$QCCL_RANK.tmp" "$0/$QCCL_RANK" && exec sleep infinity' \
      "$dir" &
    holder=$!
    for ((waited = 0; ; ++waited)); do
      ready=0
      for ((r = 0; r < nranks; ++r)); do [[ -f $dir/$r ]] && ready=$((ready + 1)); done
      ((ready == nranks)) && break
      kill -0 "$holder" 2>/dev/null || die "mpi: qcclrun --netem exited before its hosts were up"
      ((waited < 600)) || die "mpi: the emulated hosts were not up after 60 s"
      sleep 0.1
    done
    read -r pid0 if0 <"$dir/0"
    export PMIX_MCA_ptl_tcp_if_include=$if0 PMIX_MCA_ptl_tcp_remote_connections=1
    rc=0
    timeout -k 10 "$timeout" nsenter --net="/proc/$pid0/ns/net" -- \
      mpirun --allow-run-as-root --oversubscribe -np "$nranks" --mca pml ob1 --mca btl self,tcp \
      --mca oob_tcp_if_include "$if0" -x PMIX_MCA_ptl_tcp_if_include -x PMIX_MCA_ptl_tcp_remote_connections \
      "$(realpath "${BASH_SOURCE[0]}")" rank "$dir" -- "$@" &
    job=$!
    wait "$job" || rc=$?
    job=""
    exit "$rc"
    ;;
  ""|-h|--help)
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    [[ -n $mode ]] && exit 0 || exit 2
    ;;
  *) die "unknown mode '$mode' (gloo, mpi)" ;;
esac
