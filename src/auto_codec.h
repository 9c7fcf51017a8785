// QCCL_CODEC=auto: per plain all-reduce, whether and how to compress, and by which algorithm, chosen
// by a cost model.
//
// The user sets an error budget (`auto:maxrelerr=E`, default 0.01): the worst error of any element of
// the result, relative to the largest sum the inputs could make (the sum over ranks of each rank's
// largest |x|; for an average, both divided by n). A codec runs only if its proven bound on that
// error, for the algorithm the call would run, plus the rounding of a half or bfloat16 result, is
// within the budget (error_bound); fp16 only on half inputs, since its relative bound holds in its
// normal range alone. Uncompressed always may run. Per call the model predicts each option's time
// (a codec or none, by each algorithm that can run it) and the fastest runs (the most accurate
// within 10% of it, by the policy's algorithm if that is among them), so that a fast link stays
// uncompressed and a slow one compresses as far as the budget allows.
//
// The model is the simulator's (sim/simulator.h) reduced to a pipeline's steady state: the busiest
// link's bytes over its rate, the busiest rank's CPU (codec steps, sums, the kernel's TCP path per
// byte), and a fragment's chain of steps over the pipeline depth; the time is the busiest resource's
// over all fragments but the first, plus the first's chain (the pipeline's fill), and never less
// than the chains over the depth or the busiest resource alone (where a plan's pricing knows its
// chain's work before the first crossing and after the last, a link that bounds the call pays only
// that beside its own time). The chains of plans whose
// steps cross nodes or not by the ranks' layout (recursive doubling; sra_compressed up to 32 ranks)
// are walked message by message in the simulator's order of events. Its inputs are agreed by every
// rank at communicator creation, so that every rank makes the same choice: the links
// (QCCL_LINK_RATE, or the rate src/link_probe.h measures, between nodes; memory copies within one),
// the pipeline (chunk and depth, rank 0's), and the CPU costs, measured by each rank at creation
// (about 30 ms): the slowest host's kept (each host's least contended measurement, stretched by its
// ranks per CPU). tests/sim/auto_codec_test.cc holds its choices and predictions against the
// simulator's on a grid of ranks, links and sizes. Calls on device buffers are not
// compressed by auto (its costs are the host's): a communicator that mixes host and device buffers
// for the same call on different ranks would choose differently and fail the call (qcclMismatch).
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/plan.h"
#include "kernels/codec.h"

namespace qccl {

class AlgorithmPolicy;

// The calling thread's CPU time in seconds. The costs below are per core (the ranks a core carries
// stretch them in Comm::agree_auto_codec), so their measurements take CPU time, not the wall clock:
// on a loaded machine another process's time slice would count. (A preempted 0.4 ms copy once
// measured as several, and the model then compressed between the ranks of one host.)
double thread_cpu_seconds();

// Seconds per unit on one core of the slowest host (its ranks per CPU folded in).
struct CpuCosts {
  struct Codec {
    double encode = 0, decode = 0, decode_add = 0;  // per float32 value
  };
  double reduce = 0;          // per float32 value (a + b)
  double copy = 0;            // per byte
  double load = 0;            // per value: a float32 accumulator from the input
  double add = 0;             // per value: accumulator += float32 input
  double wire = 0;            // per payload byte sent or received between nodes (the kernel's TCP path)
  double message = 0;         // per message sent or received between nodes, beside its bytes (the same)
  std::vector<Codec> codecs;  // one per candidate, in AutoCodec::candidates() order

  static constexpr size_t kFixed = 6;  // flatten(): reduce, copy, load, add, wire, message, then 3 per codec
  std::vector<double> flatten() const;
  // From flatten()'s numbers for `codecs` candidates; false when the count does not fit.
  static bool unflatten(const std::vector<double>& numbers, size_t codecs, CpuCosts* out);
};

// What the model knows of the cluster.
// (Which ranks share a node comes with each call: CollArgs::nodes.)
struct ClusterFacts {
  double inter_rate = 0;      // payload bytes/s of a node's link (0: unknown: one node only)
  double inter_latency = 0;   // seconds, one way
  double inter_burst = 0;     // bytes a shaped link's token bucket holds: it fills at the rate while the
                              // link idles, and passes what it holds at once (the simulator's netem
                              // links, empty when a call starts; the library knows of none)
  double intra_rate = 0;      // payload bytes/s between ranks of one node
  double intra_latency = 0;
  CpuCosts cpu;
  // The communicator's pipeline: chunk bytes and fragments in flight (QCCL_CHUNK_BYTES,
  // QCCL_PIPELINE_DEPTH).
  double chunk_bytes = 256 * 1024;
  int depth = 2;
};

// What QCCL_CODEC=auto runs a call with: a codec (null: uncompressed) and an algorithm (null: the
// policy's, for calls auto does not take).
struct AutoChoice {
  const kernels::CodecConfig* codec = nullptr;
  const coll::Algorithm* algorithm = nullptr;
};

// One candidate's predicted time, for the log and tests.
struct Prediction {
  std::string codec;  // the candidate's name ("q8"), "" uncompressed
  std::string algorithm;
  double seconds = 0;
};

class AutoCodec {
 public:
  // Options within this share of the fastest count as fast: the model is good to some 10-15% against
  // the simulator and measured runs (docs/PERF.md "Simulator", "Automatic codec choice"), so a smaller
  // predicted gain is none. Among them the most accurate runs, uncompressed first: a codec's error is
  // certain, a gain within the model's error is not.
  static constexpr double kTieShare = 0.10;

  static bool is_auto(const std::string& spec);
  // spec: "auto" or "auto:maxrelerr=E" (0 <= E; 0 admits only uncompressed). Candidates for nranks
  // ranks: fp16, bf16 and q1 .. q8 (nearest rounding, bucket 512) whose bound fits. Throws
  // Error(qcclInvalidArgument) naming the bad token.
  AutoCodec(const std::string& spec, int nranks, const std::string& source = "QCCL_CODEC");

  double budget() const { return budget_; }
  const std::vector<kernels::CodecConfig>& candidates() const { return candidates_; }
  // This rank's CPU costs for the candidates, on one core as it found it (measured once per process
  // per codec, some ms); the communicator stretches them by its hosts' ranks per CPU.
  CpuCosts measure() const;
  // The agreed facts (the same on every rank). Before this, choose() compresses nothing.
  void agree(ClusterFacts facts);

  // The codec and algorithm for a plain all-reduce (sum or average of float32, float16 or bfloat16;
  // args as the communicator has them, codec unset): of every option (uncompressed or a candidate
  // whose bound fits, by every algorithm that can run it, or by `policy`'s alone when QCCL_ALGO
  // forces the all-reduce's) the fastest predicted; among those within 10% of it the most accurate
  // codec, by `policy`'s algorithm if that is among them. {} for calls auto does not take. With
  // `predictions`, every option's predicted time.
  AutoChoice choose(const coll::CollArgs& args, const AlgorithmPolicy& policy,
                    std::vector<Prediction>* predictions = nullptr) const;
  // The model's time for args run by `algorithm` with args.codec (null: uncompressed); negative when
  // the model does not know the algorithm.
  double predict(const coll::CollArgs& args, const std::string& algorithm) const;

  // The proven bound on the relative error defined above for `codec` (plain, nearest or stochastic
  // rounding) run by sra_compressed or hierarchical_compressed on nranks ranks (the algorithms a
  // compressed all-reduce takes unless one is forced; ring_compressed's grows with n and is given
  // by ring_error_bound).
  static double error_bound(const kernels::CodecConfig& codec, int nranks);
  static double ring_error_bound(const kernels::CodecConfig& codec, int nranks);

  // "auto, error budget 0.01: fp16, bf16, q8 (bounds ...)" for the INFO log.
  std::string describe() const;
  // A candidate's short name ("q8"), "none" for null.
  const char* name(const kernels::CodecConfig* codec) const;
  // A candidate's place in candidates(); candidates().size() for any other codec.
  size_t index_of(const kernels::CodecConfig* codec) const;

 private:
  double budget_ = 0.01;
  int nranks_ = 1;
  std::vector<kernels::CodecConfig> candidates_;
  std::vector<std::string> names_;  // the candidates' specs as written ("q8")
  ClusterFacts facts_;
  bool agreed_ = false;
  // choose()'s answers by call shape (count, datatype, op, policy): the model is weighed once per
  // shape, not per call (some 4 us of a 20 us 64 KiB all-reduce otherwise). Cleared by agree().
  using Shape = std::tuple<size_t, int, int, const AlgorithmPolicy*>;
  mutable std::mutex cache_mu_;
  mutable std::map<Shape, AutoChoice> cache_;
};

}  // namespace qccl
