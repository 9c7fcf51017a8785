#include "src/comm.h"

#include <dlfcn.h>
#include <link.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <new>

#include "base/errors.h"
#include "base/log.h"
#include "collectives/compressed.h"
#include "kernels/codec.h"
#include "kernels/fft_sparse.h"
#include "kernels/reduce.h"
#include "kernels/subnormals.h"
#include "src/link_probe.h"
#include "src/message_key.h"
#include "src/node_map.h"
#include "src/validate.h"

namespace qccl {

namespace {

using Clock = std::chrono::steady_clock;

// How long a blocked driver sleeps at most before it looks at timeouts and flags again.
constexpr int kMaxBlockMs = 100;

// When the transport cannot be armed with nothing to do (drive_until), the driver keeps polling for
// kBusyPolling after the last movement (a full FIFO is the steady state of a large transfer whose
// receiver is busy summing: it drains within microseconds), then pauses kFirstBusyPause, doubling
// each time nothing moved, up to kLongestBusyPause.
constexpr auto kBusyPolling = std::chrono::milliseconds(1);
constexpr auto kFirstBusyPause = std::chrono::microseconds(50);
constexpr auto kLongestBusyPause = std::chrono::microseconds(1000);

// How long operations may stay undriven (started in the background, or left when a wait ended)
// before the progress thread takes them over (see Comm::wait).
constexpr long kHandOffNs = 1'000'000;  // 1 ms
// A wait longer than this disarms the hand-off timer (Comm::wait).
constexpr auto kShortWait = std::chrono::microseconds(100);

int make_eventfd() {
  int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) fail(qcclSystemError, "eventfd failed: %s", errno_string(errno).c_str());
  return fd;
}

// The fft codec's encode + decode of one float32 value on this CPU: the default spec on 2^18 smooth
// values, the best of three after a warm-up (some 20 ms), once per process. What the fft all-reduce
// weighs against the link's rate (LinkFacts, allreduce_fft_allgather.cc).
double fft_cost_per_value() {
  static const double cost = [] {
    const kernels::CodecConfig codec = kernels::parse_codec_spec("fft");
    const size_t n = size_t{1} << 18;
    std::vector<float> x(n), y(n);
    for (size_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<float>(i) * 0.001f) + 0.01f * static_cast<float>(i % 7);
    std::vector<uint8_t> encoded(codec.encoded_bytes(n));
    double best = 1e30;
    for (int round = 0; round < 4; ++round) {
      const double begin = thread_cpu_seconds();  // per core, as auto's costs
      kernels::encode(codec, x.data(), n, encoded.data(), kernels::PhiloxKey{}, 0);
      kernels::decode(codec, encoded.data(), n, y.data());
      const double seconds = thread_cpu_seconds() - begin;
      if (round > 0) best = std::min(best, seconds);
    }
    return best / static_cast<double>(n);
  }();
  return cost;
}

void drain(int fd) {
  uint64_t value;
  while (read(fd, &value, sizeof(value)) > 0) {
  }
}

}  // namespace

// ---- Creation ------------------------------------------------------------------------------------

Comm::Comm(int rank, int nranks, const Config& config)
    : rank_(rank), nranks_(nranks), config_(config), policy_(config.algorithms, config.algorithms_from),
      codec_policy_(AutoCodec::is_auto(config.codec) ? "" : config.codec, config.codec_min_bytes, config.codec_from,
                    config.aggregator_count()),
      auto_codec_(AutoCodec::is_auto(config.codec)
                      ? std::make_unique<AutoCodec>(config.codec, nranks, config.codec_from)
                      : nullptr),
      state_budget_(std::make_shared<StateBudget>(config.codec_state_budget)),
      send_sequence_(nranks, 0), recv_sequence_(nranks, 0), p2p_running_(2 * static_cast<size_t>(nranks)) {
  try {
    progress_wake_fd_ = make_eventfd();
    driver_wake_fd_ = make_eventfd();
    hand_off_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (hand_off_fd_ < 0) fail(qcclSystemError, "timerfd_create failed: %s", errno_string(errno).c_str());
  } catch (const Error&) {  // out of descriptors: the destructor does not run for a constructor that threw
    for (int fd : {progress_wake_fd_, driver_wake_fd_})
      if (fd >= 0) close(fd);
    throw;
  }
}

void Comm::check_settings(const Config& config, int nranks) {
  AlgorithmPolicy(config.algorithms, config.algorithms_from);
  if (AutoCodec::is_auto(config.codec)) AutoCodec(config.codec, nranks, config.codec_from);
  else CodecPolicy(config.codec, config.codec_min_bytes, config.codec_from, config.aggregator_count());
}

std::shared_ptr<Comm> Comm::create(const BootstrapId& id, int nranks, int rank, const Config& config) {
  std::shared_ptr<Comm> comm(new Comm(rank, nranks, config));
  try {
    comm->join(id);
  } catch (const Error& e) {
    // Once the control plane is up (the transport's connection, the aggregators, the barrier, ...),
    // the others would read this rank's closed connection as a crash ("the process died ..."): it
    // tells them why it leaves instead.
    if (comm->control_) comm->control_->report_failure(Failure{e.code(), e.message(), 0}, /*departing=*/true);
    throw;
  }
  return comm;
}

void Comm::join(const BootstrapId& id) {
  const auto deadline = net::Deadline::after(config_.timeout_seconds);
  log_set_rank(rank_);
  if (!config_.node_map.empty()) parse_node_map(config_.node_map, nranks_);  // refused before any exchange
  topology_ = detect_local_topology();
  transport_ = std::make_unique<transport::UcxTransport>(rank_, nranks_);

  net::Socket control_listener;
  PeerInfo me;
  if (rank_ == 0) {
    control_listener = net::Socket::listen(net::local_address(config_.socket_ifname));
    me.control_address = control_listener.local_address().to_string();
  }
  me.hostname = topology_.hostname;
  me.boot_id = topology_.boot_id;
  me.pid = static_cast<int32_t>(getpid());
  me.topology = topology_.summary();
  me.transport_address = transport_->address();
  me.transport_version = transport::UcxTransport::library_version();
  // The links between nodes are measured after the transport is up (QCCL_LINK_RATE=probe, or auto's
  // model without a rate), when there are several nodes: every rank decides alike, from what all
  // agree on.
  const bool probe = config_.probe_link_rate || (auto_codec_ && config_.link_rate_bits == 0);
  if (config_.link_rate_bits || probe) me.fft_seconds_per_value = fft_cost_per_value();
  me.chunk_bytes = config_.chunk_bytes;
  me.link_rate_bits = config_.probe_link_rate ? kProbedLinkRate : config_.link_rate_bits;
  me.chunk_explicit = config_.chunk_explicit ? 1 : 0;
  me.node_map = config_.node_map;
  me.algorithms = policy_.forced();
  me.aggregators = config_.aggregators;
  if (auto_codec_) me.codec_policy = config_.codec;  // (a fixed codec's mismatch fails by its hash)
  me.pipeline_depth = config_.pipeline_depth;
  if (auto_codec_) me.codec_costs = auto_codec_->measure().flatten();  // stretched in agree_auto_codec
  me.cpus = topology_.bound_pus;
  me.oversubscribed = config_.oversubscribed;
  me.parent_host_ranks = config_.parent_host_ranks;

  auto blobs = exchange_through_root(id, rank_, nranks_, me.serialize(), deadline);
  for (int r = 0; r < nranks_; ++r) {
    peers_.push_back(PeerInfo::parse(blobs[r], r));
    names_.push_back(format("rank %d (%s:%d)", r, peers_[r].hostname.c_str(), peers_[r].pid));
  }
  // Before any worker address is unpacked (transport_->connect): UCX reads the addresses of its other
  // releases (its wire protocol is versioned), but another major version's would reach its assertions,
  // which abort every rank; an empty one would leave a peer without an endpoint.
  auto major = [](const std::string& version) { return version.substr(0, version.find('.')); };
  for (int r = 0; r < nranks_; ++r) {
    if (peers_[r].transport_version == peers_[0].transport_version) continue;
    if (major(peers_[r].transport_version) != major(peers_[0].transport_version))
      fail(qcclSystemError, "%s runs UCX %s, %s UCX %s: the ranks must run one major version of UCX (a worker "
           "address is read by the releases of the version that wrote it)", names_[r].c_str(),
           peers_[r].transport_version.c_str(), names_[0].c_str(), peers_[0].transport_version.c_str());
    if (rank_ == 0)
      QCCL_WARN("%s runs UCX %s, %s UCX %s: mixed releases rely on UCX's wire compatibility", names_[r].c_str(),
                peers_[r].transport_version.c_str(), names_[0].c_str(), peers_[0].transport_version.c_str());
  }
  for (int r = 0; r < nranks_; ++r)
    if (peers_[r].transport_address.empty())
      fail(qcclRemoteError, "%s sent an empty UCX worker address", names_[r].c_str());
  int local = 0;
  for (const PeerInfo& p : peers_) local += p.same_host(me) ? 1 : 0;
  node_map_ = compute_node_map(peers_, config_.node_map);
  auto rate_text = [](uint64_t bits) {
    if (bits == kProbedLinkRate) return std::string("probe");
    return bits ? std::to_string(bits) + " bit/s" : std::string("unset");
  };
  // Settings that decide the messages, the chunk a probed rate sets, and which ranks probe: every
  // rank finds the same first difference, and fails alike.
  for (int r = 0; r < nranks_; ++r)
    if (peers_[r].node_map != peers_[0].node_map)
      fail(qcclInvalidArgument, "%s has QCCL_NODE_MAP = '%s', %s '%s': every rank must set the same", names_[r].c_str(),
           peers_[r].node_map.c_str(), names_[0].c_str(), peers_[0].node_map.c_str());
  for (int r = 0; r < nranks_; ++r)
    if (peers_[r].algorithms != peers_[0].algorithms)
      fail(qcclInvalidArgument, "%s forces %s (%s), %s %s: every rank must force the same algorithms",
           names_[r].c_str(), peers_[r].algorithms.empty() ? "no algorithm" : peers_[r].algorithms.c_str(),
           config_.algorithms_from.c_str(), names_[0].c_str(),
           peers_[0].algorithms.empty() ? "none" : peers_[0].algorithms.c_str());
  // Ranks that list other aggregators would register with different ones and wait for each other
  // until QCCL_TIMEOUT (or sum through different ones, the shards in another order).
  for (int r = 0; r < nranks_; ++r)
    if (peers_[r].aggregators != peers_[0].aggregators)
      fail(qcclInvalidArgument, "%s has QCCL_AGGREGATORS = '%s', %s '%s': every rank must set the same",
           names_[r].c_str(), peers_[r].aggregators.c_str(), names_[0].c_str(), peers_[0].aggregators.c_str());
  for (int r = 0; r < nranks_; ++r)
    if (peers_[r].chunk_explicit != peers_[0].chunk_explicit)
      fail(qcclInvalidArgument, "%s %s the chunk (QCCL_CHUNK_BYTES or chunkBytes) and %s %s: every rank must set it, or none",
           names_[r].c_str(), peers_[r].chunk_explicit ? "sets" : "does not set", names_[0].c_str(),
           peers_[0].chunk_explicit ? "does" : "does not");
  for (int r = 0; r < nranks_; ++r)
    if (peers_[r].chunk_bytes != peers_[0].chunk_bytes || peers_[r].link_rate_bits != peers_[0].link_rate_bits)
      fail(qcclInvalidArgument, "%s takes a chunk of %llu bytes and QCCL_LINK_RATE = %s, %s %llu and %s: "
           "every rank must take the same (QCCL_CHUNK_BYTES or chunkBytes, QCCL_LINK_RATE)",
           names_[r].c_str(), static_cast<unsigned long long>(peers_[r].chunk_bytes),
           rate_text(peers_[r].link_rate_bits).c_str(), names_[0].c_str(),
           static_cast<unsigned long long>(peers_[0].chunk_bytes), rate_text(peers_[0].link_rate_bits).c_str());
  set_link_facts();
  // auto's choice must be every rank's (a fixed codec's mismatch fails at the first call, by its hash)
  for (int r = 0; r < nranks_; ++r)
    if (peers_[r].codec_policy != peers_[0].codec_policy &&
        (AutoCodec::is_auto(peers_[r].codec_policy) || AutoCodec::is_auto(peers_[0].codec_policy)))
      fail(qcclInvalidArgument, "%s has QCCL_CODEC = %s, %s %s: with auto, every rank must set the same",
           names_[r].c_str(), peers_[r].codec_policy.empty() ? "a fixed codec or none" : peers_[r].codec_policy.c_str(),
           names_[0].c_str(), peers_[0].codec_policy.empty() ? "a fixed codec or none" : peers_[0].codec_policy.c_str());
  // QCCL_OVERSUBSCRIBED overrides the count: emulated hosts (qcclrun --nodes) share the CPUs.
  host_ranks_ = std::max(config_.oversubscribed == 1 ? nranks_ : local, config_.parent_host_ranks);
  oversubscribed_ = config_.oversubscribed >= 0 ? config_.oversubscribed == 1 : host_ranks_ > topology_.bound_pus;

  control_ = std::make_unique<ControlPlane>(
      rank_, nranks_, id.magic, names_,
      [this](const Failure& failure) { break_comm(failure, false); });
  if (rank_ == 0) control_->accept_peers(control_listener, deadline);
  else control_->connect_to_hub(net::Address::parse(peers_[0].control_address, "rank 0's control address"), deadline);

  std::vector<std::vector<uint8_t>> addresses;
  for (const PeerInfo& p : peers_) addresses.push_back(p.transport_address);
  transport_->connect(addresses);
  if (!config_.aggregators.empty()) {
    // IntSGD's aggregators: transport peers nranks .. nranks + K - 1. A rank sends them at most a
    // chunk of int32 (chunk_bytes of float32 input) behind its 8-byte header.
    AggregatorHello hello;
    // The job: the bootstrap magic, which communicators made from the environment share, mixed with
    // rank 0's control-plane address, which is this communicator's own.
    hello.job = id.magic;
    for (unsigned char c : peers_[0].control_address) hello.job = (hello.job ^ c) * 1099511628211ull;
    hello.rank = rank_;
    hello.nranks = nranks_;
    hello.max_message = config_.chunk_bytes + 64;
    hello.address = transport_->address();
    aggregator_links_ = register_with_aggregators(config_.aggregators, hello, deadline);
    for (size_t k = 0; k < aggregator_links_.size(); ++k) {
      transport_->connect_peer(nranks_ + static_cast<int>(k), aggregator_links_[k].address);
      names_.push_back(aggregator_links_[k].name);
    }
  }
  executor_ = std::make_unique<HostExecutor>(*transport_, HostExecutorOptions{config_.pipeline_depth, false}, &names_);
  progress_thread_ = std::thread([this] { progress_thread_main(); });
  control_->barrier(deadline);
  std::string probed;  // what the probe measured, for the log
  if (probe && node_map_.nodes() > 1) {
    const LinkProbe measured = probe_link_rate(*this);
    probed = measured.description;
    // A communicator split from this one inherits the measured rate instead of probing again.
    config_.link_rate_bits = measured.bits_per_s;
    config_.probe_link_rate = false;
    // The aggregators were told the chunk when this rank registered (their message size): it stays.
    if (!config_.chunk_explicit && aggregator_links_.empty())
      config_.chunk_bytes = chunk_for_link_rate(measured.bits_per_s);
    set_link_facts();
  }
  if (auto_codec_) agree_auto_codec();

  QCCL_INFO("communicator of %d ranks (%d on this host, %d CPUs: %s%s), root %s", nranks_, local, topology_.bound_pus,
            oversubscribed_ ? "oversubscribed, spinning yields" : "spinning",
            config_.oversubscribed >= 0 || config_.parent_host_ranks > local ? " as set or inherited" : "",
            id.root.to_string().c_str());
  QCCL_INFO("topology %s", topology_.summary().c_str());
  QCCL_INFO("node map (%s): %s", config_.node_map.empty() ? "by host" : "QCCL_NODE_MAP", node_map_.describe().c_str());
  if (log_level() >= LogLevel::kInfo) QCCL_INFO("links: %s", describe_links().c_str());
  QCCL_INFO("%s; reduction kernels %s; chunk %zu bytes, timeout %g s", executor_->describe().c_str(),
            kernels::reduce_target_name(), config_.chunk_bytes, config_.timeout_seconds);
  QCCL_INFO("algorithms %s", policy_.describe().c_str());
  if (!probed.empty())
    QCCL_INFO("link probe between %d nodes: %s: %llu bit/s", node_map_.nodes(), probed.c_str(),
              static_cast<unsigned long long>(config_.link_rate_bits));
  if (link_facts_.rate > 0)
    QCCL_INFO("link %.0f Mbit/s (%s): chunk %zu bytes; the fft codec costs %.1f ns a value here (the "
              "slowest rank), so it can pay only below %.0f Mbit/s, however much it compresses",
              link_facts_.rate * 8 / 1e6, probed.empty() ? "QCCL_LINK_RATE" : "measured", config_.chunk_bytes,
              link_facts_.fft_seconds_per_value * 1e9, 4 / link_facts_.fft_seconds_per_value * 8 / 1e6);
  else if (probe && node_map_.nodes() == 1)
    QCCL_INFO("link probe: not needed, the ranks share one node");
  QCCL_INFO("compression of plain all-reduce calls (QCCL_CODEC): %s",
            auto_codec_ ? auto_codec_->describe().c_str() : codec_policy_.describe().c_str());
  if (!aggregator_links_.empty()) QCCL_INFO("IntSGD aggregators (QCCL_AGGREGATORS): %s", config_.aggregators.c_str());
}

// The fft codec's facts (LinkFacts) for config_.link_rate_bits, the same on every rank: the rate, and
// the slowest rank's cost of a value.
void Comm::set_link_facts() {
  if (!config_.link_rate_bits) return;
  link_facts_.rate = static_cast<double>(config_.link_rate_bits) / 8;
  for (const PeerInfo& p : peers_)
    link_facts_.fft_seconds_per_value = std::max(link_facts_.fft_seconds_per_value, p.fft_seconds_per_value);
}

// QCCL_CODEC=auto's facts, from what every rank sent at bootstrap, so that every rank chooses alike:
// the links (QCCL_LINK_RATE or the probe's rate between nodes, memory copies within one) and the
// slowest host's CPU costs, stretched by its ranks per CPU (all ranks, when QCCL_OVERSUBSCRIBED says the hosts share one
// machine's CPUs; a split child's parent's ranks there, when more: ranks_sharing_cpus). The ranks of a
// host measured at the same time, on the same cores: the least contended measurement of each cost (the
// smallest) is the host's, before the stretch.
void Comm::agree_auto_codec() {
  const size_t count = CpuCosts::kFixed + 3 * auto_codec_->candidates().size();
  for (int r = 0; r < nranks_; ++r)
    if (peers_[r].codec_costs.size() != count)
      fail(qcclRemoteError, "%s sent %zu codec costs for QCCL_CODEC=auto, not %zu", names_[r].c_str(),
           peers_[r].codec_costs.size(), count);
  std::vector<double> slowest(count, 0.0);
  double most_stretched = 1;
  for (int r = 0; r < nranks_; ++r) {
    const PeerInfo& p = peers_[r];
    std::vector<double> host = p.codec_costs;
    for (const PeerInfo& q : peers_)
      if (q.same_host(p) || p.oversubscribed == 1)
        for (size_t i = 0; i < count; ++i) host[i] = std::min(host[i], q.codec_costs[i]);
    const int sharing = ranks_sharing_cpus(peers_, static_cast<size_t>(r));
    const double stretch = std::max(1.0, static_cast<double>(sharing) / std::max(p.cpus, 1));
    most_stretched = std::max(most_stretched, stretch);
    for (size_t i = 0; i < count; ++i) slowest[i] = std::max(slowest[i], host[i] * stretch);
  }
  QCCL_INFO("QCCL_CODEC=auto: CPU costs stretched by up to %gx (the ranks sharing a host's CPUs, per CPU)",
            most_stretched);
  ClusterFacts facts;
  CpuCosts::unflatten(slowest, auto_codec_->candidates().size(), &facts.cpu);
  // Ethernet carries 1448 payload bytes per 1538 (MTU 1500); a message's latency is a switch and the
  // kernel's TCP path (25 us, sim/model.cc's presets) or shared memory's (1 us), plus UCX's post (2 us).
  facts.inter_rate = static_cast<double>(config_.link_rate_bits) / 8 * (1448.0 / 1538);
  facts.inter_latency = 27e-6;
  facts.intra_rate = facts.cpu.copy > 0 ? 1 / facts.cpu.copy : 0;
  facts.intra_latency = 3e-6;
  facts.chunk_bytes = static_cast<double>(config_.chunk_bytes);
  facts.depth = peers_[0].pipeline_depth;  // the same on every rank, whatever each was told
  auto_codec_->agree(std::move(facts));
}

Comm::~Comm() {
  if (!shut_down_) shutdown();
  close(progress_wake_fd_);
  close(driver_wake_fd_);
  close(hand_off_fd_);
}

// The transports to the other ranks, grouped by link class (a rank of the same node or of another
// node) and transport, each group with its ranks as ranges: "same node, rank 1: cma/memory,
// sysv/memory; other nodes, ranks 2-3: tcp/veth0".
std::string Comm::describe_links() const {
  std::map<std::pair<bool, std::string>, std::vector<int>> groups;
  for (int peer = 0; peer < nranks_; ++peer)
    if (peer != rank_)
      groups[{!node_map_.same_node(rank_, peer), transport_->peer_transports(peer)}].push_back(peer);
  std::string out;
  for (const auto& [key, ranks] : groups) {
    std::string list;
    for (size_t i = 0; i < ranks.size();) {
      size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
      list += (list.empty() ? "" : ",") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
      i = j + 1;
    }
    out += format("%s%s, rank%s %s: %s", out.empty() ? "" : "; ", key.first ? "other nodes" : "same node",
                  ranks.size() == 1 ? "" : "s", list.c_str(),
                  key.second.empty() ? "none" : key.second.c_str());
  }
  return out.empty() ? "none (one rank)" : out;
}

// ---- Starting and finishing operations -----------------------------------------------------------

// What the frame headers carry to check that every rank runs the same codec: its hash on the FFT
// library that runs it (the device's, for an fft call on device buffers that the device runs), with
// the segment list (CollArgs::segments) folded in, so that ranks whose lists differ fail as ranks
// whose codecs differ do (0 for an uncompressed call).
static uint64_t codec_hash(const coll::CollArgs& args, const char* fft_library) {
  if (!args.codec) return 0;
  uint64_t h = args.codec->hash(fft_library);
  if (args.segments)
    for (const coll::Segment& s : *args.segments) {
      h = (h ^ s.count) * 1099511628211ull;
      h = (h ^ (s.exact ? 1u : 0u)) * 1099511628211ull;
    }
  return h ? h : 1;
}

namespace {
const char* device_codec_refusal(const kernels::CodecConfig& c, const Device& device);  // below, with the device path
}  // namespace

void Comm::start(const std::shared_ptr<OpRecord>& record, bool background) {
  std::shared_lock<std::shared_mutex> executors(executors_mu_);
  record->started.store(true);
  record->started_at = Clock::now();
  if (broken_) {
    std::lock_guard<std::mutex> lock(ops_mu_);
    throw Error(failures_.first().code, failures_.first().message);
  }
  if (shut_down_) {
    // An abort from another thread may come between the look at broken_ above and this one (the
    // call holds the communicator through it, src/api.cc): the call fails as one the abort caught.
    if (aborting_.load()) throw Error(qcclAborted, abort_message());
    fail(qcclInvalidUsage, "the communicator was destroyed before the call started");
  }
  coll::CollArgs& args = record->args;
  if (args.count == 0) {
    // Nothing to move, so nothing is sent (NCCL's zero count), but a collective keeps its place in
    // the call order, which every rank makes: where one rank passed 0 and another a count, their
    // calls no longer meet (the others' call used to take this rank's next call's data). A point-
    // to-point call of nothing needs no partner, as in NCCL. A collective's also completes in call
    // order (qccl.h): with the newest collective still running, which it follows without traffic of
    // its own (finish), else at once.
    if (args.kind != coll::CollKind::kSend && args.kind != coll::CollKind::kRecv) {
      std::lock_guard<std::mutex> lock(ops_mu_);
      const uint64_t sequence = next_sequence_++;
      collectives_issued_ = next_sequence_;
      for (auto it = active_.rbegin(); it != active_.rend(); ++it)
        if (!(*it)->operation->identity().p2p) {
          (*it)->followers.emplace_back(record, sequence);
          return;
        }
    }
    finish(*record, qcclSuccess, "");
    return;
  }
  args.nodes = &node_map_;
  args.link = link_facts_.rate > 0 ? &link_facts_ : nullptr;
  // QCCL_CODEC compresses plain calls; auto by its model of host costs, so not on device buffers, and
  // auto also picks the algorithm.
  const coll::Algorithm* auto_algorithm = nullptr;
  if (!args.codec && auto_codec_ && !record->on_device) {
    const AutoChoice choice = auto_codec_->choose(args, policy_);
    args.codec = choice.codec;
    auto_algorithm = choice.algorithm;
  } else if (!args.codec) {
    args.codec = codec_policy_.choose(args);
  }
  if (record->on_device && args.codec && !record->codec && device_codec_refusal(*args.codec, *device_))
    args.codec = nullptr;  // a QCCL_CODEC method the device path does not run: exact (on every rank alike)

  OperationIdentity identity;
  identity.p2p = args.kind == coll::CollKind::kSend || args.kind == coll::CollKind::kRecv;
  // Point-to-point calls, keyed delta calls among them, are numbered per peer and direction
  // (src/message_key.h).
  identity.keyed = args.delta != nullptr;
  if (!identity.p2p) {
    identity.sequence = next_sequence_++;
  } else if (args.kind == coll::CollKind::kSend) {
    identity.sequence = send_sequence_[args.peer]++;
  } else {
    identity.sequence = recv_sequence_[args.peer]++;
  }
  uint64_t codec_step = 0;  // ranks whose states are at different steps fail (frame.h)
  if (args.codec) {
    // Stochastic rounding is keyed by the state's step when the caller keeps one (so that a rerun of
    // a training step from a checkpoint draws the same numbers), else by the sequence number.
    if (record->state) codec_step = record->state->take_step();
    const uint64_t step = record->state ? codec_step : identity.sequence;
    const uint64_t salt = record->state ? record->state->rounding_salt() : 0;
    args.rng = kernels::PhiloxKey{args.codec->seed ^ salt, step, static_cast<uint32_t>(rank_), 0};
    args.aggregators = aggregators();
    // The codec's method binds the call to the state it keeps (made, and charged, at submission).
    const coll::Method* method = coll::method_for(*args.codec);
    if (!method) fail(qcclInternalError, "codec '%s' has no method", args.codec->canonical().c_str());
    coll::MethodState* method_state = record->state ? record->state->bind(*method, *args.codec) : nullptr;
    const coll::StateView view = record->state ? record->state->view() : coll::StateView{};
    record->call = method->begin(args, method_state, record->state ? &view : nullptr);
    args.method_call = record->call.get();
  }
  const coll::Algorithm& algorithm = auto_algorithm ? *auto_algorithm : policy_.choose(args);
  coll::PlanOptions options;
  options.chunk_bytes = config_.chunk_bytes;
  std::unique_ptr<coll::Plan> plan = algorithm.make(args, options);
  // An agg=switch call is refused once an aggregator is lost; one that passed this check is counted
  // until it joins active_, where the driver's scan for such calls finds it (the count tells the
  // driver when it may stop scanning).
  struct Entering {
    Comm* comm;
    ~Entering() {
      if (!comm) return;
      std::lock_guard<std::mutex> lock(comm->ops_mu_);
      --comm->aggregator_calls_entering_;
    }
  } entering{nullptr};
  if (plan->uses_aggregators()) {
    std::lock_guard<std::mutex> lock(ops_mu_);
    if (!aggregator_lost_.empty()) throw Error(qcclRemoteError, aggregator_lost_);
    ++aggregator_calls_entering_;
    entering.comm = this;
  }
  const bool device_fft = record->on_device && args.codec && args.codec->kind == kernels::CodecKind::kFft;
  const char* fft_library = device_fft ? device_->fft_library() : kernels::fft_backend();
  identity.header = FrameHeader::for_call(args, identity.sequence, codec_hash(args, fft_library), codec_step);
  identity.expected = identity.header;

  Executor& executor = record->on_device ? *device_executor_.load() : *executor_;
  record->scratch_bytes = executor.scratch_bytes(*plan);  // taken when it starts to run (take_scratch)
  QCCL_TRACE("%s via %s%s: %zu fragments, %llu wire bytes", identity.header.describe().c_str(), algorithm.name,
             record->on_device ? " on the device" : "", plan->fragments(),
             static_cast<unsigned long long>(plan->wire_bytes_sent()));
  record->operation = executor.launch(algorithm, std::move(plan), identity, nullptr);
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    record->submitted = submitted_++;
    if (!identity.p2p) collectives_issued_ = identity.sequence + 1;
    else p2p_running_[p2p_direction(args)].insert(identity.sequence);
    active_.push_back(record);
    if (entering.comm) --aggregator_calls_entering_, entering.comm = nullptr;
    if (identity.p2p) active_p2p_.fetch_add(1);
    active_count_.fetch_add(1);
    active_version_.fetch_add(1);
  }
  // The progress thread takes it over in a moment (see wait()): a caller that issues calls back to
  // back and then waits drives them itself, with no thread beside it; one that goes away to compute
  // leaves them undriven for kHandOffNs at most.
  if (background && !hand_off_armed_.exchange(true)) arm_hand_off(true);
}

namespace {
// How many shared objects the process has loaded so far (glibc's counter): 26 ns to read, where a
// dlopen that finds nothing costs 26 us (it searches the library path), once per call that was.
unsigned long long objects_loaded() {
  unsigned long long adds = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* out) {
        if (size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds)
          *static_cast<unsigned long long*>(out) = info->dlpi_adds;
        return 1;  // the counter is the process's: the first object is enough
      },
      &adds);
  return adds;
}

}  // namespace

// The CUDA device p's memory belongs to (-1: host memory), asked of the CUDA driver the process has
// loaded, if any: a process that never loaded CUDA has no device memory, and asking the driver makes
// no context, so that host calls in a CUDA process cost a lookup and nothing more. Builds without
// CUDA ask too, to refuse device buffers rather than read them. The driver's types are spelt out here
// (cuda.h: CUresult cuPointerGetAttributes(unsigned, CUpointer_attribute*, void**, CUdeviceptr)), as
// a host-only build has no cuda.h. The plural query answers pageable host memory, which the driver
// does not know, with a zero type, where the singular one fails (an API error compute-sanitizer
// reports at every call).
int device_of(const void* p) {
  if (!p) return -1;
  using GetAttributes = int (*)(unsigned count, int* attributes, void** data, unsigned long long pointer);
  constexpr int kMemoryType = 2;                        // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
  constexpr int kOrdinal = 9;                           // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
  constexpr unsigned kDevice = 2, kArray = 3;           // CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_ARRAY
  static std::atomic<GetAttributes> get{nullptr};       // found once CUDA is in the process
  static std::atomic<unsigned long long> looked_at{~0ull};  // objects loaded when it was last looked for
  GetAttributes fn = get.load(std::memory_order_acquire);
  if (!fn) {
    const unsigned long long loaded = objects_loaded();
    if (looked_at.exchange(loaded) == loaded) return -1;  // nothing loaded since: still no CUDA
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!driver) return -1;
    fn = reinterpret_cast<GetAttributes>(dlsym(driver, "cuPointerGetAttributes"));
    if (!fn) return -1;
    get.store(fn, std::memory_order_release);  // the library stays: the NOLOAD reference is kept
  }
  unsigned type = 0;
  int ordinal = -1;
  int attributes[] = {kMemoryType, kOrdinal};
  void* data[] = {&type, &ordinal};
  if (fn(2, attributes, data, reinterpret_cast<uintptr_t>(p)) != 0 || (type != kDevice && type != kArray)) return -1;
  return ordinal;
}

namespace {

const char* device_codec_refusal(const kernels::CodecConfig& c, const Device& device) {
  using kernels::CodecKind;
  if (c.kind == CodecKind::kFft && device.runs_fft()) return nullptr;
  if (c.kind == CodecKind::kNone || c.kind == CodecKind::kFp16 || c.kind == CodecKind::kBf16) return nullptr;
  if (c.kind == CodecKind::kQuant) return nullptr;
  if (c.kind == CodecKind::kInt || c.kind == CodecKind::kSign || c.kind == CodecKind::kAq) return nullptr;
  return "the device path runs the none, fp16, bf16, q1..q8 (learned levels too), aq2..aq8, Marsit's sign and "
         "IntSGD's int8..int32 codecs so far";
}
}  // namespace

Device* Comm::device(int ordinal, std::string* why) {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (!device_ && no_device_.empty()) {
    device_ = make_cuda_device(ordinal, config_.gpu_fft == "cufft", &no_device_);
    if (device_) QCCL_INFO("device buffers run on %s", device_->describe().c_str());
  }
  if (!device_) *why = no_device_;
  return device_.get();
}

void Comm::start_device_executor() {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (device_executor_owned_) return;
  device_executor_owned_ = std::make_unique<DeviceExecutor>(
      *transport_, device_, nullptr, HostExecutorOptions{config_.pipeline_depth, false}, &names_);
  device_executor_.store(device_executor_owned_.get());
}

// The first collective on device buffers, on every rank at the same point: the ranks tell each other
// which GPU they use and choose the wire together (QCCL_GPU_WIRE), rank 0 offering an NCCL unique id.
// Point-to-point calls, which not every rank makes, take the staged wire and leave the choice to the
// first collective.
void Comm::choose_gpu_wire() {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (gpu_wire_chosen_) return;
  gpu_wire_chosen_ = true;
  struct Announcement {
    char uuid[16] = {};
    char nccl_id[128] = {};  // rank 0's, when NCCL could be loaded there
    int32_t nccl_ok = 0;
    int32_t unused = 0;
  };
  static_assert(sizeof(Announcement::nccl_id) >= 128, "NCCL_UNIQUE_ID_BYTES");
  std::shared_ptr<PeerWire> wire;
  std::string why_host = config_.gpu_wire == "host" ? "QCCL_GPU_WIRE=host" : "one rank";
  if (config_.gpu_wire != "host" && nranks_ > 1) {
    Announcement mine;
    const std::string uuid = device_->uuid();
    std::memcpy(mine.uuid, uuid.data(), std::min(uuid.size(), sizeof mine.uuid));
    std::string nccl_error;
    if (rank_ == 0) {
      const std::string id = nccl_unique_id(&nccl_error);
      mine.nccl_ok = id.size() == sizeof mine.nccl_id;
      if (mine.nccl_ok) std::memcpy(mine.nccl_id, id.data(), id.size());
    } else {
      mine.nccl_ok = nccl_available(&nccl_error);
    }
    std::vector<Announcement> all(nranks_);
    try {
      allgather_bytes(&mine, all.data(), sizeof mine);
    } catch (const Error& e) {
      if (e.code() != qcclMismatch) throw;
      throw Error(e.code(), e.message() + " (that AllGather is this rank's choice of the GPU wire with every rank, "
                  "made at its first collective on device buffers outside a group: every rank must make its "
                  "first such collective at the same point, QCCL_GPU_WIRE in the README)");
    }
    std::string shared;  // "ranks 0 and 2 share a GPU"
    bool one_host = true;
    for (int a = 0; a < nranks_; ++a) {
      one_host = one_host && peers_[a].same_host(peers_[0]);
      for (int b = a + 1; b < nranks_ && shared.empty(); ++b)
        if (std::memcmp(all[a].uuid, all[b].uuid, sizeof all[a].uuid) == 0 && peers_[a].same_host(peers_[b]))
          shared = format("ranks %d and %d share a GPU", a, b);
    }
    if (config_.gpu_wire == "nccl" && !shared.empty())
      fail(qcclInvalidUsage, "QCCL_GPU_WIRE=nccl: %s, which NCCL does not allow (QCCL_GPU_WIRE=host stages through "
           "host memory instead)", shared.c_str());
    int without_nccl = -1;  // a rank that cannot load NCCL (every rank must, or none uses it)
    for (int r = 0; r < nranks_ && without_nccl < 0; ++r)
      if (!all[r].nccl_ok) without_nccl = r;
    if (config_.gpu_wire == "nccl" && without_nccl >= 0)
      fail(qcclSystemError, "QCCL_GPU_WIRE=nccl: rank %d cannot use NCCL%s%s", without_nccl,
           without_nccl == rank_ ? ": " : "", without_nccl == rank_ ? nccl_error.c_str() : "");
    const bool use_nccl = config_.gpu_wire == "nccl" || (shared.empty() && one_host && without_nccl < 0);
    if (use_nccl) {
      std::string why;
      wire = make_nccl_wire(*device_, nranks_, rank_, std::string(all[0].nccl_id, sizeof all[0].nccl_id),
                            config_.timeout_seconds, &why);
      // Every rank uses the wire or none does: a rank whose NCCL failed late would leave the others
      // posting to a peer that never answers.
      const int32_t made = wire != nullptr;
      std::vector<int32_t> made_by(nranks_);
      allgather_bytes(&made, made_by.data(), sizeof made);
      int failed = -1;
      for (int r = 0; r < nranks_ && failed < 0; ++r)
        if (!made_by[r]) failed = r;
      if (failed >= 0 && wire) wire->abort();  // its peer is gone: destroying would wait for it
      if (failed >= 0)
        fail(qcclSystemError, "the NCCL wire (QCCL_GPU_WIRE=%s): %s", config_.gpu_wire.c_str(),
             failed == rank_ ? why.c_str() : format("rank %d could not make its NCCL communicator", failed).c_str());
    } else {
      why_host = !shared.empty() ? shared
                 : !one_host     ? "the ranks are on several hosts"
                                 : format("rank %d cannot use NCCL", without_nccl);
    }
  }
  if (wire) device_executor_owned_->attach_wire(std::move(wire));
  QCCL_INFO("%s%s", device_executor_owned_->describe().c_str(),
            device_executor_owned_->has_wire()
                ? ""
                : format(" (QCCL_GPU_WIRE=%s: %s)", config_.gpu_wire.c_str(), why_host.c_str()).c_str());
}

Device& Comm::device_for(const char* name, const void* buffer, int ordinal) {
  std::string why;
  Device* d = device(ordinal, &why);
  if (!d)
    fail(qcclInvalidArgument, "%s = %p is CUDA device memory, which this process cannot use: %s", name, buffer,
         why.c_str());
  if (d->ordinal() != ordinal)
    fail(qcclInvalidArgument, "%s = %p is memory of CUDA device %d, but this communicator's device buffers are on "
         "%s (the device of its first call on device buffers)", name, buffer, ordinal, d->describe().c_str());
  return *d;
}

void* Comm::stage(OpRecord& record, const void* buffer, size_t bytes, bool in, bool out) {
  Device* d = &device_for("the buffer", buffer, device_of(buffer));
  if (!record.staging) {
    // As place() refuses for the device executor: the copies would be recorded into the graph, and
    // the host's part of the call not.
    if (d->capturing(stream()))
      fail(qcclInvalidUsage, "the communicator's stream %p is capturing a CUDA graph: qccl stages this call's device "
           "buffers through host memory from its progress thread, which a graph cannot record; make the call "
           "outside the capture", stream());
    record.staging = std::make_unique<OpRecord::Staging>(device_);
    record.staging->mark = d->mark(stream());
  }
  for (OpRecord::Staging::Buffer& b : record.staging->buffers)
    if (b.device == buffer) {
      b.in |= in, b.out |= out;
      return b.pinned;
    }
  record.staging->buffers.push_back({const_cast<void*>(buffer), nullptr, bytes, in, out});
  record.staging->buffers.back().pinned = d->allocate(Device::Memory::kPinned, std::max<size_t>(bytes, 1));
  return record.staging->buffers.back().pinned;
}

OpRecord::Staging::~Staging() {
  try {
    if (mark) device->forget(mark);
    for (const Buffer& b : buffers)  // no copy of them is in flight (end_staging)
      if (b.pinned) device->release(Device::Memory::kPinned, b.pinned);
  } catch (const Error&) {
  }
}

void Comm::end_staging(OpRecord& record, qcclResult_t* result, std::string* error) {
  OpRecord::Staging& s = *record.staging;
  Device* d = s.device.get();
  try {
    if (s.completed) {
      if (s.mark) d->wait(s.mark);  // after what the caller queued before the call, which may still read the buffers
      s.mark = 0;
      for (const OpRecord::Staging::Buffer& b : s.buffers)
        if (b.out && b.bytes) d->copy(b.device, b.pinned, b.bytes);
      d->signal(stream());
    }
    d->synchronize();  // the pinned buffers are no longer read
  } catch (const Error& e) {
    if (*result == qcclSuccess) *result = e.code(), *error = e.what();
    for (OpRecord::Staging::Buffer& b : s.buffers) b.pinned = nullptr;  // copies may still run: the memory stays
  }
  if (*result != qcclSuccess && *result != qcclNonFinite) {
    // The plan's transfers used the pinned buffers: a send the transport could not withdraw may still
    // read them (transport.h), so they go with the transport (shut_down_now), not with the call.
    std::lock_guard<std::mutex> lock(ops_mu_);
    failed_staging_.push_back(std::move(record.staging));
    return;
  }
  record.staging.reset();
}

void Comm::place(OpRecord& record, bool in_group) {
  coll::CollArgs& a = record.args;
  // Only the buffers this rank uses: a Broadcast's sendbuff off the root (and a Reduce's, Gather's or
  // Scatter's unused one) may be anything, as qccl.h says; a call of no values uses none, and runs on
  // the host on every rank whatever its pointers (no rank then starts the GPU wire's choice alone).
  const BufferUse used = buffer_use(a);
  const int send_device = used.read ? device_of(a.sendbuf) : -1, recv_device = used.written ? device_of(a.recvbuf) : -1;
  if (send_device < 0 && recv_device < 0) return;
  if (used.read && used.written && send_device != recv_device)
    fail(qcclInvalidArgument, "sendbuff = %p is %s and recvbuff = %p is %s: both must be memory of one device, or both "
         "host memory", a.sendbuf, send_device < 0 ? "host memory" : format("memory of CUDA device %d", send_device).c_str(),
         a.recvbuf, recv_device < 0 ? "host memory" : format("memory of CUDA device %d", recv_device).c_str());
  Device* d = send_device >= 0 ? &device_for("sendbuff", a.sendbuf, send_device)
                                : &device_for("recvbuff", a.recvbuf, recv_device);
  if (record.codec && a.codec->kind == kernels::CodecKind::kFft && !d->runs_fft()) {
    // Without the fft codec on the device (QCCL_GPU_FFT=host, the default), the host executor runs
    // the host's codec on pinned copies of the buffers (an all-reduce: count values each way; in
    // place, one buffer).
    const size_t bytes = a.count * a.element_size();
    void* send = stage(record, a.sendbuf, bytes, /*in=*/true, /*out=*/false);
    a.recvbuf = stage(record, a.recvbuf, bytes, /*in=*/false, /*out=*/true);
    a.sendbuf = send;
    return;
  }
  if (a.codec)
    if (const char* why = device_codec_refusal(*a.codec, *d))
      fail(qcclInvalidUsage, "codec '%s' on device buffers: %s", a.codec->canonical().c_str(), why);
  a.stream = stream();
  // A capture would record the caller's side of the join and nothing of the collective, which the
  // progress thread runs on a stream of its own: refused rather than left out of the graph.
  if (d->capturing(a.stream))
    fail(qcclInvalidUsage, "the communicator's stream %p is capturing a CUDA graph: qccl runs device collectives from "
         "its progress thread, which a graph cannot record; make the call outside the capture", a.stream);
  record.on_device = true;
  start_device_executor();
  // The wire is chosen by every rank together, at a collective made outside a group (inside one, a
  // thread may be driving several communicators' calls, which a blocking exchange here would hang):
  // until then collectives take the staged wire, which needs no agreement.
  if (a.kind != coll::CollKind::kSend && a.kind != coll::CollKind::kRecv && !in_group) choose_gpu_wire();
}

// Scratch buffers are reused across calls (a fresh allocation would page-fault every time), and
// taken only when a call starts to run: calls queued behind others hold none, so 20 calls in flight
// need the buffers of the few that run, not 20. The smallest that fits, so that a small call leaves
// the large buffers to the large ones.
void Comm::take_scratch(OpRecord& record) {
  if (record.scratch_bytes == 0) {  // (any pooled buffer fits none: one would leave the pool for nothing)
    record.operation->set_scratch(nullptr);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    auto best = scratch_pool_.end();
    for (auto it = scratch_pool_.begin(); it != scratch_pool_.end(); ++it)
      if ((*it)->size() >= record.scratch_bytes && (best == scratch_pool_.end() || (*it)->size() < (*best)->size()))
        best = it;
    if (best != scratch_pool_.end()) {
      record.scratch = *best;
      scratch_pool_.erase(best);
    }
  }
  if (!record.scratch) record.scratch = std::make_shared<std::vector<std::byte>>(record.scratch_bytes);
  record.operation->set_scratch(record.scratch->data());
}

void Comm::finish(OpRecord& record, qcclResult_t result, const std::string& message) {
  std::string error = message;
  if (record.staging) end_staging(record, &result, &error);
  std::unique_lock<std::mutex> lock(ops_mu_);
  record.result = result;
  record.error = error;
  if (record.operation) {
    auto it = std::find_if(active_.begin(), active_.end(), [&](const auto& r) { return r.get() == &record; });
    if (it != active_.end()) {
      active_.erase(it);
      active_count_.fetch_sub(1);
      if (record.operation->identity().p2p) {
        active_p2p_.fetch_sub(1);
        p2p_running_[p2p_direction(record.args)].erase(record.operation->identity().sequence);
      }
      active_version_.fetch_add(1);
    }
    // Completed (a non-finite result is data); the library's own exchanges (a split's, the GPU
    // wire's choice, learned levels') leave the statistics of the caller's last collective.
    if ((result == qcclSuccess || result == qcclNonFinite) && !record.internal) {
      const Execution& op = *record.operation;
      const ExecutionStats& stats = op.stats();
      last_stats_ = qcclStats_t{};
      last_stats_.wireBytesSent = stats.bytes_sent;
      last_stats_.wireBytesReceived = stats.bytes_received;
      last_stats_.interNodeBytesSent = stats.inter_node_bytes_sent;
      last_stats_.seconds = std::chrono::duration<double>(Clock::now() - record.started_at).count();
      last_stats_.sequence = op.identity().sequence;
      std::snprintf(last_stats_.algorithm, sizeof(last_stats_.algorithm), "%s", op.algorithm().name);
      const uint64_t raw = op.plan().raw_wire_bytes();
      last_stats_.compressionRatio = stats.bytes_sent ? static_cast<double>(raw) / stats.bytes_sent : 1.0;
      last_stats_.encodeSeconds = stats.encode_seconds;
      last_stats_.decodeSeconds = stats.decode_seconds;
      last_stats_.wireSeconds =
          std::max(0.0, last_stats_.seconds - last_stats_.encodeSeconds - last_stats_.decodeSeconds);
      last_stats_.reduceSeconds = stats.reduce_seconds;
      const DriveTotals now = drive_totals();
      last_stats_.transportSeconds = stats.post_seconds + 1e-9 * double(now.transport_ns - record.drive_at_start.transport_ns);
      last_stats_.waitSeconds = 1e-9 * double(now.waiting_ns - record.drive_at_start.waiting_ns);
      last_stats_.wakeups = static_cast<uint64_t>(now.wakeups - record.drive_at_start.wakeups);
      if (const kernels::CodecConfig* codec = op.plan().args().codec)
        std::snprintf(last_stats_.codec, sizeof(last_stats_.codec), "%s", codec->canonical().c_str());
      if (record.call) {
        const coll::MethodStats method = record.call->stats(op.plan());
        if (method.has_scale) last_stats_.intAlpha = method.scale;
        last_stats_.clippedValues = method.clipped;
        last_stats_.largestInteger = method.largest;
      }
    }
    if (record.scratch) scratch_pool_.push_back(std::move(record.scratch));
  } else if (result == qcclSuccess) {
    last_stats_ = qcclStats_t{};
  }
  if (record.call) record.call->end();
  record.state_call.reset();
  // The zero-count collectives that followed it complete after it, in call order: failed where a
  // failure of the communicator concerns them, as it would a call in flight, else with success (its
  // own failure may be the call's alone, or its result data: qcclNonFinite).
  std::vector<std::pair<std::shared_ptr<OpRecord>, Failure>> followers;
  for (auto& [follower, sequence] : record.followers) {
    const Failure* failure = failures_.concerning(false, sequence);
    followers.emplace_back(std::move(follower), failure ? *failure : Failure{});
  }
  record.followers.clear();
  record.done.store(true, std::memory_order_release);
  lock.unlock();  // what the woken look at is `done`, not what ops_mu_ guards
  drive_mu_.signal();  // a caller may wait for it while another drives
  for (const auto& [follower, failure] : followers) finish(*follower, failure.code, failure.message);
}

namespace {
qcclResult_t result_of(const coll::CallFailure& failure) {
  switch (failure.kind) {
    case coll::CallFailure::Kind::kArgument: return qcclInvalidArgument;
    case coll::CallFailure::Kind::kUsage: return qcclInvalidUsage;
    case coll::CallFailure::Kind::kMismatch: return qcclMismatch;
    case coll::CallFailure::Kind::kNonFinite: return qcclNonFinite;
    case coll::CallFailure::Kind::kSystem: return qcclSystemError;
  }
  return qcclInternalError;
}
}  // namespace

// A completed operation succeeded, unless its method says it failed (the call alone: a delta message
// the receiver refused) or a compressed one decoded non-finite values: every rank
// decodes the same bytes, so every rank reports the same count, and the communicator stays healthy.
void Comm::finish_completed(OpRecord& record) {
  if (record.staging) record.staging->completed = true;
  const Execution& op = *record.operation;
  size_t nonfinite = op.stats().nonfinite;
  if (record.call) {
    coll::CollArgs args = op.plan().args();
    // A method that reads the output where the host can (IntSGD's exact round, once per state) reads a
    // copy of a device call's; its bytes are on the device by now (the execution finished).
    std::unique_ptr<void, std::function<void(void*)>> output;
    if (record.on_device && record.call->reads_output(op.plan()) && args.count) {
      const size_t bytes = args.count * args.element_size();
      Device* device = device_.get();
      output = {device->allocate(Device::Memory::kPinned, bytes),
                [device](void* p) { device->release(Device::Memory::kPinned, p); }};
      device->copy(output.get(), args.recvbuf, bytes);
      device->synchronize();
      args.recvbuf = output.get();
    }
    record.call->complete(args, op.plan(), &nonfinite);
    if (const coll::CallFailure* failure = record.call->failure()) return finish(record, result_of(*failure), failure->message);
  }
  if (nonfinite == 0) return finish(record, qcclSuccess, "");
  finish(record, qcclNonFinite,
         format("%s: %zu output values are NaN or Inf: an input held NaN or Inf (or overflowed the codec), "
                "and compressed collectives never turn that into finite values",
                op.identity().header.describe().c_str(), nonfinite));
}

// The call of a compressed collective is about to run (earlier calls on its state are done): its
// method fixes what depends on them (IntSGD's alpha), and the frame headers announce the scale.
void Comm::prepare(OpRecord& record) {
  if (record.staging) {  // the inputs, once the caller's stream made them
    OpRecord::Staging& s = *record.staging;
    s.device->wait(s.mark);
    s.mark = 0;
    for (const OpRecord::Staging::Buffer& b : s.buffers)
      if (b.in && b.bytes) s.device->copy(b.pinned, b.device, b.bytes);
    s.device->synchronize();
  }
  // The calls before this one on its state have finished: its residual moves to where this call runs.
  if (record.state && record.on_device) {
    record.call->use_device_arrays(record.state->arrays_on_device(device_));
  } else if (record.state) {
    record.state->arrays_to_host();
  }
  record.call->prepare(record.operation->plan().args());
  record.operation->set_codec_scale(record.call->scale());
  QCCL_TRACE("%s: codec scale %.9g", record.operation->identity().header.describe().c_str(), record.call->scale());
}

void Comm::allgather_bytes(const void* send, void* recv, size_t bytes) {
  auto record = std::make_shared<OpRecord>();
  coll::CollArgs& args = record->args;
  args.kind = coll::CollKind::kAllGather;
  args.sendbuf = send;
  args.recvbuf = recv;
  args.count = bytes;
  args.dtype = kernels::DataType::kUint8;
  args.rank = rank_;
  args.nranks = nranks_;
  record->comm = shared_from_this();
  record->internal = true;
  start(record, /*background=*/false);
  wait(*record);
}

// ---- Driving -------------------------------------------------------------------------------------

bool DriveLock::lock_unless(const std::function<bool()>& done) {
  waiters_.fetch_add(1);
  // A completion or a release between this thread's look and its sleep is not lost: signal() takes
  // signal_mu_ before it notifies, and sees this waiter (the fences order the two threads' counts
  // and states, Dekker's way).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bool locked = false;
  {
    std::unique_lock<std::mutex> lock(signal_mu_);
    // Looking again now and then: try_lock may fail spuriously (the standard allows it, though glibc's
    // does not), and no signal would follow such a failure.
    const auto ready = [&] { return done() || (locked = mu_.try_lock()); };
    while (!signalled_.wait_for(lock, std::chrono::milliseconds(100), ready)) {
    }
  }
  waiters_.fetch_sub(1);
  return locked;
}

void DriveLock::signal() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waiters_.load() == 0) return;
  { std::lock_guard<std::mutex> lock(signal_mu_); }
  signalled_.notify_all();
}

void Comm::wait(OpRecord& record) {
  // An armed hand-off timer is left running while the wait is short (disarming costs a system call,
  // a third of a 64 KiB all-reduce): if it fires while we drive, we take up the calls started since
  // (wait_for_events), and the progress thread finds the drive lock taken and sleeps again. A wait
  // that lasts is worth the call, which spares the progress thread (and on an oversubscribed host, a
  // rank that spins) a wake-up per timer period.
  const auto entered = Clock::now();
  auto done = [&] {
    if (hand_off_armed_.load(std::memory_order_relaxed) && Clock::now() - entered > kShortWait &&
        hand_off_armed_.exchange(false))
      arm_hand_off(false);
    return record.done.load(std::memory_order_acquire);
  };
  while (!record.done.load(std::memory_order_acquire)) {
    callers_waiting_.fetch_add(1);
    // Ask the progress thread to step aside, but only when it drives: waking it for nothing costs a
    // context switch per call. (It raises progress_driving_ before it looks at callers_waiting_,
    // and we raised callers_waiting_ before looking at progress_driving_: one of us sees the other.)
    if (progress_driving_.load()) wake(progress_wake_fd_);
    // The lock, unless the call completes first under another caller's drive (a completion
    // thread's wait while the owning thread drives its own blocking call).
    const bool driving = drive_mu_.lock_unless([&] { return record.done.load(std::memory_order_acquire); });
    callers_waiting_.fetch_sub(1);
    if (!driving) break;
    {
      std::lock_guard<DriveLock> drive(drive_mu_, std::adopt_lock);
      drive_until(done, false);
    }
    // Others remain: hand them back to the progress thread, in a moment. A caller that waits for
    // its requests one after the other (the DDP pattern) is back at once, and an immediate wake-up
    // would make the two threads trade the drive lock once per request, which on an oversubscribed
    // host costs a scheduler slice each time; a caller that goes away to compute leaves its
    // operations undriven for kHandOffNs at most.
    if (active_count_.load() > 0 && !hand_off_armed_.exchange(true)) arm_hand_off(true);
  }
  if (record.result != qcclSuccess) throw Error(record.result, record.error);
}

bool Comm::test(OpRecord& record) {
  if (!record.done.load(std::memory_order_acquire)) {
    std::unique_lock<DriveLock> drive(drive_mu_, std::try_to_lock);
    if (drive.owns_lock()) {
      drive_until([&] { return record.done.load(std::memory_order_acquire); }, false, /*may_block=*/false);
    }
  }
  // As at the end of a wait: the progress thread takes over what is left. (Its hand-off timer may
  // have fired while this pass held the lock, which it then left alone until its next wake-up.)
  if (active_count_.load() > 0 && !hand_off_armed_.exchange(true)) arm_hand_off(true);
  return record.done.load(std::memory_order_acquire);
}

namespace {
void add_ns(std::atomic<int64_t>& total, std::chrono::steady_clock::duration d) {
  total.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(), std::memory_order_relaxed);
}
}  // namespace

void Comm::drive_until(const std::function<bool()>& done, bool progress_thread, bool may_block) {
  // The snapshot holds records, which hold the communicator: drop it on the way out once nothing is
  // active (while calls are outstanding it is kept for the next wait: a caller that waits for 20
  // requests one by one would otherwise copy the list 20 times).
  struct ClearSnapshot {
    Comm* comm;
    ~ClearSnapshot() {
      if (comm->active_count_.load() > 0) return;
      comm->driving_.clear();
      comm->driving_version_ = ~uint64_t{0};
    }
  } clear_snapshot{this};
  auto spin_until = Clock::now() + std::chrono::microseconds(config_.spin_us);
  auto busy_pause = kFirstBusyPause;
  auto last_moved = Clock::now();
  while (!done()) {
    if (progress_thread && (stopping_ || callers_waiting_.load() > 0)) return;
    if (broken_) {
      fail_affected_operations();  // collectives the failure does not concern keep going
      if (done()) return;
    }
    if (aggregator_lost_set_.load(std::memory_order_relaxed)) {
      fail_aggregator_operations();
      if (done()) return;
    }
    if (!executor_) return;  // shut down under us (abort: every call failed above)
    const auto pass_begin = Clock::now();
    bool moved = executor_->progress();
    const auto progressed = Clock::now();
    if (moved) add_ns(transport_ns_, progressed - pass_begin);
    if (driving_version_ != active_version_.load()) {
      // Brought up to date rather than copied: with hundreds of calls outstanding, a copy of the list
      // at every completion was most of the drive loop's time. Finished records have left active_
      // (and are done); new ones were added at its end, in call order.
      std::lock_guard<std::mutex> lock(ops_mu_);
      if (driving_version_ == ~uint64_t{0}) driving_.clear(), driving_submitted_ = 0;
      // Collectives finish in call order: the done ones are at the front. Point-to-point calls may
      // leave some behind, which the loop skips; a full sweep bounds them.
      auto done = [](const auto& r) { return r->done.load(std::memory_order_relaxed); };
      const auto first_live = std::find_if_not(driving_.begin(), driving_.end(), done);
      driving_.erase(driving_.begin(), first_live);
      if (driving_.size() > 2 * active_.size() + 16)
        driving_.erase(std::remove_if(driving_.begin(), driving_.end(), done), driving_.end());
      size_t first_new = active_.size();
      while (first_new > 0 && active_[first_new - 1]->submitted >= driving_submitted_) --first_new;
      driving_.insert(driving_.end(), active_.begin() + static_cast<ptrdiff_t>(first_new), active_.end());
      driving_submitted_ = submitted_;
      driving_version_ = active_version_.load();
      driving_p2p_ = active_p2p_.load() > 0;
    }
    // Collectives run in call order through one pipeline (comm.h): `slots` is what the older ones
    // leave free of QCCL_PIPELINE_DEPTH, `open` whether the next may start at all, `older_undone`
    // whether an older one has not completed yet. Point-to-point calls are outside the order.
    size_t slots = static_cast<size_t>(std::max(config_.pipeline_depth, 1));
    bool open = true;
    bool older_undone = false;
    for (size_t i = 0; i < driving_.size(); ++i) {
      const auto& record = driving_[i];
      if (record->done.load(std::memory_order_relaxed)) continue;
      Execution& op = *record->operation;
      const bool ordered = !op.identity().p2p;
      // A delta call behind another on its store; a call behind one whose keys its own would repeat.
      if (!ordered && !op.started() && (waits_for_its_state(i) || waits_for_its_key(i))) continue;
      if (ordered && !op.started() && (!open || slots == 0 || waits_for_its_state(i) || waits_for_its_buffers(i))) {
        open = false;  // every later collective waits behind this one
        older_undone = true;
        // Nothing after it can start, and only a point-to-point call could move: with hundreds of
        // calls outstanding, a pass over all of them on every spin is what the loop would cost.
        if (!driving_p2p_) break;
        continue;
      }
      try {
        if (ordered) op.set_fragment_limit(slots);
        if (!op.started()) {
          take_scratch(*record);
          if (record->call) prepare(*record);
          // Here, between two of the driver's intervals (this pass moves: it starts the execution),
          // so that none counted for the call began before it.
          record->drive_at_start = drive_totals();
        }
        moved |= op.advance();
        if (ordered) {
          slots -= std::min(slots, op.fragments_in_flight());
          open = open && op.started_every_fragment();
        }
        if (!op.finished()) {
          older_undone |= ordered;
        } else if (!ordered || !older_undone) {
          finish_completed(*record);
        }
        // else: completed before an older collective; it completes after it (call order)
      } catch (const Error& e) {
        break_comm(Failure{e.code(), e.message(), failure_sequence(*record)}, true);
        break;
      } catch (const std::bad_alloc&) {  // a call's scratch or a method's buffers
        break_comm(Failure{qcclSystemError, "out of memory starting or running a call", failure_sequence(*record)},
                   true);
        break;
      }
    }
    const auto now = Clock::now();
    if (!moved) add_ns(waiting_ns_, now - pass_begin);
    if (now >= next_timeout_check_) {
      check_timeouts();
      next_timeout_check_ = now + std::chrono::milliseconds(kMaxBlockMs);
    }
    if (!may_block) return;  // one pass only
    if (moved) {
      spin_until = now + std::chrono::microseconds(config_.spin_us);
      busy_pause = kFirstBusyPause;
      last_moved = now;
      continue;
    }
    if (now < spin_until) {
      if (oversubscribed_) sched_yield();  // let a rank that has work run on this CPU
      continue;
    }
    // The device wakes its own descriptor when it reaches its last point, where it can (else poll).
    if (DeviceExecutor* d = device_executor_.load(); d && !d->arm_device()) continue;
    // The transport refuses to arm when events arrived meanwhile (progress again), but also, and
    // for as long as it lasts, while a send waits for room in a peer's shared-memory FIFO: UCX's
    // mm transports learn of freed room only by polling. A rank that waits for a late peer would spin
    // a CPU the peer may need: it yields it, and after kBusyPolling pauses, longer while nothing moves.
    const bool armed = executor_->arm();
    if (!armed && now - last_moved < kBusyPolling) {
      if (oversubscribed_) sched_yield();
      continue;
    }
    const auto asleep = Clock::now();
    if (armed) {
      wait_for_events(progress_thread, std::chrono::milliseconds(kMaxBlockMs), true);
    } else {  // its descriptor, unarmed, may stay readable: a pause that watched it would not pause
      wait_for_events(progress_thread, busy_pause, false);
      busy_pause = std::min(2 * busy_pause, kLongestBusyPause);
    }
    add_ns(waiting_ns_, Clock::now() - asleep);
    wakeups_.fetch_add(1, std::memory_order_relaxed);
  }
}

DriveTotals Comm::drive_totals() const {
  return DriveTotals{transport_ns_.load(std::memory_order_relaxed), waiting_ns_.load(std::memory_order_relaxed),
                     wakeups_.load(std::memory_order_relaxed)};
}

// Blocks until the transport (when `transport`: armed), a wake-up, the hand-off timer or (progress
// thread) the control plane has something, or for `timeout` at most.
void Comm::wait_for_events(bool progress_thread, std::chrono::microseconds timeout, bool transport) {
  std::vector<pollfd> fds;
  fds.push_back({transport ? executor_->event_fd() : -1, POLLIN, 0});  // -1: poll skips it
  fds.push_back({progress_thread ? progress_wake_fd_ : driver_wake_fd_, POLLIN, 0});
  DeviceExecutor* device = device_executor_.load();
  fds.push_back({device ? device->device_event_fd() : -1, POLLIN, 0});  // -1: poll skips it
  // The hand-off timer, armed by a start in the background: a call started while this thread drives
  // others is this thread's to post, within the timer's 1 ms (comm.h), where the progress thread,
  // asleep here with a receive pending, would leave it unposted for the rest of its sleep (kMaxBlockMs).
  fds.push_back({hand_off_fd_, POLLIN, 0});
  size_t control_end = 4;
  if (progress_thread) {
    for (int fd : control_->fds()) fds.push_back({fd, POLLIN, 0});
    control_end = fds.size();
    for (int fd : aggregator_fds()) fds.push_back({fd, POLLIN, 0});
  }
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  const timespec limit{static_cast<time_t>(seconds.count()),
                       static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout - seconds).count())};
  if (::ppoll(fds.data(), fds.size(), &limit, nullptr) <= 0) return;
  if (fds[1].revents) drain(fds[1].fd);
  if (fds[2].revents) drain(fds[2].fd);
  if (fds[3].revents) {
    drain(hand_off_fd_);
    hand_off_armed_.store(false);  // as in progress_thread_main: the next start or end of a wait arms it
  }
  for (size_t i = 4; i < fds.size(); ++i) {
    if (!fds[i].revents) continue;
    if (i < control_end) control_->service(fds[i].fd);
    else service_aggregator(i - control_end);
  }
}

std::vector<int> Comm::aggregator_fds() const {
  std::vector<int> fds;
  for (const AggregatorLink& link : aggregator_links_) fds.push_back(link.socket.fd());  // -1 once closed: poll skips it
  return fds;
}

void Comm::service_aggregator(size_t k) {
  AggregatorLink& link = aggregator_links_[k];
  char byte;
  try {
    if (link.socket.read_some(&byte, 1) != 0) return;  // aggregators send nothing after the reply
  } catch (const Error&) {
  }
  link.socket.close();
  const std::string why = link.name + " closed its connection (it died or was stopped): the int codecs' agg=switch "
                                      "cannot sum through it";
  QCCL_WARN("%s", why.c_str());
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    if (aggregator_lost_.empty()) aggregator_lost_ = why;
  }
  // agg=switch operations in flight may wait for its sums: the driver fails them. The others never
  // talk to an aggregator, and go on (the communicator stays usable): breaking it would fail plain
  // collectives on a communicator that never uses agg=switch whenever one was running as an
  // aggregator stopped. None are in flight at a clean teardown (destroy drains them before the
  // closing barrier), when an aggregator may drop the job as the first rank leaves.
  aggregator_lost_set_.store(true);
  wake(driver_wake_fd_);
  wake(progress_wake_fd_);
}

void Comm::fail_aggregator_operations() {
  std::vector<std::shared_ptr<OpRecord>> affected;
  std::string why;
  {
    // Scanned on every pass until no agg=switch call can join active_ unseen: one that passed the
    // submission check before the loss joins it later (aggregator_calls_entering_); later ones are
    // refused there. The ones found are failed below, before the next pass.
    std::lock_guard<std::mutex> lock(ops_mu_);
    why = aggregator_lost_;
    for (const auto& record : active_)
      if (record->operation->plan().uses_aggregators()) affected.push_back(record);
    if (aggregator_calls_entering_ == 0) aggregator_lost_set_.store(false);
  }
  if (affected.empty()) return;
  if (executor_) {
    for (const auto& record : affected) record->operation->cancel();
    executor_->settle_cancelled();  // as in fail_affected_operations
  }
  for (const auto& record : affected) finish(*record, qcclRemoteError, why);
}

// Calls that share a codec state run one after the other, in the order they were made: each reads
// and writes the whole state (a residual, a compensation, the step), so overlapping them would race.
bool Comm::waits_for_its_state(size_t index) const {
  const auto& record = driving_[index];
  if (!record->serial || record->operation->started()) return false;
  for (size_t j = 0; j < index; ++j)
    if (driving_[j]->serial == record->serial && !driving_[j]->done.load(std::memory_order_relaxed)) return true;
  return false;
}

// Point-to-point calls of one peer and direction are told apart by the low bits of their numbers
// (src/message_key.h): a call starts only once the calls kP2pWindow or more older than it there have
// finished, or a message of one could meet the other's receive.
bool Comm::waits_for_its_key(size_t index) const {
  const OpRecord& record = *driving_[index];
  const uint64_t number = record.operation->identity().sequence;
  if (number < message_key::kP2pWindow || record.operation->started()) return false;
  std::lock_guard<std::mutex> lock(ops_mu_);
  const std::set<uint64_t>& running = p2p_running_[p2p_direction(record.args)];
  return !running.empty() && *running.begin() + message_key::kP2pWindow <= number;
}

// A collective not started yet whose buffers an older one still running writes (or reads, where this
// one writes): it starts when that one is past them (the pipeline would have them side by side): a
// host call once it finished, a device call once all its steps are queued on the device's stream,
// which runs the later call's after them (Execution::queued_all). A staged call (stage) is compared
// by the caller's device buffers, not by its pinned copies, and is past them only once it completed:
// its outputs reach the device buffers then (end_staging), after its host execution finished.
bool Comm::waits_for_its_buffers(size_t index) const {
  const OpRecord& record = *driving_[index];
  const BufferUse mine = callers_buffer_use(record);
  for (size_t j = 0; j < index; ++j) {
    const OpRecord& older = *driving_[j];
    if (older.done.load(std::memory_order_relaxed) || older.operation->identity().p2p ||
        (older.operation->queued_all() && !older.staging))
      continue;
    if (must_wait_for(callers_buffer_use(older), mine)) return true;
  }
  return false;
}

BufferUse Comm::callers_buffer_use(const OpRecord& record) {
  BufferUse use = buffer_use(record.args);
  if (record.staging)
    for (const OpRecord::Staging::Buffer& b : record.staging->buffers) {
      if (use.read == b.pinned) use.read = b.device;
      if (use.written == b.pinned) use.written = b.device;
    }
  return use;
}

void Comm::check_timeouts() {
  if (config_.timeout_seconds <= 0) return;
  const auto now = Clock::now();
  for (const auto& record : driving_) {
    // Not started: waits for the collectives before it or for its state. Finished: waits to complete
    // after an older collective, which has a clock of its own.
    if (record->done || !record->operation->started() || record->operation->finished()) continue;
    const Execution& op = *record->operation;
    const double idle = std::chrono::duration<double>(now - op.last_progress()).count();
    if (idle < config_.timeout_seconds) continue;
    Failure failure{qcclTimeout,
                    format("%s (%s) made no progress for %.0f s (QCCL_TIMEOUT): waiting for %s",
                           op.identity().header.describe().c_str(), op.algorithm().name, idle,
                           op.waiting_for().c_str()),
                    failure_sequence(*record)};
    // Kept and reported, also where a later collective's failure broke the communicator before:
    // the next pass fails this call and those after it.
    break_comm(failure, true);
    return;
  }
}

void Comm::progress_thread_main() {
  log_set_rank(rank_);
  const kernels::SubnormalsKept ieee;  // whatever mode the thread that made it was in (kernels/subnormals.h)
  while (!stopping_) {
    std::vector<int> control_fds = control_->fds();
    std::vector<pollfd> fds;
    fds.push_back({progress_wake_fd_, POLLIN, 0});
    fds.push_back({hand_off_fd_, POLLIN, 0});
    for (int fd : control_fds) fds.push_back({fd, POLLIN, 0});
    const size_t control_end = fds.size();
    for (int fd : aggregator_fds()) fds.push_back({fd, POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), 1000);
    if (rc > 0) {
      if (fds[0].revents) drain(progress_wake_fd_);
      if (fds[1].revents) {
        drain(hand_off_fd_);
        hand_off_armed_.store(false);  // the next start or end of a wait arms it again
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        if (i < control_end) control_->service(fds[i].fd);
        else service_aggregator(i - control_end);
      }
    }
    if (stopping_) break;
    if (active_count_.load() == 0) continue;
    progress_driving_.store(true);
    if (callers_waiting_.load() == 0) {
      std::unique_lock<DriveLock> drive(drive_mu_, std::try_to_lock);
      // What escapes the drive (the transport refusing to arm) breaks the communicator, whose
      // callers then fail: on this thread it would end the process.
      try {
        if (drive.owns_lock()) drive_until([this] { return active_count_.load() == 0; }, true);
      } catch (const Error& e) {
        break_comm(Failure{e.code(), "progress thread: " + e.message(), 0}, true);
      } catch (const std::exception& e) {
        break_comm(Failure{qcclSystemError, std::string("progress thread: ") + e.what(), 0}, true);
      }
    }
    progress_driving_.store(false);
  }
}

void Comm::arm_hand_off(bool arm) {
  itimerspec spec{};
  if (arm) spec.it_value.tv_nsec = kHandOffNs;
  (void)timerfd_settime(hand_off_fd_, 0, &spec, nullptr);  // cannot fail with a valid descriptor and time
}

void Comm::wake(int fd) {
  uint64_t one = 1;
  ssize_t rc = ::write(fd, &one, sizeof(one));
  (void)rc;  // a full counter already means "wake up"
}

// ---- Failure -------------------------------------------------------------------------------------

uint64_t Comm::failure_sequence(const OpRecord& record) {
  const OperationIdentity& id = record.operation->identity();
  return id.p2p ? 0 : id.sequence;  // point-to-point numbers are per peer: not comparable
}

uint64_t Comm::first_unfinished_collective() const {
  std::lock_guard<std::mutex> lock(ops_mu_);
  uint64_t first = collectives_issued_;  // a number taken by a start() still on its way counts
  for (const auto& record : active_) {
    const OperationIdentity& id = record->operation->identity();
    if (!id.p2p) first = std::min(first, id.sequence);
  }
  return first;
}

void Comm::break_comm(const Failure& failure, bool report) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    if (!failures_.add(failure)) return;  // concerns no call an earlier failure did not
    first = !broken_;
    broken_ = true;
  }
  QCCL_WARN("%s: %s", first ? "communicator failed" : "an older collective failed too", failure.message.c_str());
  if (report && control_) control_->report_failure(failure);
  wake(driver_wake_fd_);
  wake(progress_wake_fd_);
}

void Comm::fail_affected_operations() {
  std::vector<std::pair<std::shared_ptr<OpRecord>, Failure>> affected;
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    for (const auto& record : active_) {
      const OperationIdentity& id = record->operation->identity();
      if (const Failure* failure = failures_.concerning(id.p2p, id.sequence)) affected.emplace_back(record, *failure);
    }
  }
  if (affected.empty()) return;
  if (executor_) {
    for (const auto& [record, failure] : affected) record->operation->cancel();
    // Receives the transport could not withdraw are given time to be done with the callers' buffers
    // before the calls end (sends it cannot withdraw at all: qccl.h keeps a failed call's buffers the
    // communicator's until its teardown).
    executor_->settle_cancelled();
  }
  for (const auto& [record, failure] : affected) finish(*record, failure.code, failure.message);
}

qcclResult_t Comm::health(std::string* message) const {
  if (!broken_) return qcclSuccess;
  std::lock_guard<std::mutex> lock(ops_mu_);
  *message = failures_.first().message;
  return failures_.first().code;
}

void Comm::last_stats(qcclStats_t* out) const {
  std::lock_guard<std::mutex> lock(ops_mu_);
  const size_t size = out->size;
  *out = last_stats_;
  out->size = size;
}

// ---- Teardown ------------------------------------------------------------------------------------

void Comm::destroy() {
  {
    std::lock_guard<DriveLock> drive(drive_mu_);
    drive_until([this] { return active_count_.load() == 0; }, false);
  }
  std::string message;
  bool failed = health(&message) != qcclSuccess;
  std::unique_ptr<Error> barrier_error;
  if (failed) {
    // Leaving a failed communicator, whose closing barrier the others may never reach: the departure is
    // announced with what it leaves unfinished (nothing older: the calls were driven to their end
    // above), so that the closed connection fails none of the others' calls that may still finish.
    control_->report_failure(Failure{qcclRemoteError, "it left with qcclCommDestroy after the communicator failed",
                                     first_unfinished_collective()},
                             /*departing=*/true);
  } else {
    try {
      control_->barrier(net::Deadline::after(config_.timeout_seconds), /*closing=*/true);
    } catch (const Error& e) {
      // An abort from another thread ends the wait with its own failure, whatever the peers' answers
      // to its report came first (a peer that left meanwhile: its departure raced the abort here).
      if (aborting_.load())
        barrier_error = std::make_unique<Error>(qcclAborted, abort_message());
      else
        barrier_error = std::make_unique<Error>(e.code(), "waiting for the other ranks to destroy: " + e.message());
    }
  }
  shutdown();
  if (barrier_error) throw *barrier_error;
}

std::string Comm::abort_message() const {
  return format("qcclCommAbort was called on %s", names_.empty() ? "this rank" : names_[rank_].c_str());
}

void Comm::abort() {
  aborting_.store(true);  // before the peers hear of it: a destroy waiting here reports the abort
  const Failure failure{qcclAborted, abort_message(), 0};
  if (control_) control_->begin_close();  // our own departure is not news to us
  // The peers' calls fail from this rank's oldest unfinished collective on (and their point-to-point
  // calls): it has done its part of the older ones, which may still finish there.
  if (control_)
    control_->report_failure(Failure{failure.code, failure.message, first_unfinished_collective()}, /*departing=*/true);
  // Every call of this rank's, those older than an earlier failure too. A qcclCommDestroy driving
  // them fails them on waking, and lets go of the drive lock taken below.
  break_comm(failure, false);
  if (control_) control_->fail_waits(failure);  // a qcclCommDestroy waiting in its closing barrier
  {
    std::lock_guard<DriveLock> drive(drive_mu_);
    fail_affected_operations();
  }
  shutdown();
}

void Comm::shutdown() {
  // Once: qcclCommDestroy's thread and a qcclCommAbort from another may both come here; the second
  // waits for the first.
  std::call_once(shutdown_once_, [this] { shut_down_now(); });
}

void Comm::shut_down_now() {
  shut_down_ = true;
  if (control_) control_->begin_close();
  stopping_ = true;
  wake(progress_wake_fd_);
  if (progress_thread_.joinable()) progress_thread_.join();
  {
    std::lock_guard<DriveLock> drive(drive_mu_);
    std::unique_lock<std::shared_mutex> executors(executors_mu_);  // no start() is using them
    driving_.clear();  // a snapshot kept while calls were outstanding (drive_until)
    driving_version_ = ~uint64_t{0};
    transport_.reset();  // first: it may still read the buffers the executor keeps for abandoned sends
    {
      std::lock_guard<std::mutex> lock(ops_mu_);
      failed_staging_.clear();  // (end_staging) likewise
    }
    executor_.reset();
    device_executor_.store(nullptr);
    device_executor_owned_.reset();  // its pool goes with the last execution a request still holds
  }
  if (control_) control_->close();
}

}  // namespace qccl
