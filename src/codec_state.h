// Codec state: what the library keeps for one tensor across calls (DESIGN.md "Codec state"): the step
// counter that keys random rounding (Marsit's round t), the learning rate the caller set, and the
// state of the method that first used it (collectives/method.h: an error-feedback residual, Marsit's
// compensation, IntSGD's moving average), made at that first use. Owned by qccl, charged to a budget
// (the communicator's QCCL_CODEC_STATE_BUDGET, and a store's own when it lives in one), and
// serializable for checkpoints. CodecStore holds many tensors' states by key.
//
// Threads: calls on one state run one after the other (the communicator orders them; begin_call
// refuses another communicator's while calls are in flight), so nothing here locks except the
// budgets, the store's map and begin_call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/method.h"
#include "src/device.h"

namespace qccl {

// A budget for codec state, shared by the states charged to it (thread-safe). A store's budget has its
// communicator's as parent: a charge must fit both.
class StateBudget {
 public:
  StateBudget(size_t limit, std::shared_ptr<StateBudget> parent = nullptr, std::string name = "QCCL_CODEC_STATE_BUDGET")
      : limit_(limit), parent_(std::move(parent)), name_(std::move(name)) {}
  // Throws Error(qcclInvalidUsage) naming the sizes when `bytes` more would exceed a limit.
  void charge(size_t bytes);
  void release(size_t bytes);
  size_t limit() const { return limit_; }
  size_t used() const { return used_.load(); }

 private:
  const size_t limit_;
  const std::shared_ptr<StateBudget> parent_;
  const std::string name_;
  std::atomic<size_t> used_{0};
};

class CodecState : public std::enable_shared_from_this<CodecState> {
 public:
  CodecState(std::shared_ptr<StateBudget> budget, size_t count);
  ~CodecState();
  CodecState(const CodecState&) = delete;
  CodecState& operator=(const CodecState&) = delete;

  size_t count() const { return count_; }
  // The step of the next collective that uses this state (then incremented).
  uint64_t take_step() { return step_++; }
  uint64_t step() const { return step_; }
  double learning_rate() const { return learning_rate_; }
  void set_learning_rate(double lr) { learning_rate_ = lr; }
  // What the codec's seed is mixed with to key this state's random rounding: a store's state draws
  // from its key's own stream, so that two tensors at the same step do not round with the same
  // numbers (correlated errors: shared/specs/qsdp.md F6); a state made alone draws from the seed.
  uint64_t rounding_salt() const { return rounding_salt_; }
  void set_rounding_key(uint64_t key);
  coll::StateView view() const { return coll::StateView{count_, learning_rate_}; }

  // The state of `method` for this codec, made (and charged) at the first call that needs one.
  // Throws Error(qcclInvalidUsage) when another method made this state's (one state per tensor and
  // method), or past the budget; nothing is sent before that.
  coll::MethodState* bind(const coll::Method& method, const kernels::CodecConfig& codec);

  // Calls on device buffers: the method state's device_arrays() (error feedback's residual, Marsit's
  // compensation) have copies in device memory, and whichever copies the last call used are the
  // current ones. Called when a call starts to run (the calls before it on this state have
  // finished): a device call gets the device copies (uploaded if the host's are newer; empty when the
  // state keeps none), a host call brings the arrays home (downloaded if the device's are newer).
  // save() and load() bring them home too.
  std::vector<void*> arrays_on_device(const std::shared_ptr<Device>& device);
  void arrays_to_host() const;

  // A call on this state from its submission to its end, on communicator `comm`: the returned handle
  // ends it when released. save() and load() are refused meanwhile (Error(qcclInvalidUsage)): the
  // call reads and writes the method state, which a load may even free. So is a call on another
  // communicator: calls on one state run one after the other because their communicator orders
  // them, and two communicators' progress would not be ordered.
  std::shared_ptr<void> begin_call(const void* comm);
  int calls_in_flight() const { return calls_.load(); }

  size_t serialized_bytes() const;
  void save(void* buffer, size_t bytes) const;
  // Restores a checkpoint of this format or an earlier one (1 and 2 predate per-method states).
  // Throws Error(qcclInvalidArgument) naming what does not match (magic, version, count, method,
  // checksum); the state is unchanged then.
  void load(const void* buffer, size_t bytes);

 private:
  // The method's fresh state for this tensor, its bytes charged to the budget before it is made: past
  // the budget, Error(qcclInvalidUsage) and nothing allocated.
  std::unique_ptr<coll::MethodState> make_charged(const coll::Method& method, const kernels::CodecConfig* codec);
  // Takes a state from make_charged (its bytes charged already) in place of the current one.
  void adopt(std::unique_ptr<coll::MethodState> state);

  const std::shared_ptr<StateBudget> budget_;
  const size_t count_;
  uint64_t step_ = 0;
  double learning_rate_ = 0;
  uint64_t rounding_salt_ = 0;
  const coll::Method* method_ = nullptr;  // the method that first used the state
  std::unique_ptr<coll::MethodState> state_;
  size_t charged_ = 0;
  // The arrays' device copies (arrays_on_device); their device outlives them through the pointer.
  std::shared_ptr<Device> device_;
  std::vector<void*> device_arrays_;
  mutable bool device_newer_ = false;  // the device copies are the current ones
  // A checkpoint of format 1 or 2 restored before the method is known: handed to its state then.
  std::vector<float> legacy_values_;
  coll::LegacyState legacy_;
  bool has_legacy_ = false;
  std::atomic<int> calls_{0};
  // begin_call's check and owner_; and method_ and state_, which a call's bind() makes on its thread
  // while a store's Size (serialized_bytes) may read them on another.
  mutable std::mutex calls_mu_;
  const void* owner_ = nullptr;   // the communicator of the calls in flight
};

// Many tensors' states by key (DESIGN.md "Codec state": keyed by a tensor handle the caller makes).
// Calls on states of different keys run concurrently; calls on one key run in call order. Its own
// budget (0: none beyond its communicator's) bounds the states it holds. Thread-safe.
class CodecStore {
 public:
  CodecStore(std::shared_ptr<StateBudget> comm_budget, size_t limit);
  // The state of `key`, made for `count` values at the first get. Throws Error(qcclInvalidArgument)
  // when the key's state holds another count, (qcclInvalidUsage) past a budget.
  std::shared_ptr<CodecState> get(uint64_t key, size_t count);
  // Forgets a key (calls in flight keep its state alive). False when there was none.
  bool erase(uint64_t key);
  // The state of `key`, or null.
  std::shared_ptr<CodecState> find(uint64_t key) const;
  size_t size() const;
  size_t serialized_bytes() const;
  void save(void* buffer, size_t bytes) const;
  // Replaces the whole contents with a checkpoint's (this format or an earlier one). The restored
  // states are charged before the old ones are freed, so a restore needs room for both. Throws
  // Error(qcclInvalidArgument, or qcclInvalidUsage past a budget) naming what is wrong; the store is
  // unchanged then.
  void load(const void* buffer, size_t bytes);
  const std::shared_ptr<StateBudget>& budget() const { return budget_; }

 private:
  mutable std::mutex mu_;
  const std::shared_ptr<StateBudget> budget_;
  std::map<uint64_t, std::shared_ptr<CodecState>> states_;
};

}  // namespace qccl
