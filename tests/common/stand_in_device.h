// A host stand-in for a GPU (src/device.h), strict enough that the device executor's scheduling
// bugs show up as wrong bits or crashes on a CPU:
//   - device memory is mapped PROT_NONE except while the stand-in runs its own queued work, so the
//     host touching it (reading a kernel's output too early, writing a received message straight
//     into it) faults;
//   - every operand of a launched step must lie inside this device's memory (a residual left in host
//     memory, another rank's buffer: the test fails with the step named);
//   - queued work runs only when the test says (run_some, a seeded random number of items at a time),
//     so the stream lags behind the host as a real one does, and a ticket polled too early is seen
//     as not reached;
//   - the numerics are the host executor's own (run_data_step, and for the step kernels' device
//     form, collectives/device_kernels.h, the host's element functions), so the device executor
//     must give the host executor's bits exactly;
//   - StandInWire is NCCL point-to-point among the stand-ins of a test (StandInFabric): a group of
//     transfers is posted when the stream reaches it, a transfer completes only once its peer posted
//     the match (the k-th send from a to b with b's k-th receive from a, of the same length, else the
//     test fails), and the stream waits for its whole group, so a schedule that NCCL would deadlock
//     deadlocks here too.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/convert.h"
#include "kernels/fft_sparse.h"
#include "kernels/intsgd.h"
#include "kernels/marsit.h"
#include "src/device.h"
#include "src/executor.h"

namespace qccl::test {

class StandInFabric;

class StandInDevice final : public Device {
 public:
  explicit StandInDevice(uint64_t seed = 1) : rng_(seed) {}
  ~StandInDevice() override {
    for (auto& [p, bytes] : device_) munmap(reinterpret_cast<void*>(p), bytes);
    for (auto& [p, bytes] : pinned_) munmap(reinterpret_cast<void*>(p), bytes);
  }

  std::string describe() const override { return "a host stand-in device"; }

  void* allocate(Memory kind, size_t bytes) override {
    if (bytes == 0) throw std::logic_error("stand-in device: an allocation of zero bytes");
    const size_t mapped = round_up(bytes);
    void* p = mmap(nullptr, mapped, kind == Memory::kDevice ? PROT_NONE : PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("stand-in device: mmap failed");
    (kind == Memory::kDevice ? device_ : pinned_)[reinterpret_cast<uintptr_t>(p)] = mapped;
    ++allocations_;
    return p;
  }
  void release(Memory kind, void* p) override {
    auto& map = kind == Memory::kDevice ? device_ : pinned_;
    auto it = map.find(reinterpret_cast<uintptr_t>(p));
    if (it == map.end()) throw std::logic_error("stand-in device: release of memory it did not allocate");
    munmap(p, it->second);
    map.erase(it);
  }

  void launch(const coll::Step& step, const coll::CollArgs& args, unsigned long long* nonfinite) override {
    check_operands(step, args);
    require_device(nonfinite, sizeof *nonfinite, "the non-finite counter");
    coll::Step queued = step;
    if (auto* e = std::get_if<coll::step::Encode>(&queued); e && e->length) {
      // As the CUDA device: the length is known on the host when the step is enqueued.
      if (e->codec->variable_length()) throw std::logic_error("stand-in device: a variable-length encode");
      *e->length = e->codec->encoded_bytes(e->count);
      e->length = nullptr;
    }
    enqueue([queued, args, nonfinite] {
      *nonfinite += run_data_step(queued, args);
      return true;
    });
  }
  // The step kernels' device form: the host's functions, queued, on operands that must be device
  // memory; counters and taint words too.
  void int_encode(int bits, const float* x, size_t n, float alpha, bool stochastic, kernels::IntClip clip,
                  const kernels::PhiloxKey& key, uint64_t first, void* out, unsigned long long* clipped,
                  unsigned long long* nonfinite) override {
    require_device(x, n * sizeof(float), "int_encode's input");
    require_device(out, n * static_cast<size_t>(bits / 8), "int_encode's output");
    require_device(clipped, sizeof *clipped, "int_encode's clip counter");
    require_device(nonfinite, sizeof *nonfinite, "int_encode's taint word");
    enqueue([=] {
      const kernels::IntEncodeReport report = kernels::int_encode(bits, x, n, alpha, stochastic, clip, key, first, out);
      *clipped += report.clipped;
      *nonfinite += report.nonfinite;
      return true;
    });
  }
  void int_add(int bits, const void* in, void* acc, size_t n) override {
    require_device(in, n * static_cast<size_t>(bits / 8), "int_add's input");
    require_device(acc, n * static_cast<size_t>(bits / 8), "int_add's sum");
    enqueue([=] {
      kernels::int_add(bits, in, acc, n);
      return true;
    });
  }
  void int_decode(int bits, const void* in, size_t n, double scale, float* out, const unsigned long long* taint,
                  bool tainted, coll::DeviceCounters* counters) override {
    require_device(in, n * static_cast<size_t>(bits / 8), "int_decode's input");
    require_device(out, n * sizeof(float), "int_decode's output");
    require_device(taint, sizeof *taint, "int_decode's taint word");
    require_device(counters, sizeof *counters, "int_decode's counters");
    enqueue([=] {
      if (tainted || *taint) {
        std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
        counters->nonfinite += n;
        return true;
      }
      kernels::int_decode(bits, in, n, scale, out);
      kernels::IntSums sums;
      sums.squares_lo = counters->squares_lo, sums.squares_hi = counters->squares_hi;
      sums.max_abs = static_cast<uint32_t>(counters->max_abs);
      kernels::int_accumulate_sums(bits, in, n, &sums);
      counters->squares_lo = sums.squares_lo, counters->squares_hi = sums.squares_hi, counters->max_abs = sums.max_abs;
      return true;
    });
  }
  void pack_signs(const float* u, kernels::Compensation c, size_t first, size_t n, uint32_t* words, float* backup,
                  unsigned long long* nonfinite) override {
    require_device(u, n * sizeof(float), "pack_signs's input");
    require_compensation(c, first, n, "pack_signs");
    require_device(words, (n + 31) / 32 * sizeof(uint32_t), "pack_signs's words");
    if (backup) require_device(backup, n * sizeof(float), "pack_signs's backup");
    require_device(nonfinite, sizeof *nonfinite, "pack_signs's taint word");
    enqueue([=] {
      *nonfinite += kernels::pack_signs(u, &c, first, n, words, backup);
      return true;
    });
  }
  void merge_signs(const uint32_t* a, const uint32_t* s, uint32_t* out, size_t nwords, uint32_t k,
                   const kernels::PhiloxKey& key, uint64_t first_word) override {
    require_device(a, nwords * sizeof(uint32_t), "merge_signs's incoming words");
    require_device(s, nwords * sizeof(uint32_t), "merge_signs's own words");
    require_device(out, nwords * sizeof(uint32_t), "merge_signs's output");
    enqueue([=] {
      kernels::merge_signs(a, s, out, nwords, k, key, first_word);
      return true;
    });
  }
  void decode_signs(const uint32_t* words, size_t n, float eta, float* g, kernels::Compensation c, size_t first,
                    const float* backup, const unsigned long long* taint, bool tainted,
                    unsigned long long* nonfinite) override {
    require_device(words, (n + 31) / 32 * sizeof(uint32_t), "decode_signs's words");
    require_device(g, n * sizeof(float), "decode_signs's output");
    require_compensation(c, first, n, "decode_signs");
    require_device(backup, n * sizeof(float), "decode_signs's backup");
    require_device(taint, sizeof *taint, "decode_signs's taint word");
    require_device(nonfinite, sizeof *nonfinite, "decode_signs's counter");
    enqueue([=] {
      if (tainted || *taint) {
        std::fill(g, g + n, std::numeric_limits<float>::quiet_NaN());
        std::memcpy(c.stored + first, backup, n * sizeof(float));
        *nonfinite += n;
      } else {
        kernels::decode_signs(words, n, eta, g, &c, first);
      }
      return true;
    });
  }
  void add_compensation(const float* x, kernels::Compensation c, size_t first, size_t n, float* out) override {
    if (x) require_device(x, n * sizeof(float), "add_compensation's input");
    require_compensation(c, first, n, "add_compensation");
    require_device(out, n * sizeof(float), "add_compensation's output");
    enqueue([=] {
      kernels::add_compensation(x, c, first, n, out);
      return true;
    });
  }
  void reset_compensation(const float* g, kernels::Compensation c, size_t first, size_t n,
                          unsigned long long* nonfinite) override {
    require_device(g, n * sizeof(float), "reset_compensation's input");
    require_compensation(c, first, n, "reset_compensation");
    require_device(nonfinite, sizeof *nonfinite, "reset_compensation's counter");
    enqueue([=] {
      *nonfinite += kernels::reset_compensation(g, c, first, n);
      return true;
    });
  }
  // The fft codec: the host's (so a device execution must give the host's bits).
  bool runs_fft() const override { return true; }
  const char* fft_library() const override { return kernels::fft_backend(); }
  void fft_encode(const kernels::CodecConfig& c, const float* in, size_t count, void* out, size_t* length,
                  float* residual, coll::DeviceCounters* counters) override {
    require_device(in, count * sizeof(float), "fft_encode's input");
    require_device(out, c.encoded_bytes(count), "fft_encode's payload capacity");
    require_device(length, sizeof *length, "fft_encode's length");
    if (residual) require_device(residual, count * sizeof(float), "fft_encode's residual");
    require_device(counters, sizeof *counters, "fft_encode's counters");
    enqueue([=, codec = c] {
      const kernels::FftWorkspaceHandle ws = kernels::take_fft_workspace();
      const kernels::FftReport report = kernels::fft_encode(codec, in, count, out, *ws, residual);
      *length = report.bytes;
      counters->clamped += report.clamped;
      return true;
    });
  }
  void fft_add_spectrum(const kernels::CodecConfig& c, const void* in, const size_t* length, size_t count,
                        float* spectrum, bool accumulate) override {
    require_device(in, c.encoded_bytes(count), "fft_add_spectrum's payload capacity");
    require_device(length, sizeof *length, "fft_add_spectrum's length");
    require_device(spectrum, kernels::fft_spectrum_floats(c, count) * sizeof(float), "fft_add_spectrum's spectrum");
    enqueue([=, codec = c] {
      const kernels::FftWorkspaceHandle ws = kernels::take_fft_workspace();
      kernels::fft_decode_spectrum(codec, in, *length, count, spectrum, accumulate, *ws);
      return true;
    });
  }
  void fft_synthesize(const kernels::CodecConfig& c, const float* spectrum, size_t count, float* out) override {
    require_device(spectrum, kernels::fft_spectrum_floats(c, count) * sizeof(float), "fft_synthesize's spectrum");
    require_device(out, count * sizeof(float), "fft_synthesize's output");
    enqueue([=, codec = c] {
      const kernels::FftWorkspaceHandle ws = kernels::take_fft_workspace();
      kernels::fft_synthesize(codec, spectrum, count, out, *ws);
      return true;
    });
  }
  void fft_restore_residual(const kernels::CodecConfig& c, const float* saved, const float* sum, size_t count,
                            float* residual) override {
    require_device(saved, count * sizeof(float), "fft_restore_residual's saved residual");
    require_device(sum, count * sizeof(float), "fft_restore_residual's sum");
    require_device(residual, count * sizeof(float), "fft_restore_residual's residual");
    enqueue([=, codec = c] {
      kernels::fft_restore_residual(codec, saved, sum, count, residual);
      return true;
    });
  }
  void store_float(kernels::DataType type, const float* in, void* out, size_t n) override {
    require_device(in, n * sizeof(float), "store_float's input");
    require_device(out, n * kernels::element_size(type), "store_float's output");
    enqueue([=] {
      kernels::store_float(type, in, out, n);
      return true;
    });
  }
  void write_bytes(void* dst, const void* bytes, size_t n) override {
    require_device(dst, n, "write_bytes's destination");
    if (n > 16) throw std::logic_error("stand-in device: write_bytes of more than 16 bytes");
    std::array<uint8_t, 16> copy{};
    std::memcpy(copy.data(), bytes, n);
    enqueue([=] {
      std::memcpy(dst, copy.data(), n);
      return true;
    });
  }
  void add_counter(unsigned long long* acc, const unsigned long long* add) override {
    require_device(acc, sizeof *acc, "add_counter's sum");
    require_device(add, sizeof *add, "add_counter's operand");
    enqueue([=] {
      *acc += *add;
      return true;
    });
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (!known(dst, bytes) || !known(src, bytes))
      throw std::logic_error("stand-in device: a copy from or to memory it does not know");
    enqueue([dst, src, bytes] {
      std::memcpy(dst, src, bytes);
      return true;
    });
  }
  void zero(void* dst, size_t bytes) override {
    require_device(dst, bytes, "zero");
    enqueue([dst, bytes] {
      std::memset(dst, 0, bytes);
      return true;
    });
  }
  Ticket record() override { return enqueued_; }
  bool reached(Ticket ticket) override { return done_ >= ticket; }
  void synchronize() override {
    while (run_some(~size_t{0})) {
    }
  }
  bool busy() override { return !queue_.empty(); }
  int event_fd() override { return -1; }  // its queue moves only when the test runs it
  bool arm() override { return !busy(); }
  Mark mark(void* stream) override {
    last_stream_ = stream;
    open_marks_.insert(++marks_);
    return marks_;
  }
  void wait(Mark mark) override {
    if (!open_marks_.erase(mark)) throw std::logic_error("stand-in device: a wait for an unknown or used mark");
    ++waits_;
  }
  void forget(Mark mark) override {
    if (!open_marks_.erase(mark)) throw std::logic_error("stand-in device: forget of an unknown or used mark");
  }
  void signal(void* stream) override {
    ++signals_;
    last_stream_ = stream;
  }
  bool capturing(void*) override { return false; }  // the stand-in's streams record no graphs
  void* native_stream() override { return this; }
  std::string uuid() override { return "stand-in " + std::to_string(reinterpret_cast<uintptr_t>(this)); }
  int ordinal() const override { return 0; }

  // The test's side. Runs up to `limit` queued items (a random number from 0 to 3 by default),
  // stopping at one that cannot complete yet (a transfer group whose peers have not posted); true
  // when it completed any.
  bool run_some(size_t limit = 0) {
    if (limit == 0) limit = std::uniform_int_distribution<size_t>(0, 3)(rng_);
    size_t ran = 0;
    while (ran < limit && !queue_.empty()) {
      unprotect(true);
      const bool completed = queue_.front()();
      unprotect(false);
      if (!completed) break;
      queue_.pop_front();
      ++done_;
      ++ran;
    }
    return ran > 0;
  }
  // Work on the stream, in order: `work` returns false while it cannot complete (it is run again).
  void enqueue(std::function<bool()> work) {
    queue_.push_back(std::move(work));
    ++enqueued_;
  }
  void unprotect(bool on) {
    for (auto& [p, bytes] : device_) mprotect(reinterpret_cast<void*>(p), bytes, on ? PROT_READ | PROT_WRITE : PROT_NONE);
  }
  void require_device(const void* p, size_t bytes, const std::string& what) const {
    if (bytes && !inside(device_, p, bytes))
      throw std::logic_error("stand-in device: " + what + " is not in this device's memory");
  }
  // A compensation's values first .. first + n - 1 and their words.
  void require_compensation(const kernels::Compensation& c, size_t first, size_t n, const std::string& what) const {
    require_device(c.stored + first, n * sizeof(float), what + "'s compensation values");
    const size_t words = (first + n + 31) / 32 - first / 32;
    require_device(c.words + first / 32, words * sizeof(uint32_t), what + "'s compensation words");
    require_device(c.eta + first / 32, words * sizeof(float), what + "'s compensation eta");
  }
  // Synchronous copies between the test's host memory and device memory.
  void upload(void* dst, const void* src, size_t bytes) {
    require_device(dst, bytes, "upload");
    unprotect(true);
    std::memcpy(dst, src, bytes);
    unprotect(false);
  }
  void download(void* dst, const void* src, size_t bytes) {
    require_device(src, bytes, "download");
    unprotect(true);
    std::memcpy(dst, src, bytes);
    unprotect(false);
  }
  size_t allocations() const { return allocations_; }  // made so far
  size_t live_allocations() const { return device_.size() + pinned_.size(); }
  int waits() const { return waits_; }
  size_t open_marks() const { return open_marks_.size(); }
  int signals() const { return signals_; }
  void* last_stream() const { return last_stream_; }

 private:
  static size_t round_up(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return (bytes + page - 1) / page * page;
  }
  static bool inside(const std::map<uintptr_t, size_t>& map, const void* p, size_t bytes) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = map.upper_bound(a);
    if (it == map.begin()) return false;
    --it;
    return a >= it->first && a + bytes <= it->first + it->second;
  }
  bool known(const void* p, size_t bytes) const { return inside(device_, p, bytes) || inside(pinned_, p, bytes); }
  // Every pointer a step's kernel would touch, with its extent.
  void check_operands(const coll::Step& step, const coll::CollArgs& args) const {
    namespace st = coll::step;
    const size_t es = args.element_size();
    auto need = [&](const void* p, size_t bytes, const char* what) {
      require_device(p, bytes, std::string("step ") + std::to_string(step.index()) + "'s " + what);
    };
    std::visit(
        [&](const auto& s) {
          using S = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<S, st::Reduce>) {
            need(s.a, s.count * es, "a"), need(s.b, s.count * es, "b"), need(s.dst, s.count * es, "dst");
          } else if constexpr (std::is_same_v<S, st::Copy>) {
            need(s.src, s.bytes, "src"), need(s.dst, s.bytes, "dst");
          } else if constexpr (std::is_same_v<S, st::Average>) {
            need(s.buf, s.count * es, "buf");
          } else if constexpr (std::is_same_v<S, st::Load>) {
            need(s.src, s.count * es, "src"), need(s.dst, s.count * 4, "dst");
          } else if constexpr (std::is_same_v<S, st::Store>) {
            need(s.src, s.count * 4, "src"), need(s.dst, s.count * es, "dst");
          } else if constexpr (std::is_same_v<S, st::AddFloat>) {
            need(s.src, s.count * 4, "src"), need(s.dst, s.count * 4, "dst");
          } else if constexpr (std::is_same_v<S, st::Divide>) {
            need(s.dst, s.count * 4, "dst");
          } else if constexpr (std::is_same_v<S, st::Encode>) {
            need(s.src, s.count * 4, "src"), need(s.dst, s.codec->encoded_bytes(s.count), "dst");
          } else if constexpr (std::is_same_v<S, st::DecodeAdd>) {
            need(s.src, s.codec->encoded_bytes(s.count), "src"), need(s.dst, s.count * 4, "dst");
          } else if constexpr (std::is_same_v<S, st::DecodeOut>) {
            need(s.src, s.codec->encoded_bytes(s.count), "src"), need(s.dst, s.count * es, "dst");
            if (args.dtype != kernels::DataType::kFloat32) need(s.scratch, s.count * 4, "scratch");
          } else if constexpr (std::is_same_v<S, st::ErrorFeedback>) {
            need(s.residual, s.count * 4, "residual"), need(s.acc, s.count * 4, "acc");
            need(s.encoded, s.codec->encoded_bytes(s.count), "encoded");
          } else {
            throw std::logic_error("stand-in device: step " + std::to_string(step.index()) + " is not a data step");
          }
        },
        step);
  }

  std::mt19937_64 rng_;
  std::map<uintptr_t, size_t> device_, pinned_;
  std::deque<std::function<bool()>> queue_;
  Ticket enqueued_ = 0, done_ = 0;
  size_t allocations_ = 0;
  int waits_ = 0, signals_ = 0;
  Mark marks_ = 0;
  std::set<Mark> open_marks_;
  void* last_stream_ = nullptr;
};

// NCCL's matching among the stand-in devices of a test (one per rank).
class StandInFabric {
 public:
  struct Transfer {
    StandInDevice* device;
    void* data;
    size_t bytes;
    bool done = false;
  };
  explicit StandInFabric(int nranks) : nranks_(nranks), sends_(nranks * nranks), recvs_(nranks * nranks) {}
  void post_send(int from, int to, const std::shared_ptr<Transfer>& t) {
    sends_[channel(from, to)].push_back(t);
    match(from, to);
  }
  void post_recv(int from, int to, const std::shared_ptr<Transfer>& t) {
    recvs_[channel(from, to)].push_back(t);
    match(from, to);
  }
  bool idle() const {
    for (size_t c = 0; c < sends_.size(); ++c)
      if (!sends_[c].empty() || !recvs_[c].empty()) return false;
    return true;
  }

 private:
  size_t channel(int from, int to) const {
    if (from < 0 || to < 0 || from >= nranks_ || to >= nranks_)
      throw std::logic_error("stand-in wire: a transfer between ranks " + std::to_string(from) + " and " +
                             std::to_string(to));
    return static_cast<size_t>(from) * nranks_ + to;
  }
  void match(int from, int to) {
    auto& s = sends_[channel(from, to)];
    auto& r = recvs_[channel(from, to)];
    while (!s.empty() && !r.empty()) {
      Transfer& send = *s.front();
      Transfer& recv = *r.front();
      if (send.bytes != recv.bytes)
        throw std::logic_error("stand-in wire: rank " + std::to_string(from) + " sends " + std::to_string(send.bytes) +
                               " bytes where rank " + std::to_string(to) + " receives " + std::to_string(recv.bytes));
      send.device->unprotect(true);
      recv.device->unprotect(true);
      std::memcpy(recv.data, send.data, send.bytes);
      send.device->unprotect(false);
      recv.device->unprotect(false);
      send.done = recv.done = true;
      s.pop_front();
      r.pop_front();
    }
  }
  int nranks_;
  std::vector<std::deque<std::shared_ptr<Transfer>>> sends_, recvs_;  // per (from, to)
};

// One rank's end of the fabric, posting on its stand-in device's stream.
class StandInWire final : public PeerWire {
 public:
  StandInWire(StandInFabric& fabric, StandInDevice& device, int rank) : fabric_(fabric), device_(device), rank_(rank) {}
  std::string describe() const override { return "a stand-in of NCCL point-to-point"; }
  void group_start() override { ++depth_; }
  void group_end() override {
    if (depth_ == 0) throw std::logic_error("stand-in wire: group_end without group_start");
    if (--depth_ == 0) flush();
  }
  void send(int peer, const void* src, size_t bytes) override { add(true, peer, const_cast<void*>(src), bytes); }
  void recv(int peer, void* dst, size_t bytes) override { add(false, peer, dst, bytes); }
  void abort() override { ++aborts_; }
  bool aborted() const override { return aborts_ > 0; }
  size_t groups() const { return groups_; }

 private:
  struct Op {
    bool send;
    int peer;
    std::shared_ptr<StandInFabric::Transfer> transfer;
  };
  void add(bool send, int peer, void* data, size_t bytes) {
    device_.require_device(data, bytes, send ? "a send's source" : "a receive's destination");
    group_.push_back({send, peer, std::make_shared<StandInFabric::Transfer>(StandInFabric::Transfer{&device_, data, bytes})});
    if (depth_ == 0) flush();  // outside a group: a group of one, as NCCL
  }
  // The group becomes one item of the stream: posted when the stream reaches it, done when every
  // transfer in it is.
  void flush() {
    if (group_.empty()) return;
    // NCCL runs a group's transfers together, in no order: a receive into what a send of the same
    // group reads could overwrite it first.
    for (const Op& r : group_)
      for (const Op& w : group_) {
        if (r.send || !w.send) continue;
        const auto* dst = static_cast<const std::byte*>(r.transfer->data);
        const auto* src = static_cast<const std::byte*>(w.transfer->data);
        if (dst < src + w.transfer->bytes && src < dst + r.transfer->bytes)
          throw std::logic_error("stand-in wire: a group receives into the buffer one of its sends reads");
      }
    ++groups_;
    auto ops = std::make_shared<std::vector<Op>>(std::move(group_));
    group_.clear();
    auto posted = std::make_shared<bool>(false);
    StandInFabric* fabric = &fabric_;
    const int rank = rank_;
    device_.enqueue([ops, posted, fabric, rank] {
      if (!*posted) {
        *posted = true;
        for (const Op& op : *ops) {
          if (op.send) fabric->post_send(rank, op.peer, op.transfer);
          else fabric->post_recv(op.peer, rank, op.transfer);
        }
      }
      for (const Op& op : *ops)
        if (!op.transfer->done) return false;
      return true;
    });
  }
  StandInFabric& fabric_;
  StandInDevice& device_;
  int rank_;
  int depth_ = 0;
  std::vector<Op> group_;
  size_t groups_ = 0;
  int aborts_ = 0;
};

}  // namespace qccl::test
