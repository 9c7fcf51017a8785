// codec_perf: codec throughput in GB/s of float32 input, next to a copy of the same bytes measured in
// the same run: the host launchers (kernels/codec.h) on one thread, or with --device the CUDA
// launchers (kernels/codec_cuda.h) on GPU 0. A kernel microbenchmark: it links qccl_kernels (and
// qccl_kernels_cuda where the toolkit is found) directly rather than the public API. docs/PERF.md
// "Codec throughput (host)" and "Codec throughput (device)" are made from its output.
#include <getopt.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec_list.h"
#include "kernels/aq_delta.h"
#include "kernels/codec.h"
#include "kernels/convert.h"
#include "kernels/fft_sparse.h"
#include "kernels/marsit.h"
#include "kernels/reduce.h"
#include "kernels/sign.h"
#if QCCL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/codec_cuda.h"
#include "kernels/fft_cuda.h"
#endif

namespace {

using qccl::kernels::CodecConfig;

constexpr const char kHelp[] = R"HELP(NAME
    codec_perf - throughput of qccl's codecs (encode, decode, decode_accumulate) next to a copy, on
    the host or on a CUDA device

SYNOPSIS
    codec_perf [-b SIZE] [-e SIZE] [-f N] [-n N] [-w N] [--codec SPEC[,SPEC...]] [--device]

DESCRIPTION
    For every codec and every size from -b to -e, times the three host launchers of kernels/codec.h
    on one thread, and memcpy of the same float32 input in the same repetitions:

      memcpy   memcpy(dst, in, SIZE)
      encode   encode(codec, in, SIZE / 4 values) into the wire buffer
      decode   decode(codec, wire, SIZE / 4 values) into a float32 buffer
      dec+acc  decode_accumulate(codec, wire, SIZE / 4 values) into a float32 accumulator

    For Marsit's sign codec (sign:eta_s=E) the columns time its hot path instead: encode is
    pack_signs of w = u + c (which also leaves w in the compensation and copies the old values to a
    backup, 64 Ki values at a time as a collective's 256 KiB chunks do) followed by the merge of a
    ring hop (k = 3) with a received word of random bits; decode is decode_signs, which writes g and
    records the round's words in the compensation (c = w - g); dec+acc is "-".

    The fft codec's columns are its whole launchers (encode: transform, selection, range floats and
    packing; decode: unpacking and one inverse transform per segment), and a line below each row
    times its stages apart, each on the output of the one before: the encode's forward transform
    (fft_analyze), selection of the K bins of largest magnitude (fft_select) and range floats with
    packing (fft_pack), and the decode's unpacking into a spectrum (fft_decode_spectrum) and
    inverse transform (fft_synthesize).

    For AQ-SGD's aq codecs a line below each row times its delta messages (kernels/aq_delta.h) with
    a float16 store: send is the sender's work (encode x - m, m += the decoded delta), receive the
    receiver's (x = m + the decoded delta, m = x), in GB/s of float32 input.

    IntSGD's codecs (int8, int16, int32) are timed as one rank's: encode is Int(alpha x) under the
    spec's fixed alpha (1 when adaptive) over the whole wire range, decode is m / alpha (the
    collectives pass the shared alpha and divide by n alpha; the work per value is the same).

    Every rate is in GB/s (1e9 bytes/s) of float32 input, SIZE / time, whatever the codec reads and
    writes, so the columns compare directly; "/mcp" is that rate divided by memcpy's. Each rate is the
    median of -n repetitions; in each repetition the four operations run one after the other, so the
    noise of a shared machine hits them alike. A repetition repeats its operation until it has
    moved at least 64 MiB of input (one call at 64 MiB and above), so that small sizes are timed
    over milliseconds: those sizes stay in the caches between calls and measure cache bandwidth.

    The input is Gaussian (seed 1); stochastic rounding uses a fixed Philox key. Buffers are
    allocated once, at -e, and written before timing so that no page fault is timed. The Highway
    target the launchers dispatch to is printed in the header.

    With --device the same table times the CUDA launchers of kernels/codec_cuda.h on GPU 0, all on
    one stream, with CUDA events around each repetition: memcpy is cudaMemcpyAsync device to device,
    and a repetition repeats its launch until it has moved at least 1 GiB of input, so that the
    launch latency of small sizes shows as the rate it limits. The sign codec's encode packs the
    whole tensor in one launch (a backup of every value) and merges it. The fft codec's encode is
    fft_encode_cuda (kernels/fft_cuda.h: cuFFT's transforms, the selection, range floats and
    packing) and its decode fft_decode_spectrum_cuda then fft_synthesize_cuda; its dec+acc is "-".
    The header names the device, its multiprocessors and memory. A build without the CUDA toolkit
    takes --device and exits 77.

OPTIONS
    SIZE is a number of bytes of float32 input, a multiple of 4, with an optional K, M or G suffix
    (powers of 1024).

    -b, --minbytes SIZE      smallest size (default 64K)
    -e, --maxbytes SIZE      largest size (default 64M)
    -f, --stepfactor N       multiply the size by N from row to row (default 4)
    -n, --iters N            timed repetitions per cell; the median is printed (default 10)
    -w, --warmup_iters N     untimed repetitions per cell before the timed ones (default 1)
        --codec LIST         codec specs separated by commas (default: none, fp16, bf16, and q8, q4,
                             q2, q1 each with round=nearest and round=stochastic). A piece of the
                             list that is key=value (no ':' before its '=') continues the spec
                             before it, so "q8:bucket=1024,round=stochastic,q4" is two specs and
                             "sign:eta_s=0.1,topology=torus:2x2" one. May be repeated. ef=on is
                             refused: error feedback lives in the collectives, not in the
                             launchers timed here.
        --device             time the CUDA launchers on GPU 0 instead of the host's (see above)
    -h, --help               print this page and exit

OUTPUT
    A header (target, repetitions), then per codec a line "# codec SPEC (B bits per value on the
    wire)" and one row per size:

    size       bytes of float32 input
    count      values (size / 4)
    wire       encoded_bytes(count)
    memcpy     GB/s of memcpy of size bytes (--device: cudaMemcpyAsync device to device)
    encode, decode, dec+acc
               GB/s of float32 input, each followed by its ratio to memcpy (/mcp)

EXIT STATUS
    0  success
    1  a codec reported a wrong non-finite count on finite input (a bug), or a CUDA call failed
       (the message names the call and the error)
    2  a bad command line (the message names the option and the value)
    77 --device, and no CUDA device is usable (or the build has no CUDA launchers)

EXAMPLES
    codec_perf
        every default codec, 64K to 64M
    codec_perf -b 64M -e 64M -n 20 --codec q8,q8:round=stochastic
        q8 at one size, 20 repetitions
    taskset -c 1 codec_perf --codec q4:bucket=1024
        pinned to one core
    codec_perf --device -b 64K -e 1G -f 16
        every default codec on GPU 0, 64K to 1G
)HELP";

struct Options {
  size_t min_bytes = 64 << 10, max_bytes = 64 << 20;
  long step_factor = 4;
  int iters = 10, warmup = 1;
  bool device = false;
  std::vector<std::string> codecs;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void bad_value(const char* option, const char* value, const std::string& why) {
  throw UsageError(std::string("invalid value '") + value + "' for " + option + ": " + why);
}

long parse_int(const char* option, const char* s, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (errno || end == s || *end) bad_value(option, s, "not an integer");
  if (v < lo || v > hi) bad_value(option, s, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

size_t parse_size(const char* option, const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || !(v > 0)) bad_value(option, s, "not a positive size");
  switch (*end) {
    case 'k':
    case 'K':
      v *= 1024.0, ++end;
      break;
    case 'm':
    case 'M':
      v *= 1024.0 * 1024, ++end;
      break;
    case 'g':
    case 'G':
      v *= 1024.0 * 1024 * 1024, ++end;
      break;
    default:
      break;
  }
  if (*end) bad_value(option, s, "expected a number of bytes with an optional K, M or G suffix");
  if (v > 16.0 * (1ull << 30)) bad_value(option, s, "larger than 16G");
  const auto bytes = static_cast<size_t>(v);
  if (bytes % 4) bad_value(option, s, "not a multiple of 4 bytes (float32 values)");
  return bytes;
}

// Splits "q8:bucket=1024,round=stochastic,q4" into its specs (codec_list.h) and checks each one.
void add_codecs(const char* list, std::vector<std::string>* codecs) {
  const std::vector<std::string> specs = qccl_perf::split_codec_list(list);
  for (const std::string& s : specs) {
    CodecConfig config;
    try {
      config = qccl::kernels::parse_codec_spec(s);
    } catch (const qccl::kernels::CodecSpecError& e) {
      bad_value("--codec", list, e.what());
    }
    // Error feedback is the collective's (it adds the residual before encoding and keeps the new
    // one), not the launchers': timed here, ef=on would read as its cost included.
    if (config.error_feedback) {
      const std::string why = "error feedback lives in the collectives, not in the launchers timed here";
      bad_value("--codec", list, "'" + s + "': ef=on is not timed by codec_perf (" + why + "); drop ef=on");
    }
    codecs->push_back(s);
  }
}

// Returns false when --help was printed.
bool parse_options(int argc, char** argv, Options* o) {
  enum { kCodec = 256, kDevice };
  static const option kLong[] = {{"minbytes", required_argument, nullptr, 'b'},
                                 {"maxbytes", required_argument, nullptr, 'e'},
                                 {"stepfactor", required_argument, nullptr, 'f'},
                                 {"iters", required_argument, nullptr, 'n'},
                                 {"warmup_iters", required_argument, nullptr, 'w'},
                                 {"codec", required_argument, nullptr, kCodec},
                                 {"device", no_argument, nullptr, kDevice},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":b:e:f:n:w:h", kLong, nullptr)) != -1) {
    switch (c) {
      case 'b':
        o->min_bytes = parse_size("-b/--minbytes", optarg);
        break;
      case 'e':
        o->max_bytes = parse_size("-e/--maxbytes", optarg);
        break;
      case 'f':
        o->step_factor = parse_int("-f/--stepfactor", optarg, 2, 1 << 20);
        break;
      case 'n':
        o->iters = static_cast<int>(parse_int("-n/--iters", optarg, 1, 1 << 20));
        break;
      case 'w':
        o->warmup = static_cast<int>(parse_int("-w/--warmup_iters", optarg, 0, 1 << 20));
        break;
      case kCodec:
        add_codecs(optarg, &o->codecs);
        break;
      case kDevice:
        o->device = true;
        break;
      case 'h':
        std::fputs(kHelp, stdout);
        return false;
      case ':':
        throw UsageError(std::string("option ") + argv[optind - 1] + " needs a value");
      default:
        throw UsageError(std::string("unknown option ") + argv[optind - 1] + " (see --help)");
    }
  }
  if (optind < argc) throw UsageError(std::string("unexpected argument '") + argv[optind] + "' (see --help)");
  if (o->min_bytes > o->max_bytes) throw UsageError("-b/--minbytes is larger than -e/--maxbytes");
  if (o->codecs.empty()) {
    o->codecs = {"none", "fp16", "bf16"};
    for (const char* q : {"q8", "q4", "q2", "q1"}) {
      o->codecs.push_back(q);
      o->codecs.push_back(std::string(q) + ":round=stochastic");
    }
  }
  return true;
}

// ---- Timing -------------------------------------------------------------------------------------------

double seconds_of(const std::chrono::steady_clock::duration& d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct Buffers {
  std::vector<float> in, out, acc, copy;
  std::vector<uint8_t> wire;
  std::vector<uint32_t> incoming;  // sign: the bits a ring hop receives
  std::vector<uint32_t> pending_words;  // sign: the compensation's pending round (acc: its stored values)
  std::vector<float> pending_eta, backup;
};

// Medians in GB/s of float32 input: memcpy, encode, decode, decode_accumulate.
struct Row {
  double gbps[4] = {0, 0, 0, 0};
  bool accumulates = true;  // else dec+acc is "-" (the sign codec; the fft codec on the device)
  bool nonfinite_seen = false;
  std::string missing;  // why the codec cannot be measured here (no row is printed), or empty
};

Row measure(const CodecConfig& codec, size_t bytes, const Options& o, Buffers* b) {
  const size_t count = bytes / 4;
  const size_t calls = std::max<size_t>(1, (size_t{64} << 20) / bytes);
  const qccl::kernels::PhiloxKey key;
  Row row;
  const bool sign = codec.kind == qccl::kernels::CodecKind::kSign;
  auto* words = reinterpret_cast<uint32_t*>(b->wire.data());
  const qccl::kernels::Compensation c{b->acc.data(), b->pending_words.data(), b->pending_eta.data()};
  auto op = [&](int which) {
    if (sign) {  // Marsit's hot path: signs of u + c, the merge of a hop; the decode recording the round
      switch (which) {
        case 0: std::memcpy(b->copy.data(), b->in.data(), bytes); break;
        case 1:
          for (size_t first = 0; first < count; first += b->backup.size()) {
            const size_t n = std::min(b->backup.size(), count - first);
            row.nonfinite_seen |= qccl::kernels::pack_signs(b->in.data() + first, &c, first, n, words + first / 32,
                                                            b->backup.data()) != 0;
          }
          qccl::kernels::merge_signs(b->incoming.data(), words, words, qccl::kernels::sign_words(count), 3, key, 0);
          break;
        case 2: qccl::kernels::decode_signs(words, count, codec.eta, b->out.data(), &c, 0); break;
        default: break;
      }
      return;
    }
    switch (which) {
      case 0:
        std::memcpy(b->copy.data(), b->in.data(), bytes);
        break;
      case 1:
        row.nonfinite_seen |= encode(codec, b->in.data(), count, b->wire.data(), key, 0).nonfinite != 0;
        break;
      case 2:
        row.nonfinite_seen |= decode(codec, b->wire.data(), count, b->out.data()) != 0;
        break;
      default:
        decode_accumulate(codec, b->wire.data(), count, b->acc.data());
        break;
    }
  };
  std::vector<double> rates[4];
  for (int rep = -o.warmup; rep < o.iters; ++rep) {
    for (int which = 0; which < 4; ++which) {
      const auto start = std::chrono::steady_clock::now();
      for (size_t i = 0; i < calls; ++i) op(which);
      const double t = seconds_of(std::chrono::steady_clock::now() - start);
      if (rep >= 0) rates[which].push_back(static_cast<double>(bytes) * calls / t / 1e9);
    }
    // Keep the accumulator (the sign codec's compensation) bounded, untimed, so that it never
    // overflows to Inf.
    std::fill(b->acc.begin(), b->acc.begin() + count, 0.0f);
    std::fill(b->pending_eta.begin(), b->pending_eta.end(), 0.0f);
  }
  for (int which = 0; which < 4; ++which) row.gbps[which] = median(rates[which]);
  return row;
}

// The fft codec's stages, medians in GB/s of float32 input: the encode's forward transform,
// selection and range floats with packing (each on the stage before's output), the decode's
// unpacking into a spectrum and inverse transform (the wire buffer holds the encode's output).
struct Stages {
  double gbps[5];
};
Stages measure_fft_stages(const CodecConfig& codec, size_t bytes, const Options& o, Buffers* b) {
  const size_t count = bytes / 4, calls = std::max<size_t>(1, (size_t{64} << 20) / bytes);
  auto ws = qccl::kernels::take_fft_workspace();
  const size_t floats = qccl::kernels::fft_spectrum_floats(codec, count);
  std::vector<float> spectrum(floats), unpacked(floats);
  std::vector<uint8_t> kept(floats / 2), packed(codec.encoded_bytes(count));
  const size_t wire = encode(codec, b->in.data(), count, b->wire.data(), qccl::kernels::PhiloxKey{}, 0).bytes;
  std::vector<double> rates[5];
  for (int rep = -o.warmup; rep < o.iters; ++rep)
    for (int which = 0; which < 5; ++which) {
      const auto start = std::chrono::steady_clock::now();
      for (size_t i = 0; i < calls; ++i) {
        if (which == 0) qccl::kernels::fft_analyze(codec, b->in.data(), count, spectrum.data(), *ws);
        if (which == 1) qccl::kernels::fft_select(codec, spectrum.data(), count, kept.data(), *ws);
        if (which == 2) qccl::kernels::fft_pack(codec, spectrum.data(), kept.data(), count, packed.data(), *ws);
        if (which == 3)
          qccl::kernels::fft_decode_spectrum(codec, b->wire.data(), wire, count, unpacked.data(), false, *ws);
        if (which == 4) qccl::kernels::fft_synthesize(codec, unpacked.data(), count, b->out.data(), *ws);
      }
      const double t = seconds_of(std::chrono::steady_clock::now() - start);
      if (rep >= 0) rates[which].push_back(static_cast<double>(bytes) * calls / t / 1e9);
    }
  Stages s;
  for (int which = 0; which < 5; ++which) s.gbps[which] = median(rates[which]);
  return s;
}

// The table of OUTPUT: per codec a header and one row per size, measured by measure(codec, bytes);
// after_row prints what a row has below it. Returns the exit status.
int print_table(const Options& o, const std::function<Row(const CodecConfig&, size_t)>& measure,
                const std::function<void(const CodecConfig&, size_t, const Row&)>& after_row) {
  const size_t max_count = o.max_bytes / 4;
  int status = 0;
  for (const std::string& s : o.codecs) {
    const CodecConfig codec = qccl::kernels::parse_codec_spec(s);
    const double bits = 8.0 * static_cast<double>(codec.encoded_bytes(max_count)) / static_cast<double>(max_count);
    std::printf("#\n# codec %s (%.4g bits per value on the wire)\n", codec.canonical().c_str(), bits);
    std::printf("# %10s %10s %10s %8s %8s %5s %8s %5s %8s %5s\n", "size", "count", "wire", "memcpy", "encode", "/mcp",
                "decode", "/mcp", "dec+acc", "/mcp");
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= static_cast<size_t>(o.step_factor)) {
      const Row r = measure(codec, bytes);
      if (!r.missing.empty()) {
        std::printf("#   %s\n", r.missing.c_str());
        break;
      }
      if (codec.kind == qccl::kernels::CodecKind::kSign || !r.accumulates)
        std::printf("  %10zu %10zu %10zu %8.2f %8.2f %5.2f %8.2f %5.2f %8s %5s\n", bytes, bytes / 4,
                    codec.encoded_bytes(bytes / 4), r.gbps[0], r.gbps[1], r.gbps[1] / r.gbps[0], r.gbps[2],
                    r.gbps[2] / r.gbps[0], "-", "-");
      else
        std::printf("  %10zu %10zu %10zu %8.2f %8.2f %5.2f %8.2f %5.2f %8.2f %5.2f\n", bytes, bytes / 4,
                    codec.encoded_bytes(bytes / 4), r.gbps[0], r.gbps[1], r.gbps[1] / r.gbps[0], r.gbps[2],
                    r.gbps[2] / r.gbps[0], r.gbps[3], r.gbps[3] / r.gbps[0]);
      after_row(codec, bytes, r);
      std::fflush(stdout);
      if (r.nonfinite_seen) {
        std::fprintf(stderr, "codec_perf: %s reported non-finite values for finite input\n", s.c_str());
        status = 1;
      }
      if (bytes > o.max_bytes / static_cast<size_t>(o.step_factor)) break;  // no overflow on the next step
    }
  }
  return status;
}

size_t max_wire_bytes(const Options& o) {
  size_t max_wire = 0;
  for (const std::string& s : o.codecs)
    max_wire = std::max(max_wire, qccl::kernels::parse_codec_spec(s).encoded_bytes(o.max_bytes / 4));
  return max_wire;
}

std::vector<float> gaussian_input(size_t count) {
  std::vector<float> in(count);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : in) v = normal(rng);
  return in;
}

std::vector<uint32_t> random_words(size_t n) {
  std::vector<uint32_t> w(n);
  std::mt19937_64 rng(2);
  for (uint32_t& x : w) x = static_cast<uint32_t>(rng());
  return w;
}

// AQ-SGD's delta messages (kernels/aq_delta.h) with a float16 store, medians in GB/s of float32
// input: the sender's work (encode x - m, then m += decoded) and the receiver's (x = m + decoded,
// then m = x). The store starts at the input minus a small drift, so the deltas are small.
struct DeltaRates {
  double send, receive;
};
DeltaRates measure_aq_delta(const CodecConfig& codec, size_t bytes, const Options& o, Buffers* b) {
  const size_t count = bytes / 4, calls = std::max<size_t>(1, (size_t{64} << 20) / bytes);
  std::vector<uint16_t> m_send(count), m_receive(count);
  std::vector<float> drifted(b->in.begin(), b->in.begin() + static_cast<long>(count));
  for (size_t i = 0; i < count; ++i) drifted[i] -= 0.01f * b->in[(i * 7) % count];
  qccl::kernels::store_float(qccl::kernels::DataType::kFloat16, drifted.data(), m_send.data(), count);
  m_receive = m_send;
  std::vector<double> rates[2];
  for (int rep = -o.warmup; rep < o.iters; ++rep)
    for (int which = 0; which < 2; ++which) {
      const auto start = std::chrono::steady_clock::now();
      for (size_t i = 0; i < calls; ++i) {
        if (which == 0)
          qccl::kernels::aq_delta_send(codec, b->in.data(), count, qccl::kernels::DataType::kFloat16, m_send.data(),
                                       b->wire.data(), qccl::kernels::PhiloxKey{}, 0);
        else
          qccl::kernels::aq_delta_receive(codec, b->wire.data(), count, qccl::kernels::DataType::kFloat16,
                                          m_receive.data(), b->out.data());
      }
      const double t = seconds_of(std::chrono::steady_clock::now() - start);
      if (rep >= 0) rates[which].push_back(static_cast<double>(bytes) * calls / t / 1e9);
    }
  return DeltaRates{median(rates[0]), median(rates[1])};
}

int run_host(const Options& o) {
  Buffers b;
  const size_t max_count = o.max_bytes / 4;
  b.in = gaussian_input(max_count);
  b.out.assign(max_count, 0.0f), b.acc.assign(max_count, 0.0f), b.copy.assign(max_count, 0.0f);
  b.wire.assign(max_wire_bytes(o), 0);
  b.incoming = random_words(qccl::kernels::sign_words(max_count));
  b.pending_words.assign(qccl::kernels::sign_words(max_count), 0);
  b.pending_eta.assign(qccl::kernels::sign_words(max_count), 0.0f);
  b.backup.assign(size_t{64} << 10, 0.0f);

  std::printf(
      "# codec_perf: host codecs, GB/s of float32 input, median of %d repetitions (%d warmup), "
      "one thread\n# Highway target: %s\n",
      o.iters, o.warmup, qccl::kernels::reduce_target_name());
  return print_table(
      o, [&](const CodecConfig& codec, size_t bytes) { return measure(codec, bytes, o, &b); },
      [&](const CodecConfig& codec, size_t bytes, const Row&) {
        if (codec.kind == qccl::kernels::CodecKind::kAq) {
          const DeltaRates d = measure_aq_delta(codec, bytes, o, &b);
          std::printf("#   delta messages (float16 store): send %.2f, receive %.2f\n", d.send, d.receive);
        }
        if (codec.kind != qccl::kernels::CodecKind::kFft) return;
        const Stages st = measure_fft_stages(codec, bytes, o, &b);
        std::printf("#   stages: encode = transform %.2f, selection %.2f, range floats and packing %.2f; "
                    "decode = unpack %.2f, inverse transform %.2f\n",
                    st.gbps[0], st.gbps[1], st.gbps[2], st.gbps[3], st.gbps[4]);
      });
}

// ---- The device -------------------------------------------------------------------------------------

constexpr int kNoDevice = 77;

#if QCCL_HAVE_CUDA
struct CudaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void cuda_ok(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    throw CudaFailure(std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// cudaMalloc'd bytes, freed on scope exit.
class DeviceArray {
 public:
  explicit DeviceArray(size_t bytes) { cuda_ok(cudaMalloc(&p_, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

struct DeviceBuffers {
  explicit DeviceBuffers(const Options& o)
      : in(o.max_bytes), out(o.max_bytes), acc(o.max_bytes), copy(o.max_bytes), backup(o.max_bytes),
        wire(max_wire_bytes(o)), incoming(4 * qccl::kernels::sign_words(o.max_bytes / 4)),
        pending_words(4 * qccl::kernels::sign_words(o.max_bytes / 4)),
        pending_eta(4 * qccl::kernels::sign_words(o.max_bytes / 4)), counter(sizeof(unsigned long long)) {}
  DeviceArray in, out, acc, copy, backup, wire, incoming, pending_words, pending_eta, counter;
};

class DeviceTimer {
 public:
  explicit DeviceTimer(cudaStream_t s) : s_(s) {
    cuda_ok(cudaEventCreate(&start_), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~DeviceTimer() { cudaEventDestroy(start_), cudaEventDestroy(stop_); }
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;
  void start() { cuda_ok(cudaEventRecord(start_, s_), "cudaEventRecord"); }
  double stop_seconds() {
    cuda_ok(cudaEventRecord(stop_, s_), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms / 1e3;
  }

 private:
  cudaStream_t s_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// measure() on the device: the same four operations through codec_cuda.h on stream s.
Row measure_on_device(const CodecConfig& codec, size_t bytes, const Options& o, const DeviceBuffers& b,
                      cudaStream_t s) {
  Row row;
  const size_t count = bytes / 4;
  const bool fft = codec.kind == qccl::kernels::CodecKind::kFft;
  std::string why;
  if (fft && !qccl::kernels::fft_cuda_available(&why)) {
    row.missing = "the fft codec's device launchers need cuFFT: " + why;
    return row;
  }
  // The fft codec's: its payloads' length, the spectrum its decode goes through, cuFFT's plans.
  const std::unique_ptr<qccl::kernels::FftCudaWorkspace, void (*)(qccl::kernels::FftCudaWorkspace*)> fft_ws(
      fft ? qccl::kernels::fft_cuda_workspace() : nullptr, qccl::kernels::fft_cuda_release);
  DeviceArray fft_length(sizeof(size_t)), spectrum(fft ? qccl::kernels::fft_spectrum_floats(codec, count) * 4 : 1);
  const uint32_t hash = static_cast<uint32_t>(codec.hash());
  const size_t calls = std::max<size_t>(1, (size_t{1} << 30) / bytes);
  const qccl::kernels::PhiloxKey key;
  const bool sign = codec.kind == qccl::kernels::CodecKind::kSign;
  auto* words = b.wire.as<uint32_t>();
  auto* nonfinite = b.counter.as<unsigned long long>();
  const qccl::kernels::Compensation c{b.acc.as<float>(), b.pending_words.as<uint32_t>(), b.pending_eta.as<float>()};
  auto op = [&](int which) {
    if (which == 0) {
      cuda_ok(cudaMemcpyAsync(b.copy.as<float>(), b.in.as<float>(), bytes, cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync");
    } else if (sign) {
      if (which == 1) {
        cuda_ok(qccl::kernels::pack_signs_cuda(b.in.as<float>(), c, 0, count, words, b.backup.as<float>(),
                                               nonfinite, s),
                "pack_signs_cuda");
        cuda_ok(qccl::kernels::merge_signs_cuda(b.incoming.as<uint32_t>(), words, words,
                                                qccl::kernels::sign_words(count), 3, key, 0, s),
                "merge_signs_cuda");
      } else if (which == 2) {
        cuda_ok(qccl::kernels::decode_signs_cuda(words, count, codec.eta, b.out.as<float>(), c, 0, s),
                "decode_signs_cuda");
      }
    } else if (fft) {
      if (which == 1) {
        cuda_ok(qccl::kernels::fft_encode_cuda(codec, hash, b.in.as<float>(), count, b.wire.as<void>(),
                                               fft_length.as<size_t>(), nullptr, nonfinite, nullptr, fft_ws.get(), s),
                "fft_encode_cuda");
      } else if (which == 2) {
        cuda_ok(qccl::kernels::fft_decode_spectrum_cuda(codec, hash, b.wire.as<void>(), fft_length.as<size_t>(), count,
                                                        spectrum.as<float>(), false, nonfinite, fft_ws.get(), s),
                "fft_decode_spectrum_cuda");
        cuda_ok(qccl::kernels::fft_synthesize_cuda(codec, spectrum.as<float>(), count, b.out.as<float>(), fft_ws.get(), s),
                "fft_synthesize_cuda");
      }
    } else if (which == 1) {
      cuda_ok(qccl::kernels::encode_cuda(codec, b.in.as<float>(), count, b.wire.as<void>(), key, 0, nonfinite, s),
              "encode_cuda");
    } else if (which == 2) {
      cuda_ok(qccl::kernels::decode_cuda(codec, b.wire.as<void>(), count, b.out.as<float>(), nonfinite, s),
              "decode_cuda");
    } else {
      cuda_ok(qccl::kernels::decode_accumulate_cuda(codec, b.wire.as<void>(), count, b.acc.as<float>(), nullptr, s),
              "decode_accumulate_cuda");
    }
  };
  DeviceTimer timer(s);
  cuda_ok(cudaMemsetAsync(nonfinite, 0, sizeof *nonfinite, s), "cudaMemsetAsync");
  std::vector<double> rates[4];
  for (int rep = -o.warmup; rep < o.iters; ++rep) {
    for (int which = 0; which < 4; ++which) {
      if ((sign || fft) && which == 3) continue;
      timer.start();
      for (size_t i = 0; i < calls; ++i) op(which);
      const double t = timer.stop_seconds();
      if (rep >= 0) rates[which].push_back(static_cast<double>(bytes) * calls / t / 1e9);
    }
    // Untimed, as on the host: the accumulator (the sign codec's compensation) back to zero.
    cuda_ok(cudaMemsetAsync(b.acc.as<void>(), 0, bytes, s), "cudaMemsetAsync");
    cuda_ok(cudaMemsetAsync(b.pending_eta.as<void>(), 0, 4 * qccl::kernels::sign_words(count), s), "cudaMemsetAsync");
  }
  unsigned long long seen = 0;
  cuda_ok(cudaMemcpyAsync(&seen, nonfinite, sizeof seen, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  row.nonfinite_seen = seen != 0;
  row.accumulates = !fft;
  for (int which = 0; which < 4; ++which) row.gbps[which] = rates[which].empty() ? 0.0 : median(rates[which]);
  return row;
}

int run_device(const Options& o) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "codec_perf: --device: no usable CUDA device (%s)\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
    return kNoDevice;
  }
  try {
    cuda_ok(cudaSetDevice(0), "cudaSetDevice");
    cudaDeviceProp prop{};
    cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    const DeviceBuffers b(o);
    const size_t max_count = o.max_bytes / 4;
    const std::vector<float> in = gaussian_input(max_count);
    const std::vector<uint32_t> incoming = random_words(qccl::kernels::sign_words(max_count));
    cuda_ok(cudaMemcpy(b.in.as<void>(), in.data(), o.max_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_ok(cudaMemcpy(b.incoming.as<void>(), incoming.data(), 4 * incoming.size(), cudaMemcpyHostToDevice),
            "cudaMemcpy");
    for (const DeviceArray* a : {&b.out, &b.acc, &b.copy, &b.backup})
      cuda_ok(cudaMemset(a->as<void>(), 0, o.max_bytes), "cudaMemset");
    for (const DeviceArray* a : {&b.pending_words, &b.pending_eta})
      cuda_ok(cudaMemset(a->as<void>(), 0, 4 * qccl::kernels::sign_words(max_count)), "cudaMemset");
    cudaStream_t stream = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    std::printf(
        "# codec_perf: device codecs, GB/s of float32 input, median of %d repetitions (%d warmup), "
        "one stream\n# device 0: %s, %d multiprocessors, %.1f GiB\n",
        o.iters, o.warmup, prop.name, prop.multiProcessorCount,
        static_cast<double>(prop.totalGlobalMem) / (1ull << 30));
    const int status = print_table(
        o, [&](const CodecConfig& codec, size_t bytes) { return measure_on_device(codec, bytes, o, b, stream); },
        [](const CodecConfig&, size_t, const Row&) {});
    cudaStreamDestroy(stream);
    return status;
  } catch (const CudaFailure& f) {
    std::fprintf(stderr, "codec_perf: --device: %s\n", f.what());
    return 1;
  }
}
#else
int run_device(const Options&) {
  std::fprintf(stderr, "codec_perf: --device: this build has no CUDA launchers (the CUDA toolkit was not found)\n");
  return kNoDevice;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    if (!parse_options(argc, argv, &options)) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "codec_perf: %s\n", e.what());
    return 2;
  }
  return options.device ? run_device(options) : run_host(options);
}
