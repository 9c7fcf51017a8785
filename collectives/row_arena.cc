#include "collectives/row_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace qccl::coll {

namespace {

// About this many bytes per block: large enough that a store of millions of rows has few blocks
// (a file's: few mappings), small enough that a small store does not hold much it does not use (a
// memory block's bytes count against the process whether or not its rows are used).
constexpr size_t kFileBlockBytes = size_t{16} << 20;
constexpr size_t kMemoryBlockBytes = size_t{1} << 20;
constexpr size_t kMaxSlots = 0xFFFFFFFFu;  // slots are uint32_t

std::string reason(const std::string& what, const std::string& file) {
  return what + " '" + file + "': " + std::strerror(errno);
}

}  // namespace

RowArena::RowArena(size_t row_bytes, const std::string& file) : row_bytes_(row_bytes), file_(file) {
  if (row_bytes_ == 0) throw std::invalid_argument("RowArena: rows of 0 bytes");
  rows_per_block_ = std::max<size_t>(1, (file_.empty() ? kMemoryBlockBytes : kFileBlockBytes) / row_bytes_);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  block_bytes_ = (rows_per_block_ * row_bytes_ + page - 1) / page * page;
  if (!file_.empty()) {
    // A new file, never an existing one (a user's file, another store's, a device: O_EXCL does not
    // follow a link either), removed from its directory at once: the store reaches it through the
    // descriptor alone, two stores given one path each have their own, and nothing is left behind,
    // not even after a crash.
    fd_ = open(file_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd_ < 0) throw RowArenaError(reason("cannot create the store's file", file_));
    if (unlink(file_.c_str()) != 0) {
      const std::string why = reason("cannot remove the store's file from its directory", file_);
      close(fd_);
      throw RowArenaError(why);
    }
  }
}

RowArena::~RowArena() {
  for (uint8_t* block : blocks_) {
    if (fd_ >= 0) munmap(block, block_bytes_);
    else delete[] block;
  }
  if (fd_ >= 0) close(fd_);  // the file's blocks go with its last descriptor and mapping
}

void RowArena::add_block() {
  if ((blocks_.size() + 1) * rows_per_block_ > kMaxSlots) throw RowArenaError("a store of 2^32 - 1 rows is full");
  blocks_.reserve(blocks_.size() + 1);  // so that the push_back below cannot throw and lose the block
  if (fd_ < 0) {
    blocks_.push_back(new uint8_t[block_bytes_]);
    return;
  }
  const off_t offset = static_cast<off_t>(blocks_.size() * block_bytes_);
  // posix_fallocate, not ftruncate: the blocks are the disk's now, so a full disk fails here, with
  // an error, and not later as a SIGBUS when a row is written (on file systems that write in place;
  // a copy-on-write one, btrfs or ZFS, may still run out later).
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
  free_.reserve(blocks_.size() * rows_per_block_);  // room for every slot: release() never allocates
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

size_t RowArena::file_bytes() const {
  struct stat st;
  return fd_ >= 0 && fstat(fd_, &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
}

void RowArena::will_need(uint32_t slot) const {
  if (fd_ < 0) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(row(slot)) / page * page;
  const auto end = reinterpret_cast<uintptr_t>(row(slot)) + row_bytes_;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);  // advice: its failure changes nothing
}

}  // namespace qccl::coll
