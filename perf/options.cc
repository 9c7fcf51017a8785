// The command line and the --help page of the benchmarks.
#include "options.h"

#include <getopt.h>
#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "codec_list.h"
#include "strict_number.h"

namespace qccl_perf {

const char* const kTypeNames[qcclNumTypes] = {"int8",  "uint8", "int32",  "uint32", "int64",
                                              "uint64", "half", "float", "double", "bfloat16"};
const char* const kOpNames[qcclNumOps] = {"sum", "prod", "max", "min", "avg"};

namespace {

[[noreturn]] void bad_value(const char* option, const char* value, const char* why) {
  throw UsageError(std::string("invalid value '") + value + "' for " + option + ": " + why);
}

// Decimal only (base 0 read -n 010 as 8 and 0x10 as 16), from its first digit (strict_number.h).
long parse_int(const char* option, const char* s, long lo, long hi) {
  long long v = 0;
  if (!parse_integer(s, &v)) bad_value(option, s, "not an integer");
  if (v < lo || v > hi) {
    bad_value(option, s, ("out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]").c_str());
  }
  return static_cast<long>(v);
}

// A finite number >= 0 (0.01, 1e-2): what --max-relerr takes.
double parse_bound(const char* option, const char* s) {
  double v = 0;
  if (!parse_number(s, &v) || !(v >= 0)) bad_value(option, s, "expected a number >= 0");
  return v;
}

// nccl-tests' parsesize: a number with an optional K, M or G suffix (powers of 1024).
size_t parse_size(const char* option, const char* s) {
  // Its fractions (1.5M) are nccl-tests', but not strtod's blanks, '+', hex, inf or nan.
  if (!(std::isdigit(static_cast<unsigned char>(*s)) || *s == '.') || std::strpbrk(s, "xX"))
    bad_value(option, s, "not a size");
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || !(v >= 0)) bad_value(option, s, "not a size");
  switch (*end) {
    case 'k': case 'K': v *= 1024.0, ++end; break;
    case 'm': case 'M': v *= 1024.0 * 1024, ++end; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024, ++end; break;
    default: break;
  }
  if (*end) bad_value(option, s, "expected a number of bytes with an optional K, M or G suffix");
  if (v > 1e18) bad_value(option, s, "too large");
  return static_cast<size_t>(v);
}

int parse_type(const char* s) {
  if (!std::strcmp(s, "all")) return -1;
  for (int t = 0; t < qcclNumTypes; ++t)
    if (!std::strcmp(s, kTypeNames[t])) return t;
  bad_value("-d/--datatype", s, "expected int8, uint8, int32, uint32, int64, uint64, half, float, double, "
            "bfloat16 or all");
}

int parse_op(const char* s) {
  if (!std::strcmp(s, "all")) return -1;
  for (int op = 0; op < qcclNumOps; ++op)
    if (!std::strcmp(s, kOpNames[op])) return op;
  bad_value("-o/--op", s, "expected sum, prod, min, max, avg or all");
}

// qcclConfig_t.chunkBytes' range, checked here so that a bad value is a bad command line.
int parse_chunk(const char* option, const char* s) {
  const size_t bytes = parse_size(option, s);
  if (bytes < 64 || bytes > (size_t{1} << 30)) bad_value(option, s, "out of range [64, 1G]");
  return static_cast<int>(bytes);
}

// A link rate as qcclrun --netem takes it, in tc(8)'s units: bit, kbit, mbit, gbit, tbit and kibit ..
// tibit (bits/s; a bare number too), bps, kbps .. tbps and kibps .. tibps (bytes/s), case-insensitive,
// after a plain decimal number. Returns bytes/s.
double parse_rate(const char* option, const char* s) {
  const char* end = s;
  int dots = 0;
  while (std::isdigit(static_cast<unsigned char>(*end)) || *end == '.') dots += *end++ == '.';
  const double v = std::strtod(std::string(s, end).c_str(), nullptr);
  if (end == s || dots > 1 || !(v > 0)) bad_value(option, s, "expected a rate such as 100mbit, 1gbit or 10gbit");
  static const struct {
    const char* unit;
    double bits;
  } kUnits[] = {{"", 1},          {"bit", 1},       {"kbit", 1e3},          {"mbit", 1e6},          {"gbit", 1e9},
                {"tbit", 1e12},   {"kibit", 0x1p10}, {"mibit", 0x1p20},     {"gibit", 0x1p30},      {"tibit", 0x1p40},
                {"bps", 8},       {"kbps", 8e3},    {"mbps", 8e6},          {"gbps", 8e9},          {"tbps", 8e12},
                {"kibps", 0x1p13}, {"mibps", 0x1p23}, {"gibps", 0x1p33},    {"tibps", 0x1p43}};
  for (const auto& u : kUnits)
    if (!strcasecmp(end, u.unit)) return v * u.bits / 8;
  bad_value(option, s, "unknown unit (tc's: bit, kbit, mbit, gbit, tbit, kibit ... tibit; bps, kbps ... tbps, "
            "kibps ... tibps for bytes/s)");
}

// --codec SPEC[,SPEC...] (codec_list.h).
std::vector<std::string> parse_codecs(const char* option, const char* s) {
  std::vector<std::string> specs = split_codec_list(s);
  for (const std::string& spec : specs)
    if (spec.empty()) bad_value(option, s, "empty codec spec");
  return specs;
}

enum LongOnly { kAlgo = 256, kChunk, kDepth, kLinkRate, kCodec, kDevice, kPhases, kMaxRelerr };
constexpr option kLongOptions[] = {
    {"minbytes", required_argument, nullptr, 'b'},  {"maxbytes", required_argument, nullptr, 'e'},
    {"stepfactor", required_argument, nullptr, 'f'}, {"stepbytes", required_argument, nullptr, 'i'},
    {"iters", required_argument, nullptr, 'n'},     {"warmup_iters", required_argument, nullptr, 'w'},
    {"check", required_argument, nullptr, 'c'},     {"datatype", required_argument, nullptr, 'd'},
    {"op", required_argument, nullptr, 'o'},        {"root", required_argument, nullptr, 'r'},
    {"blocking", required_argument, nullptr, 'z'},  {"timeout", required_argument, nullptr, 'T'},
    {"average", required_argument, nullptr, 'a'},   {"run_cycles", required_argument, nullptr, 'N'},
    {"algo", required_argument, nullptr, kAlgo},    {"chunk", required_argument, nullptr, kChunk},
    {"depth", required_argument, nullptr, kDepth},  {"link-rate", required_argument, nullptr, kLinkRate},
    {"codec", required_argument, nullptr, kCodec},  {"device", no_argument, nullptr, kDevice},
    {"phases", no_argument, nullptr, kPhases},      {"help", no_argument, nullptr, 'h'},
    {"nthreads", required_argument, nullptr, 't'},  {"ngpus", required_argument, nullptr, 'g'},
    {"agg_iters", required_argument, nullptr, 'm'}, {"max-relerr", required_argument, nullptr, kMaxRelerr},
    {nullptr, 0, nullptr, 0}};

// The option's spelling for messages: "-n/--iters".
std::string option_name(int c) {
  for (const option& o : kLongOptions) {
    if (o.name && o.val == c) return c < 256 ? std::string("-") + char(c) + "/--" + o.name : std::string("--") + o.name;
  }
  return std::string("-") + char(c);
}

void apply_option(int c, const char* arg, Options* o) {
  const std::string name = option_name(c);
  const char* n = name.c_str();
  switch (c) {
    case 'b': o->min_bytes = parse_size(n, arg); break;
    case 'e': o->max_bytes = parse_size(n, arg); break;
    case 'f': o->step_factor = parse_int(n, arg, 1, 1L << 30); break;
    case 'i': o->step_bytes = parse_size(n, arg); break;
    case 'n': o->iters = int(parse_int(n, arg, 1, 1L << 30)); break;
    case 'w': o->warmup = int(parse_int(n, arg, 0, 1L << 30)); break;
    case 'c': o->check = int(parse_int(n, arg, 0, 1L << 30)); break;
    case 'd': o->type = parse_type(arg); break;
    case 'o': o->op = parse_op(arg); break;
    case 'r': o->root = std::strcmp(arg, "all") ? int(parse_int(n, arg, 0, 1L << 30)) : -1; break;
    case 'z': o->blocking = int(parse_int(n, arg, 0, 3)); break;
    case 'T': o->timeout = double(parse_int(n, arg, 0, 1L << 30)); break;
    case 'a': o->average = int(parse_int(n, arg, 0, 3)); break;
    case 'N': o->cycles = int(parse_int(n, arg, 0, 1L << 30)); break;
    case 't': case 'g': case 'm':  // nccl-tests' own, which scripts pass as 1
      if (parse_int(n, arg, 1, 1L << 30) != 1)
        bad_value(n, arg, c == 'm' ? "each timed operation is one call here (only 1)"
                                   : "one process is one rank here (only 1: start more ranks with qcclrun -n)");
      break;
    case kAlgo: o->algo = arg; break;
    case kChunk: o->chunk = parse_chunk(n, arg); break;
    case kDepth: o->depth = int(parse_int(n, arg, 1, 64)); break;  // qcclConfig_t.pipelineDepth's range
    case kLinkRate: o->link_rate = parse_rate(n, arg); break;
    case kCodec: {  // appended, as codec_perf's --codec is: a repeated --codec adds its specs
      const std::vector<std::string> specs = parse_codecs(n, arg);
      o->codecs.insert(o->codecs.end(), specs.begin(), specs.end());
      break;
    }
    case kMaxRelerr: o->max_relerr = parse_bound(n, arg); break;
    case kPhases: o->phases = true; break;
    case kDevice:
#ifndef QCCL_PERF_CUDA
      throw UsageError(name + ": this build has no CUDA (the toolkit was not found, or QCCL_CUDA=OFF)");
#endif
      o->device = true;
      break;
    default: throw UsageError("internal: unhandled option " + name);
  }
}

// ---- --help -------------------------------------------------------------------------------------------

// @P@ is the program, @C@ the qccl call; the other @...@ depend on the collective (print_help).
constexpr const char kHelpTop[] = R"(NAME
    @P@ - time qcclCollective and check its results, in the format of nccl-tests

SYNOPSIS
    qcclrun -n NRANKS -- @P@ [OPTIONS]
    @P@ [OPTIONS]                      (a single rank)

DESCRIPTION
    One process is one rank, on host memory. The ranks come from qcclCommInitEnv: QCCL_RANK,
    QCCL_NRANKS and QCCL_ROOT (set by qcclrun); else torchrun's RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT; else Open MPI's OMPI_COMM_WORLD_* or Slurm's SLURM_PROCID/SLURM_NTASKS; with none of
    them, a single rank. For every datatype, op and root selected, the sizes from -b to -e are timed
    out of place and then in place, and rank 0 prints one row per size.

OPTIONS
    SIZE is a number of bytes with an optional K, M or G suffix (powers of 1024).

    -b, --minbytes SIZE      smallest size (default 32M)
    -e, --maxbytes SIZE      largest size (default 32M); buffers of this size are allocated
    -f, --stepfactor N       multiply the size by N from row to row (default 1: use -i)
    -i, --stepbytes SIZE     add SIZE from row to row when -f is 1 (default 1M)
    -n, --iters N            timed operations per cell (default 20)
    -w, --warmup_iters N     untimed operations at -e and at -b before each sweep (default 1, as in
                             current nccl-tests; older releases used 5). Every cell also runs
                             one untimed operation and a barrier before its timer starts.
    -c, --check N            checked operations per cell after the timed ones (default 1; 0 = none,
                             and #wrong prints N/A)
    -d, --datatype NAME      int8 uint8 int32 uint32 int64 uint64 half float double bfloat16, or all
                             (default float)
    -o, --op NAME            sum prod max min avg, or all (default sum)@OPNOTE@
    -r, --root R             the root rank, or all to sweep every rank (default 0)@ROOTNOTE@
    -z, --blocking N         how the -n timed operations are issued (default 0):
                               0  qcclI* calls back to back, then qcclWait on every request: nccl-tests'
                                  -z 0 (launch on a stream, synchronize once). qccl runs them in call
                                  order as a stream does; on these same buffers each waits for the
                                  one before (calls on other buffers keep the pipeline full across
                                  operation boundaries).
                               1  blocking calls, each followed by a barrier that is timed
                                  (nccl-tests -z 1: wait and barrier after each operation)
                               2  blocking calls back to back, no barrier (nccl-tests -z 2)
                               3  blocking calls, each after a barrier that is not timed
                                  (nccl-tests -z 3)
    -a, --average N          the time printed: 0 rank 0's, 1 the mean over ranks, 2 the minimum,
                             3 the maximum (default 1); combined with qcclBroadcast/qcclAllReduce
    -N, --run_cycles N       run the whole sweep N times; 0 = until killed (default 1)
    -T, --timeout SECONDS    qcclConfig_t.timeoutSeconds: a collective that makes no progress for
                             this long fails on every rank; 0 = never (default: QCCL_TIMEOUT, 300)
        --algo LIST          qcclConfig_t.algorithms, e.g. ring or allreduce=ring,broadcast=chain
                             (default: QCCL_ALGO, else chosen by size)
        --chunk SIZE         qcclConfig_t.chunkBytes, the pipeline chunk (default:
                             QCCL_CHUNK_BYTES, else sized from QCCL_LINK_RATE, else 256K)
        --depth N            qcclConfig_t.pipelineDepth, chunks in flight (default:
                             QCCL_PIPELINE_DEPTH, else 2)
        --codec SPEC[,SPEC...]
                             all_reduce_perf, all_gather_perf, reduce_scatter_perf and
                             sendrecv_perf: run the sweep once per codec spec through
                             qcclAllReduceCompressed (float, half, bfloat16; sum, avg),
                             qcclAllGatherCompressed (float, half, bfloat16),
                             qcclReduceScatterCompressed (float, half, bfloat16; sum, avg) or
                             qcclSendCompressed / qcclRecvCompressed (float, half, bfloat16), e.g.
                             --codec q8,q4:round=stochastic,fp16 (a key=value piece continues the
                             spec before it; any other piece starts one). May be repeated: the
                             lists add up, in the order given. Adds three columns to each half
                             of the table: wire (bytes this rank sent), ratio (uncompressed bytes /
                             sent) and relerr (||out - exact|| / ||exact|| over all ranks, the
                             largest of the -c checks; ||out|| where exact is all zeros). #wrong
                             is then N/A, as a lossy result is not exact: a finite relerr passes
                             unless --max-relerr bounds it. A relerr that is not finite fails the
                             cell, and so does a checked call that returns qcclNonFinite (relerr
                             nan): the checks' inputs are small integers. In place, a sum's output
                             is a later timed call's input, so the values grow by the rank count
                             per call; a call whose values outgrow the datatype (half: 65504)
                             returns qcclNonFinite, is timed as it ran, and is counted in the
                             footer ("Non-finite results"); -o avg or a smaller -n keeps the timed
                             values finite. Marsit's sign and IntSGD's int codecs run in
                             all_reduce_perf only, AQ-SGD's aq codecs (aq4:channels=1600, ...) in
                             sendrecv_perf only. The sign codec (sign:eta_s=E,...) runs float32
                             avg only, with one codec state per size; its relerr is N/A (it
                             estimates the average of the signs), and its rounds follow k= (k=0:
                             sign rounds only). IntSGD's codecs (int8, int16, int32) also keep one
                             state per size: the untimed first call is their exact round, the
                             timed ones are integer rounds under the adaptive alpha (alpha=lr runs
                             with learning rate 1). States are made afresh for every datatype and
                             op, so that a cell gives what it gives alone. IntSGD's relerr
                             is what Proposition 2 asks for: the rounding noise is of the order of
                             the average itself (about 0.7), and more where the timed in-place
                             rounds grew the values the state learned alpha from; a fixed alpha=A
                             shows the codec's own precision. Default: off
        --max-relerr E       with --codec: a cell whose relerr exceeds E fails (it counts in the
                             footer's "Out of bounds values", and the exit status is 1), e.g.
                             --max-relerr 0.01: one E for every codec of the list (each codec's
                             own per-element bounds are in docs/PERF.md). The sign codec's relerr
                             is N/A, so its cells are not bounded. Needs -c 1 or more. Without it,
                             relerr is reported, not bounded, and the footer says so (default: off)
        --link-rate RATE     the rate of each rank's link, in tc(8) units (100mbit, 1gbit, 10gbit;
                             "bps" = bytes/s), e.g. the RATE of qcclrun --netem: adds two columns to
                             each half of the table, the wire floor (the time the busbw definition
                             allows: bus bytes / RATE, in us; with --codec, the bytes this rank
                             sent / RATE) and time / floor (default: off)
        --device             buffers in CUDA device memory (cudaMalloc on device rank % the
                             device count; qccl's device path, staged through pinned host memory),
                             inputs copied there and outputs back for the checks, outside the
                             timed batch; a blocking call returns once its result is on the device
                             (default: host memory; only in a build with CUDA). Where no CUDA
                             device is usable, every rank exits 77 (a skip) before the run
        --phases             where rank 0's time went (qcclStats_t), the mean over the timed
                             operations: adds six columns to each half of the table. Five are
                             percents of rank 0's own seconds per call (not of the time column,
                             which is combined over ranks as -a says): enc (encoding), dec
                             (decoding, and summing decoded values), red (the other data steps:
                             uncompressed sums, copies, averages), xport (in the transport:
                             posting transfers and progressing them; with UCX over TCP, the
                             kernel's socket copies) and wait (waiting for the wire or a peer);
                             sleeps is the driver's sleeps per operation.
                             The rest is the drive loop and time the rank was not running. Needs
                             -z 1, 2 or 3: non-blocking operations overlap, and what the driver
                             did for one it did for all (default: off)
    -t, --nthreads 1, -g, --ngpus 1, -m, --agg_iters 1
                             nccl-tests' threads per process, GPUs per thread and operations per
                             group, accepted as 1 (their default), so that scripts written for
                             nccl-tests run unchanged; other values are refused
    -h, --help               print this page and exit
)";

constexpr const char kHelpBottom[] = R"(
OUTPUT
    Rank 0 prints nccl-tests' format: a parameter line (nThread and nGpus are always 1, agg iters 1,
    graph 0), one "#  Rank" line per rank with its host and pid (device 0 and "cpu": buffers are host
    memory), then one row per size:

    size     max(send, recv) bytes of one rank
    count    the count argument of @C@ (elements)
    type     the datatype; redop the op ("none" if the collective does not reduce)
    root     the root rank (-1 if the collective has none)
    time     microseconds per operation: the wall time of the -n timed operations divided by -n,
             combined over ranks as -a says
    algbw    GB/s (1e9 bytes) of application data moved, see below
    busbw    algbw scaled by the collective's bus factor, comparable across collectives and with the
             link bandwidth, see below
    #wrong   wrong output elements of the checked operations, summed over ranks (N/A with -c 0)

    The four columns appear twice: out of place (separate buffers), then in place (the output overlays
    the input as qccl.h defines it for @C@).@INPLACE@ The footer gives the number of
    cells with #wrong > 0 ("Out of bounds values"; with --codec, cells whose relerr is not finite or
    exceeds --max-relerr, and whether relerr was bounded) and the mean busbw of all cells; with
    --codec, a "Non-finite results" line when timed calls returned qcclNonFinite (see --codec).

BANDWIDTH (n = number of ranks, t = time)
@BW@
    The bus factor is the fraction of the data each rank must put on its link (nccl-tests
    doc/PERFORMANCE.md), so busbw approaches the link bandwidth for any collective and rank count.

CORRECTNESS
    Each checked operation takes fresh inputs from a generator of (seed, rank, element) that every rank
    evaluates for every rank, so the expected output is computed locally, without communication, and
    every output element is compared. Reductions use small integers (|x| <= 8, products of +-1 and 2)
    whose results are exact in every datatype; they must match bit for bit, except avg on floating
    types, where the mean rounded to the type is allowed 1 unit in the last place. Integer avg
    truncates toward zero. Copies carry random bit patterns and must match bit for bit.

ENVIRONMENT
    QCCL_TESTS_MIN_BW        fail (exit 1) when the average bus bandwidth is below 0.9 times this
                             value in GB/s; the footer then ends in OK or FAILED. NCCL_TESTS_MIN_BW is
                             read when it is unset.
    QCCL_*                   the library's settings (QCCL_DEBUG, QCCL_TIMEOUT, QCCL_ALGO, ...); options
                             above take precedence.@CODECENV@

EXIT STATUS
    0  every check passed
    1  a check found wrong elements (with --codec: a relerr that is not finite or exceeds
       --max-relerr), a qccl call failed (its qcclGetLastError line goes to stderr), or
       QCCL_TESTS_MIN_BW was not met
    2  a bad command line (the message names the option)
    77 --device, and no CUDA device is usable here (a skip, as ctest's SKIP_RETURN_CODE reads it)

EXAMPLES
    qcclrun -n 4 -- @P@ -b 8 -e 64M -f 2
        sizes 8 B to 64 MiB, doubling, float@OPEX@, 4 ranks on this host
    qcclrun -n 2 -- @P@ -b 64M -e 64M -n 50 -z 2 -a 3
        one size, 50 blocking operations, the slowest rank's time
    qcclrun -n 3 -- @P@ -b 1K -e 1M -f 4 -d all@ALLEX@ -c 2
        every datatype@ALLEXT@, two checked operations per cell
    for r in 0 1; do QCCL_RANK=$r QCCL_NRANKS=2 QCCL_ROOT=127.0.0.1:29600 @P@ -b 1M -e 1M & done; wait
        two ranks started by hand
)";

// getopt_long's '?': an unknown short option (optopt holds it), an unknown or ambiguous long one
// (optopt 0; `word`, the argument it stopped at, names it), or a long one without argument given
// "=VALUE" (optopt holds that option's value).
std::string unknown_option(const char* word) {
  if (optopt) {
    for (const option& o : kLongOptions)
      if (o.name && o.val == optopt) return "option --" + std::string(o.name) + " takes no value";
    return std::string("unknown option -") + char(optopt);
  }
  const std::string name(word + 2, std::strcspn(word + 2, "="));
  std::string matches;
  for (const option& o : kLongOptions)
    if (o.name && !std::strncmp(o.name, name.c_str(), name.size())) matches += " --" + std::string(o.name);
  if (!name.empty() && !matches.empty()) return "option --" + name + " is ambiguous (it begins" + matches + ")";
  return std::string("unknown option ") + word;
}

void replace_all(std::string* s, const std::string& from, const std::string& to) {
  for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, at + to.size()))
    s->replace(at, from.size(), to);
}

void print_help(const CollTest& t) {
  std::string text = std::string(kHelpTop) + kHelpBottom;
  replace_all(&text, "qcclCollective", t.call);
  replace_all(&text, "@P@", std::string(t.name) + "_perf");
  replace_all(&text, "@C@", t.call);
  replace_all(&text, "@OPNOTE@", t.reduces ? "" : "\n                             (ignored: this collective does not reduce)");
  replace_all(&text, "@ROOTNOTE@", t.rooted ? "" : "\n                             (ignored: this collective has no root)");
  replace_all(&text, "@INPLACE@",
              t.has_in_place ? "" : "\n    For this collective in place is undefined in qccl, so those columns print N/A.");
  replace_all(&text, "@BW@", t.bw_help);
  // QCCL_CODEC compresses plain qcclAllReduce calls only (README, "Environment variables").
  constexpr const char kCodecEnv[] = R"(
    QCCL_CODEC               compresses the plain qcclAllReduce calls timed here (without --codec)
                             of float, half and bfloat16, sum and avg, from QCCL_CODEC_MIN_BYTES
                             (default 1M) up (auto weighs every size); smaller calls, other
                             datatypes and ops stay exact. Where a codec changes the checks' small
                             integers (q1 .. q8 do; fp16 and bf16 carry them exactly), the exact
                             check counts them as #wrong and the run fails, as expected; --codec
                             times a codec and reports its relerr.)";
  replace_all(&text, "@CODECENV@", t.all_reduce_codecs ? kCodecEnv : "");
  replace_all(&text, "@OPEX@", t.reduces ? " sum" : "");
  replace_all(&text, "@ALLEX@", t.reduces ? " -o all" : "");
  replace_all(&text, "@ALLEXT@", t.reduces ? " and op" : "");
  std::fputs(text.c_str(), stdout);
}

}  // namespace

const char* blocking_summary(int mode) {
  switch (mode) {
    case 1: return "blocking calls, barrier after each operation (timed)";
    case 2: return "blocking calls back to back, no barrier";
    case 3: return "blocking calls, barrier before each operation (not timed)";
    default: return "qcclI* calls, waited for together after each batch";
  }
}

bool parse_options(int argc, char** argv, const CollTest& test, Options* o) {
  opterr = 0;  // our own messages, which name the option
  int c;
  while ((c = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:r:z:T:a:N:t:g:m:h", kLongOptions, nullptr)) != -1) {
    if (c == 'h') {
      print_help(test);
      return false;
    }
    if (c == '?') throw UsageError(unknown_option(argv[optind - 1]));
    if (c == ':') {
      throw UsageError("option " + (optopt ? option_name(optopt) : std::string(argv[optind - 1])) +
                       " needs a value");
    }
    apply_option(c, optarg, o);
  }
  if (optind < argc) throw UsageError(std::string("unexpected argument '") + argv[optind] + "'");
  if (o->phases && o->blocking == 0)
    throw UsageError("--phases needs blocking calls (-z 1, 2 or 3): with -z 0 the operations overlap, "
                     "and the driver's time during one is spent on all of them");
  if (o->min_bytes > o->max_bytes) throw UsageError("-b/--minbytes is larger than -e/--maxbytes");
  if (o->step_factor <= 1 && o->step_bytes == 0) throw UsageError("-i/--stepbytes is 0 and -f/--stepfactor is 1");
  if (o->step_factor > 1 && o->min_bytes == 0 && o->max_bytes > 0)
    throw UsageError("-b/--minbytes 0 cannot grow by -f/--stepfactor " + std::to_string(o->step_factor) +
                     " to -e/--maxbytes; start at -b 1 (or step with -i)");
  if (!o->codecs.empty() && !test.compressible)
    throw UsageError(std::string("--codec: ") + test.name +
                     "_perf does not compress (all_reduce_perf, all_gather_perf, reduce_scatter_perf and sendrecv_perf do)");
  // A bound that nothing is held to would read as a pass: refuse it where no relerr is measured.
  if (o->max_relerr >= 0 && o->codecs.empty())
    throw UsageError("--max-relerr bounds the relerr of --codec's cells (without --codec, every element is exact)");
  if (o->max_relerr >= 0 && o->check == 0) throw UsageError("--max-relerr needs checked operations (-c 1 or more)");
  return true;
}

}  // namespace qccl_perf
