// Marsit's sign round (Wu et al., DAC 2022, §4.1, Alg. 1) on an R x C grid of ranks: the ring all-
// reduce (R = 1, C = M) or the 2D-torus all-reduce of Mikami et al. (marsit.md §1.7), carrying one
// sign bit per value and merging bits at every reduce hop with the stochastic operator of sign.h.
//
// Rank r sits at row r / C, column r % C. The ceil(D / 32) words of sign bits are cut into C row
// segments and each of those into R cells (sizes differ by at most one word; no bit straddles a
// cell). Fragment f is word chunk f of every cell, so a row segment's part of fragment f is R pieces,
// stored back to back and sent as one message.
//
//   1. Row reduce-scatter (ring of the C ranks of a row): at step s = 0 .. C-2 a rank receives the
//      merged bits of s + 1 ranks for a row segment and merges in its own signs of w = u + c (packed
//      while the receive is in flight: they do not depend on it) with k = s + 2 contributions. Rank
//      (row, j) ends with row segment j merged over its row.
//   2. Column all-reduce of row segment j (ring of the R ranks of column j, on the R cells): the
//      reduce-scatter merges row aggregates, each standing for C ranks, so again k = s + 2; then an
//      allgather copies the final cells.
//   3. Row allgather of the final row segments.
//
// Unbiasedness: after a merge of k contributions each bit is 1 with probability (ones among the k) / k
// (sign.h), whatever order the hops took; in the torus a uniform choice within the row times a
// uniform choice among equal-weight rows is uniform over all M ranks. So every output bit is 1 with
// probability (ranks whose bit is 1) / M, and unanimous bits pass exactly. Every rank decodes the same
// final words: g = eta_s (2 b - 1), and c <- w - g (marsit.md §1.6): the pack leaves w in the
// compensation and the decode records the words (kernels/marsit.h, Compensation).
//
// Random bits: the merge of a word at hop k draws from Philox keyed by (seed, step t, k,
// phase << 10 | row or column, global word index), never by rank, so the bits are a pure function of
// the inputs and the grid, and host and device would agree.
//
// Wire bytes per rank: 4 * [sum over the row steps of the row segments' words (2(C-1) messages) +
// sum over the column steps of the cells' words (2(R-1) messages)] = 2(M-1)/M * 4 ceil(D/32) when the
// cells are all equal.
//
// Non-finite input: a NaN or Inf in w sets the fragment's taint, which rides with every later send
// of the fragment; the cell that held it travels through every rank, so every rank decodes that
// fragment to NaN, puts its c back (the stored values the pack replaced wait in scratch), and reports
// the same count.
#include "collectives/algorithms.h"
#include "collectives/marsit.h"
#include "collectives/ring.h"
#include "kernels/sign.h"

namespace qccl::coll {

namespace {

// Random streams: phase << 10 | row or column (< kMaxTorusSide), within Philox's 12 stream bits.
constexpr uint32_t kRowPhase = 1u << 10, kColumnPhase = 2u << 10;
static_assert(kernels::kMaxTorusSide <= 1 << 10);

class AllReduceMarsit final : public Plan {
 public:
  AllReduceMarsit(const CollArgs& args, const PlanOptions& options)
      : Plan(args), rows_(args.codec->torus_rows ? args.codec->torus_rows : 1), cols_(args.nranks / rows_),
        row_(grid_row(args.rank, cols_)), column_(grid_column(args.rank, rows_, cols_)),
        row_segments_{kernels::sign_words(args.count), cols_}, steps_(args_) {
    const size_t largest_cell = Segments{row_segments_.max_size(), rows_}.max_size();
    chunk_ = std::max<size_t>(1, std::min(marsit_chunk_words(options.chunk_bytes, rows_), largest_cell));
  }

  size_t fragments() const override { return ceil_div(Segments{row_segments_.max_size(), rows_}.max_size(), chunk_); }
  // Word buffers of one row segment's part (R chunks): outgoing x2, incoming, local signs, this rank's
  // row aggregate, and the C final row segments (on a ring, this rank's is the aggregate); then the
  // backup of the compensation's stored values for the fragment's C row segments (32 floats a word),
  // put back if the fragment turns out tainted.
  size_t scratch_bytes() const override {
    return (5 + static_cast<size_t>(cols_)) * row_buffer_words() * 4 + backup_floats() * sizeof(float);
  }

  void build(size_t f, std::byte* scratch, Program& p) const override {
    p.clear();
    auto* words = reinterpret_cast<uint32_t*>(scratch);
    auto buffer = [&](size_t i) { return words + i * row_buffer_words(); };
    uint32_t* outgoing[2] = {buffer(0), buffer(1)};
    uint32_t* incoming = buffer(2);
    uint32_t* local = buffer(3);
    uint32_t* aggregate = buffer(4);
    // On a ring the row aggregate is final: no column phase.
    auto final_segment = [&](int j) { return rows_ == 1 && j == row_.position() ? aggregate : buffer(5 + static_cast<size_t>(j)); };
    auto* backup = reinterpret_cast<float*>(buffer(5 + static_cast<size_t>(cols_)));
    const Fragment fr{this, f};
    const auto total = static_cast<uint32_t>(fragments());
    uint32_t step = 0;  // message ids: one per ring step of any phase
    auto msg = [&] { return step++ * total + static_cast<uint32_t>(f); };
    const int col = row_.position(), row = column_.position(), C = cols_, R = rows_;
    const int row_next = row_.next(), row_prev = row_.prev();
    const int column_next = column_.next(), column_prev = column_.prev();

    // 1. Row reduce-scatter.
    pack_segment(p, fr, C == 1 ? aggregate : outgoing[0], row_.position_at(-1), backup);
    for (int s = 0; s < C - 1; ++s) {
      const int j_send = row_.position_at(-s - 1), j_recv = row_.position_at(-s - 2);
      const uint32_t id = msg();
      p.recv(0, row_prev, id, incoming, fr.segment_words(j_recv) * 4);
      p.send(1, row_next, id, outgoing[s % 2], fr.segment_words(j_send) * 4);
      pack_segment(p, fr, local, j_recv, backup);
      p.wait(0);
      uint32_t* merged = j_recv == col ? aggregate : outgoing[(s + 1) % 2];
      for (int i = 0; i < R; ++i) {
        const size_t at = fr.offset(j_recv, i);
        steps_.merge_signs(p, merged + at, incoming + at, local + at, fr.cell(j_recv, i).count, static_cast<uint32_t>(s + 2),
                      kRowPhase | static_cast<uint32_t>(row), fr.first_word(j_recv, i));
      }
      p.wait(1);
    }

    // 2. Column all-reduce of row segment `col`, cell by cell.
    uint32_t* mine = final_segment(col);
    for (int s = 0; s < R - 1; ++s) {
      const int i_send = column_.position_at(-s - 1), i_recv = column_.position_at(-s - 2);
      const uint32_t id = msg();
      const uint32_t* partial = s == 0 ? aggregate + fr.offset(col, i_send) : outgoing[s % 2];
      p.recv(0, column_prev, id, incoming, fr.cell(col, i_recv).count * 4);
      p.send(1, column_next, id, partial, fr.cell(col, i_send).count * 4);
      p.wait(0);
      uint32_t* merged = i_recv == row ? mine + fr.offset(col, row) : outgoing[(s + 1) % 2];
      steps_.merge_signs(p, merged, incoming, aggregate + fr.offset(col, i_recv), fr.cell(col, i_recv).count,
                    static_cast<uint32_t>(s + 2), kColumnPhase | static_cast<uint32_t>(col), fr.first_word(col, i_recv));
      p.wait(1);
    }
    for (int s = 0; s < R - 1; ++s) {
      const int i_send = column_.position_at(-s), i_recv = column_.position_at(-s - 1);
      const uint32_t id = msg();
      p.recv(0, column_prev, id, mine + fr.offset(col, i_recv), fr.cell(col, i_recv).count * 4);
      p.send(1, column_next, id, mine + fr.offset(col, i_send), fr.cell(col, i_send).count * 4);
      p.wait(0);
      p.wait(1);
    }

    // 3. Row allgather of the final row segments.
    for (int s = 0; s < C - 1; ++s) {
      const int j_send = row_.position_at(-s), j_recv = row_.position_at(-s - 1);
      const uint32_t id = msg();
      p.recv(0, row_prev, id, final_segment(j_recv), fr.segment_words(j_recv) * 4);
      p.send(1, row_next, id, final_segment(j_send), fr.segment_words(j_send) * 4);
      p.wait(0);
      p.wait(1);
    }

    // Decode after the last receive, when any taint has reached this rank.
    auto* g = static_cast<float*>(args_.recvbuf);
    for (int j = 0; j < C; ++j)
      for (int i = 0; i < R; ++i) {
        const Elements e = fr.elements(j, i);
        steps_.decode_signs(p, g + e.first, final_segment(j) + fr.offset(j, i), e.first, e.count, backup_of(backup, fr, j, i));
      }
  }

  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const override {
    marsit_links(args_, send_to, recv_from);
  }

  uint64_t wire_bytes_sent() const override {
    uint64_t words = 0;
    for (int s = 0; s < cols_ - 1; ++s)  // row reduce-scatter and allgather
      words += row_segments_.size(row_.position_at(-s - 1)) + row_segments_.size(row_.position_at(-s));
    const Segments cells{row_segments_.size(row_.position()), rows_};
    for (int s = 0; s < rows_ - 1; ++s)  // column reduce-scatter and allgather
      words += cells.size(column_.position_at(-s - 1)) + cells.size(column_.position_at(-s));
    return words * sizeof(uint32_t);
  }

  // What the uncompressed ring all-reduce sends: 4 bytes per value.
  uint64_t raw_wire_bytes() const override {
    const Ring ring = Ring::whole(args_.rank, args_.nranks);
    const Segments segments{args_.count, args_.nranks};
    uint64_t values = 0;
    for (int k = 0; k < ring.size() - 1; ++k)
      values += segments.size(ring.position_at(-k - 1)) + segments.size(ring.position_at(-k));
    return values * sizeof(float);
  }

 private:
  struct Elements {
    size_t first;
    size_t count;
  };

  // Fragment f's pieces of every cell, and where they sit in a row buffer.
  struct Fragment {
    const AllReduceMarsit* plan;
    size_t f;
    Segments cells(int j) const { return Segments{plan->row_segments_.size(j), plan->rows_}; }
    Piece cell(int j, int i) const { return piece(cells(j).size(i), plan->chunk_, f); }
    size_t first_word(int j, int i) const {
      return plan->row_segments_.begin(j) + cells(j).begin(i) + cell(j, i).offset;
    }
    size_t offset(int j, int i) const {  // in the row buffer: the pieces of cells 0 .. i-1 before it
      size_t at = 0;
      for (int q = 0; q < i; ++q) at += cell(j, q).count;
      return at;
    }
    size_t segment_words(int j) const { return offset(j, plan->rows_); }
    Elements elements(int j, int i) const {
      const size_t count = plan->args_.count;
      const size_t first = std::min(count, first_word(j, i) * 32);
      return Elements{first, std::min(count, (first_word(j, i) + cell(j, i).count) * 32) - first};
    }
  };

  // local = the signs of w = u + c for fragment f's part of row segment j; c's stored values become w,
  // the old ones go to the backup.
  void pack_segment(Program& p, const Fragment& fr, uint32_t* out, int j, float* backup) const {
    const auto* u = static_cast<const float*>(args_.sendbuf);
    for (int i = 0; i < rows_; ++i) {
      const Elements e = fr.elements(j, i);
      steps_.pack_signs(p, out + fr.offset(j, i), u + e.first, e.first, e.count, backup_of(backup, fr, j, i));
    }
  }

  // Where the values of fragment f's piece of cell (j, i) keep their backup: 32 floats per word of
  // the piece's place in the row buffers, row segment after row segment.
  float* backup_of(float* backup, const Fragment& fr, int j, int i) const {
    return backup + (static_cast<size_t>(j) * row_buffer_words() + fr.offset(j, i)) * 32;
  }
  size_t backup_floats() const { return static_cast<size_t>(cols_) * row_buffer_words() * 32; }
  size_t row_buffer_words() const { return chunk_ * static_cast<size_t>(rows_); }

  int rows_, cols_;
  Ring row_;     // this rank's row: position = its column
  Ring column_;  // this rank's column: position = its row
  Segments row_segments_;
  size_t chunk_;  // words per cell piece
  MarsitSteps steps_;
};

}  // namespace

void marsit_links(const CollArgs& args, std::vector<int>* send_to, std::vector<int>* recv_from) {
  if (args.nranks < 2) return;
  const int rows = args.codec->torus_rows ? args.codec->torus_rows : 1, cols = args.nranks / rows;
  // The ring, the row ring and the column ring (a row or column of one has no links).
  Ring::whole(args.rank, args.nranks).links(send_to, recv_from);
  grid_row(args.rank, cols).links(send_to, recv_from);
  grid_column(args.rank, rows, cols).links(send_to, recv_from);
}

const char* marsit_cannot_run(const CollArgs& args) {
  const kernels::CodecConfig* codec = args.codec;
  if (!codec || codec->kind != kernels::CodecKind::kSign) return "Marsit runs the sign codec only";
  if (args.dtype != DataType::kFloat32) return "Marsit takes float32 updates";
  if (args.op != RedOp::kAvg) return "Marsit's result estimates the average (op avg)";
  if (!args.method_call || !static_cast<const MarsitCall*>(args.method_call)->compensation.stored)
    return "Marsit needs a codec state (the compensation)";
  if (codec->torus_rows && codec->torus_rows * codec->torus_cols != args.nranks)
    return "the codec's torus does not have one place per rank";
  return nullptr;
}

const char* allreduce_marsit_cannot_run(const CollArgs& args) { return marsit_cannot_run(args); }

std::unique_ptr<Plan> make_allreduce_marsit(const CollArgs& args, const PlanOptions& options) {
  if (args.codec->full_precision_round(args.rng.step)) return make_marsit_full_precision(args, options);
  return std::make_unique<AllReduceMarsit>(args, options);
}

}  // namespace qccl::coll
