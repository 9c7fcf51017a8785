// Errors inside qccl are exceptions carrying a public result code and a message that names the
// argument and its value. They never cross the C boundary: api.cc translates each one into a
// qcclResult_t plus the thread's last-error line (STYLE rule 15).
#pragma once

#include <exception>
#include <string>

#include "include/qccl.h"

namespace qccl {

class Error : public std::exception {
 public:
  Error(qcclResult_t code, std::string message) : code_(code), message_(std::move(message)) {}
  qcclResult_t code() const { return code_; }
  const std::string& message() const { return message_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  qcclResult_t code_;
  std::string message_;
};

// printf-style formatting into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Throws Error(code, formatted message).
[[noreturn]] void fail(qcclResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// strerror(errnum) as a std::string (thread-safe).
std::string errno_string(int errnum);

// The calling thread's last error line (qcclGetLastError).
void set_last_error(const std::string& message);
const char* last_error();

const char* result_string(qcclResult_t result);

}  // namespace qccl
