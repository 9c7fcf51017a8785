// The benchmark harness: the timed sweep, the correctness check and the nccl-tests table (the command
// line is options.cc). Format strings and the order of operations follow NVIDIA/nccl-tests v2.14
// src/common.cu; the per-collective parts live in <collective>_perf.cc.
#include "common.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>

#include "options.h"
#include "strict_number.h"

#ifdef QCCL_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace qccl_perf {
namespace {

// ---- Errors ------------------------------------------------------------------------------------

// A failed qccl call or a failed allocation: reported by the rank that saw it; exit status 1.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --device where no CUDA device can be used: nothing to measure here, which is a skip (exit 77, as
// codec_perf --device and ctest's SKIP_RETURN_CODE read it), not a failure.
struct NoDevice : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(qcclResult_t result, const char* call) {
  if (result == qcclSuccess) return;
  throw Failure(std::string(call) + " failed: " + qcclGetErrorString(result) + ": " + qcclGetLastError(nullptr));
}

// ---- Datatypes and ops ---------------------------------------------------------------------------

struct TypeInfo {
  qcclDataType_t type;
  size_t size;
  bool is_float;
  bool is_signed;
  int exp_bits;  // floating types: IEEE-style layout
  int mant_bits;
};
constexpr TypeInfo kTypes[] = {
    {qcclInt8, 1, false, true, 0, 0},      {qcclUint8, 1, false, false, 0, 0},  {qcclInt32, 4, false, true, 0, 0},
    {qcclUint32, 4, false, false, 0, 0},   {qcclInt64, 8, false, true, 0, 0},   {qcclUint64, 8, false, false, 0, 0},
    {qcclFloat16, 2, true, true, 5, 10},   {qcclFloat32, 4, true, true, 8, 23}, {qcclFloat64, 8, true, true, 11, 52},
    {qcclBfloat16, 2, true, true, 8, 7}};
static_assert(sizeof(kTypes) / sizeof(kTypes[0]) == qcclNumTypes, "one TypeInfo per qcclDataType_t");

// v rounded to the nearest value of a binary floating format (ties to even), as its bits. Used for
// fp16, bf16, float and double alike; NaN is never an input here.
uint64_t encode_real(double v, int exp_bits, int mant_bits) {
  const uint64_t sign = std::signbit(v) ? uint64_t{1} << (exp_bits + mant_bits) : 0;
  const double a = std::fabs(v);
  if (a == 0) return sign;
  const int bias = (1 << (exp_bits - 1)) - 1;
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): the leading bit has exponent e - 1
  int exponent = std::max(e - 1, 1 - bias);  // subnormals share the smallest normal exponent
  double mant = std::nearbyint(std::ldexp(a, mant_bits - exponent));  // hidden bit included
  if (mant >= std::ldexp(1.0, mant_bits + 1)) mant /= 2, ++exponent;  // rounded up into the next binade
  if (exponent > bias) return sign | (uint64_t((1 << exp_bits) - 1) << mant_bits);  // infinity
  const auto m = static_cast<uint64_t>(mant);
  const uint64_t hidden = uint64_t{1} << mant_bits;
  if (m < hidden) return sign | m;  // subnormal
  return sign | (uint64_t(exponent + bias) << mant_bits) | (m - hidden);
}

uint64_t low_bytes_mask(size_t size) { return size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * size)) - 1; }

// An integer value (small enough to be exact) in the datatype, as bits.
uint64_t encode_int(const TypeInfo& t, int64_t v) {
  if (t.is_float) return encode_real(static_cast<double>(v), t.exp_bits, t.mant_bits);
  return static_cast<uint64_t>(v) & low_bytes_mask(t.size);  // two's complement
}

// Floating bits mapped to integers that are ordered like the values (+0 and -0 both map to 0), so
// that the distance of two values in units in the last place is a subtraction.
int64_t ordered(uint64_t bits, size_t size) {
  const int sign_bit = static_cast<int>(8 * size - 1);
  const auto magnitude = static_cast<int64_t>(bits & ((uint64_t{1} << sign_bit) - 1));
  return (bits >> sign_bit) & 1 ? -magnitude : magnitude;
}

// The value of floating-point bits of `t` (for --codec's relative error): sign, exponent, mantissa.
double decode_real(const TypeInfo& t, uint64_t bits) {
  if (t.type == qcclFloat32) {
    float f;
    const auto b = static_cast<uint32_t>(bits);
    std::memcpy(&f, &b, sizeof f);
    return f;
  }
  if (t.type == qcclFloat64) {
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }
  const int mant = t.mant_bits, exp = t.exp_bits, bias = (1 << (exp - 1)) - 1;
  const uint64_t m = bits & ((uint64_t{1} << mant) - 1), e = (bits >> mant) & ((uint64_t{1} << exp) - 1);
  const double sign = (bits >> (mant + exp)) & 1 ? -1.0 : 1.0;
  if (e == (uint64_t{1} << exp) - 1) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), 1 - bias - mant);
  return sign * std::ldexp(static_cast<double>(m | (uint64_t{1} << mant)), static_cast<int>(e) - bias - mant);
}

// Buffers are little-endian host memory (x86-64, aarch64).
uint64_t load(const char* p, size_t size) {
  uint64_t v = 0;
  std::memcpy(&v, p, size);
  return v;
}
void store(char* p, uint64_t v, size_t size) { std::memcpy(p, &v, size); }

// ---- Inputs and expected values -------------------------------------------------------------------

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// What every rank can compute about every rank's input for one check iteration.
struct Pattern {
  const TypeInfo* type;
  int op;  // a qcclRedOp_t, or kCopy for collectives that do not reduce
  uint64_t seed;
  int nranks;
  static constexpr int kCopy = -1;
};

uint64_t draw(const Pattern& p, int rank, size_t index) {
  return mix(mix(p.seed ^ (uint64_t(rank) << 32)) ^ index);
}

// A reduction input. Small integers keep every sum, product, min and max exact in every datatype and
// independent of the reduction order: |x| <= A = clamp(120 / nranks, 1, 8) keeps every partial sum
// within int8 (no wrap, so avg is unambiguous) and within bf16's exact integers (256); products use
// +-1 with a factor 2 on ranks 0..5 only, so |product| <= 64. Unsigned types get x >= 0.
int64_t input_value(const Pattern& p, int rank, size_t index) {
  const uint64_t h = draw(p, rank, index);
  if (p.op == qcclProd) {
    const int64_t two = rank < 6 && (h >> 8) % 3 == 0 ? 2 : 1;
    return (p.type->is_signed && (h & 1)) ? -two : two;
  }
  const int64_t a = std::clamp(120 / p.nranks, 1, 8);
  if (!p.type->is_signed) return static_cast<int64_t>(h % uint64_t(a + 1));
  return static_cast<int64_t>(h % uint64_t(2 * a + 1)) - a;
}

// Copies carry arbitrary bit patterns (NaNs included: they are compared bitwise), so that a misplaced
// byte is caught.
uint64_t input_bits(const Pattern& p, int rank, size_t index) {
  if (p.op == Pattern::kCopy) return draw(p, rank, index) & low_bytes_mask(p.type->size);
  return encode_int(*p.type, input_value(p, rank, index));
}

// The expected bits of a reduction over all ranks of element `index`, and the tolerance in units in
// the last place (1 for avg on floating types: the exact mean rounded once to the type).
uint64_t reduced_bits(const Pattern& p, size_t index, int* ulps) {
  int64_t acc = input_value(p, 0, index);
  for (int r = 1; r < p.nranks; ++r) {
    const int64_t x = input_value(p, r, index);
    switch (p.op) {
      case qcclProd: acc *= x; break;
      case qcclMax: acc = std::max(acc, x); break;
      case qcclMin: acc = std::min(acc, x); break;
      default: acc += x; break;  // sum, avg
    }
  }
  *ulps = 0;
  if (p.op != qcclAvg) return encode_int(*p.type, acc);
  if (!p.type->is_float) return encode_int(*p.type, acc / p.nranks);  // C++ division truncates toward zero
  *ulps = 1;
  return encode_real(static_cast<double>(acc) / p.nranks, p.type->exp_bits, p.type->mant_bits);
}

bool matches(const Pattern& p, uint64_t got, uint64_t want, int ulps) {
  if (p.op == Pattern::kCopy || !p.type->is_float) return got == want;
  return std::llabs(ordered(got, p.type->size) - ordered(want, p.type->size)) <= ulps;
}

// ---- Device buffers (--device) ------------------------------------------------------------------------

#ifdef QCCL_PERF_CUDA
void cuda_check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw Failure(std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}
#endif

// The device copy of a host buffer: the collectives run on it, the harness fills and checks the host
// one and copies between them outside the timed batch.
class DeviceMirror {
 public:
  DeviceMirror() = default;
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  ~DeviceMirror() {
#ifdef QCCL_PERF_CUDA
    if (p_) cudaFree(p_);
#endif
  }
  void allocate(size_t bytes) {
#ifdef QCCL_PERF_CUDA
    if (cudaMalloc(&p_, std::max<size_t>(bytes, 64)) != cudaSuccess)
      throw Failure("cannot allocate " + std::to_string(bytes) + " bytes of device memory (lower -e/--maxbytes)");
    cuda_check(cudaMemset(p_, 0, bytes), "cudaMemset");
#else
    (void)bytes;
    throw Failure("--device: this build has no CUDA");
#endif
  }
  char* get() const { return static_cast<char*>(p_); }
  void upload(const char* host, size_t bytes) {
#ifdef QCCL_PERF_CUDA
    if (bytes) cuda_check(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
#else
    (void)host, (void)bytes;
#endif
  }
  void download(char* host, size_t bytes) const {
#ifdef QCCL_PERF_CUDA
    if (bytes) cuda_check(cudaMemcpy(host, p_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
#else
    (void)host, (void)bytes;
#endif
  }

 private:
  void* p_ = nullptr;
};

// The CUDA devices this process sees; NoDevice when there is none it can use (no driver, no GPU). The
// message keeps "no CUDA device" and CUDA's error name, which tests/perf's device cases skip on.
int device_count() {
#ifdef QCCL_PERF_CUDA
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    throw NoDevice(std::string("--device: no CUDA device is usable here (") +
                   (e != cudaSuccess ? std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e)
                                     : std::string("cudaGetDeviceCount found none")) +
                   ")");
  }
  return count;
#else
  throw Failure("--device: this build has no CUDA");
#endif
}

// "NVIDIA H100 80GB HBM3" for the preamble, after choosing device rank % count.
std::string use_device(int rank) {
#ifdef QCCL_PERF_CUDA
  const int count = device_count();
  cuda_check(cudaSetDevice(rank % count), "cudaSetDevice");
  cudaDeviceProp props{};
  cuda_check(cudaGetDeviceProperties(&props, rank % count), "cudaGetDeviceProperties");
  return props.name;
#else
  (void)rank;
  throw Failure("--device: this build has no CUDA");
#endif
}

// ---- Host buffers -----------------------------------------------------------------------------------

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<char, FreeDeleter>;

HostBuffer allocate(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, std::max<size_t>(bytes, 64))) {
    throw Failure("cannot allocate " + std::to_string(bytes) + " bytes of host memory (lower -e/--maxbytes)");
  }
  std::memset(p, 0, bytes);  // touch every page before timing
  return HostBuffer(static_cast<char*>(p));
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

// ---- The table ---------------------------------------------------------------------------------------

int Table::extra_width() const {
  int w = 0;
  for (const ExtraColumn& c : extra_) w += 2 + c.width;
  return w;
}

void Table::print_header() const {
  const int pad = extra_width();
  std::printf("#\n");
  std::printf("# %10s  %12s  %8s  %6s  %6s", "", "", "", "", "");
  std::printf("           out-of-place         %*s              in-place          %*s\n", pad, "", pad, "");
  std::printf("# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
  for (int half = 0; half < 2; ++half) {
    std::printf("  %7s  %6s  %6s %6s", "time", "algbw", "busbw", "#wrong");
    for (const ExtraColumn& c : extra_) std::printf("  %*s", c.width, c.title.c_str());
  }
  std::printf("\n# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
  for (int half = 0; half < 2; ++half) {
    std::printf("  %7s  %6s  %6s  %5s", "(us)", "(GB/s)", "(GB/s)", "");
    for (const ExtraColumn& c : extra_) std::printf("  %*s", c.width, c.unit.c_str());
  }
  std::printf("\n");
}

void Table::print_row_start(size_t bytes, size_t count, const char* type, const char* op, int root) const {
  std::printf("%12li  %12li  %8s  %6s  %6i", long(bytes), long(count), type, op, root);
  std::fflush(stdout);
}

void Table::print_cell(const Cell& cell) const {
  if (!cell.ran) {
    std::printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
    for (const ExtraColumn& c : extra_) std::printf("  %*s", c.width, "N/A");
    std::fflush(stdout);
    return;
  }
  const double us = cell.seconds * 1e6;
  char time[32];
  std::snprintf(time, sizeof time, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
  if (cell.wrong >= 0) {
    std::printf("  %7s  %6.2f  %6.2f  %5g", time, cell.algbw, cell.busbw, double(cell.wrong));
  } else {
    std::printf("  %7s  %6.2f  %6.2f  %5s", time, cell.algbw, cell.busbw, "N/A");
  }
  for (const ExtraColumn& c : extra_) std::printf("  %*s", c.width, c.format(cell).c_str());
  std::fflush(stdout);
}

void Table::print_row_end() const {
  std::printf("\n");
  std::fflush(stdout);
}

// ---- The benchmark ---------------------------------------------------------------------------------

namespace {

// The extra columns of the table (see ExtraColumn). --link-rate adds the wire floor: busbw is the
// rate at which a rank's link carries the collective's bus bytes, so the fastest a link of rate B
// allows is time * busbw / B, and time / floor = B / busbw. (Future --codec columns go here too.)
std::string formatted(const char* fmt, double v) {
  char text[32];
  std::snprintf(text, sizeof(text), fmt, v);
  return text;
}

std::vector<ExtraColumn> extra_columns(const Options& opt) {
  std::vector<ExtraColumn> columns;
  if (!opt.codecs.empty()) {
    columns.push_back({"wire", "(B)", 11, [](const Cell& c) { return formatted("%.0f", double(c.stats.wireBytesSent)); }});
    columns.push_back({"ratio", "", 6, [](const Cell& c) { return formatted("%.2f", c.stats.compressionRatio); }});
    columns.push_back({"relerr", "", 8, [](const Cell& c) {
                         return c.relerr < 0 ? std::string("N/A") : formatted("%.2e", c.relerr);
                       }});
  }
  if (opt.phases) {
    using Phases = Cell::Phases;
    auto percent = [](double Phases::*field) {
      return [field](const Cell& c) {
        return formatted("%.1f", c.phases.seconds > 0 ? 100.0 * (c.phases.*field) / c.phases.seconds : 0.0);
      };
    };
    columns.push_back({"enc", "(%)", 5, percent(&Phases::encode)});
    columns.push_back({"dec", "(%)", 5, percent(&Phases::decode)});
    columns.push_back({"red", "(%)", 5, percent(&Phases::reduce)});
    columns.push_back({"xport", "(%)", 5, percent(&Phases::transport)});
    columns.push_back({"wait", "(%)", 5, percent(&Phases::wait)});
    columns.push_back({"sleeps", "", 6, [](const Cell& c) { return formatted("%.1f", c.phases.sleeps); }});
  }
  if (opt.link_rate > 0) {
    // Uncompressed, the floor is the bus bytes over the link; compressed, it is the bytes this rank
    // actually sent (qcclStats_t) over the link: the codec's own wire floor.
    const bool compressed = !opt.codecs.empty();
    const double rate = opt.link_rate;  // bytes/s
    auto floor_us = [rate, compressed](const Cell& c) {
      return compressed ? c.stats.wireBytesSent / rate * 1e6 : c.seconds * 1e6 * c.busbw * 1e9 / rate;
    };
    columns.push_back({"floor", "(us)", 9, [floor_us](const Cell& c) { return formatted("%.1f", floor_us(c)); }});
    columns.push_back({"x floor", "", 7, [floor_us](const Cell& c) {
                         const double f = floor_us(c);
                         return formatted("%.2f", f > 0 ? c.seconds * 1e6 / f : 0.0);
                       }});
  }
  return columns;
}

// One benchmarked (datatype, op, root) and size.
struct Shape {
  const TypeInfo* type;
  int op;    // qcclRedOp_t, or Pattern::kCopy
  int root;  // -1 for rootless collectives
  Counts counts;
};

class Bench {
 public:
  Bench(const CollTest& test, const Options& options)
      : test_(test), opt_(options), table_(extra_columns(options)) {}
  ~Bench();
  void init();
  void print_preamble();
  void run();
  int finish(double min_bw);
  void abort();
  int rank() const { return rank_; }

 private:
  void sweep(const TypeInfo& type, int op, int root);
  bool next_size(size_t* bytes) const;
  void reset_codec_states();
  void bench_size(Shape shape);
  Cell bench_cell(const Shape& s, bool in_place);
  bool relerr_fails(double relerr) const;
  uint64_t check_seed(const Shape& s, bool in_place, int check) const;
  // The mean seconds per operation of the timed batch; with `phases`, its time fields' means too. Adds
  // the timed calls that returned qcclNonFinite to *nonfinite_calls.
  double time_batch(const Shape& s, bool in_place, Cell::Phases* phases, int64_t* nonfinite_calls);
  void read_last_stats();  // into last_stats_, after run_ops' last call
  void add_phases();
  int64_t check_cell(const Shape& s, bool in_place, uint64_t seed);
  double relative_error(const Shape& s, bool in_place, uint64_t seed);
  bool compressible(const TypeInfo& type, int op) const;
  Pattern pattern(const TypeInfo* type, int op, uint64_t seed) const;
  void fill_inputs(const Shape& s, bool in_place, const Pattern& p);
  int64_t count_wrong(const Shape& s, bool in_place, const Pattern& p);
  Shape shape_for(size_t bytes, const TypeInfo& type, int op, int root) const;
  // The call of iteration `iter`, on the buffers it runs on, or (host) on the host ones whatever --device.
  Call make_call(const Shape& s, bool in_place, int iter, bool host = false) const;
  // --device: the first `bytes` of both host buffers to the device, or of the receive buffer back.
  void upload(size_t bytes);
  void download(size_t bytes);
  // Returns how many calls returned qcclNonFinite (only a codec's may; any other failure throws).
  [[nodiscard]] int run_ops(const Shape& s, bool in_place, int first_iter, int n);
  void barrier();
  double reduce_time(double seconds);
  bool printer() const { return rank_ == 0; }

  const CollTest& test_;
  Options opt_;
  Table table_;
  Cell::Phases* phases_ = nullptr;  // --phases: the timed batch's sums (time_batch, run_ops)
  qcclStats_t last_stats_{};        // the last call of the timed batch (read_last_stats)
  bool last_stats_wanted_ = false;  // run_ops reads it after its last call (time_batch, once a batch)
  qcclComm_t comm_ = nullptr;
  int rank_ = -1, nranks_ = 1;  // -1 until the communicator is made: a failure before names no rank
  HostBuffer send_, recv_;
  DeviceMirror device_send_, device_recv_;  // --device
  std::string device_name_;                 // --device
  size_t buffer_bytes_ = 0;
  std::vector<std::pair<std::string, qcclCodec_t>> codecs_;  // --codec
  qcclCodec_t codec_ = nullptr;                               // the sweep's codec, or none
  bool sign_codec_ = false;                                   // it is Marsit's (it needs a state)
  bool int_codec_ = false;                                    // it is IntSGD's (alpha adapts in a state)
  bool fft_codec_ = false;                                    // it is FFT sparsification's (all-reduce only)
  bool aq_codec_ = false;                                     // it is AQ-SGD's (point-to-point only)
  mutable std::map<size_t, qcclCodecState_t> states_;         // Marsit, IntSGD: one per count, per sweep
  int cycle_ = 0;                                             // -N: the sweep's cycle, for check_seed
  int failed_cells_ = 0;
  int compressed_cells_ = 0;          // cells run through a codec
  int bounded_cells_ = 0;             // of those, the ones whose relerr was held to --max-relerr
  int64_t nonfinite_timed_calls_ = 0;  // timed calls that returned qcclNonFinite (Cell::nonfinite_calls)
  double bw_sum_ = 0;
  int bw_count_ = 0;
};

Bench::~Bench() {
  for (auto& s : states_) qcclCodecStateDestroy(s.second);
  if (comm_) qcclCommDestroy(comm_);
  for (auto& c : codecs_) qcclCodecDestroy(c.second);
}

void Bench::abort() {
  if (comm_) qcclCommAbort(comm_);
  comm_ = nullptr;
}

void Bench::init() {
  qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
  config.timeoutSeconds = opt_.timeout;
  config.chunkBytes = opt_.chunk;
  config.pipelineDepth = opt_.depth;
  if (!opt_.algo.empty()) config.algorithms = opt_.algo.c_str();
  // Before the communicator, so that every rank skips on its own rather than fail a collective peer.
  if (opt_.device) device_count();
  const qcclResult_t made = qcclCommInitEnv(&comm_, &config);
  // qccl checks --algo's names as it makes the communicator, on every rank alike, and its message
  // names the field they came from: a bad command line (exit 2), not a failed call.
  if (made == qcclInvalidArgument && !opt_.algo.empty()) {
    const std::string why = qcclGetLastError(nullptr);
    const std::string field = "config->algorithms: ";
    const size_t at = why.find(field);
    if (at != std::string::npos)
      throw UsageError("invalid value '" + opt_.algo + "' for --algo: " + why.substr(at + field.size()));
  }
  check(made, "qcclCommInitEnv");
  check(qcclCommUserRank(comm_, &rank_), "qcclCommUserRank");
  check(qcclCommCount(comm_, &nranks_), "qcclCommCount");
  if (test_.rooted && opt_.root >= nranks_) {
    throw UsageError("invalid value '" + std::to_string(opt_.root) + "' for -r/--root: there are " +
                     std::to_string(nranks_) + " ranks");
  }
  for (const std::string& spec : opt_.codecs) {
    qcclCodec_t codec = nullptr;
    if (qcclCodecCreate(spec.c_str(), &codec) != qcclSuccess)
      throw UsageError(std::string("invalid value for --codec: ") + qcclGetLastError(nullptr));
    codecs_.emplace_back(spec, codec);
  }
  buffer_bytes_ = opt_.max_bytes;
  send_ = allocate(buffer_bytes_);
  recv_ = allocate(buffer_bytes_);
  if (opt_.device) {
    device_name_ = use_device(rank_);
    device_send_.allocate(buffer_bytes_);
    device_recv_.allocate(buffer_bytes_);
  }
}

void Bench::upload(size_t bytes) {
  if (!opt_.device) return;
  device_send_.upload(send_.get(), bytes);
  device_recv_.upload(recv_.get(), bytes);
}

void Bench::download(size_t bytes) {
  if (opt_.device) device_recv_.download(recv_.get(), bytes);
}

// nccl-tests' parameter line and one "#  Rank" line per rank (host names and pids by AllGather).
void Bench::print_preamble() {
  struct RankInfo {
    char host[64];
    int32_t pid;
    int32_t unused;
    char device[64];
  } mine{};
  gethostname(mine.host, sizeof mine.host - 1);
  std::snprintf(mine.device, sizeof mine.device, "%s", opt_.device ? device_name_.c_str() : "cpu");
  mine.pid = getpid();
  std::vector<RankInfo> all(nranks_);
  check(qcclAllGather(&mine, all.data(), sizeof mine, qcclUint8, comm_), "qcclAllGather");
  if (!printer()) return;
  const bool factor = opt_.step_factor > 1;
  std::printf("# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d "
              "agg iters: %d validation: %d graph: %d\n",
              1, 1, long(opt_.min_bytes), long(opt_.max_bytes), factor ? opt_.step_factor : long(opt_.step_bytes),
              factor ? "factor" : "bytes", opt_.warmup, opt_.iters, 1, opt_.check, 0);
  if (opt_.blocking) std::printf("# Blocking Enabled: %s\n", blocking_summary(opt_.blocking));
  if (!opt_.algo.empty() || opt_.chunk != QCCL_CONFIG_UNDEF_INT || opt_.depth != QCCL_CONFIG_UNDEF_INT) {
    std::printf("# qccl config: algorithms %s chunkBytes %d pipelineDepth %d (-1: default)\n",
                opt_.algo.empty() ? "default" : opt_.algo.c_str(), opt_.chunk == QCCL_CONFIG_UNDEF_INT ? -1 : opt_.chunk,
                opt_.depth == QCCL_CONFIG_UNDEF_INT ? -1 : opt_.depth);
  }
  std::printf("#\n# Using devices\n");
  for (int r = 0; r < nranks_; ++r)
    std::printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n", r, 0, all[r].pid,
                all[r].host, 0, 0, 0, 0, all[r].device);  // no PCI address: host memory
}

void Bench::run() {
  if (printer()) table_.print_header();
  std::vector<std::pair<std::string, qcclCodec_t>> codecs = codecs_;
  if (codecs.empty()) codecs.emplace_back("", nullptr);
  for (int cycle = 0; opt_.cycles == 0 || cycle < opt_.cycles; ++cycle) {
    cycle_ = cycle;
    int cycle_sweeps = 0;
    for (const auto& [spec, codec] : codecs) {
      codec_ = codec;
      sign_codec_ = spec.rfind("sign", 0) == 0;
      int_codec_ = spec.rfind("int", 0) == 0;
      fft_codec_ = spec.rfind("fft", 0) == 0;
      aq_codec_ = spec.rfind("aq", 0) == 0;
      if (codec && printer()) std::printf("# codec %s\n", spec.c_str());
      int sweeps = 0;
      for (int t = 0; t < qcclNumTypes; ++t) {
        if (opt_.type != -1 && opt_.type != t) continue;
        for (int op = 0; op < (test_.reduces ? qcclNumOps : 1); ++op) {
          if (test_.reduces && opt_.op != -1 && opt_.op != op) continue;
          if (codec && !compressible(kTypes[t], op)) continue;
          const int first_root = !test_.rooted ? -1 : opt_.root == -1 ? 0 : opt_.root;
          const int last_root = !test_.rooted ? -1 : opt_.root == -1 ? nranks_ - 1 : opt_.root;
          for (int root = first_root; root <= last_root; ++root)
            sweep(kTypes[t], test_.reduces ? op : Pattern::kCopy, root), ++sweeps;
        }
      }
      if (codec && sweeps == 0 && printer())
        std::printf("#   nothing to run: this codec takes %s (see -d and -o)\n",
                    aq_codec_ && !test_.point_to_point_codecs ? "point-to-point messages (sendrecv_perf)"
                    : (sign_codec_ || int_codec_ || fft_codec_) && !test_.all_reduce_codecs ? "an all-reduce (all_reduce_perf)"
                    : sign_codec_                                          ? "float with op avg"
                                                                            : "float, half or bfloat16 with op sum or avg");
      cycle_sweeps += sweeps;
    }
    // A run that measured nothing is no pass (and with -N 0 it would print that line forever).
    if (cycle_sweeps == 0) throw UsageError("no --codec fits this benchmark's datatypes and ops: nothing was run");
  }
}

// Codecs take float, half and bfloat16, summed or averaged (qcclAllReduceCompressed, and
// qcclAllGatherCompressed, which does not reduce, and qcclReduceScatterCompressed).
// Marsit's sign codec takes float32 averaged; it, IntSGD's and the fft codec are all-reduce only;
// AQ-SGD's aq codecs are point-to-point only (sendrecv_perf, qcclSendCompressed).
bool Bench::compressible(const TypeInfo& type, int op) const {
  if ((sign_codec_ || int_codec_ || fft_codec_) && !test_.all_reduce_codecs) return false;
  if (aq_codec_ && !test_.point_to_point_codecs) return false;
  if (sign_codec_) return type.type == qcclFloat32 && op == qcclAvg;
  const bool floating = type.type == qcclFloat32 || type.type == qcclFloat16 || type.type == qcclBfloat16;
  return floating && (op == qcclSum || op == qcclAvg);
}

// The inputs of a sweep: a copy's arbitrary bits (NaN included), except through a codec, which
// gets the small finite values of a sum (a codec turns NaN into a NaN bucket and qcclNonFinite).
Pattern Bench::pattern(const TypeInfo* type, int op, uint64_t seed) const {
  return Pattern{type, codec_ && op == Pattern::kCopy ? static_cast<int>(qcclSum) : op, seed, nranks_};
}

// nccl-tests' TimeTest: a barrier, warm-up at the largest and the smallest size, then every size.
void Bench::sweep(const TypeInfo& type, int op, int root) {
  reset_codec_states();
  if (codec_) {
    // Timed iterations read the buffers at many offsets, where earlier sweeps left other datatypes'
    // bits: read as this type they can be NaN, which a compressed collective reports (qcclNonFinite).
    // Codecs must time on finite values, so every element gets one.
    const Pattern p = pattern(&type, op, 0);
    for (char* buffer : {send_.get(), recv_.get()})
      for (size_t i = 0; i < buffer_bytes_ / type.size; ++i)
        store(buffer + i * type.size, input_bits(p, rank_, i), type.size);
    upload(buffer_bytes_);
  }
  barrier();
  for (size_t bytes : {opt_.max_bytes, opt_.min_bytes}) {
    const Shape s = shape_for(bytes, type, op, root);
    (void)run_ops(s, false, 0, opt_.warmup);  // untimed and unchecked
  }
  size_t bytes = opt_.min_bytes;
  do {
    bench_size(shape_for(bytes, type, op, root));
  } while (next_size(&bytes));
}

// The size after *bytes (-f, else -i); false past -e, and before a step that would wrap size_t (-e and
// -f near their limits) or never grow (0 * -f).
bool Bench::next_size(size_t* bytes) const {
  if (opt_.step_factor > 1) {
    const auto factor = static_cast<size_t>(opt_.step_factor);
    if (*bytes == 0 || *bytes > opt_.max_bytes / factor) return false;
    *bytes *= factor;
    return true;
  }
  if (opt_.max_bytes - *bytes < opt_.step_bytes) return false;  // *bytes <= -e: no wrap here
  *bytes += opt_.step_bytes;
  return true;
}

// A codec state (Marsit's compensation, IntSGD's moving average of alpha) learns from the values it
// compressed: each datatype and op sweep starts from fresh ones, so that a cell gives the relerr it
// gives alone (with -d all -o all an int codec's alpha otherwise came from the sweep before).
void Bench::reset_codec_states() {
  for (auto& st : states_) qcclCodecStateDestroy(st.second);
  states_.clear();
}

Shape Bench::shape_for(size_t bytes, const TypeInfo& type, int op, int root) const {
  Shape s{&type, op, root, {}};
  test_.get_counts(bytes / type.size, nranks_, &s.counts);
  return s;
}

void Bench::bench_size(Shape s) {
  const size_t bytes = std::max(s.counts.send, s.counts.recv) * s.type->size;
  const char* op = s.op == Pattern::kCopy ? "none" : kOpNames[s.op];
  if (printer()) table_.print_row_start(bytes, s.counts.param, kTypeNames[s.type->type], op, s.root);
  for (bool in_place : {false, true}) {
    const Cell cell = bench_cell(s, in_place);
    if (cell.ran) bw_sum_ += cell.busbw, ++bw_count_;
    if (cell.wrong > 0 || relerr_fails(cell.relerr)) ++failed_cells_;
    if (codec_ && cell.ran) {
      ++compressed_cells_;
      if (opt_.max_relerr >= 0 && !(cell.relerr < 0)) ++bounded_cells_;  // NaN was checked too (and failed)
      nonfinite_timed_calls_ += cell.nonfinite_calls;
    }
    if (printer()) table_.print_cell(cell);
  }
  if (printer()) table_.print_row_end();
}

// nccl-tests' BenchTime: inputs, one untimed operation and a barrier, the timed batch, then -c checks.
Cell Bench::bench_cell(const Shape& s, bool in_place) {
  Cell cell;
  if (in_place && !test_.has_in_place) return cell;
  if (opt_.check) fill_inputs(s, in_place, pattern(s.type, s.op, 0));
  (void)run_ops(s, in_place, 0, 1);  // untimed: a non-finite result here only feeds the timed calls
  barrier();
  cell.ran = true;
  const double seconds = time_batch(s, in_place, opt_.phases ? &cell.phases : nullptr, &cell.nonfinite_calls);
  // The extra columns show the last timed call (a codec that keeps state, like IntSGD's, runs its
  // untimed first call differently: exact, with more bytes).
  cell.stats = last_stats_;
  cell.seconds = reduce_time(seconds);
  if (test_.point_to_point_codecs && codec_ && cell.stats.wireBytesSent == 0 && cell.stats.wireBytesReceived > 0) {
    // The statistics are those of the call that completed last, here the receive: on the ring every
    // rank receives what its neighbour sent, the same bytes it sends itself, so show those.
    cell.stats.wireBytesSent = cell.stats.wireBytesReceived;
    cell.stats.compressionRatio =
        static_cast<double>(s.counts.param * s.type->size) / static_cast<double>(cell.stats.wireBytesReceived);
  }
  test_.get_bw(s.counts.param, s.type->size, cell.seconds, nranks_, &cell.algbw, &cell.busbw);
  for (int c = 0; c < opt_.check; ++c) {
    if (codec_) {  // lossy: the relative error, not an exact comparison
      if (sign_codec_) break;  // Marsit estimates the average of the signs, not of the values: N/A
      const double relerr = relative_error(s, in_place, check_seed(s, in_place, c));
      cell.relerr = std::isnan(relerr) ? relerr : std::max(cell.relerr, relerr);  // NaN must show (and fail)
      continue;
    }
    cell.wrong = check_cell(s, in_place, check_seed(s, in_place, c));
    if (cell.wrong) break;
  }
  return cell;
}

// A compressed cell fails on a relerr that is not finite (NaN also marks a checked call that returned
// qcclNonFinite) and, with --max-relerr, on one above the bound; -1 (not checked) passes.
bool Bench::relerr_fails(double relerr) const {
  if (!std::isfinite(relerr)) return true;
  return opt_.max_relerr >= 0 && relerr > opt_.max_relerr;
}

// The inputs of check `check` of a cell depend on the cell (and the -N cycle) only, not on what ran
// before it: a cell run alone checks the same values as within -d all -o all, and through a codec gets
// the same relerr.
uint64_t Bench::check_seed(const Shape& s, bool in_place, int check) const {
  uint64_t seed = mix(uint64_t(s.type->type) << 8 | uint64_t(s.op + 1));  // op: kCopy is -1
  seed = mix(seed ^ (uint64_t(s.root + 1) << 32 | uint64_t(cycle_)));  // root: -1 for rootless collectives
  seed = mix(seed ^ s.counts.param);
  return mix(seed ^ (uint64_t(check) << 1 | uint64_t(in_place))) | 1;  // 0 is the timed calls' pattern
}

// Seconds per operation on this rank for one batch of -n operations, issued as -z says.
double Bench::time_batch(const Shape& s, bool in_place, Cell::Phases* phases, int64_t* nonfinite_calls) {
  phases_ = phases;  // run_ops adds each blocking call's time fields to it
  double seconds = 0;
  if (opt_.blocking == 0 || opt_.blocking == 2) {
    last_stats_wanted_ = true;
    const double start = now();
    *nonfinite_calls += run_ops(s, in_place, 0, opt_.iters);
    seconds = (now() - start) / opt_.iters;
  } else {
    double total = 0;
    for (int iter = 0; iter < opt_.iters; ++iter) {
      last_stats_wanted_ = iter + 1 == opt_.iters;
      double start = now();
      if (opt_.blocking == 3) barrier(), start = now();  // -z 3: the barrier is not timed
      *nonfinite_calls += run_ops(s, in_place, iter, 1);
      if (opt_.blocking == 1) barrier();                 // -z 1: the barrier is timed
      total += now() - start;
    }
    seconds = total / opt_.iters;
  }
  phases_ = nullptr;
  last_stats_wanted_ = false;
  if (phases)
    for (double* field : {&phases->seconds, &phases->encode, &phases->decode, &phases->reduce, &phases->transport,
                          &phases->wait, &phases->sleeps})
      *field /= opt_.iters;
  return seconds;
}

void Bench::read_last_stats() {
  last_stats_.size = sizeof last_stats_;
  check(qcclCommGetLastStats(comm_, &last_stats_), "qcclCommGetLastStats");
}

// --phases: the time fields of the call that just completed (read_last_stats), added to the batch's sums.
void Bench::add_phases() {
  const qcclStats_t& stats = last_stats_;
  phases_->seconds += stats.seconds;
  phases_->encode += stats.encodeSeconds;
  phases_->decode += stats.decodeSeconds;
  phases_->reduce += stats.reduceSeconds;
  phases_->transport += stats.transportSeconds;
  phases_->wait += stats.waitSeconds;
  phases_->sleeps += static_cast<double>(stats.wakeups);
}

// Runs operations first_iter .. first_iter + n - 1: blocking calls, or (-z 0) non-blocking calls that
// are all waited for at the end.
int Bench::run_ops(const Shape& s, bool in_place, int first_iter, int n) {
  // In place, a sum feeds its output back as the next input and grows until it overflows the
  // datatype: a compressed collective then returns qcclNonFinite (the communicator stays intact). The
  // caller decides what that means: counted in timing (the footer reports it), a failure in a check,
  // whose inputs are fresh small integers.
  int nonfinite = 0;
  auto ok = [this, &nonfinite](qcclResult_t result, const char* what) {
    if (codec_ && result == qcclNonFinite) ++nonfinite;
    else check(result, what);
  };
  if (opt_.blocking != 0) {
    for (int i = 0; i < n; ++i) {
      ok(test_.run(make_call(s, in_place, first_iter + i), nullptr), test_.call);
      if (phases_ || (last_stats_wanted_ && i + 1 == n)) read_last_stats();
      if (phases_) add_phases();
    }
    return nonfinite;
  }
  Requests requests;
  for (int i = 0; i < n; ++i) ok(test_.run(make_call(s, in_place, first_iter + i), &requests), test_.call);
  for (qcclRequest_t& r : requests.list()) ok(qcclWait(&r), "qcclWait");
  if (last_stats_wanted_) read_last_stats();
  return nonfinite;
}

// nccl-tests' startColl: iteration `iter` works at an offset of iter * size within the -e sized
// buffers (modulo their capacity), to avoid cache effects and to catch races between operations.
Call Bench::make_call(const Shape& s, bool in_place, int iter, bool host) const {
  const size_t es = s.type->size;
  const size_t total = std::max(s.counts.send, s.counts.recv) * es;
  const size_t steps = total ? buffer_bytes_ / total : 1;
  const size_t shift = total * (size_t(iter) % steps);
  const bool device = opt_.device && !host;
  char* recv = (device ? device_recv_.get() : recv_.get()) + shift;
  char* send = (device ? device_send_.get() : send_.get()) + shift;
  if (in_place) send = recv + s.counts.send_in_place * size_t(rank_) * es;
  if (in_place) recv += s.counts.recv_in_place * size_t(rank_) * es;
  const auto op = static_cast<qcclRedOp_t>(s.op == Pattern::kCopy ? qcclSum : s.op);
  Call call{send, recv, s.counts.param, s.type->type, op, s.root, rank_, nranks_, comm_, codec_};
  // Marsit keeps its compensation in a state of the tensor's size, IntSGD its moving average (its first
  // round, the untimed one, is exact; the timed ones are integers).
  if ((sign_codec_ || int_codec_) && s.counts.param > 0) {
    qcclCodecState_t& state = states_[s.counts.param];
    if (!state) {
      check(qcclCodecStateCreate(comm_, s.counts.param, &state), "qcclCodecStateCreate");
      if (int_codec_) check(qcclCodecStateSetLearningRate(state, 1.0), "qcclCodecStateSetLearningRate");
    }
    call.state = state;
  }
  return call;
}

// One check iteration: fresh inputs, one operation, every output element compared with the value
// computed locally from the generator, wrong elements summed over ranks.
int64_t Bench::check_cell(const Shape& s, bool in_place, uint64_t seed) {
  const Pattern p{s.type, s.op, seed, nranks_};
  fill_inputs(s, in_place, p);
  (void)run_ops(s, in_place, 0, 1);  // uncompressed: qcclNonFinite is never returned
  int64_t wrong = count_wrong(s, in_place, p);
  check(qcclAllReduce(&wrong, &wrong, 1, qcclInt64, qcclSum, comm_), "qcclAllReduce (#wrong)");
  return wrong;
}

// One compressed check: fresh inputs, one operation, then ||out - exact||_2 / ||exact||_2 over every
// element of every rank (the sums of squares are all-reduced in float64); NaN when the call returned
// qcclNonFinite, which on these small finite inputs is a fault whatever the outputs hold.
double Bench::relative_error(const Shape& s, bool in_place, uint64_t seed) {
  const Pattern p = pattern(s.type, s.op, seed);
  fill_inputs(s, in_place, p);
  // A reduce-scatter's qcclNonFinite is its rank's block's: summed below, so that every rank judges
  // the cell alike.
  const int nonfinite = run_ops(s, in_place, 0, 1);
  const size_t es = s.type->size;
  download(std::max(s.counts.send, s.counts.recv) * es);
  const Call call = make_call(s, in_place, 0, /*host=*/true);
  const char* out = static_cast<const char*>(call.recvbuff);
  double sums[3] = {0, 0, static_cast<double>(nonfinite)};  // squared error, squared reference, calls
  for (size_t i = 0; i < s.counts.recv; ++i) {
    const Source src = test_.source(i, call);
    int ulps = 0;
    const double want = decode_real(
        *s.type, src.rank == Source::kAllRanks ? reduced_bits(p, src.index, &ulps) : input_bits(p, src.rank, src.index));
    const double got = decode_real(*s.type, load(out + i * es, es));
    sums[0] += (got - want) * (got - want);
    sums[1] += want * want;
  }
  check(qcclAllReduce(sums, sums, 3, qcclFloat64, qcclSum, comm_), "qcclAllReduce (relative error)");
  if (sums[2] > 0) return NAN;
  return sums[1] > 0 ? std::sqrt(sums[0] / sums[1]) : std::sqrt(sums[0]);
}

// Inputs for iteration 0 (offset 0); the output buffer gets a sentinel byte first, so that elements
// the collective fails to write are caught.
void Bench::fill_inputs(const Shape& s, bool in_place, const Pattern& p) {
  const size_t es = s.type->size;
  std::memset(recv_.get(), 0xA5, std::max(s.counts.send, s.counts.recv) * es);
  char* send = const_cast<char*>(static_cast<const char*>(make_call(s, in_place, 0, /*host=*/true).sendbuff));
  for (size_t i = 0; i < s.counts.send; ++i) store(send + i * es, input_bits(p, rank_, i), es);
  upload(std::max(s.counts.send, s.counts.recv) * es);
}

int64_t Bench::count_wrong(const Shape& s, bool in_place, const Pattern& p) {
  if (test_.result_on_root_only && rank_ != s.root) return 0;
  const size_t es = s.type->size;
  download(std::max(s.counts.send, s.counts.recv) * es);
  const Call call = make_call(s, in_place, 0, /*host=*/true);
  const char* out = static_cast<const char*>(call.recvbuff);
  int64_t wrong = 0;
  for (size_t i = 0; i < s.counts.recv; ++i) {
    const Source src = test_.source(i, call);
    int ulps = 0;
    const uint64_t want =
        src.rank == Source::kAllRanks ? reduced_bits(p, src.index, &ulps) : input_bits(p, src.rank, src.index);
    if (!matches(p, load(out + i * es, es), want, ulps)) ++wrong;
  }
  return wrong;
}

void Bench::barrier() {
  int32_t token = 0;
  check(qcclAllReduce(&token, &token, 1, qcclInt32, qcclSum, comm_), "qcclAllReduce (barrier)");
}

// -a: rank 0's time (broadcast), or the mean, min or max over ranks.
double Bench::reduce_time(double seconds) {
  if (opt_.average == 0) {
    check(qcclBroadcast(&seconds, &seconds, 1, qcclFloat64, 0, comm_), "qcclBroadcast (time)");
    return seconds;
  }
  const qcclRedOp_t op = opt_.average == 2 ? qcclMin : opt_.average == 3 ? qcclMax : qcclSum;
  check(qcclAllReduce(&seconds, &seconds, 1, qcclFloat64, op, comm_), "qcclAllReduce (time)");
  return opt_.average == 1 ? seconds / nranks_ : seconds;
}

// QCCL_TESTS_MIN_BW (or NCCL_TESTS_MIN_BW) in GB/s; -1 when unset or empty.
double min_bus_bandwidth() {
  const char* name = "QCCL_TESTS_MIN_BW";
  const char* env = std::getenv(name);
  if (!env || !*env) env = std::getenv(name = "NCCL_TESTS_MIN_BW");
  if (!env || !*env) return -1;
  double v = 0;
  if (!parse_number(env, &v) || !(v >= 0))  // strtod alone took ' 5', '+3' and '0x10'
    throw UsageError(std::string(name) + " = '" + env + "' is not a bandwidth in GB/s");
  return v;
}

// nccl-tests' footer; min_bw (min_bus_bandwidth, -1: none) fails the run below 90% of it.
int Bench::finish(double min_bw) {
  const double avg_bw = bw_count_ ? bw_sum_ / bw_count_ : 0;
  const bool bw_failed = min_bw != -1 && avg_bw < 0.9 * min_bw;
  if (printer()) {
    // Compressed cells pass on any finite relerr unless --max-relerr bounds it: say which it was.
    std::string relerr_note;
    if (compressed_cells_ > 0 && bounded_cells_ == compressed_cells_) {
      relerr_note = formatted(" (relerr bound %g)", opt_.max_relerr);
    } else if (compressed_cells_ > 0 && bounded_cells_ > 0) {
      relerr_note = formatted(" (relerr bound %g in ", opt_.max_relerr) + std::to_string(bounded_cells_) + " of " +
                    std::to_string(compressed_cells_) + " compressed cells; the others' relerr is not bounded)";
    } else if (compressed_cells_ > 0) {
      relerr_note = " (relerr not bounded: see --max-relerr)";
    }
    std::printf("# Out of bounds values : %d %s%s\n", failed_cells_, failed_cells_ ? "FAILED" : "OK",
                relerr_note.c_str());
    if (nonfinite_timed_calls_ > 0) {
      std::printf("# Non-finite results   : %lld timed calls returned qcclNonFinite, timed as they ran (in place, "
                  "sums outgrow the datatype: see --codec in --help)\n",
                  static_cast<long long>(nonfinite_timed_calls_));
    }
    std::printf("# Avg bus bandwidth    : %g %s\n", avg_bw, min_bw == -1 ? "" : bw_failed ? "FAILED" : "OK");
    std::printf("#\n");
  }
  const qcclResult_t destroyed = qcclCommDestroy(comm_);
  comm_ = nullptr;
  check(destroyed, "qcclCommDestroy");
  return failed_cells_ || bw_failed ? 1 : 0;
}

}  // namespace

int run_benchmark(int argc, char** argv, const CollTest& test) {
  setlinebuf(stdout);
  const std::string prog = std::string(test.name) + "_perf";
  Options options;
  try {
    if (!parse_options(argc, argv, test, &options)) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", prog.c_str(), e.what());
    return 2;
  }
  Bench bench(test, options);
  try {
    const double min_bw = min_bus_bandwidth();  // refused before anything runs
    bench.init();
    bench.print_preamble();
    bench.run();
    return bench.finish(min_bw);
  } catch (const UsageError& e) {  // every rank finds the same one (a root beyond the rank count, a bad --algo)
    std::fprintf(stderr, "%s: %s (see --help)\n", prog.c_str(), e.what());
    return 2;  // ~Bench destroys the communicator together with the other ranks
  } catch (const NoDevice& e) {  // found before the communicator is made (Bench::init)
    std::fprintf(stderr, "%s: %s: skipped\n", prog.c_str(), e.what());
    bench.abort();  // none is made yet, unless a device went away since (use_device)
    return 77;
  } catch (const Failure& e) {
    if (bench.rank() >= 0) {
      std::fprintf(stderr, "%s: rank %d: %s\n", prog.c_str(), bench.rank(), e.what());
    } else {
      std::fprintf(stderr, "%s: %s\n", prog.c_str(), e.what());
    }
    bench.abort();
    return 1;
  }
}

}  // namespace qccl_perf
