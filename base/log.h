// Logging in NCCL's manner: QCCL_DEBUG=WARN|INFO|TRACE selects the level (unset: nothing but fatal
// configuration errors), QCCL_DEBUG_FILE=path (%h host, %p pid) redirects it. Each line reads
//   host:pid:tid [rank] QCCL LEVEL message
// The rank is the calling thread's current communicator rank (log_set_rank), or '-' outside one.
#pragma once

namespace qccl {

enum class LogLevel : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

LogLevel log_level();
void log_write(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void log_set_rank(int rank);  // -1: none

}  // namespace qccl

#define QCCL_LOG(level, ...)                                                     \
  do {                                                                           \
    if (static_cast<int>(::qccl::log_level()) >= static_cast<int>(level))        \
      ::qccl::log_write(level, __VA_ARGS__);                                     \
  } while (0)
#define QCCL_WARN(...) QCCL_LOG(::qccl::LogLevel::kWarn, __VA_ARGS__)
#define QCCL_INFO(...) QCCL_LOG(::qccl::LogLevel::kInfo, __VA_ARGS__)
#define QCCL_TRACE(...) QCCL_LOG(::qccl::LogLevel::kTrace, __VA_ARGS__)
