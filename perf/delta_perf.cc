// delta_perf: AQ-SGD's keyed delta messages (qcclDeltaSend / qcclDeltaRecv) replaying a slowly
// drifting set of sample activations for several epochs, beside plain fp32 qcclSend of the same
// micro-batches, so that the warm-up epoch, the deltas' size and their shrinking error show. Public
// API only, run under qcclrun; docs/PERF.md "AQ-SGD's keyed deltas over 100 Mbit/s" is made from it.
#include <getopt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "demo.h"
#include "qccl.h"

namespace {

using qccl_demo::check;
using qccl_demo::integer;
using qccl_demo::number;
using qccl_demo::refuse_operands;
using qccl_demo::unknown_option;

constexpr const char kHelp[] = R"HELP(NAME
    delta_perf - AQ-SGD's keyed delta messages over a link, epoch by epoch, beside fp32 sends

SYNOPSIS
    qcclrun -n N [--netem RATE] -- delta_perf [--codec SPEC] [--keys K] [--batch B] [--tokens T]
                                              [--channels H] [--epochs E] [--warmup W] [--drift D]
                                              [--seed S]

DESCRIPTION
    Ranks pair up (rank 2i sends to rank 2i + 1; N must be even), as adjacent pipeline stages do.
    K samples each have an activation of T x H float32 values (T tokens, H channels), drawn once
    and then drifting by N(0, D^2) per value at every visit, as a stage's output does while the
    model trains. An epoch visits every sample once in a shuffled order (the same at both ends), B
    samples per call: K / B calls of qcclDeltaSend / qcclDeltaRecv of B rows, keyed by sample. The
    first W epochs are warm-up (every row sent whole, in float16, the store's type); the others send
    deltas under the codec. Each call's rows are also sent with plain qcclSend in float32 right
    before (the baseline, the same bytes a pipeline without compression moves).

    Per epoch the receiving rank of pair 0 prints: mode (warm-up or delta), the median time per
    call of the fp32 send and of the delta call (the delta call's includes its receiver's answer,
    256 bytes, one round trip), their ratio, the bytes per call of each, and the relative error
    ||received - true activation|| / ||true activation|| over the epoch.

OPTIONS
    --codec SPEC     an aq codec (default aq4:channels=H: one fp16 scale per channel per section
                     of a call, qccl.h's qcclDeltaSend)
    --keys K         samples (default 16)
    --batch B        samples per call (default 4; K must be a multiple)
    --tokens T       rows per sample (default 256)
    --channels H     values per row (default 1600: GPT2-1.5B's hidden size)
    --epochs E       epochs (default 4)
    --warmup W       warm-up epochs (default 1)
    --drift D        drift per visit, standard deviation (default 0.01)
    --seed S         seed of the activations and the order (default 1)
    -h, --help       print this page and exit

EXIT STATUS
    0 success; 2 bad usage (a --codec that is no aq codec, too); 3 a qccl call failed (the message
    names it)

EXAMPLES
    qcclrun -n 2 --netem 100mbit -- delta_perf
        a GPT2-sized micro-batch (4 samples of 256 x 1600) over 100 Mbit/s links
)HELP";

struct Options {
  std::string codec;
  size_t keys = 16, batch = 4, tokens = 256, channels = 1600;
  int epochs = 4, warmup = 1;
  double drift = 0.01;
  uint64_t seed = 1;
};

bool parse(int argc, char** argv, Options* o) {
  static const option kLong[] = {{"codec", required_argument, nullptr, 'c'}, {"keys", required_argument, nullptr, 'k'},
                                 {"batch", required_argument, nullptr, 'b'}, {"tokens", required_argument, nullptr, 't'},
                                 {"channels", required_argument, nullptr, 'H'},
                                 {"epochs", required_argument, nullptr, 'e'}, {"warmup", required_argument, nullptr, 'w'},
                                 {"drift", required_argument, nullptr, 'd'}, {"seed", required_argument, nullptr, 's'},
                                 {"help", no_argument, nullptr, 'h'},           {nullptr, 0, nullptr, 0}};
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", kLong, nullptr)) != -1) {
    switch (c) {
      case 'c': o->codec = optarg; break;
      case 'k': o->keys = static_cast<size_t>(integer("--keys", optarg, 1, 1 << 20)); break;
      case 'b': o->batch = static_cast<size_t>(integer("--batch", optarg, 1, 1 << 16)); break;
      case 't': o->tokens = static_cast<size_t>(integer("--tokens", optarg, 1, 1 << 20)); break;
      case 'H': o->channels = static_cast<size_t>(integer("--channels", optarg, 1, 1 << 24)); break;
      case 'e': o->epochs = static_cast<int>(integer("--epochs", optarg, 1, 1000)); break;
      case 'w': o->warmup = static_cast<int>(integer("--warmup", optarg, 0, 1000)); break;
      case 'd': o->drift = number("--drift", optarg, 0, 10); break;
      case 's': o->seed = static_cast<uint64_t>(integer("--seed", optarg, 0, 1e15)); break;
      case 'h': std::fputs(kHelp, stdout); return false;
      default: unknown_option(argv, optind);
    }
  }
  refuse_operands(argc, argv, optind);
  if (o->keys % o->batch) throw qccl_demo::UsageError("--keys must be a multiple of --batch");
  if (o->codec.empty()) o->codec = "aq4:channels=" + std::to_string(o->channels);
  // The codec and a store of these rows are made here, before any rank waits on its peer, and thrown
  // away: a spec qccl refuses, or one that is no aq codec (q8), is a bad command line (exit 2).
  qcclCodec_t codec = nullptr;
  if (qcclCodecCreate(o->codec.c_str(), &codec) != qcclSuccess)
    throw qccl_demo::UsageError("invalid value '" + o->codec + "' for --codec: " + qcclGetLastError(nullptr));
  qcclDeltaStore_t store = nullptr;
  const qcclResult_t made = qcclDeltaStoreCreate(codec, o->tokens * o->channels, qcclFloat16, 0, 0, 1, &store);
  const std::string why = made == qcclSuccess ? "" : qcclGetLastError(nullptr);
  if (made == qcclSuccess) qcclDeltaStoreDestroy(store);
  qcclCodecDestroy(codec);
  if (made != qcclSuccess) throw qccl_demo::UsageError("invalid value '" + o->codec + "' for --codec: " + why);
  return true;
}

// The mean of the two middle values for an even count, as codec_perf's median (4 calls an epoch by
// default: the upper middle alone would be the second slowest).
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int run(const Options& o) {
  qcclComm_t comm = nullptr;
  check(qcclCommInitEnv(&comm, nullptr), "qcclCommInitEnv");
  int rank = 0, nranks = 1;
  check(qcclCommUserRank(comm, &rank), "qcclCommUserRank");
  check(qcclCommCount(comm, &nranks), "qcclCommCount");
  if (nranks % 2) {
    std::fprintf(stderr, "delta_perf: pairs ranks: run it with an even number of ranks, not %d\n", nranks);
    qcclCommDestroy(comm);
    return 2;
  }
  const bool sender = rank % 2 == 0;
  const int peer = sender ? rank + 1 : rank - 1;
  const size_t row = o.tokens * o.channels, call_values = o.batch * row;

  qcclCodec_t codec = nullptr;
  check(qcclCodecCreate(o.codec.c_str(), &codec), "qcclCodecCreate");
  qcclDeltaStore_t store = nullptr;
  check(qcclDeltaStoreCreate(codec, row, qcclFloat16, 0, 0, 1, &store), "qcclDeltaStoreCreate");

  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> truth(o.keys, std::vector<float>(row));
  for (auto& t : truth)
    for (float& v : t) v = normal(rng);
  std::vector<size_t> order(o.keys);
  for (size_t i = 0; i < o.keys; ++i) order[i] = i;
  std::vector<float> x(call_values), out(call_values);
  std::vector<uint64_t> keys(o.batch);

  if (rank == 1)
    std::printf("# delta_perf: %zu samples of %zu x %zu values, %zu per call, codec %s, drift %g\n"
                "# %5s %8s %12s %12s %7s %12s %12s %10s\n",
                o.keys, o.tokens, o.channels, o.batch, o.codec.c_str(), o.drift, "epoch", "mode", "fp32 (ms)",
                "delta (ms)", "speedup", "fp32 (B)", "delta (B)", "relerr");
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const bool warm = epoch < o.warmup;
    check(qcclDeltaStoreSetWarmup(store, warm), "qcclDeltaStoreSetWarmup");
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<double> fp32_times, delta_times;
    double err2 = 0, norm2 = 0, delta_bytes = 0;
    std::normal_distribution<float> drift(0.0f, static_cast<float>(o.drift));
    for (size_t c = 0; c < o.keys / o.batch; ++c) {
      for (size_t b = 0; b < o.batch; ++b) {
        const size_t k = order[c * o.batch + b];
        keys[b] = k;
        for (float& v : truth[k]) v += drift(rng);
        std::copy(truth[k].begin(), truth[k].end(), x.begin() + static_cast<long>(b * row));
      }
      double t0 = seconds();
      if (sender)
        check(qcclSend(x.data(), call_values, qcclFloat32, peer, comm), "qcclSend");
      else
        check(qcclRecv(out.data(), call_values, qcclFloat32, peer, comm), "qcclRecv");
      fp32_times.push_back(seconds() - t0);
      t0 = seconds();
      if (sender)
        check(qcclDeltaSend(x.data(), o.batch, keys.data(), qcclFloat32, store, peer, comm), "qcclDeltaSend");
      else
        check(qcclDeltaRecv(out.data(), o.batch, keys.data(), qcclFloat32, store, peer, comm), "qcclDeltaRecv");
      delta_times.push_back(seconds() - t0);
      qcclDeltaStoreInfo_t info;
      check(qcclDeltaStoreGetInfo(store, &info), "qcclDeltaStoreGetInfo");
      delta_bytes += static_cast<double>(info.lastMessageBytes);
      for (size_t i = 0; i < call_values && !sender; ++i)
        err2 += (double{out[i]} - x[i]) * (double{out[i]} - x[i]), norm2 += double{x[i]} * x[i];
    }
    if (rank == 1) {
      const double f = median(fp32_times), d = median(delta_times);
      std::printf("  %5d %8s %12.2f %12.2f %7.2f %12zu %12.0f %10.3e\n", epoch, warm ? "warm-up" : "delta", f * 1e3,
                  d * 1e3, f / d, call_values * sizeof(float), delta_bytes / static_cast<double>(o.keys / o.batch),
                  std::sqrt(err2 / norm2));
      std::fflush(stdout);
    }
  }
  qcclDeltaStoreDestroy(store);
  qcclCodecDestroy(codec);
  check(qcclCommDestroy(comm), "qcclCommDestroy");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return qccl_demo::demo_main<Options>("delta_perf", argc, argv, parse, run); }
