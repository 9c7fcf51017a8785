// gloo_allreduce_perf: Gloo's all-reduce (float, sum) over TCP, printed as nccl-tests' table, so that
// it reads side by side with all_reduce_perf. Timing and checking: see baseline_common.h.
//
// Gloo 0.5.0 as Debian ships it (libgloo-dev 0.0~git20220518) offers two ring all-reduces:
//   -A ring          gloo::allreduce() with AllreduceOptions::Algorithm::RING (the default): the
//                    function-style API that PyTorch's ProcessGroupGloo uses; reduce-scatter then
//                    all-gather in segments of at most 1 MiB; out of place.
//   -A ring_chunked  the class gloo::AllreduceRingChunked<float>: 2n chunks around the ring, in place;
//                    the class binds its buffer when constructed, so every timed operation works at
//                    offset 0, and the row's numbers appear in the in-place half of the table.
//
// Ranks: QCCL_RANK / QCCL_NRANKS (qcclrun), else OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (mpirun).
// Rendezvous: a gloo::rendezvous::FileStore in the directory given by -s, namespaced by QCCL_MAGIC
// (new for every qcclrun job) so that a reused directory cannot join two jobs; -s must still be a
// directory no other concurrent job uses with the same prefix.
//
//   qcclrun -n 4 -- gloo_allreduce_perf -s "$(mktemp -d)" -b 64K -e 256M -f 2 -n 20
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "baseline_common.h"

namespace {

const char kUsage[] =
    "usage: qcclrun -n N -- gloo_allreduce_perf -s DIR [-H HOST] [-A ring|ring_chunked] [-b SIZE] [-e SIZE]\n"
    "           [-f N] [-n N] [-w N] [-c 0|1] [-a N]\n"
    "  Times Gloo's ring all-reduce (float, sum) over TCP, blocking calls back to back.\n"
    "    -s DIR    FileStore directory for the rendezvous (required; shared by the ranks)\n"
    "    -H HOST   address of the TCP device (default 127.0.0.1)\n"
    "    -A ALGO   ring: gloo::allreduce, RING, out of place (default);\n"
    "              ring_chunked: gloo::AllreduceRingChunked<float>, in place at offset 0\n"
    "  Ranks from QCCL_RANK/QCCL_NRANKS, else OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE.\n" BASELINE_COMMON_USAGE;

constexpr std::chrono::seconds kTimeout(300);  // per operation; 256 MiB on 4 ranks / 2 cores is ~1 s

struct Extra {
  std::string store_dir;
  std::string host = "127.0.0.1";
  bool chunked = false;
};

int on_extra(int letter, const char* value, void* ctx) {
  Extra* e = static_cast<Extra*>(ctx);
  switch (letter) {
    case 's': e->store_dir = value; return 1;
    case 'H': e->host = value; return 1;
    case 'A':
      if (!std::strcmp(value, "ring")) e->chunked = false;
      else if (!std::strcmp(value, "ring_chunked")) e->chunked = true;
      else return 0;
      return 1;
    default: return 0;
  }
}

// The first of the launcher variables that is set, or -1.
int env_int(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  if (!v) v = std::getenv(fallback);
  return v ? std::atoi(v) : -1;
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

class Bench {
 public:
  Bench(std::shared_ptr<gloo::Context> context, const baseline_options& opt, bool chunked)
      : ctx_(std::move(context)), opt_(opt), chunked_(chunked),
        send_(static_cast<float*>(baseline_alloc(opt.max_bytes))),
        recv_(static_cast<float*>(baseline_alloc(opt.max_bytes))) {
    if (!send_ || !recv_) throw std::runtime_error("cannot allocate 2 x " + std::to_string(opt.max_bytes) + " bytes");
    baseline_fill_send(send_, opt.max_bytes / sizeof(float), ctx_->rank);
  }
  ~Bench() {
    std::free(send_);
    std::free(recv_);
  }

  void print_preamble(const char* algo);
  int run();  // the sweep; returns the number of failed checks

 private:
  int64_t bench_size(size_t bytes, double* seconds);
  void allreduce_at(size_t bytes, size_t offset);
  void barrier();
  double combine_time(double seconds);
  template <typename T>
  void allreduce_small(T* data, size_t n, ReduceFn fn);

  std::shared_ptr<gloo::Context> ctx_;
  baseline_options opt_;
  bool chunked_;
  float* send_;
  float* recv_;
  // ring_chunked: the algorithm object of the current size, bound to recv_ at offset 0.
  std::unique_ptr<gloo::AllreduceRingChunked<float>> chunked_algo_;
  uint32_t tag_ = 0;  // every gloo:: call gets a new tag, as ProcessGroupGloo does
};

// Out of place, the function-style API: Gloo copies the input to the output, then runs the ring on it.
void Bench::allreduce_at(size_t bytes, size_t offset) {
  const size_t count = bytes / sizeof(float);
  if (chunked_) {
    chunked_algo_->run();
    return;
  }
  gloo::AllreduceOptions opts(ctx_);
  opts.setInput(reinterpret_cast<float*>(reinterpret_cast<char*>(send_) + offset), count);
  opts.setOutput(reinterpret_cast<float*>(reinterpret_cast<char*>(recv_) + offset), count);
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
  opts.setTag(tag_++);
  opts.setTimeout(kTimeout);
  gloo::allreduce(opts);
}

void Bench::barrier() {
  gloo::BarrierOptions opts(ctx_);
  opts.setTag(tag_++);
  opts.setTimeout(kTimeout);
  gloo::barrier(opts);
}

template <typename T>
void Bench::allreduce_small(T* data, size_t n, ReduceFn fn) {
  gloo::AllreduceOptions opts(ctx_);
  opts.setOutput(data, n);
  opts.setReduceFunction(fn);
  opts.setTag(tag_++);
  opts.setTimeout(kTimeout);
  gloo::allreduce(opts);
}

// nccl-tests -a: rank 0's time, or the mean, min or max over ranks; one all-reduce of every rank's
// time in its own slot serves all four.
double Bench::combine_time(double seconds) {
  std::vector<double> all(ctx_->size, 0.0);
  all[ctx_->rank] = seconds;
  allreduce_small(all.data(), all.size(), static_cast<ReduceFn>(&gloo::sum<double>));
  double sum = 0, lo = all[0], hi = all[0];
  for (double t : all) sum += t, lo = std::min(lo, t), hi = std::max(hi, t);
  switch (opt_.average) {
    case 0: return all[0];
    case 2: return lo;
    case 3: return hi;
    default: return sum / ctx_->size;
  }
}

// One row: an untimed operation, a barrier, -n timed operations, then the check. Returns #wrong
// summed over ranks (-1 when not checked) and the combined time per operation in *seconds.
int64_t Bench::bench_size(size_t bytes, double* seconds) {
  const size_t count = bytes / sizeof(float);
  if (chunked_) {
    std::memcpy(recv_, send_, count * sizeof(float));
    chunked_algo_ = std::make_unique<gloo::AllreduceRingChunked<float>>(ctx_, std::vector<float*>{recv_}, int(count));
  }
  allreduce_at(bytes, 0);
  barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < opt_.iters; ++i) allreduce_at(bytes, chunked_ ? 0 : baseline_offset(bytes, opt_.max_bytes, i));
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  *seconds = combine_time(elapsed.count() / opt_.iters);
  if (!opt_.check) return -1;
  if (chunked_) {
    std::memcpy(recv_, send_, count * sizeof(float));  // in place: the input is the output buffer
  } else {
    baseline_poison(recv_, count);
  }
  allreduce_at(bytes, 0);
  int64_t wrong = baseline_count_wrong(recv_, count, ctx_->size);
  allreduce_small(&wrong, 1, static_cast<ReduceFn>(&gloo::sum<int64_t>));
  return wrong;
}

void Bench::print_preamble(const char* algo) {
  struct RankInfo {
    char host[64];
    int32_t pid;
  } mine{}, none{};
  gethostname(mine.host, sizeof mine.host - 1);
  mine.pid = getpid();
  std::vector<RankInfo> all(ctx_->size, none);
  gloo::AllgatherOptions opts(ctx_);
  opts.setInput(reinterpret_cast<char*>(&mine), sizeof mine);
  opts.setOutput(reinterpret_cast<char*>(all.data()), sizeof mine * all.size());
  opts.setTag(tag_++);
  gloo::allgather(opts);
  if (ctx_->rank != 0) return;
  baseline_print_params(&opt_);
  std::printf("# Gloo %d.%d.%d %s over TCP (%s)\n#\n# Using devices\n", GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR,
              GLOO_VERSION_PATCH, algo, ctx_->getDevice()->str().c_str());
  for (int r = 0; r < ctx_->size; ++r) baseline_print_rank(r, all[r].pid, all[r].host);
}

// nccl-tests' TimeTest: a barrier, warm-up at the largest and the smallest size, then every size.
int Bench::run() {
  const bool printer = ctx_->rank == 0;
  if (printer) baseline_print_header();
  barrier();
  if (!chunked_) {  // ring_chunked warms up in bench_size, which builds its object
    for (int i = 0; i < opt_.warmup; ++i) allreduce_at(opt_.max_bytes, 0);
    for (int i = 0; i < opt_.warmup; ++i) allreduce_at(opt_.min_bytes, 0);
  }
  int failed = 0, bw_count = 0;
  double bw_sum = 0;
  for (size_t bytes = opt_.min_bytes; bytes <= opt_.max_bytes; bytes *= size_t(opt_.step_factor)) {
    barrier();
    double seconds = 0, busbw = 0;
    const int64_t wrong = bench_size(bytes, &seconds);
    failed += wrong > 0;
    if (printer) baseline_print_row(bytes, seconds, ctx_->size, wrong, chunked_, &busbw);
    bw_sum += busbw;
    ++bw_count;
  }
  chunked_algo_.reset();
  if (printer) baseline_print_footer(failed, bw_sum, bw_count);
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  setlinebuf(stdout);
  baseline_options opt = baseline_default_options();
  Extra extra;
  const int parsed = baseline_parse(argc, argv, kUsage, "s:H:A:", on_extra, &extra, &opt);
  if (parsed) return parsed == 1 ? 0 : 2;
  const int rank = env_int("QCCL_RANK", "OMPI_COMM_WORLD_RANK");
  const int nranks = env_int("QCCL_NRANKS", "OMPI_COMM_WORLD_SIZE");
  if (extra.store_dir.empty() || rank < 0 || nranks < 1 || rank >= nranks) {
    std::fprintf(stderr, "%s: needs -s DIR and QCCL_RANK/QCCL_NRANKS (or mpirun's OMPI_COMM_WORLD_*)\n%s", argv[0],
                 kUsage);
    return 2;
  }
  if (opt.max_bytes / sizeof(float) > 0x7fffffff) {
    std::fprintf(stderr, "%s: -e too large for Gloo's int counts\n", argv[0]);
    return 2;
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = extra.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(extra.store_dir);
    const char* magic = std::getenv("QCCL_MAGIC");
    gloo::rendezvous::PrefixStore store(magic ? magic : "gloo_allreduce_perf", file_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    context->setTimeout(kTimeout);
    context->connectFullMesh(store, device);

    Bench bench(context, opt, extra.chunked);
    bench.print_preamble(extra.chunked ? "AllreduceRingChunked<float>" : "allreduce(RING)");
    return bench.run() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", argv[0], rank, e.what());
    return 1;
  }
}
