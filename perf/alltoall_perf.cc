// alltoall_perf: qcclAlltoAll. recvbuff[r*count + i] = sendbuff of rank r [rank*count + i]. qccl refuses
// overlapping buffers for AlltoAll, so the in-place half of each row is N/A.
#include "common.h"

namespace {

// As nccl-tests, without its 16-byte rounding of the per-peer count.
void get_counts(size_t count, int n, qccl_perf::Counts* c) {
  c->param = count / n;
  c->send = c->recv = c->param * n;
  c->send_in_place = c->recv_in_place = 0;
}

qcclResult_t run(const qccl_perf::Call& c, qccl_perf::Requests* requests) {
  if (!requests) return qcclAlltoAll(c.sendbuff, c.recvbuff, c.count, c.type, c.comm);
  return qcclIAlltoAll(c.sendbuff, c.recvbuff, c.count, c.type, c.comm, requests->add());
}

qccl_perf::Source source(size_t i, const qccl_perf::Call& c) {
  return {int(i / c.count), size_t(c.rank) * c.count + i % c.count};
}

// Each rank sends the (n-1)/n of its buffer addressed to other ranks.
void get_bw(size_t count, size_t type_size, double sec, int n, double* algbw, double* busbw) {
  *algbw = double(count) * n * double(type_size) / 1.0e9 / sec;
  *busbw = *algbw * (double(n - 1) / n);
}

constexpr qccl_perf::CollTest kTest = {
    "alltoall", "qcclAlltoAll", /*reduces=*/false, /*rooted=*/false, /*has_in_place=*/false,
    /*result_on_root_only=*/false,
    "    algbw = n * count * sizeof(type) / t        (count = per-peer count)\n"
    "    busbw = algbw * (n-1)/n\n",
    get_counts, run, source, get_bw};

}  // namespace

int main(int argc, char** argv) { return qccl_perf::run_benchmark(argc, argv, kTest); }
