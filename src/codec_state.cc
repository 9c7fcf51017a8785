#include "src/codec_state.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>

#include "base/errors.h"
#include "base/wire.h"

namespace qccl {

namespace {

constexpr uint32_t kStateMagic = 0x54534351;  // "QCST"
// 1: count, step, residual. 2: + IntSGD's memory and learning rate. 3: the method's own state.
constexpr uint32_t kStateVersion = 3;
constexpr uint32_t kStoreMagic = 0x53534351;  // "QCSS"
constexpr uint32_t kStoreVersion = 1;
constexpr size_t kMaxMethodName = 64;

uint64_t bits_of(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}
double double_of(uint64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof(v));
  return v;
}

uint64_t checksum(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  return h;
}

}  // namespace

// ---- Budgets -------------------------------------------------------------------------------------

void StateBudget::charge(size_t bytes) {
  size_t used = used_.load();
  do {
    if (bytes > limit_ - std::min(used, limit_))
      fail(qcclInvalidUsage, "codec state of %zu bytes would exceed %s (%zu bytes, %zu in use)", bytes, name_.c_str(),
           limit_, used);
  } while (!used_.compare_exchange_weak(used, used + bytes));
  if (!parent_) return;
  try {
    parent_->charge(bytes);
  } catch (...) {
    used_.fetch_sub(bytes);
    throw;
  }
}

void StateBudget::release(size_t bytes) {
  used_.fetch_sub(bytes);
  if (parent_) parent_->release(bytes);
}

// ---- One tensor's state --------------------------------------------------------------------------

CodecState::CodecState(std::shared_ptr<StateBudget> budget, size_t count) : budget_(std::move(budget)), count_(count) {}

CodecState::~CodecState() {
  budget_->release(charged_);
  if (device_arrays_.empty()) return;
  try {
    device_->synchronize();  // no call on them may still run
    for (void* p : device_arrays_) device_->release(Device::Memory::kDevice, p);
  } catch (const Error&) {
    // A device that cannot synchronize keeps the memory: its work may still touch it.
  }
}

std::vector<void*> CodecState::arrays_on_device(const std::shared_ptr<Device>& device) {
  const std::vector<coll::StateArray> arrays = state_ ? state_->device_arrays() : std::vector<coll::StateArray>{};
  if (arrays.empty()) return {};
  if (device_ && device_.get() != device.get())
    fail(qcclInvalidUsage, "the codec state's %s state lives on %s, not %s: a state serves one device",
         method_->name(), device_->describe().c_str(), device->describe().c_str());
  if (!device_arrays_.empty() && device_arrays_.size() != arrays.size())
    fail(qcclInternalError, "the codec state's %s state has %zu arrays, its device copies %zu", method_->name(),
         arrays.size(), device_arrays_.size());
  if (device_arrays_.empty()) {
    device_ = device;
    for (const coll::StateArray& a : arrays) {
      try {
        device_arrays_.push_back(device->allocate(Device::Memory::kDevice, a.bytes));
      } catch (const Error&) {
        for (void* p : device_arrays_) device->release(Device::Memory::kDevice, p);
        device_arrays_.clear();
        throw;
      }
    }
  }
  if (!device_newer_) {  // the host's copies are newer: up, before the call's kernels (the same stream)
    for (size_t i = 0; i < arrays.size(); ++i) device_->copy(device_arrays_[i], arrays[i].host, arrays[i].bytes);
    device_->synchronize();  // the host copies are pageable memory that a host call may change later
    device_newer_ = true;
  }
  return device_arrays_;
}

void CodecState::arrays_to_host() const {
  if (!device_newer_) return;
  const std::vector<coll::StateArray> arrays = state_->device_arrays();
  device_->synchronize();  // the last device call's update is done
  for (size_t i = 0; i < arrays.size(); ++i) device_->copy(arrays[i].host, device_arrays_[i], arrays[i].bytes);
  device_->synchronize();
  device_newer_ = false;
}

std::unique_ptr<coll::MethodState> CodecState::make_charged(const coll::Method& method,
                                                            const kernels::CodecConfig* codec) {
  const size_t bytes = method.state_bytes(count_, codec);
  if (bytes == SIZE_MAX)
    fail(qcclInvalidArgument, "count = %zu: %s's state of that many values would not fit in memory", count_,
         method.name());
  budget_->charge(bytes);
  std::unique_ptr<coll::MethodState> made;
  try {
    made = method.make_state(count_, codec);
  } catch (...) {
    budget_->release(bytes);
    throw;
  }
  if (const size_t held = made ? made->bytes() : 0; held != bytes) {
    budget_->release(bytes);
    fail(qcclInternalError, "%s's state of %zu values holds %zu bytes, %zu charged", method.name(), count_, held,
         bytes);
  }
  return made;
}

void CodecState::adopt(std::unique_ptr<coll::MethodState> state) {
  budget_->release(charged_);
  charged_ = state ? state->bytes() : 0;
  state_ = std::move(state);
}

coll::MethodState* CodecState::bind(const coll::Method& method, const kernels::CodecConfig& codec) {
  std::lock_guard<std::mutex> lock(calls_mu_);
  if (method_ && method_ != &method)
    fail(qcclInvalidUsage, "the codec state holds %s's state, but codec '%s' is %s's: one state per tensor and method",
         method_->name(), codec.canonical().c_str(), method.name());
  if (!state_) {
    std::unique_ptr<coll::MethodState> made = make_charged(method, &codec);
    if (made && has_legacy_) made->load_legacy(legacy_);
    if (made) adopt(std::move(made));
    if (state_) has_legacy_ = false, legacy_values_.clear();
  }
  method_ = &method;
  return state_.get();
}

size_t CodecState::serialized_bytes() const {
  std::lock_guard<std::mutex> lock(calls_mu_);  // a call's bind() may be making the method's state
  const size_t name = method_ ? std::strlen(method_->name()) : 0;
  // magic, version, count, step, learning rate, name (length + bytes), state version, state length,
  // state, checksum
  return 4 + 4 + 8 + 8 + 8 + 4 + name + 4 + 8 + (state_ ? state_->serialized_bytes() : 0) + 8;
}

namespace {
void refuse_calls_in_flight(int calls, const char* what) {
  if (calls)
    fail(qcclInvalidUsage, "%s while %d calls on the state are in flight (qcclWait for them first)", what, calls);
}
}  // namespace

std::shared_ptr<void> CodecState::begin_call(const void* comm) {
  std::lock_guard<std::mutex> lock(calls_mu_);
  if (const int calls = calls_.load(); calls > 0 && owner_ != comm)
    fail(qcclInvalidUsage, "state: %d calls on it are in flight on another communicator (qcclWait for them first): "
         "a state's calls run in order on one communicator at a time", calls);
  owner_ = comm;
  calls_.fetch_add(1);
  return std::shared_ptr<void>(nullptr, [self = shared_from_this()](void*) { self->calls_.fetch_sub(1); });
}

void CodecState::save(void* buffer, size_t bytes) const {
  refuse_calls_in_flight(calls_.load(), "a checkpoint's save");
  if (bytes < serialized_bytes())
    fail(qcclInvalidArgument, "bytes = %zu is smaller than the state's %zu (qcclCodecStateSize)", bytes,
         serialized_bytes());
  arrays_to_host();
  ByteWriter w;
  w.put<uint32_t>(kStateMagic);
  w.put<uint32_t>(kStateVersion);
  w.put<uint64_t>(count_);
  w.put<uint64_t>(step_);
  w.put<uint64_t>(bits_of(learning_rate_));
  w.put_string(method_ ? method_->name() : "");
  w.put<uint32_t>(state_ ? state_->version() : 0);
  std::vector<uint8_t> blob(state_ ? state_->serialized_bytes() : 0);
  if (state_) state_->save(blob.data());
  w.put<uint64_t>(blob.size());
  w.bytes().insert(w.bytes().end(), blob.begin(), blob.end());
  // Over everything that follows the version: a flipped bit anywhere is caught.
  w.put<uint64_t>(checksum(w.bytes().data() + 8, w.bytes().size() - 8));
  std::memcpy(buffer, w.bytes().data(), w.bytes().size());
}

void CodecState::load(const void* buffer, size_t bytes) {
  refuse_calls_in_flight(calls_.load(), "a checkpoint's load");
  arrays_to_host();  // a load that fails leaves the state as it was, on the host: current there
  const auto* data = static_cast<const uint8_t*>(buffer);
  ByteReader r(data, bytes, "codec state checkpoint", qcclInvalidArgument);
  const uint32_t magic = r.get<uint32_t>(), version = r.get<uint32_t>();
  if (magic != kStateMagic || version < 1 || version > kStateVersion)
    fail(qcclInvalidArgument,
         "buffer is not a qccl codec state checkpoint of format 1 to %u (magic 0x%08x, version %u)", kStateVersion,
         magic, version);
  const uint64_t count = r.get<uint64_t>(), step = r.get<uint64_t>();
  if (count != count_)
    fail(qcclInvalidArgument, "checkpoint holds a state of %llu values, this state has %zu",
         static_cast<unsigned long long>(count), count_);

  if (version <= 2) {  // one float per value, and (2) IntSGD's memory: handed to the method's state
    double lr = learning_rate_;
    coll::LegacyState legacy;
    uint64_t sum = 0;
    size_t header = 4 + 4 + 8 + 8 + 8;
    if (version == 2) {
      legacy.moving_average = double_of(r.get<uint64_t>());
      lr = double_of(r.get<uint64_t>());
      legacy.has_moving_average = r.get<uint64_t>() & 1;
      header += 8 + 8 + 8;
    }
    sum = r.get<uint64_t>();
    if (count > r.remaining() / sizeof(float))  // (count * 4 could wrap)
      fail(qcclInvalidArgument, "checkpoint is truncated: %zu bytes of values, %llu expected", r.remaining(),
           static_cast<unsigned long long>(count * sizeof(float)));
    const uint8_t* values = data + header;
    // Format 1 sums the values; format 2 the header fields after the version, then the values.
    const uint64_t expected = version == 1 ? checksum(values, count * sizeof(float))
                                           : checksum(values, count * sizeof(float), checksum(data + 8, header - 16));
    if (expected != sum) fail(qcclInvalidArgument, "checkpoint checksum does not match");
    std::vector<float> floats(count);
    std::memcpy(floats.data(), values, count * sizeof(float));
    legacy.values = floats.data();
    legacy.count = count;
    if (state_) {
      state_->load_legacy(legacy);
    } else {
      legacy_values_ = std::move(floats);
      legacy_ = legacy;
      legacy_.values = legacy_values_.data();
      has_legacy_ = true;
    }
    step_ = step;
    learning_rate_ = lr;
    return;
  }

  const double lr = double_of(r.get<uint64_t>());
  const std::string name = r.get_string(kMaxMethodName);
  const uint32_t state_version = r.get<uint32_t>();
  const uint64_t length = r.get<uint64_t>();
  if (length > r.remaining())
    fail(qcclInvalidArgument, "checkpoint is truncated: %zu bytes of method state, %llu expected", r.remaining(),
         static_cast<unsigned long long>(length));
  const uint8_t* blob = r.take(static_cast<size_t>(length));
  const size_t covered = bytes - r.remaining();
  const uint64_t sum = r.get<uint64_t>();
  if (checksum(data + 8, covered - 8) != sum) fail(qcclInvalidArgument, "checkpoint checksum does not match");

  const coll::Method* method = nullptr;
  if (!name.empty()) {
    method = coll::find_method(name);
    if (!method)
      fail(qcclInvalidArgument, "checkpoint holds the state of method '%s', which this build does not have",
           name.c_str());
    if (method_ && method_ != method)
      fail(qcclInvalidArgument, "checkpoint holds %s's state, but this state is %s's", name.c_str(), method_->name());
  }
  // Into the state in place when this method made one already (calls bound to it keep pointing at
  // it), else into a new one.
  auto restore = [&](coll::MethodState& into) {
    try {
      into.load(blob, static_cast<size_t>(length), state_version);
    } catch (const std::invalid_argument& e) {
      fail(qcclInvalidArgument, "checkpoint's %s state: %s", name.c_str(), e.what());
    }
  };
  if (method && length && state_ && method_ == method) {
    restore(*state_);
  } else {
    std::unique_ptr<coll::MethodState> restored;
    if (method && length) {
      try {  // a store's entry names its own count: a crafted one must not end the process
        restored = make_charged(*method, nullptr);
      } catch (const std::bad_alloc&) {
        fail(qcclInvalidArgument, "checkpoint's %s state of %zu values cannot be allocated", name.c_str(), count_);
      } catch (const std::length_error&) {
        fail(qcclInvalidArgument, "checkpoint's %s state of %zu values cannot be allocated", name.c_str(), count_);
      }
      try {
        restore(*restored);
      } catch (...) {
        budget_->release(restored->bytes());
        throw;
      }
    }
    adopt(std::move(restored));
  }
  if (method) method_ = method;
  has_legacy_ = false;
  legacy_values_.clear();
  step_ = step;
  learning_rate_ = lr;
}

// ---- Many tensors' states ------------------------------------------------------------------------

CodecStore::CodecStore(std::shared_ptr<StateBudget> comm_budget, size_t limit)
    : budget_(std::make_shared<StateBudget>(limit ? limit : ~size_t{0}, std::move(comm_budget), "the store's budget")) {
}

void CodecState::set_rounding_key(uint64_t key) {
  uint64_t z = key + 0x9e3779b97f4a7c15ull;  // splitmix64: keys 0, 1, 2 ... far apart
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  rounding_salt_ = z ^ (z >> 31);
}

std::shared_ptr<CodecState> CodecStore::get(uint64_t key, size_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(key);
  if (it != states_.end()) {
    if (it->second->count() != count)
      fail(qcclInvalidArgument, "count = %zu but the state of key %llu holds %zu values (one key per tensor)", count,
           static_cast<unsigned long long>(key), it->second->count());
    return it->second;
  }
  auto state = std::make_shared<CodecState>(budget_, count);
  state->set_rounding_key(key);
  states_.emplace(key, state);
  return state;
}

bool CodecStore::erase(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  return states_.erase(key) != 0;
}

std::shared_ptr<CodecState> CodecStore::find(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? nullptr : it->second;
}

size_t CodecStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return states_.size();
}

size_t CodecStore::serialized_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t total = 4 + 4 + 8 + 8;  // magic, version, entries, checksum
  for (const auto& [key, state] : states_) total += 8 + 8 + state->serialized_bytes();
  return total;
}

// Sized and written under one lock: a key another thread adds meanwhile must not grow what is
// written past what was checked.
void CodecStore::save(void* buffer, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  ByteWriter w;
  w.put<uint32_t>(kStoreMagic);
  w.put<uint32_t>(kStoreVersion);
  w.put<uint64_t>(states_.size());
  for (const auto& [key, state] : states_) {
    std::vector<uint8_t> blob(state->serialized_bytes());
    state->save(blob.data(), blob.size());
    w.put<uint64_t>(key);
    w.put<uint64_t>(blob.size());
    w.bytes().insert(w.bytes().end(), blob.begin(), blob.end());
  }
  w.put<uint64_t>(checksum(w.bytes().data() + 8, w.bytes().size() - 8));
  if (bytes < w.bytes().size())
    fail(qcclInvalidArgument, "bytes = %zu is smaller than the store's %zu (qcclCodecStoreSize)", bytes,
         w.bytes().size());
  std::memcpy(buffer, w.bytes().data(), w.bytes().size());
}

void CodecStore::load(const void* buffer, size_t bytes) {
  const auto* data = static_cast<const uint8_t*>(buffer);
  ByteReader r(data, bytes, "codec store checkpoint", qcclInvalidArgument);
  const uint32_t magic = r.get<uint32_t>(), version = r.get<uint32_t>();
  if (magic != kStoreMagic || version < 1 || version > kStoreVersion)
    fail(qcclInvalidArgument,
         "buffer is not a qccl codec store checkpoint of format 1 to %u (magic 0x%08x, version %u)", kStoreVersion,
         magic, version);
  const uint64_t entries = r.get<uint64_t>();
  std::map<uint64_t, std::shared_ptr<CodecState>> restored;
  for (uint64_t i = 0; i < entries; ++i) {
    const uint64_t key = r.get<uint64_t>(), length = r.get<uint64_t>();
    if (length > r.remaining() || length < 16)
      fail(qcclInvalidArgument, "codec store checkpoint: entry %llu (key %llu) is truncated",
           static_cast<unsigned long long>(i), static_cast<unsigned long long>(key));
    const uint8_t* blob = r.take(static_cast<size_t>(length));
    uint64_t count = 0;  // the state's count sits after its magic and version
    for (int b = 0; b < 8; ++b) count |= uint64_t{blob[8 + b]} << (8 * b);
    auto state = std::make_shared<CodecState>(budget_, static_cast<size_t>(count));
    state->set_rounding_key(key);
    try {
      state->load(blob, static_cast<size_t>(length));
    } catch (const Error& e) {
      fail(e.code(), "codec store checkpoint, key %llu: %s", static_cast<unsigned long long>(key), e.message().c_str());
    }
    if (!restored.emplace(key, std::move(state)).second)
      fail(qcclInvalidArgument, "codec store checkpoint holds key %llu twice", static_cast<unsigned long long>(key));
  }
  const size_t covered = bytes - r.remaining();
  if (checksum(data + 8, covered - 8) != r.get<uint64_t>())
    fail(qcclInvalidArgument, "codec store checkpoint checksum does not match");
  std::lock_guard<std::mutex> lock(mu_);
  // As a state's own load: a call on a key's old state would go on updating what the store dropped.
  for (const auto& [key, state] : states_)
    if (const int calls = state->calls_in_flight())
      fail(qcclInvalidUsage, "key %llu: a checkpoint's load while %d calls on its state are in flight (qcclWait for "
           "them first)", static_cast<unsigned long long>(key), calls);
  states_.swap(restored);
}

}  // namespace qccl
