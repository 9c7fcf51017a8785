// qccl_sim: qccl's collectives on a modeled cluster (sim/simulator.h), as an nccl-tests-style table,
// and `qccl_sim calibrate`, which measures this machine's costs into a model file (sim/model.h).
#include <getopt.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/errors.h"
#include "collectives/plan.h"
#include "kernels/codec.h"
#include "kernels/types.h"
#include "sim/auto_choice.h"
#include "sim/calibrate.h"
#include "sim/model.h"
#include "sim/simulator.h"

namespace {

constexpr size_t kExecuteBytes = size_t{4} << 30;  // --execute's buffers for all ranks together

using namespace qccl;
using namespace qccl::sim;

constexpr const char kHelp[] = R"HELP(NAME
    qccl_sim - predict qccl's collectives on a modeled cluster

SYNOPSIS
    qccl_sim [OPTIONS]
    qccl_sim calibrate [-o FILE] [--codec LIST] [--values N] [--link L] [--intra L]

DESCRIPTION
    Runs qccl's own plans (the algorithms and codecs the library runs, bound to each rank's call as a
    communicator binds them) in virtual time on a modeled cluster: hosts joined by links of one
    class (a NIC per host, full duplex, shared by its ranks; qcclrun --netem's token buckets), ranks
    of a host joined by another, CPU steps charged at measured costs per value (per codec and step),
    the kernel's TCP path charged per byte and per message at each end, all stretched where a host
    has fewer cores than ranks, whose blocked ranks also wait for a core when they wake. No data
    moves (unless --execute), and a codec state is addresses only, as the buffers are; a 1,024-rank
    all-reduce of 1 GiB takes seconds. Not modeled: TCP's losses and congestion control, switch
    buffers, NUMA. sim/model.h documents every term.

    Prints one row per message size and codec, as nccl-tests do: size, count, type, codec, the
    algorithm, the predicted time, algbw and busbw, the payload bytes the call puts on the links
    between hosts and within hosts (all ranks), and the resource that bounds it: "inter" or "intra"
    (the busiest port of that class was busy at least half the time), "cpu", or "latency".

    The simulated call is a steady-state one (a codec state past its first round).

    Every rank's plan and its program per fragment in flight are held at once, up to 4 GiB for all
    ranks: a call past it is refused with the figure and what would fit. Most plans keep a ring of
    every rank, and a ring's fragment takes 2(n - 1) steps, so rings stop at some 5,400 ranks (3,800
    with two fragments in flight); recursive doubling's and the binomial trees' programs take
    O(log n) steps and their plans a few fields, so an all-reduce of recursive doubling runs on a
    million ranks (8 bytes: a minute and 4 GB; 1 MiB: 5 minutes and 9 GB).

    calibrate measures this machine's CPU costs (copies, reductions, float32 accumulator steps,
    encode, decode and decode-accumulate of each codec, median of 5 runs on 4 Mi values, and each
    method's step kernels timed inside its all-reduce on an in-process network) and writes a model
    file with the links given by --link and --intra, every number in the digits that read back as
    the same value. Without --link the file's inter.rate is a comment (the defaults' link, not told
    to the library): read back, a file tells the library only a link it was given. Pass it back with
    --model. The TCP path's costs per byte and per message (cpu.wire, cpu.message) are not measured
    here: perf/validate_sim.sh measures them on emulated hosts.

OPTIONS
    -n, --ranks N           ranks (default 8, at most 2^20); a comma list (64,256,1024) sweeps the
                            rank count at each size
        --nodes H, --hosts H
                            hosts (nodes, as qcclrun --nodes calls them) holding equal blocks of
                            ranks (default: one host per rank)
        --ranks-per-host R  hosts of R ranks each (with a rank list: as many hosts as that makes)
        --cores C           cores per host (default: one per rank, no contention)
        --machine-cores C   all hosts share one machine of C cores (qcclrun --netem's emulation;
                            not with --cores)
    -l, --link L            the link between hosts: 100mbit, 1gbit, 10gbit, 25gbit, 100gbit
                            (Ethernet, 25 us one-way latency), netem:RATE (qcclrun --netem RATE,
                            30 us), nvlink (2 us), or a rate with its unit: tc's (40gbit, 1gibit;
                            125mbps is 125 MB/s, as for tc and qcclrun) or per second, B for
                            bytes and b or bit for bits (12.5GB/s, 100Mb/s, 40Gbit/s); 1 kbit/s
                            to 1000 Tbit/s. A rate is Ethernet with NO latency, whatever preset's
                            rate it equals (10Gbit/s is 10gbit without its 25 us): add --latency.
                            The table's first line shows the latency taken.
                            Default: the model's (10gbit). A link given here or by the model
                            file's inter.rate is told to the library, as QCCL_LINK_RATE tells it
        --intra L           the link between ranks of one host, as for -l (default: the model's,
                            10 GB/s, 1 us)
        --latency S         one-way latency between hosts in seconds (overrides the link's;
                            the Ethernet presets take 25e-6)
    -m, --model FILE        a model file (qccl_sim calibrate; keys in sim/model.h) over the defaults
    -c, --collective C      allreduce (default), allgather, reducescatter, broadcast, reduce,
                            alltoall, gather, scatter
    -b, --minbytes SIZE     smallest message (default 1M); sizes as nccl-tests: the whole buffer
                            (allgather: the received one), 512, 64K, 4M, 1G
    -e, --maxbytes SIZE     largest message (default: minbytes)
    -f, --stepfactor F      multiply the size by F between rows (default 2)
    -d, --datatype T        float (default), half, bfloat16, double, int8, uint8, int32, uint32,
                            int64, uint64
    -o, --op OP             sum (default), prod, max, min, avg
    -r, --root R            root of broadcast, reduce, gather, scatter (default 0); the other
                            collectives have none and ignore it, as perf/'s *_perf do (a note on
                            standard error says so)
    -a, --algo NAME         the algorithm (default: the one qccl picks; qccl_info lists them); a
                            name the collective has, else a bad option
    -z, --codec LIST        codecs, comma-separated (q8,q4:bucket=256,fp16; "none" or "" for
                            uncompressed); each size runs once per codec (default: uncompressed).
                            auto[:maxrelerr=E] runs what QCCL_CODEC=auto would choose on this
                            cluster (the model's links and costs), shown as auto=CODEC
        --chunk SIZE        pipeline chunk (QCCL_CHUNK_BYTES, 64 to 1G; default 256K, or where
                            the link is told (-l, or the model file's inter.rate) the chunk qccl
                            takes when QCCL_LINK_RATE names that link, as qcclrun --netem sets
                            it: 5 ms of the link, 16K to 256K; 1M from 8gbit)
        --depth D           fragments in flight (QCCL_PIPELINE_DEPTH; default 2)
        --density X         variable-length codecs (fft): the share of their capacity an encoding
                            takes, in (0, 1] (default 1)
        --execute           also run each call with real data on an in-process network (the host
                            executor and kernels) and compare the bytes on every link; sizes up to
                            64 MiB per rank and 4 GiB of buffers for all ranks (2 x size x ranks)
        --break-even        for each codec, also the link rate between hosts below which it is
                            faster than the uncompressed call (the same size, ranks and CPU; the
                            uncompressed call with the algorithm qccl picks; where the link is
                            told, the library is told each rate tried)
        --csv FILE          also write the rows as CSV
        --plot FILE.png     draw time against size (or against ranks with a rank list), one line
                            per codec (python3 and matplotlib); the name's extension picks the
                            format: png, pdf, svg, svgz, eps, ps, jpg, jpeg, tif, tiff, webp (a
                            name without one: png, written to NAME.png)
    -o FILE (calibrate)     where to write the model (default: standard output)
        --values N          values per calibration run (calibrate; 1K to 256M, default 4M)
    -h, --help              this text

EXIT STATUS
    0 on success; 1 when a call cannot be simulated (its algorithm cannot run it, or its plans and
    programs would pass 4 GiB), --execute finds bytes that differ, or --plot cannot draw the picture
    (python3 with matplotlib failed; the table is printed); 2 for a bad option or combination,
    before any row (a host count, --ranks-per-host or root that a rank count of -n cannot take, an
    empty value for an option that names a link or a file).
    calibrate: 0 on success; 2 for a bad option or an -o FILE that cannot be written, before
    anything is measured; 1 when writing the model fails after all.

EXAMPLES
    qccl_sim -n 1024 --nodes 128 --link 10gbit --intra 300GB/s -b 1G -z none,q8,q4
    qccl_sim -n 64,128,256,512,1024 -b 1G -z none,q8 --plot scale.png
    qccl_sim calibrate --link 1gbit -o model.txt && qccl_sim -m model.txt -n 4 -b 64M -z q8
)HELP";

struct Options {
  std::vector<int> ranks{8};
  Topology topology;
  int ranks_per_host = 0;
  bool root_given = false;
  std::string link, intra, model_file;
  bool chunk_given = false;
  double latency = -1;
  CallSpec call;
  size_t min_bytes = 1 << 20, max_bytes = 0;
  double step_factor = 2;
  std::vector<std::string> codecs{""};
  bool execute = false;
  bool break_even = false;
  std::string csv, plot;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "qccl_sim: %s\n(qccl_sim --help lists the options)\n", message.c_str());
  std::exit(2);
}

// getopt_long's ':' (an option without its value) and '?' (an unknown option, or a long flag given
// "=VALUE"), in perf/options.cc's words: with opterr on, getopt printed its own line and then came
// "unknown option", naming nothing. `word` is argv[optind - 1]: for ':' the option itself (it was the
// last argument); for '?' the unknown long option (optopt 0), else optopt is the short option or the
// long flag's value. `command`: "" or "calibrate: ".
[[noreturn]] void option_error(const std::string& command, int c, const char* word, const option* longs) {
  if (c == ':') {
    const bool long_word = std::strncmp(word, "--", 2) == 0;
    usage_error(command + "option " + (long_word ? std::string(word) : std::string("-") + char(optopt)) +
                " needs a value");
  }
  if (!optopt) usage_error(command + "unknown option " + std::string(word, std::strcspn(word, "=")));
  for (const option* o = longs; o->name; ++o)
    if (o->val == optopt && o->has_arg == no_argument)
      usage_error(command + "option --" + o->name + " takes no value");
  usage_error(command + "unknown option -" + char(optopt));
}

// The value of an option that names a link or a file: an empty one (-l "") read as no option at all,
// so a script's unset variable ran on the defaults without a word.
std::string named_value(const char* option, const char* value) {
  if (!*value) usage_error(std::string(option) + ": the value is empty");
  return value;
}

// A link given by an option, or a bad option naming it (the message names the rate, not the option).
LinkClass parse_link_option(const char* option, const std::string& text, std::string* source) {
  try {
    return parse_link(text, source);
  } catch (const std::invalid_argument& e) {
    usage_error(std::string(option) + ": " + e.what());
  }
}

// Why `path` cannot be written ("" when it can), found before minutes of measuring: an existing
// file is left as it is (an interrupted calibration keeps the model it had) and none is left behind.
std::string cannot_write(const std::string& path) {
  struct stat st;
  const bool existed = stat(path.c_str(), &st) == 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return std::strerror(errno);
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
  return "";
}

coll::CollKind parse_collective(const std::string& s) {
  static const std::pair<const char*, coll::CollKind> kNames[] = {{"allreduce", coll::CollKind::kAllReduce},
                                                                  {"allgather", coll::CollKind::kAllGather},
                                                                  {"reducescatter", coll::CollKind::kReduceScatter},
                                                                  {"broadcast", coll::CollKind::kBroadcast},
                                                                  {"reduce", coll::CollKind::kReduce},
                                                                  {"alltoall", coll::CollKind::kAlltoAll},
                                                                  {"gather", coll::CollKind::kGather},
                                                                  {"scatter", coll::CollKind::kScatter}};
  for (const auto& [name, kind] : kNames)
    if (s == name) return kind;
  usage_error("--collective '" + s +
              "': one of allreduce, allgather, reducescatter, broadcast, reduce, alltoall, "
              "gather, scatter");
}

kernels::DataType parse_type(const std::string& s) {
  static const std::pair<const char*, kernels::DataType> kNames[] = {
      {"float", kernels::DataType::kFloat32},     {"half", kernels::DataType::kFloat16},
      {"bfloat16", kernels::DataType::kBfloat16}, {"double", kernels::DataType::kFloat64},
      {"int8", kernels::DataType::kInt8},         {"uint8", kernels::DataType::kUint8},
      {"int32", kernels::DataType::kInt32},       {"uint32", kernels::DataType::kUint32},
      {"int64", kernels::DataType::kInt64},       {"uint64", kernels::DataType::kUint64}};
  for (const auto& [name, type] : kNames)
    if (s == name) return type;
  usage_error("--datatype '" + s +
              "': one of float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64");
}

kernels::RedOp parse_op(const std::string& s) {
  static const std::pair<const char*, kernels::RedOp> kNames[] = {{"sum", kernels::RedOp::kSum},
                                                                  {"prod", kernels::RedOp::kProd},
                                                                  {"max", kernels::RedOp::kMax},
                                                                  {"min", kernels::RedOp::kMin},
                                                                  {"avg", kernels::RedOp::kAvg}};
  for (const auto& [name, op] : kNames)
    if (s == name) return op;
  usage_error("--op '" + s + "': one of sum, prod, max, min, avg");
}

// Codec specs hold commas of their own (q8:bucket=256,round=stochastic): a piece that is key=value
// continues the spec before it.
std::vector<std::string> split_codecs(const std::string& list) {
  std::vector<std::string> specs;
  size_t at = 0;
  while (at <= list.size()) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    std::string piece = list.substr(at, comma - at);
    at = comma + 1;
    const size_t eq = piece.find('=');
    if (eq != std::string::npos && piece.find(':') > eq && !specs.empty())
      specs.back() += "," + piece;
    else
      specs.push_back(piece == "none" ? "" : piece);
  }
  std::vector<std::string> once;  // "none," and "q8,q8" name a row once
  for (const std::string& spec : specs)
    if (std::find(once.begin(), once.end(), spec) == once.end()) once.push_back(spec);
  return once;
}

double parse_real(const char* option, const std::string& value, double lo, double hi) {
  try {
    return parse_double(option, value, lo, hi);
  } catch (const Error& e) {
    usage_error(e.what());
  }
}

int parse_count(const char* option, const std::string& value, int lo, int hi) {
  try {
    return static_cast<int>(parse_int(option, value, lo, hi));
  } catch (const Error& e) {
    usage_error(e.what());
  }
}

// A size with nccl-tests' suffixes (512, 64K, 4M, 1G), within [lo, hi] (of `unit`).
size_t parse_bytes(const char* option, const std::string& value, size_t lo, size_t hi, const char* unit = "bytes") {
  size_t bytes = 0;
  try {
    bytes = parse_size(option, value);
  } catch (const Error& e) {
    usage_error(e.what());
  }
  if (bytes < lo || bytes > hi)
    usage_error(std::string(option) + " = " + value + " is out of range [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "] " + unit);
  return bytes;
}

constexpr size_t kMaxMessageBytes = size_t{1} << 50;  // 1 PiB: sizes stay exact in a double

// The library sizes its chunk to a link it is told of (QCCL_LINK_RATE, as qcclrun --netem sets it),
// and weighs the fft codec's cost against it: so does a prediction whose link is given (-l, or a
// model file's inter.rate), with the model's costs of the codec's steps.
void tell_link(const Model& model, bool chunk_given, CallSpec* call) {
  if (!chunk_given) call->chunk_bytes = chunk_for_link_rate(static_cast<uint64_t>(model.inter.rate * 8));
  call->link.rate = model.inter.rate;
  call->link.fft_seconds_per_value = 0;
  const std::string fft = kernels::parse_codec_spec("fft").canonical();
  for (const char* step : {"fft_encode", "add_spectrum", "synthesize"})
    if (const double* cost = model.step_cost(fft, step)) call->link.fft_seconds_per_value += *cost;
}

double bus_factor(coll::CollKind kind, int n) {
  switch (kind) {
    case coll::CollKind::kAllReduce:
      return 2.0 * (n - 1) / n;
    case coll::CollKind::kBroadcast:
    case coll::CollKind::kReduce:
      return 1.0;
    default:
      return static_cast<double>(n - 1) / n;
  }
}

// Elements per rank for a message of `bytes` (nccl-tests: the whole buffer for allgather and the
// collectives whose buffers hold a block per rank).
// How many counts a call's size holds, as nccl-tests: n for the collectives whose count is per rank.
size_t counts_per_size(coll::CollKind kind, int n) {
  switch (kind) {
    case coll::CollKind::kAllGather:
    case coll::CollKind::kReduceScatter:
    case coll::CollKind::kAlltoAll:
    case coll::CollKind::kGather:
    case coll::CollKind::kScatter:
      return static_cast<size_t>(n);
    default:
      return 1;
  }
}

size_t count_for(coll::CollKind kind, size_t bytes, size_t element_size, int n) {
  return bytes / element_size / counts_per_size(kind, n);
}

// The formats --plot's savefig writes with the Agg backend and matplotlib's own dependencies, picked by
// the file name's extension, in any case (pgf needs LaTeX; raw and rgba are no pictures); a name without
// one gets ".png" from matplotlib. Checked before any row: a name matplotlib refuses failed after the
// whole table.
constexpr const char* kPlotFormats[] = {"png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp"};

void check_plot_name(const std::string& file) {
  const size_t base = file.rfind('/') == std::string::npos ? 0 : file.rfind('/') + 1;
  const size_t dot = file.find_last_of('.');
  if (dot == std::string::npos || dot < base || dot + 1 == file.size()) return;  // matplotlib adds .png
  std::string extension = file.substr(dot + 1);
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string formats;
  for (const char* format : kPlotFormats) {
    if (extension == format) return;
    formats += (formats.empty() ? "" : ", ") + std::string(format);
  }
  usage_error("--plot '" + file + "': the name's extension picks the picture's format, one of " + formats +
              " (a name without one: png)");
}

constexpr const char kPlotScript[] = R"PY(
import csv, sys
try:
    import matplotlib
except ImportError:
    sys.exit(3)  # try another python3
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
by_ranks = len({r["ranks"] for r in rows}) > 1
x_key = "ranks" if by_ranks else "bytes"
fig, ax = plt.subplots(figsize=(9, 4.5))
groups = {}
for r in rows:
    label = (r["codec"] or "uncompressed") + " (" + r["algorithm"] + ")"
    if by_ranks and len({q["bytes"] for q in rows}) > 1:
        label += " " + r["size"]
    groups.setdefault(label, []).append((float(r[x_key]), float(r["time_us"]) / 1e6))
for label, pts in groups.items():
    pts.sort()
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("ranks" if by_ranks else "message size (bytes)")
ax.set_ylabel("predicted time (s)")
ax.set_title(sys.argv[3])
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
)PY";

// Runs the plot script with `python3 -c` (sys.argv[1:] are the CSV, the picture and the title): the
// python3 on PATH first, then the system's (a virtual environment's may lack matplotlib: status 3).
int draw(const std::string& csv, const std::string& png, const std::string& title) {
  int status = -1;
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    const pid_t pid = fork();
    if (pid == 0) {
      execlp(python, python, "-c", kPlotScript, csv.c_str(), png.c_str(), title.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    if (pid > 0) waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || (WEXITSTATUS(status) != 3 && WEXITSTATUS(status) != 127)) break;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "qccl_sim: --plot %s: python3 with matplotlib failed (Debian: python3-matplotlib)\n",
                 png.c_str());
    return 1;
  }
  return 0;
}

// The rate of the links between hosts at which `codec` and the uncompressed call take the same time:
// compression pays below it. 0 when it does not pay even at 1 Mbit/s, infinity when it still pays at
// 100 Tbit/s. The gain falls as the rate grows (the wire's share of the time shrinks, the codec's
// CPU time stays), so bisection on a log scale finds the crossing. `link_told`: the library knows
// each rate tried, as QCCL_LINK_RATE would tell it (its chunk and fft's choice follow the rate).
double break_even_rate(Model model, const Topology& topology, const CallSpec& call, const std::string& codec,
                       bool link_told, bool chunk_given) {
  CallSpec plain = call, packed = call;
  plain.codec = "";
  plain.algorithm = "";  // the uncompressed call as qccl runs it (--algo names the compressed one's)
  packed.codec = codec;
  auto pays = [&](double rate) {
    model.inter.rate = rate;
    if (link_told) tell_link(model, chunk_given, &plain), tell_link(model, chunk_given, &packed);
    return simulate(model, topology, packed).seconds < simulate(model, topology, plain).seconds;
  };
  double lo = 1e6 / 8, hi = 1e14 / 8;
  if (!pays(lo)) return 0;
  if (pays(hi)) return INFINITY;
  while (hi / lo > 1.002) {
    const double mid = std::sqrt(lo * hi);
    (pays(mid) ? lo : hi) = mid;
  }
  return std::sqrt(lo * hi);
}

int run_calibrate(int argc, char** argv) {
  std::string out, link, intra;
  CalibrateOptions options;
  static const option kLong[] = {{"output", required_argument, nullptr, 'o'},
                                 {"codec", required_argument, nullptr, 'z'},
                                 {"values", required_argument, nullptr, 'v'},
                                 {"link", required_argument, nullptr, 'l'},
                                 {"intra", required_argument, nullptr, 'i'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  opterr = 0;  // option_error's messages, which name the option
  int c;
  while ((c = getopt_long(argc, argv, ":o:z:l:h", kLong, nullptr)) != -1) {
    switch (c) {
      case 'o':
        out = named_value("-o (--output)", optarg);
        break;
      case 'z':
        for (const std::string& s : split_codecs(optarg)) {
          try {  // refused now, not after the whole calibration ran
            if (!s.empty()) kernels::parse_codec_spec(s);
          } catch (const kernels::CodecSpecError& e) {
            usage_error(std::string("--codec: ") + e.what());
          }
          options.codecs.push_back(s.empty() ? "none" : s);
        }
        break;
      case 'v':
        options.values = parse_bytes("--values", optarg, 1024, size_t{1} << 28, "values");
        break;
      case 'l':
        link = named_value("--link", optarg);
        break;
      case 'i':
        intra = named_value("--intra", optarg);
        break;
      case 'h':
        std::fputs(kHelp, stdout);
        return 0;
      case ':':
      case '?':
        option_error("calibrate: ", c, argv[optind - 1], kLong);
      default:
        usage_error("calibrate: unhandled option");
    }
  }
  if (optind < argc) usage_error(std::string("calibrate: unexpected argument '") + argv[optind] + "'");
  Model model = default_model();
  model.sources.clear();
  std::string source;
  if (!link.empty())
    model.inter = parse_link_option("--link", link, &source), model.sources.push_back("inter " + source);
  if (!intra.empty())
    model.intra = parse_link_option("--intra", intra, &source), model.sources.push_back("intra " + source);
  // Only a link given is told to the library when the file is read back (Model::inter_rate_told): the
  // defaults' rate told would change the chunk, and the file would predict otherwise than they do.
  model.inter_rate_told = !link.empty();
  if (!out.empty())
    if (const std::string why = cannot_write(out); !why.empty())
      usage_error("-o " + out + ": cannot be written: " + why);
  try {
    char host[256] = "this machine";
    gethostname(host, sizeof host - 1);
    const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    model.sources.push_back(std::string("cpu: qccl_sim calibrate on ") + host + ", " +
                            std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " cores, " + date);
    std::cerr << "qccl_sim calibrate: " << options.values << " values per run\n";
    calibrate(&model, options, &std::cerr);
  } catch (const std::invalid_argument& e) {
    usage_error(e.what());
  }
  if (out.empty()) {
    std::cout << format_model(model);
  } else if (!save_model(model, out)) {
    std::fprintf(stderr, "qccl_sim: cannot write %s: %s\n", out.c_str(), strerror(errno));
    return 1;
  }
  return 0;
}

Options parse_options(int argc, char** argv) {
  Options o;
  enum {
    kHosts = 256,
    kCores,
    kMachineCores,
    kIntra,
    kLatency,
    kChunk,
    kDepth,
    kDensity,
    kExecute,
    kCsv,
    kPlot,
    kBreakEven,
    kRanksPerHost
  };
  static const option kLong[] = {{"ranks", required_argument, nullptr, 'n'},
                                 {"hosts", required_argument, nullptr, kHosts},
                                 {"nodes", required_argument, nullptr, kHosts},
                                 {"cores", required_argument, nullptr, kCores},
                                 {"ranks-per-host", required_argument, nullptr, kRanksPerHost},
                                 {"machine-cores", required_argument, nullptr, kMachineCores},
                                 {"link", required_argument, nullptr, 'l'},
                                 {"intra", required_argument, nullptr, kIntra},
                                 {"latency", required_argument, nullptr, kLatency},
                                 {"model", required_argument, nullptr, 'm'},
                                 {"collective", required_argument, nullptr, 'c'},
                                 {"minbytes", required_argument, nullptr, 'b'},
                                 {"maxbytes", required_argument, nullptr, 'e'},
                                 {"stepfactor", required_argument, nullptr, 'f'},
                                 {"datatype", required_argument, nullptr, 'd'},
                                 {"op", required_argument, nullptr, 'o'},
                                 {"root", required_argument, nullptr, 'r'},
                                 {"algo", required_argument, nullptr, 'a'},
                                 {"codec", required_argument, nullptr, 'z'},
                                 {"chunk", required_argument, nullptr, kChunk},
                                 {"depth", required_argument, nullptr, kDepth},
                                 {"density", required_argument, nullptr, kDensity},
                                 {"execute", no_argument, nullptr, kExecute},
                                 {"csv", required_argument, nullptr, kCsv},
                                 {"plot", required_argument, nullptr, kPlot},
                                 {"break-even", no_argument, nullptr, kBreakEven},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  opterr = 0;  // option_error's messages, which name the option
  int c;
  while ((c = getopt_long(argc, argv, ":n:l:m:c:b:e:f:d:o:r:a:z:h", kLong, nullptr)) != -1) {
    switch (c) {
      case 'n': {
        o.ranks.clear();
        std::stringstream list(optarg);
        for (std::string item; std::getline(list, item, ',');) {
          const int n = parse_count("--ranks", item, 1, 1 << 20);
          if (std::find(o.ranks.begin(), o.ranks.end(), n) == o.ranks.end()) o.ranks.push_back(n);  // a row once
        }
        if (o.ranks.empty()) usage_error("--ranks: give a count or a comma list");
        break;
      }
      case kHosts:
        o.topology.hosts = parse_count("--nodes (--hosts)", optarg, 1, 1 << 20);
        break;
      case kRanksPerHost:
        o.ranks_per_host = parse_count("--ranks-per-host", optarg, 1, 1 << 20);
        break;
      case kCores:
        o.topology.cores_per_host = parse_count("--cores", optarg, 1, 1 << 20);
        break;
      case kMachineCores:
        o.topology.machine_cores = parse_count("--machine-cores", optarg, 1, 1 << 20);
        break;
      case 'l':
        o.link = named_value("--link", optarg);
        break;
      case kIntra:
        o.intra = named_value("--intra", optarg);
        break;
      case kLatency:
        o.latency = parse_real("--latency", optarg, 0, 100);
        break;
      case 'm':
        o.model_file = named_value("--model", optarg);
        break;
      case 'c':
        o.call.kind = parse_collective(optarg);
        break;
      case 'b':
        o.min_bytes = parse_bytes("--minbytes", optarg, 0, kMaxMessageBytes);
        break;
      case 'e':
        o.max_bytes = parse_bytes("--maxbytes", optarg, 0, kMaxMessageBytes);
        break;
      case 'f':
        o.step_factor = parse_real("--stepfactor", optarg, 1.0001, 1024);
        break;
      case 'd':
        o.call.dtype = parse_type(optarg);
        break;
      case 'o':
        o.call.op = parse_op(optarg);
        break;
      case 'r':
        o.call.root = parse_count("--root", optarg, 0, 1 << 20);
        o.root_given = true;
        break;
      case 'a':
        o.call.algorithm = optarg;
        break;
      case 'z':
        o.codecs = split_codecs(optarg);
        break;
      case kChunk:
        o.call.chunk_bytes = parse_bytes("--chunk", optarg, 64, size_t{1} << 30);  // qcclConfig_t's range
        o.chunk_given = true;
        break;
      case kDepth:
        o.call.depth = parse_count("--depth", optarg, 1, 64);
        break;
      case kDensity:
        o.call.density = parse_real("--density", optarg, 0, 1);
        if (o.call.density == 0) usage_error("--density = 0: an encoding takes some share of its capacity, in (0, 1]");
        break;
      case kExecute:
        o.execute = true;
        break;
      case kCsv:
        o.csv = named_value("--csv", optarg);
        break;
      case kPlot:
        o.plot = named_value("--plot", optarg);
        break;
      case kBreakEven:
        o.break_even = true;
        break;
      case 'h':
        std::fputs(kHelp, stdout);
        std::exit(0);
      case ':':
      case '?':
        option_error("", c, argv[optind - 1], kLong);
      default:
        usage_error("unhandled option");
    }
  }
  if (optind < argc) usage_error(std::string("unexpected argument '") + argv[optind] + "'");
  if (o.ranks_per_host && o.topology.hosts) usage_error("give --nodes (--hosts) or --ranks-per-host, not both");
  // Every rank count of the list against the layout and the root: a combination no call can take is
  // a bad option (exit 2, before any row), not a row that cannot be simulated.
  for (int n : o.ranks) {
    const std::string ranks = "--ranks " + std::to_string(n);
    if (o.ranks_per_host && n % o.ranks_per_host)
      usage_error("--ranks-per-host " + std::to_string(o.ranks_per_host) + " does not divide " + std::to_string(n) +
                  " ranks");
    if (o.topology.hosts > n)
      usage_error("--nodes (--hosts) " + std::to_string(o.topology.hosts) + " is more hosts than " + ranks +
                  " (a host holds at least one rank)");
    if (o.topology.hosts && n % o.topology.hosts)
      usage_error("--nodes (--hosts) " + std::to_string(o.topology.hosts) + " does not divide " + ranks +
                  " (hosts hold equal blocks of ranks)");
    if (coll::rooted(o.call.kind) && o.call.root >= n)
      usage_error("--root " + std::to_string(o.call.root) + " is not a rank of " + ranks + " (0 to " +
                  std::to_string(n - 1) + ")");
  }
  if (o.root_given && !coll::rooted(o.call.kind))  // as perf/'s *_perf take it
    std::fprintf(stderr, "qccl_sim: --root %d ignored: %s has no root\n", o.call.root, coll::coll_name(o.call.kind));
  if (o.max_bytes == 0) o.max_bytes = o.min_bytes;
  if (o.max_bytes < o.min_bytes) usage_error("--maxbytes is smaller than --minbytes");
  if (o.min_bytes == 0 && o.max_bytes > 0)
    usage_error("--minbytes 0 cannot grow by --stepfactor to --maxbytes; start at 1 (or -b 0 -e 0 for one row)");
  if (o.topology.machine_cores && o.topology.cores_per_host)
    usage_error("give --cores (per host) or --machine-cores (one machine for all hosts), not both");
  // A name the collective lacks is a bad option; a known algorithm that cannot run a call is that row's
  // "cannot be simulated" (exit 1).
  if (!o.call.algorithm.empty() && !coll::find_algorithm(o.call.kind, o.call.algorithm)) {
    std::string names;
    for (const coll::Algorithm& a : coll::algorithms())
      if (a.collective == o.call.kind) names += (names.empty() ? "" : ", ") + std::string(a.name);
    usage_error("--algo '" + o.call.algorithm + "': " + coll::coll_name(o.call.kind) +
                " has no algorithm of that name (" + names + ")");
  }
  if (!o.plot.empty()) check_plot_name(o.plot);
  for (const std::string& spec : o.codecs) {
    try {
      if (AutoCodec::is_auto(spec)) AutoCodec(spec, 2, "--codec");
      else if (!spec.empty()) kernels::parse_codec_spec(spec);
    } catch (const kernels::CodecSpecError& e) {
      usage_error(std::string("--codec: ") + e.what());
    } catch (const Error& e) {
      usage_error(e.what());  // names --codec itself
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "calibrate") == 0) return run_calibrate(argc - 1, argv + 1);
  Options o = parse_options(argc, argv);
  Model model = default_model();
  try {
    if (!o.model_file.empty()) model = load_model(o.model_file, model);
  } catch (const std::invalid_argument& e) {
    usage_error(e.what());
  }
  std::string source;
  if (!o.link.empty()) model.inter = parse_link_option("--link", o.link, &source), model.inter_rate_told = true;
  if (!o.intra.empty()) model.intra = parse_link_option("--intra", o.intra, &source);
  const bool link_told = model.inter_rate_told;  // the library is told the link between hosts (tell_link)
  if (o.latency >= 0) model.inter.latency = o.latency;
  if (link_told) tell_link(model, o.chunk_given, &o.call);

  const size_t es = kernels::element_size(o.call.dtype);
  std::printf("# qccl_sim: %s, %s %s, inter %s (latency %g us), intra %s, oversubscription from %s\n",
              coll::coll_name(o.call.kind), kernels::data_type_name(o.call.dtype), kernels::red_op_name(o.call.op),
              describe_rate(model.inter.rate).c_str(), model.inter.latency * 1e6,
              describe_rate(model.intra.rate).c_str(),
              o.topology.machine_cores    ? "one shared machine"
              : o.topology.cores_per_host ? "cores per host"
                                          : "none");
  std::printf("# %6s %6s %12s %12s %6s %-18s %-24s %12s %9s %9s %10s %10s %-8s\n", "ranks", "hosts", "size", "count",
              "type", "codec", "algorithm", "time(us)", "algbw", "busbw", "inter", "intra", "bound");
  std::ofstream csv;
  std::string csv_path = o.csv;
  if (csv_path.empty() && !o.plot.empty()) csv_path = o.plot + ".csv";
  if (!csv_path.empty()) {
    csv.open(csv_path);
    if (!csv)
      usage_error((o.csv.empty() ? "--plot's table " : "--csv ") + csv_path + ": cannot be written: " +
                  std::strerror(errno));
    csv << "ranks,hosts,bytes,size,count,type,codec,algorithm,time_us,algbw,busbw,inter_bytes,intra_bytes,bound,"
           "messages\n";
  }
  int status = 0;
  for (double bytes = static_cast<double>(o.min_bytes); bytes <= static_cast<double>(o.max_bytes) * 1.000001;
       bytes *= o.step_factor) {
    for (int n : o.ranks) {
      Topology topology = o.topology;
      topology.nranks = n;
      if (o.ranks_per_host) topology.hosts = n / o.ranks_per_host;
      for (const std::string& codec : o.codecs) {
        CallSpec call = o.call;
        call.codec = codec;
        call.count = count_for(call.kind, static_cast<size_t>(bytes), es, n);
        const size_t size = call.count * counts_per_size(call.kind, n) * es;  // what the call moves, as nccl-tests
        try {
          std::string codec_name = codec.empty() ? "-" : codec, csv_codec = codec;
          if (AutoCodec::is_auto(codec)) {
            call.codec = choose_auto_codec(model, topology, call, codec, nullptr, &call.algorithm);
            codec_name = csv_codec = "auto=" + (call.codec.empty() ? std::string("none") : call.codec);
          }
          const SimResult r = simulate(model, topology, call, o.execute);
          const double algbw = r.seconds > 0 ? static_cast<double>(size) / r.seconds / 1e9 : 0;
          std::printf("  %6d %6d %12zu %12zu %6s %-18s %-24s %12.1f %9.3f %9.3f %10s %10s %-8s\n", n,
                      topology.host_count(), size, call.count, kernels::data_type_name(call.dtype), codec_name.c_str(),
                      r.algorithm.c_str(), r.seconds * 1e6, algbw, algbw * bus_factor(call.kind, n),
                      human_bytes(static_cast<double>(r.inter_bytes)).c_str(),
                      human_bytes(static_cast<double>(r.intra_bytes)).c_str(), r.bottleneck.c_str());
          if (csv)
            csv << n << "," << topology.host_count() << "," << size << "," << human_bytes(static_cast<double>(size))
                << "," << call.count << "," << kernels::data_type_name(call.dtype) << ",\"" << csv_codec << "\","
                << r.algorithm << "," << r.seconds * 1e6 << "," << algbw << "," << algbw * bus_factor(call.kind, n)
                << "," << r.inter_bytes << "," << r.intra_bytes << "," << r.bottleneck << "," << r.transfers << "\n";
          if (o.execute) {
            // Every rank's buffers live in this process: about 2 x size x ranks bytes.
            if (static_cast<double>(size) > 64.0 * (1 << 20) ||
                2.0 * static_cast<double>(size) * n > static_cast<double>(kExecuteBytes)) {
              std::printf("  # --execute skipped: %zu bytes on %d ranks is above its 64 MiB per rank or 4 GiB in all\n",
                          size, n);
              continue;
            }
            const auto executed = execute(topology, call);
            size_t differ = 0;
            for (const auto& [link, b] : executed) {
              auto it = r.link_bytes.find(link);
              const uint64_t predicted = it == r.link_bytes.end() ? 0 : it->second;
              if (predicted != b) {
                if (differ++ < 5)
                  std::printf("  # --execute: rank %d -> %d carried %llu bytes, the simulation %llu\n", link.first,
                              link.second, static_cast<unsigned long long>(b),
                              static_cast<unsigned long long>(predicted));
              }
            }
            for (const auto& [link, b] : r.link_bytes)
              if (!executed.count(link) && b) ++differ;
            std::printf("  # --execute: %zu links, %s\n", executed.size(),
                        differ ? (std::to_string(differ) + " differ").c_str() : "the same bytes on every link");
            if (differ) status = 1;
          }
        } catch (const std::exception& e) {
          std::printf("  %6d %6d %12zu %12zu %6s %-18s  cannot be simulated: %s\n", n, topology.host_count(), size,
                      call.count, kernels::data_type_name(call.dtype), codec.empty() ? "-" : codec.c_str(), e.what());
          status = 1;
        }
      }
      if (o.break_even) {
        CallSpec call = o.call;
        call.count = count_for(call.kind, static_cast<size_t>(bytes), es, n);
        for (const std::string& codec : o.codecs) {
          if (codec.empty() || AutoCodec::is_auto(codec)) continue;
          try {
            const double rate = break_even_rate(model, topology, call, codec, link_told, o.chunk_given);
            if (rate == 0)
              std::printf("  # break-even: %s is slower than uncompressed at any rate from 1 Mbit/s\n", codec.c_str());
            else if (std::isinf(rate))
              std::printf("  # break-even: %s is faster than uncompressed at any rate up to 100 Tbit/s\n",
                          codec.c_str());
            else
              std::printf("  # break-even: %s is faster than uncompressed below %s between hosts\n", codec.c_str(),
                          describe_rate(rate).c_str());
          } catch (const std::exception& e) {
            std::printf("  # break-even: %s cannot be simulated: %s\n", codec.c_str(), e.what());
            status = 1;
          }
        }
      }
    }
    if (o.step_factor <= 1 || bytes == 0) break;
  }
  if (csv) csv.close();
  if (!o.plot.empty()) {
    const std::string title = std::string(coll::coll_name(o.call.kind)) + ", inter " + describe_rate(model.inter.rate);
    if (draw(csv_path, o.plot, title)) status = 1;
  }
  return status;
}
