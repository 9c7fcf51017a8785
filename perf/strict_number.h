// The number syntax of the library's own parsers (base/config.cc: parse_int, parse_double), for the
// perf programs, which link only the public API. strtol and strtod alone also take leading blanks, a
// '+', hex ("0x10"; base 0 read "010" as octal 8) and, strtod, "inf", "nan" and hex floats, so a typo
// or a stray blank in a script ran as some other number.
#pragma once

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace qccl_perf {

// A decimal integer and nothing else: a digit first, or a '-' and a digit (a range may then refuse
// it, with a message that says so).
inline bool parse_integer(const char* s, long long* out) {
  const char* digits = *s == '-' ? s + 1 : s;
  if (!std::isdigit(static_cast<unsigned char>(*digits))) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (*end || errno == ERANGE) return false;
  *out = v;
  return true;
}

// A finite decimal number and nothing else (1e-3 too): a digit or '.' first, after an optional '-'.
inline bool parse_number(const char* s, double* out) {
  const char* lead = *s == '-' ? s + 1 : s;
  if (!(std::isdigit(static_cast<unsigned char>(*lead)) || *lead == '.') || std::strpbrk(s, "xX")) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  // ERANGE: overflow, or underflow to 0 or a subnormal (1e-400 read as 0).
  if (end == s || *end || errno == ERANGE || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace qccl_perf
