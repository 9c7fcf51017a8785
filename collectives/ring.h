// Rank and index arithmetic shared by the algorithms, so that each algorithm file reads like its
// paper or textbook description (STYLE rule 5).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace qccl::coll {

// A ring over an ordered list of communicator ranks: position i holds rank members[i], and the ring
// runs position 0 -> 1 -> ... -> n-1 -> 0. The whole communicator in rank order is the special case
// members = 0 .. n-1 (Ring::whole); a sub-group (the ranks of one node, one rank per node, a torus
// row) is any other list, so that one plan can run over part of the communicator. Positions index
// the algorithm's blocks and segments; next(), prev(), at() and member() return communicator ranks,
// which is what a step's peer is.
class Ring {
 public:
  // `members` in ring order, distinct; `rank` must be one of them.
  Ring(std::vector<int> members, int rank)
      : members_(std::move(members)), n_(static_cast<int>(members_.size())), position_(position_of(rank)) {}
  // The whole communicator of `nranks` ranks in rank order, seen from `rank`.
  static Ring whole(int rank, int nranks) {
    std::vector<int> members(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; ++r) members[static_cast<size_t>(r)] = r;
    return Ring(std::move(members), rank);
  }

  int size() const { return n_; }
  int position() const { return position_; }  // this rank's
  int rank() const { return member(position_); }
  // The position `offset` places along the ring from this rank's (offset may be negative).
  int position_at(int offset) const { return ((position_ + offset) % n_ + n_) % n_; }
  // The communicator rank at a position (0 <= position < size()).
  int member(int position) const { return members_[static_cast<size_t>(position)]; }
  // The communicator rank `offset` places along the ring from this one.
  int at(int offset) const { return member(position_at(offset)); }
  int next() const { return at(1); }
  int prev() const { return at(-1); }
  // The position of communicator rank `rank`, or -1 when it is not a member.
  int position_of(int rank) const {
    const auto it = std::find(members_.begin(), members_.end(), rank);
    return it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
  }
  const std::vector<int>& members() const { return members_; }
  // A ring plan's links (Plan::links): it sends to the next rank and receives from the previous one;
  // a ring of one has none.
  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const {
    if (n_ < 2) return;
    send_to->push_back(next());
    recv_from->push_back(prev());
  }

 private:
  std::vector<int> members_;
  int n_;
  int position_;
};

// The rows and columns of an R x C grid of the communicator's ranks (rank r at row r / C, column
// r % C), as rings: a row's position is the column, a column's position is the row.
inline Ring grid_row(int rank, int cols) {
  std::vector<int> members(static_cast<size_t>(cols));
  for (int j = 0; j < cols; ++j) members[static_cast<size_t>(j)] = rank / cols * cols + j;
  return Ring(std::move(members), rank);
}
inline Ring grid_column(int rank, int rows, int cols) {
  std::vector<int> members(static_cast<size_t>(rows));
  for (int i = 0; i < rows; ++i) members[static_cast<size_t>(i)] = i * cols + rank % cols;
  return Ring(std::move(members), rank);
}

// A binomial tree over a ring's members rooted at the member `root_rank` (MPICH's binomial broadcast
// and reduce): with v = (position - the root's position) mod n, the parent is v - m for m the lowest set bit of v, and
// the children are v + m' for every power of two m' < m with v + m' < n. Parent and children are
// communicator ranks; children are listed smallest m' first (the order a reduce adds them in).
struct BinomialTree {
  int parent = -1;  // -1 at the root
  std::vector<int> children;

  BinomialTree(const Ring& members, int root_rank) {
    const int n = members.size(), root = members.position_of(root_rank);
    const int v = (members.position() - root + n) % n;
    auto rank_of = [&](int u) { return members.member((u + root) % n); };
    for (int mask = 1; mask < n; mask <<= 1) {
      if (v & mask) {
        parent = rank_of(v - mask);
        break;
      }
      if (v + mask < n) children.push_back(rank_of(v + mask));
    }
  }
};

// Recursive doubling's pairing over n ranks (Thakur, Rabenseifner and Gropp 2005, §4.1): with p the
// largest power of two <= n and rem = n - p, ranks below 2*rem fold in pairs (the even rank into the
// odd one, which stays active), and the p active ranks, numbered vr = 0 .. p-1, exchange with
// vr ^ mask for mask = 1, 2, ..., p/2 (exchange i uses mask 2^i). The all-reduce's plan runs it, and
// QCCL_CODEC=auto prices it message by message.
struct RecursiveDoubling {
  int pow2 = 1, rem = 0, rounds = 0;

  explicit RecursiveDoubling(int nranks) {
    while (pow2 * 2 <= nranks) pow2 *= 2, ++rounds;
    rem = nranks - pow2;
  }
  bool folds(int r) const { return r < 2 * rem; }  // one of a folding pair (either side)
  int fold_partner(int r) const { return r ^ 1; }
  bool active(int r) const { return !(folds(r) && r % 2 == 0); }
  // The partner of active rank r in exchange i.
  int partner(int r, int i) const { return real_rank(virtual_rank(r) ^ (1 << i)); }

 private:
  int virtual_rank(int r) const { return folds(r) ? r / 2 : r - rem; }
  int real_rank(int v) const { return v < rem ? v * 2 + 1 : v + rem; }
};

// count elements split into n segments whose sizes differ by at most one; segment i starts at
// begin(i). Independent of the chunk size, which is what makes results chunking-invariant.
struct Segments {
  size_t count;
  int n;
  size_t begin(int i) const {
    const size_t q = count / n, r = count % n;
    return q * i + std::min<size_t>(i, r);
  }
  size_t size(int i) const { return count / n + (static_cast<size_t>(i) < count % n ? 1 : 0); }
  size_t max_size() const { return count / n + (count % n ? 1 : 0); }
};

// Fragment f of a run of `size` elements cut into chunks of `chunk` elements (empty past the end).
struct Piece {
  size_t offset;
  size_t count;
};
inline Piece piece(size_t size, size_t chunk, size_t f) {
  const size_t begin = std::min(size, f * chunk);
  return Piece{begin, std::min(size, begin + chunk) - begin};
}

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Elements per chunk for a chunk size in bytes: at least one, and no more than the `run` of
// elements being chunked (so small calls do not reserve chunk-sized scratch).
inline size_t chunk_elements(size_t chunk_bytes, size_t element_size, size_t run) {
  return std::max<size_t>(1, std::min(chunk_bytes / element_size, run));
}

// Typed views of the user's buffers: element offsets to byte pointers.
struct Buffers {
  const char* in;
  char* out;
  size_t es;
  const char* src(size_t element) const { return in + element * es; }
  char* dst(size_t element) const { return out + element * es; }
};

}  // namespace qccl::coll
