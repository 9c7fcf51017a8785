// qsdp_training: a softmax classifier trained FSDP-style (each rank holds a shard of the parameters,
// all-gathers the weights, computes its gradient, reduce-scatters the gradients and updates its
// shard) in full precision and with QSDP's quantized AllGather and ReduceScatter at the paper's
// W8G8, W5G4 and W4G4, to show the quantized runs reaching full precision's loss. docs/PERF.md
// "QSDP training" is made from its output. Public API only, run under qcclrun (with --nodes or
// QCCL_NODE_MAP, the collectives go hierarchical).
#include <getopt.h>

#include <algorithm>
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
using qccl_demo::UsageError;

constexpr const char kHelp[] = R"HELP(NAME
    qsdp_training - a classifier trained FSDP-style with quantized weight AllGather and gradient
                    ReduceScatter (QSDP), against full precision

SYNOPSIS
    qcclrun -n N [--nodes K] [--netem RATE] -- qsdp_training [--features D] [--classes C] [--rows R]
                                                             [--batch B] [--steps T] [--lr LR]
                                                             [--bucket S] [--seed S] [--tolerance F]

DESCRIPTION
    Every rank holds R labelled rows (a, c) of a C-class problem in D features: class means
    m_c ~ N(0, 1/D) per entry, a = m_c + N(0, 64/D) per entry, c uniform, all from --seed (each rank
    its own rows). The model is a softmax regression, logits = W a + b, with P = C (D + 1)
    parameters, flattened and padded to a multiple of N; rank r keeps shard r (P / N values) in
    float32. One step, as PyTorch FSDP runs it [QSDP, Markov et al., ICML 2023, §3.3]:

      w = AllGather(shard)                      (quantized: qcclAllGatherCompressed, "qWB:round=nearest")
      g = the gradient of the mean cross-entropy of a minibatch of B local rows at w
      gshard = ReduceScatter(g, avg)            (quantized: qcclReduceScatterCompressed, "qGB:round=stochastic")
      shard -= LR * gshard

    Each configuration runs T steps from zero weights with the same minibatches: fp32 (the
    uncompressed qcclAllGather and qcclReduceScatter), then W8G8, W5G4 and W4G4 (weights and
    gradients quantized to that many bits in buckets of S values, each rank's shard encoded once by
    its owner and decoded by every rank, the owner too, so that all ranks compute on the same
    weights). It prints the full loss of the weights every rank holds (the gathered ones) every
    T / 10 steps, the final loss and accuracy over every rank's rows, and the bytes each
    configuration sent (all ranks together; and the part that went to other nodes, which with a
    node map of several nodes is what crosses the slow links), relative to fp32, and judges:

      every quantized run's final loss <= (1 + F) * fp32's final loss

OPTIONS
    --features D     features (default 1024)
    --classes C      classes (default 10)
    --rows R         rows per rank (default 2000)
    --batch B        minibatch rows per rank per step (default 64)
    --steps T        steps per configuration (default 300)
    --lr LR          the learning rate (default 0.5)
    --bucket S       the quantizers' bucket (default 1024, the paper's)
    --seed S         data, minibatch and rounding seed (default 1)
    --tolerance F    the relative loss tolerance of the verdict (default 0.03)
    -h, --help       print this page and exit

EXIT STATUS
    0  the verdict holds
    1  it does not
    2  bad usage
    3  a qccl call failed (the message says which)
)HELP";

struct Options {
  int features = 1024, classes = 10, rows = 2000, batch = 64, steps = 300, bucket = 1024;
  double lr = 0.5, tolerance = 0.03;
  uint64_t seed = 1;
};

bool parse(int argc, char** argv, Options* o) {
  enum { kFeatures = 256, kClasses, kRows, kBatch, kSteps, kLr, kBucket, kSeed, kTolerance };
  static const option longs[] = {{"features", required_argument, nullptr, kFeatures},
                                 {"classes", required_argument, nullptr, kClasses},
                                 {"rows", required_argument, nullptr, kRows},
                                 {"batch", required_argument, nullptr, kBatch},
                                 {"steps", required_argument, nullptr, kSteps},
                                 {"lr", required_argument, nullptr, kLr},
                                 {"bucket", required_argument, nullptr, kBucket},
                                 {"seed", required_argument, nullptr, kSeed},
                                 {"tolerance", required_argument, nullptr, kTolerance},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", longs, nullptr)) != -1) {
    switch (c) {
      case kFeatures: o->features = static_cast<int>(integer("--features", optarg, 1, 1 << 20)); break;
      case kClasses: o->classes = static_cast<int>(integer("--classes", optarg, 2, 1 << 12)); break;
      case kRows: o->rows = static_cast<int>(integer("--rows", optarg, 1, 1 << 22)); break;
      case kBatch: o->batch = static_cast<int>(integer("--batch", optarg, 1, 1 << 22)); break;
      case kSteps: o->steps = static_cast<int>(integer("--steps", optarg, 1, 1e9)); break;
      case kLr: o->lr = number("--lr", optarg, 1e-30, 1e6); break;
      case kBucket: o->bucket = static_cast<int>(integer("--bucket", optarg, 8, 1 << 20)); break;
      case kSeed: o->seed = static_cast<uint64_t>(integer("--seed", optarg, 0, 1e15)); break;
      case kTolerance: o->tolerance = number("--tolerance", optarg, 0, 1e6); break;
      case 'h': std::fputs(kHelp, stdout); return false;
      default: unknown_option(argv, optind);
    }
  }
  refuse_operands(argc, argv, optind);
  return true;
}

struct Data {
  int features, classes, rows;
  std::vector<float> a;  // rows x features
  std::vector<int> label;
};

Data make_data(const Options& o, int rank) {
  Data d{o.features, o.classes, o.rows, std::vector<float>(static_cast<size_t>(o.rows) * o.features), std::vector<int>(o.rows)};
  std::mt19937_64 shared(o.seed);
  std::normal_distribution<double> normal;
  const double scale = 1.0 / std::sqrt(static_cast<double>(o.features));
  std::vector<double> means(static_cast<size_t>(o.classes) * o.features);
  for (double& m : means) m = normal(shared) * scale;
  std::mt19937_64 mine(o.seed * 1000003 + 1 + static_cast<uint64_t>(rank));
  std::uniform_int_distribution<int> pick(0, o.classes - 1);
  for (int i = 0; i < o.rows; ++i) {
    const int c = pick(mine);
    d.label[i] = c;
    for (int j = 0; j < o.features; ++j)
      d.a[static_cast<size_t>(i) * o.features + j] =
          static_cast<float>(means[static_cast<size_t>(c) * o.features + j] + 8 * normal(mine) * scale);
  }
  return d;
}

// Softmax probabilities of row i under parameters w (W row-major classes x features, then b).
void probabilities(const Data& d, const std::vector<float>& w, int i, std::vector<double>* p) {
  const float* row = &d.a[static_cast<size_t>(i) * d.features];
  const float* bias = &w[static_cast<size_t>(d.classes) * d.features];
  double top = -INFINITY;
  for (int c = 0; c < d.classes; ++c) {
    double z = bias[c];
    const float* wc = &w[static_cast<size_t>(c) * d.features];
    for (int j = 0; j < d.features; ++j) z += static_cast<double>(wc[j]) * row[j];
    (*p)[c] = z;
    top = std::max(top, z);
  }
  double sum = 0;
  for (int c = 0; c < d.classes; ++c) sum += ((*p)[c] = std::exp((*p)[c] - top));
  for (int c = 0; c < d.classes; ++c) (*p)[c] /= sum;
}

// g (the padded parameter vector) = the gradient of the minibatch's mean cross-entropy.
void gradient(const Data& d, const std::vector<float>& w, const std::vector<int>& batch, std::vector<float>* g) {
  std::fill(g->begin(), g->end(), 0.0f);
  std::vector<double> p(d.classes);
  const double inv = 1.0 / static_cast<double>(batch.size());
  float* bias = &(*g)[static_cast<size_t>(d.classes) * d.features];
  for (int i : batch) {
    probabilities(d, w, i, &p);
    const float* row = &d.a[static_cast<size_t>(i) * d.features];
    for (int c = 0; c < d.classes; ++c) {
      const double e = (p[c] - (c == d.label[i] ? 1.0 : 0.0)) * inv;
      float* gc = &(*g)[static_cast<size_t>(c) * d.features];
      for (int j = 0; j < d.features; ++j) gc[j] += static_cast<float>(e * row[j]);
      bias[c] += static_cast<float>(e);
    }
  }
}

// The mean cross-entropy and the accuracy over every rank's rows.
void evaluate(const Data& d, const std::vector<float>& w, qcclComm_t comm, double* loss, double* accuracy) {
  double sums[3] = {0, 0, static_cast<double>(d.rows)};
  std::vector<double> p(d.classes);
  for (int i = 0; i < d.rows; ++i) {
    probabilities(d, w, i, &p);
    sums[0] -= std::log(std::max(p[d.label[i]], 1e-300));
    sums[1] += std::max_element(p.begin(), p.end()) - p.begin() == d.label[i] ? 1 : 0;
  }
  check(qcclAllReduce(sums, sums, 3, qcclFloat64, qcclSum, comm), "qcclAllReduce (loss)");
  *loss = sums[0] / sums[2];
  *accuracy = sums[1] / sums[2];
}

struct Config {
  const char* name;
  int weight_bits, gradient_bits;  // 0: full precision
};

struct Outcome {
  std::vector<double> losses;
  double accuracy = 0, wire = 0, inter_node = 0;  // bytes sent by all ranks; to other nodes
};

int run(const Options& o) {
  qcclComm_t comm = nullptr;
  check(qcclCommInitEnv(&comm, nullptr), "qcclCommInitEnv");
  int rank = 0, nranks = 1;
  qcclCommUserRank(comm, &rank);
  qcclCommCount(comm, &nranks);
  const Data d = make_data(o, rank);
  const size_t params = static_cast<size_t>(o.classes) * (o.features + 1);
  const size_t shard = (params + nranks - 1) / nranks, padded = shard * static_cast<size_t>(nranks);
  const int every = std::max(1, o.steps / 10);
  const Config configs[] = {{"fp32", 0, 0}, {"W8G8", 8, 8}, {"W5G4", 5, 4}, {"W4G4", 4, 4}};
  if (rank == 0)
    std::printf("# qsdp_training: %d ranks, %zu parameters (shards of %zu), %d rows per rank, minibatch %d, "
                "%d steps, lr %g, buckets of %d\n",
                nranks, params, shard, o.rows, o.batch, o.steps, o.lr, o.bucket);
  std::vector<Outcome> outcomes;
  for (const Config& config : configs) {
    qcclCodec_t wcodec = nullptr, gcodec = nullptr;
    if (config.weight_bits) {
      const std::string seed = ",seed=" + std::to_string(o.seed);
      const std::string bucket = ":bucket=" + std::to_string(o.bucket);
      check(qcclCodecCreate(("q" + std::to_string(config.weight_bits) + bucket + ",round=nearest" + seed).c_str(), &wcodec),
            "qcclCodecCreate (weights)");
      check(qcclCodecCreate(("q" + std::to_string(config.gradient_bits) + bucket + ",round=stochastic" + seed).c_str(),
                            &gcodec),
            "qcclCodecCreate (gradients)");
    }
    Outcome out;
    std::vector<float> master(shard, 0.0f), w(padded), g(padded), gshard(shard);
    std::mt19937_64 batches(o.seed * 7919 + static_cast<uint64_t>(rank));  // the same draws in every run
    std::uniform_int_distribution<int> pick(0, o.rows - 1);
    std::vector<int> batch(o.batch);
    auto add_wire = [&]() {
      qcclStats_t stats{};
      stats.size = sizeof(stats);
      check(qcclCommGetLastStats(comm, &stats), "qcclCommGetLastStats");
      out.wire += static_cast<double>(stats.wireBytesSent);
      out.inter_node += static_cast<double>(stats.interNodeBytesSent);
    };
    auto gather = [&]() {
      if (wcodec)
        check(qcclAllGatherCompressed(master.data(), w.data(), shard, qcclFloat32, wcodec, nullptr, comm),
              "qcclAllGatherCompressed");
      else
        check(qcclAllGather(master.data(), w.data(), shard, qcclFloat32, comm), "qcclAllGather");
      add_wire();
    };
    for (int t = 0; t <= o.steps; ++t) {
      gather();
      if (t % every == 0 || t == o.steps) {
        double loss = 0, accuracy = 0;
        evaluate(d, w, comm, &loss, &accuracy);
        out.losses.push_back(loss);
        out.accuracy = accuracy;
      }
      if (t == o.steps) break;
      for (int& i : batch) i = pick(batches);
      gradient(d, w, batch, &g);
      if (gcodec)
        check(qcclReduceScatterCompressed(g.data(), gshard.data(), shard, qcclFloat32, qcclAvg, gcodec, nullptr, comm),
              "qcclReduceScatterCompressed");
      else
        check(qcclReduceScatter(g.data(), gshard.data(), shard, qcclFloat32, qcclAvg, comm), "qcclReduceScatter");
      add_wire();
      for (size_t j = 0; j < shard; ++j) master[j] -= static_cast<float>(o.lr) * gshard[j];
    }
    double bytes[2] = {out.wire, out.inter_node};
    check(qcclAllReduce(bytes, bytes, 2, qcclFloat64, qcclSum, comm), "qcclAllReduce (bytes)");
    out.wire = bytes[0], out.inter_node = bytes[1];
    outcomes.push_back(out);
    if (wcodec) qcclCodecDestroy(wcodec);
    if (gcodec) qcclCodecDestroy(gcodec);
  }
  int status = 0;
  if (rank == 0) {
    std::printf("# %8s", "step");
    for (const Config& c : configs) std::printf(" %12s", c.name);
    std::printf("\n");
    for (size_t i = 0; i < outcomes[0].losses.size(); ++i) {
      std::printf("  %8d", std::min(static_cast<int>(i) * every, o.steps));
      for (const Outcome& out : outcomes) std::printf(" %12.6f", out.losses[i]);
      std::printf("\n");
    }
    bool holds = true;
    const double reference = outcomes[0].losses.back();
    for (size_t k = 0; k < outcomes.size(); ++k) {
      const double loss = outcomes[k].losses.back();
      const bool ok = k == 0 || loss <= (1 + o.tolerance) * reference;
      holds = holds && ok;
      const Outcome& out = outcomes[k];
      std::printf("# %-5s final loss %.6f (%.4f of fp32), accuracy %.2f%%; bytes sent %.3g (%.3f of fp32), to other "
                  "nodes %.3g (%.3f)%s\n",
                  configs[k].name, loss, loss / reference, 100 * out.accuracy, out.wire, out.wire / outcomes[0].wire,
                  out.inter_node, outcomes[0].inter_node > 0 ? out.inter_node / outcomes[0].inter_node : 0.0,
                  ok ? "" : "  <- beyond the tolerance");
    }
    std::printf("# every quantized run within %g%% of fp32's final loss: %s\n", 100 * o.tolerance, holds ? "yes" : "no");
    status = holds ? 0 : 1;
  }
  check(qcclBroadcast(&status, &status, 1, qcclInt32, 0, comm), "qcclBroadcast");
  qcclCommDestroy(comm);
  return status;
}

}  // namespace

int main(int argc, char** argv) { return qccl_demo::demo_main<Options>("qsdp_training", argc, argv, parse, run); }
