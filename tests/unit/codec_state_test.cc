// Codec states and stores (src/codec_state.h) with the methods' states (collectives/method.h):
// checkpoints round-trip for every method, restore from the formats of earlier releases (1 and 2,
// written here byte by byte as those releases did), refuse corrupt or foreign buffers without changing
// anything, a state serves one method, budgets (a store's inside its communicator's) are charged and
// released exactly, and a store's checkpoint restores every key.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <vector>

#include "base/errors.h"
#include "base/wire.h"
#include "collectives/compressed.h"
#include "collectives/fft.h"
#include "collectives/intsgd.h"
#include "collectives/marsit.h"
#include "collectives/method.h"
#include "kernels/codec.h"
#include "src/codec_state.h"

namespace qccl::test {
namespace {

const coll::Method& method_of(const kernels::CodecConfig& codec) {
  const coll::Method* m = coll::method_for(codec);
  REQUIRE(m != nullptr);
  return *m;
}

// Binds `state` to the codec's method and returns that method's call, as a communicator would.
std::unique_ptr<coll::MethodCall> begin(CodecState& state, const kernels::CodecConfig& codec, coll::CollArgs& args) {
  const coll::Method& method = method_of(codec);
  coll::MethodState* ms = state.bind(method, codec);
  const coll::StateView view = state.view();
  args.codec = &codec;
  args.count = state.count();
  args.nranks = 4;
  return method.begin(args, ms, &view);
}

std::vector<uint8_t> save(const CodecState& state) {
  std::vector<uint8_t> bytes(state.serialized_bytes());
  state.save(bytes.data(), bytes.size());
  return bytes;
}

uint64_t fnv(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  return h;
}

qcclResult_t code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return qcclSuccess;
}

}  // namespace

TEST_CASE("codec state: an error-feedback residual round-trips through a checkpoint", "[codec_state]") {
  auto budget = std::make_shared<StateBudget>(1 << 20);
  const kernels::CodecConfig q8 = kernels::parse_codec_spec("q8:ef=on");
  CodecState a(budget, 100);
  coll::CollArgs args;
  auto call = begin(a, q8, args);
  float* residual = static_cast<coll::QuantizedCall*>(call.get())->residual;
  REQUIRE(residual != nullptr);
  for (int i = 0; i < 100; ++i) residual[i] = 0.25f * i;
  a.take_step(), a.take_step();
  a.set_learning_rate(0.5);
  CHECK(budget->used() == 400);

  // Restored into a state that already holds one: in place, so that a call bound to it sees it.
  const std::vector<uint8_t> checkpoint = save(a);
  for (int i = 0; i < 100; ++i) residual[i] = -1.0f;
  a.load(checkpoint.data(), checkpoint.size());
  for (int i = 0; i < 100; ++i) REQUIRE(residual[i] == 0.25f * i);

  CodecState b(budget, 100);
  b.load(save(a).data(), save(a).size());
  CHECK(b.step() == 2);
  CHECK(b.learning_rate() == 0.5);
  coll::CollArgs args_b;
  auto call_b = begin(b, q8, args_b);
  const float* restored = static_cast<coll::QuantizedCall*>(call_b.get())->residual;
  for (int i = 0; i < 100; ++i) REQUIRE(restored[i] == 0.25f * i);
  CHECK(budget->used() == 800);
}

TEST_CASE("codec state: the fft residual round-trips and outlives a change of theta", "[codec_state]") {
  auto budget = std::make_shared<StateBudget>(1 << 20);
  const kernels::CodecConfig first = kernels::parse_codec_spec("fft:theta=0.9,ef=on");
  const kernels::CodecConfig later = kernels::parse_codec_spec("fft:theta=0.5,ef=on");
  CodecState a(budget, 64);
  coll::CollArgs args;
  auto call = begin(a, first, args);
  float* residual = static_cast<coll::FftCall*>(call.get())->residual;
  REQUIRE(residual != nullptr);
  for (int i = 0; i < 64; ++i) residual[i] = 0.5f * i - 3;
  CHECK(budget->used() == 256);
  // A schedule passes another fft codec with the same state: the same residual.
  coll::CollArgs args_later;
  auto call_later = begin(a, later, args_later);
  CHECK(static_cast<coll::FftCall*>(call_later.get())->residual == residual);
  CodecState b(budget, 64);
  const std::vector<uint8_t> checkpoint = save(a);
  b.load(checkpoint.data(), checkpoint.size());
  coll::CollArgs args_b;
  auto call_b = begin(b, later, args_b);
  const float* restored = static_cast<coll::FftCall*>(call_b.get())->residual;
  for (int i = 0; i < 64; ++i) REQUIRE(restored[i] == 0.5f * i - 3);
  // Without error feedback the method keeps nothing.
  CodecState c(budget, 64);
  coll::CollArgs args_c;
  auto call_c = begin(c, kernels::parse_codec_spec("fft"), args_c);
  CHECK(static_cast<coll::FftCall*>(call_c.get())->residual == nullptr);
  CHECK(budget->used() == 512);
}

TEST_CASE("codec state: a state without error feedback holds no memory; a fixed IntSGD alpha neither",
          "[codec_state]") {
  auto budget = std::make_shared<StateBudget>(1 << 20);
  CodecState a(budget, 1000);
  coll::CollArgs args;
  auto call = begin(a, kernels::parse_codec_spec("q4"), args);
  CHECK(static_cast<coll::QuantizedCall*>(call.get())->residual == nullptr);
  CHECK(budget->used() == 0);
  // The same method with error feedback later makes the residual then.
  auto ef = begin(a, kernels::parse_codec_spec("q4:ef=on"), args);
  CHECK(static_cast<coll::QuantizedCall*>(ef.get())->residual != nullptr);
  CHECK(budget->used() == 4000);

  CodecState b(budget, 1000);
  begin(b, kernels::parse_codec_spec("int8:alpha=3"), args);
  CHECK(budget->used() == 4000);
}

TEST_CASE("codec state: Marsit's compensation is checkpointed as c itself, its pending round applied",
          "[codec_state]") {
  auto budget = std::make_shared<StateBudget>(1 << 20);
  const kernels::CodecConfig sign = kernels::parse_codec_spec("sign:eta_s=0.5");
  CodecState a(budget, 64);
  coll::CollArgs args;
  auto call = begin(a, sign, args);
  kernels::Compensation c = static_cast<coll::MarsitCall*>(call.get())->compensation;
  for (int i = 0; i < 64; ++i) c.stored[i] = 1.0f + i;  // w after a pack
  c.words[0] = 0xffffffffu, c.words[1] = 0;             // the decoded bits of a round...
  c.eta[0] = c.eta[1] = 0.5f;                           // ...pending: c = w - g
  CHECK(budget->used() == 64 * 4 + 2 * 8);

  const std::vector<uint8_t> bytes = save(a);
  CodecState b(budget, 64);
  b.load(bytes.data(), bytes.size());
  auto call_b = begin(b, sign, args);
  const kernels::Compensation cb = static_cast<coll::MarsitCall*>(call_b.get())->compensation;
  for (int i = 0; i < 64; ++i) {
    const float g = i < 32 ? 0.5f : -0.5f;
    REQUIRE(cb.stored[i] == (1.0f + i) - g);
  }
  CHECK(cb.eta[0] == 0.0f);  // nothing pending after a restore
  CHECK(cb.eta[1] == 0.0f);
}

TEST_CASE("codec state: IntSGD's moving average round-trips; formats 1 and 2 restore into it and into a residual",
          "[codec_state]") {
  auto budget = std::make_shared<StateBudget>(1 << 20);
  const kernels::CodecConfig int8 = kernels::parse_codec_spec("int8:alpha=lr");
  coll::CollArgs args;
  {
    CodecState a(budget, 10);
    a.set_learning_rate(0.1);
    auto call = begin(a, int8, args);
    static_cast<coll::IntsgdCall*>(call.get())->prepare(args);
    CHECK(static_cast<coll::IntsgdCall*>(call.get())->round().exact);  // no memory yet: an exact round
    CodecState b(budget, 10);
    const std::vector<uint8_t> bytes = save(a);
    b.load(bytes.data(), bytes.size());
    CHECK(b.learning_rate() == 0.1);
  }

  // Format 2 (IntSGD's release): magic, version, count, step, r, lr, flags, checksum, floats.
  const size_t count = 8;
  std::vector<float> floats(count);
  for (size_t i = 0; i < count; ++i) floats[i] = 0.5f * static_cast<float>(i);
  auto format2 = [&](double r, double lr, bool has_r) {
    ByteWriter w;
    uint64_t rb, lb;
    std::memcpy(&rb, &r, 8), std::memcpy(&lb, &lr, 8);
    w.put<uint32_t>(0x54534351), w.put<uint32_t>(2), w.put<uint64_t>(count), w.put<uint64_t>(9);
    w.put<uint64_t>(rb), w.put<uint64_t>(lb), w.put<uint64_t>(has_r ? 1 : 0);
    const uint64_t scalars = fnv(w.bytes().data() + 8, w.bytes().size() - 8);
    w.put<uint64_t>(fnv(floats.data(), count * 4, scalars));
    const auto* f = reinterpret_cast<const uint8_t*>(floats.data());
    w.bytes().insert(w.bytes().end(), f, f + count * 4);
    return w.bytes();
  };
  {
    // Restored before any call: the method that binds first takes it (here IntSGD: r and lr).
    CodecState s(budget, count);
    const std::vector<uint8_t> bytes = format2(2.5, 0.01, true);
    s.load(bytes.data(), bytes.size());
    CHECK(s.step() == 9);
    CHECK(s.learning_rate() == 0.01);
    auto call = begin(s, int8, args);
    auto* intsgd = static_cast<coll::IntsgdCall*>(call.get());
    intsgd->prepare(args);
    CHECK_FALSE(intsgd->round().exact);  // r came back: alpha from it, as Proposition 2 says
    CHECK(intsgd->round().alpha == static_cast<float>(kernels::intsgd_alpha(count, 4, 2.5, 0.01, int8.eps)));
  }
  {
    // ...or the residual of error feedback.
    CodecState s(budget, count);
    const std::vector<uint8_t> bytes = format2(0, 0, false);
    s.load(bytes.data(), bytes.size());
    auto call = begin(s, kernels::parse_codec_spec("q8:ef=on"), args);
    const float* residual = static_cast<coll::QuantizedCall*>(call.get())->residual;
    for (size_t i = 0; i < count; ++i) REQUIRE(residual[i] == floats[i]);
  }
  {
    // Format 1 (the first release): magic, version, count, step, checksum of the floats, floats.
    ByteWriter w;
    w.put<uint32_t>(0x54534351), w.put<uint32_t>(1), w.put<uint64_t>(count), w.put<uint64_t>(4);
    w.put<uint64_t>(fnv(floats.data(), count * 4));
    const auto* f = reinterpret_cast<const uint8_t*>(floats.data());
    w.bytes().insert(w.bytes().end(), f, f + count * 4);
    CodecState s(budget, count);
    auto call = begin(s, kernels::parse_codec_spec("q8:ef=on"), args);  // bound first, restored after
    s.load(w.bytes().data(), w.bytes().size());
    CHECK(s.step() == 4);
    const float* residual = static_cast<coll::QuantizedCall*>(call.get())->residual;
    for (size_t i = 0; i < count; ++i) REQUIRE(residual[i] == floats[i]);
    // A flipped bit in the values fails the checksum and leaves the state as it was.
    w.bytes().back() ^= 1;
    CHECK(code_of([&] { s.load(w.bytes().data(), w.bytes().size()); }) == qcclInvalidArgument);
    CHECK(s.step() == 4);
  }
}

TEST_CASE("codec state: one method per state; corrupt, foreign and mismatched checkpoints change nothing",
          "[codec_state]") {
  auto budget = std::make_shared<StateBudget>(1 << 20);
  coll::CollArgs args;
  CodecState marsit(budget, 32);
  begin(marsit, kernels::parse_codec_spec("sign:eta_s=1"), args);
  CHECK(code_of([&] {
          marsit.bind(method_of(kernels::parse_codec_spec("q8:ef=on")), kernels::parse_codec_spec("q8:ef=on"));
        }) == qcclInvalidUsage);

  CodecState quantized(budget, 32);
  auto call = begin(quantized, kernels::parse_codec_spec("q8:ef=on"), args);
  static_cast<coll::QuantizedCall*>(call.get())->residual[3] = 7.0f;
  std::vector<uint8_t> bytes = save(quantized);
  const std::vector<uint8_t> marsit_bytes = save(marsit);
  // Another method's checkpoint, another count, a flipped bit, a truncated buffer, another magic.
  CHECK(code_of([&] { quantized.load(marsit_bytes.data(), marsit_bytes.size()); }) == qcclInvalidArgument);
  CodecState other_count(budget, 33);
  CHECK(code_of([&] { other_count.load(bytes.data(), bytes.size()); }) == qcclInvalidArgument);
  std::vector<uint8_t> flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  CHECK(code_of([&] { quantized.load(flipped.data(), flipped.size()); }) == qcclInvalidArgument);
  CHECK(code_of([&] { quantized.load(bytes.data(), bytes.size() - 9); }) == qcclInvalidArgument);
  std::vector<uint8_t> foreign = bytes;
  foreign[0] = 'X';
  CHECK(code_of([&] { quantized.load(foreign.data(), foreign.size()); }) == qcclInvalidArgument);
  CHECK(static_cast<coll::QuantizedCall*>(call.get())->residual[3] == 7.0f);
  CHECK(save(quantized) == bytes);
}

TEST_CASE(
    "codec state budgets: charged when a method's state is made, released when it goes; a store's sits "
    "inside its communicator's",
    "[codec_state]") {
  auto comm_budget = std::make_shared<StateBudget>(10000);
  coll::CollArgs args;
  const kernels::CodecConfig ef = kernels::parse_codec_spec("q8:ef=on");
  {
    CodecStore store(comm_budget, 3000);
    auto a = store.get(1, 500);  // 2000 bytes once used
    begin(*a, ef, args);
    CHECK(store.budget()->used() == 2000);
    CHECK(comm_budget->used() == 2000);
    auto b = store.get(2, 500);
    CHECK(code_of([&] { begin(*b, ef, args); }) == qcclInvalidUsage);  // past the store's 3000
    CHECK(comm_budget->used() == 2000);                                // nothing kept of the refusal
    CHECK(store.get(1, 500) == a);
    CHECK(code_of([&] { store.get(1, 501); }) == qcclInvalidArgument);
    CHECK(store.erase(1));
    CHECK_FALSE(store.erase(1));
    CHECK(store.find(1) == nullptr);
    a.reset();  // the last reference: its memory is released
    CHECK(comm_budget->used() == 0);
    begin(*b, ef, args);
    CHECK(comm_budget->used() == 2000);
  }
  CHECK(comm_budget->used() == 0);
  // The communicator's budget bounds a store with none of its own.
  CodecStore unbounded(comm_budget, 0);
  auto big = unbounded.get(7, 3000);
  CHECK(code_of([&] { begin(*big, ef, args); }) == qcclInvalidUsage);
}

TEST_CASE("codec state budgets: charged before the state is made, so a state past it is never allocated",
          "[codec_state]") {
  // 2^40 values: 4 TiB of residual, or of Marsit's compensation, which no allocation here could
  // hold: a budget charged after making the state would fail with std::bad_alloc, not the budget.
  auto budget = std::make_shared<StateBudget>(1 << 20);
  coll::CollArgs args;
  for (const char* spec : {"q8:ef=on", "fft:ef=on", "sign:eta_s=0.01"}) {
    CAPTURE(spec);
    const kernels::CodecConfig codec = kernels::parse_codec_spec(spec);
    CodecState huge(budget, size_t{1} << 40);
    CHECK(code_of([&] { begin(huge, codec, args); }) == qcclInvalidUsage);
    CHECK(budget->used() == 0);
    CodecState fits(budget, 1000);  // the charge is the state's bytes()
    begin(fits, codec, args);
    CHECK(budget->used() == method_of(codec).state_bytes(1000, &codec));
    CHECK(budget->used() >= 4000);
  }
  CHECK(budget->used() == 0);
  // A count whose bytes do not fit a size_t is the count's fault.
  CodecState impossible(budget, size_t{1} << 62);
  CHECK(code_of([&] { begin(impossible, kernels::parse_codec_spec("q8:ef=on"), args); }) == qcclInvalidArgument);
  // A store's checkpoint naming a count past the budget is refused before anything is allocated.
  CodecState small(budget, 16);
  begin(small, kernels::parse_codec_spec("q8:ef=on"), args);
  std::vector<uint8_t> entry = save(small);
  const uint64_t count = uint64_t{1} << 40;
  std::memcpy(entry.data() + 8, &count, 8);
  const uint64_t sum = fnv(entry.data() + 8, entry.size() - 16);
  std::memcpy(entry.data() + entry.size() - 8, &sum, 8);
  ByteWriter w;
  w.put<uint32_t>(0x53534351), w.put<uint32_t>(1), w.put<uint64_t>(1);  // store magic, format, entries
  w.put<uint64_t>(5), w.put<uint64_t>(entry.size());
  w.bytes().insert(w.bytes().end(), entry.begin(), entry.end());
  w.put<uint64_t>(fnv(w.bytes().data() + 8, w.bytes().size() - 8));
  CodecStore store(budget, 0);
  CHECK(code_of([&] { store.load(w.bytes().data(), w.bytes().size()); }) == qcclInvalidUsage);
  CHECK(budget->used() == 64);
}

TEST_CASE("codec store: a checkpoint restores every key's state; a corrupt one changes nothing", "[codec_state]") {
  auto budget = std::make_shared<StateBudget>(1 << 20);
  coll::CollArgs args;
  CodecStore store(budget, 0);
  for (uint64_t key : {uint64_t{3}, uint64_t{1} << 40, uint64_t{17}}) {
    auto s = store.get(key, 16);
    auto call = begin(*s, kernels::parse_codec_spec("q8:ef=on"), args);
    for (int i = 0; i < 16; ++i) static_cast<coll::QuantizedCall*>(call.get())->residual[i] = float(key % 97) + i;
    for (uint64_t t = 0; t < key % 5; ++t) s->take_step();
  }
  std::vector<uint8_t> bytes(store.serialized_bytes());
  store.save(bytes.data(), bytes.size());

  CodecStore restored(budget, 0);
  restored.get(99, 4);  // replaced by the checkpoint's keys
  restored.load(bytes.data(), bytes.size());
  CHECK(restored.size() == 3);
  CHECK(restored.find(99) == nullptr);
  for (uint64_t key : {uint64_t{3}, uint64_t{1} << 40, uint64_t{17}}) {
    auto s = restored.find(key);
    REQUIRE(s != nullptr);
    CHECK(s->step() == key % 5);
    auto call = begin(*s, kernels::parse_codec_spec("q8:ef=on"), args);
    for (int i = 0; i < 16; ++i)
      REQUIRE(static_cast<coll::QuantizedCall*>(call.get())->residual[i] == float(key % 97) + i);
  }
  std::vector<uint8_t> again(restored.serialized_bytes());
  restored.save(again.data(), again.size());
  CHECK(again == bytes);

  bytes[bytes.size() - 20] ^= 1;
  CHECK(code_of([&] { restored.load(bytes.data(), bytes.size()); }) == qcclInvalidArgument);
  CHECK(restored.size() == 3);
}

TEST_CASE("codec store: an entry that claims more values than can exist is refused, not allocated", "[codec_state]") {
  // A store's entry names its own count; 2^62 values would wrap count * 4 to 0 bytes of floats
  // (format 1) and cannot be allocated (format 3): both are the checkpoint's fault.
  auto budget = std::make_shared<StateBudget>(1 << 20);
  const uint64_t huge = uint64_t{1} << 62;
  auto store_of = [](const std::vector<uint8_t>& entry) {
    ByteWriter w;
    w.put<uint32_t>(0x53534351), w.put<uint32_t>(1), w.put<uint64_t>(1);  // store magic, format, entries
    w.put<uint64_t>(5), w.put<uint64_t>(entry.size());
    w.bytes().insert(w.bytes().end(), entry.begin(), entry.end());
    w.put<uint64_t>(fnv(w.bytes().data() + 8, w.bytes().size() - 8));
    return w.bytes();
  };
  CodecStore store(budget, 0);
  {
    ByteWriter w;  // format 1 with no floats: the checksum of zero bytes
    w.put<uint32_t>(0x54534351), w.put<uint32_t>(1), w.put<uint64_t>(huge), w.put<uint64_t>(0);
    w.put<uint64_t>(fnv(nullptr, 0));
    const std::vector<uint8_t> bytes = store_of(w.bytes());
    CHECK(code_of([&] { store.load(bytes.data(), bytes.size()); }) == qcclInvalidArgument);
  }
  {
    // A real format-3 state whose count is rewritten (and its checksum with it).
    CodecState small(budget, 16);
    coll::CollArgs args;
    begin(small, kernels::parse_codec_spec("q8:ef=on"), args);
    std::vector<uint8_t> entry = save(small);
    std::memcpy(entry.data() + 8, &huge, 8);
    const uint64_t sum = fnv(entry.data() + 8, entry.size() - 16);
    std::memcpy(entry.data() + entry.size() - 8, &sum, 8);
    const std::vector<uint8_t> bytes = store_of(entry);
    CHECK(code_of([&] { store.load(bytes.data(), bytes.size()); }) == qcclInvalidArgument);
  }
  CHECK(store.size() == 0);
  CHECK(budget->used() == 0);
}

}  // namespace qccl::test
