// The CUDA launchers (kernels/codec_cuda.h) against the host launchers (codec.h, convert.h,
// reduce.h), bit for bit: every codec (AQ-SGD's aq and QSDP's learned levels too), odd counts, partial buckets, NaN/Inf/±0
// buckets, several Philox keys and offsets, aligned and misaligned buffers; every reduction type and operator.
//
// Without a usable CUDA device the program exits 77 before the first test runs (CTest: skipped; see
// tests/common/require_cuda_device.h).
// First, before anything includes Catch: it enables Catch's listener interface.
#include "tests/common/require_cuda_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/aq_delta.h"
#include "kernels/codec.h"
#include "kernels/codec_cuda.h"
#include "kernels/convert.h"
#include "kernels/feedback.h"
#include "kernels/fft_cuda.h"
#include "kernels/fft_sparse.h"
#include "kernels/intsgd.h"
#include "kernels/marsit.h"
#include "kernels/reduce.h"
#include "kernels/sign.h"

namespace qccl::kernels {
namespace {

void ok(cudaError_t e) {
  INFO(cudaGetErrorName(e) << ": " << cudaGetErrorString(e));
  REQUIRE(e == cudaSuccess);
}

// Raw device memory, freed on scope exit.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) { ok(cudaMalloc(&p_, bytes ? bytes : 1)); }
  ~DeviceBytes() { cudaFree(p_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(p_); }

 private:
  void* p_ = nullptr;
};

class Stream {
 public:
  Stream() { ok(cudaStreamCreate(&s_)); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// "" where host and device agree, else where and how they first differ: in bits, or, with
// nan_equal, as NaN against a number.
std::string first_difference(const float* host, const float* dev, size_t n, bool nan_equal) {
  for (size_t i = 0; i < n; ++i) {
    if (nan_equal && std::isnan(host[i]) && std::isnan(dev[i])) continue;
    if (bits_of(host[i]) != bits_of(dev[i])) {
      char text[160];
      std::snprintf(text, sizeof text, "float %zu: host %a (0x%08x), device %a (0x%08x)", i, host[i],
                    bits_of(host[i]), dev[i], bits_of(dev[i]));
      return text;
    }
  }
  return "";
}

std::string first_difference(const uint8_t* host, const uint8_t* dev, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (host[i] != dev[i]) {
      char text[96];
      std::snprintf(text, sizeof text, "byte %zu: host 0x%02x, device 0x%02x", i, host[i], dev[i]);
      return text;
    }
  }
  return "";
}

enum class Pattern { kNormal, kSpecial, kZeros };
const char* pattern_name(Pattern p) {
  return p == Pattern::kNormal ? "normal" : p == Pattern::kSpecial ? "special" : "zeros";
}

// Inputs: normal values at scales that change every 64 values; or the same with NaN, ±Inf, an
// all-equal run, ±0 runs in both orders, subnormals, values beyond float16's range and a range that
// overflows float32; or mostly signed zeros, where which of -0 and +0 becomes a bucket's min or max
// shows in the meta's bits.
std::vector<float> make_input(size_t n, Pattern pattern, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const float scale = std::ldexp(1.0f, static_cast<int>((i / 64) % 21) - 10);
    x[i] = pattern == Pattern::kZeros ? (rng() & 1 ? -0.0f : 0.0f) : normal(rng) * scale;
    if (pattern == Pattern::kZeros && rng() % 16 == 0) x[i] = normal(rng) * 1e-3f;
  }
  if (pattern != Pattern::kSpecial) return x;
  auto put = [&](size_t i, float v) {
    if (i < n) x[i] = v;
  };
  put(5, NAN);
  put(30, INFINITY);
  for (size_t i = 40; i < 48; ++i) put(i, 3.25f);                 // an all-equal group
  for (size_t i = 48; i < 64; ++i) put(i, i % 2 ? 0.0f : -0.0f);  // -0 first
  for (size_t i = 64; i < 72; ++i) put(i, i % 2 ? -0.0f : 0.0f);  // +0 first
  put(600, -INFINITY);
  put(700, float_of(0x7FC00123u));  // a NaN with a payload
  for (size_t i = 800; i < 808; ++i) put(i, float_of(0x00000001u + static_cast<uint32_t>(i)));  // subnormals
  put(900, 70000.0f);   // float16: Inf
  put(901, -65520.0f);  // float16: -Inf (the tie with 2^16)
  put(902, 65504.0f);
  put(903, 1e-8f);      // float16: rounds to a subnormal or zero
  put(1000, 3e38f);     // a finite bucket whose range overflows float32: sent as non-finite
  put(1001, -3e38f);
  return x;
}

struct KeyCase {
  PhiloxKey key;
  uint64_t first;
  bool misaligned;  // buffers just past cudaMalloc's 256-byte alignment
};

const KeyCase kKeys[] = {
    {PhiloxKey{0, 0, 0, 0}, 0, false},
    {PhiloxKey{7, 3, 1, 2}, 3, true},
    {PhiloxKey{~0ull, 1ull << 40, 5, 1}, (1ull << 33) + 5, false},
};

std::vector<std::string> all_specs() {
  std::vector<std::string> specs = {"none", "fp16", "bf16"};
  for (int bits = 1; bits <= 8; ++bits)
    for (const char* round : {"nearest", "stochastic", "shift"})
      for (int bucket : {8, 24, 512})
        specs.push_back("q" + std::to_string(bits) + ":bucket=" + std::to_string(bucket) + ",round=" + round +
                        ",seed=11");
  for (const char* spec : {"int8:seed=11", "int16:alpha=3.5,seed=11", "int32:alpha=1000,round=nearest"})
    specs.push_back(spec);
  for (const char* spec : {"aq2:channels=7", "aq3:channels=64,rows=3,round=stochastic,seed=11", "aq4", "aq5:channels=13",
                           "aq8:channels=5,rows=1,round=stochastic", "aq6:channels=100,rows=2"})
    specs.push_back(spec);
  // Learned levels (levels.h): uneven tables of 4, 8 and 256 levels, every rounding.
  for (const char* round : {"nearest", "stochastic", "shift"}) {
    specs.push_back(std::string("q2:bucket=64,levels=0/0.125/0.6/1,seed=11,round=") + round);
    specs.push_back(std::string("q3:bucket=24,levels=0/0.01/0.05/0.2/0.5/0.7/0.95/1,seed=11,round=") + round);
    std::string q8 = std::string("q8:bucket=512,seed=11,round=") + round + ",levels=0";
    for (int k = 1; k < 255; ++k) q8 += "/" + std::to_string(std::pow(k / 255.0, 1.5));
    specs.push_back(q8 + "/1");
  }
  return specs;
}

TEST_CASE("encode_cuda, decode_cuda and decode_accumulate_cuda match the host launchers bit for bit",
          "[codec][cuda]") {
  const size_t counts[] = {1, 7, 8, 9, 23, 25, 511, 513, 1000, 4099, 70001};
  constexpr size_t kMaxCount = 70001;
  constexpr size_t kPad = 64;  // sentinel bytes past every output
  const Stream stream;
  const DeviceBytes d_in(kMaxCount * 4 + 256), d_enc(kMaxCount * 4 + 256 + kPad),
      d_out(kMaxCount * 4 + 256 + kPad), d_count(sizeof(unsigned long long));
  auto* counter = reinterpret_cast<unsigned long long*>(d_count.get());
  size_t runs = 0;
  for (const std::string& spec : all_specs()) {
    const CodecConfig codec = parse_codec_spec(spec);
    for (Pattern pattern : {Pattern::kNormal, Pattern::kSpecial, Pattern::kZeros}) {
      for (size_t count : counts) {
        const std::vector<float> x = make_input(count, pattern, count * 3 + static_cast<int>(pattern));
        std::vector<float> acc0 = make_input(count, Pattern::kNormal, count + 99);
        if (count > 3) acc0[3] = NAN, acc0[2] = -0.0f;
        const size_t bytes = codec.encoded_bytes(count);
        for (const KeyCase& kc : kKeys) {
          INFO(spec << ", " << pattern_name(pattern) << ", count " << count << ", first " << kc.first
                    << (kc.misaligned ? ", misaligned" : ""));
          ++runs;
          // Misaligned: floats off 16 bytes, a q codec's bytes off any boundary, 16-bit codes off 4.
          const size_t enc_offset = codec.kind == CodecKind::kQuant  ? 1
                                    : codec.kind == CodecKind::kNone ? 4
                                    : codec.kind == CodecKind::kInt  ? static_cast<size_t>(codec.bits / 8)
                                                                     : 2;
          float* in = reinterpret_cast<float*>(d_in.get()) + (kc.misaligned ? 1 : 0);
          uint8_t* enc = d_enc.get() + (kc.misaligned ? enc_offset : 0);
          float* out = reinterpret_cast<float*>(d_out.get() + (kc.misaligned ? 4 : 0));
          const cudaStream_t s = stream.get();

          // Encode on both sides.
          std::vector<uint8_t> host_enc(bytes + kPad, 0xA5), dev_enc(bytes + kPad);
          const EncodeReport host_report = encode(codec, x.data(), count, host_enc.data(), kc.key, kc.first);
          ok(cudaMemcpyAsync(in, x.data(), count * 4, cudaMemcpyHostToDevice, s));
          ok(cudaMemsetAsync(enc, 0xA5, bytes + kPad, s));
          ok(cudaMemsetAsync(counter, 0, sizeof *counter, s));
          ok(encode_cuda(codec, in, count, enc, kc.key, kc.first, counter, s));
          unsigned long long dev_nonfinite = 0;
          ok(cudaMemcpyAsync(dev_enc.data(), enc, bytes + kPad, cudaMemcpyDeviceToHost, s));
          ok(cudaMemcpyAsync(&dev_nonfinite, counter, sizeof dev_nonfinite, cudaMemcpyDeviceToHost, s));
          ok(cudaStreamSynchronize(s));
          REQUIRE(first_difference(host_enc.data(), dev_enc.data(), bytes + kPad) == "");
          REQUIRE(dev_nonfinite == host_report.nonfinite);

          // Decode the same bytes on both sides.
          std::vector<float> host_dec(count + kPad / 4, 1.5f), dev_dec(count + kPad / 4);
          const size_t host_bad = decode(codec, host_enc.data(), count, host_dec.data());
          ok(cudaMemcpyAsync(out, host_dec.data(), (count + kPad / 4) * 4, cudaMemcpyHostToDevice, s));
          ok(cudaMemsetAsync(out, 0, count * 4, s));
          ok(cudaMemsetAsync(counter, 0, sizeof *counter, s));
          ok(decode_cuda(codec, enc, count, out, counter, s));
          ok(cudaMemcpyAsync(dev_dec.data(), out, (count + kPad / 4) * 4, cudaMemcpyDeviceToHost, s));
          ok(cudaMemcpyAsync(&dev_nonfinite, counter, sizeof dev_nonfinite, cudaMemcpyDeviceToHost, s));
          ok(cudaStreamSynchronize(s));
          REQUIRE(first_difference(host_dec.data(), dev_dec.data(), count + kPad / 4, false) == "");
          REQUIRE(dev_nonfinite == host_bad);

          // Decode-accumulate: the same bits, except that a NaN sum may carry another payload.
          std::vector<float> host_acc = acc0, dev_acc(count);
          const size_t host_acc_bad = decode_accumulate(codec, host_enc.data(), count, host_acc.data());
          ok(cudaMemcpyAsync(out, acc0.data(), count * 4, cudaMemcpyHostToDevice, s));
          ok(cudaMemsetAsync(counter, 0, sizeof *counter, s));
          ok(decode_accumulate_cuda(codec, enc, count, out, counter, s));
          ok(cudaMemcpyAsync(dev_acc.data(), out, count * 4, cudaMemcpyDeviceToHost, s));
          ok(cudaMemcpyAsync(&dev_nonfinite, counter, sizeof dev_nonfinite, cudaMemcpyDeviceToHost, s));
          ok(cudaStreamSynchronize(s));
          REQUIRE(first_difference(host_acc.data(), dev_acc.data(), count, true) == "");
          REQUIRE(dev_nonfinite == host_acc_bad);
        }
      }
    }
  }
  CHECK(runs == all_specs().size() * 3 * std::size(counts) * std::size(kKeys));
}

TEST_CASE("the nonfinite counter adds across launches and may be null", "[codec][cuda]") {
  const CodecConfig codec = parse_codec_spec("q4:bucket=8");
  std::vector<float> x(64, 1.0f);
  x[3] = NAN, x[20] = INFINITY;  // two buckets of eight
  const DeviceBytes d_in(64 * 4), d_enc(codec.encoded_bytes(64)), d_count(8);
  auto* counter = reinterpret_cast<unsigned long long*>(d_count.get());
  auto* in = reinterpret_cast<float*>(d_in.get());
  ok(cudaMemcpy(in, x.data(), 64 * 4, cudaMemcpyHostToDevice));
  ok(cudaMemset(counter, 0, 8));
  ok(encode_cuda(codec, in, 64, d_enc.get(), PhiloxKey{}, 0, counter, nullptr));
  ok(encode_cuda(codec, in, 64, d_enc.get(), PhiloxKey{}, 0, counter, nullptr));
  ok(encode_cuda(codec, in, 64, d_enc.get(), PhiloxKey{}, 0, nullptr, nullptr));
  unsigned long long n = 0;
  ok(cudaMemcpy(&n, counter, 8, cudaMemcpyDeviceToHost));
  CHECK(n == 4);
  ok(decode_cuda(codec, d_enc.get(), 64, in, counter, nullptr));
  ok(cudaMemcpy(&n, counter, 8, cudaMemcpyDeviceToHost));
  CHECK(n == 4 + 16);
}

TEST_CASE("invalid arguments enqueue nothing and say cudaErrorInvalidValue", "[codec][cuda]") {
  const DeviceBytes d(4096);
  auto* f = reinterpret_cast<float*>(d.get());
  CodecConfig q = parse_codec_spec("q4");
  CHECK(encode_cuda(q, nullptr, 8, d.get(), PhiloxKey{}, 0, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(decode_cuda(q, d.get(), 8, nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(encode_cuda(q, nullptr, 0, nullptr, PhiloxKey{}, 0, nullptr, nullptr) == cudaSuccess);  // nothing to do
  q.bits = 9;
  CHECK(encode_cuda(q, f, 8, d.get(), PhiloxKey{}, 0, nullptr, nullptr) == cudaErrorInvalidValue);
  q.bits = 4, q.bucket = 12;
  CHECK(decode_accumulate_cuda(q, d.get(), 8, f, nullptr, nullptr) == cudaErrorInvalidValue);
  q.bucket = 8, q.levels = {0.0f, 0.5f, 1.0f};  // q4 takes 16 levels
  CHECK(encode_cuda(q, f, 8, d.get(), PhiloxKey{}, 0, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(load_float_cuda(DataType::kInt32, d.get(), f, 8, nullptr) == cudaErrorInvalidValue);
  CHECK(store_float_cuda(DataType::kFloat64, f, d.get(), 8, nullptr, nullptr) == cudaErrorInvalidValue);
  ok(cudaDeviceSynchronize());
}

// Host vectors copied to the device and back.
template <typename T>
struct Mirrored {
  std::vector<T> host;
  DeviceBytes device;
  explicit Mirrored(std::vector<T> values) : host(std::move(values)), device(host.size() * sizeof(T)) {
    ok(cudaMemcpy(device.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  T* dev() const { return reinterpret_cast<T*>(device.get()); }
  std::vector<T> fetch() const {
    std::vector<T> out(host.size());
    ok(cudaMemcpy(out.data(), device.get(), host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

TEST_CASE("Marsit's sign launchers match marsit.h bit for bit, the lazy compensation included", "[sign][cuda]") {
  for (size_t n : {size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{1000}, size_t{100003}}) {
    INFO("n " << n);
    // The run is values 32 .. 32 + n - 1 of a tensor whose compensation has a round pending.
    const size_t first = 32, total = first + n, words = sign_words(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> normal;
    std::vector<float> u(n), stored(total), eta(sign_words(total));
    std::vector<uint32_t> pending(sign_words(total)), incoming(words);
    for (float& v : u) v = normal(rng);
    for (float& v : stored) v = 0.3f * normal(rng);
    for (size_t w = 0; w < pending.size(); ++w) pending[w] = rng(), eta[w] = w % 3 ? 0.0625f : 0.0f;
    for (uint32_t& w : incoming) w = rng();
    u[0] = -0.0f;
    if (n > 7) u[7] = NAN;
    const Mirrored<float> d_u{u}, d_stored{stored}, d_eta{eta};
    const Mirrored<float> d_backup{std::vector<float>(n)}, d_g{std::vector<float>(n)};
    const Mirrored<uint32_t> d_pending{pending}, d_words{std::vector<uint32_t>(words)}, d_incoming{incoming};
    const Mirrored<unsigned long long> d_count{std::vector<unsigned long long>(1, 0)};
    const Compensation host{stored.data(), pending.data(), eta.data()};
    const Compensation dev{d_stored.dev(), d_pending.dev(), d_eta.dev()};

    std::vector<uint32_t> s(words), merged(words);
    std::vector<float> backup(n);
    const size_t nonfinite = pack_signs(u.data(), &host, first, n, s.data(), backup.data());
    ok(pack_signs_cuda(d_u.dev(), dev, first, n, d_words.dev(), d_backup.dev(), d_count.dev(), nullptr));
    CHECK(d_words.fetch() == s);
    CHECK(d_count.fetch()[0] == nonfinite);
    CHECK(first_difference(stored.data(), d_stored.fetch().data(), total, true) == "");  // w: NaN at 7
    CHECK(first_difference(backup.data(), d_backup.fetch().data(), n, false) == "");

    const PhiloxKey key{3, 17, 5, 1u << 10 | 2};
    merge_signs(incoming.data(), s.data(), merged.data(), words, 5, key, 1234);
    ok(merge_signs_cuda(d_incoming.dev(), d_words.dev(), d_incoming.dev(), words, 5, key, 1234, nullptr));  // in place
    CHECK(d_incoming.fetch() == merged);

    std::vector<float> g(n);
    decode_signs(merged.data(), n, 0.125f, g.data(), &host, first);
    ok(decode_signs_cuda(d_incoming.dev(), n, 0.125f, d_g.dev(), dev, first, nullptr));
    CHECK(first_difference(g.data(), d_g.fetch().data(), n, false) == "");
    CHECK(d_pending.fetch() == pending);
    CHECK(d_eta.fetch() == eta);
    CHECK(pack_signs_cuda(d_u.dev(), dev, 5, n, d_words.dev(), nullptr, nullptr, nullptr) == cudaErrorInvalidValue);

    // Inside a collective: a clean fragment's checked decode is the decode; a tainted one (the host's
    // flag, or the device's word) gives the host's NaN, c's values back from the backup, counted.
    const Mirrored<unsigned long long> d_taint{std::vector<unsigned long long>(2, 0)};  // taint word, count
    ok(decode_signs_checked_cuda(d_incoming.dev(), n, 0.125f, d_g.dev(), dev, first, d_backup.dev(), d_taint.dev(),
                                 false, d_taint.dev() + 1, nullptr));
    CHECK(first_difference(g.data(), d_g.fetch().data(), n, false) == "");
    CHECK(d_pending.fetch() == pending);
    CHECK(d_taint.fetch()[1] == 0);
    std::vector<float> restored = stored;
    std::copy(backup.begin(), backup.end(), restored.begin() + static_cast<std::ptrdiff_t>(first));
    const std::vector<float> nans(n, std::numeric_limits<float>::quiet_NaN());
    for (bool by_flag : {true, false}) {
      if (!by_flag) ok(add_counter_cuda(d_taint.dev(), d_count.dev(), nullptr));  // the pack's NaN count, not 0
      ok(decode_signs_checked_cuda(d_incoming.dev(), n, 0.125f, d_g.dev(), dev, first, d_backup.dev(), d_taint.dev(),
                                   by_flag, d_taint.dev() + 1, nullptr));
      if (n <= 7) continue;  // no NaN in u: nothing taints the word
      CHECK(std::memcmp(d_g.fetch().data(), nans.data(), n * sizeof(float)) == 0);
      CHECK(first_difference(restored.data(), d_stored.fetch().data(), total, true) == "");
    }
    CHECK(d_taint.fetch()[1] == (n > 7 ? 2 * n : n));
    ok(cudaMemcpy(d_stored.dev(), stored.data(), total * sizeof(float), cudaMemcpyHostToDevice));  // as the pack left it

    // The full-precision round's helpers, from a first value inside a word.
    std::vector<float> w(n);
    add_compensation(u.data(), host, 3, n, w.data());
    ok(add_compensation_cuda(d_u.dev(), dev, 3, n, d_g.dev(), nullptr));
    CHECK(first_difference(w.data(), d_g.fetch().data(), n, true) == "");
    const size_t bad = reset_compensation(w.data(), host, 3, n);
    ok(cudaMemset(d_count.dev(), 0, sizeof(unsigned long long)));
    ok(reset_compensation_cuda(d_g.dev(), dev, 3, n, d_count.dev(), nullptr));
    CHECK(d_count.fetch()[0] == bad);
    CHECK(first_difference(stored.data(), d_stored.fetch().data(), total, true) == "");
  }
}

TEST_CASE("IntSGD's launchers match intsgd.h bit for bit, clips and non-finite counts included", "[intsgd][cuda]") {
  for (int bits : {8, 16, 32}) {
    for (size_t n : {size_t{1}, size_t{255}, size_t{4099}, size_t{100003}}) {
      INFO("int" << bits << " n " << n);
      std::mt19937 rng(static_cast<uint32_t>(n + bits));
      std::normal_distribution<float> normal(0.0f, 40.0f);
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      if (n > 9) x[3] = NAN, x[5] = INFINITY, x[9] = 3e38f;
      const size_t wb = static_cast<size_t>(bits / 8);
      const IntClip clip = int_clip(bits, 5);
      const PhiloxKey key{7, 2, 3, 0};
      const DeviceBytes d_x(n * 4), d_m(n * wb), d_acc(n * wb), d_out(n * 4), d_count(16);
      auto* counters = reinterpret_cast<unsigned long long*>(d_count.get());
      ok(cudaMemcpy(d_x.get(), x.data(), n * 4, cudaMemcpyHostToDevice));
      ok(cudaMemset(counters, 0, 16));
      for (bool stochastic : {true, false}) {
        std::vector<uint8_t> m(n * wb), dev(n * wb);
        const IntEncodeReport report = int_encode(bits, x.data(), n, 1.7f, stochastic, clip, key, 77, m.data());
        ok(cudaMemset(counters, 0, 16));
        ok(int_encode_cuda(bits, reinterpret_cast<const float*>(d_x.get()), n, 1.7f, stochastic, clip, key, 77,
                           d_m.get(), counters, counters + 1, nullptr));
        ok(cudaMemcpy(dev.data(), d_m.get(), n * wb, cudaMemcpyDeviceToHost));
        unsigned long long counts[2] = {};
        ok(cudaMemcpy(counts, counters, 16, cudaMemcpyDeviceToHost));
        CHECK(dev == m);
        CHECK(counts[0] == report.clipped);
        CHECK(counts[1] == report.nonfinite);
        // Wrapping adds, then the decode of the sums.
        std::vector<uint8_t> acc(n * wb);
        for (auto& b : acc) b = static_cast<uint8_t>(rng());
        ok(cudaMemcpy(d_acc.get(), acc.data(), n * wb, cudaMemcpyHostToDevice));
        int_add(bits, m.data(), acc.data(), n);
        ok(int_add_cuda(bits, d_m.get(), d_acc.get(), n, nullptr));
        ok(cudaMemcpy(dev.data(), d_acc.get(), n * wb, cudaMemcpyDeviceToHost));
        CHECK(dev == acc);
        std::vector<float> out(n), out_dev(n);
        int_decode(bits, acc.data(), n, 1.0 / (5 * 1.7), out.data());
        ok(int_decode_cuda(bits, d_acc.get(), n, 1.0 / (5 * 1.7), reinterpret_cast<float*>(d_out.get()), nullptr));
        ok(cudaMemcpy(out_dev.data(), d_out.get(), n * 4, cudaMemcpyDeviceToHost));
        CHECK(first_difference(out.data(), out_dev.data(), n, false) == "");
        // Inside a collective: the same values and the exact integer sums (random int32 sums carry into
        // the high word), twice into the same counters; then a tainted fragment (by the host's flag or
        // by the device's word, which add_counter_cuda gathered) decodes to the host's NaN, counted.
        IntSums sums;
        int_accumulate_sums(bits, acc.data(), n, &sums);
        int_accumulate_sums(bits, acc.data(), n, &sums);
        const DeviceBytes d_sums(8 * 8);
        auto* s = reinterpret_cast<unsigned long long*>(d_sums.get());  // squares lo, hi, max, nonfinite, taint, add
        ok(cudaMemset(s, 0, 8 * 8));
        for (int twice = 0; twice < 2; ++twice)
          ok(int_decode_sums_cuda(bits, d_acc.get(), n, 1.0 / (5 * 1.7), reinterpret_cast<float*>(d_out.get()), s + 4,
                                  false, s, s + 2, s + 3, nullptr));
        unsigned long long got[6] = {};
        ok(cudaMemcpy(got, s, sizeof got, cudaMemcpyDeviceToHost));
        ok(cudaMemcpy(out_dev.data(), d_out.get(), n * 4, cudaMemcpyDeviceToHost));
        CHECK(first_difference(out.data(), out_dev.data(), n, false) == "");
        CHECK(got[0] == sums.squares_lo);
        CHECK(got[1] == sums.squares_hi);
        CHECK(got[2] == sums.max_abs);
        CHECK(got[3] == 0);
        const std::vector<float> nans(n, std::numeric_limits<float>::quiet_NaN());
        ok(int_decode_sums_cuda(bits, d_acc.get(), n, 1.0, reinterpret_cast<float*>(d_out.get()), nullptr, true, s,
                                s + 2, s + 3, nullptr));
        const unsigned long long one = 1;
        ok(cudaMemcpy(s + 5, &one, sizeof one, cudaMemcpyHostToDevice));
        ok(add_counter_cuda(s + 4, s + 5, nullptr));
        ok(int_decode_sums_cuda(bits, d_acc.get(), n, 1.0, reinterpret_cast<float*>(d_out.get()), s + 4, false, s,
                                s + 2, s + 3, nullptr));
        ok(cudaMemcpy(got, s, sizeof got, cudaMemcpyDeviceToHost));
        ok(cudaMemcpy(out_dev.data(), d_out.get(), n * 4, cudaMemcpyDeviceToHost));
        CHECK(std::memcmp(out_dev.data(), nans.data(), n * 4) == 0);
        CHECK(got[0] == sums.squares_lo);  // tainted fragments add no sums
        CHECK(got[3] == 2 * n);
        CHECK(got[4] == 1);
      }
    }
  }
}

// Random bit patterns: every class of float16/bfloat16/float32 value, NaNs with payloads included.
std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  return b;
}

TEST_CASE("the conversions match convert.h bit for bit", "[convert][cuda]") {
  const Stream stream;
  const cudaStream_t s = stream.get();
  for (DataType type : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
      INFO(data_type_name(type) << ", n " << n);
      const size_t esize = element_size(type);
      const std::vector<uint8_t> typed = random_bytes(n * esize, n + esize);
      std::mt19937 rng(static_cast<uint32_t>(n));
      std::vector<float> floats(n), acc0(n);
      for (size_t i = 0; i < n; ++i) {
        floats[i] = float_of(static_cast<uint32_t>(rng()));
        acc0[i] = static_cast<float>(i % 97) - 48.5f;
      }
      const DeviceBytes d_typed(n * esize), d_float(n * 4), d_acc(n * 4);
      ok(cudaMemcpyAsync(d_typed.get(), typed.data(), n * esize, cudaMemcpyHostToDevice, s));
      ok(cudaMemcpyAsync(d_float.get(), floats.data(), n * 4, cudaMemcpyHostToDevice, s));
      auto* df = reinterpret_cast<float*>(d_float.get());
      auto* da = reinterpret_cast<float*>(d_acc.get());
      std::vector<float> host(n), dev(n);

      load_float(type, typed.data(), host.data(), n);
      ok(load_float_cuda(type, d_typed.get(), da, n, s));
      ok(cudaMemcpyAsync(dev.data(), da, n * 4, cudaMemcpyDeviceToHost, s));
      ok(cudaStreamSynchronize(s));
      CHECK(first_difference(host.data(), dev.data(), n, false) == "");

      host = acc0;
      load_add_float(type, typed.data(), host.data(), n);
      ok(cudaMemcpyAsync(da, acc0.data(), n * 4, cudaMemcpyHostToDevice, s));
      ok(load_add_float_cuda(type, d_typed.get(), da, n, s));
      ok(cudaMemcpyAsync(dev.data(), da, n * 4, cudaMemcpyDeviceToHost, s));
      ok(cudaStreamSynchronize(s));
      CHECK(first_difference(host.data(), dev.data(), n, true) == "");

      std::vector<uint8_t> host_typed(n * esize), dev_typed(n * esize);
      store_float(type, floats.data(), host_typed.data(), n);
      const size_t host_stored_nonfinite = count_nonfinite(type, host_typed.data(), n);
      const DeviceBytes d_count(sizeof(unsigned long long));
      auto* counter = reinterpret_cast<unsigned long long*>(d_count.get());
      ok(cudaMemsetAsync(counter, 0, sizeof(unsigned long long), s));
      ok(store_float_cuda(type, df, d_typed.get(), n, counter, s));
      unsigned long long dev_stored_nonfinite = 0;
      ok(cudaMemcpyAsync(dev_typed.data(), d_typed.get(), n * esize, cudaMemcpyDeviceToHost, s));
      ok(cudaMemcpyAsync(&dev_stored_nonfinite, counter, sizeof dev_stored_nonfinite, cudaMemcpyDeviceToHost, s));
      ok(cudaStreamSynchronize(s));
      CHECK(first_difference(host_typed.data(), dev_typed.data(), n * esize) == "");
      CHECK(dev_stored_nonfinite == host_stored_nonfinite);
    }
  }
  for (size_t n : {size_t{1}, size_t{4099}}) {
    INFO("n " << n);
    std::mt19937 rng(static_cast<uint32_t>(n + 5));
    std::vector<float> x(n), acc0(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = float_of(static_cast<uint32_t>(rng()));
      acc0[i] = static_cast<float>(i) * 0.37f;
    }
    const DeviceBytes d_x(n * 4), d_acc(n * 4);
    auto* dx = reinterpret_cast<float*>(d_x.get());
    auto* da = reinterpret_cast<float*>(d_acc.get());
    std::vector<float> host = x, dev(n);
    for (float divisor : {3.0f, 8.0f}) {
      host = x;
      divide_float(host.data(), n, divisor);
      ok(cudaMemcpyAsync(dx, x.data(), n * 4, cudaMemcpyHostToDevice, s));
      ok(divide_float_cuda(dx, n, divisor, s));
      ok(cudaMemcpyAsync(dev.data(), dx, n * 4, cudaMemcpyDeviceToHost, s));
      ok(cudaStreamSynchronize(s));
      CHECK(first_difference(host.data(), dev.data(), n, true) == "");
    }
    host = acc0;
    add_float(x.data(), host.data(), n);
    ok(cudaMemcpyAsync(dx, x.data(), n * 4, cudaMemcpyHostToDevice, s));
    ok(cudaMemcpyAsync(da, acc0.data(), n * 4, cudaMemcpyHostToDevice, s));
    ok(add_float_cuda(dx, da, n, s));
    ok(cudaMemcpyAsync(dev.data(), da, n * 4, cudaMemcpyDeviceToHost, s));
    ok(cudaStreamSynchronize(s));
    CHECK(first_difference(host.data(), dev.data(), n, true) == "");
    // Error feedback's residual (the host executor's ErrorFeedback step shares feedback.h's rule),
    // against a reference written out here: 0.9 (acc - decoded), restarted at 0 where it is not
    // finite (x holds NaNs and infinities: random bits), so NaN is never expected.
    size_t restarted = 0;
    for (size_t i = 0; i < n; ++i) {
      const float miss = 0.9f * (x[i] - acc0[i]);
      host[i] = std::isfinite(miss) ? miss : 0.0f;
      restarted += !std::isfinite(miss);
      CHECK(feedback_miss(x[i], acc0[i], 0.9f) == host[i]);
    }
    if (n > 1000) CHECK(restarted > 0);  // the case is exercised
    ok(cudaMemcpyAsync(dx, x.data(), n * 4, cudaMemcpyHostToDevice, s));
    ok(cudaMemcpyAsync(da, acc0.data(), n * 4, cudaMemcpyHostToDevice, s));
    ok(feedback_residual_cuda(dx, da, n, 0.9f, s));
    ok(cudaMemcpyAsync(dev.data(), da, n * 4, cudaMemcpyDeviceToHost, s));
    ok(cudaStreamSynchronize(s));
    CHECK(first_difference(host.data(), dev.data(), n, false) == "");
  }
}

// Operands for the reductions: random bits (every class of value, NaNs with payloads, integer
// overflow), with some pairs made equal and, for the floating types, some signed-zero pairs.
void make_operands(DataType type, size_t n, uint64_t seed, std::vector<uint8_t>& a, std::vector<uint8_t>& b) {
  const size_t esize = element_size(type);
  a = random_bytes(n * esize, seed);
  b = random_bytes(n * esize, seed + 1);
  for (size_t i = 0; i < n; i += 5) std::memcpy(&b[i * esize], &a[i * esize], esize);  // a == b
  if (!is_floating(type)) return;
  for (size_t i = 1; i + 1 < n; i += 7) {  // (+0, -0) and (-0, +0): the sign bit is the top bit
    std::memset(&a[i * esize], 0, esize), std::memset(&b[i * esize], 0, esize);
    b[i * esize + esize - 1] = 0x80;
    std::memset(&a[(i + 1) * esize], 0, esize), std::memset(&b[(i + 1) * esize], 0, esize);
    a[(i + 1) * esize + esize - 1] = 0x80;
  }
}

TEST_CASE("reduce_cuda and finish_average_cuda match reduce.h bit for bit", "[reduce][cuda]") {
  const Stream stream;
  const cudaStream_t s = stream.get();
  constexpr size_t kMax = 40000;
  const DeviceBytes d_a(kMax * 8), d_b(kMax * 8), d_dst(kMax * 8);
  for (int t = 0; t < kNumDataTypes; ++t) {
    const auto type = static_cast<DataType>(t);
    const size_t esize = element_size(type);
    for (size_t n : {size_t{1}, size_t{31}, size_t{kMax}}) {
      std::vector<uint8_t> a, b;
      make_operands(type, n, n * 16 + t, a, b);
      ok(cudaMemcpyAsync(d_a.get(), a.data(), n * esize, cudaMemcpyHostToDevice, s));
      ok(cudaMemcpyAsync(d_b.get(), b.data(), n * esize, cudaMemcpyHostToDevice, s));
      for (int o = 0; o < kNumRedOps; ++o) {
        const auto op = static_cast<RedOp>(o);
        INFO(data_type_name(type) << " " << red_op_name(op) << ", n " << n);
        std::vector<uint8_t> host(n * esize), dev(n * esize), dev_swapped(n * esize);
        reduce(type, op, a.data(), b.data(), host.data(), n);
        ok(reduce_cuda(type, op, d_a.get(), d_b.get(), d_dst.get(), n, s));
        ok(cudaMemcpyAsync(dev.data(), d_dst.get(), n * esize, cudaMemcpyDeviceToHost, s));
        ok(reduce_cuda(type, op, d_b.get(), d_a.get(), d_dst.get(), n, s));  // symmetry
        ok(cudaMemcpyAsync(dev_swapped.data(), d_dst.get(), n * esize, cudaMemcpyDeviceToHost, s));
        ok(cudaStreamSynchronize(s));
        CHECK(first_difference(host.data(), dev.data(), n * esize) == "");
        CHECK(first_difference(host.data(), dev_swapped.data(), n * esize) == "");
      }
      // In place (dst == a), then the average's division.
      for (int nranks : {1, 3, 8, 300}) {
        INFO(data_type_name(type) << " finish_average, nranks " << nranks << ", n " << n);
        std::vector<uint8_t> host(n * esize), dev(n * esize);
        reduce(type, RedOp::kAvg, a.data(), b.data(), host.data(), n);
        finish_average(type, host.data(), n, nranks);
        ok(cudaMemcpyAsync(d_dst.get(), a.data(), n * esize, cudaMemcpyHostToDevice, s));
        ok(reduce_cuda(type, RedOp::kAvg, d_dst.get(), d_b.get(), d_dst.get(), n, s));
        ok(finish_average_cuda(type, d_dst.get(), n, nranks, s));
        ok(cudaMemcpyAsync(dev.data(), d_dst.get(), n * esize, cudaMemcpyDeviceToHost, s));
        ok(cudaStreamSynchronize(s));
        CHECK(first_difference(host.data(), dev.data(), n * esize) == "");
      }
    }
  }
  CHECK(reduce_cuda(static_cast<DataType>(kNumDataTypes), RedOp::kSum, d_a.get(), d_b.get(), d_dst.get(), 1, s) ==
        cudaErrorInvalidValue);
  CHECK(reduce_cuda(DataType::kFloat32, static_cast<RedOp>(kNumRedOps), d_a.get(), d_b.get(), d_dst.get(), 1, s) ==
        cudaErrorInvalidValue);
  CHECK(finish_average_cuda(DataType::kFloat32, d_a.get(), 1, 0, s) == cudaErrorInvalidValue);
}

}  // namespace
}  // namespace qccl::kernels

namespace qccl::kernels {

TEST_CASE("the fft codec's range floats: device codes and values are the host's, clamps counted (P10)",
          "[fft][cuda]") {
  std::mt19937 rng(21);
  std::uniform_real_distribution<double> exponent(-40, 4);
  for (int bits : {4, 10, 12, 16})
    for (int mant : {2, 4, 6})
      for (bool nearest : {false, true}) {
        if (mant > bits - 1 || range_float_invalid(bits, mant, 2.0f)) continue;
        INFO("bits=" << bits << " mant=" << mant << (nearest ? " nearest" : " trunc"));
        const RangeFloat r = make_range_float(bits, mant, 2.0f, nearest);
        // Every code, and values across the range, below it and beyond it, of both signs, ±0.
        const size_t codes = size_t{1} << bits;
        std::vector<uint32_t> code(codes);
        for (size_t c = 0; c < codes; ++c) code[c] = static_cast<uint32_t>(c);
        std::vector<float> x(50001);
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::exp2(exponent(rng))) * (i % 2 ? -1.0f : 1.0f);
        x[0] = 0.0f, x[1] = -0.0f, x[2] = 2.0f, x[3] = 1e30f;
        std::vector<uint32_t> host_codes(x.size()), dev_codes(x.size());
        unsigned long long host_clamped = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          bool c = false;
          host_codes[i] = range_float_encode(r, x[i], &c);
          host_clamped += c;
        }
        std::vector<float> host_values(codes), dev_values(codes);
        for (size_t c = 0; c < codes; ++c) host_values[c] = range_float_decode(r, code[c]);

        DeviceBytes din(x.size() * 4), dcodes(x.size() * 4), dcode(codes * 4), dvalues(codes * 4), dclamped(8);
        Stream s;
        ok(cudaMemcpy(din.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        ok(cudaMemcpy(dcode.get(), code.data(), codes * 4, cudaMemcpyHostToDevice));
        ok(cudaMemset(dclamped.get(), 0, 8));
        auto* clamped = reinterpret_cast<unsigned long long*>(dclamped.get());
        ok(range_float_encode_cuda(r, reinterpret_cast<float*>(din.get()), x.size(), reinterpret_cast<uint32_t*>(dcodes.get()),
                                   clamped, s.get()));
        ok(range_float_decode_cuda(r, reinterpret_cast<uint32_t*>(dcode.get()), codes, reinterpret_cast<float*>(dvalues.get()),
                                   s.get()));
        ok(cudaStreamSynchronize(s.get()));
        unsigned long long dev_clamped = 0;
        ok(cudaMemcpy(dev_codes.data(), dcodes.get(), x.size() * 4, cudaMemcpyDeviceToHost));
        ok(cudaMemcpy(dev_values.data(), dvalues.get(), codes * 4, cudaMemcpyDeviceToHost));
        ok(cudaMemcpy(&dev_clamped, clamped, 8, cudaMemcpyDeviceToHost));
        CHECK(dev_codes == host_codes);
        CHECK(first_difference(host_values.data(), dev_values.data(), codes, false).empty());
        CHECK(dev_clamped == host_clamped);
        CHECK(host_clamped > 0);
      }
  CHECK(range_float_encode_cuda(make_range_float(10, 6, 1.0f, false), nullptr, 5, nullptr, nullptr, nullptr) ==
        cudaErrorInvalidValue);
}

// Whether cuFFT loads here; a case that needs it says why not otherwise (and ends: it passes).
bool cufft_loads() {
  std::string why;
  if (fft_cuda_available(&why)) return true;
  WARN("cuFFT is not loadable here: " << why);
  return false;
}

// A payload run's segments as its headers say (fft_sparse.h): count of bins sent and flags of each.
struct SegmentHeader {
  uint32_t length, count, flags;
};
std::vector<SegmentHeader> headers_of(const CodecConfig& c, const std::vector<uint8_t>& run, size_t count) {
  std::vector<SegmentHeader> out;
  size_t at = 0;
  for (size_t v = 0; v < count; v += c.segment) {
    const FftShape shape = fft_shape(c, std::min<size_t>(c.segment, count - v));
    SegmentHeader h{};
    uint16_t magic = 0, flags = 0;
    REQUIRE(at + kFftHeaderBytes <= run.size());
    std::memcpy(&magic, &run[at], 2), std::memcpy(&flags, &run[at + 2], 2);
    std::memcpy(&h.length, &run[at + 4], 4), std::memcpy(&h.count, &run[at + 8], 4);
    h.flags = flags;
    REQUIRE(magic == 0x5146);
    out.push_back(h);
    at += (flags & 1) ? kFftHeaderBytes : fft_payload_bytes(c, shape, h.count, flags & 2);
  }
  CHECK(at == run.size());
  return out;
}

double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(sum);
}

// fft_encode_cuda of x: the payload run, the residual (its device buffer holding `residual_before`
// first) and the counters.
struct DeviceEncoding {
  std::vector<uint8_t> run;
  std::vector<float> residual;
  unsigned long long nonfinite = 0, clamped = 0;
};
DeviceEncoding encode_on_device(const CodecConfig& c, uint32_t hash, const std::vector<float>& x, float residual_before,
                                FftCudaWorkspace* ws) {
  const size_t count = x.size();
  Stream s;
  DeviceBytes din(count * 4), dout(c.encoded_bytes(count)), dlength(8), dresidual(count * 4), dcounters(16);
  DeviceEncoding e;
  e.residual.assign(count, residual_before);
  ok(cudaMemcpy(din.get(), x.data(), count * 4, cudaMemcpyHostToDevice));
  ok(cudaMemcpy(dresidual.get(), e.residual.data(), count * 4, cudaMemcpyHostToDevice));
  ok(cudaMemset(dcounters.get(), 0, 16));
  auto* counters = reinterpret_cast<unsigned long long*>(dcounters.get());  // non-finite values, clamped parts
  ok(fft_encode_cuda(c, hash, reinterpret_cast<float*>(din.get()), count, dout.get(),
                     reinterpret_cast<size_t*>(dlength.get()), reinterpret_cast<float*>(dresidual.get()), counters,
                     counters + 1, ws, s.get()));
  ok(cudaStreamSynchronize(s.get()));
  size_t bytes = 0;
  ok(cudaMemcpy(&bytes, dlength.get(), 8, cudaMemcpyDeviceToHost));
  REQUIRE(bytes <= c.encoded_bytes(count));
  e.run.resize(bytes);
  ok(cudaMemcpy(e.run.data(), dout.get(), bytes, cudaMemcpyDeviceToHost));
  ok(cudaMemcpy(e.residual.data(), dresidual.get(), count * 4, cudaMemcpyDeviceToHost));
  ok(cudaMemcpy(&e.nonfinite, counters, 8, cudaMemcpyDeviceToHost));
  ok(cudaMemcpy(&e.clamped, counters + 1, 8, cudaMemcpyDeviceToHost));
  return e;
}

// fft_decode_spectrum_cuda of a payload run onto `spectrum` (accumulate: added to it); returns the
// non-finite count.
unsigned long long decode_on_device(const CodecConfig& c, uint32_t hash, const std::vector<uint8_t>& run, size_t count,
                                    std::vector<float>& spectrum, bool accumulate, FftCudaWorkspace* ws) {
  Stream s;
  const size_t bytes = run.size();
  DeviceBytes drun(bytes), dlength(8), dspectrum(spectrum.size() * 4), dnonfinite(8);
  ok(cudaMemcpy(drun.get(), run.data(), bytes, cudaMemcpyHostToDevice));
  ok(cudaMemcpy(dlength.get(), &bytes, 8, cudaMemcpyHostToDevice));
  ok(cudaMemcpy(dspectrum.get(), spectrum.data(), spectrum.size() * 4, cudaMemcpyHostToDevice));
  ok(cudaMemset(dnonfinite.get(), 0, 8));
  auto* nonfinite = reinterpret_cast<unsigned long long*>(dnonfinite.get());
  ok(fft_decode_spectrum_cuda(c, hash, drun.get(), reinterpret_cast<size_t*>(dlength.get()), count,
                              reinterpret_cast<float*>(dspectrum.get()), accumulate, nonfinite, ws, s.get()));
  ok(cudaStreamSynchronize(s.get()));
  unsigned long long seen = 0;
  ok(cudaMemcpy(spectrum.data(), dspectrum.get(), spectrum.size() * 4, cudaMemcpyDeviceToHost));
  ok(cudaMemcpy(&seen, nonfinite, 8, cudaMemcpyDeviceToHost));
  return seen;
}

// fft_synthesize_cuda of a spectrum.
std::vector<float> synthesize_on_device(const CodecConfig& c, const std::vector<float>& spectrum, size_t count,
                                        FftCudaWorkspace* ws) {
  Stream s;
  DeviceBytes dspectrum(spectrum.size() * 4), dout(count * 4);
  ok(cudaMemcpy(dspectrum.get(), spectrum.data(), spectrum.size() * 4, cudaMemcpyHostToDevice));
  ok(fft_synthesize_cuda(c, reinterpret_cast<float*>(dspectrum.get()), count, reinterpret_cast<float*>(dout.get()), ws,
                         s.get()));
  ok(cudaStreamSynchronize(s.get()));
  std::vector<float> out(count);
  ok(cudaMemcpy(out.data(), dout.get(), count * 4, cudaMemcpyDeviceToHost));
  return out;
}

// cuFFT rounds otherwise than the host's FFT, so the device's payloads are not the host's bytes. What
// must hold: the host reads every device payload (the layout is exact), both decoders give the same
// spectrum bits for the same payload (unpacking is exact), the device's error is the host's within
// the transforms' rounding, each segment sends K bins as the host does (less the underflows), the
// residual is the input less the device's own decode, bit for bit, and NaN segments and malformed
// payloads read as the host reads them.
TEST_CASE("the fft codec's cuFFT launchers: payloads both sides read alike, the host's error, exact K",
          "[fft][cuda]") {
  if (!cufft_loads()) return;
  FftCudaWorkspace* ws = fft_cuda_workspace();
  const FftWorkspaceHandle hws = take_fft_workspace();
  std::mt19937_64 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const char* spec : {"fft:theta=0.9,bits=10,segment=4096", "fft:theta=0.99,bits=12,mant=6,segment=1000,index=coo",
                           "fft:theta=0.5,bits=8,mant=4,segment=777,max=auto,round=nearest",
                           "fft:theta=0,bits=16,mant=10,segment=64,index=bitmap",
                           // the default segment: 32,769 bins, several rounds of the device's
                           // compaction (4,096 bins a round) and of its bitmap walk
                           "fft:theta=0.9,bits=12,mant=6,segment=65536"}) {
    const CodecConfig c = parse_codec_spec(spec);
    const uint32_t hash = static_cast<uint32_t>(c.hash());  // the host's, so that the host reads them
    for (size_t count : {size_t{3} * c.segment + 123, size_t{c.segment / 2 + 1}}) {
      INFO(spec << ", " << count << " values");
      std::vector<float> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = 0.3f * std::sin(0.01f * static_cast<float>(i)) + 0.05f * normal(rng);
      std::vector<uint8_t> host_run(c.encoded_bytes(count));
      const FftReport host = fft_encode(c, x.data(), count, host_run.data(), *hws);
      host_run.resize(host.bytes);
      std::vector<float> host_out(count);
      REQUIRE(fft_decode(c, host_run.data(), host_run.size(), count, host_out.data(), false, *hws) == 0);
      const DeviceEncoding dev = encode_on_device(c, hash, x, 0.0f, ws);
      CHECK(dev.nonfinite == 0);
      CHECK(dev.clamped == host.clamped);

      // The host reads it; its error is the host's.
      std::vector<float> dev_out(count);
      CHECK(fft_decode(c, dev.run.data(), dev.run.size(), count, dev_out.data(), false, *hws) == 0);
      const double norm = distance(x, std::vector<float>(count, 0.0f));
      CHECK(distance(dev_out, x) <= 1.01 * distance(host_out, x) + 1e-5 * norm);
      // K bins per segment as the host sends, less underflows, which the two sides share but for
      // near ties.
      const std::vector<SegmentHeader> dh = headers_of(c, dev.run, count), hh = headers_of(c, host_run, count);
      REQUIRE(dh.size() == hh.size());
      for (size_t k = 0; k < dh.size(); ++k) {
        CHECK(dh[k].length == hh[k].length);
        CHECK(dh[k].flags == hh[k].flags);
        const FftShape shape = fft_shape(c, dh[k].length);
        CHECK(dh[k].count <= shape.keep);
        CHECK(std::abs(static_cast<long>(dh[k].count) - static_cast<long>(hh[k].count)) <=
              static_cast<long>(shape.keep / 100 + 1));
      }

      // Spectra: both decoders, both payloads, plain and accumulated, the same bits.
      const size_t floats = fft_spectrum_floats(c, count);
      const std::vector<uint8_t>& host_payload = host_run;
      for (const std::vector<uint8_t>* run : {&dev.run, &host_payload}) {
        for (bool accumulate : {false, true}) {
          std::vector<float> host_spectrum(floats, 0.5f), dev_spectrum(floats, 0.5f);
          CHECK(fft_decode_spectrum(c, run->data(), run->size(), count, host_spectrum.data(), accumulate, *hws) == 0);
          CHECK(decode_on_device(c, hash, *run, count, dev_spectrum, accumulate, ws) == 0);
          CHECK(first_difference(host_spectrum.data(), dev_spectrum.data(), floats, false).empty());
        }
      }
      // The inverse transforms: the host's within rounding. The residual: the input less the device's
      // own decode of its payload, bit for bit.
      std::vector<float> spectrum(floats), host_synth(count);
      decode_on_device(c, hash, dev.run, count, spectrum, false, ws);
      const std::vector<float> dev_synth = synthesize_on_device(c, spectrum, count, ws);
      fft_synthesize(c, spectrum.data(), count, host_synth.data(), *hws);
      CHECK(distance(dev_synth, host_synth) <= 1e-5 * norm);
      size_t residual_wrong = 0;
      for (size_t i = 0; i < count; ++i) residual_wrong += bits_of(dev.residual[i]) != bits_of(x[i] - dev_synth[i]);
      CHECK(residual_wrong == 0);
    }
  }

  // NaN in the second segment: sent as such, counted, the residual left alone there; a payload broken in
  // its second segment reads as NaN from there on, on both sides.
  const CodecConfig c = parse_codec_spec("fft:theta=0.9,bits=10,segment=512");
  const uint32_t hash = static_cast<uint32_t>(c.hash());
  const size_t count = 4 * 512;
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = std::cos(0.02f * static_cast<float>(i));
  x[700] = NAN;
  const DeviceEncoding dev = encode_on_device(c, hash, x, 7.0f, ws);
  CHECK(dev.nonfinite == 512);
  const std::vector<SegmentHeader> headers = headers_of(c, dev.run, count);
  REQUIRE(headers.size() == 4);
  CHECK(headers[1].flags == 1);
  CHECK(headers[0].flags != 1);
  const size_t floats = fft_spectrum_floats(c, count);
  {  // the residual: left alone over the NaN segment, the input less the device's decode elsewhere
    std::vector<float> spectrum(floats);
    decode_on_device(c, hash, dev.run, count, spectrum, false, ws);
    const std::vector<float> decoded = synthesize_on_device(c, spectrum, count, ws);
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i)
      wrong += i / 512 == 1 ? dev.residual[i] != 7.0f : bits_of(dev.residual[i]) != bits_of(x[i] - decoded[i]);
    CHECK(wrong == 0);
  }
  for (bool broken : {false, true}) {
    INFO((broken ? "broken" : "NaN segment"));
    std::vector<uint8_t> payload = dev.run;
    const size_t second = fft_payload_bytes(c, fft_shape(c, 512), headers[0].count, headers[0].flags & 2);
    if (broken) payload[second] ^= 0xFF;  // the second segment's magic
    std::vector<float> host_spectrum(floats, 0.0f), dev_spectrum(floats, 0.0f);
    const size_t host_bad = fft_decode_spectrum(c, payload.data(), payload.size(), count, host_spectrum.data(), false, *hws);
    CHECK(host_bad == (broken ? count - 512 : 512));
    CHECK(decode_on_device(c, hash, payload, count, dev_spectrum, false, ws) == host_bad);
    CHECK(first_difference(host_spectrum.data(), dev_spectrum.data(), floats, true).empty());
  }
  Stream s;
  DeviceBytes dlength(8);
  CHECK(fft_encode_cuda(c, hash, nullptr, 5, nullptr, reinterpret_cast<size_t*>(dlength.get()), nullptr, nullptr,
                        nullptr, ws, s.get()) == cudaErrorInvalidValue);
  // A spectrum that cannot be read as float2 is refused, not faulted on.
  DeviceBytes dspectrum(64);
  CHECK(fft_decode_spectrum_cuda(c, hash, dspectrum.get(), reinterpret_cast<size_t*>(dlength.get()), 5,
                                 reinterpret_cast<float*>(dspectrum.get() + 4), false, nullptr, ws,
                                 s.get()) == cudaErrorInvalidValue);
  fft_cuda_release(ws);
}

// The byte offset of each segment's payload in a run (headers_of's walk).
std::vector<size_t> payload_offsets(const CodecConfig& c, const std::vector<uint8_t>& run, size_t count) {
  std::vector<size_t> at{0};
  const std::vector<SegmentHeader> headers = headers_of(c, run, count);
  for (const SegmentHeader& h : headers)
    at.push_back(at.back() + ((h.flags & 1) ? kFftHeaderBytes
                                            : fft_payload_bytes(c, fft_shape(c, h.length), h.count, h.flags & 2)));
  return at;
}

// Where cuFFT and the host's FFT must agree to the bit, the device must choose what the host chooses:
// an impulse transforms to equal bins in any FFT of a power-of-two length (every butterfly adds an
// exact zero), so every magnitude ties and exactly the K lowest bins are sent; a zero segment sends
// no bin (every part underflows); with K = 1 a dominant frequency is the one bin sent. The decoded
// spectra are then equal value for value (the imaginary zeros' signs may differ).
TEST_CASE("the fft codec's cuFFT launchers choose the host's bins where the transforms agree exactly",
          "[fft][cuda]") {
  if (!cufft_loads()) return;
  FftCudaWorkspace* ws = fft_cuda_workspace();
  const FftWorkspaceHandle hws = take_fft_workspace();
  // (At segment 65,536 the impulse's K = 16,385 tied bins span several rounds of the device's
  // compaction: the ties' ranks carry from round to round.)
  for (const char* spec : {"fft:theta=0.9,bits=10,segment=4096", "fft:theta=0.99,bits=10,segment=64",
                           "fft:theta=0.5,bits=12,mant=6,segment=256,index=coo",
                           "fft:theta=0.5,bits=12,mant=6,segment=65536"}) {
    const CodecConfig c = parse_codec_spec(spec);
    const uint32_t hash = static_cast<uint32_t>(c.hash());
    const size_t count = 3 * c.segment;
    std::vector<float> x(count, 0.0f);
    x[0] = 1.0f;  // segment 0: an impulse; segment 1: zeros; segment 2: a cosine at bin 5 over a small one
    for (size_t i = 0; i < c.segment; ++i) {
      const float t = static_cast<float>(i) / static_cast<float>(c.segment);
      x[2 * c.segment + i] = std::cos(6.2831853f * 5.0f * t) + 0.01f * std::cos(6.2831853f * 9.0f * t);
    }
    INFO(spec);
    std::vector<uint8_t> host_run(c.encoded_bytes(count));
    host_run.resize(fft_encode(c, x.data(), count, host_run.data(), *hws).bytes);
    const DeviceEncoding dev = encode_on_device(c, hash, x, 0.0f, ws);
    const std::vector<SegmentHeader> dh = headers_of(c, dev.run, count), hh = headers_of(c, host_run, count);
    REQUIRE(dh.size() == 3);
    const FftShape shape = fft_shape(c, c.segment);
    CHECK(dh[0].count == shape.keep);
    CHECK(hh[0].count == shape.keep);
    CHECK(dh[1].count == 0);
    CHECK(hh[1].count == 0);
    // (with K above 1, segment 2's other bins are its transform's rounding noise, which differs)
    const size_t exact_segments = shape.keep == 1 ? 3 : 2;
    if (shape.keep == 1) CHECK((dh[2].count == 1 && hh[2].count == 1));
    // The bins sent: the same bitmap or index list on both sides.
    const std::vector<size_t> dat = payload_offsets(c, dev.run, count), hat = payload_offsets(c, host_run, count);
    for (size_t k = 0; k < exact_segments; ++k) {
      INFO("segment " << k);
      REQUIRE(dh[k].flags == hh[k].flags);
      const size_t list = (dh[k].flags & 2) ? 4 * size_t{dh[k].count} : (shape.bins + 7) / 8;
      CHECK(first_difference(&host_run[hat[k] + kFftHeaderBytes], &dev.run[dat[k] + kFftHeaderBytes], list).empty());
    }
    const size_t floats = fft_spectrum_floats(c, count);
    std::vector<float> from_host(floats, 0.0f), from_dev(floats, 0.0f);
    CHECK(fft_decode_spectrum(c, host_run.data(), host_run.size(), count, from_host.data(), false, *hws) == 0);
    CHECK(fft_decode_spectrum(c, dev.run.data(), dev.run.size(), count, from_dev.data(), false, *hws) == 0);
    size_t unequal = 0;
    for (size_t i = 0; i < 4 * shape.bins; ++i) unequal += from_host[i] != from_dev[i];  // segments 0 and 1
    CHECK(unequal == 0);
  }
  fft_cuda_release(ws);
}

// Bins are ranked by magnitudes scaled into float32's range (rfloat.h's magnitude_scale), on the
// device as on the host: a cosine at bin 5 scaled by 2^90 (|X|^2 would overflow: the segment was sent
// as NaN) or 2^-90 (|X|^2 would be 0: every bin a tie, bin 0 sent) sends bin 5 alone, as the host;
// and at 2^122 and 2^-120, beyond where max=auto's exponent was clamped to +-100 (the part clamped,
// or underflowed and nothing was sent), with the host's exponent (fft_auto_exponent).
TEST_CASE("the fft codec's cuFFT launchers rank bins at any scale as the host does", "[fft][cuda]") {
  if (!cufft_loads()) return;
  FftCudaWorkspace* ws = fft_cuda_workspace();
  const FftWorkspaceHandle hws = take_fft_workspace();
  const CodecConfig c = parse_codec_spec("fft:theta=0.99,bits=10,segment=64,max=auto,index=coo");
  const uint32_t hash = static_cast<uint32_t>(c.hash());
  REQUIRE(fft_shape(c, 64).keep == 1);
  for (int k : {-120, -90, 0, 90, 122}) {
    INFO("2^" << k);
    std::vector<float> x(64);
    for (size_t i = 0; i < x.size(); ++i) {
      const float t = static_cast<float>(i) / 64.0f;
      // (0.75: the largest part lies between two powers of two, so that max=auto's exponent does not
      // hang on how the two transforms round a part that is a power of two)
      x[i] = std::ldexp(0.75f * std::cos(6.2831853f * 5.0f * t) + 0.01f * std::cos(6.2831853f * 9.0f * t), k);
    }
    std::vector<uint8_t> host_run(c.encoded_bytes(x.size()));
    host_run.resize(fft_encode(c, x.data(), x.size(), host_run.data(), *hws).bytes);
    const DeviceEncoding dev = encode_on_device(c, hash, x, 0.0f, ws);
    CHECK(dev.nonfinite == 0);
    const std::vector<SegmentHeader> dh = headers_of(c, dev.run, x.size()), hh = headers_of(c, host_run, x.size());
    REQUIRE((dh.size() == 1 && hh.size() == 1));
    CHECK(dh[0].flags == hh[0].flags);
    REQUIRE((dh[0].count == 1 && hh[0].count == 1));
    uint32_t device_bin = 0, host_bin = 0;  // the index list's one entry, after the header
    std::memcpy(&device_bin, &dev.run[kFftHeaderBytes], 4);
    std::memcpy(&host_bin, &host_run[kFftHeaderBytes], 4);
    CHECK(host_bin == 5);
    CHECK(device_bin == 5);
  }
  fft_cuda_release(ws);
}

// Payloads broken in the middle of a run the way a bad sender or a cut message would break them: an
// index list out of order, an index past the last bin, a bitmap bit in the padding past the last bin,
// a count above K, an exponent without max=auto. The device's decoder finds each as the host's does:
// the same spectrum (NaN from the broken segment on) and the same non-finite count, plain and
// accumulated.
TEST_CASE("the fft codec's cuFFT decoder rejects malformed payloads as the host's does", "[fft][cuda]") {
  if (!cufft_loads()) return;
  FftCudaWorkspace* ws = fft_cuda_workspace();
  const FftWorkspaceHandle hws = take_fft_workspace();
  const size_t count = 4 * 64 + 20;  // four segments and a tail
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i)
    x[i] = std::sin(0.3f * static_cast<float>(i)) + 0.2f * std::cos(1.7f * static_cast<float>(i));
  struct Break {
    const char* what;
    const char* spec;
    std::function<void(std::vector<uint8_t>&, size_t at, const SegmentHeader&)> apply;
  };
  auto put32 = [](std::vector<uint8_t>& run, size_t at, uint32_t v) { std::memcpy(&run[at], &v, 4); };
  const Break breaks[] = {
      {"indices out of order", "fft:theta=0.5,bits=10,segment=64,index=coo",
       [&](std::vector<uint8_t>& run, size_t at, const SegmentHeader&) {
         uint32_t first = 0;
         std::memcpy(&first, &run[at + kFftHeaderBytes], 4);
         put32(run, at + kFftHeaderBytes + 4, first);  // the second index equal to the first
       }},
      {"an index past the last bin", "fft:theta=0.5,bits=10,segment=64,index=coo",
       [&](std::vector<uint8_t>& run, size_t at, const SegmentHeader& h) {
         put32(run, at + kFftHeaderBytes + 4 * (h.count - 1), 33);  // bins 0..32
       }},
      {"a bitmap bit past the last bin", "fft:theta=0.5,bits=10,segment=64,index=bitmap",
       [&](std::vector<uint8_t>& run, size_t at, const SegmentHeader&) {
         run[at + kFftHeaderBytes + 4] |= 0x08;  // bit 35 of the 40: padding
       }},
      {"a count above K", "fft:theta=0.5,bits=10,segment=64,index=coo",
       [&](std::vector<uint8_t>& run, size_t at, const SegmentHeader&) { put32(run, at + 8, 18); }},  // K = 17
      {"an exponent without max=auto", "fft:theta=0.5,bits=10,segment=64",
       [&](std::vector<uint8_t>& run, size_t at, const SegmentHeader&) { run[at + 3] = 2; }},
  };
  for (const Break& b : breaks) {
    INFO(b.what);
    const CodecConfig c = parse_codec_spec(b.spec);
    const uint32_t hash = static_cast<uint32_t>(c.hash());
    std::vector<uint8_t> run(c.encoded_bytes(count));
    run.resize(fft_encode(c, x.data(), count, run.data(), *hws).bytes);
    const std::vector<SegmentHeader> headers = headers_of(c, run, count);
    REQUIRE(headers[2].count >= 2);
    b.apply(run, payload_offsets(c, run, count)[2], headers[2]);
    const size_t floats = fft_spectrum_floats(c, count);
    for (bool accumulate : {false, true}) {
      std::vector<float> host_spectrum(floats, 0.25f), dev_spectrum(floats, 0.25f);
      const size_t host_bad =
          fft_decode_spectrum(c, run.data(), run.size(), count, host_spectrum.data(), accumulate, *hws);
      CHECK(host_bad == count - 2 * 64);  // the third segment on, the tail included
      CHECK(decode_on_device(c, hash, run, count, dev_spectrum, accumulate, ws) == host_bad);
      CHECK(first_difference(host_spectrum.data(), dev_spectrum.data(), floats, true).empty());
    }
  }
  fft_cuda_release(ws);
}

// Error feedback's restore over a poisoned sum: the device takes back the saved residual over the
// segments whose sum holds NaN, Inf or -Inf and leaves the others, as the host does, bit for bit; the
// last shape has more segments than the kernel's grid has blocks (blocks take several). No cuFFT.
TEST_CASE("fft_restore_residual_cuda matches fft_restore_residual bit for bit", "[fft][cuda]") {
  struct Shape {
    uint32_t segment;
    size_t count;
  };
  for (const Shape shape : {Shape{1024, 1}, Shape{777, 5000}, Shape{65536, 200000}, Shape{8, 300001}}) {
    INFO("segment " << shape.segment << ", count " << shape.count);
    CodecConfig c = parse_codec_spec("fft:theta=0.9,ef=on");
    c.segment = shape.segment;
    const size_t count = shape.count;
    std::vector<float> saved(count), sum(count), residual(count);
    std::mt19937 rng(static_cast<uint32_t>(count));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (size_t i = 0; i < count; ++i) saved[i] = u(rng), sum[i] = u(rng), residual[i] = u(rng);
    const float poison[] = {NAN, INFINITY, -INFINITY};
    size_t poisoned = 0;
    for (size_t at = 0, s = 0; at < count; at += c.segment, ++s)
      if (s % 3 == 0) sum[std::min(count - 1, at + s % c.segment)] = poison[s / 3 % 3], ++poisoned;
    std::vector<float> expected = residual;
    fft_restore_residual(c, saved.data(), sum.data(), count, expected.data());
    size_t restored = 0;
    for (size_t i = 0; i < count; ++i) restored += expected[i] != residual[i];
    CHECK(restored > 0);
    CHECK(restored <= poisoned * c.segment);

    Stream s;
    DeviceBytes dsaved(count * 4), dsum(count * 4), dresidual(count * 4);
    ok(cudaMemcpy(dsaved.get(), saved.data(), count * 4, cudaMemcpyHostToDevice));
    ok(cudaMemcpy(dsum.get(), sum.data(), count * 4, cudaMemcpyHostToDevice));
    ok(cudaMemcpy(dresidual.get(), residual.data(), count * 4, cudaMemcpyHostToDevice));
    ok(fft_restore_residual_cuda(c, reinterpret_cast<float*>(dsaved.get()), reinterpret_cast<float*>(dsum.get()),
                                 count, reinterpret_cast<float*>(dresidual.get()), s.get()));
    ok(cudaStreamSynchronize(s.get()));
    std::vector<float> device(count);
    ok(cudaMemcpy(device.data(), dresidual.get(), count * 4, cudaMemcpyDeviceToHost));
    CHECK(std::memcmp(device.data(), expected.data(), count * 4) == 0);
  }
}

// AQ-SGD's delta messages: a sender and a receiver on the device and their twins on the host, fed the
// same drifting activation message after message (and, last, one holding NaN), hold the same m, send
// the same bytes and return the same x_out, bit for bit; the NaN message commits nothing on either.
// A scale of Inf, which no encoder writes (a malformed payload), decodes its channel to NaN on both
// sides, counted alike (the device counted the values that came out NaN, the host none).
TEST_CASE("aq: a payload's Inf scale decodes to NaN and is counted as on the host", "[aq][cuda]") {
  const CodecConfig c = parse_codec_spec("aq4:channels=4");
  const size_t n = 40;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::sin(0.7f * static_cast<float>(i));
  std::vector<uint8_t> wire(c.encoded_bytes(n));
  REQUIRE(encode(c, x.data(), n, wire.data(), PhiloxKey{}, 0).nonfinite == 0);
  wire[2 * 1] = 0x00, wire[2 * 1 + 1] = 0x7C;  // channel 1's scale: +Inf
  std::vector<float> host(n), dev(n);
  const size_t host_bad = decode(c, wire.data(), n, host.data());
  CHECK(host_bad == n / 4);
  const Stream stream;
  const DeviceBytes d_wire(wire.size()), d_out(n * 4), d_count(8);
  auto* counter = reinterpret_cast<unsigned long long*>(d_count.get());
  ok(cudaMemcpyAsync(d_wire.get(), wire.data(), wire.size(), cudaMemcpyHostToDevice, stream.get()));
  ok(cudaMemsetAsync(counter, 0, 8, stream.get()));
  ok(decode_cuda(c, d_wire.get(), n, reinterpret_cast<float*>(d_out.get()), counter, stream.get()));
  unsigned long long dev_bad = 0;
  ok(cudaMemcpyAsync(dev.data(), d_out.get(), n * 4, cudaMemcpyDeviceToHost, stream.get()));
  ok(cudaMemcpyAsync(&dev_bad, counter, 8, cudaMemcpyDeviceToHost, stream.get()));
  ok(cudaStreamSynchronize(stream.get()));
  CHECK(dev_bad == host_bad);
  CHECK(first_difference(host.data(), dev.data(), n, true) == "");
  for (size_t i = 0; i < n; ++i) CHECK(std::isnan(dev[i]) == (i % 4 == 1));
}

TEST_CASE("aq_delta_send_cuda and aq_delta_receive_cuda match aq_delta.h bit for bit", "[aq][cuda]") {
  for (DataType t : {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32})
    for (const char* spec : {"aq4:channels=64,round=stochastic,seed=5", "aq2:channels=7,rows=3", "aq8:channels=1"}) {
      const CodecConfig c = parse_codec_spec(spec);
      const size_t n = 64 * 21 + 5, es = element_size(t);
      std::mt19937_64 rng(99);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      std::vector<uint8_t> m_host(n * es);
      store_float(t, x.data(), m_host.data(), n);  // a full message first: m = round_t(x) on both ends
      std::vector<uint8_t> mr_host = m_host, wire_host(c.encoded_bytes(n)), wire_dev(wire_host.size());
      std::vector<float> out_host(n), out_dev(n);
      Mirrored<uint8_t> m_dev(m_host), mr_dev(m_host);
      DeviceBytes d_x(n * 4), d_wire(wire_host.size()), d_out(n * 4), d_scratch(2 * n * 4), d_count(8);
      auto* count = reinterpret_cast<unsigned long long*>(d_count.get());
      for (int step = 0; step < 8; ++step) {
        for (float& v : x) v += 0.1f * normal(rng);
        if (step == 7) x[70] = NAN;
        INFO(data_type_name(t) << " " << spec << " message " << step);
        const PhiloxKey key{5, static_cast<uint64_t>(step), 0, 0};
        const size_t sent_bad = aq_delta_send(c, x.data(), n, t, m_host.data(), wire_host.data(), key, 0);
        const size_t received_bad = aq_delta_receive(c, wire_host.data(), n, t, mr_host.data(), out_host.data());
        CHECK((sent_bad != 0) == (step == 7));
        ok(cudaMemcpy(d_x.get(), x.data(), n * 4, cudaMemcpyHostToDevice));
        ok(cudaMemset(count, 0, 8));
        ok(aq_delta_send_cuda(c, reinterpret_cast<float*>(d_x.get()), n, t, m_dev.dev(), d_wire.get(), key, 0,
                              reinterpret_cast<float*>(d_scratch.get()), count, nullptr));
        ok(cudaDeviceSynchronize());
        unsigned long long dev_sent_bad = 0, dev_received_bad = 0;
        ok(cudaMemcpy(&dev_sent_bad, count, 8, cudaMemcpyDeviceToHost));
        ok(cudaMemset(count, 0, 8));
        ok(aq_delta_receive_cuda(c, d_wire.get(), n, t, mr_dev.dev(), reinterpret_cast<float*>(d_out.get()), count,
                                 nullptr));
        ok(cudaDeviceSynchronize());
        ok(cudaMemcpy(&dev_received_bad, count, 8, cudaMemcpyDeviceToHost));
        ok(cudaMemcpy(wire_dev.data(), d_wire.get(), wire_dev.size(), cudaMemcpyDeviceToHost));
        ok(cudaMemcpy(out_dev.data(), d_out.get(), n * 4, cudaMemcpyDeviceToHost));
        CHECK(first_difference(wire_host.data(), wire_dev.data(), wire_host.size()).empty());
        CHECK(first_difference(out_host.data(), out_dev.data(), n, true).empty());
        CHECK(m_dev.fetch() == m_host);
        CHECK(mr_dev.fetch() == mr_host);
        CHECK(dev_sent_bad == sent_bad);
        CHECK(dev_received_bad == received_bad);
        CHECK(m_host == mr_host);
      }
    }
  CHECK(aq_delta_send_cuda(parse_codec_spec("q8"), nullptr, 5, DataType::kFloat16, nullptr, nullptr, PhiloxKey{}, 0,
                           nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
}

}  // namespace qccl::kernels
