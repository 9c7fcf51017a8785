#include "collectives/row_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

namespace qccl::coll {

namespace {

// About this many bytes per block: large enough that a store of millions of rows has few blocks,
// small enough that a small store does not hold much it does not use.
constexpr size_t kBlockBytes = size_t{16} << 20;

std::string reason(const std::string& what, const std::string& file) {
  return what + " '" + file + "': " + std::strerror(errno);
}

}  // namespace

RowArena::RowArena(size_t row_bytes, const std::string& file) : row_bytes_(row_bytes), file_(file) {
  if (row_bytes_ == 0) throw std::invalid_argument("RowArena: rows of 0 bytes");
  rows_per_block_ = std::max<size_t>(1, kBlockBytes / row_bytes_);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  block_bytes_ = (rows_per_block_ * row_bytes_ + page - 1) / page * page;
  if (!file_.empty()) {
    // Checked before it is truncated: a device or a directory is not the store's to empty (or, as
    // the arena removes its file when it goes, to delete).
    struct stat st;
    if (stat(file_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      throw RowArenaError("the store's file '" + file_ + "' exists and is not a regular file");
    fd_ = open(file_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd_ < 0) throw RowArenaError(reason("cannot create the store's file", file_));
  }
}

RowArena::~RowArena() {
  for (uint8_t* block : blocks_) {
    if (fd_ >= 0) munmap(block, block_bytes_);
    else delete[] block;
  }
  if (fd_ >= 0) {
    close(fd_);
    unlink(file_.c_str());
  }
}

void RowArena::add_block() {
  if (blocks_.size() >= (size_t{1} << 32) / rows_per_block_) throw RowArenaError("a store of 2^32 rows is full");
  if (fd_ < 0) {
    blocks_.push_back(new uint8_t[block_bytes_]);
    return;
  }
  const off_t offset = static_cast<off_t>(blocks_.size() * block_bytes_);
  // posix_fallocate, not ftruncate: the blocks are the disk's now, so a full disk fails here, with
  // an error, and not later as a SIGBUS when a row is written.
  if (const int e = posix_fallocate(fd_, offset, static_cast<off_t>(block_bytes_)); e != 0) {
    errno = e;
    throw RowArenaError(reason("cannot grow the store's file", file_));
  }
  void* p = mmap(nullptr, block_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, offset);
  if (p == MAP_FAILED) throw RowArenaError(reason("cannot map the store's file", file_));
  blocks_.push_back(static_cast<uint8_t*>(p));
}

void RowArena::reserve(size_t n) {
  while (free_.size() + (blocks_.size() * rows_per_block_ - next_) < n) add_block();
}

uint32_t RowArena::allocate() {
  if (!free_.empty()) {
    const uint32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  if (next_ >= blocks_.size() * rows_per_block_) throw std::logic_error("RowArena::allocate without reserve");
  return next_++;
}

void RowArena::release(uint32_t slot) { free_.push_back(slot); }

void RowArena::clear() {
  free_.clear();
  next_ = 0;
}

void RowArena::will_need(uint32_t slot) const {
  if (fd_ < 0) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(row(slot)) / page * page;
  const auto end = reinterpret_cast<uintptr_t>(row(slot)) + row_bytes_;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);  // advice: its failure changes nothing
}

}  // namespace qccl::coll
