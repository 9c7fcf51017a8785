// reduce_perf: qcclReduce. recvbuff[i] of root = op over ranks of sendbuff[i]; in place: same buffer.
#include "common.h"

namespace {

void get_counts(size_t count, int, qccl_perf::Counts* c) {
  c->send = c->recv = c->param = count;
  c->send_in_place = c->recv_in_place = 0;
}

qcclResult_t run(const qccl_perf::Call& c, qccl_perf::Requests* requests) {
  if (!requests) return qcclReduce(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.root, c.comm);
  return qcclIReduce(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.root, c.comm, requests->add());
}

qccl_perf::Source source(size_t i, const qccl_perf::Call&) { return {qccl_perf::Source::kAllRanks, i}; }

// A pipelined reduce puts every byte once on each rank's link.
void get_bw(size_t count, size_t type_size, double sec, int, double* algbw, double* busbw) {
  *algbw = double(count) * double(type_size) / 1.0e9 / sec;
  *busbw = *algbw;
}

constexpr qccl_perf::CollTest kTest = {
    "reduce", "qcclReduce", /*reduces=*/true, /*rooted=*/true, /*has_in_place=*/true,
    /*result_on_root_only=*/true,
    "    algbw = count * sizeof(type) / t\n"
    "    busbw = algbw\n",
    get_counts, run, source, get_bw};

}  // namespace

int main(int argc, char** argv) { return qccl_perf::run_benchmark(argc, argv, kTest); }
