#include "base/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace qccl {
namespace {

struct Logger {
  LogLevel level = LogLevel::kNone;
  FILE* out = stderr;
  char host[64] = "?";
  std::mutex mu;

  Logger() {
    gethostname(host, sizeof(host) - 1);
    if (char* dot = std::strchr(host, '.')) *dot = '\0';
    if (const char* v = std::getenv("QCCL_DEBUG")) {
      if (!strcasecmp(v, "WARN")) level = LogLevel::kWarn;
      else if (!strcasecmp(v, "INFO")) level = LogLevel::kInfo;
      else if (!strcasecmp(v, "TRACE")) level = LogLevel::kTrace;
      else if (!strcasecmp(v, "NONE") || !*v) level = LogLevel::kNone;
      else
        std::fprintf(stderr, "qccl: QCCL_DEBUG = '%s' is not one of NONE, WARN, INFO, TRACE; using WARN\n",
                     v), level = LogLevel::kWarn;
    }
    if (const char* path = std::getenv("QCCL_DEBUG_FILE"); path && *path && level != LogLevel::kNone) {
      std::string name;
      for (const char* p = path; *p; ++p) {
        if (p[0] == '%' && p[1] == 'h') name += host, ++p;
        else if (p[0] == '%' && p[1] == 'p') name += std::to_string(getpid()), ++p;
        else name += *p;
      }
      if (FILE* f = std::fopen(name.c_str(), "a")) {
        setvbuf(f, nullptr, _IOLBF, 0);
        out = f;
      } else {
        std::fprintf(stderr, "qccl: QCCL_DEBUG_FILE = '%s': cannot open '%s' (%s); logging to stderr\n",
                     path, name.c_str(), std::strerror(errno));
      }
    }
  }
};

Logger& logger() {
  static Logger* instance = new Logger();  // never destroyed: logging works during exit
  return *instance;
}

thread_local int t_rank = -1;

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kNone: break;
  }
  return "";
}

}  // namespace

LogLevel log_level() { return logger().level; }
void log_set_rank(int rank) { t_rank = rank; }

void log_write(LogLevel level, const char* fmt, ...) {
  Logger& log = logger();
  char message[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(message, sizeof(message), fmt, args);
  va_end(args);
  char rank[16] = "-";
  if (t_rank >= 0) std::snprintf(rank, sizeof(rank), "%d", t_rank);
  std::lock_guard<std::mutex> lock(log.mu);
  std::fprintf(log.out, "%s:%d:%ld [%s] QCCL %s %s\n", log.host, static_cast<int>(getpid()),
               static_cast<long>(syscall(SYS_gettid)), rank, level_name(level), message);
  std::fflush(log.out);
}

}  // namespace qccl
