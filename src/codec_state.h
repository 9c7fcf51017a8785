// Codec state: what a codec keeps for one tensor across steps (DESIGN.md "Codec state"): the
// error-feedback residual or Marsit's compensation, and the step counter that keys random rounding
// (Marsit's round t). Owned by qccl, charged
// to its communicator's budget (QCCL_CODEC_STATE_BUDGET), and serializable for checkpoints.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/marsit.h"

namespace qccl {

// A communicator's budget for codec state, shared by the states it created (thread-safe).
class StateBudget {
 public:
  explicit StateBudget(size_t limit) : limit_(limit) {}
  // Throws Error(qcclInvalidUsage) naming the sizes when `bytes` more would exceed the limit.
  void charge(size_t bytes);
  void release(size_t bytes) { used_.fetch_sub(bytes); }
  size_t limit() const { return limit_; }

 private:
  const size_t limit_;
  std::atomic<size_t> used_{0};
};

// IntSGD's replicated scalars (int codecs): identical on every rank, since they change only through
// results every rank shares. r is the moving average of ||x^k - x^(k-1)||^2 = eta_(k-1)^2 ||g~||^2
// (alpha=lr) or of ||g~||^2 (alpha=grad), g~ the decoded average; lr is the caller's next eta.
struct IntsgdMemory {
  double r = 0;
  bool has_r = false;  // false until a round completed with finite values: the next round is exact
  double lr = 0;       // 0 until the caller sets it
};

class CodecState {
 public:
  CodecState(std::shared_ptr<StateBudget> budget, size_t count);
  ~CodecState();
  CodecState(const CodecState&) = delete;
  CodecState& operator=(const CodecState&) = delete;

  size_t count() const { return residual_.size(); }
  float* residual() { return residual_.data(); }
  // Marsit's compensation: the residual's floats as its stored values, with the words and eta_s of
  // a pending sign round (kernels/marsit.h). Those are allocated, and charged to the budget, at the
  // first call (Error(qcclInvalidUsage) past the budget); nothing is pending until a sign round.
  kernels::Compensation compensation();
  // The step of the next collective that uses this state (then incremented).
  uint64_t take_step() { return step_++; }
  uint64_t step() const { return step_; }
  IntsgdMemory& intsgd() { return intsgd_; }

  size_t serialized_bytes() const;
  void save(void* buffer, size_t bytes) const;
  // Throws Error(qcclInvalidArgument) naming what does not match (magic, version, count, checksum).
  void load(const void* buffer, size_t bytes);

 private:
  size_t pending_bytes() const;

  std::shared_ptr<StateBudget> budget_;
  std::vector<float> residual_;
  std::vector<uint32_t> pending_words_;  // Marsit: empty until compensation() is first called
  std::vector<float> pending_eta_;
  uint64_t step_ = 0;
  IntsgdMemory intsgd_;
};

}  // namespace qccl
