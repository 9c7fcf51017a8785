// An error-feedback residual as a method's state (method.h): a float per value of the tensor, zero
// at first, serialized as the floats themselves (format 1). The value-codec method and FFT
// sparsification keep one each; the method's name in the checkpoint tells them apart.
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/method.h"

namespace qccl::coll {

class ResidualState final : public MethodState {
 public:
  explicit ResidualState(size_t count) : residual_(count, 0.0f) {}
  static size_t bytes_for(size_t count) { return coll::bytes_for(count, sizeof(float)); }
  float* residual() { return residual_.data(); }
  std::vector<StateArray> device_arrays() override { return {{residual_.data(), bytes()}}; }

  size_t bytes() const override { return residual_.size() * sizeof(float); }
  uint32_t version() const override { return 1; }
  size_t serialized_bytes() const override { return bytes(); }
  void save(uint8_t* out) const override { std::memcpy(out, residual_.data(), bytes()); }
  void load(const uint8_t* in, size_t bytes, uint32_t version) override {
    if (version != 1) throw std::invalid_argument("residual of format " + std::to_string(version) + " (this is 1)");
    if (bytes != this->bytes())
      throw std::invalid_argument("residual of " + std::to_string(bytes / sizeof(float)) + " values, this state has " +
                                  std::to_string(residual_.size()));
    std::memcpy(residual_.data(), in, bytes);
  }
  void load_legacy(const LegacyState& legacy) override {
    std::memcpy(residual_.data(), legacy.values, legacy.count * sizeof(float));
  }

 private:
  std::vector<float> residual_;
};

}  // namespace qccl::coll
