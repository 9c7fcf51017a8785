// Little-endian serialisation for bootstrap and control-plane messages. ByteReader checks every read
// against the end of the buffer and throws Error(code) naming the message: input from the network
// is never trusted (a fuzzer drives these readers).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/errors.h"

namespace qccl {

class ByteWriter {
 public:
  template <class T>
  void put(T value) {
    static_assert(std::is_integral_v<T>, "integers only");
    for (size_t i = 0; i < sizeof(T); ++i) bytes_.push_back(static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i)));
  }
  void put_bytes(const void* data, size_t n) {
    put<uint32_t>(static_cast<uint32_t>(n));
    const auto* p = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + n);
  }
  void put_string(const std::string& s) { put_bytes(s.data(), s.size()); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, const char* what, qcclResult_t code = qcclRemoteError)
      : p_(data), end_(data + size), what_(what), code_(code) {}
  template <class T>
  T get() {
    static_assert(std::is_integral_v<T>, "integers only");
    need(sizeof(T));
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p_[i]) << (8 * i);
    p_ += sizeof(T);
    return static_cast<T>(v);
  }
  std::vector<uint8_t> get_bytes(size_t max_len) {
    uint32_t n = get<uint32_t>();
    if (n > max_len) fail(code_, "malformed %s: a field of %u bytes exceeds its limit of %zu", what_, n, max_len);
    need(n);
    std::vector<uint8_t> out(p_, p_ + n);
    p_ += n;
    return out;
  }
  std::string get_string(size_t max_len) {
    auto b = get_bytes(max_len);
    return std::string(b.begin(), b.end());
  }
  // The next n bytes, in place (valid as long as the buffer).
  const uint8_t* take(size_t n) {
    need(n);
    const uint8_t* at = p_;
    p_ += n;
    return at;
  }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

 private:
  void need(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n)
      fail(code_, "malformed %s: truncated (%zu bytes left, %zu needed)", what_, remaining(), n);
  }
  const uint8_t* p_;
  const uint8_t* end_;
  const char* what_;
  qcclResult_t code_;
};

}  // namespace qccl
