// all_reduce_perf: qcclAllReduce (qcclAllReduceCompressed with --codec). recvbuff[i] = op over ranks of
// sendbuff[i]; in place: same buffer.
#include "common.h"

namespace {

void get_counts(size_t count, int, qccl_perf::Counts* c) {
  c->send = c->recv = c->param = count;
  c->send_in_place = c->recv_in_place = 0;
}

qcclResult_t run(const qccl_perf::Call& c, qccl_perf::Requests* requests) {
  if (c.codec) {
    if (!requests) return qcclAllReduceCompressed(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.codec, c.state, c.comm);
    return qcclIAllReduceCompressed(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.codec, c.state, c.comm,
                                    requests->add());
  }
  if (!requests) return qcclAllReduce(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.comm);
  return qcclIAllReduce(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.comm, requests->add());
}

qccl_perf::Source source(size_t i, const qccl_perf::Call&) { return {qccl_perf::Source::kAllRanks, i}; }

// Each element crosses 2(n-1) links of a ring spread over n ranks.
void get_bw(size_t count, size_t type_size, double sec, int n, double* algbw, double* busbw) {
  *algbw = double(count) * double(type_size) / 1.0e9 / sec;
  *busbw = *algbw * (2.0 * (n - 1) / n);
}

constexpr qccl_perf::CollTest kTest = {
    "all_reduce", "qcclAllReduce", /*reduces=*/true, /*rooted=*/false, /*has_in_place=*/true,
    /*result_on_root_only=*/false,
    "    algbw = count * sizeof(type) / t\n"
    "    busbw = algbw * 2(n-1)/n\n",
    get_counts, run, source, get_bw, /*compressible=*/true, /*all_reduce_codecs=*/true};

}  // namespace

int main(int argc, char** argv) { return qccl_perf::run_benchmark(argc, argv, kTest); }
