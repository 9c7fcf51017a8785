// The IntSGD aggregator daemon (tools/qccl_aggregator is its command line): the process that plays
// SwitchML's programmable switch for the int codecs' agg=switch (collectives/allreduce_intsgd_switch.cc).
// It adds the integer chunks the ranks stream to it in a fixed pool of slots and sends every sum back
// to every rank.
//
// Design: one thread, one loop over every job's UCX worker and the registration sockets, spinning
// while messages move and blocking in poll() when nothing does. A job (one communicator) forms when
// all its ranks have registered (src/aggregator.h); it ends when any of its registration connections
// closes. A slot is keyed by the chunk's message key (collective sequence and message id,
// src/message_key.h): the first contribution is copied in, the next n - 1 are added with wrapping
// integer adds (kernels/intsgd.h), and the full sum goes back to every rank with the same key, the
// fingerprint kept and the taint bit (a rank met NaN or Inf) ORed over the contributions.
// Contributions that disagree (another collective's fingerprint, another width or count) make the slot
// answer with its 8-byte header only, which every rank reports as a mismatch. A contribution that
// finds no free slot waits in a queue.
#include "src/aggregator_daemon.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/errors.h"
#include "collectives/intsgd.h"
#include "kernels/intsgd.h"
#include "src/aggregator.h"
#include "src/message_key.h"
#include "transports/ucx_transport.h"

namespace qccl {
namespace {

using coll::SwitchChunkHeader;

using message_key::chunk_id;
using message_key::kFingerprintBits;
using message_key::kTaintBit;

struct Slot {
  bool used = false;
  transport::Key id = 0, key = 0;  // chunk id, and the key the sum goes back with
  SwitchChunkHeader header;
  bool mismatch = false;
  int contributions = 0;
  std::vector<bool> from;
  std::vector<uint8_t> sum;
  size_t bytes = 0;
  std::vector<transport::Handle> sends;  // the sum's way back, one per rank
};

struct Contribution {
  int rank;
  transport::Key key;
  std::vector<uint8_t> bytes;
};

class Job {
 public:
  Job(std::vector<net::Socket> sockets, std::vector<AggregatorHello> hellos, const AggregatorDaemonOptions& o)
      : sockets_(std::move(sockets)), hellos_(std::move(hellos)) {
    n_ = hellos_[0].nranks;
    max_message_ = hellos_[0].max_message;
    for (const AggregatorHello& h : hellos_) max_message_ = std::max<size_t>(max_message_, h.max_message);
    transport_ = std::make_unique<transport::UcxTransport>(n_ + hellos_[0].index, n_);
    for (int r = 0; r < n_; ++r) transport_->connect_peer(r, hellos_[r].address);
    slots_.resize(o.slots);
    posted_.resize(static_cast<size_t>(n_));
    oldest_.assign(static_cast<size_t>(n_), 0);
    for (int r = 0; r < n_; ++r) {
      posted_[r].resize(static_cast<size_t>(o.receives));
      for (Posted& p : posted_[r]) {
        p.buffer.resize(max_message_);
        post(r, p);
      }
    }
    AggregatorReply reply;
    reply.address = transport_->address();
    for (net::Socket& s : sockets_) send_frame(s, reply.serialize(), net::Deadline::after(30));
  }

  ~Job() {
    for (auto& per_rank : posted_)
      for (Posted& p : per_rank)
        if (!p.handle.empty()) transport_->cancel(p.handle);
    for (Slot& s : slots_)
      for (transport::Handle& h : s.sends)
        if (!h.empty()) transport_->cancel(h);
  }

  uint64_t id() const { return hellos_[0].job; }
  int nranks() const { return n_; }
  transport::UcxTransport& transport() { return *transport_; }
  std::vector<net::Socket>& sockets() { return sockets_; }

  // Moves what can move; true when something did.
  bool progress() {
    bool moved = transport_->progress();
    transport::Completion done;
    std::string error;
    // A rank's receives are handled in the order they were posted (UCX matches its messages to them in
    // that order), stopping at the first still pending: a re-posted receive holds a later chunk than
    // the older ones, and handling it first could take the last free slot from the chunk every rank
    // waits on (ranks of different pipeline depths then deadlock with few slots).
    for (int r = 0; r < n_; ++r) {
      std::vector<Posted>& ring = posted_[r];
      for (size_t tries = 0; tries < ring.size(); ++tries) {
        Posted& p = ring[oldest_[r]];
        const transport::Poll state = transport_->test(p.handle, &done, &error);
        if (state == transport::Poll::kPending) break;
        if (state == transport::Poll::kFailed)
          throw std::runtime_error("a receive from rank " + std::to_string(r) + " failed: " + error);
        moved = true;
        contribute(r, done.key, p.buffer.data(), done.bytes);
        post(r, p);  // now the newest
        oldest_[r] = (oldest_[r] + 1) % ring.size();
      }
    }
    for (Slot& s : slots_) {
      if (!s.used || s.sends.empty()) continue;
      bool all = true;
      for (transport::Handle& h : s.sends) {
        if (h.empty()) continue;
        switch (transport_->test(h, &done, &error)) {
          case transport::Poll::kPending:
            all = false;
            break;
          case transport::Poll::kFailed:
            throw std::runtime_error("sending a sum failed: " + error);
          case transport::Poll::kDone:
            moved = true;
            break;
        }
      }
      if (!all) continue;
      s.used = s.mismatch = false;  // free again; the sum buffer stays allocated
      s.id = s.key = 0;
      s.contributions = 0;
      s.bytes = 0;
      s.from.clear();
      s.sends.clear();
      moved = true;
    }
    // A slot may have freed. Every waiting contribution that finds its chunk's slot or a free one goes
    // in, in order, not only those before the first that finds neither: a queued chunk whose slot a
    // contribution made since (taken from the queue, or arrived once a slot freed) would otherwise
    // wait behind that one, and its slot, short of it, never free (a hang with few slots).
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (contribute(it->rank, it->key, it->bytes.data(), it->bytes.size(), /*from_queue=*/true)) {
        it = waiting_.erase(it);
        moved = true;
      } else {
        ++it;
      }
    }
    return moved;
  }

 private:
  struct Posted {
    transport::Handle handle;
    std::vector<uint8_t> buffer;
  };

  void post(int rank, Posted& p) {
    p.handle = transport_->irecv(rank, 0, transport::kKeyMask, p.buffer.data(), p.buffer.size());
  }

  // False only when it came from the queue and still finds no slot.
  bool contribute(int rank, transport::Key key, const uint8_t* data, size_t bytes, bool from_queue = false) {
    const transport::Key id = chunk_id(key);
    Slot* slot = nullptr;
    Slot* free = nullptr;
    for (Slot& s : slots_) {
      if (s.used && s.id == id && s.sends.empty()) slot = &s;
      if (!s.used && !free) free = &s;
    }
    if (!slot) {
      if (!free) {
        if (!from_queue) waiting_.push_back(Contribution{rank, key, std::vector<uint8_t>(data, data + bytes)});
        return false;
      }
      slot = free;
      slot->used = true;
      slot->id = id;
      slot->key = key & ~kTaintBit;
      slot->from.assign(static_cast<size_t>(n_), false);
      slot->sum.resize(max_message_);
      slot->bytes = bytes;
      slot->mismatch = !slot->header.decode(data) || bytes > max_message_ ||
                       bytes != SwitchChunkHeader::kBytes + size_t{slot->header.count} * (slot->header.bits / 8u);
      if (!slot->mismatch) std::memcpy(slot->sum.data(), data, bytes);
    } else if (slot->from[static_cast<size_t>(rank)]) {
      // A second contribution from one rank: the slot's answer is a mismatch, but it still waits for
      // the ranks that have not contributed (counted, it would answer early and they would find no
      // slot to match their chunk, and a new one would wait for its n - 1 others forever).
      slot->mismatch = true;
      slot->key |= key & kTaintBit;
      return true;
    } else {
      SwitchChunkHeader h;
      const bool same = h.decode(data) && h.bits == slot->header.bits && h.count == slot->header.count &&
                        bytes == slot->bytes && (key & kFingerprintBits) == (slot->key & kFingerprintBits);
      if (!same) slot->mismatch = true;
      if (!slot->mismatch)
        kernels::int_add(h.bits, data + SwitchChunkHeader::kBytes, slot->sum.data() + SwitchChunkHeader::kBytes,
                         h.count);
    }
    slot->from[static_cast<size_t>(rank)] = true;
    slot->key |= key & kTaintBit;
    if (++slot->contributions == n_) {
      // Disagreeing contributions get the header alone: every rank reports the size as a mismatch.
      if (slot->mismatch) {
        SwitchChunkHeader{}.encode(slot->sum.data());
        slot->bytes = SwitchChunkHeader::kBytes;
      }
      slot->sends.resize(static_cast<size_t>(n_));
      for (int r = 0; r < n_; ++r) slot->sends[r] = transport_->isend(r, slot->key, slot->sum.data(), slot->bytes);
    }
    return true;
  }

  std::vector<net::Socket> sockets_;
  std::vector<AggregatorHello> hellos_;
  int n_ = 0;
  size_t max_message_ = 0;
  std::vector<Slot> slots_;
  std::vector<std::vector<Posted>> posted_;  // per rank, a ring in posting order
  std::vector<size_t> oldest_;               // per rank, the index in posted_ of its oldest receive
  std::deque<Contribution> waiting_;
  // Declared last, so destroyed first: a cancelled receive that had matched goes on writing into its
  // posted_ buffer, and a sum's send goes on reading its slot, while ~UcxTransport progresses the worker.
  std::unique_ptr<transport::UcxTransport> transport_;
};

// A connection whose hello is still arriving. Its bytes are read as they come, in the daemon's one
// loop, so that a client that connects and says nothing (or slowly) holds up no job; it is dropped
// after kHelloSeconds.
struct Greeting {
  net::Socket socket;
  std::string from;
  std::vector<uint8_t> bytes;
  net::Deadline deadline;
};
constexpr double kHelloSeconds = 30;

// Ranks that have said hello, grouped by job until all of a job's ranks have. A forming job is
// dropped (its connections closed) when one of them closes, or after kFormSeconds: the ranks register
// once they have all joined their communicator, each within its join deadline, so a job still short
// of a rank by then will not form, and would hold its connections forever.
struct Forming {
  int nranks = 0, index = 0;
  std::vector<net::Socket> sockets;
  std::vector<AggregatorHello> hellos;
  std::vector<bool> seen;
  net::Deadline deadline;
};
constexpr double kFormSeconds = 600;

// A connection that is readable has closed: ranks send nothing after their hello.
bool closed(net::Socket& s) {
  char byte;
  try {
    return s.read_some(&byte, 1) == 0;
  } catch (const Error&) {
    return true;
  }
}

// An accept that failed (out of descriptors, buffers or memory: EMFILE, ENFILE, ENOBUFS, ENOMEM) is
// retried after this long, the jobs served meanwhile: the daemon's other jobs are no reason to end it.
constexpr double kAcceptBackoffSeconds = 0.1;

// The job's buffers and transport are made from a hello's numbers and address: what would make them
// unusable, or abort the daemon, is refused ("" when the hello fits). A rank asks for its chunk plus
// 64 bytes (src/comm.cc): fewer could not hold a chunk's 8-byte header, and more than kMaxMessage
// would have every posted receive and slot allocate it. The UCX worker address cannot be checked
// beyond its size: UCX unpacks it only in ucp_ep_create, which asserts (aborting the process) on
// garbage rather than failing; an address is a packed header and at least one transport's, never
// as small as kMinAddress.
constexpr uint64_t kMinMessage = 64;
constexpr uint64_t kMaxMessage = uint64_t{1} << 30;
constexpr size_t kMinAddress = 16;

std::string unfit(const AggregatorHello& h) {
  if (h.max_message < kMinMessage || h.max_message > kMaxMessage)
    return "a largest message of " + std::to_string(h.max_message) + " bytes is out of range [" +
           std::to_string(kMinMessage) + ", " + std::to_string(kMaxMessage) + "]";
  // The daemon talks as transport rank nranks + index, which the tag layout must hold.
  if (h.index >= transport::UcxTransport::kMaxRanks - h.nranks)
    return "aggregator index " + std::to_string(h.index) + " of a job of " + std::to_string(h.nranks) +
           " ranks is past the transport's " + std::to_string(transport::UcxTransport::kMaxRanks) + " ranks";
  if (h.address.size() < kMinAddress)
    return "a " + std::to_string(h.address.size()) + "-byte UCX worker address is too short to be one";
  return "";
}

void refuse(net::Socket& s, const std::string& why) {
  AggregatorReply reply;
  reply.status = 1;
  reply.message = why;
  try {
    send_frame(s, reply.serialize(), net::Deadline::after(5));
  } catch (const Error&) {
  }
}

}  // namespace

int run_aggregator_daemon(const AggregatorDaemonOptions& o) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  const int sigfd = signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
  signal(SIGPIPE, SIG_IGN);

  net::Socket listener = net::Socket::listen(net::Address::parse(o.listen, "--listen"));
  // Port 0 chose a port the user needs to know; otherwise only --verbose says it.
  if (o.verbose || net::Address::parse(o.listen, "--listen").port() == 0)
    std::fprintf(stderr, "qccl_aggregator: listening on %s\n", listener.local_address().to_string().c_str());
  std::map<uint64_t, Forming> forming;
  std::vector<Greeting> greetings;
  std::vector<std::unique_ptr<Job>> jobs;
  long ended = 0;
  net::Deadline accept_paused;  // while accept_failing: when to try again
  bool accept_failing = false;
  // A rank's hello, read whole: the rank joins its job, which forms once all its ranks have.
  auto registration = [&](net::Socket s, const std::vector<uint8_t>& frame, const std::string& from) {
    const AggregatorHello hello = AggregatorHello::parse(frame, from);
    if (const std::string bad = unfit(hello); !bad.empty()) {
      refuse(s, bad);
      std::fprintf(stderr, "qccl_aggregator: registration from %s: %s\n", from.c_str(), bad.c_str());
      return;
    }
    Forming& f = forming[hello.job];
    if (f.seen.empty()) {
      f.nranks = hello.nranks, f.index = hello.index;
      f.seen.assign(static_cast<size_t>(hello.nranks), false);
      f.hellos.resize(static_cast<size_t>(hello.nranks));
      f.sockets.resize(static_cast<size_t>(hello.nranks));
      f.deadline = net::Deadline::after(kFormSeconds);
    }
    if (f.nranks != hello.nranks || f.index != hello.index) {
      refuse(s, "the job's other ranks said " + std::to_string(f.nranks) + " ranks and aggregator " +
                    std::to_string(f.index) + "; this one " + std::to_string(hello.nranks) + " and " +
                    std::to_string(hello.index));
      return;
    }
    if (f.seen[static_cast<size_t>(hello.rank)]) {
      refuse(s, "rank " + std::to_string(hello.rank) + " of this job registered already");
      return;
    }
    f.seen[static_cast<size_t>(hello.rank)] = true;
    f.hellos[static_cast<size_t>(hello.rank)] = hello;
    f.sockets[static_cast<size_t>(hello.rank)] = std::move(s);
    if (std::find(f.seen.begin(), f.seen.end(), false) != f.seen.end()) return;
    Forming formed = std::move(f);
    forming.erase(hello.job);  // formed or failed, it is no longer forming
    jobs.push_back(std::make_unique<Job>(std::move(formed.sockets), std::move(formed.hellos), o));
    if (o.verbose)
      std::fprintf(stderr, "qccl_aggregator: job %016llx of %d ranks formed (aggregator %d)\n",
                   static_cast<unsigned long long>(jobs.back()->id()), jobs.back()->nranks(), hello.index);
  };
  for (;;) {
    bool moved = false;
    for (size_t j = 0; j < jobs.size(); ++j) {
      try {
        moved |= jobs[j]->progress();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "qccl_aggregator: job %016llx: %s; dropping it\n",
                     static_cast<unsigned long long>(jobs[j]->id()), e.what());
        jobs.erase(jobs.begin() + static_cast<long>(j)), ++ended;
        break;
      }
    }
    if (o.jobs && ended >= o.jobs) return 0;
    if (moved) continue;

    // Nothing moved: block until a socket, a signal or a UCX worker has something.
    const bool accepting = !accept_failing || accept_paused.expired();
    std::vector<pollfd> fds = {{listener.fd(), static_cast<short>(accepting ? POLLIN : 0), 0}, {sigfd, POLLIN, 0}};
    bool armed = true;
    for (auto& job : jobs) {
      armed &= job->transport().arm();
      fds.push_back({job->transport().event_fd(), POLLIN, 0});
      for (net::Socket& s : job->sockets()) fds.push_back({s.fd(), POLLIN, 0});
    }
    for (auto& [id, f] : forming)
      for (net::Socket& s : f.sockets)
        if (s.valid()) fds.push_back({s.fd(), POLLIN, 0});
    const size_t first_greeting = fds.size();
    for (const Greeting& g : greetings) fds.push_back({g.socket.fd(), POLLIN, 0});
    if (!armed) continue;  // events arrived meanwhile
    if (poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) {
      std::perror("qccl_aggregator: poll");
      return 1;
    }
    if (fds[1].revents) {
      if (o.verbose) std::fprintf(stderr, "qccl_aggregator: stopping (signal)\n");
      return 0;
    }
    // A registration connection that is readable has closed (ranks send nothing after the hello).
    for (size_t j = 0; j < jobs.size(); ++j) {
      bool ended_here = false;
      for (net::Socket& s : jobs[j]->sockets()) ended_here |= closed(s);
      if (ended_here) {
        if (o.verbose)
          std::fprintf(stderr, "qccl_aggregator: job %016llx of %d ranks ended\n",
                       static_cast<unsigned long long>(jobs[j]->id()), jobs[j]->nranks());
        jobs.erase(jobs.begin() + static_cast<long>(j--));
        ++ended;
      }
    }
    for (auto it = forming.begin(); it != forming.end();) {
      bool drop = it->second.deadline.expired();
      for (net::Socket& s : it->second.sockets) drop |= s.valid() && closed(s);
      if (drop) {
        std::fprintf(stderr, "qccl_aggregator: job %016llx dropped while forming: a rank's connection closed, or "
                     "not all %d ranks registered within %.0f s\n", static_cast<unsigned long long>(it->first),
                     it->second.nranks, kFormSeconds);
        it = forming.erase(it);  // closes the connections of the ranks that registered
      } else {
        ++it;
      }
    }
    // Hellos: what arrived of each, whole ones registered; the silent dropped at their deadline.
    for (size_t i = greetings.size(); i-- > 0;) {
      Greeting& g = greetings[i];
      bool done = false;
      try {
        if (fds[first_greeting + i].revents) {
          uint8_t chunk[4096];
          long n = 0;
          while ((n = g.socket.read_some(chunk, sizeof chunk)) > 0) g.bytes.insert(g.bytes.end(), chunk, chunk + n);
          if (n == 0) fail(qcclRemoteError, "%s closed the connection before its hello", g.from.c_str());
        }
        std::vector<uint8_t> frame;
        if (take_frame(g.bytes, &frame, g.from)) {
          registration(std::move(g.socket), frame, g.from);
          done = true;
        } else if (g.deadline.expired()) {
          fail(qcclTimeout, "%s sent no whole hello within %.0f s", g.from.c_str(), kHelloSeconds);
        }
      } catch (const std::exception& e) {  // a bad hello, or one that cannot be held: that client alone
        std::fprintf(stderr, "qccl_aggregator: registration from %s: %s\n", g.from.c_str(), e.what());
        done = true;
      }
      if (done) greetings.erase(greetings.begin() + static_cast<long>(i));
    }
    if (!(fds[0].revents & POLLIN)) continue;
    net::Socket s;
    try {
      s = listener.accept(net::Deadline::after(0.001));
      accept_failing = false;
    } catch (const Error& e) {  // only ever temporary: the listener itself stays good
      if (!accept_failing) std::fprintf(stderr, "qccl_aggregator: %s; retrying\n", e.what());
      accept_failing = true;
      accept_paused = net::Deadline::after(kAcceptBackoffSeconds);
      continue;
    }
    if (!s.valid()) continue;
    const std::string from = s.peer_address().to_string();
    greetings.push_back(Greeting{std::move(s), from, {}, net::Deadline::after(kHelloSeconds)});
  }
}

}  // namespace qccl
