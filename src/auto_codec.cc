#include "src/auto_codec.h"

#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "base/config.h"
#include "base/errors.h"
#include "base/log.h"
#include "collectives/ring.h"
#include "kernels/convert.h"
#include "kernels/reduce.h"
#include "src/policy.h"

namespace qccl {

namespace {

// The kernel's TCP path between hosts, per payload byte at each end: the simulator's calibration on
// the development machine (sim/model.cc, default_model: 0.27-0.79 ns, 0.4 kept). Not measured at
// creation: that would take a transfer between nodes.
constexpr double kKernelTcpSecondsPerByte = 4e-10;
// ... and per message, beside its bytes: 8 us (sim/model.cc, default_model: 7.4-9.5 us).
constexpr double kKernelTcpSecondsPerMessage = 8e-6;
constexpr double kDefaultBudget = 0.01;
// sra_compressed's chain is walked message by message (FragmentWalk: n^2 messages) up to this many
// ranks, priced in closed form beyond: weighing a call's options at 32 ranks takes 0.3-1.2 ms, once
// per call shape (docs/PERF.md).
constexpr int kWalkedRanks = 32;
// choose() remembers this many call shapes.
constexpr size_t kCachedShapes = 4096;
// At most this many distinct calls are logged with their predictions.
constexpr size_t kLoggedShapes = 64;

// Rounds of measurement: every kernel runs once per round, and each keeps its best (least
// contended) round. Interleaved, not one kernel's runs back to back: a burst of contention from the
// other ranks starting up or a neighbour's job (a copy is the kernel that memory traffic slows most)
// then costs each kernel a round, not one kernel all of its runs, which skewed the model towards
// compressing between ranks of one host in CI twice. The first round warms the caches and pages.
constexpr int kRounds = 4;

// Kernels to time: each its per-unit result's address, the units it handles and the kernel.
struct Probe {
  double* result;
  double units;
  std::function<void()> run;
};

void run_probes(const std::vector<Probe>& probes) {
  std::vector<double> best(probes.size(), std::numeric_limits<double>::infinity());
  for (int round = 0; round < kRounds; ++round)
    for (size_t i = 0; i < probes.size(); ++i) {
      const double begin = thread_cpu_seconds();
      probes[i].run();
      best[i] = std::min(best[i], thread_cpu_seconds() - begin);
    }
  for (size_t i = 0; i < probes.size(); ++i) *probes[i].result = best[i] / probes[i].units;
}

// Values per measurement: 4 MiB of float32, beyond the per-core caches (qccl_sim calibrate takes
// 16 MiB; a quarter keeps communicator creation to some 30 ms for 3 codecs).
constexpr size_t kProbeValues = size_t{1} << 20;

std::vector<float> probe_input() {
  std::vector<float> x(kProbeValues);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (float& v : x) {  // uniform in [-1, 1): codecs do not branch on values, but keep them honest
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<double>(s >> 11) * 0x1p-52 - 1.0);
  }
  return x;
}

// This process's measured costs, once per codec (a process may make many communicators).
std::mutex g_measured_mu;
std::map<std::string, CpuCosts::Codec> g_measured_codecs;
CpuCosts g_measured;  // the codec-independent costs

// Per-unit error of one encode: of its input range (q codecs), and of the encoded magnitude (casts).
// False for codecs without a bound here (learned levels, random shift, the method codecs).
bool unit_errors(const kernels::CodecConfig& c, double* per_range, double* relative) {
  *per_range = 0, *relative = 0;
  switch (c.kind) {
    case kernels::CodecKind::kNone: return true;
    case kernels::CodecKind::kFp16: *relative = 0x1p-11; return true;  // half an ulp of 11 bits
    case kernels::CodecKind::kBf16: *relative = 0x1p-8; return true;
    case kernels::CodecKind::kQuant:
      if (!c.levels.empty()) return false;
      // quant.h: a bucket's 2^b - 1 steps span its range; nearest errs by half a step, stochastic by
      // less than one
      if (c.rounding == kernels::Rounding::kNearest) *per_range = 0.5 / ((1u << c.bits) - 1);
      else if (c.rounding == kernels::Rounding::kStochastic) *per_range = 1.0 / ((1u << c.bits) - 1);
      else return false;
      return true;
    default: return false;
  }
}

// The float32 arithmetic around the codecs: quant.h's own allowance per encode (2^-13 of a step
// plus 2^-22 of the bucket's largest magnitude, for its float32 scale and minimum) and the float32
// sums of n contributions.
double with_float_slack(double bound, int nranks) { return bound * (1 + 0x1p-11) + (nranks + 4) * 0x1p-22; }

// The rounding of the result to the call's type, relative to its magnitude (a half or bfloat16 sum
// rounds once more; an uncompressed sum does too).
double output_rounding(kernels::DataType type) {
  if (type == kernels::DataType::kFloat16) return 0x1p-11;
  if (type == kernels::DataType::kBfloat16) return 0x1p-8;
  return 0;
}

std::string budget_text(double budget) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", budget);
  return text;
}

// One fragment of a call walked message by message in virtual time, in the simulator's order of
// events (sim/simulator.cc): a message leaves once both ends have posted it and takes the earliest
// gap that both its ports have (between nodes the sending node's link and the receiving node's, each
// with a token bucket that fills while it idles, ClusterFacts::inter_burst; within a node the two
// ranks' ports), while its sender writes it into the socket; the receiver reads it after its flight.
// For the plans whose steps cross nodes or not depending on how the ranks sit on them (recursive
// doubling's fold, sra_compressed's steps on nodes of several ranks), which a closed form would have
// to guess.
class FragmentWalk {
 public:
  struct Message {
    int from, to;
    double after = 0;  // the receiver's work once it has read it (a sum, a decode)
  };
  // When a rank of a step waits for its send: before the receiver's work (recursive doubling adds
  // once both are done), after it (sra_compressed's gather decodes, then waits), or two steps later,
  // before that step's work (sra_compressed's scatter: two send buffers in turn).
  enum class SendWait { kBeforeWork, kAfterWork, kTwoStepsLater };

  // `node_of[r]`: rank r's node, 0 .. nodes-1.
  FragmentWalk(const ClusterFacts& facts, std::vector<int> node_of, int nodes)
      : facts_(facts),
        node_of_(std::move(node_of)),
        clock_(node_of_.size()),
        cpu_(node_of_.size()),
        last_sent_(node_of_.size()),
        earlier_sent_(node_of_.size()),
        link_out_(static_cast<size_t>(nodes)),
        link_in_(static_cast<size_t>(nodes)),
        port_out_(node_of_.size()),
        port_in_(node_of_.size()) {}

  // Every rank works `seconds` (a copy, a sum of what it received).
  void work(double seconds) {
    for (size_t r = 0; r < clock_.size(); ++r) clock_[r] += seconds, cpu_[r] += seconds;
  }
  // The ranks of `messages` each work `before`, post their receives and sends of `bytes` each, write
  // those between nodes into the socket, wait for their receives, read them and do the receiver's
  // work (in the plans walked a rank receives at most one message a step), waiting for their sends
  // as `wait` says.
  void step(std::vector<Message> messages, double bytes, double before, SendWait wait) {
    std::vector<Turn>& turns = turns_;
    turns.assign(clock_.size(), Turn{});
    for (const Message& m : messages) turns[m.from].takes_part = turns[m.to].takes_part = true;
    // No message of this step or a later one is posted before the earliest clock: what the ports held
    // until then cannot be in its way.
    const double horizon = *std::min_element(clock_.begin(), clock_.end());
    for (auto* ports : {&link_out_, &link_in_, &port_out_, &port_in_})
      for (Port& port : *ports) port.forget_until(horizon);
    if (wait == SendWait::kTwoStepsLater)
      for (size_t r = 0; r < clock_.size(); ++r)
        if (turns[r].takes_part) clock_[r] = std::max(clock_[r], earlier_sent_[r]);
    const auto posted = [&](const Message& m) { return std::max(clock_[m.from], clock_[m.to]) + before; };
    std::sort(messages.begin(), messages.end(), [&](const Message& a, const Message& b) {
      return std::make_pair(posted(a), a.from) < std::make_pair(posted(b), b.from);  // ties: rank order
    });
    const double socket = bytes * facts_.cpu.wire + facts_.cpu.message;
    for (const Message& m : messages) {
      Turn &sender = turns[m.from], &receiver = turns[m.to];
      const int a = node_of_[m.from], b = node_of_[m.to];
      double sent = 0, flight = 0;
      if (a != b) {
        sent = transfer(link_out_[a], link_in_[b], posted(m), bytes, facts_.inter_rate, facts_.inter_burst);
        flight = facts_.inter_latency;
        sender.writes += socket, receiver.reads += socket;
      } else {
        sent = transfer(port_out_[m.from], port_in_[m.to], posted(m), bytes, facts_.intra_rate, 0);
        flight = facts_.intra_latency;
      }
      sender.sent = std::max(sender.sent, sent);
      receiver.arrived = std::max(receiver.arrived, sent + flight);
      receiver.after += m.after;
    }
    for (size_t r = 0; r < clock_.size(); ++r) {
      const Turn& t = turns[r];
      if (!t.takes_part) continue;
      cpu_[r] += before + t.writes + t.reads + t.after;
      double& c = clock_[r];
      c = std::max(c + before + t.writes, t.arrived) + t.reads;
      if (wait == SendWait::kBeforeWork) c = std::max(c, t.sent);
      c += t.after;
      if (wait == SendWait::kAfterWork) c = std::max(c, t.sent);
      earlier_sent_[r] = last_sent_[r], last_sent_[r] = t.sent;
    }
  }
  // Every rank waits for the sends it has not waited for.
  void wait_for_sends() {
    for (size_t r = 0; r < clock_.size(); ++r) clock_[r] = std::max({clock_[r], last_sent_[r], earlier_sent_[r]});
  }

  double end() const { return clock_.empty() ? 0 : *std::max_element(clock_.begin(), clock_.end()); }
  // The busiest rank's CPU seconds (its work and its socket writes and reads).
  double busiest_cpu() const { return cpu_.empty() ? 0 : *std::max_element(cpu_.begin(), cpu_.end()); }
  // The bytes of the busiest node's link (the larger way), and of the busiest rank's port inside.
  double busiest_link_bytes() const {
    double most = 0;
    for (size_t k = 0; k < link_out_.size(); ++k) most = std::max({most, link_out_[k].bytes, link_in_[k].bytes});
    return most;
  }
  double busiest_port_bytes() const {
    double most = 0;
    for (size_t r = 0; r < port_out_.size(); ++r) most = std::max({most, port_out_[r].bytes, port_in_[r].bytes});
    return most;
  }

 private:
  struct Turn {  // a rank's part in a step
    bool takes_part = false;
    double writes = 0, sent = 0, arrived = 0, reads = 0, after = 0;
  };
  // A port one way (a node's link, a rank's port inside its node). A message holds both its ports
  // while it is on the wire, in the earliest gap both have (one waiting for a port does not keep
  // the other from later messages).
  struct Port {
    std::vector<std::pair<double, double>> busy;  // [begin, end), by begin; those before `first` over
    size_t first = 0;
    double free = 0, tokens = 0, bytes = 0;  // the end of its last interval; tokens at `free`
    void reserve(double begin, double end) {
      busy.insert(std::upper_bound(busy.begin() + first, busy.end(), std::make_pair(begin, end)), {begin, end});
      free = std::max(free, end);
    }
    void forget_until(double t) {  // intervals over by t (ends are in order too: they do not overlap)
      while (first < busy.size() && busy[first].second <= t) ++first;
      if (first > 64 && 2 * first > busy.size()) busy.erase(busy.begin(), busy.begin() + first), first = 0;
    }
  };
  static double earliest_gap(const Port& out, const Port& in, double ready, double seconds) {
    double t = ready;
    for (bool moved = true; moved;) {
      moved = false;
      for (const Port* port : {&out, &in}) {
        auto i = std::upper_bound(port->busy.begin() + port->first, port->busy.end(), t,
                                  [](double v, const std::pair<double, double>& x) { return v < x.second; });
        for (; i != port->busy.end() && i->first < t + seconds; ++i) t = i->second, moved = true;
      }
    }
    return t;
  }
  // `bytes` from `out` to `in` once posted at `ready`: when the last byte has left.
  static double transfer(Port& out, Port& in, double ready, double bytes, double rate, double burst) {
    double wire = bytes / rate;
    const double start = earliest_gap(out, in, ready, wire);
    if (burst > 0 && start >= std::max(out.free, in.free)) {  // after all they hold: the buckets give
      const double out_tokens = std::min(burst, out.tokens + (start - out.free) * rate);
      const double in_tokens = std::min(burst, in.tokens + (start - in.free) * rate);
      wire = std::max(0.0, bytes - std::min(out_tokens, in_tokens)) / rate;
      out.tokens = std::min(burst, out_tokens - bytes + wire * rate);
      in.tokens = std::min(burst, in_tokens - bytes + wire * rate);
    }
    out.reserve(start, start + wire), in.reserve(start, start + wire);
    out.bytes += bytes, in.bytes += bytes;
    return start + wire;
  }

  const ClusterFacts& facts_;
  std::vector<int> node_of_;
  std::vector<double> clock_, cpu_, last_sent_, earlier_sent_;
  std::vector<Port> link_out_, link_in_, port_out_, port_in_;
  std::vector<Turn> turns_;  // step()'s, kept to save an allocation per step
};

}  // namespace

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// ---- CpuCosts -------------------------------------------------------------------------------------

std::vector<double> CpuCosts::flatten() const {
  std::vector<double> out = {reduce, copy, load, add, wire, message};
  for (const Codec& c : codecs) out.insert(out.end(), {c.encode, c.decode, c.decode_add});
  return out;
}

bool CpuCosts::unflatten(const std::vector<double>& numbers, size_t codec_count, CpuCosts* out) {
  if (numbers.size() != kFixed + 3 * codec_count) return false;
  out->reduce = numbers[0], out->copy = numbers[1], out->load = numbers[2], out->add = numbers[3];
  out->wire = numbers[4], out->message = numbers[5];
  out->codecs.resize(codec_count);
  for (size_t i = 0; i < codec_count; ++i) {
    const double* c = &numbers[kFixed + 3 * i];
    out->codecs[i] = Codec{c[0], c[1], c[2]};
  }
  return true;
}

// ---- AutoCodec ------------------------------------------------------------------------------------

bool AutoCodec::is_auto(const std::string& spec) { return spec == "auto" || spec.rfind("auto:", 0) == 0; }

AutoCodec::AutoCodec(const std::string& spec, int nranks, const std::string& source)
    : budget_(kDefaultBudget), nranks_(nranks) {
  const char* from = source.c_str();
  if (!is_auto(spec)) fail(qcclInvalidArgument, "%s: '%s' is not auto[:maxrelerr=E]", from, spec.c_str());
  if (spec.size() > 4) {
    const std::string option = spec.substr(5);
    const std::string key = "maxrelerr=";
    if (option.rfind(key, 0) != 0)
      fail(qcclInvalidArgument, "%s: auto takes maxrelerr=E, not '%s'", from, option.c_str());
    // The variables' own rules (no blanks, hex or underflow to 0): a bound, so any finite E >= 0.
    budget_ = parse_double(std::string(from) + ": auto's maxrelerr", option.substr(key.size()), 0,
                           std::numeric_limits<double>::max());
  }
  // The most accurate first: among candidates the model finds about as fast, the first wins.
  std::vector<std::string> specs = {"fp16", "bf16"};
  for (int bits = 8; bits >= 1; --bits) specs.push_back("q" + std::to_string(bits));
  for (const std::string& s : specs) {
    kernels::CodecConfig codec = kernels::parse_codec_spec(s);
    if (error_bound(codec, nranks) > budget_) continue;
    candidates_.push_back(codec);
    names_.push_back(s);
  }
}

double AutoCodec::error_bound(const kernels::CodecConfig& codec, int nranks) {
  double per_range = 0, relative = 0;
  if (!unit_errors(codec, &per_range, &relative)) return std::numeric_limits<double>::infinity();
  // sra_compressed, inputs |x| <= M_r on rank r, largest sum S = sum of M_r: the contributions a
  // segment's owner receives are encoded once each (range <= 2 M_r, magnitude <= M_r; together at
  // most 2S and S) and its sum once (range <= 2S, magnitude <= S): per element at most
  // per_range 4S + relative 2S. hierarchical_compressed encodes node sums instead of contributions:
  // the same. (With equal M_r it is (4n - 2)/n and (2n - 1)/n of S; one rank may hold all of S.)
  return with_float_slack(4 * per_range + 2 * relative, nranks);
}

double AutoCodec::ring_error_bound(const kernels::CodecConfig& codec, int nranks) {
  double per_range = 0, relative = 0;
  if (!unit_errors(codec, &per_range, &relative)) return std::numeric_limits<double>::infinity();
  // ring_compressed re-encodes the partial sum of h+1 inputs at hops h = 0..n-1 (range <= 2S and
  // magnitude <= S each, S as above: reached when the first rank of a chain holds all of it).
  const double n = std::max(nranks, 1);
  return with_float_slack(per_range * 2 * n + relative * n, nranks);
}

CpuCosts AutoCodec::measure() const {
  std::lock_guard<std::mutex> lock(g_measured_mu);
  // What this process has not measured yet (a process may make many communicators): the host
  // executor's steps, as qccl_sim calibrate times them, and each new candidate's three kernels.
  bool measured = g_measured.reduce != 0;
  for (const kernels::CodecConfig& codec : candidates_) measured &= g_measured_codecs.count(codec.canonical()) != 0;
  std::vector<Probe> probes;
  const std::vector<float> x = measured ? std::vector<float>() : probe_input();
  const double n = static_cast<double>(x.size());
  std::vector<float> y(x.size(), 0.0f);
  if (g_measured.reduce == 0) {
    probes.push_back({&g_measured.reduce, n, [&] {
      kernels::reduce(kernels::DataType::kFloat32, kernels::RedOp::kSum, x.data(), y.data(), y.data(), x.size());
    }});
    probes.push_back({&g_measured.copy, n * 4, [&] { std::memcpy(y.data(), x.data(), x.size() * 4); }});
    probes.push_back({&g_measured.load, n, [&] { kernels::load_float(kernels::DataType::kFloat32, x.data(), y.data(), x.size()); }});
    probes.push_back({&g_measured.add, n, [&] { kernels::add_float(x.data(), y.data(), x.size()); }});
  }
  std::map<std::string, CpuCosts::Codec> fresh;
  std::vector<std::vector<uint8_t>> encoded;  // one buffer per fresh codec
  encoded.reserve(candidates_.size());
  for (const kernels::CodecConfig& codec : candidates_) {
    const std::string key = codec.canonical();
    if (g_measured_codecs.count(key) || fresh.count(key)) continue;
    CpuCosts::Codec& c = fresh[key];  // std::map: the address holds while others are added
    encoded.emplace_back(codec.encoded_bytes(x.size()));
    uint8_t* bytes = encoded.back().data();
    probes.push_back({&c.encode, n, [&, bytes] { kernels::encode(codec, x.data(), x.size(), bytes, kernels::PhiloxKey{}, 0); }});
    probes.push_back({&c.decode, n, [&, bytes] { kernels::decode(codec, bytes, x.size(), y.data()); }});
    probes.push_back({&c.decode_add, n, [&, bytes] { kernels::decode_accumulate(codec, bytes, x.size(), y.data()); }});
  }
  run_probes(probes);
  g_measured_codecs.insert(fresh.begin(), fresh.end());

  CpuCosts costs = g_measured;
  costs.wire = kKernelTcpSecondsPerByte;
  costs.message = kKernelTcpSecondsPerMessage;
  for (const kernels::CodecConfig& codec : candidates_) costs.codecs.push_back(g_measured_codecs.at(codec.canonical()));
  return costs;
}

void AutoCodec::agree(ClusterFacts facts) {
  facts_ = std::move(facts);
  agreed_ = facts_.cpu.codecs.size() == candidates_.size();
  const std::lock_guard<std::mutex> lock(cache_mu_);
  cache_.clear();
}

double AutoCodec::predict(const coll::CollArgs& args, const std::string& algorithm) const {
  const double n = args.nranks;
  // Nodes: the call's map; without one, a node per rank where the link is known, else one node.
  double nodes = facts_.inter_rate > 0 ? n : 1, per_node = n / nodes;
  if (args.nodes) {
    nodes = args.nodes->nodes();
    per_node = 0;
    for (int node = 0; node < args.nodes->nodes(); ++node)
      per_node = std::max(per_node, static_cast<double>(args.nodes->ranks_of(node).size()));
  }
  const CpuCosts& cpu = facts_.cpu;
  const double es = static_cast<double>(args.element_size());
  const double values = static_cast<double>(args.count);
  const double raw = values * es;
  if (!(raw > 0) || args.nranks < 1) return -1;  // nothing to move: no time to weigh (and 0/0 below)
  // Several nodes and no rate between them: nothing to weigh (every algorithm crosses).
  if (nodes > 1 && !(facts_.inter_rate > 0)) return -1;
  const double reduce = cpu.reduce * es / 4;  // per value (other types than float32 by their size)
  CpuCosts::Codec codec;  // the call's codec's costs
  double ratio = 1;       // encoded bytes per raw byte
  if (args.codec) {
    const size_t index = index_of(args.codec);
    if (index >= facts_.cpu.codecs.size()) return -1;  // not one of ours, or not agreed
    codec = cpu.codecs[index];
    ratio = static_cast<double>(args.codec->encoded_bytes(args.count)) / raw;
  }
  const double encoded = raw * ratio;
  // A compressed plan's chunk: chunk_bytes of input, grown until it encodes to min_message_bytes
  // where every message is encoded (collectives/compressed.h, compressed_chunk).
  const double coded_chunk =
      std::max(facts_.chunk_bytes / es,
               static_cast<double>(coll::min_message_bytes(static_cast<size_t>(facts_.chunk_bytes))) / (es * ratio));
  const double latency = nodes > 1 ? facts_.inter_latency : facts_.intra_latency;
  // The kernel's TCP path at one end for `bytes` sent (or received) between nodes in messages of
  // `message` bytes: cpu.wire per byte, cpu.message per message.
  const auto tcp = [&](double bytes, double message) {
    return bytes * cpu.wire + (message > 0 ? bytes / message * cpu.message : 0.0);
  };
  // One chunk's trip over the slowest link it takes, in a step where each rank sends one and
  // receives one: between nodes a message leaves when it is posted, while its sender writes it into
  // the socket, so the receiver, having written its own, waits for the later of that and the bytes'
  // arrival (the link's rate and latency), then reads it (the simulator's order of events). `sharing`
  // ranks of a node send theirs over its link at once. A shaped link's token bucket, empty when the
  // call starts, fills while the link idles (`idle` seconds before this message) and passes what it
  // holds at once. Within a node bytes take their port's time at the node's copy rate. A receiver
  // whose own message of the step stays inside its node (`receiver_writes` false) has no write to
  // finish first.
  const auto within = [&](double bytes) { return bytes / facts_.intra_rate + facts_.intra_latency; };
  const auto trip = [&](double bytes, double sharing, double idle, bool receiver_writes = true) {
    if (nodes == 1) return within(bytes);
    const double socket = tcp(bytes, bytes);
    const double wire = std::max(0.0, sharing * bytes - std::min(facts_.inter_burst, idle * facts_.inter_rate));
    return std::max(receiver_writes ? socket : 0.0, wire / facts_.inter_rate + facts_.inter_latency) + socket;
  };
  // How long a link idles between a rank's messages of `bytes` when it works `work` seconds between
  // them: the message's flight, its read, and the work.
  const auto between = [&](double bytes, double work) { return facts_.inter_latency + tcp(bytes, bytes) + work; };
  // Fragments run `depth` at a time: a chain of steps is paid once per round of them.
  const auto rounds = [&](double fragments) { return std::max(1.0, std::ceil(fragments) / std::max(1, facts_.depth)); };
  // A fragment walked over the call's nodes (FragmentWalk).
  const auto walker = [&] {
    std::vector<int> node_of(static_cast<size_t>(args.nranks));
    for (int r = 0; r < args.nranks; ++r) node_of[r] = args.nodes ? args.nodes->node_of(r) : nodes > 1 ? r : 0;
    return FragmentWalk(facts_, std::move(node_of), static_cast<int>(nodes));
  };

  // Per algorithm, the busiest rank's totals (bytes on each link, CPU seconds) and the chain of one
  // fragment (its steps one after another: a step waits for the one before); `depth` fragments run
  // at once. `fragments` counts them in full chunks (2 1/3: the last one a third of a chunk). The
  // time: below.
  double nic = 0, intra = 0, busy = 0, chain = 0, steps = 0, fragments = 1;
  // Where known, the parts of a fragment's chain before its first message between nodes and after its
  // last: a link that bounds the call works from the first fragment's first crossing to the last one's
  // last (below).
  double before = std::numeric_limits<double>::infinity(), after = 0;
  if (algorithm == "ring" && !args.codec) {
    const double total = 2 * (n - 1) / n * raw;  // each way, every rank
    // With one rank per node every rank sends and receives across nodes; with more, a node's first
    // rank receives across and its last sends across (ranks in node order), the rest stays inside.
    const double crossing = nodes == 1 ? 0 : per_node > 1 ? total : 2 * total;
    nic = nodes > 1 ? total : 0;
    intra = per_node > 1 ? total : 0;
    const double segment = values / n, chunk = std::min(segment, facts_.chunk_bytes / es);
    busy = (n - 1) / n * values * reduce + tcp(crossing, chunk * es);
    fragments = segment / chunk;
    const double bytes = chunk * es;
    // A ring in rank order crosses at the nodes' edges: with several ranks a node, the rank that
    // receives across sends inside.
    const bool writes = per_node <= 1;
    chain = rounds(segment / chunk) *
            (trip(bytes, 1, 0, writes) + (n - 2) * trip(bytes, 1, between(bytes, chunk * reduce), writes) +
             (n - 1) * chunk * reduce + (n - 1) * trip(bytes, 1, between(bytes, 0), writes));
    steps = 2 * (n - 1);
  } else if (algorithm == "recursive_doubling" && !args.codec) {
    // One fragment (a chunk of the buffer, copied to the output first) walked through the plan's
    // pairing (coll::RecursiveDoubling): the fold, log2 p exchanges, the unfold. Which pairs cross
    // depends on how the ranks sit on the nodes (6 ranks on 2 nodes of 3 cross at the fold and the
    // unfold too), so the busiest rank's and node's totals come from the same walk.
    const coll::RecursiveDoubling pairs(args.nranks);
    const double chunk = std::min(values, facts_.chunk_bytes / es), bytes = chunk * es;
    fragments = values / chunk;
    FragmentWalk walk = walker();
    walk.work(bytes * cpu.copy);
    std::vector<FragmentWalk::Message> fold, unfold;
    for (int r = 0; r < args.nranks; ++r)
      if (pairs.folds(r) && !pairs.active(r)) {
        fold.push_back({r, pairs.fold_partner(r), chunk * reduce});
        unfold.push_back({pairs.fold_partner(r), r});
      }
    const auto both_done = FragmentWalk::SendWait::kBeforeWork;  // each exchange adds once both are done
    walk.step(fold, bytes, 0, both_done);
    for (int i = 0; i < pairs.rounds; ++i) {
      std::vector<FragmentWalk::Message> exchange;
      for (int r = 0; r < args.nranks; ++r)
        if (pairs.active(r)) exchange.push_back({r, pairs.partner(r, i), chunk * reduce});
      walk.step(exchange, bytes, 0, both_done);
    }
    walk.step(unfold, bytes, 0, both_done);
    chain = rounds(fragments) * walk.end();
    nic = walk.busiest_link_bytes() * fragments;
    intra = walk.busiest_port_bytes() * fragments;
    busy = walk.busiest_cpu() * fragments;
    steps = pairs.rounds + (fold.empty() ? 0 : 2);
  } else if (algorithm == "sra_compressed" && args.codec) {
    // Each rank's contribution to each owner's segment (E/n) goes once, each owner's encoded sum
    // (E/n) to everyone: per rank E (n-1)/n twice each way, (n - L) of its n - 1 peers on other
    // nodes. The owner adds n - 1 contributions to its segment; every rank decodes every segment.
    const double out_of_node = 2 * (n - per_node) / n * encoded;
    nic = per_node * out_of_node;  // the node's ranks share its link
    intra = 2 * (per_node - 1) / n * encoded;
    const double segment = values / n, chunk = std::min(segment, coded_chunk);
    busy = values / n * cpu.load + values * codec.encode + (n - 1) / n * values * codec.decode_add +
           values * codec.decode + 2 * tcp(out_of_node, chunk * es * ratio);
    // A fragment: n - 1 pairwise steps (encode a chunk, send it to the rank k ahead), the sum (its
    // input loaded, n - 1 chunks added, one encoded), n - 1 more (send it, decode the one received),
    // its own decoded.
    const double bytes = chunk * es * ratio;
    const double sum = chunk * (cpu.load + (n - 1) * codec.decode_add + codec.encode + codec.decode);
    fragments = segment / chunk;
    before = chunk * codec.encode, after = chunk * codec.decode;
    if (args.nranks <= kWalkedRanks) {
      // Which ranks cross at step k depends on the layout; walked, the longest chain of waits.
      FragmentWalk walk = walker();
      const auto pairwise = [&](int k, double receiver_work) {
        std::vector<FragmentWalk::Message> messages;
        for (int r = 0; r < args.nranks; ++r) messages.push_back({r, (r + k) % args.nranks, receiver_work});
        return messages;
      };
      for (int k = 1; k < args.nranks; ++k)
        walk.step(pairwise(k, 0), bytes, chunk * codec.encode, FragmentWalk::SendWait::kTwoStepsLater);
      walk.wait_for_sends();
      walk.work(sum);
      for (int k = 1; k < args.nranks; ++k)
        walk.step(pairwise(k, chunk * codec.decode), bytes, 0, FragmentWalk::SendWait::kAfterWork);
      chain = rounds(fragments) * walk.end();
    } else {
      // With several nodes some rank crosses to another at every step, min(k, n - k, L) of a node's
      // ranks at once, and the others wait for it at the next.
      double scatter = 0, gather = 0;
      for (double k = 1; k < n; ++k) {
        const double sharing = std::min({k, n - k, per_node});
        scatter += trip(bytes, sharing, k == 1 ? chunk * codec.encode : between(bytes, chunk * codec.encode));
        gather += trip(bytes, sharing, between(bytes, chunk * codec.decode));
      }
      chain = rounds(fragments) *
              ((n - 1) * chunk * codec.encode + scatter + sum + gather + (n - 1) * chunk * codec.decode);
    }
    steps = 2 * (n - 1);
  } else if (algorithm == "hierarchical_compressed" && args.codec) {
    // The leader of the largest node: its members' buffers in (raw), their sum's SRA among the N
    // leaders, the owners' bytes out to its members (encoded), every segment decoded.
    const double members = per_node - 1, leaders = nodes;
    const double across = 2 * (leaders - 1) / leaders * encoded;
    nic = across;
    intra = members * raw;
    // The members' raw inputs keep the chunk of input (compressed_chunk's raw_messages).
    const double segment = values / leaders, chunk = std::min(segment, facts_.chunk_bytes / es);
    busy = values * (cpu.load + members * (cpu.load + cpu.add)) + values * codec.encode +
           (leaders - 1) / leaders * values * codec.decode_add + values * codec.decode +
           2 * tcp(across, chunk * es * ratio);
    // A fragment: chunk f of each of the N segments, from every member, summed, then SRA's steps
    // among the leaders on it, and its encoded bytes to the members.
    const double inside = members * leaders * chunk * es / facts_.intra_rate;
    const double bytes = chunk * es * ratio;  // between leaders (nodes > 1 here)
    fragments = segment / chunk;
    // The first message of each half finds the link idle since the work before it.
    before = inside + leaders * chunk * (cpu.load + members * (cpu.load + cpu.add)) + chunk * codec.encode;
    after = chunk * codec.decode + inside * ratio;
    const double sum = (leaders - 1) * chunk * codec.decode_add + chunk * codec.encode;
    const double more = std::max(0.0, leaders - 2);  // hops after each half's first (N >= 2 here)
    chain = rounds(segment / chunk) *
            (before + trip(bytes, 1, before) +
             more * (chunk * codec.encode + trip(bytes, 1, between(bytes, chunk * codec.encode))) + sum +
             trip(bytes, 1, between(bytes, sum)) + more * trip(bytes, 1, between(bytes, chunk * codec.decode)) +
             (leaders - 1) * chunk * codec.decode + after);
    steps = 2 + 2 * (leaders - 1);
  } else if (algorithm == "ring_compressed" && args.codec) {
    // The partial sum re-encoded at each of n-1 reduce hops, then each owner's bytes passed round.
    const double total = 2 * (n - 1) / n * encoded;  // each way, every rank
    const double crossing = nodes == 1 ? 0 : per_node > 1 ? total : 2 * total;  // as the ring's
    nic = nodes > 1 ? total : 0;
    intra = per_node > 1 ? total : 0;
    const double segment = values / n, chunk = std::min(segment, coded_chunk);
    // Per fragment: this rank's chunk encoded, then n - 1 hops each adding the partial received to
    // its input (loaded) and encoding the sum, then n hops' bytes decoded (its own included).
    busy = values / n * (n * codec.encode + (n - 1) * (cpu.load + codec.decode_add) + n * codec.decode) +
           tcp(crossing, chunk * es * ratio);
    const double bytes = chunk * es * ratio, step = chunk * (cpu.load + codec.decode_add + codec.encode);
    const bool writes = per_node <= 1;  // as the ring's
    fragments = segment / chunk;
    chain = rounds(segment / chunk) *
            (chunk * codec.encode + trip(bytes, 1, chunk * codec.encode, writes) +
             (n - 2) * trip(bytes, 1, between(bytes, step), writes) + (n - 1) * step + chunk * codec.decode +
             (n - 1) * (trip(bytes, 1, between(bytes, chunk * codec.decode), writes) + chunk * codec.decode));
    steps = 2 * (n - 1);
  } else {
    return -1;
  }
  if ((intra > 0 && !(facts_.intra_rate > 0)) || (nic > 0 && !(facts_.inter_rate > 0))) return -1;  // unknown link
  const double nic_seconds = nic > 0 ? nic / facts_.inter_rate : 0.0;
  const double intra_seconds = intra > 0 ? intra / facts_.intra_rate : 0.0;
  // The busiest resource (a link, a port, a CPU) works on the rest of the call, (F - 1)/F of its
  // totals, while the first fragment fills the pipeline, one fragment's chain; the depth bounds the
  // fragments in flight (chain). A chain's hops carry their latencies already (trip): the per-step
  // latencies go on the totals only.
  const double fill = chain / rounds(fragments);
  const double busiest = std::max({nic_seconds, intra_seconds, busy});
  const double totals = busiest + steps * latency;
  double pipelined = totals * (fragments - 1) / fragments + fill;
  // A link that bounds it is busy from the first crossing to the last, the chains' other work done
  // meanwhile (the line above also counts the first chain's work between its crossings); a shaped
  // link's bucket gives back what it gathered while it waited for the first.
  if (nic_seconds == busiest && nic_seconds > 0)
    pipelined = std::min(pipelined, std::max(0.0, before - facts_.inter_burst / facts_.inter_rate) + after + totals);
  // Never below the busiest resource's own time (with one fragment the chain alone would price a
  // link that several ranks share as if each had it).
  // Where the ports within a node bound the call, the fragments in flight take turns on them: a
  // round of them costs one chain and the others' turns (the ring on one host of 4 ranks, 16 fragments
  // two at a time, was 0.70x the simulator's time priced as rounds of chains alone). Not where a link
  // between nodes or the CPU bounds it: there the rounds overlap better and the term over-priced
  // pipelines 15-29% (docs/PERF.md, "Fragments taking turns").
  const double in_flight = std::min<double>(std::max(1, facts_.depth), fragments);
  const double rounds_of_chains =
      intra_seconds == busiest ? rounds(fragments) * (fill + (in_flight - 1) * busiest / fragments) : chain;
  const double seconds = std::max({busiest, pipelined, rounds_of_chains});
  return std::isfinite(seconds) ? seconds : -1;
}

AutoChoice AutoCodec::choose(const coll::CollArgs& args, const AlgorithmPolicy& policy,
                             std::vector<Prediction>* predictions) const {
  if (!agreed_ || args.kind != coll::CollKind::kAllReduce || args.codec) return {};
  if (args.op != kernels::RedOp::kSum && args.op != kernels::RedOp::kAvg) return {};
  if (args.dtype != kernels::DataType::kFloat32 && args.dtype != kernels::DataType::kFloat16 &&
      args.dtype != kernels::DataType::kBfloat16)
    return {};
  if (args.nranks < 2 || (args.nodes && args.nodes->nodes() > 1 && facts_.inter_rate <= 0)) return {};
  const Shape shape{args.count, static_cast<int>(args.dtype), static_cast<int>(args.op), &policy};
  if (!predictions) {
    const std::lock_guard<std::mutex> lock(cache_mu_);
    if (auto it = cache_.find(shape); it != cache_.end()) return it->second;
  }

  // Every option: uncompressed, then the candidates from the most accurate, each by every algorithm
  // that can run it (the policy's alone when QCCL_ALGO forces the all-reduce's); options[i] is all[i]'s.
  std::vector<Prediction> all;
  std::vector<AutoChoice> options;
  std::vector<bool> preferred;  // the policy's own algorithm for that codec
  const auto consider = [&](const kernels::CodecConfig* codec) {
    coll::CollArgs trial = args;
    trial.codec = codec;
    const coll::Algorithm& usual = policy.choose(trial);
    std::vector<const coll::Algorithm*> algorithms;
    if (policy.forces(args.kind)) {
      algorithms.push_back(&usual);
    } else {
      for (const coll::Algorithm& a : coll::algorithms())
        if (a.collective == args.kind && !a.cannot_run(trial)) algorithms.push_back(&a);
    }
    for (const coll::Algorithm* a : algorithms) {
      const bool ring = std::strcmp(a->name, "ring_compressed") == 0;
      if (codec && (ring ? ring_error_bound(*codec, args.nranks) : error_bound(*codec, args.nranks)) +
                           output_rounding(args.dtype) > budget_)
        continue;
      const double seconds = predict(trial, a->name);
      if (seconds < 0) continue;
      all.push_back({codec ? name(codec) : "", a->name, seconds});
      options.push_back({codec, a});
      preferred.push_back(a == &usual);
    }
  };
  consider(nullptr);
  if (options.empty()) return {};  // no uncompressed algorithm the model knows: nothing to weigh
  for (const kernels::CodecConfig& codec : candidates_) {
    // fp16's bound holds in its normal range only (float32 and bfloat16 inputs may fall below it or
    // overflow it); on half inputs it is their own type.
    if (codec.kind == kernels::CodecKind::kFp16 && args.dtype != kernels::DataType::kFloat16) continue;
    consider(&codec);
  }
  double fastest = all.front().seconds;
  for (const Prediction& p : all) fastest = std::min(fastest, p.seconds);
  const double fast = fastest * (1 + kTieShare);
  // The most accurate codec among the fast options; of its fast algorithms the policy's, else the fastest.
  size_t chosen = 0;
  while (all[chosen].seconds > fast) ++chosen;
  for (size_t i = chosen + 1; i < all.size() && options[i].codec == options[chosen].codec; ++i)
    if (all[i].seconds <= fast && !preferred[chosen] && (preferred[i] || all[i].seconds < all[chosen].seconds))
      chosen = i;

  if (log_level() >= LogLevel::kInfo) {  // each distinct call once
    static std::mutex mu;
    static std::set<std::tuple<size_t, int, int>> logged;
    std::lock_guard<std::mutex> lock(mu);
    if (logged.size() < kLoggedShapes &&
        logged.emplace(args.count, static_cast<int>(args.dtype), args.nranks).second) {
      std::string others;
      for (size_t i = 0; i < all.size(); ++i)
        if (i != chosen)
          others += format("%s%s via %s %.3g ms", others.empty() ? "" : ", ",
                           all[i].codec.empty() ? "none" : all[i].codec.c_str(), all[i].algorithm.c_str(),
                           all[i].seconds * 1e3);
      QCCL_INFO("QCCL_CODEC=auto: AllReduce of %zu %s: %s via %s, %.3g ms predicted (%s)", args.count,
                kernels::data_type_name(args.dtype),
                all[chosen].codec.empty() ? "uncompressed" : all[chosen].codec.c_str(), all[chosen].algorithm.c_str(),
                all[chosen].seconds * 1e3, others.c_str());
    }
  }
  if (predictions) *predictions = std::move(all);
  const std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= kCachedShapes) cache_.clear();  // a program of ever-new sizes: start over
  cache_[shape] = options[chosen];
  return options[chosen];
}

size_t AutoCodec::index_of(const kernels::CodecConfig* codec) const {
  for (size_t i = 0; i < candidates_.size(); ++i)
    if (&candidates_[i] == codec) return i;
  return candidates_.size();
}

const char* AutoCodec::name(const kernels::CodecConfig* codec) const {
  if (!codec) return "none";
  const size_t index = index_of(codec);
  return index < names_.size() ? names_[index].c_str() : "?";
}

std::string AutoCodec::describe() const {
  std::string list;
  for (const kernels::CodecConfig& c : candidates_)
    list += format("%s%s (bound %.2g)", list.empty() ? "" : ", ", name(&c), error_bound(c, nranks_));
  std::string links;
  if (agreed_)
    links = format("; links: %s, %.1f GB/s within a node (memory copies)",
                   facts_.inter_rate > 0 ? format("%.0f Mbit/s of payload between nodes", facts_.inter_rate * 8 / 1e6).c_str()
                                         : "none between nodes known",
                   facts_.intra_rate / 1e9);
  return "auto, error budget " + budget_text(budget_) + " of the largest sum: uncompressed" +
         (list.empty() ? "" : ", " + list) + " (nearest rounding, bucket 512)" + links;
}

}  // namespace qccl
