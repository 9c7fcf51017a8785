// What the convergence demonstrations (marsit_convergence, intsgd_convergence) share: option values
// checked with a message that names the option, qccl calls that throw with qccl's message, the
// traffic and loss table they report, and a main whose exit status follows EXIT STATUS in their
// --help (2 bad usage, 3 a qccl call failed).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "qccl.h"
#include "strict_number.h"

namespace qccl_demo {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct QcclError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The number `s` given to `option`, which must lie in [lo, hi]: decimal (strict_number.h; strtod
// alone took ' 5' and 0x10).
inline double number(const char* option, const char* s, double lo, double hi) {
  double v = 0;
  if (!qccl_perf::parse_number(s, &v) || !(v >= lo && v <= hi))
    throw UsageError(std::string("invalid value '") + s + "' for " + option + " (expected a number in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "])");
  return v;
}

// The whole number `s` given to `option` (1e6 too), which must lie in [lo, hi]: a fraction is refused
// rather than truncated (--batch 2.5 was 2).
inline long long integer(const char* option, const char* s, double lo, double hi) {
  const double v = number(option, s, lo, hi);
  if (v != std::floor(v))
    throw UsageError(std::string("invalid value '") + s + "' for " + option + " (expected a whole number)");
  return static_cast<long long>(v);
}

inline void check(qcclResult_t r, const char* what) {
  if (r != qcclSuccess) throw QcclError(std::string(what) + ": " + qcclGetLastError(nullptr));
}

// The two ways a getopt_long loop over argv ends badly: an option it does not know (or one missing
// its value), and an operand, which the demos take none of.
[[noreturn]] inline void unknown_option(char** argv, int optind) {
  throw UsageError(std::string("unknown option, or one without its value: '") + argv[optind - 1] + "' (see --help)");
}
inline void refuse_operands(int argc, char** argv, int optind) {
  if (optind < argc) throw UsageError(std::string("unexpected argument '") + argv[optind] + "' (see --help)");
}

// The bytes a run sent, and what the uncompressed all-reduce would have sent for the same calls.
struct Traffic {
  double wire = 0, raw = 0;
  // Adds the communicator's last call (a compressed one scaled back by its compression ratio) and
  // returns its statistics.
  qcclStats_t add_last_call(qcclComm_t comm, bool compressed) {
    qcclStats_t stats{};
    stats.size = sizeof(stats);
    check(qcclCommGetLastStats(comm, &stats), "qcclCommGetLastStats");
    wire += static_cast<double>(stats.wireBytesSent);
    raw += static_cast<double>(stats.wireBytesSent) * (compressed ? stats.compressionRatio : 1.0);
    return stats;
  }
  double bits_per_value() const { return raw > 0 ? 32.0 * wire / raw : 32.0; }
};

// Rank 0's table: the losses of SGD and of the method, recorded at step 0, every `every` steps and
// at the last step.
inline void print_losses(const std::vector<double>& sgd, const std::vector<double>& method, int every, int steps) {
  for (size_t i = 0; i < sgd.size(); ++i) {
    const int step = i == 0 ? 0 : std::min(static_cast<int>(i) * every, steps);
    std::printf("  %8d %14.6g %14.6g %14.4f\n", step, sgd[i], method[i], method[i] / sgd[i]);
  }
}

// parse(argc, argv, &options) returns false after --help; run(options) returns the verdict's status.
template <class Options, class Parse, class Run>
int demo_main(const char* name, int argc, char** argv, Parse parse, Run run) {
  Options o;
  try {
    if (!parse(argc, argv, &o)) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  }
  try {
    return run(o);
  } catch (const QcclError& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 3;
  }
}

}  // namespace qccl_demo
