// fft_convergence: a smooth least-squares problem trained data-parallel with the gradients averaged
// in full precision, through the fft codec (FFT sparsification) at several theta, and through
// spatial top-k sending the same bytes, to show where the spectrum keeps what the gradient carries.
// docs/PERF.md "FFT sparsification: convergence" is made from its output. Public API only, run
// under qcclrun.
#include <getopt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
    fft_convergence - least squares with spatially correlated gradients, averaged exactly, by FFT
                      sparsification, and by spatial top-k at the same bytes

SYNOPSIS
    qcclrun -n N [--netem RATE] -- fft_convergence [--dim D] [--width S] [--batch B] [--steps T]
                                                   [--lr LR] [--bits N] [--mant M] [--range first|auto]
                                                   [--seed S] [--tolerance F]

DESCRIPTION
    A signal w* of D values, smooth along its index (five random sines), is seen through a blur:
    observation i is k_i . w* + noise, with k_i a Gaussian of width S centred on i (weights summing
    to 1) and noise N(0, 0.01^2). Every rank holds all D observations with its own noise. One step
    of data-parallel SGD on the mean squared error:

      g = the gradient of the loss of B observations drawn at random (a sum of Gaussian bumps:
          smooth, so its spectrum is concentrated in few bins)
      w -= LR * average over the ranks of g

    Each configuration runs T steps from w = 0 with the same draws: fp32 (qcclAllReduce), the fft
    codec at theta = 0.5, 0.85 and 0.9 (qcclAllReduceCompressed, "fft:theta=T,bits=N,mant=M,max=X":
    X the power of two above the first gradient's norm, the range the paper estimates from the
    first iterations; no error feedback, as in the paper), and spatial top-k at theta 0.85 and 0.9: every
    rank sends the k of its gradient's values of largest magnitude with their indices, 8 bytes
    each, k chosen so that a rank sends what the fft run at that theta sent (qcclAllGather of the
    pairs; every rank adds them in rank order). It prints the loss over every rank's observations
    every T / 10 steps, the final losses and the bytes each configuration sent (all ranks), and
    judges:

      fft at theta 0.5: final loss <= (1 + F) * fp32's
      fft at theta 0.85 and 0.9: final loss below spatial top-k's at the same bytes

OPTIONS
    --dim D          values of w (default 16384: one FFT segment)
    --width S        the blur's standard deviation in values (default 8)
    --batch B        observations per rank per step (default 64)
    --steps T        steps per configuration (default 400)
    --lr LR          the learning rate (default 400)
    --bits N         the fft codec's bits per part (default 10, the paper's)
    --mant M         its mantissa bits (default 4: 2^(N-1-M) binades below the range, enough for
                     a gradient that shrinks over training; the codec's default 6 spans 8)
    --range R        first: max = the power of two above the first gradient's norm (default, the
                     paper's way); auto: max=auto, each segment's own power of two, which follows
                     the gradient as it shrinks
    --seed S         signal, noise and draw seed (default 1)
    --tolerance F    the relative loss tolerance of the verdict (default 0.05)
    -h, --help       print this page and exit

EXIT STATUS
    0  the verdict holds
    1  it does not
    2  bad usage
    3  a qccl call failed (the message says which)
)HELP";

struct Options {
  int dim = 16384, width = 8, batch = 64, steps = 400, bits = 10, mant = 4;
  bool auto_range = false;
  double lr = 400, tolerance = 0.05;
  uint64_t seed = 1;
};

bool parse(int argc, char** argv, Options* o) {
  enum { kDim = 256, kWidth, kBatch, kSteps, kLr, kBits, kMant, kRange, kSeed, kTolerance };
  static const option longs[] = {{"dim", required_argument, nullptr, kDim},
                                 {"width", required_argument, nullptr, kWidth},
                                 {"batch", required_argument, nullptr, kBatch},
                                 {"steps", required_argument, nullptr, kSteps},
                                 {"lr", required_argument, nullptr, kLr},
                                 {"bits", required_argument, nullptr, kBits},
                                 {"mant", required_argument, nullptr, kMant},
                                 {"range", required_argument, nullptr, kRange},
                                 {"seed", required_argument, nullptr, kSeed},
                                 {"tolerance", required_argument, nullptr, kTolerance},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", longs, nullptr)) != -1) {
    switch (c) {
      case kDim: o->dim = static_cast<int>(integer("--dim", optarg, 64, 1 << 24)); break;
      case kWidth: o->width = static_cast<int>(integer("--width", optarg, 1, 1 << 12)); break;
      case kBatch: o->batch = static_cast<int>(integer("--batch", optarg, 1, 1 << 22)); break;
      case kSteps: o->steps = static_cast<int>(integer("--steps", optarg, 1, 1e9)); break;
      case kLr: o->lr = number("--lr", optarg, 1e-30, 1e9); break;
      case kBits: o->bits = static_cast<int>(integer("--bits", optarg, 3, 16)); break;
      case kMant: o->mant = static_cast<int>(integer("--mant", optarg, 1, 15)); break;
      case kRange:
        if (std::string(optarg) != "first" && std::string(optarg) != "auto")
          throw qccl_demo::UsageError(std::string("invalid value '") + optarg + "' for --range (expected first or auto)");
        o->auto_range = std::string(optarg) == "auto";
        break;
      case kSeed: o->seed = static_cast<uint64_t>(integer("--seed", optarg, 0, 1e15)); break;
      case kTolerance: o->tolerance = number("--tolerance", optarg, 0, 1e6); break;
      case 'h': std::fputs(kHelp, stdout); return false;
      default: unknown_option(argv, optind);
    }
  }
  refuse_operands(argc, argv, optind);
  return true;
}

// The blur: observation i weighs w[i + j] by kernel[j + reach], circularly.
struct Problem {
  int dim, reach;
  std::vector<double> kernel;
  std::vector<double> observed;  // this rank's D observations
  double predict(const std::vector<float>& w, int i) const {
    double s = 0;
    for (int j = -reach; j <= reach; ++j) s += kernel[j + reach] * w[(i + j + dim) % dim];
    return s;
  }
};

Problem make_problem(const Options& o, int rank) {
  Problem p{o.dim, 4 * o.width, {}, {}};
  double total = 0;
  for (int j = -p.reach; j <= p.reach; ++j)
    total += p.kernel.emplace_back(std::exp(-0.5 * double(j) * j / (double(o.width) * o.width)));
  for (double& k : p.kernel) k /= total;
  std::mt19937_64 shared(o.seed);
  std::uniform_real_distribution<double> phase(0, 6.283185307179586);
  std::vector<float> truth(o.dim, 0.0f);
  for (int f = 1; f <= 5; ++f) {
    const double a = 1.0 / f, ph = phase(shared), freq = 6.283185307179586 * (3 * f) / o.dim;
    for (int i = 0; i < o.dim; ++i) truth[i] += static_cast<float>(a * std::sin(freq * i + ph));
  }
  std::mt19937_64 mine(o.seed * 1000003 + 17 + static_cast<uint64_t>(rank));
  std::normal_distribution<double> noise(0.0, 0.01);
  for (int i = 0; i < o.dim; ++i) p.observed.push_back(p.predict(truth, i) + noise(mine));
  return p;
}

// g = the gradient of (1 / 2B) sum over the batch of (k_i . w - observed_i)^2.
void gradient(const Problem& p, const std::vector<float>& w, const std::vector<int>& batch, std::vector<float>* g) {
  std::fill(g->begin(), g->end(), 0.0f);
  for (int i : batch) {
    const double e = (p.predict(w, i) - p.observed[i]) / static_cast<double>(batch.size());
    for (int j = -p.reach; j <= p.reach; ++j) (*g)[(i + j + p.dim) % p.dim] += static_cast<float>(e * p.kernel[j + p.reach]);
  }
}

// The mean squared error over every rank's observations (halved).
double loss(const Problem& p, const std::vector<float>& w, qcclComm_t comm) {
  double sums[2] = {0, static_cast<double>(p.dim)};
  for (int i = 0; i < p.dim; ++i) sums[0] += 0.5 * std::pow(p.predict(w, i) - p.observed[i], 2);
  check(qcclAllReduce(sums, sums, 2, qcclFloat64, qcclSum, comm), "qcclAllReduce (loss)");
  return sums[0] / sums[1];
}

struct Config {
  std::string name;
  double theta;  // 0 with fft false: fp32
  bool fft;      // else spatial top-k (theta > 0) or fp32
};

struct Outcome {
  std::vector<double> losses;
  double wire = 0;     // bytes sent, all ranks
  double per_call = 0; // bytes one rank sent per call (fft: the mean)
};

int run(const Options& o) {
  qcclComm_t comm = nullptr;
  check(qcclCommInitEnv(&comm, nullptr), "qcclCommInitEnv");
  int rank = 0, nranks = 1;
  qcclCommUserRank(comm, &rank);
  qcclCommCount(comm, &nranks);
  const Problem p = make_problem(o, rank);
  const size_t d = static_cast<size_t>(o.dim);
  const int every = std::max(1, o.steps / 10);

  // The range: the power of two above the first gradient's norm (the largest over the ranks).
  std::vector<float> w(d, 0.0f), g(d), avg(d);
  std::vector<int> batch(o.batch);
  {
    std::mt19937_64 draws(o.seed * 7919 + static_cast<uint64_t>(rank));
    std::uniform_int_distribution<int> pick(0, o.dim - 1);
    for (int& i : batch) i = pick(draws);
    gradient(p, w, batch, &g);
  }
  double norm = 0;
  for (float v : g) norm += double(v) * v;
  norm = std::sqrt(norm);
  check(qcclAllReduce(&norm, &norm, 1, qcclFloat64, qcclMax, comm), "qcclAllReduce (range)");
  const double range = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(norm))));

  const std::vector<Config> configs = {{"fp32", 0, false},        {"fft 0.5", 0.5, true},   {"fft 0.85", 0.85, true},
                                       {"top-k 0.85", 0.85, false}, {"fft 0.9", 0.9, true}, {"top-k 0.9", 0.9, false}};
  if (rank == 0)
    std::printf("# fft_convergence: %d ranks, %d values, blur width %d, batch %d, %d steps, lr %g, %d bits (%d mantissa), "
                "range %s\n",
                nranks, o.dim, o.width, o.batch, o.steps, o.lr, o.bits, o.mant,
                o.auto_range ? "auto (per segment)" : std::to_string(range).c_str());
  std::vector<Outcome> outcomes;
  double fft_bytes_at[2] = {0, 0};  // per rank per call, for theta 0.85 and 0.9
  for (const Config& config : configs) {
    qcclCodec_t codec = nullptr;
    if (config.fft) {
      char spec[160];
      const std::string max = o.auto_range ? std::string("auto") : std::to_string(range);
      std::snprintf(spec, sizeof spec, "fft:theta=%g,bits=%d,mant=%d,max=%s,segment=%d", config.theta, o.bits, o.mant,
                    max.c_str(), o.dim);
      check(qcclCodecCreate(spec, &codec), "qcclCodecCreate");
    }
    const bool topk = !config.fft && config.theta > 0;
    const size_t k = topk ? std::max<size_t>(1, static_cast<size_t>(fft_bytes_at[config.theta > 0.87] / 8)) : 0;
    std::vector<uint32_t> mine(2 * k), all(2 * k * static_cast<size_t>(nranks));
    std::vector<uint32_t> order(d);
    Outcome out;
    std::fill(w.begin(), w.end(), 0.0f);
    std::mt19937_64 draws(o.seed * 7919 + static_cast<uint64_t>(rank));  // the same draws in every run
    std::uniform_int_distribution<int> pick(0, o.dim - 1);
    for (int t = 0; t <= o.steps; ++t) {
      if (t % every == 0 || t == o.steps) out.losses.push_back(loss(p, w, comm));
      if (t == o.steps) break;
      for (int& i : batch) i = pick(draws);
      gradient(p, w, batch, &g);
      if (codec) {
        check(qcclAllReduceCompressed(g.data(), avg.data(), d, qcclFloat32, qcclAvg, codec, nullptr, comm),
              "qcclAllReduceCompressed");
      } else if (topk) {
        // The k values of largest magnitude (ties to the lower index), as (index, float bits) pairs.
        for (size_t j = 0; j < d; ++j) order[j] = static_cast<uint32_t>(j);
        std::nth_element(order.begin(), order.begin() + static_cast<long>(k) - 1, order.end(), [&](uint32_t a, uint32_t b) {
          return std::fabs(g[a]) > std::fabs(g[b]) || (std::fabs(g[a]) == std::fabs(g[b]) && a < b);
        });
        for (size_t j = 0; j < k; ++j) {
          mine[2 * j] = order[j];
          std::memcpy(&mine[2 * j + 1], &g[order[j]], 4);
        }
        check(qcclAllGather(mine.data(), all.data(), 2 * k, qcclUint32, comm), "qcclAllGather (top-k)");
        std::fill(avg.begin(), avg.end(), 0.0f);
        for (size_t j = 0; j < all.size(); j += 2) {
          float v;
          std::memcpy(&v, &all[j + 1], 4);
          avg[all[j]] += v / static_cast<float>(nranks);
        }
      } else {
        check(qcclAllReduce(g.data(), avg.data(), d, qcclFloat32, qcclAvg, comm), "qcclAllReduce");
      }
      qcclStats_t stats{};
      stats.size = sizeof(stats);
      check(qcclCommGetLastStats(comm, &stats), "qcclCommGetLastStats");
      out.wire += static_cast<double>(stats.wireBytesSent);
      for (size_t j = 0; j < d; ++j) w[j] -= static_cast<float>(o.lr) * avg[j];
    }
    check(qcclAllReduce(&out.wire, &out.wire, 1, qcclFloat64, qcclSum, comm), "qcclAllReduce (bytes)");
    out.per_call = out.wire / nranks / o.steps;
    // What a rank sent the others per call, per other rank: the payload top-k must match.
    if (config.fft && config.theta > 0.8) fft_bytes_at[config.theta > 0.87] = out.per_call / std::max(1, nranks - 1);
    outcomes.push_back(out);
    if (codec) qcclCodecDestroy(codec);
  }
  int status = 0;
  if (rank == 0) {
    std::printf("# %8s", "step");
    for (const Config& c : configs) std::printf(" %12s", c.name.c_str());
    std::printf("\n");
    for (size_t i = 0; i < outcomes[0].losses.size(); ++i) {
      std::printf("  %8d", std::min(static_cast<int>(i) * every, o.steps));
      for (const Outcome& out : outcomes) std::printf(" %12.6g", out.losses[i]);
      std::printf("\n");
    }
    const double reference = outcomes[0].losses.back();
    for (size_t c = 0; c < configs.size(); ++c)
      std::printf("# %-10s final loss %.6g (%.4f of fp32); bytes sent %.4g (%.4f of fp32), %.0f per rank per call\n",
                  configs[c].name.c_str(), outcomes[c].losses.back(), outcomes[c].losses.back() / reference,
                  outcomes[c].wire, outcomes[c].wire / outcomes[0].wire, outcomes[c].per_call);
    const bool close = outcomes[1].losses.back() <= (1 + o.tolerance) * reference;
    const bool beats85 = outcomes[2].losses.back() < outcomes[3].losses.back();
    const bool beats90 = outcomes[4].losses.back() < outcomes[5].losses.back();
    std::printf("# fft 0.5 within %g%% of fp32: %s; fft below top-k at the same bytes, theta 0.85: %s, 0.9: %s\n",
                100 * o.tolerance, close ? "yes" : "no", beats85 ? "yes" : "no", beats90 ? "yes" : "no");
    status = close && beats85 && beats90 ? 0 : 1;
  }
  check(qcclBroadcast(&status, &status, 1, qcclInt32, 0, comm), "qcclBroadcast");
  qcclCommDestroy(comm);
  return status;
}

}  // namespace

int main(int argc, char** argv) { return qccl_demo::demo_main<Options>("fft_convergence", argc, argv, parse, run); }
