// The benchmarks' command line: nccl-tests' options (getopt_long, short and long forms) plus qccl's
// --algo, --chunk and --depth, and the --help page. Part of the harness (common.h).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "qccl.h"

namespace qccl_perf {

// nccl-tests' spellings, indexed by qcclDataType_t and qcclRedOp_t (NCCL's numbering: max before min).
extern const char* const kTypeNames[qcclNumTypes];
extern const char* const kOpNames[qcclNumOps];

// Defaults are nccl-tests' except where --help says otherwise.
struct Options {
  size_t min_bytes = 32 << 20, max_bytes = 32 << 20, step_bytes = 1 << 20;
  long step_factor = 1;  // > 1: multiply; else add step_bytes
  int iters = 20, warmup = 1, check = 1;
  int blocking = 0;  // -z: 0 non-blocking batch, 1 barrier after each (timed), 2 none, 3 before each (untimed)
  int average = 1;   // -a: 0 rank 0, 1 mean, 2 min, 3 max
  int cycles = 1;    // -N: 0 = forever
  int type = qcclFloat32, op = qcclSum, root = 0;  // -1: all
  double timeout = QCCL_CONFIG_UNDEF_DOUBLE;
  std::string algo;  // empty: the library's choice
  int chunk = QCCL_CONFIG_UNDEF_INT, depth = QCCL_CONFIG_UNDEF_INT;
  double link_rate = 0;  // --link-rate, bytes/s; > 0 adds the wire-floor columns
  std::vector<std::string> codecs;  // --codec: one sweep per spec
  double max_relerr = -1;            // --max-relerr: >= 0 fails a compressed cell whose relerr exceeds it
  bool device = false;               // --device: buffers in CUDA device memory
  bool phases = false;               // --phases: where rank 0's time went, per timed operation
};

// A bad command line; its message names the option and the value. Exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses argv into *options. Returns false when --help was printed (exit 0); throws UsageError.
bool parse_options(int argc, char** argv, const CollTest& test, Options* options);

// One line for the "# Blocking Enabled:" header, for -z 1..3.
const char* blocking_summary(int mode);

}  // namespace qccl_perf
