// sendrecv_perf: every rank sends to rank+1 and receives from rank-1 (mod n) in one group, as
// nccl-tests. Sending and receiving the same buffer at once is a race on host memory, so the in-place
// half of each row is N/A. --codec sends through qcclSendCompressed / qcclRecvCompressed (value
// codecs and AQ-SGD's aq codecs).
#include "common.h"

namespace {

void get_counts(size_t count, int, qccl_perf::Counts* c) {
  c->send = c->recv = c->param = count;
  c->send_in_place = c->recv_in_place = 0;
}

// --codec: qcclSendCompressed / qcclRecvCompressed, the receive first so that the send is the call
// whose statistics the table reports (its wire bytes).
qcclResult_t run_compressed(const qccl_perf::Call& c, int to, int from, qccl_perf::Requests* requests) {
  if (requests) {
    const qcclResult_t received = qcclIRecvCompressed(c.recvbuff, c.count, c.type, c.codec, from, c.comm, requests->add());
    if (received != qcclSuccess) return received;
    return qcclISendCompressed(c.sendbuff, c.count, c.type, c.codec, to, c.comm, requests->add());
  }
  qcclResult_t result = qcclGroupStart();
  if (result == qcclSuccess) result = qcclRecvCompressed(c.recvbuff, c.count, c.type, c.codec, from, c.comm);
  if (result == qcclSuccess) result = qcclSendCompressed(c.sendbuff, c.count, c.type, c.codec, to, c.comm);
  const qcclResult_t ended = qcclGroupEnd();  // always closes the group
  return result != qcclSuccess ? result : ended;
}

qcclResult_t run(const qccl_perf::Call& c, qccl_perf::Requests* requests) {
  const int to = (c.rank + 1) % c.nranks, from = (c.rank - 1 + c.nranks) % c.nranks;
  if (c.codec) return run_compressed(c, to, from, requests);
  if (requests) {
    const qcclResult_t sent = qcclISend(c.sendbuff, c.count, c.type, to, c.comm, requests->add());
    if (sent != qcclSuccess) return sent;
    return qcclIRecv(c.recvbuff, c.count, c.type, from, c.comm, requests->add());
  }
  qcclResult_t result = qcclGroupStart();
  if (result == qcclSuccess) result = qcclSend(c.sendbuff, c.count, c.type, to, c.comm);
  if (result == qcclSuccess) result = qcclRecv(c.recvbuff, c.count, c.type, from, c.comm);
  const qcclResult_t ended = qcclGroupEnd();  // always closes the group
  return result != qcclSuccess ? result : ended;
}

qccl_perf::Source source(size_t i, const qccl_perf::Call& c) { return {(c.rank - 1 + c.nranks) % c.nranks, i}; }

void get_bw(size_t count, size_t type_size, double sec, int, double* algbw, double* busbw) {
  *algbw = double(count) * double(type_size) / 1.0e9 / sec;
  *busbw = *algbw;
}

constexpr qccl_perf::CollTest kTest = {
    "sendrecv", "qcclSend/qcclRecv", /*reduces=*/false, /*rooted=*/false, /*has_in_place=*/false,
    /*result_on_root_only=*/false,
    "    algbw = count * sizeof(type) / t\n"
    "    busbw = algbw\n",
    get_counts, run, source, get_bw, /*compressible=*/true, /*all_reduce_codecs=*/false,
    /*point_to_point_codecs=*/true};

}  // namespace

int main(int argc, char** argv) { return qccl_perf::run_benchmark(argc, argv, kTest); }
