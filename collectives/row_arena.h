// Where a keyed store (aqsgd_store.h) keeps its rows: slots of a fixed size in blocks of memory, or in
// blocks of a file mapped into memory, for a store larger than memory (AQ-SGD keeps one row per
// training sample: 82 GB per direction for the paper's QNLI run), whose rows the kernel then pages
// in and out. Blocks are never moved, so a row's address holds until its slot is released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace qccl::coll {

// A file that could not be made, grown or mapped: what() names it and the system's reason.
struct RowArenaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class RowArena {
 public:
  // Rows of row_bytes (> 0) bytes, in memory, or (file not empty) in a new file at path `file`,
  // unlinked at once (reached through its descriptor; its space freed when the arena goes, or the
  // process ends). Throws RowArenaError when the file cannot be created, and when the path exists:
  // a user's file, a device or a link is never truncated, replaced or removed.
  RowArena(size_t row_bytes, const std::string& file);
  ~RowArena();
  RowArena(const RowArena&) = delete;
  RowArena& operator=(const RowArena&) = delete;

  const std::string& file() const { return file_; }
  // The file's size in bytes (0 in memory): the blocks it holds.
  size_t file_bytes() const;
  size_t live() const { return next_ - free_.size(); }
  // Room for n more rows than are live, so that the next allocate() calls up to that count cannot
  // fail, and release() after it allocates nothing. Throws RowArenaError (a file that cannot grow:
  // the disk is full) or std::bad_alloc.
  void reserve(size_t n);
  // A slot for one row (its bytes as they were left); reserve() must have made room.
  uint32_t allocate();
  void release(uint32_t slot);
  // Every slot released.
  void clear();
  uint8_t* row(uint32_t slot) { return blocks_[slot / rows_per_block_] + (slot % rows_per_block_) * row_bytes_; }
  const uint8_t* row(uint32_t slot) const {
    return blocks_[slot / rows_per_block_] + (slot % rows_per_block_) * row_bytes_;
  }
  // A file's rows that a call will read: the kernel starts reading their pages now (madvise), so
  // that a call's rows come from the disk in parallel, not one page fault at a time. Memory: nothing.
  void will_need(uint32_t slot) const;

 private:
  void add_block();

  size_t row_bytes_;
  size_t rows_per_block_;
  size_t block_bytes_;  // rows_per_block_ rows, rounded up to whole pages (a file block's mapping)
  std::string file_;
  int fd_ = -1;
  std::vector<uint8_t*> blocks_;
  std::vector<uint32_t> free_;  // released slots, reused first
  uint32_t next_ = 0;           // slots handed out at least once
};

}  // namespace qccl::coll
