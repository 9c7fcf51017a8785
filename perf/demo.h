// What the convergence demonstrations (marsit_convergence, intsgd_convergence) share: option values
// checked with a message that names the option, qccl calls that throw with qccl's message, and a
// main whose exit status follows EXIT STATUS in their --help (2 bad usage, 3 a qccl call failed).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "qccl.h"

namespace qccl_demo {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct QcclError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The number `s` given to `option`, which must lie in [lo, hi].
inline double number(const char* option, const char* s, double lo, double hi) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (!*s || *end || errno || !(v >= lo && v <= hi))
    throw UsageError(std::string("invalid value '") + s + "' for " + option + " (expected a number in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "])");
  return v;
}

inline void check(qcclResult_t r, const char* what) {
  if (r != qcclSuccess) throw QcclError(std::string(what) + ": " + qcclGetLastError(nullptr));
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
