// The fft codec (kernels/fft_sparse.h, kernels/rfloat.h) against shared/specs/fftsparse.md §4: the
// range float exhaustively (P7), its error bounds (P8) and a worked vector (P9); the transform's
// energy identities through the whole codec (P1-P4, P16), the smooth-signal capture against spatial
// top-k at the same number of reals (P5), the payload format read by this test from its documented
// layout (P11, P12 with the spec's 2^20 example), NaN and malformed payloads, odd and tail lengths,
// the spec grammar's errors, and Eq. 4's break-even helper (P17). References in double precision.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/fft_sparse.h"
#include "kernels/rfloat.h"

namespace qccl::kernels {
namespace {

constexpr double kPi = 3.14159265358979323846;

// The documented header: magic, flags, logical length, count, hash (fft_sparse.h).
struct Header {
  uint16_t magic, flags;
  uint32_t length, count, hash;
};
Header header_at(const uint8_t* p) {
  Header h;
  std::memcpy(&h.magic, p, 2);
  std::memcpy(&h.flags, p + 2, 2);
  std::memcpy(&h.length, p + 4, 4);
  std::memcpy(&h.count, p + 8, 4);
  std::memcpy(&h.hash, p + 12, 4);
  return h;
}

// The bins a bitmap payload sends, from its bitmap.
std::vector<size_t> bitmap_bins(const uint8_t* payload, size_t bins) {
  std::vector<size_t> out;
  for (size_t k = 0; k < bins; ++k)
    if (payload[16 + k / 8] >> (k % 8) & 1) out.push_back(k);
  return out;
}

struct Coded {
  std::vector<uint8_t> wire;
  std::vector<float> decoded;
  FftReport report;
};
Coded round_trip(const CodecConfig& c, const std::vector<float>& x) {
  Coded r;
  r.wire.assign(c.encoded_bytes(x.size()) + 1, 0xAB);
  auto ws = take_fft_workspace();
  r.report = fft_encode(c, x.data(), x.size(), r.wire.data(), *ws);
  REQUIRE(r.report.bytes <= c.encoded_bytes(x.size()));
  CHECK(r.wire[c.encoded_bytes(x.size())] == 0xAB);  // nothing past the capacity
  r.decoded.assign(x.size(), -7.0f);
  CHECK(fft_decode(c, r.wire.data(), r.report.bytes, x.size(), r.decoded.data(), false, *ws) == 0);
  return r;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}
double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s);
}

// A double-precision real DFT scaled by 1/sqrt(L): bins 0 .. L/2.
std::vector<std::complex<double>> dft(const std::vector<float>& x) {
  const size_t n = x.size();
  std::vector<std::complex<double>> X(n / 2 + 1);
  for (size_t k = 0; k <= n / 2; ++k) {
    std::complex<double> s = 0;
    for (size_t j = 0; j < n; ++j) s += static_cast<double>(x[j]) * std::polar(1.0, -2 * kPi * double(k * j % n) / double(n));
    X[k] = s / std::sqrt(double(n));
  }
  return X;
}

}  // namespace

TEST_CASE("range float: every code of N <= 16 round-trips, in order, mirrored (P7)", "[fft]") {
  for (int bits : {3, 4, 8, 10, 12, 16})
    for (int mant = 1; mant <= bits - 1; ++mant)
      for (float max : {1.0f, 0.75f, 1000.0f})
        for (bool nearest : {false, true}) {
          if (range_float_invalid(bits, mant, max)) continue;
          INFO("bits=" << bits << " mant=" << mant << " max=" << max << (nearest ? " nearest" : " trunc"));
          const RangeFloat r = make_range_float(bits, mant, max, nearest);
          const uint32_t P = (1u << (bits - 1)) - 1, sign = 1u << (bits - 1);
          CHECK(range_float_decode(r, 0) == 0.0f);
          CHECK(range_float_decode(r, sign) == 0.0f);  // the unused negative zero
          CHECK(range_float_decode(r, 1) == range_float_eps(r));
          CHECK(range_float_decode(r, P) == range_float_max(r));
          CHECK(range_float_max(r) <= max);
          CHECK(range_float_max(r) > max * (1 - std::ldexp(1.0f, -mant)));
          size_t wrong = 0;
          float previous = 0;
          for (uint32_t c = 1; c <= P; ++c) {
            const float v = range_float_decode(r, c);
            bool clamped = false;
            wrong += range_float_encode(r, v, &clamped) != c || clamped;
            wrong += !(v > previous);  // strictly increasing
            wrong += range_float_decode(r, c | sign) != -v;  // the negative half mirrors
            wrong += range_float_encode(r, -v, &clamped) != (c | sign);
            previous = v;
          }
          CHECK(wrong == 0);
        }
}

TEST_CASE("range float: truncation within 2^-m below |x|, nearest within 2^-(m+1), clamps, underflow (P8)", "[fft]") {
  std::mt19937_64 rng(11);
  for (int bits : {6, 10, 16})
    for (int mant : {2, 4, bits - 2}) {
      if (range_float_invalid(bits, mant, 1.0f)) continue;
      INFO("bits=" << bits << " mant=" << mant);
      const RangeFloat trunc = make_range_float(bits, mant, 1.0f, false), near = make_range_float(bits, mant, 1.0f, true);
      const double lo = std::log(range_float_eps(trunc)), hi = std::log(range_float_max(trunc));
      std::uniform_real_distribution<double> u(lo, hi);
      size_t over = 0;
      for (int i = 0; i < 20000; ++i) {
        const float x = static_cast<float>(std::exp(u(rng))) * (i % 2 ? -1.0f : 1.0f);
        bool clamped = false;
        const float t = range_float_decode(trunc, range_float_encode(trunc, x, &clamped));
        over += clamped || std::signbit(t) != std::signbit(x) || !(std::fabs(x) - std::fabs(t) >= 0) ||
                !(std::fabs(x) - std::fabs(t) < std::ldexp(std::fabs(x), -mant));
        const float n = range_float_decode(near, range_float_encode(near, x, &clamped));
        over += !(std::fabs(x - n) <= std::ldexp(std::fabs(x), -(mant + 1)));
      }
      CHECK(over == 0);
      bool clamped = false;
      CHECK(range_float_decode(trunc, range_float_encode(trunc, 5.0f, &clamped)) == range_float_max(trunc));
      CHECK(clamped);
      clamped = false;
      CHECK(range_float_decode(trunc, range_float_encode(trunc, -5.0f, &clamped)) == -range_float_max(trunc));
      CHECK(clamped);
      clamped = false;
      CHECK(range_float_encode(trunc, range_float_eps(trunc) * 0.99f, &clamped) == 0);
      CHECK(range_float_encode(trunc, -range_float_eps(trunc) * 0.5f, &clamped) == 0);
      CHECK(range_float_encode(trunc, 0.0f, &clamped) == 0);
      CHECK_FALSE(clamped);
    }
}

TEST_CASE("range float: the worked vector, N=10, m=6, [-1, 1] (P9, sign-magnitude)", "[fft]") {
  // S(1.0) = 0x3F800000 >> 17 = 8128; sign-magnitude has P = 511 magnitudes, so S(eps) = 8128 - 511
  // + 1 = 7618 (the spec's 7617 is its P = 512 positive codes of the paper's split layout). 0.3 =
  // 0x3E99999A: S = 8012, index 8012 - 7618 + 1 = 395, decoding to 8012 << 17 = 0.296875 (the same
  // value the spec's code 396 decodes to).
  const RangeFloat r = make_range_float(10, 6, 1.0f, false);
  bool clamped = false;
  CHECK(r.base == 7618);
  CHECK(r.top == 8128);
  CHECK(range_float_encode(r, 0.3f, &clamped) == 395);
  CHECK(range_float_decode(r, 395) == 0.296875f);
  CHECK(range_float_encode(r, -0.3f, &clamped) == (395 | 512));
  uint32_t eps_bits = 7618u << 17;
  float eps;
  std::memcpy(&eps, &eps_bits, 4);
  CHECK(range_float_eps(r) == eps);
  CHECK(range_float_max(r) == 1.0f);
  // m=1 and m=2 cannot reach 511 magnitudes below 1.0 in normal floats (the spec's table).
  CHECK(range_float_invalid(10, 1, 1.0f) != nullptr);
  CHECK(range_float_invalid(10, 2, 1.0f) != nullptr);
  CHECK(range_float_invalid(10, 3, 1.0f) == nullptr);
}

TEST_CASE("fft codec: the spec grammar, canonical text, errors that name the token", "[fft]") {
  const CodecConfig c = parse_codec_spec("fft");
  CHECK(c.kind == CodecKind::kFft);
  CHECK(c.canonical() == "fft:theta=0.9,bits=10,mant=6,max=1,segment=65536,index=auto,round=trunc,ef=off,fallback=auto");
  const CodecConfig d =
      parse_codec_spec("fft:theta=0.85,bits=12,mant=7,max=4,segment=1001,index=coo,round=nearest,ef=on,fallback=off");
  CHECK(d.canonical() ==
        "fft:theta=0.85,bits=12,mant=7,max=4,segment=1001,index=coo,round=nearest,ef=on,fallback=off");
  CHECK(parse_codec_spec(d.canonical()).hash() == d.hash());
  CHECK(parse_codec_spec("fft:theta=0").theta == 0.0f);
  // -0 is 0: the same canonical text and hash, so that ranks writing either agree.
  for (const char* zero : {"fft:theta=-0", "fft:theta=-0.0", "fft:theta=-0e5"}) {
    INFO(zero);
    CHECK(parse_codec_spec(zero).canonical() == parse_codec_spec("fft:theta=0").canonical());
    CHECK(parse_codec_spec(zero).hash() == parse_codec_spec("fft:theta=0").hash());
  }
  CHECK(c.hash() != parse_codec_spec("fft:theta=0.8").hash());
  for (const char* bad : {"fft:theta=1", "fft:theta=-0.1", "fft:theta=nan", "fft:bits=2", "fft:bits=17", "fft:mant=0",
                          "fft:bits=8,mant=8", "fft:mant=1", "fft:segment=1", "fft:index=dense", "fft:round=stochastic",
                          "fft:bucket=64", "fft:max=0", "fft:max=automatic", "fft:theta", "fft:", "fft:fallback=on"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_codec_spec(bad), CodecSpecError);
  }
  CHECK_THROWS_WITH(parse_codec_spec("fft:theta=1"), Catch::Contains("theta=1") && Catch::Contains("[0, 1)"));
  CHECK_THROWS_WITH(parse_codec_spec("fft:mant=1"), Catch::Contains("mant=1") && Catch::Contains("smallest normal"));
  CHECK_THROWS_WITH(parse_codec_spec("fft:seed=3"), Catch::Contains("unknown key 'seed'"));
  // The token as written, not the float32 it became (1e-300 is 0 there).
  CHECK_THROWS_WITH(parse_codec_spec("fft:max=1e-300"), Catch::Contains("max=1e-300: max must be a positive normal"));
}

TEST_CASE("fft codec: wire size of the spec's example and the documented layout (P11, P12, P18)", "[fft]") {
  // L = 2^20, theta = 0.85, N = 10: 524289 bins, K = 78644, bitmap 65537 B, codes 196610 B.
  const CodecConfig big = parse_codec_spec("fft:theta=0.85,bits=10,segment=1048576");
  const FftShape shape = fft_shape(big, 1u << 20);
  CHECK(shape.bins == 524289);
  CHECK(shape.keep == 78644);
  CHECK(fft_segment_capacity(big, 1u << 20) == 16 + 65537 + 196610);
  CHECK(big.encoded_bytes(1u << 20) == 16 + 262147);
  // P18: the paper's 21.33 = 6.667 x 3.2 counts the kept values alone (1 / (1 - theta) of the bins,
  // 32 / N bits each); what a segment sends is the effective ratio, with the bitmap and the header
  // (codec_perf's "bits per value on the wire"): 4 MiB in 262,163 bytes, 16.0 (2.0 bits a value).
  const double raw_bits = 32.0 * (1u << 20);
  CHECK(raw_bits / (2.0 * static_cast<double>(shape.keep) * big.bits) == Approx(32.0 / (0.15 * 10)).epsilon(1e-4));
  CHECK(raw_bits / 8 / static_cast<double>(big.encoded_bytes(1u << 20)) == Approx(15.999).epsilon(1e-4));

  // K = ceil((1 - theta) B) for theta as written: 0.9f is 0.899999976, and (1 - 0.9f) B rounded up
  // kept one bin too many wherever (1 - theta) B is whole (18 values: B = 10; a tail of 1458: B = 730).
  CHECK(fft_shape(parse_codec_spec("fft:theta=0.9"), 18).keep == 1);
  CHECK(fft_shape(parse_codec_spec("fft:theta=0.9"), 1458).keep == 73);
  struct Theta {
    const char* spec;
    uint64_t keep_num, keep_den;  // 1 - theta
  };
  for (const Theta& t : {Theta{"fft:theta=0.9", 1, 10}, Theta{"fft:theta=0.7", 3, 10}, Theta{"fft:theta=0.95", 1, 20},
                         Theta{"fft:theta=0.85", 3, 20}, Theta{"fft:theta=0.99", 1, 100}, Theta{"fft:theta=0.5", 1, 2},
                         Theta{"fft:theta=0.12345", 17531, 20000}, Theta{"fft:theta=1e-05", 99999, 100000},
                         Theta{"fft:theta=0", 1, 1}}) {
    const CodecConfig c = parse_codec_spec(t.spec);
    size_t wrong = 0;
    for (size_t length = 2; length <= 4000; ++length) {
      const FftShape s = fft_shape(c, length);
      wrong += s.keep != std::max<uint64_t>(1, (t.keep_num * s.bins + t.keep_den - 1) / t.keep_den);
    }
    INFO(t.spec);
    CHECK(wrong == 0);
  }

  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (const char* spec : {"fft:theta=0.5,segment=512,index=bitmap", "fft:theta=0.97,segment=512,index=coo",
                           "fft:theta=0.5,segment=512", "fft:theta=0.99,segment=512", "fft:theta=0,segment=512,bits=12"}) {
    const CodecConfig c = parse_codec_spec(spec);
    INFO(spec);
    std::vector<float> x(512);
    for (float& v : x) v = normal(rng);
    const Coded coded = round_trip(c, x);
    const Header h = header_at(coded.wire.data());
    const FftShape s = fft_shape(c, 512);
    CHECK(h.magic == 0x5146);
    CHECK(h.length == 512);
    CHECK(h.hash == static_cast<uint32_t>(c.hash()));
    CHECK(h.count <= s.keep);
    CHECK(h.count + 10 >= s.keep);  // a few kept bins may underflow, not many of Gaussian data
    const bool indices = h.flags & 2;
    if (c.index == FftIndex::kBitmap) CHECK_FALSE(indices);
    if (c.index == FftIndex::kCoo) CHECK(indices);
    if (c.index == FftIndex::kAuto) CHECK(indices == (4 * h.count < (s.bins + 7) / 8));
    const size_t index_bytes = indices ? 4 * h.count : (s.bins + 7) / 8;
    CHECK(coded.report.bytes == 16 + index_bytes + (2 * h.count * c.bits + 7) / 8);
    if (!indices) CHECK(bitmap_bins(coded.wire.data(), s.bins).size() == h.count);
    CHECK(coded.report.kept == h.count);
  }
  // Bitmap and index forms decode to the same values.
  std::vector<float> x(512);
  for (float& v : x) v = normal(rng);
  const Coded a = round_trip(parse_codec_spec("fft:theta=0.8,segment=512,index=bitmap"), x);
  const Coded b = round_trip(parse_codec_spec("fft:theta=0.8,segment=512,index=coo"), x);
  CHECK(a.decoded == b.decoded);
  CHECK(a.report.bytes != b.report.bytes);
}

TEST_CASE("fft codec: its stages apart (analyze, select, pack) write fft_encode's bytes", "[fft]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (const char* spec : {"fft:theta=0.9,bits=10,segment=512", "fft:theta=0.97,segment=512,index=coo",
                           "fft:theta=0.5,bits=12,mant=7,max=auto,segment=256", "fft:theta=0,segment=64"}) {
    const CodecConfig c = parse_codec_spec(spec);
    for (size_t count : {size_t{1}, size_t{3 * 512 + 17}}) {
      for (bool poison : {false, true}) {
        INFO(spec << " count=" << count << (poison ? " with a NaN in the second segment" : ""));
        std::vector<float> x(count);
        for (float& v : x) v = normal(rng);
        if (poison && count > c.segment) x[c.segment + 3] = std::numeric_limits<float>::quiet_NaN();
        auto ws = take_fft_workspace();
        std::vector<uint8_t> whole(c.encoded_bytes(count)), staged(whole.size());
        const FftReport a = fft_encode(c, x.data(), count, whole.data(), *ws);

        const size_t floats = fft_spectrum_floats(c, count);
        std::vector<float> spectrum(floats);
        std::vector<uint8_t> kept(floats / 2, 0xEE);
        fft_analyze(c, x.data(), count, spectrum.data(), *ws);
        size_t keep = 0, bins = 0;
        for (size_t at = 0; at < count; at += c.segment) {
          const FftShape shape = fft_shape(c, std::min<size_t>(c.segment, count - at));
          if (!(poison && at == c.segment)) keep += shape.keep;
          bins += shape.bins;
        }
        REQUIRE(bins == kept.size());
        CHECK(fft_select(c, spectrum.data(), count, kept.data(), *ws) == keep);
        size_t marked = 0;
        for (uint8_t k : kept) {
          CHECK((k == 0 || k == 1 || k == kFftNonfiniteSegment));
          marked += k == 1;
        }
        CHECK(marked == keep);
        const FftReport b = fft_pack(c, spectrum.data(), kept.data(), count, staged.data(), *ws);
        CHECK(b.bytes == a.bytes);
        CHECK(b.nonfinite == a.nonfinite);
        CHECK(b.kept == a.kept);
        CHECK(b.clamped == a.clamped);
        CHECK(std::memcmp(staged.data(), whole.data(), a.bytes) == 0);
      }
    }
  }
}

TEST_CASE("fft codec: exactly K bins, ties to the lower bin", "[fft]") {
  // An impulse has a flat spectrum: every bin's magnitude is 1 / sqrt(L), all tied.
  const CodecConfig c = parse_codec_spec("fft:theta=0.75,bits=12,mant=6,segment=256,index=bitmap");
  std::vector<float> x(256, 0.0f);
  x[0] = 1.0f;
  auto ws = take_fft_workspace();
  std::vector<float> spectrum(fft_spectrum_floats(c, 256));
  fft_analyze(c, x.data(), 256, spectrum.data(), *ws);
  for (size_t k = 0; k < 129; ++k) REQUIRE(std::hypot(spectrum[2 * k], spectrum[2 * k + 1]) == spectrum[0]);
  const Coded coded = round_trip(c, x);
  const FftShape s = fft_shape(c, 256);
  REQUIRE(s.keep == 33);
  std::vector<size_t> first(s.keep);
  for (size_t k = 0; k < s.keep; ++k) first[k] = k;
  CHECK(bitmap_bins(coded.wire.data(), s.bins) == first);
  // One bin larger than the rest takes a place; the rest still go to the lowest bins.
  for (size_t i = 0; i < 256; ++i) x[i] = (i == 0 ? 1.0f : 0.0f) + 0.5f * static_cast<float>(std::cos(2 * kPi * 100 * double(i) / 256));
  const Coded peaked = round_trip(c, x);
  const std::vector<size_t> bins = bitmap_bins(peaked.wire.data(), s.bins);
  CHECK(bins.size() == s.keep);
  CHECK(std::find(bins.begin(), bins.end(), size_t{100}) != bins.end());
  // At the default segment, with half the bins kept: 16,385 ties, the lowest.
  const CodecConfig wide = parse_codec_spec("fft:theta=0.5,bits=12,mant=6,segment=65536,index=bitmap");
  std::vector<float> impulse(65536, 0.0f);
  impulse[0] = 1.0f;
  const FftShape wide_shape = fft_shape(wide, 65536);
  REQUIRE(wide_shape.keep == 16385);
  std::vector<size_t> lowest(wide_shape.keep);
  for (size_t k = 0; k < wide_shape.keep; ++k) lowest[k] = k;
  CHECK(bitmap_bins(round_trip(wide, impulse).wire.data(), wide_shape.bins) == lowest);
}

TEST_CASE("fft codec: the FFT library is part of the codec's hash", "[fft]") {
  // KissFFT, FFTW and cuFFT round differently: ranks must not sum each other's spectra, so a build
  // with FFTW, and device calls on cuFFT, hash their fft codecs apart (the frame headers then fail the
  // call as a mismatch), and KissFFT's hash is the canonical text's alone (as before FFTW was an
  // option). Other codecs hash alike whatever the library.
  const CodecConfig c = parse_codec_spec("fft:theta=0.5");
  uint64_t text = 1469598103934665603ull;
  for (unsigned char ch : c.canonical()) text = (text ^ ch) * 1099511628211ull;
  const std::string backend = fft_backend();
  REQUIRE((backend == "kissfft" || backend == "fftw"));
  CHECK((c.hash() == text) == (backend == "kissfft"));
  CHECK(c.hash() == c.hash(fft_backend()));
  CHECK(c.hash("kissfft") == text);
  CHECK(c.hash("fftw") != text);
  CHECK(c.hash("cufft") != text);
  CHECK(c.hash("cufft") != c.hash("fftw"));
  const CodecConfig q8 = parse_codec_spec("q8");
  CHECK(q8.hash() != 0);
  CHECK(q8.hash("cufft") == q8.hash());
}

TEST_CASE("fft codec: the K largest magnitudes of random spectra, as a full sort ranks them", "[fft]") {
  // The encoder's selection (a radix select on the magnitudes' bits) against a sort of (magnitude
  // descending, bin ascending), on spectra of random signals, some with few distinct values; with
  // fewer bins than the select's four-way counting starts at, and more.
  for (size_t segment : {size_t{2048}, size_t{32768}}) {
    const CodecConfig c = parse_codec_spec("fft:theta=0.9,bits=12,mant=6,segment=" + std::to_string(segment) +
                                           ",index=bitmap,max=auto");
    const FftShape s = fft_shape(c, segment);
    std::mt19937 rng(17);
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(segment);
      for (float& v : x)
        v = trial % 2 ? std::uniform_real_distribution<float>(-1, 1)(rng) : 0.5f * static_cast<float>(rng() % 3);
      auto ws = take_fft_workspace();
      std::vector<float> spectrum(fft_spectrum_floats(c, segment));
      fft_analyze(c, x.data(), segment, spectrum.data(), *ws);
      std::vector<size_t> order(s.bins);
      for (size_t k = 0; k < s.bins; ++k) order[k] = k;
      auto magnitude = [&](size_t k) {
        return spectrum[2 * k] * spectrum[2 * k] + spectrum[2 * k + 1] * spectrum[2 * k + 1];
      };
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return magnitude(a) > magnitude(b); });
      std::vector<size_t> expected(order.begin(), order.begin() + static_cast<long>(s.keep));
      std::sort(expected.begin(), expected.end());
      expected.erase(std::remove_if(expected.begin(), expected.end(), [&](size_t k) { return magnitude(k) == 0; }),
                     expected.end());  // a bin of two zero parts is not sent
      const Coded coded = round_trip(c, x);
      INFO(segment << " values, trial " << trial);
      CHECK(bitmap_bins(coded.wire.data(), s.bins) == expected);
    }
  }
}

TEST_CASE("fft codec: Parseval and magnitude selection bound the error, non-expansive, monotone in theta (P1-P4, P16)",
          "[fft]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (size_t length : {size_t{256}, size_t{1000}, size_t{999}}) {
    std::vector<float> x(length);
    for (size_t i = 0; i < length; ++i) x[i] = normal(rng) + 0.1f * static_cast<float>(std::sin(0.05 * double(i)));
    // The codec pads a segment with zeros to its transform's length (999 to 1000): the identities
    // hold for the padded vector, whose error bounds the error on the segment's own values from above.
    std::vector<float> padded = x;
    padded.resize(fft_transform_length(length), 0.0f);
    const std::vector<std::complex<double>> X = dft(padded);
    double previous = std::numeric_limits<double>::infinity();
    for (double theta : {0.95, 0.9, 0.75, 0.5, 0.2, 0.0}) {
      const int mant = 12;
      // max=4: the sine's bins reach 0.1 sqrt(L) / 2 = 1.6 at L = 1000 (the spec's scale hazard).
      const CodecConfig c = parse_codec_spec("fft:theta=" + std::to_string(theta) + ",bits=16,mant=12,max=4,segment=" +
                                             std::to_string(length) + ",index=bitmap");
      INFO("length " << length << " theta " << theta);
      const Coded coded = round_trip(c, x);
      REQUIRE(coded.report.clamped == 0);
      // theta_eff: the dropped share of the full L'-point spectrum (conjugate pairs twice, DC and
      // Nyquist once), read from the bitmap.
      const FftShape s = fft_shape(c, length);
      std::vector<bool> sent(s.bins, false);
      for (size_t k : bitmap_bins(coded.wire.data(), s.bins)) sent[k] = true;
      // The quantization of a sent bin: per part at most 2^-m of it (truncation), or all of it when
      // it is below the range's smallest magnitude (flushed to zero).
      const double eps = range_float_eps(make_range_float(16, mant, 4.0f, false));
      auto part_error = [&](double v) { return std::fabs(v) < eps ? v * v : std::ldexp(v * v, -2 * mant); };
      double dropped_weight = 0, dropped_energy = 0, quantization = 0;
      for (size_t k = 0; k < s.bins; ++k) {
        const double w = (k == 0 || 2 * k == s.fft_length) ? 1 : 2;
        if (!sent[k]) dropped_weight += w, dropped_energy += w * std::norm(X[k]);
        if (sent[k]) quantization += w * (part_error(X[k].real()) + part_error(X[k].imag()));
      }
      const double theta_eff = dropped_weight / double(s.fft_length);
      const double err = distance(x, coded.decoded), nx = norm(x);
      // P1: the error's energy is the dropped bins' plus the sent bins' quantization (orthogonal in
      // the spectrum), up to float32 rounding of the transforms (1e-6 of |x| here).
      CHECK(err <= std::sqrt(dropped_energy + quantization) + 1e-6 * nx);
      if (s.fft_length == length) CHECK(err >= std::sqrt(dropped_energy) - 1e-6 * nx);
      // P3: magnitude selection drops at most theta_eff of the energy (the bins sent are among the K
      // largest; one whose parts both flushed to zero counts as dropped, and is below eps).
      CHECK(dropped_energy <= theta_eff * nx * nx * (1 + 1e-9) + 2 * eps * eps * double(s.bins));
      CHECK(err <= std::sqrt(theta_eff * nx * nx + 2 * eps * eps * double(s.bins) + quantization) + 1e-6 * nx);
      // P16: truncation never grows the vector (P2 plus |q(v)| <= |v|), up to float32 rounding.
      CHECK(norm(coded.decoded) <= nx * (1 + 1e-5));
      // P4: keeping more bins never increases the error (nested kept sets).
      CHECK(err <= previous * (1 + 1e-5) + 1e-7);
      previous = err;
    }
  }
}

TEST_CASE("fft codec: a few cosines are captured where spatial top-k of as many reals is not (P5)", "[fft]") {
  const size_t L = 1024;
  std::vector<float> x(L);
  for (size_t j = 0; j < L; ++j)
    x[j] = static_cast<float>(0.3 + 0.8 * std::cos(2 * kPi * 3 * double(j) / L + 0.4) +
                              0.5 * std::cos(2 * kPi * 17 * double(j) / L + 1.1) +
                              0.2 * std::cos(2 * kPi * 40 * double(j) / L + 2.0));
  // Keep 8 of 513 bins (theta = 0.985): the 4 that carry the signal among them. Magnitudes reach
  // 0.8 sqrt(L) / 2 = 12.8, so max=16; 16 bits with 12 mantissa bits: 2^-12 relative per part.
  const CodecConfig c = parse_codec_spec("fft:theta=0.985,bits=16,mant=12,max=16,segment=1024");
  const FftShape s = fft_shape(c, L);
  REQUIRE(s.keep == 8);
  const Coded coded = round_trip(c, x);
  double fft_max_err = 0, xmax = 0;
  for (size_t j = 0; j < L; ++j) {
    fft_max_err = std::max(fft_max_err, std::fabs(double(coded.decoded[j]) - x[j]));
    xmax = std::max(xmax, std::fabs(double(x[j])));
  }
  CHECK(fft_max_err <= 2e-3 * xmax);  // quantization-limited: 4 bins of 2^-12 relative error each
  // Spatial top-k sending as many reals (2 K): the 16 largest |x_j|, the rest zero.
  std::vector<size_t> order(L);
  for (size_t j = 0; j < L; ++j) order[j] = j;
  std::partial_sort(order.begin(), order.begin() + 2 * s.keep, order.end(),
                    [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  std::vector<float> spatial(L, 0.0f);
  for (size_t j = 0; j < 2 * s.keep; ++j) spatial[order[j]] = x[order[j]];
  CHECK(distance(x, coded.decoded) * 50 < distance(x, spatial));

  // White noise: no advantage is claimed (a unitary transform keeps it white); both only run.
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng) * 0.1f;
  const Coded noise = round_trip(parse_codec_spec("fft:theta=0.9,bits=12,mant=6,segment=1024"), x);
  CHECK(distance(x, noise.decoded) < norm(x));
}

TEST_CASE("fft codec: NaN or Inf poisons its segment only, counted; malformed payloads decode to NaN", "[fft]") {
  const CodecConfig c = parse_codec_spec("fft:theta=0.5,segment=100");
  std::vector<float> x(350);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.1 * double(i))) * 0.5f;
  x[150] = std::numeric_limits<float>::quiet_NaN();
  x[320] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> wire(c.encoded_bytes(x.size()));
  auto ws = take_fft_workspace();
  const FftReport report = fft_encode(c, x.data(), x.size(), wire.data(), *ws);
  CHECK(report.nonfinite == 150);  // segments 1 (100 values) and 3 (the tail of 50)
  std::vector<float> out(x.size(), 1.0f);
  CHECK(fft_decode(c, wire.data(), report.bytes, x.size(), out.data(), true, *ws) == 150);
  for (size_t i = 0; i < x.size(); ++i) {
    INFO(i);
    const bool poisoned = (i >= 100 && i < 200) || i >= 300;
    CHECK(std::isnan(out[i]) == poisoned);
  }
  // The clean segments are what they are alone, added onto the 1s.
  for (size_t at : {size_t{0}, size_t{200}}) {
    const Coded alone = round_trip(c, std::vector<float>(x.begin() + static_cast<long>(at), x.begin() + static_cast<long>(at) + 100));
    for (size_t i = 0; i < 100; ++i) CHECK(out[at + i] == 1.0f + alone.decoded[i]);
  }

  // Malformed: another codec's hash, a count above K, a truncated payload, a wrong length.
  std::vector<float> y(100, 0.25f);
  for (size_t i = 0; i < y.size(); ++i) y[i] += 0.1f * static_cast<float>(i % 7);
  std::vector<uint8_t> good(c.encoded_bytes(100));
  const size_t bytes = fft_encode(c, y.data(), 100, good.data(), *ws).bytes;
  auto decodes_to_nan = [&](std::vector<uint8_t> w, size_t b, size_t count) {
    std::vector<float> o(count, 0.0f);
    const size_t bad = fft_decode(c, w.data(), b, count, o.data(), false, *ws);
    return bad == count && std::all_of(o.begin(), o.end(), [](float v) { return std::isnan(v); });
  };
  CHECK_FALSE(decodes_to_nan(good, bytes, 100));
  auto corrupt = good;
  corrupt[12] ^= 1;  // hash
  CHECK(decodes_to_nan(corrupt, bytes, 100));
  corrupt = good;
  const uint32_t too_many = 200;
  std::memcpy(corrupt.data() + 8, &too_many, 4);
  CHECK(decodes_to_nan(corrupt, bytes, 100));
  CHECK(decodes_to_nan(good, bytes - 1, 100));
  CHECK(decodes_to_nan(good, bytes, 99));

  // Malformed bin lists. A bitmap of 151 bins (19 bytes, read 64 bits at a time, the last word
  // partly): a bit set that the count does not cover, one cleared, one in the padding past bin 150;
  // an index list out of order or past the last bin.
  const CodecConfig b = parse_codec_spec("fft:theta=0.5,segment=300,index=bitmap");
  const CodecConfig l = parse_codec_spec("fft:theta=0.5,segment=300,index=coo");
  std::vector<float> z(300);
  for (size_t i = 0; i < z.size(); ++i)
    z[i] = static_cast<float>(std::sin(0.05 * double(i)) + 0.3 * std::cos(0.9 * double(i)));
  auto bad_list = [&](const CodecConfig& codec, const std::function<void(std::vector<uint8_t>&, uint32_t)>& mutate) {
    std::vector<uint8_t> w(codec.encoded_bytes(z.size()));
    const size_t n = fft_encode(codec, z.data(), z.size(), w.data(), *ws).bytes;
    uint32_t sent = 0;
    std::memcpy(&sent, &w[8], 4);
    std::vector<float> o(z.size(), 0.0f);
    const bool before = fft_decode(codec, w.data(), n, z.size(), o.data(), false, *ws) == 0;
    mutate(w, sent);
    const bool after = fft_decode(codec, w.data(), n, z.size(), o.data(), false, *ws) == z.size() &&
                       std::all_of(o.begin(), o.end(), [](float v) { return std::isnan(v); });
    return before && after;
  };
  const size_t map = kFftHeaderBytes;  // the bitmap follows the header
  CHECK(bad_list(b, [&](std::vector<uint8_t>& w, uint32_t) {
    for (size_t k = 0; k < 151; ++k)  // the first bin not sent, now set
      if (!(w[map + k / 8] >> (k % 8) & 1)) return void(w[map + k / 8] |= static_cast<uint8_t>(1u << (k % 8)));
  }));
  CHECK(bad_list(b, [&](std::vector<uint8_t>& w, uint32_t) {
    for (size_t k = 151; k-- > 0;)  // the last bin sent, now cleared
      if (w[map + k / 8] >> (k % 8) & 1) return void(w[map + k / 8] &= static_cast<uint8_t>(~(1u << (k % 8))));
  }));
  CHECK(bad_list(b, [&](std::vector<uint8_t>& w, uint32_t) { w[map + 18] |= 0x80; }));  // bit 151: padding
  CHECK(bad_list(l, [&](std::vector<uint8_t>& w, uint32_t) { std::memcpy(&w[map + 4], &w[map], 4); }));
  CHECK(bad_list(l, [&](std::vector<uint8_t>& w, uint32_t sent) {
    const uint32_t past = 151;
    std::memcpy(&w[map + 4 * (sent - 1)], &past, 4);
  }));
}

TEST_CASE("fft codec: parts beyond the range are clamped to its largest magnitude and counted", "[fft]") {
  // A constant 1 over 400 values: the DC bin is sqrt(400) = 20 (orthonormal), beyond max=1.
  const CodecConfig c = parse_codec_spec("fft:theta=0.9,segment=400");
  const Coded coded = round_trip(c, std::vector<float>(400, 1.0f));
  CHECK(coded.report.clamped == 1);
  for (float v : coded.decoded) CHECK(v == Approx(1.0f / 20).epsilon(1e-5));  // max / sqrt(L)
  const Coded roomy = round_trip(parse_codec_spec("fft:theta=0.9,segment=400,max=32"), std::vector<float>(400, 1.0f));
  CHECK(roomy.report.clamped == 0);
}

TEST_CASE("fft codec: max=auto scales each segment by a power of two: nothing clamps, scale-equivariant bits",
          "[fft]") {
  const CodecConfig c = parse_codec_spec("fft:theta=0.8,max=auto,segment=400");
  CHECK(c.canonical() == "fft:theta=0.8,bits=10,mant=6,max=auto,segment=400,index=auto,round=trunc,ef=off,fallback=auto");
  CHECK(c.hash() != parse_codec_spec("fft:theta=0.8,segment=400").hash());
  // The constant that clamped at max=1 above: its DC bin (20) is sent within 2^-6 below.
  const Coded ones = round_trip(c, std::vector<float>(400, 1.0f));
  CHECK(ones.report.clamped == 0);
  for (float v : ones.decoded) CHECK((v <= 1.0f + 1e-6f && v >= 1.0f - 0x1p-6f - 1e-6f));
  // x scaled by 2^k decodes to decode(x) scaled by 2^k, bit for bit (a power of two commutes with the
  // transforms and moves only the header's exponent), from 2^-90 to 2^90: there |X|^2 is beyond
  // float32 (2^-180 was 0, every bin a tie; 2^184 was Inf, the segment sent as NaN), and the bins are
  // ranked by magnitudes scaled by a power of two (rfloat.h's magnitude_scale).
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(1000);
  for (float& v : x) v = normal(rng);
  const Coded base = round_trip(c, x);
  for (int k : {-90, -60, -7, 1, 9, 60, 90}) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = std::ldexp(x[i], k);
    const Coded scaled = round_trip(c, y);
    size_t wrong = 0;
    for (size_t i = 0; i < x.size(); ++i) wrong += scaled.decoded[i] != std::ldexp(base.decoded[i], k);
    INFO("2^" << k);
    CHECK(wrong == 0);
    CHECK(scaled.report.bytes == base.report.bytes);
  }
  // One bin sent of a cosine at bin 5 over a small one at bin 9: bin 5 at every scale (at 2^-90 every
  // |X|^2 was 0 and bin 0 was sent; at 2^90 the segment was sent as NaN), and decoded as at 2^0 up
  // to the scale, to the ends of the header's exponent. Bin 5's part is 3 (e = 2): 2^122 makes it
  // 1.5 2^123 (e = 124; the largest for L' = 64 is 125, but at 2^123 KissFFT's steps overflow and the
  // segment is sent as non-finite), 2^-129 makes it 1.5 2^-128 (a subnormal, e = -127), and 2^-135
  // smaller than e = -127 scales up to 2^-1. There
  // e was clamped to +-100: the part clamped to 2^100, or underflowed and nothing was sent. Inputs at
  // 2^-129 and below are subnormal, held to 13 bits or more: far within the 6-bit mantissa.
  // codec_cuda_test's twin checks the device.
  const CodecConfig one = parse_codec_spec("fft:theta=0.99,bits=10,segment=64,max=auto,index=coo");
  REQUIRE(fft_shape(one, 64).keep == 1);
  REQUIRE(fft_largest_auto_exponent(0.125f) == 125);
  auto wave_ws = take_fft_workspace();
  std::vector<float> unscaled;  // the decode at 2^0
  for (int k : {0, -90, 90, 122, -129, -135}) {
    std::vector<float> wave(64);
    for (size_t i = 0; i < wave.size(); ++i) {
      const float t = static_cast<float>(i) / 64.0f;
      wave[i] = std::ldexp(0.75f * std::cos(6.2831853f * 5.0f * t) + 0.01f * std::cos(6.2831853f * 9.0f * t), k);
    }
    std::vector<uint8_t> run(one.encoded_bytes(wave.size()));
    const FftReport report = fft_encode(one, wave.data(), wave.size(), run.data(), *wave_ws);
    INFO("2^" << k);
    CHECK(report.nonfinite == 0);
    CHECK(report.clamped == 0);
    CHECK(header_at(run.data()).count == 1);
    uint32_t bin = 0;  // the index list's one entry, after the header
    std::memcpy(&bin, &run[kFftHeaderBytes], 4);
    CHECK(bin == 5);
    std::vector<float> decoded(wave.size());
    CHECK(fft_decode(one, run.data(), report.bytes, wave.size(), decoded.data(), false, *wave_ws) == 0);
    if (k == 0) unscaled = decoded;
    size_t wrong = 0;
    for (size_t i = 0; i < wave.size(); ++i)
      wrong += !(std::fabs(std::ldexp(double(decoded[i]), -k) - unscaled[i]) <= 0x1p-5);  // |unscaled| < 0.77
    CHECK(wrong == 0);
  }
  // A fixed range's payload never carries an exponent: one that does is malformed there.
  const CodecConfig fixed = parse_codec_spec("fft:theta=0.8,segment=400");
  auto ws = take_fft_workspace();
  std::vector<uint8_t> wire(fixed.encoded_bytes(400));
  const size_t bytes = fft_encode(fixed, x.data(), 400, wire.data(), *ws).bytes;
  wire[3] = 1;  // the flags' high byte
  std::vector<float> out(400);
  CHECK(fft_decode(fixed, wire.data(), bytes, 400, out.data(), false, *ws) == 400);
  // Nor does max=auto's carry one its encoder never writes: above what a segment of finite unscaled
  // bins reaches (FLT_MAX / sqrt(L') ~ 2^123.7 for L' = 400: e = 124), or below -127 (2^127 does not
  // scale a part up in float32). Such a payload decoded its bins to up to 2^127, its segment to Inf,
  // and reported nothing.
  REQUIRE(fft_largest_auto_exponent(1.0f / 20) == 124);
  std::vector<uint8_t> autowire(c.encoded_bytes(400));
  const size_t autobytes = fft_encode(c, x.data(), 400, autowire.data(), *ws).bytes;
  CHECK(fft_decode(c, autowire.data(), autobytes, 400, out.data(), false, *ws) == 0);
  std::vector<float> spectrum(fft_spectrum_floats(c, 400));
  for (int e : {125, 127, -128}) {
    INFO("e = " << e);
    auto hostile = autowire;
    hostile[3] = static_cast<uint8_t>(static_cast<int8_t>(e));
    CHECK(fft_decode(c, hostile.data(), autobytes, 400, out.data(), false, *ws) == 400);
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); }));
    CHECK(fft_decode_spectrum(c, hostile.data(), autobytes, 400, spectrum.data(), false, *ws) == 400);
  }
}

TEST_CASE("fft codec: odd segments and tails, zero counts, whole-buffer API", "[fft]") {
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (const char* spec : {"fft:theta=0.3,segment=7,bits=14,mant=10", "fft:theta=0.3,segment=64,bits=14,mant=10"})
    for (size_t count : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{64}, size_t{65}, size_t{200}}) {
      const CodecConfig c = parse_codec_spec(spec);
      INFO(spec << " count " << count);
      std::vector<float> x(count);
      for (float& v : x) v = normal(rng);
      const Coded coded = round_trip(c, x);
      CHECK(distance(x, coded.decoded) <= 0.9 * norm(x) + 1e-7);
      // The generic entry points (codec.h) run the same code.
      std::vector<uint8_t> wire(c.encoded_bytes(count));
      const EncodeReport report = encode(c, x.data(), count, wire.data(), PhiloxKey{}, 0);
      CHECK(report.bytes == coded.report.bytes);
      CHECK(std::equal(wire.begin(), wire.begin() + static_cast<long>(report.bytes), coded.wire.begin()));
      std::vector<float> out(count, 0.0f);
      CHECK(decode(c, wire.data(), count, out.data()) == 0);
      CHECK(out == coded.decoded);
    }
  const CodecConfig c = parse_codec_spec("fft");
  CHECK(c.encoded_bytes(0) == 0);
  CHECK(encode(c, nullptr, 0, nullptr, PhiloxKey{}, 0).bytes == 0);
}

TEST_CASE("fft codec: a segment's transform length is the smallest even 2-3-5 length at or above it", "[fft]") {
  auto smooth_even = [](size_t n) {
    if (n % 2) return false;
    for (size_t p : {2, 3, 5})
      while (n % p == 0) n /= p;
    return n == 1;
  };
  size_t expected = 2;
  for (size_t length = 1; length <= 20000; ++length) {
    while (expected < length || !smooth_even(expected)) ++expected;
    INFO("length " << length);
    REQUIRE(fft_transform_length(length) == expected);
    if (length >= 1000) CHECK(expected <= length * 1.067);  // the padding's bins: a few percent at most
  }
  CHECK(fft_transform_length(size_t{1} << 20) == size_t{1} << 20);  // powers of two keep their length
  // A tail whose length has a large prime factor (2 x 3 x 25,943) is transformed at 2 x 5^7.
  const CodecConfig c = parse_codec_spec("fft:segment=262144");
  CHECK(fft_shape(c, 155658).fft_length == 156250);
  CHECK(fft_shape(c, 155658).bins == 78126);
}

TEST_CASE("fft codec: spectra add before one inverse transform as the transforms add after (P6)", "[fft]") {
  const CodecConfig c = parse_codec_spec("fft:theta=0.6,bits=12,mant=6,max=16,segment=300");
  const size_t count = 777;  // segments of 300, 300, 177 (transformed at 180)
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 0.4f);
  auto ws = take_fft_workspace();
  std::vector<float> spatial(count, 0.0f), spectrum(fft_spectrum_floats(c, count)), one(count), via(count);
  CHECK(spectrum.size() == 2 * (151 + 151 + 91));
  double scale = 0;
  for (int r = 0; r < 4; ++r) {
    std::vector<float> x(count);
    for (float& v : x) v = normal(rng);
    std::vector<uint8_t> wire(c.encoded_bytes(count));
    const size_t bytes = fft_encode(c, x.data(), count, wire.data(), *ws).bytes;
    fft_decode(c, wire.data(), bytes, count, spatial.data(), r > 0, *ws);
    CHECK(fft_decode_spectrum(c, wire.data(), bytes, count, spectrum.data(), r > 0, *ws) == 0);
    // One payload: the spectrum path gives the direct decode's bits.
    std::vector<float> alone(fft_spectrum_floats(c, count));
    fft_decode_spectrum(c, wire.data(), bytes, count, alone.data(), false, *ws);
    fft_synthesize(c, alone.data(), count, via.data(), *ws);
    fft_decode(c, wire.data(), bytes, count, one.data(), false, *ws);
    CHECK(via == one);
    scale += norm(x);
  }
  fft_synthesize(c, spectrum.data(), count, via.data(), *ws);
  CHECK(distance(via, spatial) <= 1e-6 * scale);
  CHECK(distance(via, spatial) > 0);  // float32 rounding differs: two orders of addition
}

TEST_CASE("fft codec: Eq. 4's break-even compression ratio (P17)", "[fft]") {
  // 1 / (1 - 2 T_comm (2/T_m + 1/T_f + 1/T_p + 1/T_s)): with every rate 100 and T_comm 1, 1 / 0.9.
  CHECK(fft_break_even_ratio(1, 100, 100, 100, 100) == Approx(1 / 0.9));
  // A link as fast as the codec: never pays.
  CHECK(std::isinf(fft_break_even_ratio(1, 8, 8, 8, 8)));
  CHECK(std::isinf(fft_break_even_ratio(1, 10, 10, 10, 10)));  // denominator exactly 0
  // The spec's reading of the paper: k ~ 30 at 7 GB/s implies S ~ 1 / 14.5 GB/s, and k ~ 1.2 at 10 GbE.
  const double rate = 14.5e9 * 5;  // five equal terms (2/T_m counts twice) summing to 1 / 14.5 GB/s
  CHECK(fft_break_even_ratio(7e9, rate, rate, rate, rate) == Approx(30).epsilon(0.05));
  CHECK(fft_break_even_ratio(1.25e9, rate, rate, rate, rate) == Approx(1.21).epsilon(0.02));
}

TEST_CASE("fft codec: whether it pays at a link rate, from its measured cost (Eq. 4)", "[fft]") {
  const CodecConfig c = parse_codec_spec("fft:theta=0.9,bits=10");
  const size_t n = 65536;
  const double k = 4.0 * n / static_cast<double>(c.encoded_bytes(n));  // float32: ~21.3
  // k > 1 / (1 - rate * seconds_per_value / 4): the largest rate at which it pays, for 8 ns a value.
  const double limit = (1 - 1 / k) / (8e-9 / 4);
  CHECK(fft_pays_at_rate(c, n, 4, 0.99 * limit, 8e-9));
  CHECK_FALSE(fft_pays_at_rate(c, n, 4, 1.01 * limit, 8e-9));
  CHECK_FALSE(fft_pays_at_rate(c, n, 4, 4 / 8e-9, 8e-9));  // the codec as slow as the link: never
  CHECK_FALSE(fft_pays_at_rate(c, n, 4, 1e12, 8e-9));
  // float16 values: half the bytes on the wire for the same codec time per value, and half the
  // ratio k: the limit is (1 - 2/k) / (1 - 1/k) / 2 ~ 0.4753 of float32's.
  CHECK(fft_pays_at_rate(c, n, 2, 0.47 * limit, 8e-9));
  CHECK_FALSE(fft_pays_at_rate(c, n, 2, 0.48 * limit, 8e-9));
}

}  // namespace qccl::kernels
