// all_gather_perf: qcclAllGather (qcclAllGatherCompressed with --codec). recvbuff[r*count + i] = sendbuff of rank r [i]; in place: sendbuff is
// recvbuff + rank*count.
#include "common.h"

namespace {

// nccl-tests also rounds the per-rank count down to 16 bytes for GPU alignment; host memory needs no
// alignment, so odd per-rank counts are benchmarked too.
void get_counts(size_t count, int n, qccl_perf::Counts* c) {
  c->param = c->send = count / n;
  c->recv = c->param * n;
  c->send_in_place = c->param;
  c->recv_in_place = 0;
}

qcclResult_t run(const qccl_perf::Call& c, qccl_perf::Requests* requests) {
  if (c.codec) {
    if (!requests) return qcclAllGatherCompressed(c.sendbuff, c.recvbuff, c.count, c.type, c.codec, c.state, c.comm);
    return qcclIAllGatherCompressed(c.sendbuff, c.recvbuff, c.count, c.type, c.codec, c.state, c.comm,
                                    requests->add());
  }
  if (!requests) return qcclAllGather(c.sendbuff, c.recvbuff, c.count, c.type, c.comm);
  return qcclIAllGather(c.sendbuff, c.recvbuff, c.count, c.type, c.comm, requests->add());
}

qccl_perf::Source source(size_t i, const qccl_perf::Call& c) { return {int(i / c.count), i % c.count}; }

// Each rank receives the (n-1)/n of the output it did not send.
void get_bw(size_t count, size_t type_size, double sec, int n, double* algbw, double* busbw) {
  *algbw = double(count) * double(type_size) * n / 1.0e9 / sec;
  *busbw = *algbw * (double(n - 1) / n);
}

constexpr qccl_perf::CollTest kTest = {
    "all_gather", "qcclAllGather", /*reduces=*/false, /*rooted=*/false, /*has_in_place=*/true,
    /*result_on_root_only=*/false,
    "    algbw = n * count * sizeof(type) / t        (count = per-rank sendcount)\n"
    "    busbw = algbw * (n-1)/n\n",
    get_counts, run, source, get_bw, /*compressible=*/true};

}  // namespace

int main(int argc, char** argv) { return qccl_perf::run_benchmark(argc, argv, kTest); }
