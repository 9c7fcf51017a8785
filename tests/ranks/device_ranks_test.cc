// Device buffers through the C API (label gpu): every collective and point-to-point call on cudaMalloc'd
// buffers (rank r on GPU r % count: over NCCL where each rank has a GPU, else staged through host
// memory, and staged whatever the GPUs with QCCL_GPU_WIRE=host) gives the bits of the same call on
// host buffers; so does the compressed all-reduce (nearest rounding, so that the key does not
// matter); error feedback's residual follows the calls between device and host; the call waits for
// the work queued on the communicator's stream before it (a blocking call returns with its result in
// place, so the work queued after it cannot tell whether the stream was joined: that side is the
// stand-in's test, device_executor_test); what the device path does not take (graph capture, mixed
// buffers) is refused before anything is sent; the fft codec, run by the host on staged copies, gives
// the host path's bits (a device call queued behind it on its buffer too), and on cuFFT
// (QCCL_GPU_FFT=cufft) one result on every rank as accurate as the host's, a job mixing the two
// failing on every rank; IntSGD's all-reduce gives the host path's bits, scale,
// clips and state, and reports a NaN on every rank; Marsit's gives the host path's bits, its
// compensation following the calls between device and host; compressed send/recv (q, aq) gives the
// host path's bits; so do QSDP's compressed AllGather and ReduceScatter with learned levels, and
// keyed delta calls (staged through the host, with byte-equal stores). Without a CUDA device every rank exits 77 before the first test (CTest: skipped).
// First, before anything includes Catch: it enables Catch's listener interface.
#include "tests/common/require_cuda_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

void ok(cudaError_t e) {
  INFO(cudaGetErrorName(e) << ": " << cudaGetErrorString(e));
  REQUIRE(e == cudaSuccess);
}

// The job's communicator, with this rank on GPU rank % count: one GPU each where there are enough
// (QCCL_GPU_WIRE=auto then takes NCCL), else shared (then the staged wire).
World& world() {
  static const bool chosen = [] {
    int count = 0;
    ok(cudaGetDeviceCount(&count));
    ok(cudaSetDevice(World::get().rank() % count));
    return true;
  }();
  (void)chosen;
  return World::get();
}

// A device copy of a host buffer (or `bytes` bytes of `fill`), freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<uint8_t>& from) : bytes_(from.size()) {
    ok(cudaMalloc(&p_, bytes_ ? bytes_ : 1));
    if (bytes_) ok(cudaMemcpy(p_, from.data(), bytes_, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  std::vector<uint8_t> read() const {
    std::vector<uint8_t> out(bytes_);
    if (bytes_) ok(cudaMemcpy(out.data(), p_, bytes_, cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

// "" when `got` and `want` hold the same bytes, else how many differ and the first of them, as
// bytes and as the float32 there: a failure says where, not a dump of megabytes.
std::string differences(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got == want) return "";
  if (got.size() != want.size()) return "sizes " + std::to_string(got.size()) + " and " + std::to_string(want.size());
  size_t first = got.size(), count = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) first = std::min(first, i), ++count;
  std::ostringstream out;
  out << count << " of " << got.size() << " bytes differ, the first at byte " << first << " ("
      << int{got[first]} << ", not " << int{want[first]} << ")";
  const size_t at = first / 4 * 4;
  if (at + 4 <= got.size()) {
    float g = 0, w = 0;
    std::memcpy(&g, &got[at], 4), std::memcpy(&w, &want[at], 4);
    out << "; as float32 value " << at / 4 << ": " << g << ", not " << w;
  }
  return out.str();
}

// Every collective with the same arguments on host buffers and on device buffers: the same bytes.
using Call = qcclResult_t (*)(const void* send, void* recv, size_t count, qcclDataType_t t, qcclRedOp_t op, int root,
                              qcclComm_t comm);

void compare(const char* name, Call call, size_t count, size_t send_values, size_t recv_values, DataType t,
             RedOp op, int root) {
  World& w = world();
  INFO(name << ", " << count << " values, datatype " << static_cast<int>(t) << ", op " << static_cast<int>(op));
  const size_t es = kernels::element_size(t);
  const std::vector<uint8_t> send = inputs(t, op, w.rank(), send_values);
  std::vector<uint8_t> host_recv(recv_values * es, 0xee);
  QCCL_REQUIRE_OK(call(send.data(), host_recv.data(), count, to_api(t), to_api(op), root, w.comm()));
  DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(recv_values * es, 0xee));
  QCCL_REQUIRE_OK(call(dsend.get(), drecv.get(), count, to_api(t), to_api(op), root, w.comm()));
  CHECK(differences(drecv.read(), host_recv) == "");
}

TEST_CASE("every collective on device buffers gives the host buffers' bits", "[device]") {
  World& w = world();
  const size_t n = static_cast<size_t>(w.size());
  const int root = w.size() - 1;
  struct Type {
    DataType t;
    RedOp op;
  };
  for (const Type& ty : {Type{DataType::kFloat32, RedOp::kSum}, Type{DataType::kFloat16, RedOp::kAvg},
                         Type{DataType::kInt32, RedOp::kMax}}) {
    for (size_t count : {size_t{1}, size_t{1000}, size_t{300001}}) {
      compare("AllReduce", [](const void* s, void* r, size_t c, qcclDataType_t t, qcclRedOp_t op, int, qcclComm_t comm) {
        return qcclAllReduce(s, r, c, t, op, comm);
      }, count, count, count, ty.t, ty.op, root);
      compare("Broadcast", [](const void* s, void* r, size_t c, qcclDataType_t t, qcclRedOp_t, int root, qcclComm_t comm) {
        return qcclBroadcast(s, r, c, t, root, comm);
      }, count, count, count, ty.t, ty.op, root);
      compare("Reduce", [](const void* s, void* r, size_t c, qcclDataType_t t, qcclRedOp_t op, int root, qcclComm_t comm) {
        return qcclReduce(s, r, c, t, op, root, comm);
      }, count, count, count, ty.t, ty.op, root);
      compare("AllGather", [](const void* s, void* r, size_t c, qcclDataType_t t, qcclRedOp_t, int, qcclComm_t comm) {
        return qcclAllGather(s, r, c, t, comm);
      }, count, count, n * count, ty.t, ty.op, root);
      compare("ReduceScatter", [](const void* s, void* r, size_t c, qcclDataType_t t, qcclRedOp_t op, int, qcclComm_t comm) {
        return qcclReduceScatter(s, r, c, t, op, comm);
      }, count, n * count, count, ty.t, ty.op, root);
      compare("AlltoAll", [](const void* s, void* r, size_t c, qcclDataType_t t, qcclRedOp_t, int, qcclComm_t comm) {
        return qcclAlltoAll(s, r, c, t, comm);
      }, count, n * count, n * count, ty.t, ty.op, root);
      compare("Gather", [](const void* s, void* r, size_t c, qcclDataType_t t, qcclRedOp_t, int root, qcclComm_t comm) {
        return qcclGather(s, r, c, t, root, comm);
      }, count, count, n * count, ty.t, ty.op, root);
      compare("Scatter", [](const void* s, void* r, size_t c, qcclDataType_t t, qcclRedOp_t, int root, qcclComm_t comm) {
        return qcclScatter(s, r, c, t, root, comm);
      }, count, n * count, count, ty.t, ty.op, root);
    }
  }
}

TEST_CASE("in-place all-reduce and a ring of sends on device buffers", "[device]") {
  World& w = world();
  const size_t count = 77777;
  std::vector<uint8_t> host = inputs(DataType::kFloat32, RedOp::kSum, w.rank(), count);
  DeviceBuffer dev(host);
  QCCL_REQUIRE_OK(qcclAllReduce(host.data(), host.data(), count, qcclFloat32, qcclSum, w.comm()));
  QCCL_REQUIRE_OK(qcclAllReduce(dev.get(), dev.get(), count, qcclFloat32, qcclSum, w.comm()));
  CHECK(differences(dev.read(), host) == "");

  const int next = (w.rank() + 1) % w.size(), prev = (w.rank() + w.size() - 1) % w.size();
  const std::vector<uint8_t> mine = inputs(DataType::kFloat32, RedOp::kSum, w.rank(), count);
  DeviceBuffer dsend(mine), drecv(std::vector<uint8_t>(mine.size(), 0));
  QCCL_REQUIRE_OK(qcclGroupStart());
  QCCL_REQUIRE_OK(qcclSend(dsend.get(), count, qcclFloat32, next, w.comm()));
  QCCL_REQUIRE_OK(qcclRecv(drecv.get(), count, qcclFloat32, prev, w.comm()));
  QCCL_REQUIRE_OK(qcclGroupEnd());
  CHECK(differences(drecv.read(), inputs(DataType::kFloat32, RedOp::kSum, prev, count)) == "");
}

TEST_CASE("device calls on one another's buffers, queued together, give the host path's bits", "[device]") {
  // Each call fits one chunk, so the next starts while this one's steps after its receives are not
  // queued yet (the staged wire queues them when the messages arrive): it must wait until they are,
  // or it reads the buffer before the sum is in it (and writes it while this one still reads it).
  World& w = world();
  const size_t count = 30000;  // 120 KB: one chunk at the default 256 KiB
  std::vector<uint8_t> host = inputs(DataType::kFloat32, RedOp::kSum, w.rank(), count);
  DeviceBuffer dev(host);
  for (void* x : {static_cast<void*>(host.data()), dev.get()}) {
    QCCL_REQUIRE_OK(qcclGroupStart());
    QCCL_REQUIRE_OK(qcclAllReduce(x, x, count, qcclFloat32, qcclSum, w.comm()));
    QCCL_REQUIRE_OK(qcclAllReduce(x, x, count, qcclFloat32, qcclMax, w.comm()));
    QCCL_REQUIRE_OK(qcclBroadcast(x, x, count, qcclFloat32, w.size() - 1, w.comm()));
    QCCL_REQUIRE_OK(qcclGroupEnd());
  }
  CHECK(differences(dev.read(), host) == "");
}

// The fft codec under QCCL_GPU_FFT=host runs the host's executor on pinned copies of the device
// buffers, its outputs reaching them only as it completes: a device call queued behind it on the same
// buffer must wait for that, although the staged call's own buffers are the pinned copies (and its
// host execution may finish while a larger call before it still runs, its completion then deferred).
TEST_CASE("a device call behind a staged fft call on its buffer, queued together, gives the host path's bits",
          "[device]") {
  World& w = world();
  Codec codec("fft:theta=0.9,bits=10,segment=4096,fallback=off");
  const size_t large = 1 << 21, count = 8192;  // the first call runs many chunks; the fft one, one
  std::vector<uint8_t> host_large = inputs(DataType::kFloat32, RedOp::kSum, w.rank(), large);
  std::vector<uint8_t> host = inputs(DataType::kFloat32, RedOp::kSum, w.rank(), count);
  DeviceBuffer dev_large(host_large), dev(host);
  for (std::pair<void*, void*> x : {std::pair<void*, void*>{host_large.data(), host.data()},
                                    std::pair<void*, void*>{dev_large.get(), dev.get()}}) {
    QCCL_REQUIRE_OK(qcclGroupStart());
    QCCL_REQUIRE_OK(qcclAllReduce(x.first, x.first, large, qcclFloat32, qcclSum, w.comm()));
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.second, x.second, count, qcclFloat32, qcclSum, codec.handle, nullptr,
                                            w.comm()));
    QCCL_REQUIRE_OK(qcclAllReduce(x.second, x.second, count, qcclFloat32, qcclMax, w.comm()));
    QCCL_REQUIRE_OK(qcclGroupEnd());
  }
  CHECK(differences(dev.read(), host) == "");
  CHECK(differences(dev_large.read(), host_large) == "");
}

TEST_CASE("compressed all-reduce on device buffers gives the host path's bits", "[device]") {
  World& w = world();
  // (fft, under QCCL_GPU_FFT=host, the default, runs the host's codec on staged copies: the same bits
  // too; the cuFFT case is below)
  for (const char* spec : {"q8", "q4:bucket=128", "fp16", "bf16", "fft:theta=0.9,bits=10,segment=4096,fallback=off"}) {
    for (DataType t : {DataType::kFloat32, DataType::kBfloat16}) {
      INFO(spec << ", datatype " << static_cast<int>(t));
      Codec codec(spec);
      const size_t count = 1 << 18;
      const std::vector<uint8_t> send = inputs(t, RedOp::kSum, w.rank(), count);
      std::vector<uint8_t> host(send.size());
      QCCL_REQUIRE_OK(qcclAllReduceCompressed(send.data(), host.data(), count, to_api(t), qcclSum, codec.handle,
                                              nullptr, w.comm()));
      DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
      QCCL_REQUIRE_OK(qcclAllReduceCompressed(dsend.get(), drecv.get(), count, to_api(t), qcclSum, codec.handle,
                                              nullptr, w.comm()));
      CHECK(differences(drecv.read(), host) == "");
    }
  }
}

// Random rounding is keyed by the state's step (by the call's sequence number without one): the host
// call and the device call each take a fresh state, so that both draw the same numbers.
TEST_CASE("QSDP's compressed AllGather and ReduceScatter with learned levels on device buffers", "[device]") {
  World& w = world();
  for (const char* spec : {"q2:bucket=64,levels=0/0.125/0.6/1", "q4:bucket=128,round=stochastic",
                           "q3:levels=0/0.01/0.05/0.2/0.5/0.7/0.95/1,round=shift"}) {
    INFO(spec);
    Codec codec(spec);
    const size_t count = 50000;
    const size_t n = static_cast<size_t>(w.size());
    const std::vector<uint8_t> block = inputs(DataType::kFloat32, RedOp::kSum, w.rank(), count);
    std::vector<uint8_t> host(block.size() * n);
    State gather_host(w.comm(), count), gather_device(w.comm(), count);
    QCCL_REQUIRE_OK(qcclAllGatherCompressed(block.data(), host.data(), count, qcclFloat32, codec.handle,
                                            gather_host.handle, w.comm()));
    DeviceBuffer dblock(block), dall(std::vector<uint8_t>(block.size() * n, 0));
    QCCL_REQUIRE_OK(qcclAllGatherCompressed(dblock.get(), dall.get(), count, qcclFloat32, codec.handle,
                                            gather_device.handle, w.comm()));
    CHECK(differences(dall.read(), host) == "");
    const std::vector<uint8_t> all = inputs(DataType::kFloat32, RedOp::kSum, w.rank(), count * n);
    std::vector<uint8_t> mine(block.size());
    State scatter_host(w.comm(), count * n), scatter_device(w.comm(), count * n);
    QCCL_REQUIRE_OK(qcclReduceScatterCompressed(all.data(), mine.data(), count, qcclFloat32, qcclSum, codec.handle,
                                                scatter_host.handle, w.comm()));
    DeviceBuffer dsend(all), drecv(std::vector<uint8_t>(block.size(), 0));
    QCCL_REQUIRE_OK(qcclReduceScatterCompressed(dsend.get(), drecv.get(), count, qcclFloat32, qcclSum, codec.handle,
                                                scatter_device.handle, w.comm()));
    CHECK(differences(drecv.read(), mine) == "");
  }
}

TEST_CASE("error feedback on device buffers: the residual follows the calls, with the host path's bits", "[device]") {
  World& w = world();
  const size_t count = 100003;
  Codec codec("q4:ef=on,bucket=256");
  State on_host(w.comm(), count), mixed(w.comm(), count);
  // Five steps on host buffers with one state, and the same steps with another state whose calls
  // alternate device, device, host, device, host: every step's result and the final checkpoints agree.
  const bool on_device[] = {true, true, false, true, false};
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    const std::vector<uint8_t> send = inputs(DataType::kFloat32, RedOp::kSum, w.rank() + step, count);
    std::vector<uint8_t> host(send.size()), other(send.size());
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(send.data(), host.data(), count, qcclFloat32, qcclSum, codec.handle,
                                            on_host.handle, w.comm()));
    if (on_device[step]) {
      DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
      QCCL_REQUIRE_OK(qcclAllReduceCompressed(dsend.get(), drecv.get(), count, qcclFloat32, qcclSum, codec.handle,
                                              mixed.handle, w.comm()));
      other = drecv.read();
    } else {
      QCCL_REQUIRE_OK(qcclAllReduceCompressed(send.data(), other.data(), count, qcclFloat32, qcclSum, codec.handle,
                                              mixed.handle, w.comm()));
    }
    CHECK(differences(other, host) == "");
  }
  size_t a = 0, b = 0;
  QCCL_REQUIRE_OK(qcclCodecStateSize(on_host.handle, &a));
  QCCL_REQUIRE_OK(qcclCodecStateSize(mixed.handle, &b));
  REQUIRE(a == b);
  std::vector<uint8_t> saved_host(a), saved_mixed(b);
  // The mixed state's last call was on the host; one more device step brings the residual to the
  // device, and the checkpoint must still see it.
  const std::vector<uint8_t> send = inputs(DataType::kFloat32, RedOp::kSum, w.rank() + 5, count);
  std::vector<uint8_t> host(send.size());
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(send.data(), host.data(), count, qcclFloat32, qcclSum, codec.handle,
                                          on_host.handle, w.comm()));
  DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(dsend.get(), drecv.get(), count, qcclFloat32, qcclSum, codec.handle,
                                          mixed.handle, w.comm()));
  CHECK(differences(drecv.read(), host) == "");
  QCCL_REQUIRE_OK(qcclCodecStateSave(on_host.handle, saved_host.data(), a));
  QCCL_REQUIRE_OK(qcclCodecStateSave(mixed.handle, saved_mixed.data(), b));
  CHECK(differences(saved_mixed, saved_host) == "");
}

qcclStats_t last_stats() {
  qcclStats_t stats{};
  stats.size = sizeof(stats);
  QCCL_REQUIRE_OK(qcclCommGetLastStats(world().comm(), &stats));
  return stats;
}

TEST_CASE("IntSGD on device buffers: the host path's bits, alpha, clips and state; NaN reported", "[device]") {
  World& w = world();
  const size_t count = 100003;
  Codec codec("int8:seed=7");
  State on_host(w.comm(), count), on_device(w.comm(), count);
  // Round 0 is exact (its norm read from a copy of the device's output); the later ones sum integers.
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    std::vector<uint8_t> send = inputs(DataType::kFloat32, RedOp::kSum, w.rank() + step, count);
    std::vector<uint8_t> host(send.size());
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(send.data(), host.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                            on_host.handle, w.comm()));
    const qcclStats_t expected = last_stats();
    DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(dsend.get(), drecv.get(), count, qcclFloat32, qcclAvg, codec.handle,
                                            on_device.handle, w.comm()));
    const qcclStats_t got = last_stats();
    CHECK(differences(drecv.read(), host) == "");
    CHECK(got.intAlpha == expected.intAlpha);
    CHECK(got.clippedValues == expected.clippedValues);
    CHECK(got.largestInteger == expected.largestInteger);
  }
  size_t a = 0, b = 0;
  QCCL_REQUIRE_OK(qcclCodecStateSize(on_host.handle, &a));
  QCCL_REQUIRE_OK(qcclCodecStateSize(on_device.handle, &b));
  REQUIRE(a == b);
  std::vector<uint8_t> saved_host(a), saved_device(b);
  QCCL_REQUIRE_OK(qcclCodecStateSave(on_host.handle, saved_host.data(), a));
  QCCL_REQUIRE_OK(qcclCodecStateSave(on_device.handle, saved_device.data(), b));
  CHECK(differences(saved_device, saved_host) == "");
  // A NaN on the last rank: qcclNonFinite on every rank, the same bytes as the host path's.
  std::vector<uint8_t> send = inputs(DataType::kFloat32, RedOp::kSum, w.rank() + 9, count);
  if (w.rank() == w.size() - 1) {
    const float nan = NAN;
    std::memcpy(send.data() + 4321 * sizeof(float), &nan, sizeof nan);
  }
  std::vector<uint8_t> host(send.size());
  CHECK(qcclAllReduceCompressed(send.data(), host.data(), count, qcclFloat32, qcclAvg, codec.handle, on_host.handle,
                                w.comm()) == qcclNonFinite);
  DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
  CHECK(qcclAllReduceCompressed(dsend.get(), drecv.get(), count, qcclFloat32, qcclAvg, codec.handle, on_device.handle,
                                w.comm()) == qcclNonFinite);
  CHECK(differences(drecv.read(), host) == "");
}

// Run only with aggregator processes (CTest's device_ranks_n3_switch: qcclrun --aggregators 1).
TEST_CASE("IntSGD through aggregators (agg=switch) on device buffers: the host path's bits", "[.][switch]") {
  World& w = world();
  const size_t count = 300001;
  Codec codec("int8:alpha=64,agg=switch");
  for (DataType t : {DataType::kFloat32, DataType::kBfloat16}) {
    INFO("datatype " << static_cast<int>(t));
    const std::vector<uint8_t> send = inputs(t, RedOp::kSum, w.rank(), count);
    std::vector<uint8_t> host(send.size());
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(send.data(), host.data(), count, to_api(t), qcclAvg, codec.handle, nullptr,
                                            w.comm()));
    DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(dsend.get(), drecv.get(), count, to_api(t), qcclAvg, codec.handle, nullptr,
                                            w.comm()));
    CHECK(differences(drecv.read(), host) == "");
  }
}

TEST_CASE("Marsit on device buffers: the host path's bits and compensation, calls moving between both", "[device]") {
  World& w = world();
  const size_t count = 100003;
  Codec codec("sign:eta_s=0.01,k=3");
  State on_host(w.comm(), count), mixed(w.comm(), count);
  // Six rounds (0 and 3 full precision) on host buffers with one state, and with another whose calls
  // alternate: the compensation follows the calls to the device and back, and every result agrees.
  const bool on_device[] = {true, true, false, true, true, false};
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    const std::vector<uint8_t> send = inputs(DataType::kFloat32, RedOp::kSum, w.rank() + step, count);
    std::vector<uint8_t> host(send.size()), other(send.size());
    QCCL_REQUIRE_OK(qcclAllReduceCompressed(send.data(), host.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                            on_host.handle, w.comm()));
    if (on_device[step]) {
      DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
      QCCL_REQUIRE_OK(qcclAllReduceCompressed(dsend.get(), drecv.get(), count, qcclFloat32, qcclAvg, codec.handle,
                                              mixed.handle, w.comm()));
      other = drecv.read();
    } else {
      QCCL_REQUIRE_OK(qcclAllReduceCompressed(send.data(), other.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                              mixed.handle, w.comm()));
    }
    CHECK(differences(other, host) == "");
  }
  // The last call ran on the host; one more on the device, then the checkpoints (c itself) agree.
  const std::vector<uint8_t> send = inputs(DataType::kFloat32, RedOp::kSum, w.rank() + 6, count);
  std::vector<uint8_t> host(send.size());
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(send.data(), host.data(), count, qcclFloat32, qcclAvg, codec.handle,
                                          on_host.handle, w.comm()));
  DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(dsend.get(), drecv.get(), count, qcclFloat32, qcclAvg, codec.handle,
                                          mixed.handle, w.comm()));
  CHECK(differences(drecv.read(), host) == "");
  size_t a = 0, b = 0;
  QCCL_REQUIRE_OK(qcclCodecStateSize(on_host.handle, &a));
  QCCL_REQUIRE_OK(qcclCodecStateSize(mixed.handle, &b));
  REQUIRE(a == b);
  std::vector<uint8_t> saved_host(a), saved_mixed(b);
  QCCL_REQUIRE_OK(qcclCodecStateSave(on_host.handle, saved_host.data(), a));
  QCCL_REQUIRE_OK(qcclCodecStateSave(mixed.handle, saved_mixed.data(), b));
  CHECK(differences(saved_mixed, saved_host) == "");
}

TEST_CASE("compressed send/recv on device buffers (q, aq) gives the host path's bits", "[device]") {
  World& w = world();
  const int next = (w.rank() + 1) % w.size(), prev = (w.rank() + w.size() - 1) % w.size();
  for (const char* spec : {"q4", "aq4:channels=64", "aq8:channels=100,rows=0"}) {
    INFO(spec);
    Codec codec(spec);
    const size_t count = 6400;
    const std::vector<uint8_t> send = inputs(DataType::kFloat32, RedOp::kSum, w.rank(), count);
    std::vector<uint8_t> host(send.size(), 0);
    QCCL_REQUIRE_OK(qcclGroupStart());
    QCCL_REQUIRE_OK(qcclSendCompressed(send.data(), count, qcclFloat32, codec.handle, next, w.comm()));
    QCCL_REQUIRE_OK(qcclRecvCompressed(host.data(), count, qcclFloat32, codec.handle, prev, w.comm()));
    QCCL_REQUIRE_OK(qcclGroupEnd());
    DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
    QCCL_REQUIRE_OK(qcclGroupStart());
    QCCL_REQUIRE_OK(qcclSendCompressed(dsend.get(), count, qcclFloat32, codec.handle, next, w.comm()));
    QCCL_REQUIRE_OK(qcclRecvCompressed(drecv.get(), count, qcclFloat32, codec.handle, prev, w.comm()));
    QCCL_REQUIRE_OK(qcclGroupEnd());
    CHECK(differences(drecv.read(), host) == "");
  }
}

TEST_CASE("keyed delta calls on device buffers: the host path's rows and stores, staged", "[device]") {
  // Around the ring, each rank sends 3 of 8 keys' rows to the next: once from host buffers with one
  // pair of stores, once from device buffers with another. Every received row and every store's
  // checkpoint agree, call after call.
  World& w = world();
  if (w.size() < 2) return;
  const size_t row = 2 * 32;
  const int next = (w.rank() + 1) % w.size(), prev = (w.rank() + w.size() - 1) % w.size();
  Codec aq("aq4:channels=32,round=stochastic,seed=4");
  auto make = [&] {
    qcclDeltaStore_t s = nullptr;
    QCCL_REQUIRE_OK(qcclDeltaStoreCreate(aq.handle, row, qcclFloat16, 0, 0, 5, &s));
    return s;
  };
  qcclDeltaStore_t host_out = make(), host_in = make(), dev_out = make(), dev_in = make();
  auto checkpoint = [](qcclDeltaStore_t s) {
    size_t bytes = 0;
    QCCL_REQUIRE_OK(qcclDeltaStoreSize(s, &bytes));
    std::vector<uint8_t> out(bytes);
    QCCL_REQUIRE_OK(qcclDeltaStoreSave(s, out.data(), bytes));
    return out;
  };
  for (int call = 0; call < 5; ++call) {
    INFO("call " << call);
    // Three different keys in every call (one call may not name a key twice), some met before.
    const uint64_t keys[] = {static_cast<uint64_t>(call % 4), static_cast<uint64_t>(4 + call % 3), 7};
    std::vector<float> x(3 * row);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>(std::sin(0.01 * static_cast<double>(i) + w.rank() + 0.1 * call));
    std::vector<float> host(3 * row, 0.0f);
    QCCL_REQUIRE_OK(qcclGroupStart());
    QCCL_REQUIRE_OK(qcclDeltaSend(x.data(), 3, keys, qcclFloat32, host_out, next, w.comm()));
    QCCL_REQUIRE_OK(qcclDeltaRecv(host.data(), 3, keys, qcclFloat32, host_in, prev, w.comm()));
    QCCL_REQUIRE_OK(qcclGroupEnd());
    std::vector<uint8_t> bytes(x.size() * sizeof(float));
    std::memcpy(bytes.data(), x.data(), bytes.size());
    DeviceBuffer dx(bytes), dout(std::vector<uint8_t>(bytes.size(), 0));
    QCCL_REQUIRE_OK(qcclGroupStart());
    QCCL_REQUIRE_OK(qcclDeltaSend(dx.get(), 3, keys, qcclFloat32, dev_out, next, w.comm()));
    QCCL_REQUIRE_OK(qcclDeltaRecv(dout.get(), 3, keys, qcclFloat32, dev_in, prev, w.comm()));
    QCCL_REQUIRE_OK(qcclGroupEnd());
    const std::vector<uint8_t> got = dout.read();
    CHECK(std::memcmp(got.data(), host.data(), got.size()) == 0);
    CHECK(differences(checkpoint(dev_out), checkpoint(host_out)) == "");
    CHECK(differences(checkpoint(dev_in), checkpoint(host_in)) == "");
  }
  for (qcclDeltaStore_t s : {host_out, host_in, dev_out, dev_in}) QCCL_REQUIRE_OK(qcclDeltaStoreDestroy(s));
}

TEST_CASE("device calls are ordered with the communicator's stream", "[device]") {
  World& w = world();
  cudaStream_t stream = nullptr;
  ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  QCCL_REQUIRE_OK(qcclCommSetStream(w.comm(), stream));
  void* got = nullptr;
  QCCL_REQUIRE_OK(qcclCommGetStream(w.comm(), &got));
  CHECK(got == stream);
  const size_t count = 1 << 20, bytes = count * sizeof(float);
  DeviceBuffer send(std::vector<uint8_t>(bytes, 0)), recv(std::vector<uint8_t>(bytes, 0));
  DeviceBuffer slow(std::vector<uint8_t>(size_t{256} << 20, 0));
  for (int round = 0; round < 3; ++round) {
    // Queued before the call: a long memset, then the one that makes the input (bytes 0x01 0x01 ..).
    ok(cudaMemsetAsync(slow.get(), round, size_t{256} << 20, stream));
    ok(cudaMemsetAsync(send.get(), 1 + round, bytes, stream));
    QCCL_REQUIRE_OK(qcclAllReduce(send.get(), recv.get(), count, qcclFloat32,
                                  qcclMax, w.comm()));
    std::vector<uint8_t> out(bytes);
    ok(cudaMemcpyAsync(out.data(), recv.get(), bytes, cudaMemcpyDeviceToHost, stream));  // queued after
    ok(cudaStreamSynchronize(stream));
    std::vector<uint8_t> expected(bytes, static_cast<uint8_t>(1 + round));  // max of equal floats
    CHECK(differences(out, expected) == "");
  }
  QCCL_REQUIRE_OK(qcclCommSetStream(w.comm(), nullptr));
  ok(cudaStreamDestroy(stream));
}

TEST_CASE("a rank's unused buffer is not looked at, and a call of no values runs on every rank alike",
          "[device]") {
  // qccl.h: a Broadcast's sendbuff is read on the root only (a Reduce's recvbuff written there only):
  // off the root it may be host memory or NULL beside device memory. It was refused there
  // ("both must be memory of one device"), and the root waited for QCCL_TIMEOUT.
  World& w = world();
  const size_t count = 5000;
  const std::vector<uint8_t> root_data = inputs(DataType::kFloat32, RedOp::kSum, 0, count);
  std::vector<uint8_t> host_garbage(16, 0xAB);
  DeviceBuffer buf(w.rank() == 0 ? root_data : std::vector<uint8_t>(root_data.size(), 0));
  void* send = w.rank() == 0 ? buf.get() : w.rank() % 2 ? static_cast<void*>(host_garbage.data()) : nullptr;
  QCCL_REQUIRE_OK(qcclBroadcast(send, buf.get(), count, qcclFloat32, 0, w.comm()));
  CHECK(differences(buf.read(), root_data) == "");
  DeviceBuffer sum(std::vector<uint8_t>(root_data.size(), 0));
  void* recv = w.rank() == 0 ? sum.get() : w.rank() % 2 ? static_cast<void*>(host_garbage.data()) : nullptr;
  QCCL_REQUIRE_OK(qcclReduce(buf.get(), recv, count, qcclFloat32, qcclMax, 0, w.comm()));
  if (w.rank() == 0) CHECK(differences(sum.read(), root_data) == "");  // the max of equal values
  // A call of no values, the first on a new communicator, with NULL on one rank and device pointers
  // on the others: every rank runs it on the host (the device ranks once began the GPU wire's choice,
  // an exchange, without rank 0); the device call after it chooses the wire on every rank together.
  qcclComm_t child = nullptr;
  QCCL_REQUIRE_OK(qcclCommSplit(w.comm(), 0, w.rank(), &child, nullptr));
  void* none = w.rank() == 0 ? nullptr : buf.get();
  QCCL_REQUIRE_OK(qcclAllReduce(none, none, 0, qcclFloat32, qcclSum, child));
  QCCL_REQUIRE_OK(qcclAllReduce(buf.get(), sum.get(), count, qcclFloat32, qcclMax, child));
  CHECK(differences(sum.read(), root_data) == "");
  QCCL_REQUIRE_OK(qcclCommDestroy(child));
}

TEST_CASE("what the device path does not take is refused before anything is sent", "[device]") {
  World& w = world();
  const size_t count = 1024;
  std::vector<uint8_t> host(count * 4, 0);
  DeviceBuffer dev(host);
  CHECK(qcclAllReduce(dev.get(), host.data(), count, qcclFloat32, qcclSum, w.comm()) == qcclInvalidArgument);
  CHECK_THAT(qcclGetLastError(nullptr), Catch::Contains("both must be memory of one device"));

  // A graph capture on the communicator's stream: refused (the progress thread's stream is not in the
  // graph), and the capture ends with nothing of the call in it. The guard undoes it all whatever
  // fails, since the job's communicator outlives this case.
  struct Capture {
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    ~Capture() {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      if (stream && cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
        cudaGraph_t left = nullptr;
        if (cudaStreamEndCapture(stream, &left) == cudaSuccess && left) cudaGraphDestroy(left);
      }
      if (graph) cudaGraphDestroy(graph);
      qcclCommSetStream(world().comm(), nullptr);
      if (stream) cudaStreamDestroy(stream);
      cudaGetLastError();
    }
  } capture;
  ok(cudaStreamCreateWithFlags(&capture.stream, cudaStreamNonBlocking));
  QCCL_REQUIRE_OK(qcclCommSetStream(w.comm(), capture.stream));
  ok(cudaStreamBeginCapture(capture.stream, cudaStreamCaptureModeGlobal));
  const qcclResult_t captured = qcclAllReduce(dev.get(), dev.get(), count, qcclFloat32, qcclSum, w.comm());
  const std::string why = qcclGetLastError(nullptr);
  // A call whose buffers the host stages (the fft codec's) is refused alike.
  Codec fft("fft:theta=0.9,fallback=off");
  const qcclResult_t staged =
      qcclAllReduceCompressed(dev.get(), dev.get(), count, qcclFloat32, qcclSum, fft.handle, nullptr, w.comm());
  const std::string why_staged = qcclGetLastError(nullptr);
  ok(cudaStreamEndCapture(capture.stream, &capture.graph));
  size_t nodes = 1;
  ok(cudaGraphGetNodes(capture.graph, nullptr, &nodes));
  CHECK(captured == qcclInvalidUsage);
  CHECK_THAT(why, Catch::Contains("capturing a CUDA graph"));
  CHECK(staged == qcclInvalidUsage);
  CHECK_THAT(why_staged, Catch::Contains("capturing a CUDA graph"));
  CHECK(nodes == 0);
  QCCL_REQUIRE_OK(qcclCommSetStream(w.comm(), nullptr));

  // The communicator is intact.
  QCCL_REQUIRE_OK(qcclAllReduce(dev.get(), dev.get(), count, qcclFloat32, qcclSum, w.comm()));
}

// ---- The fft codec on cuFFT (run with QCCL_GPU_FFT=cufft: CTest's device_ranks_n2_cufft*) ----------

// Rank r's gradient-like input for the fft cases: a smooth wave (what the codec is for) under a little
// of the reference noise, as float32 bytes.
std::vector<uint8_t> smooth_inputs(int rank, size_t count, int step) {
  std::vector<uint8_t> bytes(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) {
    const double t = static_cast<double>(i);
    const float v = static_cast<float>(std::sin(0.002 * t + rank + step) + 0.3 * std::cos(0.037 * t * (step + 1)) +
                                       0.02 * input_value(DataType::kFloat32, RedOp::kSum, rank + 7 * step, i));
    std::memcpy(&bytes[i * sizeof(float)], &v, sizeof v);
  }
  return bytes;
}

// The l2 distance of float32 bytes from a reference.
double distance(const std::vector<uint8_t>& got, const std::vector<double>& want) {
  double d = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    float g = 0;
    std::memcpy(&g, &got[i * sizeof(float)], sizeof g);
    d += (g - want[i]) * (g - want[i]);
  }
  return std::sqrt(d);
}

bool cufft_run() {
  const char* v = std::getenv("QCCL_GPU_FFT");
  return v && std::string(v) == "cufft";
}

// cuFFT rounds otherwise than the host's FFT, so the device's bits are not the host's; what must hold
// is the codec's contract: one result on every rank, as accurate as the host codec's (which bins a
// near tie keeps is all that rounding changes), and error feedback carrying a residual across steps.
TEST_CASE("the fft codec on cuFFT: one result on every rank, as accurate as the host's", "[.][cufft]") {
  World& w = world();
  REQUIRE(cufft_run());
  for (const char* spec : {"fft:theta=0.9,bits=10,segment=4096,fallback=off",
                           "fft:theta=0.5,bits=8,mant=4,segment=777,index=coo,max=auto,round=nearest,fallback=off",
                           "fft:theta=0.85,bits=12,segment=2048,ef=on,fallback=off"}) {
    Codec codec(spec);
    for (size_t count : {size_t{1} << 18, size_t{300001}}) {
      State host_state(w.comm(), count), device_state(w.comm(), count);
      for (int step = 0; step < 3; ++step) {  // (the steps matter to the ef=on spec: its residual)
        INFO(spec << ", " << count << " values, step " << step);
        const std::vector<uint8_t> send = smooth_inputs(w.rank(), count, step);
        std::vector<double> exact(count, 0.0);
        for (int r = 0; r < w.size(); ++r) {
          const std::vector<uint8_t> theirs = smooth_inputs(r, count, step);
          for (size_t i = 0; i < count; ++i) {
            float v = 0;
            std::memcpy(&v, &theirs[i * sizeof(float)], sizeof v);
            exact[i] += v;
          }
        }
        std::vector<uint8_t> host(send.size());
        QCCL_REQUIRE_OK(qcclAllReduceCompressed(send.data(), host.data(), count, qcclFloat32, qcclSum, codec.handle,
                                                host_state.handle, w.comm()));
        DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
        QCCL_REQUIRE_OK(qcclAllReduceCompressed(dsend.get(), drecv.get(), count, qcclFloat32, qcclSum, codec.handle,
                                                device_state.handle, w.comm()));
        const std::vector<uint8_t> device = drecv.read();
        require_same_everywhere(device.data(), device.size());
        const double host_error = distance(host, exact), device_error = distance(device, exact);
        double norm = 0;
        for (double v : exact) norm += v * v;
        INFO("relative error: host " << host_error / std::sqrt(norm) << ", device " << device_error / std::sqrt(norm));
        CHECK(device_error <= 1.02 * host_error);
        CHECK(device_error >= 0.98 * host_error);
      }
    }
  }
}

// A call on cuFFT on one rank and on the host's FFT on another must not sum their spectra: every rank
// fails with qcclMismatch (the frame headers' codec hashes differ), the message naming the cause. (On
// a communicator split off for it: the failure breaks the communicator, which is then aborted.) Every
// rank first makes one collective on device buffers there, where the ranks choose their GPU wire
// together (README, QCCL_GPU_WIRE): without it rank 1's call would begin with that choice, and the
// ranks' first messages would differ before any codec does.
TEST_CASE("an fft call on cuFFT on one rank and on host buffers on another fails on every rank",
          "[.][cufft-mismatch]") {
  World& w = world();
  REQUIRE(cufft_run());
  qcclComm_t comm = nullptr;
  QCCL_REQUIRE_OK(qcclCommSplit(w.comm(), 0, w.rank(), &comm, nullptr));
  Codec codec("fft:theta=0.9,bits=10,segment=4096,fallback=off");
  const size_t count = 100000;
  const std::vector<uint8_t> send = smooth_inputs(w.rank(), count, 0);
  std::vector<uint8_t> host(send.size());
  DeviceBuffer dsend(send), drecv(std::vector<uint8_t>(send.size(), 0));
  QCCL_REQUIRE_OK(qcclAllReduce(dsend.get(), drecv.get(), count, qcclFloat32, qcclSum, comm));
  const qcclResult_t result =
      w.rank() == 0 ? qcclAllReduceCompressed(send.data(), host.data(), count, qcclFloat32, qcclSum, codec.handle,
                                              nullptr, comm)
                    : qcclAllReduceCompressed(dsend.get(), drecv.get(), count, qcclFloat32, qcclSum, codec.handle,
                                              nullptr, comm);
  const std::string why = qcclGetLastError(nullptr);
  CHECK(result == qcclMismatch);
  CHECK_THAT(why, Catch::Contains("their codecs differ") && Catch::Contains("QCCL_GPU_FFT=cufft"));
  CHECK(qcclCommAbort(comm) == qcclSuccess);
  // The job's communicator is intact.
  QCCL_REQUIRE_OK(qcclAllReduce(send.data(), host.data(), count, qcclFloat32, qcclSum, w.comm()));
}

}  // namespace
}  // namespace qccl::test
