// Rank and index arithmetic shared by the algorithms, so that each algorithm file reads like its
// paper or textbook description (STYLE rule 5).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace qccl::coll {

// A ring of n ranks in rank order.
struct Ring {
  int rank;
  int n;
  int next() const { return (rank + 1) % n; }
  int prev() const { return (rank + n - 1) % n; }
  // The rank `offset` places along the ring from this one (offset may be negative).
  int at(int offset) const { return ((rank + offset) % n + n) % n; }
  // A ring plan's links (Plan::links): it sends to the next rank and receives from the previous one;
  // a ring of one has none.
  void links(std::vector<int>* send_to, std::vector<int>* recv_from) const {
    if (n < 2) return;
    send_to->push_back(next());
    recv_from->push_back(prev());
  }
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
