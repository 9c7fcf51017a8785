#include "sim/auto_choice.h"

#include <limits>
#include <stdexcept>

#include "base/errors.h"
#include "collectives/node_map.h"
#include "src/policy.h"

namespace qccl::sim {

ClusterFacts cluster_facts(const Model& model, const Topology& topology, const CallSpec& call,
                           const AutoCodec& auto_codec) {
  const double stretch = topology.oversubscription();
  ClusterFacts facts;
  facts.cpu.reduce = model.reduce * stretch;
  facts.cpu.copy = model.copy * stretch;
  facts.cpu.load = model.load * stretch;
  facts.cpu.add = model.add * stretch;
  facts.cpu.wire = model.wire * stretch;
  facts.cpu.message = model.message * stretch;
  for (const kernels::CodecConfig& codec : auto_codec.candidates()) {
    // A codec the model has no cost for is never chosen (calibrate the model for it).
    constexpr double kUnknown = std::numeric_limits<double>::infinity();
    CpuCosts::Codec c{kUnknown, kUnknown, kUnknown};
    const std::string canonical = codec.canonical();
    if (const double* x = model.step_cost(canonical, "encode")) c.encode = *x * stretch;
    if (const double* x = model.step_cost(canonical, "decode")) c.decode = *x * stretch;
    if (const double* x = model.step_cost(canonical, "decode_add")) c.decode_add = *x * stretch;
    facts.cpu.codecs.push_back(c);
  }
  facts.inter_rate = model.inter.payload_rate();
  facts.inter_latency = model.inter.latency + model.post;
  facts.inter_burst = model.inter.burst * model.inter.efficiency;
  facts.intra_rate = model.intra.payload_rate();
  facts.intra_latency = model.intra.latency + model.post;
  facts.chunk_bytes = static_cast<double>(call.chunk_bytes);
  facts.depth = call.depth;
  return facts;
}

std::string choose_auto_codec(const Model& model, const Topology& topology, const CallSpec& call,
                              const std::string& spec, std::vector<Prediction>* predictions, std::string* algorithm) {
  if (!AutoCodec::is_auto(spec)) throw std::invalid_argument("'" + spec + "' is not auto[:maxrelerr=E]");
  // The node map below divides by the ranks per host: a topology the simulation refuses stops here.
  if (const std::string why = topology.check(); !why.empty()) throw std::invalid_argument(why);
  std::unique_ptr<AutoCodec> auto_codec;
  try {
    auto_codec = std::make_unique<AutoCodec>(spec, topology.nranks);
  } catch (const Error& e) {
    throw std::invalid_argument(e.what());
  }
  auto_codec->agree(cluster_facts(model, topology, call, *auto_codec));
  const coll::NodeMap nodes = topology.node_map();
  coll::CollArgs args;
  args.kind = call.kind, args.count = call.count, args.dtype = call.dtype, args.op = call.op;
  args.nranks = topology.nranks, args.nodes = &nodes;
  const AlgorithmPolicy policy(call.algorithm);
  const AutoChoice chosen = auto_codec->choose(args, policy, predictions);
  if (algorithm) *algorithm = chosen.algorithm ? chosen.algorithm->name : call.algorithm;
  return chosen.codec ? auto_codec->name(chosen.codec) : "";
}

}  // namespace qccl::sim
