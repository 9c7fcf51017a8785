// The NCCL drop-in's device paths, on a machine with GPUs: an NCCL program linked with the real
// libnccl.so.2, run with libqccl_nccl.so preloaded, one GPU per rank. Device buffers go to the real NCCL
// (its communicator made at the first device call, from an id sent over qccl), PreMulSum ops get their
// real twins, calls during graph capture go to the real NCCL, pinned host buffers run on qccl after the
// stream's earlier work, and groups mixing host and device buffers are refused. With
// QCCL_NCCL_DEVICE=qccl device buffers run on qccl's device path instead (results checked the same
// way, after the stream's earlier work), PreMulSum ops on them are refused, graph capture still goes
// to the real NCCL, and a group may mix host and device buffers. Exits 77 (skipped) without enough
// CUDA devices.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

int failures = 0;
#define EXPECT(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "%s:%d: FAILED: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                   \
      std::fprintf(stderr, "\n");                                          \
      ++failures;                                                          \
    }                                                                      \
  } while (0)
#define NCCL_OK(call)                                                                                    \
  do {                                                                                                   \
    ncclResult_t r_ = (call);                                                                            \
    if (r_ != ncclSuccess) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_),    \
                   ncclGetLastError(nullptr));                                                           \
      std::exit(1);                                                                                      \
    }                                                                                                    \
  } while (0)
#define CUDA_OK(call)                                                                                    \
  do {                                                                                                   \
    cudaError_t e_ = (call);                                                                             \
    if (e_ != cudaSuccess) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));      \
      std::exit(1);                                                                                      \
    }                                                                                                    \
  } while (0)

int env_int(const char* a, const char* b, int fallback) {
  for (const char* name : {a, b})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return fallback;
}

ncclUniqueId first_id(int rank) {
  ncclUniqueId id{};
  const char* file = std::getenv("NCCL_TEST_ID_FILE");
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    if (file) {
      std::string tmp = std::string(file) + ".tmp";
      std::ofstream(tmp, std::ios::binary).write(id.internal, sizeof(id.internal));
      std::rename(tmp.c_str(), file);
    }
    return id;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    std::ifstream in(file, std::ios::binary);
    if (in && in.read(id.internal, sizeof(id.internal))) return id;
    if (std::chrono::steady_clock::now() > deadline) std::exit(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

int main() {
  const int rank = env_int("QCCL_RANK", "OMPI_COMM_WORLD_RANK", 0);
  const int size = env_int("QCCL_NRANKS", "OMPI_COMM_WORLD_SIZE", 1);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < size) {
    std::printf("skipped: %d CUDA devices for %d ranks\n", devices, size);
    return 77;
  }
  CUDA_OK(cudaSetDevice(rank));
  ncclComm_t comm = nullptr;
  NCCL_OK(ncclCommInitRank(&comm, size, first_id(rank), rank));
  int device = -1;
  NCCL_OK(ncclCommCuDevice(comm, &device));
  EXPECT(device == rank, "ncclCommCuDevice gave %d", device);

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  const size_t count = 1 << 20;
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 13);
  float *dsend = nullptr, *drecv = nullptr;
  CUDA_OK(cudaMalloc(&dsend, count * sizeof(float)));
  CUDA_OK(cudaMalloc(&drecv, count * sizeof(float)));
  CUDA_OK(cudaMemcpy(dsend, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  const double ranks_sum = size * (size + 1) / 2.0;
  auto check = [&](const float* d, double scale, const char* what) {
    std::vector<float> out(count);
    CUDA_OK(cudaMemcpy(out.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += out[i] != static_cast<float>(scale * (i % 13));
    EXPECT(wrong == 0, "%s: %zu wrong values", what, wrong);
  };

  const char* mode = std::getenv("QCCL_NCCL_DEVICE");
  const bool on_qccl = mode && std::strcmp(mode, "qccl") == 0;

  // Device buffers: the real NCCL, its communicator made now (or qccl's device path). The input is
  // made on the stream just before the call, which must run after it.
  CUDA_OK(cudaMemsetAsync(dsend, 0, count * sizeof(float), stream));
  CUDA_OK(cudaMemcpyAsync(dsend, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream));
  NCCL_OK(ncclAllReduce(dsend, drecv, count, ncclFloat32, ncclSum, comm, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  check(drecv, ranks_sum, "device ncclAllReduce");
  NCCL_OK(ncclAllGather(dsend, drecv, count / size, ncclFloat32, comm, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  {
    std::vector<float> out(count);
    CUDA_OK(cudaMemcpy(out.data(), drecv, count * sizeof(float), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    const size_t block = count / size;
    for (size_t i = 0; i < block * size; ++i)
      wrong += out[i] != static_cast<float>(i / block + 1) * static_cast<float>(i % block % 13);
    EXPECT(wrong == 0, "device ncclAllGather: %zu wrong values", wrong);
  }

  // A PreMulSum op made on the drop-in's communicator gets its real twin at its first device call
  // (qccl scales on the host, so it refuses the op on device buffers).
  float two = 2.0f;
  ncclRedOp_t premul;
  NCCL_OK(ncclRedOpCreatePreMulSum(&premul, &two, ncclFloat32, ncclScalarHostImmediate, comm));
  if (on_qccl) {
    EXPECT(ncclAllReduce(dsend, drecv, count, ncclFloat32, premul, comm, stream) == ncclInvalidUsage, "%s",
           ncclGetLastError(nullptr));
  } else {
    NCCL_OK(ncclAllReduce(dsend, drecv, count, ncclFloat32, premul, comm, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    check(drecv, 2 * ranks_sum, "device ncclAllReduce with PreMulSum");
  }
  NCCL_OK(ncclRedOpDestroy(premul, comm));

  // Graph capture: the call is captured by the real NCCL, and the graph replays it.
  CUDA_OK(cudaMemset(drecv, 0, count * sizeof(float)));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  NCCL_OK(ncclAllReduce(dsend, drecv, count, ncclFloat32, ncclSum, comm, stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  check(drecv, ranks_sum, "captured ncclAllReduce");

  // Pinned host memory runs on qccl, after the copy the stream already holds.
  float* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, count * sizeof(float)));
  std::memset(pinned, 0, count * sizeof(float));
  CUDA_OK(cudaMemcpyAsync(pinned, dsend, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
  NCCL_OK(ncclAllReduce(pinned, pinned, count, ncclFloat32, ncclSum, comm, stream));
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += pinned[i] != static_cast<float>(ranks_sum * (i % 13));
  EXPECT(wrong == 0, "pinned host ncclAllReduce after a copy on its stream: %zu wrong values", wrong);

  // Refused: one call with a device and a host buffer; a group with both kinds, unless qccl runs both.
  EXPECT(ncclAllReduce(dsend, pinned, count, ncclFloat32, ncclSum, comm, stream) == ncclInvalidArgument, "%s",
         ncclGetLastError(nullptr));
  CUDA_OK(cudaMemcpy(dsend, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(pinned, host.data(), count * sizeof(float), cudaMemcpyHostToHost));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(dsend, drecv, count, ncclFloat32, ncclSum, comm, stream));
  NCCL_OK(ncclAllReduce(pinned, pinned, count, ncclFloat32, ncclSum, comm, stream));
  ncclResult_t mixed = ncclGroupEnd();
  if (on_qccl) {
    EXPECT(mixed == ncclSuccess, "mixed group on qccl: %s: %s", ncclGetErrorString(mixed), ncclGetLastError(nullptr));
    CUDA_OK(cudaStreamSynchronize(stream));
    check(drecv, ranks_sum, "grouped device ncclAllReduce on qccl");
    wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += pinned[i] != static_cast<float>(ranks_sum * (i % 13));
    EXPECT(wrong == 0, "grouped pinned host ncclAllReduce: %zu wrong values", wrong);
  } else {
    EXPECT(mixed == ncclInvalidUsage && std::strstr(ncclGetLastError(nullptr), "mixes"), "mixed group: %s: %s",
           ncclGetErrorString(mixed), ncclGetLastError(nullptr));
  }

  CUDA_OK(cudaFreeHost(pinned));
  CUDA_OK(cudaFree(dsend));
  CUDA_OK(cudaFree(drecv));
  NCCL_OK(ncclCommFinalize(comm));
  NCCL_OK(ncclCommDestroy(comm));
  if (failures) return 1;
  std::printf("rank %d: device paths OK\n", rank);
  return 0;
}
