#include "src/codec_state.h"

#include <algorithm>
#include <cstring>

#include "base/errors.h"
#include "base/wire.h"

namespace qccl {

namespace {
constexpr uint32_t kStateMagic = 0x54534351;  // "QCST"
constexpr uint32_t kStateVersion = 2;
// magic, version, count, step, IntSGD's r, lr and flags, checksum
constexpr size_t kHeaderBytes = 4 + 4 + 8 + 8 + 8 + 8 + 8 + 8;

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

void StateBudget::charge(size_t bytes) {
  size_t used = used_.load();
  do {
    if (bytes > limit_ - std::min(used, limit_))
      fail(qcclInvalidUsage, "codec state of %zu bytes would exceed QCCL_CODEC_STATE_BUDGET (%zu bytes, %zu in use)",
           bytes, limit_, used);
  } while (!used_.compare_exchange_weak(used, used + bytes));
}

CodecState::CodecState(std::shared_ptr<StateBudget> budget, size_t count) : budget_(std::move(budget)) {
  budget_->charge(count * sizeof(float));
  try {
    residual_.assign(count, 0.0f);
  } catch (...) {
    budget_->release(count * sizeof(float));
    throw;
  }
}

CodecState::~CodecState() { budget_->release(residual_.size() * sizeof(float) + pending_bytes()); }

size_t CodecState::pending_bytes() const {
  return pending_words_.size() * sizeof(uint32_t) + pending_eta_.size() * sizeof(float);
}

kernels::Compensation CodecState::compensation() {
  const size_t words = (residual_.size() + 31) / 32;
  if (pending_eta_.size() != words) {
    budget_->charge(words * (sizeof(uint32_t) + sizeof(float)));
    try {
      pending_words_.assign(words, 0);
      pending_eta_.assign(words, 0.0f);  // nothing pending: c = the stored values
    } catch (...) {
      budget_->release(words * (sizeof(uint32_t) + sizeof(float)));
      pending_words_.clear(), pending_eta_.clear();
      throw;
    }
  }
  return kernels::Compensation{residual_.data(), pending_words_.data(), pending_eta_.data()};
}

size_t CodecState::serialized_bytes() const { return kHeaderBytes + residual_.size() * sizeof(float); }

void CodecState::save(void* buffer, size_t bytes) const {
  if (bytes < serialized_bytes())
    fail(qcclInvalidArgument, "bytes = %zu is smaller than the state's %zu (qcclCodecStateSize)", bytes,
         serialized_bytes());
  ByteWriter w;
  w.put<uint32_t>(kStateMagic);
  w.put<uint32_t>(kStateVersion);
  w.put<uint64_t>(residual_.size());
  w.put<uint64_t>(step_);
  w.put<uint64_t>(bits_of(intsgd_.r));
  w.put<uint64_t>(bits_of(intsgd_.lr));
  w.put<uint64_t>(intsgd_.has_r ? 1 : 0);
  // The floats: the residual, or Marsit's compensation with its pending round applied.
  auto* floats = reinterpret_cast<float*>(static_cast<char*>(buffer) + kHeaderBytes);
  if (pending_eta_.empty()) {
    std::memcpy(floats, residual_.data(), residual_.size() * sizeof(float));
  } else {
    const kernels::Compensation c{const_cast<float*>(residual_.data()), const_cast<uint32_t*>(pending_words_.data()),
                                  const_cast<float*>(pending_eta_.data())};
    kernels::add_compensation(nullptr, c, 0, residual_.size(), floats);
  }
  // Over everything that follows the version: a flipped bit anywhere is caught.
  const uint64_t scalars = checksum(w.bytes().data() + 8, w.bytes().size() - 8);
  w.put<uint64_t>(checksum(floats, residual_.size() * sizeof(float), scalars));
  std::memcpy(buffer, w.bytes().data(), kHeaderBytes);
}

void CodecState::load(const void* buffer, size_t bytes) {
  ByteReader r(static_cast<const uint8_t*>(buffer), bytes, "codec state checkpoint", qcclInvalidArgument);
  const uint32_t magic = r.get<uint32_t>(), version = r.get<uint32_t>();
  if (magic != kStateMagic || version != kStateVersion)
    fail(qcclInvalidArgument, "buffer is not a qccl codec state checkpoint (magic 0x%08x, version %u)", magic, version);
  const uint64_t count = r.get<uint64_t>(), step = r.get<uint64_t>();
  IntsgdMemory intsgd;
  intsgd.r = double_of(r.get<uint64_t>());
  intsgd.lr = double_of(r.get<uint64_t>());
  const uint64_t flags = r.get<uint64_t>(), sum = r.get<uint64_t>();
  intsgd.has_r = flags & 1;
  if (count != residual_.size())
    fail(qcclInvalidArgument, "checkpoint holds a state of %llu values, this state has %zu",
         static_cast<unsigned long long>(count), residual_.size());
  if (r.remaining() < count * sizeof(float))
    fail(qcclInvalidArgument, "checkpoint is truncated: %zu bytes of residual, %llu expected", r.remaining(),
         static_cast<unsigned long long>(count * sizeof(float)));
  const char* data = static_cast<const char*>(buffer) + kHeaderBytes;
  const uint64_t scalars = checksum(static_cast<const uint8_t*>(buffer) + 8, kHeaderBytes - 16);
  if (checksum(data, count * sizeof(float), scalars) != sum)
    fail(qcclInvalidArgument, "checkpoint checksum does not match");
  std::memcpy(residual_.data(), data, count * sizeof(float));
  std::fill(pending_eta_.begin(), pending_eta_.end(), 0.0f);  // the checkpoint holds c itself
  step_ = step;
  intsgd_ = intsgd;
}

}  // namespace qccl
