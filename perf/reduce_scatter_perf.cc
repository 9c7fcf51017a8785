// reduce_scatter_perf: qcclReduceScatter (qcclReduceScatterCompressed with --codec). recvbuff[i] = op over ranks of sendbuff[rank*count + i]; in
// place: recvbuff is sendbuff + rank*count.
#include "common.h"

namespace {

// As all_gather_perf, without nccl-tests' 16-byte rounding of the per-rank count.
void get_counts(size_t count, int n, qccl_perf::Counts* c) {
  c->param = c->recv = count / n;
  c->send = c->param * n;
  c->send_in_place = 0;
  c->recv_in_place = c->param;
}

qcclResult_t run(const qccl_perf::Call& c, qccl_perf::Requests* requests) {
  if (c.codec) {
    if (!requests)
      return qcclReduceScatterCompressed(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.codec, c.state, c.comm);
    return qcclIReduceScatterCompressed(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.codec, c.state, c.comm,
                                        requests->add());
  }
  if (!requests) return qcclReduceScatter(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.comm);
  return qcclIReduceScatter(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.comm, requests->add());
}

qccl_perf::Source source(size_t i, const qccl_perf::Call& c) {
  return {qccl_perf::Source::kAllRanks, size_t(c.rank) * c.count + i};
}

// Each rank sends the (n-1)/n of its input that other ranks own.
void get_bw(size_t count, size_t type_size, double sec, int n, double* algbw, double* busbw) {
  *algbw = double(count) * double(type_size) * n / 1.0e9 / sec;
  *busbw = *algbw * (double(n - 1) / n);
}

constexpr qccl_perf::CollTest kTest = {
    "reduce_scatter", "qcclReduceScatter", /*reduces=*/true, /*rooted=*/false, /*has_in_place=*/true,
    /*result_on_root_only=*/false,
    "    algbw = n * count * sizeof(type) / t        (count = per-rank recvcount)\n"
    "    busbw = algbw * (n-1)/n\n",
    get_counts, run, source, get_bw, /*compressible=*/true, /*all_reduce_codecs=*/false};

}  // namespace

int main(int argc, char** argv) { return qccl_perf::run_benchmark(argc, argv, kTest); }
