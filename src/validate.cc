#include "src/validate.h"

#include <cstdint>
#include <limits>

#include "base/errors.h"
#include "include/qccl.h"

namespace qccl {

static_assert(static_cast<int>(kernels::DataType::kBfloat16) == qcclBfloat16 &&
                  static_cast<int>(kernels::DataType::kFloat16) == qcclFloat16 &&
                  static_cast<int>(kernels::DataType::kUint64) == qcclUint64 && kernels::kNumDataTypes == qcclNumTypes,
              "kernels::DataType must follow qcclDataType_t");
static_assert(static_cast<int>(kernels::RedOp::kAvg) == qcclAvg && kernels::kNumRedOps == qcclNumOps,
              "kernels::RedOp must follow qcclRedOp_t");

namespace {

using coll::CollKind;

bool reduces(CollKind k) { return k == CollKind::kAllReduce || k == CollKind::kReduce || k == CollKind::kReduceScatter; }

// Bytes of a buffer of `count` elements times `factor`, or an error when it cannot exist.
size_t buffer_bytes(const char* name, size_t count, size_t element_size, size_t factor) {
  const size_t max = std::numeric_limits<size_t>::max() / 2;  // no real buffer comes near
  if (count > max / element_size / factor)
    fail(qcclInvalidArgument, "count = %zu makes %s larger than the address space", count, name);
  return count * element_size * factor;
}

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

void require(const void* p, const char* name, size_t count) {
  if (!p) fail(qcclInvalidArgument, "%s is NULL with count = %zu", name, count);
}

// Buffers a and b must either be disjoint or meet with a exactly at the in-place position.
struct Buf {
  const char* name;
  const void* p;
  size_t bytes;
};
void check_in_place(const Buf& a, const Buf& b, const void* in_place_a, const char* rule) {
  if (!overlap(a.p, a.bytes, b.p, b.bytes) || a.p == in_place_a) return;
  fail(qcclInvalidArgument, "%s %p (%zu bytes) overlaps %s %p (%zu bytes) but is not %s", a.name, a.p, a.bytes,
       b.name, b.p, b.bytes, rule);
}

}  // namespace

BufferUse buffer_use(const coll::CollArgs& a) {
  const size_t block = a.count * a.element_size(), all = block * static_cast<size_t>(a.nranks);
  const bool root = a.rank == a.root;
  BufferUse u;
  auto use = [&](size_t read, size_t written) {
    u.read = read ? a.sendbuf : nullptr, u.read_bytes = read;
    u.written = written ? a.recvbuf : nullptr, u.written_bytes = written;
  };
  switch (a.kind) {
    case CollKind::kAllReduce: use(block, block); break;
    case CollKind::kBroadcast: use(root ? block : 0, block); break;
    case CollKind::kReduce: use(block, root ? block : 0); break;
    case CollKind::kAllGather: use(block, all); break;
    case CollKind::kReduceScatter: use(all, block); break;
    case CollKind::kAlltoAll: use(all, all); break;
    case CollKind::kGather: use(block, root ? all : 0); break;
    case CollKind::kScatter: use(root ? all : 0, block); break;
    case CollKind::kSend: use(block, 0); break;
    case CollKind::kRecv: use(0, block); break;
  }
  return u;
}

bool must_wait_for(const BufferUse& earlier, const BufferUse& later) {
  auto hits = [](const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
    return a_bytes && b_bytes && overlap(a, a_bytes, b, b_bytes);
  };
  return hits(earlier.written, earlier.written_bytes, later.read, later.read_bytes) ||
         hits(earlier.written, earlier.written_bytes, later.written, later.written_bytes) ||
         hits(earlier.read, earlier.read_bytes, later.written, later.written_bytes);
}

coll::CollArgs validate_call(const RawCall& c, int rank, int nranks) {
  coll::CollArgs a;
  a.kind = c.kind;
  a.rank = rank;
  a.nranks = nranks;
  a.count = c.count;
  if (c.datatype < 0 || c.datatype >= qcclNumTypes)
    fail(qcclInvalidArgument, "datatype = %d is not a qcclDataType_t (0..%d)", c.datatype, qcclNumTypes - 1);
  a.dtype = static_cast<kernels::DataType>(c.datatype);
  if (reduces(c.kind)) {
    if (c.op < 0 || c.op >= qcclNumOps) fail(qcclInvalidArgument, "op = %d is not a qcclRedOp_t (0..%d)", c.op, qcclNumOps - 1);
    a.op = static_cast<kernels::RedOp>(c.op);
  }
  const bool rooted = coll::rooted(c.kind);
  const bool p2p = c.kind == CollKind::kSend || c.kind == CollKind::kRecv;
  if (rooted && (c.root < 0 || c.root >= nranks))
    fail(qcclInvalidArgument, "root = %d is not a rank of this communicator (0..%d)", c.root, nranks - 1);
  if (p2p && (c.root < 0 || c.root >= nranks))
    fail(qcclInvalidArgument, "peer = %d is not a rank of this communicator (0..%d)", c.root, nranks - 1);
  if (rooted) a.root = c.root;
  if (p2p) a.peer = c.root;
  a.sendbuf = c.sendbuf;
  a.recvbuf = c.recvbuf;

  const size_t es = kernels::element_size(a.dtype);
  const auto n = static_cast<size_t>(nranks);
  const size_t count = c.count;
  const bool root = rooted && rank == c.root;
  switch (c.kind) {
    case CollKind::kAllReduce: {
      const size_t bytes = buffer_bytes("the buffers", count, es, 1);
      if (!count) break;
      require(c.sendbuf, "sendbuff", count);
      require(c.recvbuf, "recvbuff", count);
      check_in_place({"sendbuff", c.sendbuf, bytes}, {"recvbuff", c.recvbuf, bytes}, c.recvbuf, "equal to it (in place)");
      break;
    }
    case CollKind::kBroadcast: {
      const size_t bytes = buffer_bytes("the buffers", count, es, 1);
      if (!count) break;
      require(c.recvbuf, "recvbuff", count);
      if (root) {
        require(c.sendbuf, "sendbuff (on the root)", count);
        check_in_place({"sendbuff", c.sendbuf, bytes}, {"recvbuff", c.recvbuf, bytes}, c.recvbuf, "equal to it (in place)");
      }
      break;
    }
    case CollKind::kReduce: {
      const size_t bytes = buffer_bytes("the buffers", count, es, 1);
      if (!count) break;
      require(c.sendbuf, "sendbuff", count);
      if (root) {
        require(c.recvbuf, "recvbuff (on the root)", count);
        check_in_place({"sendbuff", c.sendbuf, bytes}, {"recvbuff", c.recvbuf, bytes}, c.recvbuf, "equal to it (in place)");
      }
      break;
    }
    case CollKind::kAllGather: {
      const size_t recv_bytes = buffer_bytes("recvbuff (nranks * sendcount)", count, es, n);
      if (!count) break;
      require(c.sendbuf, "sendbuff", count);
      require(c.recvbuf, "recvbuff", count);
      check_in_place({"sendbuff", c.sendbuf, count * es}, {"recvbuff", c.recvbuf, recv_bytes},
                     static_cast<const char*>(c.recvbuf) + static_cast<size_t>(rank) * count * es,
                     "the in-place position recvbuff + rank * sendcount");
      break;
    }
    case CollKind::kReduceScatter: {
      const size_t send_bytes = buffer_bytes("sendbuff (nranks * recvcount)", count, es, n);
      if (!count) break;
      require(c.sendbuf, "sendbuff", count);
      require(c.recvbuf, "recvbuff", count);
      check_in_place({"recvbuff", c.recvbuf, count * es}, {"sendbuff", c.sendbuf, send_bytes},
                     static_cast<const char*>(c.sendbuf) + static_cast<size_t>(rank) * count * es,
                     "the in-place position sendbuff + rank * recvcount");
      break;
    }
    case CollKind::kAlltoAll: {
      const size_t bytes = buffer_bytes("the buffers (nranks * count)", count, es, n);
      if (!count) break;
      require(c.sendbuf, "sendbuff", count);
      require(c.recvbuf, "recvbuff", count);
      if (overlap(c.sendbuf, bytes, c.recvbuf, bytes))
        fail(qcclInvalidArgument, "sendbuff %p and recvbuff %p overlap (%zu bytes each): AlltoAll cannot run in place",
             c.sendbuf, c.recvbuf, bytes);
      break;
    }
    case CollKind::kGather: {
      const size_t recv_bytes = buffer_bytes("recvbuff (nranks * count)", count, es, n);
      if (!count) break;
      require(c.sendbuf, "sendbuff", count);
      if (root) {
        require(c.recvbuf, "recvbuff (on the root)", count);
        check_in_place({"sendbuff", c.sendbuf, count * es}, {"recvbuff", c.recvbuf, recv_bytes},
                       static_cast<const char*>(c.recvbuf) + static_cast<size_t>(c.root) * count * es,
                       "the in-place position recvbuff + root * count");
      }
      break;
    }
    case CollKind::kScatter: {
      const size_t send_bytes = buffer_bytes("sendbuff (nranks * count)", count, es, n);
      if (!count) break;
      require(c.recvbuf, "recvbuff", count);
      if (root) {
        require(c.sendbuf, "sendbuff (on the root)", count);
        check_in_place({"recvbuff", c.recvbuf, count * es}, {"sendbuff", c.sendbuf, send_bytes},
                       static_cast<const char*>(c.sendbuf) + static_cast<size_t>(c.root) * count * es,
                       "the in-place position sendbuff + root * count");
      }
      break;
    }
    case CollKind::kSend:
      buffer_bytes("sendbuff", count, es, 1);
      if (count) require(c.sendbuf, "sendbuff", count);
      break;
    case CollKind::kRecv:
      buffer_bytes("recvbuff", count, es, 1);
      if (count) require(c.recvbuf, "recvbuff", count);
      break;
  }
  return a;
}

}  // namespace qccl
