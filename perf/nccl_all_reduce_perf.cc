// The cost of the NCCL drop-in: one all-reduce timing loop built twice, against NCCL's API (run on the
// drop-in, libqccl_nccl.so: nccl_all_reduce_perf) and against qccl's C API (qccl_all_reduce_perf), so
// that the two differ only in the API the calls go through. Float sums on host buffers, in place.
//   qcclrun -n 4 -- build/perf/nccl_all_reduce_perf [-b 1M] [-e 64M] [-f 64] [-n 20] [-w 3]
// Under the drop-in, QCCL_NCCL_CODEC compresses as it would any NCCL program's calls. The first
// communicator's id travels from rank 0 through a file named after qcclrun's job (QCCL_MAGIC).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#ifdef PERF_NCCL_API
#include <nccl.h>
typedef ncclComm_t Comm;
typedef ncclUniqueId Id;
#define API_NAME "NCCL API (libqccl_nccl.so)"
static bool ok(ncclResult_t r) { return r == ncclSuccess; }
static const char* last_error() { return ncclGetLastError(nullptr); }
static bool get_id(Id* id) { return ok(ncclGetUniqueId(id)); }
static bool init(Comm* c, int n, const Id& id, int rank) { return ok(ncclCommInitRank(c, n, id, rank)); }
static bool all_reduce_f32(float* x, size_t n, Comm c) { return ok(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, c, nullptr)); }
static bool max_f64(double* x, Comm c) { return ok(ncclAllReduce(x, x, 1, ncclFloat64, ncclMax, c, nullptr)); }
static void finish(Comm c) { ncclCommFinalize(c), ncclCommDestroy(c); }
#else
#include "qccl.h"
typedef qcclComm_t Comm;
typedef qcclUniqueId Id;
#define API_NAME "qccl C API (libqccl.so)"
static bool ok(qcclResult_t r) { return r == qcclSuccess; }
static const char* last_error() { return qcclGetLastError(nullptr); }
static bool get_id(Id* id) { return ok(qcclGetUniqueId(id)); }
static bool init(Comm* c, int n, const Id& id, int rank) { return ok(qcclCommInitRank(c, n, id, rank)); }
static bool all_reduce_f32(float* x, size_t n, Comm c) { return ok(qcclAllReduce(x, x, n, qcclFloat32, qcclSum, c)); }
static bool max_f64(double* x, Comm c) { return ok(qcclAllReduce(x, x, 1, qcclFloat64, qcclMax, c)); }
static void finish(Comm c) { qcclCommDestroy(c); }
#endif

static void usage(FILE* to, const char* program) {
  fprintf(to,
          "usage: qcclrun -n N -- %s [-b BYTES] [-e BYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
          "  float sums in place from -b to -e (default 1M to 64M; bytes with K/M/G suffixes, 1.5M too,\n"
          "  0 or at least 4, rounded down to whole floats), the size times -f (default 64) from row to\n"
          "  row; -n timed (default 20)\n"
          "  after -w untimed (default 3) calls (-f, -n and -w are whole numbers). Each size starts from\n"
          "  1.0 in every element; in place, each call multiplies the values by the rank count, so enough\n"
          "  calls reach Inf (float: about 127 / log2(ranks) calls; under QCCL_NCCL_CODEC=fp16, 65504:\n"
          "  about 16 / log2(ranks)), and the drop-in returns success on such data. A row whose timed\n"
          "  calls ended on Inf or NaN is followed by a line saying so; a smaller -n or -w keeps the\n"
          "  timed data finite.\n",
          program);
}

// A number of bytes with an optional K, M or G suffix (powers of 1024), in all_reduce_perf's grammar
// (perf/options.cc parse_size: nccl-tests' fractions, 1.5M, but not strtod's blanks, '+', hex, inf or
// nan), so that one sweep script drives both; 0, or at least one float (a size under 4 bytes timed
// calls of count 0). The sweep times whole floats: the bytes rounded down to a multiple of 4.
static bool parse_size(const char* s, size_t* out) {
  if (!((*s >= '0' && *s <= '9') || *s == '.') || strpbrk(s, "xX")) return false;
  char* end = nullptr;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0)) return false;
  switch (*end) {
    case 'k': case 'K': v *= 1024.0, ++end; break;
    case 'm': case 'M': v *= 1024.0 * 1024, ++end; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024, ++end; break;
    default: break;
  }
  if (*end || v > 1e18 || (v > 0 && v < sizeof(float))) return false;
  *out = static_cast<size_t>(v);
  return true;
}

// A whole number in [lo, hi] in plain decimal (-n, -w and -f count calls and steps: "1K" or "1.9" is
// more likely a mistake than 1024 or 1), or false.
static bool parse_count(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  const long v = strtol(s, &end, 10);
  if (!(*s >= '0' && *s <= '9') || *end || errno || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// QCCL_RANK or QCCL_NRANKS, or `fallback` where it is unset or empty; exits 2 on anything but a whole
// number from lo (atoi ran QCCL_RANK=abc as rank 0).
static int env_int(const char* program, const char* name, int fallback, long lo) {
  const char* v = getenv(name);
  long n = fallback;
  if (v && *v && !parse_count(v, lo, 1L << 20, &n)) {
    fprintf(stderr, "%s: %s = '%s' is not a whole number from %ld to %ld\n", program, name, v, lo, 1L << 20);
    exit(2);
  }
  return static_cast<int>(n);
}

int main(int argc, char** argv) {
  size_t min_bytes = 1 << 20, max_bytes = 64 << 20, factor = 64;
  int iters = 20, warmup = 3;
  for (int i = 1; i < argc; i += 2) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout, argv[0]), 0;
    const char* flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    const bool known = flag[0] == '-' && flag[1] && strchr("befnw", flag[1]) && !flag[2];
    if (!known || !value) {
      fprintf(stderr, "%s: bad or incomplete option '%s%s%s'\n", argv[0], flag, value ? " " : "", value ? value : "");
      return usage(stderr, argv[0]), 2;
    }
    const bool is_size = flag[1] == 'b' || flag[1] == 'e';
    const long lo = flag[1] == 'w' ? 0 : 1;
    size_t size = 0;
    long count = 0;
    if (is_size ? !parse_size(value, &size) : !parse_count(value, lo, 1L << 30, &count)) {
      fprintf(stderr, "%s: invalid value '%s' for %s (expected %s)\n", argv[0], value, flag,
              is_size ? "0, or at least 4 bytes (one float), with an optional K, M or G suffix"
                      : (lo ? "a whole number from 1 to 1073741824" : "a whole number from 0 to 1073741824"));
      return usage(stderr, argv[0]), 2;
    }
    switch (flag[1]) {
      case 'b': min_bytes = size; break;
      case 'e': max_bytes = size; break;
      case 'f': factor = static_cast<size_t>(count); break;
      case 'n': iters = static_cast<int>(count); break;
      case 'w': warmup = static_cast<int>(count); break;
    }
  }
  if (min_bytes > max_bytes || (min_bytes == 0 && factor > 1 && max_bytes > 0)) {
    fprintf(stderr, "%s: -b must be at most -e, and above 0 when -f > 1\n", argv[0]);
    return 2;
  }
  const int rank = env_int(argv[0], "QCCL_RANK", 0, 0), nranks = env_int(argv[0], "QCCL_NRANKS", 1, 1);
  const char* job = getenv("QCCL_MAGIC");
  const std::string file = std::string("/tmp/qccl_perf_id_") + (job ? job : "single") + (
#ifdef PERF_NCCL_API
      "_nccl"
#else
      "_qccl"
#endif
  );
  Id id;
  if (rank == 0) {
    if (!get_id(&id)) return fprintf(stderr, "unique id: %s\n", last_error()), 1;
    FILE* f = fopen((file + ".tmp").c_str(), "wb");
    if (!f || fwrite(&id, sizeof(id), 1, f) != 1 || fclose(f)) return perror("id file"), 1;
    rename((file + ".tmp").c_str(), file.c_str());
  } else {
    for (int tries = 0;; ++tries) {
      FILE* f = fopen(file.c_str(), "rb");
      if (f && fread(&id, sizeof(id), 1, f) == 1) {
        fclose(f);
        break;
      }
      if (f) fclose(f);
      if (tries > 6000) return fprintf(stderr, "no id in %s\n", file.c_str()), 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  Comm comm;
  if (!init(&comm, nranks, id, rank)) return fprintf(stderr, "init: %s\n", last_error()), 1;
  if (rank == 0) {
    unlink(file.c_str());
    printf("# %s, %d ranks, float sum in place, %d iterations after %d warm-up\n", API_NAME, nranks, iters, warmup);
    printf("# %12s %12s %10s %10s %10s\n", "bytes", "count", "time(us)", "algbw", "busbw");
  }
  std::vector<float> x(max_bytes / sizeof(float), 1.0f);
  for (size_t bytes = min_bytes;; bytes *= factor) {
    const size_t count = bytes / sizeof(float);
    // In place, every call multiplies the values by nranks: each size starts again from 1.0 (untimed).
    std::fill(x.begin(), x.begin() + count, 1.0f);
    for (int i = 0; i < warmup; ++i)
      if (!all_reduce_f32(x.data(), count, comm)) return fprintf(stderr, "all-reduce: %s\n", last_error()), 1;
    double sync = 0;
    if (!max_f64(&sync, comm)) return fprintf(stderr, "barrier: %s\n", last_error()), 1;  // start together
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      if (!all_reduce_f32(x.data(), count, comm)) return fprintf(stderr, "all-reduce: %s\n", last_error()), 1;
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    if (!max_f64(&seconds, comm)) return fprintf(stderr, "max: %s\n", last_error()), 1;  // the slowest rank
    const double algbw = bytes / seconds / 1e9, busbw = algbw * 2.0 * (nranks - 1) / nranks;
    if (rank == 0) printf("  %12zu %12zu %10.1f %10.3f %10.3f\n", bytes, count, seconds * 1e6, algbw, busbw);
    // The drop-in returns success where qccl says qcclNonFinite (NCCL has no such result): look at the data.
    if (rank == 0 && !std::all_of(x.begin(), x.begin() + count, [](float v) { return std::isfinite(v); }))
      printf("# the row above timed Inf or NaN: its in-place sums outgrew the range (lower -n or -w)\n");
    // The next size, unless it passes -e, never grows (-f 1, -b 0) or would wrap size_t.
    if (factor <= 1 || bytes == 0 || bytes > max_bytes / factor) break;
  }
  finish(comm);
  return 0;
}
