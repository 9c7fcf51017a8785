// QCCL_CODEC=auto in the simulator: the library's choice (src/auto_codec.h) made from a Model's links
// and costs instead of a communicator's measurements, so that qccl_sim predicts what auto runs and the
// tests can hold auto's choices against the simulated times of every fixed choice.
#pragma once

#include <string>
#include <vector>

#include "sim/model.h"
#include "sim/simulator.h"
#include "src/auto_codec.h"

namespace qccl::sim {

// The facts a communicator of this topology would agree on, from the model: its links, the call's
// pipeline (chunk and depth), its CPU costs
// (the candidates' codecs by name; one the model has no costs for costs infinity, so that it is never
// chosen: the default model has q1, q2, q4 and q8) stretched by the topology's oversubscription.
ClusterFacts cluster_facts(const Model& model, const Topology& topology, const CallSpec& call,
                           const AutoCodec& auto_codec);

// The codec auto (`spec`: "auto[:maxrelerr=E]") picks for `call` (its codec ignored), as a spec for
// CallSpec::codec ("" for uncompressed), with every option's predicted time when asked, and in
// *algorithm the algorithm it picks for CallSpec::algorithm (call.algorithm, usually "", where auto
// leaves it to the policy). Throws std::invalid_argument for a spec that is not auto's.
std::string choose_auto_codec(const Model& model, const Topology& topology, const CallSpec& call,
                              const std::string& spec, std::vector<Prediction>* predictions = nullptr,
                              std::string* algorithm = nullptr);

}  // namespace qccl::sim
