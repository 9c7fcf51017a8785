/* mpi_allreduce_perf: MPI_Allreduce (float, sum) over a size sweep, printed as nccl-tests' table, so
 * that it reads side by side with all_reduce_perf. Timing and checking: see baseline_common.h.
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 4 --mca pml ob1 --mca btl self,vader \
 *       mpi_allreduce_perf -b 64K -e 256M -f 2 -n 20 */
#define _POSIX_C_SOURCE 200809L /* gethostname, posix_memalign under -std=c11 */

#include <mpi.h>
#include <unistd.h>

#include "baseline_common.h"

static const char kUsage[] =
    "usage: mpirun -np N mpi_allreduce_perf [-b SIZE] [-e SIZE] [-f N] [-n N] [-w N] [-c 0|1] [-a N]\n"
    "  Times MPI_Allreduce(float, MPI_SUM), out of place, blocking calls back to back.\n" BASELINE_COMMON_USAGE;

typedef struct {
  const baseline_options* opt;
  int rank, nranks;
  float *send, *recv;
} bench;

static void allreduce_at(const bench* b, size_t bytes, size_t offset) {
  MPI_Allreduce((const char*)b->send + offset, (char*)b->recv + offset, (int)(bytes / sizeof(float)),
                MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

/* nccl-tests -a: rank 0's time, or the mean, min or max over ranks. */
static double combine_time(const bench* b, double seconds) {
  double out = seconds;
  if (b->opt->average == 0) {
    MPI_Bcast(&out, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return out;
  }
  MPI_Op op = b->opt->average == 2 ? MPI_MIN : b->opt->average == 3 ? MPI_MAX : MPI_SUM;
  MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
  return b->opt->average == 1 ? out / b->nranks : out;
}

/* One row: an untimed operation, a barrier, -n timed operations, then the check. Returns #wrong
 * summed over ranks (-1 when not checked) and the combined time per operation in *seconds. */
static int64_t bench_size(const bench* b, size_t bytes, double* seconds) {
  const size_t count = bytes / sizeof(float);
  allreduce_at(b, bytes, 0);
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int i = 0; i < b->opt->iters; ++i) allreduce_at(b, bytes, baseline_offset(bytes, b->opt->max_bytes, i));
  *seconds = combine_time(b, (MPI_Wtime() - start) / b->opt->iters);
  if (!b->opt->check) return -1;
  baseline_poison(b->recv, count);
  allreduce_at(b, bytes, 0);
  int64_t wrong = baseline_count_wrong(b->recv, count, b->nranks), total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

/* nccl-tests' preamble: the parameter line, the MPI library, and one line per rank. */
static void print_preamble(const bench* b) {
  char host[64] = {0};
  gethostname(host, sizeof host - 1);
  int pid = (int)getpid();
  char* hosts = b->rank == 0 ? (char*)malloc(sizeof host * (size_t)b->nranks) : NULL;
  int* pids = b->rank == 0 ? (int*)malloc(sizeof(int) * (size_t)b->nranks) : NULL;
  MPI_Gather(host, (int)sizeof host, MPI_CHAR, hosts, (int)sizeof host, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Gather(&pid, 1, MPI_INT, pids, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (b->rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    version[strcspn(version, "\n,")] = '\0';  /* the first clause: "Open MPI v4.1.4" */
    baseline_print_params(b->opt);
    printf("# MPI_Allreduce of %s\n#\n# Using devices\n", version);
    for (int r = 0; r < b->nranks; ++r) baseline_print_rank(r, pids[r], hosts + sizeof host * (size_t)r);
  }
  free(hosts);
  free(pids);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  baseline_options opt = baseline_default_options();
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  /* Every rank parses (same argv); only rank 0 prints usage and errors. */
  if (rank != 0) {
    if (!freopen("/dev/null", "w", stderr)) return 1;
  }
  const int parsed = baseline_parse(argc, argv, rank == 0 ? kUsage : "", NULL, NULL, NULL, &opt);
  if (parsed != 0 || opt.max_bytes / sizeof(float) > (size_t)0x7fffffff) {
    if (parsed == 0 && rank == 0) fprintf(stderr, "%s: -e too large for an MPI int count\n", argv[0]);
    MPI_Finalize();
    return parsed == 1 ? 0 : 2;
  }

  bench b = {&opt, rank, nranks, (float*)baseline_alloc(opt.max_bytes), (float*)baseline_alloc(opt.max_bytes)};
  if (!b.send || !b.recv) {
    fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes\n", argv[0], rank, opt.max_bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  baseline_fill_send(b.send, opt.max_bytes / sizeof(float), rank);
  print_preamble(&b);
  if (rank == 0) baseline_print_header();

  /* nccl-tests' TimeTest: a barrier, warm-up at the largest and the smallest size, then every size. */
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < opt.warmup; ++i) allreduce_at(&b, opt.max_bytes, 0);
  for (int i = 0; i < opt.warmup; ++i) allreduce_at(&b, opt.min_bytes, 0);
  int failed_cells = 0, bw_count = 0;
  double bw_sum = 0;
  for (size_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= (size_t)opt.step_factor) {
    MPI_Barrier(MPI_COMM_WORLD);
    double seconds = 0, busbw = 0;
    const int64_t wrong = bench_size(&b, bytes, &seconds);
    failed_cells += wrong > 0;
    if (rank == 0) baseline_print_row(bytes, seconds, nranks, wrong, 0, &busbw);
    bw_sum += busbw;
    ++bw_count;
  }
  if (rank == 0) baseline_print_footer(failed_cells, bw_sum, bw_count);
  free(b.send);
  free(b.recv);
  MPI_Finalize();
  return failed_cells ? 1 : 0;
}
