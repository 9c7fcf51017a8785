/* The parts shared by the peer baselines (mpi_allreduce_perf.c, gloo_allreduce_perf.cc): options, the
 * input pattern and its check, and the nccl-tests table. Plain C that also compiles as C++, header
 * only, so that each baseline stays one translation unit.
 *
 * What the baselines measure, and how it matches all_reduce_perf (perf/common.cc) run with -z 2:
 *   - a float sum all-reduce, out of place; the in-place half of each row prints N/A;
 *   - -w warm-up operations at -e and at -b before the sweep; then for each size one untimed
 *     operation, a barrier, and -n blocking operations back to back, timed together;
 *   - operation i works at offset (i mod (maxbytes / size)) * size within -e sized buffers, as
 *     nccl-tests does, so that small sizes are not timed from a warm cache;
 *   - time = this rank's wall time / -n, combined over ranks as -a says (default 1: the mean over
 *     ranks, nccl-tests' and all_reduce_perf's default);
 *   - algbw = bytes / time, busbw = algbw * 2(n-1)/n (GB = 1e9 bytes).
 * The check (-c 1, the default) is one more operation at offset 0 on a NaN-filled output, compared
 * element by element with the exact expected sum; #wrong is summed over ranks. */
#ifndef QCCL_PERF_BASELINE_COMMON_H
#define QCCL_PERF_BASELINE_COMMON_H

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  size_t min_bytes, max_bytes;
  long step_factor;
  int iters, warmup, check, average;
} baseline_options;

/* nccl-tests' defaults, except the step (factor 2 rather than +1M: these tools only do factors). */
static inline baseline_options baseline_default_options(void) {
  baseline_options o;
  o.min_bytes = (size_t)32 << 20;
  o.max_bytes = (size_t)32 << 20;
  o.step_factor = 2;
  o.iters = 20;
  o.warmup = 1;
  o.check = 1;
  o.average = 1;
  return o;
}

/* nccl-tests' parsesize: a number with an optional K, M or G suffix (powers of 1024). 0 on error. */
static inline size_t baseline_parse_size(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  if (end == s || !(v > 0)) return 0;
  switch (*end) {
    case 'k': case 'K': v *= 1024.0; ++end; break;
    case 'm': case 'M': v *= 1024.0 * 1024; ++end; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; ++end; break;
    default: break;
  }
  if (*end || v > 1e15) return 0;
  return (size_t)v;
}

static inline int baseline_parse_int(const char* s, long lo, long hi, long* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (errno || end == s || *end || v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

/* Parses the options both baselines take (-b -e -f -n -w -c -a -h) plus, for the caller, the letters
 * in `extra` (getopt syntax); each of those is passed to on_extra(letter, optarg, ctx), which returns 0
 * to reject the value. Returns 0 to run, 1 after --help (usage printed), 2 on a usage error (message
 * printed to stderr). */
static inline int baseline_parse(int argc, char** argv, const char* usage, const char* extra,
                                 int (*on_extra)(int, const char*, void*), void* ctx, baseline_options* o) {
  char spec[64] = ":b:e:f:n:w:c:a:h";
  long v = 0;
  int c;
  if (extra) strncat(spec, extra, sizeof spec - strlen(spec) - 1);
  opterr = 0;
  while ((c = getopt(argc, argv, spec)) != -1) {
    int ok = 1;
    switch (c) {
      case 'b': ok = (o->min_bytes = baseline_parse_size(optarg)) != 0; break;
      case 'e': ok = (o->max_bytes = baseline_parse_size(optarg)) != 0; break;
      case 'f': ok = baseline_parse_int(optarg, 2, 1L << 20, &v); o->step_factor = v; break;
      case 'n': ok = baseline_parse_int(optarg, 1, 1L << 30, &v); o->iters = (int)v; break;
      case 'w': ok = baseline_parse_int(optarg, 0, 1L << 30, &v); o->warmup = (int)v; break;
      case 'c': ok = baseline_parse_int(optarg, 0, 1, &v); o->check = (int)v; break;
      case 'a': ok = baseline_parse_int(optarg, 0, 3, &v); o->average = (int)v; break;
      case 'h': fputs(usage, stdout); return 1;
      case ':': fprintf(stderr, "%s: option -%c needs a value\n%s", argv[0], optopt, usage); return 2;
      case '?': fprintf(stderr, "%s: unknown option -%c\n%s", argv[0], optopt, usage); return 2;
      default: ok = on_extra && on_extra(c, optarg, ctx); break;
    }
    if (!ok) {
      fprintf(stderr, "%s: invalid value '%s' for -%c\n%s", argv[0], optarg, c, usage);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n%s", argv[0], argv[optind], usage);
    return 2;
  }
  if (o->min_bytes < sizeof(float)) {
    fprintf(stderr, "%s: -b must be at least %zu bytes (one float)\n", argv[0], sizeof(float));
    return 2;
  }
  if (o->min_bytes > o->max_bytes) {
    fprintf(stderr, "%s: -b is larger than -e\n", argv[0]);
    return 2;
  }
  return 0;
}

/* The usage text of the common options; each baseline adds its own lines. */
#define BASELINE_COMMON_USAGE                                                                    \
  "    -b SIZE   smallest size in bytes, K/M/G suffixes (default 32M)\n"                       \
  "    -e SIZE   largest size (default 32M); buffers of this size are allocated\n"             \
  "    -f N      multiply the size by N from row to row, N >= 2 (default 2)\n"                 \
  "    -n N      timed operations per size (default 20)\n"                                     \
  "    -w N      warm-up operations at -e and -b before the sweep (default 1)\n"               \
  "    -c 0|1    check the result of one more operation per size (default 1)\n"                \
  "    -a N      time printed: 0 rank 0's, 1 mean over ranks, 2 min, 3 max (default 1)\n"     \
  "    -h        this help\n"                                                                  \
  "  Output: nccl-tests' table, out of place only (in-place columns print N/A);\n"            \
  "  busbw = algbw * 2(n-1)/n. Exit status 1 when a check fails.\n"

/* The input of `rank` at element j of the send buffer. Small integers: every sum is exact in float
 * and independent of the reduction order, and every offset of the buffer holds a valid input. */
static inline float baseline_input(int rank, size_t j) { return (float)(rank + 1 + (int)(j % 7)); }
static inline float baseline_expected(int nranks, size_t j) {
  return (float)(nranks * (nranks + 1) / 2 + nranks * (int)(j % 7));
}

static inline void baseline_fill_send(float* send, size_t count, int rank) {
  for (size_t j = 0; j < count; ++j) send[j] = baseline_input(rank, j);
}

/* Output elements [0, count) that differ from the expected sum (NaN, the sentinel, never matches). */
static inline int64_t baseline_count_wrong(const float* recv, size_t count, int nranks) {
  int64_t wrong = 0;
  for (size_t j = 0; j < count; ++j) wrong += recv[j] != baseline_expected(nranks, j);
  return wrong;
}

static inline void baseline_poison(float* recv, size_t count) {
  for (size_t j = 0; j < count; ++j) recv[j] = NAN;
}

/* Byte offset of timed operation `iter` for a size of `bytes` within buffers of `max_bytes`. */
static inline size_t baseline_offset(size_t bytes, size_t max_bytes, int iter) {
  size_t steps = max_bytes / bytes;
  return bytes * ((size_t)iter % (steps ? steps : 1));
}

static inline void* baseline_alloc(size_t bytes) {
  void* p = NULL;
  if (posix_memalign(&p, 4096, bytes < 64 ? 64 : bytes)) return NULL;
  memset(p, 0, bytes);  /* touch every page before timing */
  return p;
}

/* ---- The nccl-tests table (v2.14 format strings; see shared/specs/nccl-abi.md §3.3) ---- */

static inline void baseline_print_params(const baseline_options* o) {
  printf("# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d "
         "agg iters: %d validation: %d graph: %d\n",
         1, 1, (long)o->min_bytes, (long)o->max_bytes, o->step_factor, "factor", o->warmup, o->iters, 1,
         o->check, 0);
}

static inline void baseline_print_rank(int rank, int pid, const char* host) {
  printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n", rank, 0, pid, host, 0, 0, 0, 0,
         "cpu");
}

static inline void baseline_print_header(void) {
  printf("#\n");
  printf("# %10s  %12s  %8s  %6s  %6s", "", "", "", "", "");
  printf("           out-of-place         " "              in-place          " "\n");
  printf("# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
  printf("  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "time", "algbw", "busbw", "#wrong", "time", "algbw",
         "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
  printf("  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
         "(GB/s)", "");
}

/* One row, its numbers in the out-of-place half or (in_place) the in-place half, the other half N/A;
 * wrong < 0 prints N/A. */
static inline void baseline_print_row(size_t bytes, double seconds, int nranks, int64_t wrong, int in_place,
                                      double* busbw_out) {
  bytes -= bytes % sizeof(float);  /* as nccl-tests: size = count * sizeof(type) */
  const double us = seconds * 1e6;
  const double algbw = (double)bytes / 1e9 / seconds;
  const double busbw = algbw * (2.0 * (nranks - 1) / nranks);
  char time[32], wrong_text[32];
  snprintf(time, sizeof time, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
  if (wrong >= 0) {
    snprintf(wrong_text, sizeof wrong_text, "%5g", (double)wrong);
  } else {
    snprintf(wrong_text, sizeof wrong_text, "%5s", "N/A");
  }
  printf("%12li  %12li  %8s  %6s  %6i", (long)bytes, (long)(bytes / sizeof(float)), "float", "sum", -1);
  if (in_place) printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
  printf("  %7s  %6.2f  %6.2f  %5s", time, algbw, busbw, wrong_text);
  if (!in_place) printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
  printf("\n");
  fflush(stdout);
  *busbw_out = busbw;
}

static inline void baseline_print_footer(int failed_cells, double bw_sum, int bw_count) {
  printf("# Out of bounds values : %d %s\n", failed_cells, failed_cells ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %g \n", bw_count ? bw_sum / bw_count : 0.0);
  printf("#\n");
  fflush(stdout);
}

#endif /* QCCL_PERF_BASELINE_COMMON_H */
