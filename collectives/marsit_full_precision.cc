// Marsit's full-precision round (Alg. 2, every K-th step): the average of w = u + c over the ranks,
// by the ring all-reduce of allreduce_ring.cc run in place on recvbuf, and the compensation reset.
//
// Fragment f first writes w for its chunk of every segment into recvbuf (u may be recvbuf: each
// value is read once, before anything overwrites it), then runs the ring's reduce-scatter and
// allgather on recvbuf, and last sets c = 0 where the (identical on every rank) average is finite.
//
// Wire bytes per rank: 4 * sum over k of |seg(r-k-1)| + |seg(r-k)|, 2(n-1)/n * 4D when n divides D.
#include "collectives/marsit.h"
#include "collectives/ring.h"

namespace qccl::coll {

namespace {

class MarsitFullPrecision final : public Plan {
 public:
  MarsitFullPrecision(const CollArgs& args, const PlanOptions& options)
      : Plan(args), ring_(Ring::whole(args.rank, args.nranks)), segments_{args.count, args.nranks},
        chunk_(chunk_elements(options.chunk_bytes, sizeof(float), segments_.max_size())), steps_(args_) {}

  size_t fragments() const override { return ceil_div(segments_.max_size(), chunk_); }
  size_t scratch_bytes() const override { return chunk_ * sizeof(float); }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    const int n = ring_.size();
    const auto total = static_cast<uint32_t>(fragments());
    const auto* u = static_cast<const float*>(args_.sendbuf);
    auto* g = static_cast<float*>(args_.recvbuf);
    auto* incoming = reinterpret_cast<float*>(scratch);
    auto part = [&](int segment) { return piece(segments_.size(segment), chunk_, f); };
    auto at = [&](int segment) { return segments_.begin(segment) + part(segment).offset; };
    auto bytes = [&](int segment) { return part(segment).count * sizeof(float); };
    auto msg = [&](int step) { return static_cast<uint32_t>(step) * total + static_cast<uint32_t>(f); };

    for (int s = 0; s < n; ++s) steps_.add_compensation(p, g + at(s), u + at(s), at(s), part(s).count);  // w = u + c
    for (int k = 0; k < n - 1; ++k) {  // reduce-scatter
      const int s_send = ring_.position_at(-k - 1), s_recv = ring_.position_at(-k - 2);
      p.recv(0, ring_.prev(), msg(k), incoming, bytes(s_recv));
      p.send(1, ring_.next(), msg(k), g + at(s_send), bytes(s_send));
      p.wait(0);
      p.reduce(g + at(s_recv), incoming, g + at(s_recv), part(s_recv).count);
      p.wait(1);
    }
    const int own = ring_.position();
    p.average(g + at(own), part(own).count);
    for (int k = 0; k < n - 1; ++k) {  // allgather
      const int s_send = ring_.position_at(-k), s_recv = ring_.position_at(-k - 1);
      p.recv(0, ring_.prev(), msg(n - 1 + k), g + at(s_recv), bytes(s_recv));
      p.send(1, ring_.next(), msg(n - 1 + k), g + at(s_send), bytes(s_send));
      p.wait(0);
      p.wait(1);
    }
    for (int s = 0; s < n; ++s) steps_.reset_compensation(p, g + at(s), at(s), part(s).count);
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    marsit_links(args_, send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override {
    uint64_t elements = 0;
    for (int k = 0; k < ring_.size() - 1; ++k)
      elements += segments_.size(ring_.position_at(-k - 1)) + segments_.size(ring_.position_at(-k));
    return elements * sizeof(float);
  }

 private:
  Ring ring_;
  Segments segments_;
  size_t chunk_;
  MarsitSteps steps_;
};

}  // namespace

std::unique_ptr<Plan> make_marsit_full_precision(const CollArgs& args, const PlanOptions& options) {
  return std::make_unique<MarsitFullPrecision>(args, options);
}

}  // namespace qccl::coll
