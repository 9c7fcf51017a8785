// intsgd_convergence: distributed l2-regularized logistic regression on heterogeneous per-rank data,
// trained twice from the same start with the same minibatches: once with float all-reduce (SGD) and
// once with IntSGD's integer all-reduce, to show that IntSGD reaches SGD's loss while every value
// travels as a small integer. docs/PERF.md "IntSGD convergence" is made from its output. Public API
// only, run under qcclrun.
#include <getopt.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "demo.h"
#include "qccl.h"

namespace {

using qccl_demo::check;
using qccl_demo::integer;
using qccl_demo::number;
using qccl_demo::print_losses;
using qccl_demo::refuse_operands;
using qccl_demo::Traffic;
using qccl_demo::unknown_option;
using qccl_demo::UsageError;

constexpr const char kHelp[] = R"HELP(NAME
    intsgd_convergence - logistic regression trained with SGD and with IntSGD's integer all-reduce

SYNOPSIS
    qcclrun -n N [--netem RATE] -- intsgd_convergence [--dim D] [--rows R] [--batch B] [--steps T]
                                                      [--lr LR] [--lambda L] [--wire int8|int16|int32]
                                                      [--alpha lr|grad|A] [--round stochastic|nearest]
                                                      [--seed S] [--every N] [--tolerance F]

DESCRIPTION
    Every rank holds R labelled rows (a, y), y = +-1, of an l2-regularized logistic regression of D
    weights, min over x of
        f(x) = 1 / (N R) * sum over ranks and rows of log(1 + exp(-y a . x)) + L / 2 * |x|^2.
    The data are heterogeneous, as in the paper's experiments (each worker its own slice): rank r's
    features are a ~ N(m_r, 1 / D) per entry with its own mean m_r (entries +-0.5 / sqrt(D), signs from
    the rank's seed), and y = sign(a . x* + 0.5 z) with x* ~ N(0, 1) shared and z ~ N(0, 1), all from
    --seed. From x = 0 it runs T steps twice, drawing the same minibatches of B local rows each time:

      sgd     g = local minibatch gradient; x -= LR * qcclAllReduce(g, avg)
      intsgd  g = local minibatch gradient; qcclCodecStateSetLearningRate(LR);
              x -= LR * qcclAllReduceCompressed(g, avg, "WIRE:alpha=ALPHA,round=ROUND,seed=S")
              (Mishchenko et al., ICLR 2022, Algorithm 1: the first round is exact, then every rank
              sends clip(Int(alpha_k g)) and the integers are summed without decoding, with
              alpha_k = sqrt(D) / sqrt(2 N r_k / LR^2 + eps^2) from the moving average r_k of
              |x^k - x^(k-1)|^2)

    Every --every steps, and at the end, it prints the full loss f(x) of both runs. At the end it
    prints the bits per value each run sent relative to a 32-bit value (8 * wire bytes / raw bytes
    * 32 / 32, from qcclCommGetLastStats, summed over the steps), the largest integer sum any round
    carried (the quantity of the paper's Figure 6; with int8 at N ranks the clip keeps it below 128)
    and the values clipped, and judges the run:

      intsgd's final loss <= (1 + F) * sgd's final loss

    Every rank computes the same x in both runs (the all-reduce results are identical on every rank),
    so rank 0 alone prints.

OPTIONS
    --dim D            weights, the values all-reduced per step (default 1000)
    --rows R           rows per rank (default 2000)
    --batch B          minibatch rows per rank per step, drawn with replacement (default 32)
    --steps T          steps of each run (default 2000)
    --lr LR            the learning rate of both runs (default 0.5)
    --lambda L         the l2 regularization (default 1e-3)
    --wire W           IntSGD's wire type: int8, int16 or int32 (default int8)
    --alpha A          lr (Algorithm 1, the default), grad (learning-rate free: r averages the
                       squared decoded averages) or a fixed positive scale
    --round R          stochastic (unbiased, the default) or nearest
    --seed S           the data, minibatch and rounding seed (default 1)
    --every N          print the losses every N steps (default 250)
    --tolerance F      the relative loss tolerance of the verdict (default 0.02)
    -h, --help         print this page and exit

OUTPUT
    A header, then one row per report: step, the loss of each run, their ratio; then the bits per
    value of each run, the largest integer and the clips, and the verdict. Example (4 ranks):

        step   sgd loss   intsgd loss   intsgd / sgd
        ...
        # bits per value sent: sgd 32.00, intsgd 8.01
        # largest integer sum: 21 (int8 carries up to 127); values clipped: 0
        # intsgd reaches sgd's loss within 2%: yes

EXIT STATUS
    0  the verdict holds
    1  it does not
    2  bad usage
    3  a qccl call failed (the message says which)
)HELP";

struct Options {
  int dim = 1000, rows = 2000, batch = 32, steps = 2000, every = 250;
  double lr = 0.5, lambda = 1e-3, tolerance = 0.02;
  std::string wire = "int8", alpha = "lr", round = "stochastic";
  uint64_t seed = 1;
};

std::string one_of(const char* option, const char* s, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (std::strcmp(s, a) == 0) return s;
  std::string list;
  for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
  throw UsageError(std::string("invalid value '") + s + "' for " + option + " (expected " + list + ")");
}

bool parse(int argc, char** argv, Options* o) {
  enum { kDim = 256, kRows, kBatch, kSteps, kLr, kLambda, kWire, kAlpha, kRound, kSeed, kEvery, kTolerance };
  static const option longs[] = {{"dim", required_argument, nullptr, kDim},
                                 {"rows", required_argument, nullptr, kRows},
                                 {"batch", required_argument, nullptr, kBatch},
                                 {"steps", required_argument, nullptr, kSteps},
                                 {"lr", required_argument, nullptr, kLr},
                                 {"lambda", required_argument, nullptr, kLambda},
                                 {"wire", required_argument, nullptr, kWire},
                                 {"alpha", required_argument, nullptr, kAlpha},
                                 {"round", required_argument, nullptr, kRound},
                                 {"seed", required_argument, nullptr, kSeed},
                                 {"every", required_argument, nullptr, kEvery},
                                 {"tolerance", required_argument, nullptr, kTolerance},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", longs, nullptr)) != -1) {
    switch (c) {
      case kDim: o->dim = static_cast<int>(integer("--dim", optarg, 1, 1 << 24)); break;
      case kRows: o->rows = static_cast<int>(integer("--rows", optarg, 1, 1 << 24)); break;
      case kBatch: o->batch = static_cast<int>(integer("--batch", optarg, 1, 1 << 24)); break;
      case kSteps: o->steps = static_cast<int>(integer("--steps", optarg, 1, 1e9)); break;
      case kLr: o->lr = number("--lr", optarg, 1e-30, 1e6); break;
      case kLambda: o->lambda = number("--lambda", optarg, 0, 1e6); break;
      case kWire: o->wire = one_of("--wire", optarg, {"int8", "int16", "int32"}); break;
      case kAlpha:
        o->alpha = optarg;
        if (o->alpha != "lr" && o->alpha != "grad") number("--alpha", optarg, 1e-30, 3e38);
        break;
      case kRound: o->round = one_of("--round", optarg, {"stochastic", "nearest"}); break;
      case kSeed: o->seed = static_cast<uint64_t>(integer("--seed", optarg, 0, 1e15)); break;
      case kEvery: o->every = static_cast<int>(integer("--every", optarg, 1, 1e9)); break;
      case kTolerance: o->tolerance = number("--tolerance", optarg, 0, 1e6); break;
      case 'h': std::fputs(kHelp, stdout); return false;
      default: unknown_option(argv, optind);
    }
  }
  refuse_operands(argc, argv, optind);
  return true;
}

// This rank's rows (row-major, rows x dim) and labels.
struct Problem {
  int dim, rows;
  std::vector<float> a, y;
};

Problem make_problem(const Options& o, int rank) {
  Problem p{o.dim, o.rows, std::vector<float>(static_cast<size_t>(o.rows) * o.dim), std::vector<float>(o.rows)};
  std::mt19937_64 shared(o.seed);  // x* is the same on every rank
  std::normal_distribution<double> normal;
  std::vector<double> truth(o.dim);
  for (double& v : truth) v = normal(shared);
  std::mt19937_64 mine(o.seed + 1 + static_cast<uint64_t>(rank));
  const double scale = 1.0 / std::sqrt(static_cast<double>(o.dim));
  std::vector<double> mean(o.dim);  // this rank's own feature means: heterogeneous data
  for (double& m : mean) m = (mine() & 1 ? 0.5 : -0.5) * scale;
  for (int i = 0; i < o.rows; ++i) {
    double dot = 0;
    for (int j = 0; j < o.dim; ++j) {
      const double v = mean[j] + normal(mine) * scale;
      p.a[static_cast<size_t>(i) * o.dim + j] = static_cast<float>(v);
      dot += v * truth[j];
    }
    p.y[i] = dot + 0.5 * normal(mine) >= 0 ? 1.0f : -1.0f;
  }
  return p;
}

double sigmoid(double t) { return 1.0 / (1.0 + std::exp(-t)); }

// g = the gradient of the minibatch's mean loss plus lambda x.
void minibatch_gradient(const Problem& p, const std::vector<float>& x, const std::vector<int>& batch, double lambda,
                        std::vector<float>* g) {
  std::vector<double> grad(p.dim, 0.0);
  for (int i : batch) {
    const float* row = &p.a[static_cast<size_t>(i) * p.dim];
    double margin = 0;
    for (int j = 0; j < p.dim; ++j) margin += static_cast<double>(row[j]) * x[j];
    const double weight = -p.y[i] * sigmoid(-p.y[i] * margin);  // d/dm log(1 + exp(-y m))
    for (int j = 0; j < p.dim; ++j) grad[j] += weight * row[j];
  }
  for (int j = 0; j < p.dim; ++j) (*g)[j] = static_cast<float>(grad[j] / static_cast<double>(batch.size()) + lambda * x[j]);
}

// f(x) over every rank's rows.
double loss(const Problem& p, const std::vector<float>& x, double lambda, int nranks, qcclComm_t comm) {
  double sum = 0;
  for (int i = 0; i < p.rows; ++i) {
    const float* row = &p.a[static_cast<size_t>(i) * p.dim];
    double margin = 0;
    for (int j = 0; j < p.dim; ++j) margin += static_cast<double>(row[j]) * x[j];
    const double t = -p.y[i] * margin;
    sum += t > 30 ? t : std::log1p(std::exp(t));
  }
  double total = 0;
  check(qcclAllReduce(&sum, &total, 1, qcclFloat64, qcclSum, comm), "qcclAllReduce (loss)");
  double norm = 0;
  for (float v : x) norm += static_cast<double>(v) * v;
  return total / (static_cast<double>(p.rows) * nranks) + 0.5 * lambda * norm;
}

struct Run {
  std::vector<float> x;
  std::vector<double> losses;
  Traffic traffic;  // what this rank sent
  uint64_t largest = 0, clipped = 0;
};

int run(const Options& o) {
  qcclComm_t comm = nullptr;
  check(qcclCommInitEnv(&comm, nullptr), "qcclCommInitEnv");
  int rank = 0, nranks = 1;
  qcclCommUserRank(comm, &rank);
  qcclCommCount(comm, &nranks);
  const Problem p = make_problem(o, rank);
  const std::string spec = o.wire + ":alpha=" + o.alpha + ",round=" + o.round + ",seed=" + std::to_string(o.seed);
  qcclCodec_t codec = nullptr;
  check(qcclCodecCreate(spec.c_str(), &codec), "qcclCodecCreate");
  qcclCodecState_t state = nullptr;
  check(qcclCodecStateCreate(comm, static_cast<size_t>(o.dim), &state), "qcclCodecStateCreate");
  if (rank == 0) {
    std::printf("# intsgd_convergence: %d ranks, %d weights, %d rows per rank, minibatch %d, %d steps, lr %g, "
                "lambda %g\n", nranks, o.dim, o.rows, o.batch, o.steps, o.lr, o.lambda);
    std::printf("# intsgd codec: %s\n", spec.c_str());
    std::printf("# %8s %14s %14s %14s\n", "step", "sgd loss", "intsgd loss", "intsgd / sgd");
  }
  Run runs[2];
  for (int method = 0; method < 2; ++method) {
    Run& r = runs[method];
    r.x.assign(o.dim, 0.0f);
    std::vector<float> g(o.dim), avg(o.dim);
    std::mt19937_64 batches(o.seed * 7919 + static_cast<uint64_t>(rank));  // the same draws in both runs
    std::uniform_int_distribution<int> pick(0, o.rows - 1);
    std::vector<int> batch(o.batch);
    r.losses.push_back(loss(p, r.x, o.lambda, nranks, comm));
    for (int t = 0; t < o.steps; ++t) {
      for (int& i : batch) i = pick(batches);
      minibatch_gradient(p, r.x, batch, o.lambda, &g);
      if (method == 0) {
        check(qcclAllReduce(g.data(), avg.data(), g.size(), qcclFloat32, qcclAvg, comm), "qcclAllReduce");
      } else {
        check(qcclCodecStateSetLearningRate(state, o.lr), "qcclCodecStateSetLearningRate");
        check(qcclAllReduceCompressed(g.data(), avg.data(), g.size(), qcclFloat32, qcclAvg, codec, state, comm),
              "qcclAllReduceCompressed");
      }
      const qcclStats_t stats = r.traffic.add_last_call(comm, method == 1);
      r.largest = std::max<uint64_t>(r.largest, stats.largestInteger);
      r.clipped += stats.clippedValues;
      for (int j = 0; j < o.dim; ++j) r.x[j] -= static_cast<float>(o.lr) * avg[j];
      if ((t + 1) % o.every == 0 || t + 1 == o.steps) r.losses.push_back(loss(p, r.x, o.lambda, nranks, comm));
    }
  }
  uint64_t clipped = runs[1].clipped;
  check(qcclAllReduce(&clipped, &clipped, 1, qcclUint64, qcclSum, comm), "qcclAllReduce (clips)");
  int status = 0;
  if (rank == 0) {
    print_losses(runs[0].losses, runs[1].losses, o.every, o.steps);
    auto bits = [](const Run& r) { return r.traffic.bits_per_value(); };
    std::printf("# bits per value sent: sgd %.2f, intsgd %.2f\n", bits(runs[0]), bits(runs[1]));
    const int wire_bits = std::atoi(o.wire.c_str() + 3);
    std::printf("# largest integer sum: %llu (%s carries up to %lld); values clipped: %llu\n",
                static_cast<unsigned long long>(runs[1].largest), o.wire.c_str(),
                static_cast<long long>((int64_t{1} << (wire_bits - 1)) - 1), static_cast<unsigned long long>(clipped));
    const bool close = runs[1].losses.back() <= (1 + o.tolerance) * runs[0].losses.back();
    std::printf("# intsgd reaches sgd's loss within %g%%: %s\n", 100 * o.tolerance, close ? "yes" : "no");
    status = close ? 0 : 1;
  }
  check(qcclBroadcast(&status, &status, 1, qcclInt32, 0, comm), "qcclBroadcast");
  qcclCodecStateDestroy(state);
  qcclCodecDestroy(codec);
  qcclCommDestroy(comm);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  return qccl_demo::demo_main<Options>("intsgd_convergence", argc, argv, parse, run);
}
