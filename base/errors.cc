#include "base/errors.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

namespace qccl {
namespace {

std::string vformat(const char* fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::string out(static_cast<size_t>(n), '\0');
  std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  return out;
}

// A plain buffer, not a std::string: thread_local objects with destructors die before statics, and
// a program may call qccl from a static destructor (e.g. qcclCommDestroy at exit).
constexpr size_t kLastErrorBytes = 2048;
thread_local char t_last_error[kLastErrorBytes];

}  // namespace

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string out = vformat(fmt, args);
  va_end(args);
  return out;
}

void fail(qcclResult_t code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string message = vformat(fmt, args);
  va_end(args);
  throw Error(code, std::move(message));
}

std::string errno_string(int errnum) {
  char buf[256];
  // GNU strerror_r returns the message pointer, which may or may not be buf.
  const char* msg = strerror_r(errnum, buf, sizeof(buf));
  return msg;
}

void set_last_error(const std::string& message) {
  std::snprintf(t_last_error, kLastErrorBytes, "%s", message.c_str());
}
const char* last_error() { return t_last_error; }

const char* result_string(qcclResult_t result) {
  switch (result) {
    case qcclSuccess: return "success";
    case qcclInvalidArgument: return "invalid argument";
    case qcclInvalidUsage: return "invalid usage";
    case qcclMismatch: return "ranks called mismatched collectives";
    case qcclRemoteError: return "remote peer failed";
    case qcclTimeout: return "timed out";
    case qcclAborted: return "communicator aborted";
    case qcclSystemError: return "system error";
    case qcclInternalError: return "internal error";
    case qcclInProgress: return "operation in progress";
    case qcclNonFinite: return "non-finite input (NaN or Inf) in a compressed collective";
    case qcclNumResults: break;
  }
  return "unknown result code";
}

}  // namespace qccl
