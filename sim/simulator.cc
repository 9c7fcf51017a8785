#include "sim/simulator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <queue>
#include <random>
#include <stdexcept>
#include <unordered_map>

#include "base/errors.h"
#include "collectives/method.h"
#include "kernels/codec.h"
#include "kernels/convert.h"
#include "sim/network.h"
#include "src/executor.h"
#include "src/frame.h"
#include "src/policy.h"

namespace qccl::sim {

using coll::CollKind;

double Topology::oversubscription() const {
  if (machine_cores > 0) return std::max(1.0, static_cast<double>(nranks) / machine_cores);
  if (cores_per_host > 0) return std::max(1.0, static_cast<double>(ranks_per_host()) / cores_per_host);
  return 1.0;
}

coll::NodeMap Topology::node_map() const {
  std::vector<int> labels(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) labels[static_cast<size_t>(r)] = host_of(r);
  return coll::NodeMap::from_labels(labels);
}

std::string Topology::check() const {
  if (nranks < 1) return "the rank count must be at least 1, not " + std::to_string(nranks);
  if (nranks > (1 << 20)) return std::to_string(nranks) + " ranks: the simulator takes at most 2^20";
  if (hosts < 0 || hosts > nranks)
    return std::to_string(hosts) + " hosts: between 1 and the rank count (" + std::to_string(nranks) + ")";
  if (nranks % host_count())
    return std::to_string(hosts) + " hosts do not divide " + std::to_string(nranks) +
           " ranks (hosts hold equal blocks of ranks)";
  if (cores_per_host < 0 || machine_cores < 0) return "core counts must be positive";
  return "";
}

size_t send_elements(const CallSpec& call, int n) {
  switch (call.kind) {
    case CollKind::kReduceScatter:
    case CollKind::kAlltoAll:
    case CollKind::kScatter:
      return call.count * static_cast<size_t>(n);
    default:
      return call.count;
  }
}

size_t recv_elements(const CallSpec& call, int n) {
  switch (call.kind) {
    case CollKind::kAllGather:
    case CollKind::kAlltoAll:
    case CollKind::kGather:
      return call.count * static_cast<size_t>(n);
    default:
      return call.count;
  }
}

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// A plan's own object, its vectors' headers and the allocator's overhead, beside what grows with the
// communicator (PlanHoldings): no plan measured more than 400 bytes of it (simulator_test).
constexpr double kPlanBaseBytes = 512;

// What one rank's plan keeps that grows with the communicator, read off the members of the plans in
// collectives/*.cc, which report no size of their own: ints (rank numbers) and what they are.
// simulator_test measures real plans against these figures, so a plan that comes to keep more fails
// there rather than run a large simulation out of memory.
struct PlanHoldings {
  double ints;
  const char* what;
};

PlanHoldings plan_holdings(const coll::Algorithm& algorithm, const Topology& topology) {
  const double n = topology.nranks, hosts = topology.host_count(), per_host = topology.ranks_per_host();
  const std::string name = algorithm.name;
  // The binomial trees build a ring of every rank only while they are made (memory O(1), time O(n) a
  // rank); fft_allgather's list of every rank lives while a fragment is built.
  if (name == "local" || name == "recursive_doubling" || name == "binomial" || name == "direct" ||
      name == "fft_allgather")
    return {0, "a few fields"};
  if (algorithm.collective == CollKind::kAllGather && (name == "hierarchical" || name == "compressed_hierarchical"))
    return {n + hosts, "every rank, in the order its host's leader holds their blocks, and one rank per host"};
  if (name == "hierarchical_compressed" || name == "compressed_two_level")
    return {per_host + hosts, "the ranks of its host and one rank per host"};
  if (name == "hierarchical" || name == "compressed_hierarchical" || name == "compressed_hierarchical_intra")
    return {per_host, "the ranks of its host"};
  // ring, ring_compressed, sra_compressed, intsgd, intsgd_switch, fft_dense_ring, marsit (its row of a
  // one-row torus, or a full-precision round's ring), chain, pairwise, compressed_ring,
  // compressed_pairwise, and an algorithm not listed here: the most a plan keeps.
  return {n, "a ring of every rank, an int each"};
}

// Refuses, before any plan is made, a call whose plans would hold more than the simulator's budget: at
// 65,536 ranks, rings of every rank took 17 GB to print a row of 0 bytes, and at 131,072 ran out of
// memory. The message names the algorithm, the bytes, and those of the collective whose plans fit.
void check_plan_memory(const coll::Algorithm& algorithm, const Topology& topology, const coll::CollArgs& args) {
  const double per_rank = plan_bytes_per_rank(algorithm, topology);
  const double held = per_rank * topology.nranks;
  if (held <= kMaxHeldBytes) return;
  // The most ranks whose plans of this algorithm fit (on hosts of the same size): the plans' bytes
  // grow with the rank count, so a binary search finds it.
  int fits = 0;
  for (int step = 1 << 20; step > 0; step /= 2) {
    Topology fewer = topology;
    fewer.nranks = fits + step;
    if (topology.hosts > 0) fewer.hosts = std::max(1, fewer.nranks / topology.ranks_per_host());
    if (fewer.nranks < topology.nranks && plan_bytes_per_rank(algorithm, fewer) * fewer.nranks <= kMaxHeldBytes)
      fits = fewer.nranks;
  }
  std::string others;
  for (const coll::Algorithm& other : coll::algorithms())
    if (other.collective == algorithm.collective && &other != &algorithm && !other.cannot_run(args) &&
        plan_bytes_per_rank(other, topology) * topology.nranks <= kMaxHeldBytes)
      others += std::string(others.empty() ? "" : ", ") + "-a " + other.name;
  throw std::invalid_argument(
      format("the plans of %s on %d ranks would hold %s before a step runs (%s a rank: %s); the simulator holds up to "
             "%s of plans and programs, and %s's plans fit at most %d ranks%s%s",
             algorithm.name, topology.nranks, human_bytes(held).c_str(), human_bytes(per_rank).c_str(),
             plan_holdings(algorithm, topology).what, human_bytes(kMaxHeldBytes).c_str(), algorithm.name, fits,
             others.empty() ? "" : "; these fit: ", others.c_str()));
}

// Address space that can be neither read nor written: the simulated buffers and codec states
// (simulator.h). `what` names them in the refusal.
class Reservation {
 public:
  explicit Reservation(size_t bytes, const char* what = "the buffers") : bytes_(std::max<size_t>(bytes, 1)) {
    void* p = mmap(nullptr, bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("cannot reserve " + std::to_string(bytes_) + " bytes of address space for " + what);
    base_ = static_cast<std::byte*>(p);
  }
  ~Reservation() { munmap(base_, bytes_); }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  std::byte* base() const { return base_; }

 private:
  size_t bytes_;
  std::byte* base_;
};

// Every rank's call bound as a communicator binds it (src/comm.cc, Comm::start): the codec's method
// and a state, the random key, the node map, the algorithm.
class Binding {
 public:
  // timed: the timed simulation, where no numbers are computed: one codec state stands for every
  // rank's, its arrays addresses only (hollow_state).
  Binding(const Topology& topology, const CallSpec& call, bool timed) : link_(call.link) {
    if (std::string why = topology.check(); !why.empty()) throw std::invalid_argument(why);
    const int n = topology.nranks;
    if (coll::rooted(call.kind) && (call.root < 0 || call.root >= n))
      throw std::invalid_argument("root " + std::to_string(call.root) + " is not a rank of " + std::to_string(n));
    if (call.kind == CollKind::kSend || call.kind == CollKind::kRecv)
      throw std::invalid_argument("Send and Recv are not simulated: they pair two different calls");
    if (call.chunk_bytes == 0) throw std::invalid_argument("the chunk size must be at least 1 byte");
    if (call.depth < 1) throw std::invalid_argument("the pipeline depth must be at least 1");
    nodes_ = topology.node_map();
    if (!call.codec.empty()) {
      try {
        codec_ = std::make_unique<kernels::CodecConfig>(kernels::parse_codec_spec(call.codec));
      } catch (const kernels::CodecSpecError& e) {
        throw std::invalid_argument(std::string("codec: ") + e.what());
      }
      method_ = coll::method_for(*codec_);
      if (!method_) throw std::invalid_argument("codec '" + call.codec + "' has no method");
      // The library's generic checks of a compressed call (src/api.cc, validate_compressed).
      if (!kernels::codec_input_type(call.dtype))
        throw std::invalid_argument(std::string("datatype ") + kernels::data_type_name(call.dtype) +
                                    ": codecs take float, half or bfloat16");
      const bool reduces = call.kind == CollKind::kAllReduce || call.kind == CollKind::kReduceScatter;
      if (reduces && call.op != kernels::RedOp::kSum && call.op != kernels::RedOp::kAvg)
        throw std::invalid_argument(std::string("op ") + kernels::red_op_name(call.op) +
                                    ": a compressed reduction sums or averages");
    }
    args_.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      coll::CollArgs& a = args_[static_cast<size_t>(r)];
      a.kind = call.kind;
      a.count = call.count;
      a.dtype = call.dtype;
      a.op = call.op;
      a.root = call.root;
      a.rank = r;
      a.nranks = n;
      a.nodes = &nodes_;
      a.link = link_.rate > 0 ? &link_ : nullptr;
      a.codec = codec_.get();
    }
    if (!codec_) return;
    // A steady-state round (simulator.h): step 1 of a state that has seen a round, with a learning
    // rate set (codecs that scale by it refuse a state without one).
    // A state covers what a rank encodes, as the library checks: ReduceScatter's whole input.
    const size_t state_count = call.kind == CollKind::kReduceScatter ? call.count * static_cast<size_t>(n) : call.count;
    view_.count = state_count;
    view_.learning_rate = 0.01;
    const coll::LegacyState seen_a_round{&zero_, 0, 1.0, true};
    if (timed) {
      hollow_state(state_count);
    } else {
      for (int r = 0; r < n; ++r) states_.push_back(method_->make_state(state_count, codec_.get()));
    }
    for (auto& state : states_)
      if (state) state->load_legacy(seen_a_round);
    calls_.resize(static_cast<size_t>(n));
  }

  const coll::CollArgs& args(int r) const { return args_[static_cast<size_t>(r)]; }

  // Binds rank r's buffers and its method call; returns its arguments.
  const coll::CollArgs& bind(int r, const void* send, void* recv) {
    coll::CollArgs& a = args_[static_cast<size_t>(r)];
    a.sendbuf = send;
    a.recvbuf = recv;
    if (!codec_) return a;
    coll::MethodState* state = states_[states_.size() == 1 ? 0 : static_cast<size_t>(r)].get();
    a.rng = kernels::PhiloxKey{codec_->seed, 1, static_cast<uint32_t>(r), 0};
    a.aggregators = 1;  // as if the job had started them: agg=switch plans send to peer nranks
    if (auto refusal = method_->refuse(a, &view_, a.aggregators)) throw std::invalid_argument(refusal->message);
    auto& call = calls_[static_cast<size_t>(r)];
    call = method_->begin(a, state, &view_);
    if (!state_arrays_.empty()) call->use_device_arrays(state_arrays_);
    a.method_call = call.get();
    call->prepare(a);
    return a;
  }

  // The algorithm every rank runs (they agree: it depends on the arguments alone).
  const coll::Algorithm& algorithm(const std::string& name) const {
    const coll::CollArgs& a = args_.front();
    if (name.empty()) {
      try {
        return AlgorithmPolicy("").choose(a);
      } catch (const Error& e) {
        throw std::invalid_argument(e.what());
      }
    }
    const coll::Algorithm* chosen = coll::find_algorithm(a.kind, name);
    if (!chosen) throw std::invalid_argument(std::string(coll::coll_name(a.kind)) + " has no algorithm '" + name + "'");
    for (const coll::CollArgs& args : args_)
      if (const char* why = chosen->cannot_run(args))
        throw std::invalid_argument(std::string("algorithm ") + chosen->name + " cannot run this call: " + why);
    return *chosen;
  }

  const kernels::CodecConfig* codec() const { return codec_.get(); }

 private:
  // The timed simulation's state: a state of one value stands for one of `count`, and the calls
  // address its arrays (MethodState::device_arrays, which a call takes in place of the state's own, as
  // for a device copy) in a reservation of the full size that cannot be read or written, as the
  // buffers are. A timed run never reads a state, so a large call's (error feedback's float a value:
  // 32 GiB for 32 GiB of float input) is neither allocated nor touched: made in full, it took 4.2 GB
  // and 5 s at 4 GiB, and std::bad_alloc at 32 GiB. A method whose state has no arrays gets its state in
  // full (IntSGD's moving average: a few bytes), held to the simulator's budget.
  void hollow_state(size_t count) {
    std::unique_ptr<coll::MethodState> stand_in = method_->make_state(1, codec_.get());
    const size_t arrays = stand_in ? stand_in->device_arrays().size() : 0;
    if (stand_in && arrays == 0) {
      const double bytes = static_cast<double>(method_->state_bytes(count, codec_.get()));
      if (bytes > kMaxHeldBytes)
        throw std::invalid_argument(format("the codec state of %s would hold %s; the simulator holds up to %s",
                                           codec_->canonical().c_str(), human_bytes(bytes).c_str(),
                                           human_bytes(kMaxHeldBytes).c_str()));
      states_.push_back(method_->make_state(count, codec_.get()));
      return;
    }
    states_.push_back(std::move(stand_in));  // null where the method keeps nothing for this codec
    if (arrays == 0) return;
    // Each array takes no more than the whole state: a span of that size each, a page apart, within
    // what a process's address space holds (2^47 bytes).
    const size_t page = 4096, state_bytes = method_->state_bytes(count, codec_.get());
    if (state_bytes > (size_t{1} << 46) / arrays)
      throw std::invalid_argument("a codec state of " + std::to_string(count) + " values cannot be addressed");
    const size_t span = (state_bytes + page - 1) / page * page;
    state_space_ = std::make_unique<Reservation>(span * arrays, "the codec state");
    for (size_t i = 0; i < arrays; ++i) state_arrays_.push_back(state_space_->base() + i * span);
  }

  coll::NodeMap nodes_;
  coll::LinkFacts link_;
  std::unique_ptr<kernels::CodecConfig> codec_;
  const coll::Method* method_ = nullptr;
  coll::StateView view_;
  float zero_ = 0;
  std::vector<std::unique_ptr<coll::MethodState>> states_;  // one (timed), else one a rank
  std::unique_ptr<Reservation> state_space_;                // timed: where the state's arrays are
  std::vector<void*> state_arrays_;
  std::vector<std::unique_ptr<coll::MethodCall>> calls_;
  std::vector<coll::CollArgs> args_;
};

// A step as the simulator runs it, in 16 bytes (the step lists of every fragment in flight are the
// simulation's working set): a transfer to post or wait for, CPU time, or the length an encode
// stores for a later send (variable-length codecs). The two kinds that need an address and a byte
// count take two entries, the second a kData.
struct Op {
  enum Kind : uint8_t { kRecv, kSend, kSendLength, kWait, kCpu, kLength, kData };
  static constexpr size_t kSlots = size_t{1} << 24;
  Kind kind : 8;
  uint32_t slot : 24;  // below kSlots (compact() checks)
  int32_t peer;
  union {
    uint64_t bytes;      // kSend; kData: the byte count of the entry before it
    double seconds;      // kCpu
    const void* length;  // kSendLength: where its length is; kLength: where it goes
  };
};
static_assert(sizeof(Op) == 16, "an Op is two words");

struct Transfer {
  int src = -1, dst = -1;
  uint64_t bytes = 0;
  bool sent = false, received = false;  // posted by each end
  double send_posted = 0, recv_posted = 0;
  double send_done = -1, recv_done = -1;  // known once matched
  int owners = 0;                         // ends still holding it
};

class Engine {
 public:
  Engine(const Model& model, const Topology& topology, const CallSpec& call, bool link_bytes)
      : model_(model),
        topology_(topology),
        call_(call),
        keep_link_bytes_(link_bytes),
        binding_(topology, call, /*timed=*/true),
        factor_(topology.oversubscription()),
        wakeup_(model.wakeup * (factor_ - 1)) {}

  SimResult run();

 private:
  static constexpr size_t kIdle = ~size_t{0};
  struct Slot {
    size_t fragment = kIdle;
    size_t pc = 0;
    std::vector<Op> ops;
    std::vector<int> transfers;  // per transfer slot: a Transfer index, or -1
    std::byte* scratch = nullptr;
  };
  struct Rank {
    std::unique_ptr<coll::Plan> plan;
    std::vector<Slot> slots;
    size_t next_fragment = 0, fragments_done = 0;
    double clock = 0;
    double scheduled = kNever;  // the wake-up queued for it
    double cpu_seconds = 0;
    bool finished = false;
    std::unordered_map<const void*, uint64_t> lengths;
  };

  void schedule(int r, double t) {
    Rank& k = ranks_[static_cast<size_t>(r)];
    if (t >= k.scheduled || r == running_) return;
    k.scheduled = t;
    events_.emplace(t, r);
  }
  void step(int r);
  double advance(int r, Rank& k);
  bool start_fragment(Rank& k, Slot& s);
  void compact(const coll::Program& program, std::vector<Op>* ops);
  double cpu_cost(const coll::Step& step);
  // Seconds per unit of a codec's step (a static name: "encode", or a kernel's name()).
  double step_cost(const kernels::CodecConfig* codec, const char* step);
  int post(int r, Slot& s);  // posts the transfer at s.pc; its index
  void match(int id);
  void release(int id);
  int new_transfer();
  // Unique for ranks below 2^21 (Topology::check allows 2^20) and fragments below 2^21 (run()).
  uint64_t key(int src, int dst, size_t fragment) const {
    return (static_cast<uint64_t>(src) << 42) | (static_cast<uint64_t>(dst) << 21) | fragment;
  }

  const Model& model_;
  const Topology& topology_;
  const CallSpec& call_;
  const bool keep_link_bytes_;
  Binding binding_;
  const double factor_;
  const double wakeup_;  // the delay of a blocked rank's wake-up
  const coll::Algorithm* algorithm_ = nullptr;
  std::vector<Rank> ranks_;
  std::vector<Transfer> transfers_;
  std::vector<int> free_transfers_;
  struct Pending {
    std::vector<int> ids;  // unmatched posts of one side, oldest first from `head`
    size_t head = 0;
  };
  std::unordered_map<uint64_t, Pending> pending_;
  // Ports: per host its NIC (out and in), per rank its intra-host port (out and in).
  // A message holds both its ports for its serialization; one that waits for a busy port does not
  // keep the other from serving later messages meanwhile: a port's busy intervals ahead of now are
  // kept, and a message takes the earliest gap both its ports have (as packets of concurrent flows
  // would share them, at message granularity).
  struct Port {
    // Busy [begin, end) not yet over, by begin, from ahead[head] on: a vector, since a deque allocates
    // some 600 bytes as it is made, and four ports a rank took 2.6 GB of a million ranks' simulation.
    std::vector<std::pair<double, double>> ahead;
    size_t head = 0;
    double free = 0;    // the end of its last interval
    double tokens = 0;  // its token bucket's payload bytes at `free`
    double busy = 0;    // seconds it was serializing
    std::vector<std::pair<double, double>>::iterator first() { return ahead.begin() + static_cast<ptrdiff_t>(head); }
    void reserve(double begin, double end);
    void forget_until(double now);  // drops the intervals that ended by `now`
  };
  // The earliest time at or after `ready` when both ports are free for `seconds`.
  double earliest_gap(Port& out, Port& in, double ready, double seconds);
  std::vector<Port> nic_out_, nic_in_, port_out_, port_in_;
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>> events_;
  double now_ = 0;
  int running_ = -1;
  int finished_ = 0;
  struct StepCost {
    const kernels::CodecConfig* codec;
    const char* step;
    double seconds;
  };
  std::vector<StepCost> step_costs_;  // looked up per step: a few entries, searched in order
  coll::Program program_;             // built into, then compacted
  SimResult result_;
  // What the ranks hold (kMaxHeldBytes): their plans, estimated before they are made, and their
  // fragment programs, counted as they grow. A rank's first fragment also foretells what it will hold
  // in all its slots; once kSampledRanks have started, the ranks not yet started are taken to hold no
  // less than the smallest of those, so that a ring's n programs of 2(n - 1) steps are refused within
  // its first ranks, while a gather's root or a host's leader, whose programs alone grow with the
  // ranks, is not taken for every rank.
  static constexpr int kSampledRanks = 64;
  double plans_bytes_ = 0;
  double programs_bytes_ = 0;  // the ops' capacity in every slot of every rank
  double started_bytes_ = 0;   // what the ranks started so far will hold, by their first fragment
  double smallest_rank_bytes_ = kNever;
  int ranks_started_ = 0;
  int largest_rank_ = -1;  // the rank whose first fragment was the largest, and its steps
  size_t largest_ops_ = 0;
};

double Engine::step_cost(const kernels::CodecConfig* codec, const char* step) {
  if (!codec) throw std::logic_error("a codec step without a codec");
  for (const StepCost& c : step_costs_)
    if (c.codec == codec && c.step == step) return c.seconds;
  const std::string spec = codec->canonical();
  const double* cost = model_.step_cost(spec, step);
  if (!cost)
    throw std::invalid_argument("the model has no CPU cost for step '" + std::string(step) + "' of codec '" + spec +
                                "': measure it with `qccl_sim calibrate --codec " + spec +
                                "` and pass the file with --model");
  step_costs_.push_back({codec, step, *cost});
  return *cost;
}

double Engine::cpu_cost(const coll::Step& step) {
  namespace st = coll::step;
  const coll::CollArgs& args = binding_.args(0);
  const double size_ratio = static_cast<double>(args.element_size()) / 4.0;
  return std::visit(
      [&](const auto& s) -> double {
        using S = std::decay_t<decltype(s)>;
        const Model& m = model_;
        if constexpr (std::is_same_v<S, st::Reduce>)
          return m.reduce * size_ratio * static_cast<double>(s.count);
        else if constexpr (std::is_same_v<S, st::Copy>)
          return m.copy * static_cast<double>(s.bytes);
        else if constexpr (std::is_same_v<S, st::Average>)
          return args.op == kernels::RedOp::kAvg ? m.divide * static_cast<double>(s.count) : 0.0;
        else if constexpr (std::is_same_v<S, st::Load>)
          return (m.load + (s.add ? m.add : 0)) * static_cast<double>(s.count);
        else if constexpr (std::is_same_v<S, st::Store>)
          return m.store * static_cast<double>(s.count);
        else if constexpr (std::is_same_v<S, st::AddFloat>)
          return m.add * static_cast<double>(s.count);
        else if constexpr (std::is_same_v<S, st::Divide>)
          return m.divide * static_cast<double>(s.count);
        else if constexpr (std::is_same_v<S, st::Encode>)
          return step_cost(s.codec, "encode") * static_cast<double>(s.count);
        else if constexpr (std::is_same_v<S, st::DecodeAdd>)
          return step_cost(s.codec, "decode_add") * static_cast<double>(s.count);
        else if constexpr (std::is_same_v<S, st::DecodeOut>)
          return (step_cost(s.codec, "decode") + (args.dtype == kernels::DataType::kFloat32 ? 0 : m.store)) *
                 static_cast<double>(s.count);
        else if constexpr (std::is_same_v<S, st::ErrorFeedback>)
          return (step_cost(s.codec, "decode") + m.add) * static_cast<double>(s.count);
        else if constexpr (std::is_same_v<S, st::Compute>) {
          return step_cost(args.codec, s.kernel->name()) * static_cast<double>(s.count);
        } else {
          return 0.0;
        }
      },
      step);
}

void Engine::compact(const coll::Program& program, std::vector<Op>* ops) {
  namespace st = coll::step;
  ops->clear();
  // About an op a step: reserved at once, not grown by doubling, which left rings' programs 1.8 times
  // the size of their ops (the programs of every rank are what a simulation holds most of).
  ops->reserve(program.steps().size());
  if (program.transfer_slots() > Op::kSlots)
    throw std::invalid_argument(std::to_string(program.transfer_slots()) +
                                " transfers in one fragment: the simulator takes up to 2^24");
  for (const coll::Step& step : program.steps()) {
    Op op{};
    if (const auto* r = std::get_if<st::Recv>(&step)) {
      op.kind = Op::kRecv, op.slot = r->slot, op.peer = r->peer;
    } else if (const auto* s = std::get_if<st::Send>(&step)) {
      op.slot = s->slot, op.peer = s->peer;
      if (!s->length) {
        op.kind = Op::kSend, op.bytes = s->bytes;
      } else {  // the length an encode stores, else (a method's kernel writes it) `density` of the capacity
        op.kind = Op::kSendLength, op.length = s->length;
        ops->push_back(op);
        op = Op{};
        op.kind = Op::kData;
        op.bytes = static_cast<uint64_t>(std::llround(call_.density * static_cast<double>(s->bytes)));
      }
    } else if (const auto* w = std::get_if<st::Wait>(&step)) {
      op.kind = Op::kWait, op.slot = w->slot;
    } else {
      const double seconds = cpu_cost(step);
      if (!ops->empty() && ops->back().kind == Op::kCpu) {
        ops->back().seconds += seconds;
      } else if (seconds > 0) {
        op.kind = Op::kCpu, op.seconds = seconds;
        ops->push_back(op);
      }
      if (const auto* e = std::get_if<st::Encode>(&step); e && e->length) {
        const size_t capacity = e->codec->encoded_bytes(e->count);
        Op length{}, data{};
        length.kind = Op::kLength;
        length.length = e->length;
        data.kind = Op::kData;
        data.bytes = e->codec->variable_length()
                         ? static_cast<uint64_t>(std::llround(call_.density * static_cast<double>(capacity)))
                         : capacity;
        ops->push_back(length);
        ops->push_back(data);
      }
      continue;
    }
    ops->push_back(op);
  }
}

bool Engine::start_fragment(Rank& k, Slot& s) {
  if (k.next_fragment >= k.plan->fragments()) return false;
  s.fragment = k.next_fragment++;
  s.pc = 0;
  k.plan->build(s.fragment, s.scratch, program_);
  const size_t capacity = s.ops.capacity();  // clear() keeps it: it only grows
  compact(program_, &s.ops);
  programs_bytes_ += static_cast<double>((s.ops.capacity() - capacity) * sizeof(Op));
  const int n = topology_.nranks;
  if (s.fragment == 0) {
    const double rank_bytes = static_cast<double>(s.ops.capacity() * sizeof(Op) * k.slots.size());
    started_bytes_ += rank_bytes;
    smallest_rank_bytes_ = std::min(smallest_rank_bytes_, rank_bytes);
    ++ranks_started_;
    if (largest_rank_ < 0 || s.ops.size() > largest_ops_)
      largest_ops_ = s.ops.size(), largest_rank_ = static_cast<int>(&k - ranks_.data());
  }
  const bool sampled = ranks_started_ >= std::min(n, kSampledRanks);
  const double unstarted =
      sampled && ranks_started_ < n ? static_cast<double>(n - ranks_started_) * smallest_rank_bytes_ : 0;
  const double programs = std::max(programs_bytes_, started_bytes_ + unstarted);
  if (plans_bytes_ + programs > kMaxHeldBytes) {
    const std::string depth = k.slots.size() > 1 ? ", --depth 1 (one fragment in flight)" : "";
    throw std::invalid_argument(
        format("the fragment programs of %s on %d ranks would hold some %s beside %s of plans (rank %d: %zu steps a "
               "fragment, %zu in flight); the simulator holds up to %s of plans and programs: fewer ranks%s, or an "
               "algorithm whose fragments take fewer steps (qccl_info -a; recursive_doubling's and the binomial "
               "trees' take O(log n))",
               algorithm_->name, n, human_bytes(programs).c_str(), human_bytes(plans_bytes_).c_str(),
               largest_rank_, largest_ops_, ranks_[static_cast<size_t>(largest_rank_)].slots.size(),
               human_bytes(kMaxHeldBytes).c_str(), depth.c_str()));
  }
  result_.steps += program_.steps().size();
  if (s.transfers.size() < program_.transfer_slots()) s.transfers.resize(program_.transfer_slots(), -1);
  return true;
}

int Engine::new_transfer() {
  if (!free_transfers_.empty()) {
    const int id = free_transfers_.back();
    free_transfers_.pop_back();
    transfers_[static_cast<size_t>(id)] = Transfer{};
    return id;
  }
  transfers_.emplace_back();
  return static_cast<int>(transfers_.size() - 1);
}

void Engine::release(int id) {
  if (--transfers_[static_cast<size_t>(id)].owners == 0) free_transfers_.push_back(id);
}

int Engine::post(int r, Slot& s) {
  Rank& k = ranks_[static_cast<size_t>(r)];
  const Op& op = s.ops[s.pc];
  const bool send = op.kind != Op::kRecv;
  const int src = send ? r : op.peer, dst = send ? op.peer : r;
  if (op.peer < 0 || op.peer >= topology_.nranks)
    throw std::invalid_argument(std::string("algorithm ") + algorithm_->name + " exchanges data with peer " +
                                std::to_string(op.peer) + " (aggregator processes are not simulated)");
  Pending& pending = pending_[key(src, dst, s.fragment)];
  int id = -1;
  if (pending.head < pending.ids.size()) {  // the oldest unmatched post of the same message
    const int candidate = pending.ids[pending.head];
    const Transfer& t = transfers_[static_cast<size_t>(candidate)];
    if (send ? !t.sent : !t.received) id = candidate, ++pending.head;
  }
  const bool matched = id >= 0;
  if (!matched) {
    id = new_transfer();
    pending.ids.push_back(id);
    Transfer& t = transfers_[static_cast<size_t>(id)];
    t.src = src, t.dst = dst, t.owners = 2;
  }
  Transfer& t = transfers_[static_cast<size_t>(id)];
  if (send) {
    t.sent = true, t.send_posted = k.clock;
    t.bytes = op.bytes;
    if (op.kind == Op::kSendLength) {
      auto it = k.lengths.find(op.length);
      t.bytes = it != k.lengths.end() ? it->second : s.ops[s.pc + 1].bytes;
    }
  } else {
    t.received = true, t.recv_posted = k.clock;
  }
  int& held = s.transfers[op.slot];
  if (held >= 0) release(held);  // a completed transfer the fragment did not wait for
  held = id;
  if (matched) {
    if (pending.head == pending.ids.size()) pending_.erase(key(src, dst, s.fragment));
    match(id);
  }
  return id;
}

void Engine::Port::reserve(double begin, double end) {
  const auto at = std::upper_bound(first(), ahead.end(), begin,
                                   [](double b, const std::pair<double, double>& i) { return b < i.first; });
  ahead.insert(at, {begin, end});
  free = std::max(free, end);
}

void Engine::Port::forget_until(double now) {
  while (head < ahead.size() && ahead[head].second <= now) ++head;
  if (head > 64 && head * 2 > ahead.size()) {  // the dropped front is reclaimed once it outweighs the rest
    ahead.erase(ahead.begin(), first());
    head = 0;
  }
}

// A port's intervals do not overlap (each was placed in a gap), so their ends are sorted as their
// begins: the first interval that could overlap [t, t + seconds) is found by binary search.
double Engine::earliest_gap(Port& out, Port& in, double ready, double seconds) {
  for (Port* p : {&out, &in}) p->forget_until(now_);  // what ended before now can hold no later message
  double t = ready;
  for (bool moved = true; moved;) {
    moved = false;
    for (Port* p : {&out, &in}) {
      auto i = std::upper_bound(p->first(), p->ahead.end(), t,
                                [](double v, const std::pair<double, double>& x) { return v < x.second; });
      for (; i != p->ahead.end() && i->first < t + seconds; ++i) t = i->second, moved = true;
    }
  }
  return t;
}

void Engine::match(int id) {
  Transfer& t = transfers_[static_cast<size_t>(id)];
  const bool across = topology_.host_of(t.src) != topology_.host_of(t.dst);
  const LinkClass& link = across ? model_.inter : model_.intra;
  Port& out = across ? nic_out_[static_cast<size_t>(topology_.host_of(t.src))] : port_out_[static_cast<size_t>(t.src)];
  Port& in = across ? nic_in_[static_cast<size_t>(topology_.host_of(t.dst))] : port_in_[static_cast<size_t>(t.dst)];
  const double ready = std::max(t.send_posted, t.recv_posted);
  const double bytes = static_cast<double>(t.bytes), rate = link.payload_rate();
  double start = ready, busy = 0;
  if (rate > 0) {
    busy = bytes / rate;
    start = earliest_gap(out, in, ready, busy);
    if (start >= std::max(out.free, in.free)) {
      // After everything the ports hold: each one's bucket, refilled since, passes what its tokens
      // cover at once. (A message in a gap between others takes no tokens.)
      const double depth = link.burst * link.efficiency;
      const double out_tokens = std::min(depth, out.tokens + (start - out.free) * rate);
      const double in_tokens = std::min(depth, in.tokens + (start - in.free) * rate);
      busy = std::max(0.0, bytes - std::min(out_tokens, in_tokens)) / rate;
      out.tokens = std::min(depth, out_tokens - bytes + busy * rate);
      in.tokens = std::min(depth, in_tokens - bytes + busy * rate);
    }
    out.reserve(start, start + busy);
    in.reserve(start, start + busy);
  }
  out.busy += busy;
  in.busy += busy;
  t.send_done = start + busy;
  t.recv_done = start + busy + link.latency;
  (across ? result_.inter_bytes : result_.intra_bytes) += t.bytes;
  if (keep_link_bytes_) result_.link_bytes[{t.src, t.dst}] += t.bytes;
  ++result_.transfers;
  schedule(t.src, t.send_done);
  schedule(t.dst, t.recv_done);
}

// Rank r's turn at now_: it runs as far as it can go, then queues its next wake-up, or waits for a
// match to queue it (a transfer it waits for has no time yet), or is finished.
void Engine::step(int r) {
  Rank& k = ranks_[static_cast<size_t>(r)];
  // A rank that was blocked waits for a core when its host is oversubscribed (Model::wakeup).
  k.clock = now_ > k.clock ? now_ + wakeup_ : k.clock;
  running_ = r;
  const double wake = advance(r, k);
  running_ = -1;
  if (k.fragments_done == k.plan->fragments()) {
    k.finished = true;
    ++finished_;
    return;
  }
  if (wake < kNever) schedule(r, wake);
}

// Runs rank r's fragments as the host executor does (HostExecution::run): each slot's steps in
// order until one must wait. Returns when to try again (kNever: when a match says).
double Engine::advance(int r, Rank& k) {
  double wake = kNever;
  bool moved = true;
  while (moved) {
    moved = false;
    for (Slot& s : k.slots) {
      if (s.fragment == kIdle) {
        if (!start_fragment(k, s)) continue;
        moved = true;
      }
      while (s.fragment != kIdle) {
        if (s.pc == s.ops.size()) {  // done once all its transfers are
          double last = k.clock;
          bool known = true;
          for (int id : s.transfers) {
            if (id < 0) continue;
            const Transfer& t = transfers_[static_cast<size_t>(id)];
            const double done = t.src == r ? t.send_done : t.recv_done;
            if (done < 0)
              known = false;
            else
              last = std::max(last, done);
          }
          if (!known) break;
          if (last > k.clock) {
            wake = std::min(wake, last);
            break;
          }
          for (int& id : s.transfers)
            if (id >= 0) release(id), id = -1;
          ++k.fragments_done;
          s.fragment = kIdle;
          moved = true;
          if (!start_fragment(k, s)) break;
          continue;
        }
        const Op& op = s.ops[s.pc];
        if (op.kind == Op::kRecv || op.kind == Op::kSend || op.kind == Op::kSendLength) {
          // Ports serve messages in the order they were posted, so a rank whose CPU work took it
          // ahead of the others in virtual time lets them act first.
          if (k.clock > now_) return k.clock;
          const int id = post(r, s);
          const Transfer& t = transfers_[static_cast<size_t>(id)];
          double cpu = model_.post;
          if (op.kind == Op::kSendLength) ++s.pc;  // its kData
          if (op.kind != Op::kRecv && topology_.host_of(t.src) != topology_.host_of(t.dst))
            cpu += model_.tcp_seconds(static_cast<double>(t.bytes));  // written into the socket
          k.clock += cpu * factor_;
          k.cpu_seconds += cpu * factor_;
        } else if (op.kind == Op::kWait) {
          const int id = op.slot < s.transfers.size() ? s.transfers[op.slot] : -1;
          if (id >= 0) {
            const Transfer& t = transfers_[static_cast<size_t>(id)];
            const double done = t.src == r ? t.send_done : t.recv_done;
            if (done < 0) break;  // not matched yet
            if (done > k.clock) {
              wake = std::min(wake, done);
              break;
            }
            if (t.dst == r && topology_.host_of(t.src) != topology_.host_of(r)) {  // read from the socket
              const double cpu = model_.tcp_seconds(static_cast<double>(t.bytes)) * factor_;
              k.clock += cpu;
              k.cpu_seconds += cpu;
            }
            release(id);  // done: a later wait on the slot passes, as the executor's does
            s.transfers[op.slot] = -1;
          }
        } else if (op.kind == Op::kCpu) {
          k.clock += op.seconds * factor_;
          k.cpu_seconds += op.seconds * factor_;
        } else if (op.kind == Op::kLength) {
          k.lengths[op.length] = s.ops[++s.pc].bytes;
        } else {
          throw std::logic_error("a data entry run as a step");
        }
        ++s.pc;
        moved = true;
      }
    }
  }
  return wake;
}

SimResult Engine::run() {
  const int n = topology_.nranks;
  const int hosts = topology_.host_count();
  ranks_.resize(static_cast<size_t>(n));
  // Buffers: addresses only (simulator.h), the same for every rank.
  const size_t es = kernels::element_size(call_.dtype);
  const size_t send_bytes = send_elements(call_, n) * es, recv_bytes = recv_elements(call_, n) * es;
  const size_t page = 4096, send_span = (send_bytes + page - 1) / page * page;
  const size_t recv_span = (recv_bytes + page - 1) / page * page;
  coll::PlanOptions options;
  options.chunk_bytes = call_.chunk_bytes;
  Reservation buffers(send_span + recv_span);
  for (int r = 0; r < n; ++r) binding_.bind(r, buffers.base(), buffers.base() + send_span);
  algorithm_ = &binding_.algorithm(call_.algorithm);
  check_plan_memory(*algorithm_, topology_, binding_.args(0));
  plans_bytes_ = plan_bytes_per_rank(*algorithm_, topology_) * n;
  program_.set_default_codec(binding_.codec());
  size_t scratch = 0;
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks_[static_cast<size_t>(r)];
    k.plan = algorithm_->make(binding_.args(r), options);
    if (k.plan->fragments() >= (size_t{1} << 21))  // message keys hold 21 bits of fragment
      throw std::invalid_argument(std::to_string(k.plan->fragments()) +
                                  " fragments: the simulator takes fewer than 2^21 (a larger --chunk)");
    scratch = std::max(scratch, k.plan->scratch_stride());
    result_.plan_bytes += k.plan->wire_bytes_sent();
    result_.raw_bytes += k.plan->raw_wire_bytes();
    if (k.plan->uses_aggregators())
      throw std::invalid_argument(std::string("algorithm ") + algorithm_->name +
                                  " sums through aggregator processes, which are not simulated");
  }
  const size_t slots = static_cast<size_t>(call_.depth);
  Reservation scratch_space(scratch * slots);
  for (Rank& k : ranks_) {
    k.slots.resize(std::min(slots, std::max<size_t>(k.plan->fragments(), 1)));
    for (size_t i = 0; i < k.slots.size(); ++i) k.slots[i].scratch = scratch_space.base() + i * scratch;
  }
  // Buckets start empty: the call simulated is one of many back to back (a training step's, or a
  // benchmark's, a barrier apart), whose links were busy until it began; a full bucket would credit
  // every call with a burst of wire it does not get (docs/PERF.md, "Token buckets at a call's start").
  nic_out_.assign(static_cast<size_t>(hosts), Port{});
  nic_in_ = nic_out_;
  port_out_.assign(static_cast<size_t>(n), Port{});
  port_in_ = port_out_;

  pending_.reserve(4 * static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) schedule(r, 0.0);
  while (!events_.empty()) {
    const auto [t, r] = events_.top();
    events_.pop();
    Rank& k = ranks_[static_cast<size_t>(r)];
    if (t != k.scheduled) continue;  // superseded by an earlier wake-up
    k.scheduled = kNever;
    now_ = t;
    if (!events_.empty()) {  // the next rank's steps are far in memory: start fetching them now
      for (const Slot& slot : ranks_[static_cast<size_t>(events_.top().second)].slots)
        if (slot.pc < slot.ops.size()) __builtin_prefetch(&slot.ops[slot.pc]);
    }
    step(r);
  }
  if (finished_ < n) {
    for (int r = 0; r < n; ++r) {
      const Rank& k = ranks_[static_cast<size_t>(r)];
      if (k.finished) continue;
      throw std::runtime_error(std::string("the plans of ") + algorithm_->name + " deadlock: rank " +
                               std::to_string(r) + " finished " + std::to_string(k.fragments_done) + " of " +
                               std::to_string(k.plan->fragments()) +
                               " fragments and waits for a transfer no rank posts");
    }
  }

  // Rooted collectives also wait for their agreement rounds (src/executor.h).
  double agreement = 0;
  if (coll::rooted(call_.kind) && n > 1) {
    const double latency = hosts > 1 ? model_.inter.latency : model_.intra.latency;
    agreement = std::ceil(std::log2(static_cast<double>(n))) * (latency + model_.post * factor_);
  }
  for (const Rank& k : ranks_) {
    result_.seconds = std::max({result_.seconds, k.clock, agreement});
    result_.busiest_cpu = std::max(result_.busiest_cpu, k.cpu_seconds);
  }
  for (const auto* ports : {&nic_out_, &nic_in_})
    for (const Port& p : *ports) result_.busiest_nic = std::max(result_.busiest_nic, p.busy);
  for (const auto* ports : {&port_out_, &port_in_})
    for (const Port& p : *ports) result_.busiest_intra = std::max(result_.busiest_intra, p.busy);
  result_.algorithm = algorithm_->name;
  result_.codec = binding_.codec() ? binding_.codec()->canonical() : "";
  const double t = result_.seconds;
  const std::pair<double, const char*> bounds[] = {
      {result_.busiest_nic, "inter"}, {result_.busiest_intra, "intra"}, {result_.busiest_cpu, "cpu"}};
  const auto* top = std::max_element(std::begin(bounds), std::end(bounds));
  result_.bottleneck = t > 0 && top->first >= 0.5 * t ? top->second : "latency";
  return result_;
}

}  // namespace

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return format(u ? "%.1f %s" : "%.0f %s", b, units[u]);
}

double plan_bytes_per_rank(const coll::Algorithm& algorithm, const Topology& topology) {
  return kPlanBaseBytes + sizeof(int) * plan_holdings(algorithm, topology).ints;
}

SimResult simulate(const Model& model, const Topology& topology, const CallSpec& call, bool link_bytes) {
  Engine engine(model, topology, call, link_bytes);
  return engine.run();
}

std::map<std::pair<int, int>, uint64_t> execute(const Topology& topology, const CallSpec& call, StepProfile* profile) {
  const int n = topology.nranks;
  Binding binding(topology, call, /*timed=*/false);
  const size_t es = kernels::element_size(call.dtype);
  const size_t send_bytes = send_elements(call, n) * es, recv_bytes = recv_elements(call, n) * es;
  SimNetwork net(n);
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) names.push_back("rank " + std::to_string(r));
  std::vector<std::vector<std::byte>> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n)),
      scratch(static_cast<size_t>(n));
  std::vector<std::unique_ptr<SimTransport>> transports;
  std::vector<std::unique_ptr<HostExecutor>> executors;
  std::vector<std::unique_ptr<Execution>> ops;
  std::mt19937 random(12345);
  std::normal_distribution<float> normal;
  coll::PlanOptions options;
  options.chunk_bytes = call.chunk_bytes;
  for (int r = 0; r < n; ++r) {
    auto& in = send[static_cast<size_t>(r)];
    in.resize(send_bytes);
    recv[static_cast<size_t>(r)].resize(recv_bytes);
    // Values a codec sees in training (floating types); integers take the raw bytes.
    if (call.dtype == kernels::DataType::kFloat32) {
      for (size_t i = 0; i + 4 <= in.size(); i += 4) {
        const float v = normal(random);
        std::memcpy(&in[i], &v, 4);
      }
    } else {
      for (auto& b : in) b = static_cast<std::byte>(random() & 0x3f);
    }
    binding.bind(r, in.data(), recv[static_cast<size_t>(r)].data());
  }
  const coll::Algorithm& algorithm = binding.algorithm(call.algorithm);
  check_plan_memory(algorithm, topology, binding.args(0));
  for (int r = 0; r < n; ++r) {
    const coll::CollArgs& args = binding.args(r);
    auto plan = algorithm.make(args, options);
    if (plan->uses_aggregators())  // its messages would go to ranks that do not exist here
      throw std::invalid_argument(std::string("algorithm ") + algorithm.name +
                                  " sums through aggregator processes, which are not executed");
    transports.push_back(std::make_unique<SimTransport>(net, r));
    executors.push_back(
        std::make_unique<HostExecutor>(*transports.back(), HostExecutorOptions{call.depth, false, profile}, &names));
    scratch[static_cast<size_t>(r)].resize(executors.back()->scratch_bytes(*plan));
    OperationIdentity id;
    id.sequence = 1;
    id.header = FrameHeader::for_call(args, id.sequence, args.codec ? args.codec->hash() : 0);
    id.expected = id.header;
    ops.push_back(executors.back()->launch(algorithm, std::move(plan), id, scratch[static_cast<size_t>(r)].data()));
  }
  for (;;) {
    bool moved = net.progress(), all = true;
    for (auto& op : ops) {
      if (op->finished()) continue;
      moved |= op->advance();
      all &= op->finished();
    }
    if (all) break;
    if (!moved) throw std::runtime_error(std::string("the plans of ") + algorithm.name + " deadlock when executed");
  }
  return net.payload_bytes;
}

}  // namespace qccl::sim
