// QCCL_CODEC=auto (src/auto_codec.h): its spec and candidates, its error bounds against real runs
// (the algorithms a compressed all-reduce takes, on the real executor: every element's error within
// the bound the budget was checked against, and the bound not vacuous), and its choices against the
// simulator (sim/simulator.h, the model docs/PERF.md validates): on a grid of ranks, nodes, links
// and sizes, the simulated time of what auto picks within 5% of the best the simulator finds among
// uncompressed and every candidate at 95% of the points, and within 15% (the simulator's own
// validated accuracy against measurements) at every one; and each option's predicted time against
// its simulated one. auto's model is a closed form of the simulator's steady state and of one
// fragment's chain of steps, not its event-by-event run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/errors.h"
#include "collectives/compressed.h"
#include "kernels/codec.h"
#include "sim/auto_choice.h"
#include "sim/model.h"
#include "sim/simulator.h"
#include "src/auto_codec.h"
#include "src/policy.h"
#include "tests/collectives/sim_runner.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;
using coll::NodeMap;
using kernels::DataType;
using kernels::RedOp;

std::vector<std::string> names(const AutoCodec& a) {
  std::vector<std::string> out;
  for (const kernels::CodecConfig& c : a.candidates()) out.push_back(a.name(&c));
  return out;
}

TEST_CASE("auto: the budget decides the candidates, most accurate first", "[auto]") {
  CHECK(AutoCodec::is_auto("auto"));
  CHECK(AutoCodec::is_auto("auto:maxrelerr=0.1"));
  CHECK_FALSE(AutoCodec::is_auto("autoq8"));
  CHECK_FALSE(AutoCodec::is_auto("q8"));

  const AutoCodec default_budget("auto", 2);
  CHECK(default_budget.budget() == 0.01);
  CHECK(names(default_budget) == std::vector<std::string>{"fp16", "bf16", "q8"});
  // q8: 4 half-steps of 255 (0.0078), bf16 2 of its relative 2^-8 (0.0078), fp16 2^-10
  CHECK(names(AutoCodec("auto", 8)) == std::vector<std::string>{"fp16", "bf16", "q8"});
  CHECK(names(AutoCodec("auto:maxrelerr=0.007", 8)) == std::vector<std::string>{"fp16"});
  CHECK(names(AutoCodec("auto:maxrelerr=0.2", 2)) ==
        std::vector<std::string>{"fp16", "bf16", "q8", "q7", "q6", "q5", "q4"});
  CHECK(names(AutoCodec("auto:maxrelerr=0.13", 2)) == std::vector<std::string>{"fp16", "bf16", "q8", "q7", "q6", "q5"});
  CHECK(names(AutoCodec("auto:maxrelerr=0", 4)).empty());
  CHECK(names(AutoCodec("auto:maxrelerr=10", 4)).size() == 10);

  // The variables' own number rules (parse_double): blanks, '+' and hex were taken, and 1e-400 as 0.
  for (const char* bad : {"auto:", "auto:maxrelerr=", "auto:maxrelerr=-1", "auto:maxrelerr=x", "auto:maxrelerr=inf",
                          "auto:bits=4", "auto:maxrelerr=0.1,x=1", "q8", "auto:maxrelerr= 0.1", "auto:maxrelerr=+0.1",
                          "auto:maxrelerr=0x1p-3", "auto:maxrelerr=1e-400", "auto:maxrelerr=nan"}) {
    INFO(bad);
    try {
      AutoCodec a(bad, 2);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == qcclInvalidArgument);
      CHECK(std::string(e.what()).find("QCCL_CODEC") != std::string::npos);
    }
  }
  CHECK_THROWS_WITH(AutoCodec("auto:maxrelerr=1e-400", 2),
                    Catch::Contains("QCCL_CODEC: auto's maxrelerr = '1e-400' is too large or too small"));
  CHECK(AutoCodec("auto:maxrelerr=.5", 2).budget() == 0.5);
  CHECK(AutoCodec("auto:maxrelerr=1e300", 2).budget() == 1e300);
}

TEST_CASE("auto: the bounds as derived", "[auto]") {
  const auto q = [](const char* s) { return kernels::parse_codec_spec(s); };
  // sra_compressed and hierarchical_compressed: 4 per_range + 2 relative, with float32's slack
  // (quant.h's 2^-11 of the bound, and 2^-22 per rank and per encode)
  const auto slack = [](double x, int n) { return x * (1 + 0x1p-11) + (n + 4) * 0x1p-22; };
  CHECK(AutoCodec::error_bound(q("q8"), 2) == Approx(slack(0.5 / 255 * 4, 2)));
  CHECK(AutoCodec::error_bound(q("q8:round=stochastic"), 2) == Approx(slack(1.0 / 255 * 4, 2)));
  CHECK(AutoCodec::error_bound(q("q4"), 8) == Approx(slack(0.5 / 15 * 4, 8)));
  CHECK(AutoCodec::error_bound(q("fp16"), 4) == Approx(slack(0x1p-11 * 2, 4)));
  CHECK(AutoCodec::error_bound(q("none"), 4) == Approx(slack(0, 4)));
  // ring_compressed: 2n per_range + n relative
  CHECK(AutoCodec::ring_error_bound(q("q8"), 8) == Approx(slack(0.5 / 255 * 16, 8)));
  // no bound known: never a candidate
  CHECK(std::isinf(AutoCodec::error_bound(q("sign:eta_s=0.1"), 2)));
  CHECK(std::isinf(AutoCodec::error_bound(q("q4:round=shift"), 2)));
}

// ---- The bounds on real runs ------------------------------------------------------------------------

struct BoundCase {
  std::vector<int> labels;  // node of each rank
  std::string algorithm;
};

// The largest error of any element over the largest sum the inputs could make (sum over ranks of
// each rank's largest |x|), for rank r's inputs uniform in [-(1 + r), 1 + r].
double relative_error(const BoundCase& bc, const kernels::CodecConfig& codec, size_t count, uint64_t seed,
                      RedOp op = RedOp::kSum) {
  const int n = static_cast<int>(bc.labels.size());
  const NodeMap nodes = NodeMap::from_labels(bc.labels);
  std::mt19937_64 rng(seed);
  std::vector<std::vector<float>> in(n, std::vector<float>(count));
  std::vector<std::vector<float>> out(n, std::vector<float>(count));
  std::vector<double> exact(count, 0.0);
  double largest_sum = 0;
  for (int r = 0; r < n; ++r) {
    std::uniform_real_distribution<double> uniform(-(1.0 + r), 1.0 + r);
    double largest = 0;
    for (size_t i = 0; i < count; ++i) {
      in[r][i] = static_cast<float>(uniform(rng));
      exact[i] += in[r][i];
      largest = std::max(largest, std::fabs(static_cast<double>(in[r][i])));
    }
    largest_sum += largest;
  }
  std::vector<CollArgs> args(n);
  std::vector<coll::QuantizedCall> calls(n);
  for (int r = 0; r < n; ++r) {
    CollArgs& a = args[r];
    a.kind = CollKind::kAllReduce, a.count = count, a.dtype = DataType::kFloat32, a.op = op;
    a.rank = r, a.nranks = n, a.nodes = &nodes, a.codec = &codec;
    a.sendbuf = in[r].data(), a.recvbuf = out[r].data();
    a.rng = kernels::PhiloxKey{codec.seed, 1, static_cast<uint32_t>(r), 0};
    a.method_call = &calls[r];
  }
  run_on_sim(args, bc.algorithm, 16384, 2);
  if (op == RedOp::kAvg) {  // both sides divided by n
    for (double& e : exact) e /= n;
    largest_sum /= n;
  }
  double worst = 0;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(out[r][i] - exact[i]));
  return worst / largest_sum;
}

TEST_CASE("auto: every candidate's error within its bound on the algorithms it runs, and near it", "[auto]") {
  const std::vector<BoundCase> cases = {
      {{0, 1}, "sra_compressed"},
      {{0, 1, 2, 3, 4}, "sra_compressed"},
      {{0, 1, 2, 3, 4, 5, 6, 7}, "sra_compressed"},
      {{0, 0, 1, 1}, "hierarchical_compressed"},
      {{0, 0, 0, 1, 1, 1}, "hierarchical_compressed"},
      {{0, 1, 2}, "ring_compressed"},
      {{0, 1, 2, 3, 4, 5}, "ring_compressed"},
  };
  const AutoCodec all("auto:maxrelerr=100", 8);  // every candidate
  for (const BoundCase& bc : cases)
    for (const kernels::CodecConfig& codec : all.candidates()) {
      const int n = static_cast<int>(bc.labels.size());
      const double bound = bc.algorithm == "ring_compressed" ? AutoCodec::ring_error_bound(codec, n)
                                                              : AutoCodec::error_bound(codec, n);
      const double err = relative_error(bc, codec, 8192 + 13, 11 + n);
      INFO(bc.algorithm << " on " << n << " ranks, " << all.name(&codec) << ": error " << err << ", bound " << bound);
      CHECK(err <= bound);
      // not vacuous: the q codecs reach a sizeable share of it (the casts err far less than their
      // worst case on sums of uniforms, so only their upper side is held)
      if (codec.kind == kernels::CodecKind::kQuant) CHECK(err >= bound / 12);
      CHECK(relative_error(bc, codec, 4096 + 5, 3 + n, RedOp::kAvg) <= bound);  // an average: both over n
    }
}

// ---- The choices against the simulator ------------------------------------------------------------

// Every fixed choice auto could have made for `call` on `topology` (uncompressed or each codec within
// the budget for the algorithm's bound, by every algorithm that can run it), simulated: the fastest
// of them all, and what auto's rule picks given these times instead of its predictions (the most
// accurate codec, uncompressed first, whose fastest algorithm is within AutoCodec::kTieShare of the
// fastest; of its algorithms that fast, the policy's, else the fastest): what it would pick with a
// perfect model.
struct FixedChoices {
  double fastest = 1e30, rule = 0;
  std::string fastest_which, rule_which;
};
FixedChoices fixed_choices(const sim::Model& model, const sim::Topology& topology, sim::CallSpec call,
                           const AutoCodec& a) {
  const NodeMap nodes = topology.node_map();
  CollArgs args;
  args.kind = CollKind::kAllReduce, args.count = call.count, args.dtype = call.dtype, args.op = call.op;
  args.nranks = topology.nranks, args.nodes = &nodes;
  std::vector<const kernels::CodecConfig*> codecs = {nullptr};
  for (const kernels::CodecConfig& c : a.candidates())
    if (c.kind != kernels::CodecKind::kFp16) codecs.push_back(&c);
  FixedChoices out;
  struct Times {
    std::vector<std::pair<double, std::string>> algorithms;  // time, "codec by algorithm"
    double best = 1e30;
    size_t policy = SIZE_MAX;  // the policy's algorithm's index, if its bound admits the codec
  };
  std::vector<Times> per_codec;  // in the rule's order
  const AlgorithmPolicy policy("");
  for (const kernels::CodecConfig* codec : codecs) {
    if (codec && !sim::default_model().step_cost(codec->canonical(), "encode")) continue;  // not in the model
    Times times;
    call.codec = codec ? a.name(codec) : "";
    CollArgs trial = args;
    trial.codec = codec;
    const std::string usual = policy.choose(trial).name;
    for (const coll::Algorithm& algorithm : coll::algorithms()) {
      if (algorithm.collective != CollKind::kAllReduce || algorithm.cannot_run(trial)) continue;
      const bool ring = std::string(algorithm.name) == "ring_compressed";
      if (codec && (ring ? AutoCodec::ring_error_bound(*codec, args.nranks)
                         : AutoCodec::error_bound(*codec, args.nranks)) > a.budget())
        continue;
      call.algorithm = algorithm.name;
      const double t = sim::simulate(model, topology, call).seconds;
      if (usual == algorithm.name) times.policy = times.algorithms.size();
      times.algorithms.push_back({t, (codec ? call.codec : "none") + " by " + algorithm.name});
      times.best = std::min(times.best, t);
    }
    for (const auto& [t, which] : times.algorithms)
      if (t < out.fastest) out.fastest = t, out.fastest_which = which;
    per_codec.push_back(times);
  }
  const double fast = out.fastest * (1 + AutoCodec::kTieShare);
  for (const Times& times : per_codec) {
    if (times.best > fast) continue;
    const auto& picked = times.policy < times.algorithms.size() && times.algorithms[times.policy].first <= fast
                             ? times.algorithms[times.policy]
                             : *std::min_element(times.algorithms.begin(), times.algorithms.end());
    out.rule = picked.first, out.rule_which = picked.second;
    break;
  }
  return out;
}

// The grid both tests below walk: links, ranks on hosts, and call sizes.
struct Where {
  int nranks, hosts;
  const char* link;
};
std::vector<Where> grid() {
  std::vector<Where> out;
  for (const char* link : {"netem:100mbit", "netem:1gbit", "netem:10gbit", "25gbit", "100gbit"})
    for (auto [n, h] : {std::pair{2, 2}, {4, 4}, {4, 2}, {8, 8}, {8, 4}, {4, 1}, {6, 3}, {6, 2}, {12, 4}})
      out.push_back({n, h, link});
  return out;
}
constexpr size_t kGridBytes[] = {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, size_t{64} << 20};

// The model's errors are what this weighs: auto's pick against the pick its own rule makes on the
// simulated times (the rule may give up to kTieShare of speed for accuracy; that is its purpose).
TEST_CASE("auto: what it picks simulates within 5% of its rule's pick on simulated times (97% of the grid), "
          "within 15% of the fastest always", "[auto]") {
  int cases = 0, compressed = 0, uncompressed = 0, within_5 = 0, other_algorithm = 0;
  for (const Where& w : grid())
    for (const char* budget : {"auto", "auto:maxrelerr=0.2"})
      for (size_t bytes : kGridBytes) {
        sim::Model model = sim::default_model();
        std::string source;
        model.inter = sim::parse_link(w.link, &source);
        sim::Topology topology;
        topology.nranks = w.nranks, topology.hosts = w.hosts;
        sim::CallSpec call;
        call.count = bytes / 4;
        std::vector<Prediction> predictions;
        std::string algorithm;
        const std::string chosen = sim::choose_auto_codec(model, topology, call, budget, &predictions, &algorithm);
        REQUIRE_FALSE(algorithm.empty());  // auto takes every call of this grid, and names its algorithm
        sim::CallSpec mine_call = call;
        mine_call.codec = chosen, mine_call.algorithm = algorithm;
        const double mine = sim::simulate(model, topology, mine_call).seconds;
        sim::CallSpec usual = call;
        usual.codec = chosen;
        if (sim::simulate(model, topology, usual).algorithm != algorithm) ++other_algorithm;
        AutoCodec a(budget, w.nranks);
        const FixedChoices fixed = fixed_choices(model, topology, call, a);
        std::string table;
        for (const Prediction& p : predictions)
          table += "\n  '" + p.codec + "' by " + p.algorithm + ": predicted " + std::to_string(p.seconds * 1e6) + " us";
        INFO(w.nranks << " ranks on " << w.hosts << " hosts, " << w.link << ", " << bytes << " bytes, " << budget
                      << ": auto picked '" << chosen << "' by " << algorithm << " (" << mine * 1e6
                      << " us), the fastest fixed choice " << fixed.fastest_which << " (" << fixed.fastest * 1e6
                      << " us), the rule's on simulated times " << fixed.rule_which << " (" << fixed.rule * 1e6
                      << " us)" << table);
        REQUIRE(mine > 0);
        CHECK(mine <= fixed.fastest * 1.15);
        if (mine <= fixed.rule * 1.05) ++within_5;
        else WARN("outside 5%: " << w.nranks << " ranks on " << w.hosts << " hosts, " << w.link << ", " << bytes
                                  << " bytes, " << budget << ": '" << chosen << "' by " << algorithm << " "
                                  << mine / fixed.rule << "x the rule's pick on simulated times (" << fixed.rule_which
                                  << ")");
        ++cases;
        (chosen.empty() ? uncompressed : compressed)++;
      }
  CHECK(within_5 >= 0.97 * cases);
  // both answers occur on the grid: slow links compress, fast ones and one node do not; and the
  // algorithm is auto's choice, not always the policy's
  CHECK(compressed > cases / 4);
  CHECK(uncompressed > cases / 10);
  CHECK(other_algorithm > cases / 20);
}

// Each option's predicted time against its simulated one, on the grid above: the closed form follows
// the simulator's order of events (a message leaves when posted, its socket write and read on the
// ranks' CPUs, a node's ranks crossing at once share its link, a shaped link's token bucket fills
// while it idles; recursive doubling and sra_compressed walked message by message over the node
// map; on ports within a node, the fragments in flight taking turns), so most options land within
// 15%. Those left: the uncompressed ring on large calls on hosts of several ranks at 25 Gbit/s
// (predicted 0.78-0.85x); ring_compressed's bf16 at 64 MiB on such hosts at 25 Gbit/s
// (0.85x); hierarchical_compressed's CPU-bound q4 at 1 MiB, 1 Gbit/s, on 6 ranks over 2 hosts and 12
// over 4 (1.19x, 1.29x); recursive doubling on 6 ranks over 3 hosts at 100 Mbit/s, whose fragments'
// messages interleave on the links (0.69-0.76x).
TEST_CASE("auto: its predictions within 15% of the simulator's times for 97% of the options", "[auto]") {
  int options = 0, within_15 = 0;
  for (const Where& w : grid())
    for (size_t bytes : kGridBytes) {
      sim::Model model = sim::default_model();
      model.inter = sim::parse_link(w.link, nullptr);
      sim::Topology topology;
      topology.nranks = w.nranks, topology.hosts = w.hosts;
      sim::CallSpec call;
      call.count = bytes / 4;
      std::vector<Prediction> predictions;
      sim::choose_auto_codec(model, topology, call, "auto:maxrelerr=0.2", &predictions);  // every candidate
      for (const Prediction& p : predictions) {
        if (p.codec == "fp16") continue;  // float32 calls: weighed, never run
        sim::CallSpec option = call;
        option.codec = p.codec, option.algorithm = p.algorithm;
        const double simulated = sim::simulate(model, topology, option).seconds;
        const double ratio = p.seconds / simulated;
        INFO(w.nranks << " ranks on " << w.hosts << " hosts, " << w.link << ", " << bytes << " bytes, '" << p.codec
                      << "' by " << p.algorithm << ": predicted " << p.seconds * 1e6 << " us, simulated "
                      << simulated * 1e6);
        CHECK(ratio > 0.65);
        CHECK(ratio < 1.5);
        ++options;
        if (std::fabs(ratio - 1) <= 0.15) ++within_15;
      }
    }
  CHECK(options > 1500);
  CHECK(within_15 >= 0.97 * options);
}

TEST_CASE("auto: one node stays uncompressed, unknown links between nodes too", "[auto]") {
  sim::Model model = sim::default_model();
  sim::Topology one_host;
  one_host.nranks = 4, one_host.hosts = 1;
  sim::CallSpec call;
  call.count = size_t{16} << 20;
  CHECK(sim::choose_auto_codec(model, one_host, call, "auto:maxrelerr=1") == "");
  // A layout the simulation refuses stops here with the reason, not a division by zero in the node
  // map (SIGFPE); qccl_sim refuses it sooner, as a bad option.
  sim::Topology more_hosts_than_ranks;
  more_hosts_than_ranks.nranks = 2, more_hosts_than_ranks.hosts = 4;
  CHECK_THROWS_WITH(sim::choose_auto_codec(model, more_hosts_than_ranks, call, "auto"), Catch::Contains("4 hosts"));

  // A communicator on several nodes without QCCL_LINK_RATE knows no inter-node rate.
  AutoCodec a("auto", 4);
  sim::Topology two_hosts;
  two_hosts.nranks = 4, two_hosts.hosts = 2;
  ClusterFacts facts = sim::cluster_facts(model, two_hosts, call, a);
  facts.inter_rate = 0;
  a.agree(facts);
  const NodeMap nodes = NodeMap::from_labels({0, 0, 1, 1});
  CollArgs args;
  args.kind = CollKind::kAllReduce, args.count = call.count, args.nranks = 4, args.nodes = &nodes;
  const AlgorithmPolicy policy("");
  CHECK(a.choose(args, policy).codec == nullptr);
  CHECK(a.choose(args, policy).algorithm == nullptr);  // the policy's
  // ... and with it, a slow link compresses; calls auto does not take stay as they are
  facts.inter_rate = 1.25e6;
  a.agree(facts);
  REQUIRE(a.choose(args, policy).codec != nullptr);
  CHECK(std::string(a.name(a.choose(args, policy).codec)) == "q8");
  REQUIRE(a.choose(args, policy).algorithm != nullptr);
  // QCCL_ALGO forcing the all-reduce's algorithm holds under auto
  const AlgorithmPolicy forced("allreduce=sra_compressed");
  REQUIRE(a.choose(args, forced).algorithm != nullptr);
  CHECK(std::string(a.choose(args, forced).algorithm->name) == "sra_compressed");
  // fp16 only on half inputs (its bound holds in its normal range); a half or bfloat16 result's own
  // rounding counts against the budget
  sim::CallSpec slow = call;
  sim::Topology flat;
  flat.nranks = 4, flat.hosts = 4;
  model.inter = sim::parse_link("netem:100mbit", nullptr);
  CHECK(sim::choose_auto_codec(model, flat, slow, "auto") == "q8");
  // fp16 would halve the bytes, but float32 inputs may leave its range; q8's 0.0078 > 0.002
  CHECK(sim::choose_auto_codec(model, flat, slow, "auto:maxrelerr=0.002") == "");
  slow.dtype = DataType::kFloat16;
  CHECK(sim::choose_auto_codec(model, flat, slow, "auto") == "q8");  // 0.0078 + 2^-11
  slow.dtype = DataType::kBfloat16;
  CHECK(sim::choose_auto_codec(model, flat, slow, "auto") == "");  // q8 0.0078 + 2^-8 and bf16 > 0.01
  CHECK(sim::choose_auto_codec(model, flat, slow, "auto:maxrelerr=0.012") == "q8");

  for (auto change : {+[](CollArgs& c) { c.op = RedOp::kMax; }, +[](CollArgs& c) { c.dtype = DataType::kInt32; },
                      +[](CollArgs& c) { c.kind = CollKind::kReduceScatter; }}) {
    CollArgs other = args;
    change(other);
    CHECK(a.choose(other, policy).codec == nullptr);
    CHECK(a.choose(other, policy).algorithm == nullptr);
  }
}

}  // namespace
}  // namespace qccl::test
