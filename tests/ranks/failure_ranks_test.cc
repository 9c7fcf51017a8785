// Failures on real processes, one scenario per CTest entry (each breaks its communicator): ranks that
// disagree, a peer that dies before or during a collective, a peer that is stuck past QCCL_TIMEOUT,
// and aborts. Every surviving rank must return an error that tells the story, never hang.
#include <cmath>
#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/ranks/rank_test_util.h"

namespace qccl::test {
namespace {

struct Job {
  qcclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  // Most scenarios need a rank that is neither the hub nor the failing one.
  explicit Job(int min_size = 3) {
    QCCL_REQUIRE_OK(qcclCommInitEnv(&comm, nullptr));
    qcclCommUserRank(comm, &rank);
    qcclCommCount(comm, &size);
    REQUIRE(size >= min_size);
  }
};

std::string last_error() { return qcclGetLastError(nullptr); }

// Polls comm's asynchronous error (as an idle rank learns of the others' failures) for up to 30 s.
qcclResult_t await_async_error(qcclComm_t comm) {
  qcclResult_t async = qcclSuccess;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (async == qcclSuccess && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    QCCL_REQUIRE_OK(qcclCommGetAsyncError(comm, &async));
  }
  return async;
}

// A second thread that aborts comm after 200 ms, while this one is blocked in a call on it.
std::thread abort_soon(qcclComm_t comm) {
  return std::thread([comm] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(qcclCommAbort(comm) == qcclSuccess);
  });
}

// The process vanishes at once with status 0, as if killed (qcclrun ignores a clean exit): no
// destructors, no atexit, and no sanitizer interceptor that would let other threads run on.
[[noreturn]] void vanish() {
  syscall(SYS_exit_group, 0);
  __builtin_unreachable();
}

void warm_up(const Job& job) {
  std::vector<float> x(1000, 1.0f), y(1000);
  QCCL_REQUIRE_OK(qcclAllReduce(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, job.comm));
  REQUIRE(y[0] == static_cast<float>(job.size));
}

// Returns on `victim` only once every other rank has finished the warm-up: they tell it so with a
// small message, whose send completes locally (eager), so the victim may then vanish without
// failing anyone's warm-up.
void all_warmed_up(const Job& job, int victim) {
  int token = 1;
  if (job.rank != victim) {
    QCCL_REQUIRE_OK(qcclSend(&token, 1, qcclInt32, victim, job.comm));
    return;
  }
  std::vector<int> tokens(job.size);
  QCCL_REQUIRE_OK(qcclGroupStart());
  for (int r = 0; r < job.size; ++r)
    if (r != victim) QCCL_REQUIRE_OK(qcclRecv(&tokens[r], 1, qcclInt32, r, job.comm));
  QCCL_REQUIRE_OK(qcclGroupEnd());
}

// The process listening on TCP `port` (IPv4), from /proc/net/tcp's inode and /proc/*/fd; -1 if none.
pid_t listener_pid(int port) {
  std::ifstream tcp("/proc/net/tcp");
  std::string line, inode;
  std::getline(tcp, line);  // header
  char want[8];
  std::snprintf(want, sizeof(want), ":%04X", port);
  while (std::getline(tcp, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, skip;
    f >> sl >> local >> remote >> state;
    if (local.size() < 5 || local.substr(local.size() - 5) != want || state != "0A") continue;
    for (int i = 0; i < 5; ++i) f >> skip;  // tx:rx, tr:when, retrnsmt, uid, timeout
    f >> inode;
  }
  if (inode.empty()) return -1;
  const std::string target = "socket:[" + inode + "]";
  DIR* proc = opendir("/proc");
  pid_t found = -1;
  while (dirent* e = proc ? readdir(proc) : nullptr) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    const std::string fd_dir = "/proc/" + std::string(e->d_name) + "/fd";
    DIR* fds = opendir(fd_dir.c_str());
    while (dirent* fd = fds ? readdir(fds) : nullptr) {
      char link[64] = {};
      const ssize_t n = readlink((fd_dir + "/" + fd->d_name).c_str(), link, sizeof(link) - 1);
      if (n > 0 && target == link) found = pid;
    }
    if (fds) closedir(fds);
  }
  if (proc) closedir(proc);
  return found;
}

// The scenarios that run many cases on one job: a communicator of the world's ranks for each case
// (a mismatch breaks the one it happens on), and the check that every rank's call returned `expected`,
// made on the world communicator once every rank has returned, before any aborts (an abort tells the
// peers, whose calls would then fail with qcclRemoteError instead).
qcclComm_t fresh_comm(qcclComm_t world, int rank, int size, qcclConfig_t* config = nullptr) {
  qcclUniqueId id;
  if (rank == 0) REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  QCCL_REQUIRE_OK(qcclBroadcast(&id, &id, sizeof(id), qcclUint8, 0, world));
  qcclComm_t comm = nullptr;
  QCCL_REQUIRE_OK(config ? qcclCommInitRankConfig(&comm, size, id, rank, config)
                         : qcclCommInitRank(&comm, size, id, rank));
  return comm;
}

void check_every_rank_returned(qcclComm_t world, int size, qcclResult_t result, qcclResult_t expected) {
  const int32_t code = result;
  std::vector<int32_t> codes(size);
  QCCL_REQUIRE_OK(qcclAllGather(&code, codes.data(), 1, qcclInt32, world));
  for (int r = 0; r < size; ++r) CHECK(codes[r] == expected);
}

}  // namespace

TEST_CASE("count mismatch: every rank fails with qcclMismatch naming both calls", "[mismatch]") {
  Job job;
  warm_up(job);
  std::vector<float> x(200, 1.0f), y(200);
  const size_t count = job.rank == 0 ? 100 : 200;
  qcclResult_t result = qcclAllReduce(x.data(), y.data(), count, qcclFloat32, qcclSum, job.comm);
  CHECK(result == qcclMismatch);
  CHECK_THAT(last_error(), Catch::Contains("count=100") && Catch::Contains("count=200"));
  qcclResult_t async = qcclSuccess;
  QCCL_REQUIRE_OK(qcclCommGetAsyncError(job.comm, &async));
  CHECK(async == qcclMismatch);
  // A broken communicator refuses further work with the same story, and abort always returns.
  CHECK(qcclAllReduce(x.data(), y.data(), 10, qcclFloat32, qcclSum, job.comm) == qcclMismatch);
  // Also a group's call, refused as the group ends: it is over then, so its codec state is free for
  // a checkpoint before the request is waited for (the state stayed 'in use' until then).
  qcclCodec_t q8 = nullptr;
  qcclCodecState_t state = nullptr;
  qcclRequest_t request = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate("q8:ef=on", &q8));
  QCCL_REQUIRE_OK(qcclCodecStateCreate(job.comm, 10, &state));
  QCCL_REQUIRE_OK(qcclGroupStart());
  QCCL_REQUIRE_OK(qcclIAllReduceCompressed(x.data(), y.data(), 10, qcclFloat32, qcclSum, q8, state, job.comm, &request));
  QCCL_REQUIRE_OK(qcclGroupEnd());
  size_t bytes = 0;
  QCCL_REQUIRE_OK(qcclCodecStateSize(state, &bytes));
  std::vector<char> checkpoint(bytes);
  CHECK(qcclCodecStateSave(state, checkpoint.data(), bytes) == qcclSuccess);
  CHECK(qcclWait(&request) == qcclMismatch);
  qcclCodecStateDestroy(state);
  qcclCodecDestroy(q8);
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("different collectives at the same point: every rank fails with qcclMismatch", "[mismatch-kind]") {
  Job job;
  warm_up(job);
  std::vector<float> x(3000, 1.0f), y(3000 * 8);
  qcclResult_t result = job.rank == job.size - 1
                            ? qcclAllGather(x.data(), y.data(), 100, qcclFloat32, job.comm)
                            : qcclAllReduce(x.data(), y.data(), 100, qcclFloat32, qcclSum, job.comm);
  CHECK(result == qcclMismatch);
  CHECK_THAT(last_error(), Catch::Contains("AllGather(count=100") && Catch::Contains("AllReduce(count=100"));
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("fft codecs of different theta: every rank fails with qcclMismatch before decoding another's bins",
          "[fft-mismatch]") {
  Job job;
  warm_up(job);
  qcclCodec_t codec = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate(job.rank == 0 ? "fft:theta=0.9,segment=1024" : "fft:theta=0.8,segment=1024", &codec));
  std::vector<float> x(5000), y(5000, 7.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.01f * static_cast<float>(i));
  qcclResult_t result = qcclAllReduceCompressed(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, codec, nullptr, job.comm);
  CHECK(result == qcclMismatch);
  CHECK_THAT(last_error(), Catch::Contains("codec"));
  qcclCodecDestroy(codec);
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("different codecs at the same point: every rank fails with qcclMismatch", "[codec-mismatch]") {
  Job job;
  warm_up(job);
  qcclCodec_t codec = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate(job.rank == 0 ? "q8" : "q4", &codec));
  std::vector<float> x(5000, 1.0f), y(5000);
  qcclResult_t result = qcclAllReduceCompressed(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, codec, nullptr, job.comm);
  CHECK(result == qcclMismatch);
  CHECK_THAT(last_error(), Catch::Contains("codec"));
  qcclCodecDestroy(codec);
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("different codecs in a compressed all-gather: every rank fails with qcclMismatch",
          "[codec-mismatch-allgather]") {
  Job job;
  warm_up(job);
  qcclCodec_t codec = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate(job.rank == 0 ? "q8" : "q4", &codec));
  std::vector<float> x(5000, 1.0f), y(5000 * job.size);
  qcclResult_t result = qcclAllGatherCompressed(x.data(), y.data(), x.size(), qcclFloat32, codec, nullptr, job.comm);
  CHECK(result == qcclMismatch);
  CHECK_THAT(last_error(), Catch::Contains("codec"));
  qcclCodecDestroy(codec);
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("levels learned by each rank alone differ: every rank fails with qcclMismatch; root's levels agree",
          "[levels-mismatch]") {
  Job job;
  warm_up(job);
  qcclCodec_t base = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate("q3:bucket=64", &base));
  std::vector<float> data(4096);
  for (size_t i = 0; i < data.size(); ++i) data[i] = std::sin(0.37f * static_cast<float>(i) * (job.rank + 1)) * (1 + i % 5);
  std::vector<float> x(640), y(640 * job.size);
  for (size_t i = 0; i < x.size(); ++i) x[i] = data[i];
  // Shared: every rank gets rank 0's levels (the others pass no data), and the all-gather runs.
  qcclCodec_t shared = nullptr;
  QCCL_REQUIRE_OK(qcclCodecLearnLevels(base, job.rank == 0 ? data.data() : nullptr, job.rank == 0 ? data.size() : 0,
                                       qcclFloat32, 2, 0, job.comm, &shared));
  QCCL_REQUIRE_OK(qcclAllGatherCompressed(x.data(), y.data(), x.size(), qcclFloat32, shared, nullptr, job.comm));
  // Its spec names the levels and reads back as the same codec: the same all-gather runs with it.
  size_t needed = 0;
  QCCL_REQUIRE_OK(qcclCodecGetSpec(shared, nullptr, 0, &needed));
  std::string spec(needed, '?');
  CHECK(qcclCodecGetSpec(shared, spec.data(), needed - 1, nullptr) == qcclInvalidArgument);
  CHECK_THAT(last_error(), Catch::Contains("bytes = " + std::to_string(needed - 1)));
  CHECK(spec == std::string(needed, '?'));  // nothing written
  QCCL_REQUIRE_OK(qcclCodecGetSpec(shared, spec.data(), spec.size(), nullptr));
  spec.pop_back();  // the NUL
  CHECK_THAT(spec, Catch::StartsWith("q3:") && Catch::Contains(",levels=0/"));
  qcclCodec_t reread = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate(spec.c_str(), &reread));
  std::vector<float> y2(y.size());
  QCCL_REQUIRE_OK(qcclAllGatherCompressed(x.data(), y2.data(), x.size(), qcclFloat32, reread, nullptr, job.comm));
  CHECK(y2 == y);
  qcclCodecDestroy(reread);
  // With a communicator, one rank's refusal fails every rank at once and the communicator stays in
  // step (the root's refusal came before its exchange, and the others went on to it and mismatched).
  qcclCodec_t bad = nullptr;
  const qcclDataType_t type = job.rank == 0 ? qcclFloat64 : qcclFloat32;
  CHECK(qcclCodecLearnLevels(base, data.data(), data.size(), type, 1, 0, job.comm, &bad) == qcclInvalidArgument);
  CHECK_THAT(last_error(), Catch::Contains(job.rank == 0 ? "datatype = " : "rank 0 refused its arguments"));
  if (job.size > 1) {
    CHECK(qcclCodecLearnLevels(base, data.data(), data.size(), qcclFloat32, 1, job.rank == 1 ? 1 : 0, job.comm, &bad) ==
          qcclInvalidArgument);
    CHECK_THAT(last_error(), Catch::Contains("every rank must pass the same"));
    // Codecs of the same bits but another bucket: the root's levels would fit its bucket only (it
    // used to succeed, and the first collective failed).
    qcclCodec_t other = nullptr;
    QCCL_REQUIRE_OK(qcclCodecCreate(job.rank == 1 ? "q3:bucket=128" : "q3:bucket=64", &other));
    CHECK(qcclCodecLearnLevels(other, data.data(), data.size(), qcclFloat32, 1, 0, job.comm, &bad) ==
          qcclInvalidArgument);
    CHECK_THAT(last_error(), Catch::Contains("every rank must pass the same codec"));
    qcclCodecDestroy(other);
  }
  CHECK(bad == nullptr);
  float one = 1, sum = 0;
  QCCL_REQUIRE_OK(qcclAllReduce(&one, &sum, 1, qcclFloat32, qcclSum, job.comm));
  CHECK(sum == static_cast<float>(job.size));
  // Alone: each rank's own data give its own levels, which the frame headers' codec hash tells apart.
  qcclCodec_t own = nullptr;
  QCCL_REQUIRE_OK(qcclCodecLearnLevels(base, data.data(), data.size(), qcclFloat32, 2, 0, nullptr, &own));
  qcclResult_t result = qcclAllGatherCompressed(x.data(), y.data(), x.size(), qcclFloat32, own, nullptr, job.comm);
  CHECK(result == qcclMismatch);
  CHECK_THAT(last_error(), Catch::Contains("codec"));
  // Bad input is refused with the argument named.
  qcclCodec_t fp16 = nullptr, out = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate("fp16", &fp16));
  CHECK(qcclCodecLearnLevels(fp16, data.data(), data.size(), qcclFloat32, 1, 0, nullptr, &out) == qcclInvalidArgument);
  CHECK_THAT(last_error(), Catch::Contains("levels"));
  CHECK(qcclCodecLearnLevels(base, data.data(), data.size(), qcclFloat32, 0, 0, nullptr, &out) == qcclInvalidArgument);
  CHECK_THAT(last_error(), Catch::Contains("epochs = 0"));
  CHECK(qcclCodecLearnLevels(base, data.data(), data.size(), qcclInt32, 1, 0, nullptr, &out) == qcclInvalidArgument);
  CHECK_THAT(last_error(), Catch::Contains("datatype"));
  qcclCodecDestroy(fp16);
  qcclCodecDestroy(own);
  qcclCodecDestroy(shared);
  qcclCodecDestroy(base);
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("segment lists: one list runs, exact segments arrive exactly; different lists fail with qcclMismatch",
          "[segments-mismatch]") {
  Job job;
  warm_up(job);
  qcclCodec_t codec = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate("q2:bucket=64", &codec));
  const size_t count = 1000;
  std::vector<float> x(count), y(count * job.size);
  for (size_t i = 0; i < count; ++i) x[i] = std::sin(0.1f * static_cast<float>(i) + job.rank);
  const qcclSegment_t same[] = {{400, 0}, {100, 1}, {500, 0}};
  QCCL_REQUIRE_OK(qcclAllGatherCompressedSegments(x.data(), y.data(), count, qcclFloat32, codec, same, 3, nullptr, job.comm));
  for (int q = 0; q < job.size; ++q)
    for (size_t i = 400; i < 500; ++i) REQUIRE(y[q * count + i] == std::sin(0.1f * static_cast<float>(i) + q));
  // Bad lists are refused before anything is sent, naming what is wrong.
  const qcclSegment_t short_list[] = {{400, 0}, {100, 1}};
  CHECK(qcclAllGatherCompressedSegments(x.data(), y.data(), count, qcclFloat32, codec, short_list, 2, nullptr,
                                        job.comm) == qcclInvalidArgument);
  CHECK_THAT(last_error(), Catch::Contains("segments hold 500 values but sendcount = 1000"));
  const qcclSegment_t bad_flag[] = {{1000, 2}};
  CHECK(qcclAllGatherCompressedSegments(x.data(), y.data(), count, qcclFloat32, codec, bad_flag, 1, nullptr,
                                        job.comm) == qcclInvalidArgument);
  CHECK_THAT(last_error(), Catch::Contains("segments[0].exact = 2"));
  CHECK(qcclAllGatherCompressedSegments(x.data(), y.data(), count, qcclFloat32, codec, nullptr, 3, nullptr, job.comm) ==
        qcclInvalidArgument);
  CHECK_THAT(last_error(), Catch::Contains("segments is NULL"));
  // No list at all is no segment call: it was taken for the plain call.
  CHECK(qcclAllGatherCompressedSegments(x.data(), y.data(), count, qcclFloat32, codec, nullptr, 0, nullptr, job.comm) ==
        qcclInvalidArgument);
  CHECK_THAT(last_error(), Catch::Contains("nsegments = 0 is out of range [1, 1048576]"));
  // Rank 0 cuts the block elsewhere: every rank fails, through the codec hash of the frame headers.
  const qcclSegment_t other[] = {{400, 0}, {101, 1}, {499, 0}};
  const qcclResult_t result = qcclAllGatherCompressedSegments(x.data(), y.data(), count, qcclFloat32, codec,
                                                              job.rank == 0 ? other : same, 3, nullptr, job.comm);
  CHECK(result == qcclMismatch);
  CHECK_THAT(last_error(), Catch::Contains("codec"));
  qcclCodecDestroy(codec);
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("Marsit states at different steps: every rank fails with qcclMismatch saying so", "[marsit-step]") {
  Job job;
  warm_up(job);
  qcclCodec_t codec = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate("sign:eta_s=0.01,k=100", &codec));
  const size_t count = 5000;
  qcclCodecState_t state = nullptr;
  QCCL_REQUIRE_OK(qcclCodecStateCreate(job.comm, count, &state));
  size_t bytes = 0;
  QCCL_REQUIRE_OK(qcclCodecStateSize(state, &bytes));
  std::vector<uint8_t> step0(bytes);
  QCCL_REQUIRE_OK(qcclCodecStateSave(state, step0.data(), bytes));
  std::vector<float> u(count, 0.5f), g(count);
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(u.data(), g.data(), count, qcclFloat32, qcclAvg, codec, state, job.comm));
  // Rank 1 restores the wrong checkpoint: it would run round 0 (full precision) where the others run
  // round 1 (signs).
  if (job.rank == 1) QCCL_REQUIRE_OK(qcclCodecStateLoad(state, step0.data(), bytes));
  qcclResult_t result = qcclAllReduceCompressed(u.data(), g.data(), count, qcclFloat32, qcclAvg, codec, state, job.comm);
  CHECK(result == qcclMismatch);
  CHECK_THAT(last_error(), Catch::Contains("step 0") && Catch::Contains("step 1") &&
                               Catch::Contains("codec states are at different steps"));
  qcclCodecStateDestroy(state);
  qcclCodecDestroy(codec);
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("IntSGD states with different learning rates: every rank fails with qcclMismatch naming alpha",
          "[intsgd-alpha]") {
  Job job;
  warm_up(job);
  qcclCodec_t codec = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate("int8:alpha=lr", &codec));
  const size_t count = 5000;
  qcclCodecState_t state = nullptr;
  QCCL_REQUIRE_OK(qcclCodecStateCreate(job.comm, count, &state));
  QCCL_REQUIRE_OK(qcclCodecStateSetLearningRate(state, 0.1));
  std::vector<float> x(count, 0.5f), g(count);
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat32, qcclAvg, codec, state, job.comm));
  // Rank 1 passes another learning rate: its alpha differs, and integers under different scales
  // would add up to garbage. The frame headers carry alpha, so the call fails instead.
  if (job.rank == 1) QCCL_REQUIRE_OK(qcclCodecStateSetLearningRate(state, 0.2));
  qcclResult_t result = qcclAllReduceCompressed(x.data(), g.data(), count, qcclFloat32, qcclAvg, codec, state, job.comm);
  CHECK(result == qcclMismatch);
  CHECK_THAT(last_error(), Catch::Contains("shared scale alpha") && Catch::Contains("codec states diverged"));
  qcclCodecStateDestroy(state);
  qcclCodecDestroy(codec);
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

// Rooted collectives whose ranks pass different roots. The disagreeing ranks may have no link in
// either rank's plan (rank 0 believes it is the root of a chain the others start at rank 1), so the
// plans' own frame headers cannot see it; a root that sends eagerly may even be done before anyone
// looks. Runs at 2, 3 and 4 ranks: every rank must fail with qcclMismatch naming both roots, for
// every algorithm, small and large, never succeed with another rank's data or wait for QCCL_TIMEOUT.
// The same holds for a count that differs on one rank only, which the ranks upstream of it never hear.
TEST_CASE("ranks that pass different roots: every rank fails with qcclMismatch naming both", "[root-mismatch]") {
  Job world(2);
  const int rank = world.rank, size = world.size;
  // The odd rank passes root 0 (or half the count) where the others pass root 1 (and the count).
  struct Disagreement {
    int odd_rank;
    bool on_count;
  };
  const Disagreement disagreements[] = {{0, false}, {size - 1, false}, {size - 1, true}};
  for (const char* coll : {"broadcast", "reduce"})
    for (const char* algorithm : {"chain", "binomial"})
      for (size_t full : {size_t{1000}, size_t{4} << 20})  // 4 KB (eager) and 16 MiB (rendezvous)
        for (const Disagreement& d : disagreements) {
          const bool odd = rank == d.odd_rank;
          const int root = odd && !d.on_count ? 0 : 1;
          const size_t count = odd && d.on_count ? full / 2 : full;
          INFO(coll << " via " << algorithm << ", " << full << " floats, rank " << d.odd_rank << " passes "
                    << (d.on_count ? "half the count" : "root 0, the others root 1") << "; this rank " << rank);
          // A fresh communicator for each case, forced to `algorithm`.
          const std::string algorithms = std::string(coll) + "=" + algorithm;
          qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
          config.algorithms = algorithms.c_str();
          qcclComm_t comm = fresh_comm(world.comm, rank, size, &config);
          std::vector<float> in(full, static_cast<float>(rank + 1)), out(full, -1.0f);
          auto call = [&](int r, size_t n) {
            return coll[0] == 'b' ? qcclBroadcast(in.data(), out.data(), n, qcclFloat32, r, comm)
                                  : qcclReduce(in.data(), out.data(), n, qcclFloat32, qcclSum, r, comm);
          };
          // The same call with agreeing arguments runs the forced algorithm.
          QCCL_REQUIRE_OK(call(1, full));
          qcclStats_t stats{};
          stats.size = sizeof(stats);
          QCCL_REQUIRE_OK(qcclCommGetLastStats(comm, &stats));
          CHECK(std::string(stats.algorithm) == algorithm);
          const qcclResult_t result = call(root, count);
          const std::string error = last_error();
          CHECK(result == qcclMismatch);
          if (d.on_count)
            CHECK_THAT(error, Catch::Contains("count=" + std::to_string(full)) &&
                                  Catch::Contains("count=" + std::to_string(full / 2)));
          else
            CHECK_THAT(error, Catch::Contains("root=0") && Catch::Contains("root=1"));
          qcclResult_t async = qcclSuccess;
          QCCL_REQUIRE_OK(qcclCommGetAsyncError(comm, &async));
          CHECK(async == qcclMismatch);
          check_every_rank_returned(world.comm, size, result, qcclMismatch);
          CHECK(qcclCommAbort(comm) == qcclSuccess);
        }
  QCCL_REQUIRE_OK(qcclCommDestroy(world.comm));
}

// One rank calls a rooted collective (Broadcast, Reduce) where the others call a collective without a
// root (AllReduce, AllGather): their plans may share no link that a frame header crosses (3 ranks,
// recursive doubling against a binomial tree), and the rooted rank's agreement rounds go to ranks
// that never answer them. Every rank must fail with qcclMismatch naming both calls, not wait for
// QCCL_TIMEOUT, at 2, 3 and 4 ranks, small and large, whichever rank is the odd one.
TEST_CASE("a rooted collective where the others call one without a root: every rank fails with qcclMismatch",
          "[rooted-mismatch]") {
  Job world(2);
  const int rank = world.rank, size = world.size;
  for (const char* rooted : {"Broadcast", "Reduce"})
    for (const char* other : {"AllReduce", "AllGather"})
      for (size_t count : {size_t{100}, size_t{1} << 20})  // eager, and rendezvous in the ring
        for (int odd_rank : {0, size - 1}) {
          INFO(rooted << " on rank " << odd_rank << ", " << other << " on the others, " << count
                      << " floats; this rank " << rank);
          qcclComm_t comm = fresh_comm(world.comm, rank, size);
          std::vector<float> in(count, 1.0f), out(count * static_cast<size_t>(size));
          qcclResult_t result;
          if (rank == odd_rank)
            result = rooted[0] == 'B' ? qcclBroadcast(in.data(), out.data(), count, qcclFloat32, 0, comm)
                                      : qcclReduce(in.data(), out.data(), count, qcclFloat32, qcclSum, 0, comm);
          else
            result = other[3] == 'R' ? qcclAllReduce(in.data(), out.data(), count, qcclFloat32, qcclSum, comm)
                                     : qcclAllGather(in.data(), out.data(), count, qcclFloat32, comm);
          const std::string error = last_error();
          CHECK(result == qcclMismatch);
          CHECK_THAT(error, Catch::Contains(std::string(rooted) + "(count=" + std::to_string(count)) &&
                                Catch::Contains(std::string(other) + "(count=" + std::to_string(count)));
          check_every_rank_returned(world.comm, size, result, qcclMismatch);
          CHECK(qcclCommAbort(comm) == qcclSuccess);
        }
  QCCL_REQUIRE_OK(qcclCommDestroy(world.comm));
}

// The listening above starts when a call stalls; a rank that arrives late stalls the others without
// any disagreement. Calls without a root and rooted ones, each with one rank 300 ms late (the others
// listen, then withdraw the receive at the end), must all succeed with the right sums, and nothing
// they listened for may match a later call.
TEST_CASE("a rank that arrives late: the others wait and succeed, rooted calls after them too", "[late-rank]") {
  Job job;
  warm_up(job);
  const size_t count = 1000;
  const float n = static_cast<float>(job.size);
  std::vector<float> x(count, static_cast<float>(job.rank + 1)), y(count * static_cast<size_t>(job.size));
  for (int round = 0; round < 2; ++round) {
    const int late = round % job.size;
    auto arrive = [&] {
      if (job.rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    };
    arrive();
    QCCL_REQUIRE_OK(qcclAllReduce(x.data(), y.data(), count, qcclFloat32, qcclSum, job.comm));
    CHECK(y[count - 1] == n * (n + 1) / 2);
    arrive();
    QCCL_REQUIRE_OK(qcclAllGather(x.data(), y.data(), count, qcclFloat32, job.comm));
    CHECK(y[count * static_cast<size_t>(job.size) - 1] == n);
    arrive();
    QCCL_REQUIRE_OK(qcclReduce(x.data(), y.data(), count, qcclFloat32, qcclSum, 0, job.comm));
    if (job.rank == 0) CHECK(y[0] == n * (n + 1) / 2);
    arrive();
    QCCL_REQUIRE_OK(qcclBroadcast(x.data(), y.data(), count, qcclFloat32, job.size - 1, job.comm));
    CHECK(y[0] == n);
  }
  QCCL_REQUIRE_OK(qcclCommDestroy(job.comm));
}

TEST_CASE("an aggregator that dies fails agg=switch calls with qcclRemoteError naming it", "[aggregator-dies]") {
  Job job;
  warm_up(job);
  const char* aggregators = std::getenv("QCCL_AGGREGATORS");
  REQUIRE(aggregators != nullptr);  // run under qcclrun --aggregators 1
  qcclCodec_t codec = nullptr;
  QCCL_REQUIRE_OK(qcclCodecCreate("int8:alpha=10,agg=switch", &codec));
  std::vector<float> x(1 << 20, 0.5f), y(1 << 20);
  QCCL_REQUIRE_OK(qcclAllReduceCompressed(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, codec, nullptr, job.comm));
  warm_up(job);  // every rank is past the first sum
  if (job.rank == 0) {
    const std::string list = aggregators;
    const pid_t pid = listener_pid(std::atoi(list.substr(list.rfind(':') + 1).c_str()));
    REQUIRE(pid > 0);
    REQUIRE(kill(pid, SIGKILL) == 0);
  }
  // Sums keep being asked for until one fails: in flight when the connection closes (the call breaks)
  // or started after (refused at once). qcclTimeout would mean the death went unnoticed.
  qcclResult_t result = qcclSuccess;
  for (int i = 0; i < 1000 && result == qcclSuccess; ++i)
    result = qcclAllReduceCompressed(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, codec, nullptr, job.comm);
  CHECK(result == qcclRemoteError);
  CHECK_THAT(last_error(), Catch::Contains("aggregator 0") && Catch::Contains("closed its connection"));
  qcclCodecDestroy(codec);
  // An abort is reported to the other ranks, whose calls it fails too: a rank slower to see the
  // aggregator's death (a loaded sanitizer build) would report the abort instead. Every rank watches
  // its own connection to the aggregator and sees it close within milliseconds; give them a second.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("a peer that dies between collectives fails the others with qcclRemoteError", "[dead-peer]") {
  Job job;
  warm_up(job);
  const int victim = job.size - 1;
  all_warmed_up(job, victim);
  if (job.rank == victim) vanish();
  std::vector<float> x(1 << 20, 1.0f), y(1 << 20);
  qcclResult_t result = qcclAllReduce(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, job.comm);
  CHECK(result == qcclRemoteError);  // not qcclTimeout: the control plane noticed at once
  CHECK_THAT(last_error(), Catch::Contains("rank " + std::to_string(victim)));
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("a peer that dies during a collective fails the others with qcclRemoteError", "[dead-peer-during]") {
  Job job;
  warm_up(job);
  const int victim = job.size - 1;
  all_warmed_up(job, victim);
  // 64 MiB per rank: the ring takes far longer than the victim's 5 ms, however slow the machine.
  const size_t count = 16 << 20;
  std::vector<float> x(count, 1.0f), y(count);
  if (job.rank == victim) {
    qcclRequest_t request = nullptr;
    QCCL_REQUIRE_OK(qcclIAllReduce(x.data(), y.data(), count, qcclFloat32, qcclSum, job.comm, &request));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let the transfers start
    vanish();
  }
  qcclResult_t result = qcclAllReduce(x.data(), y.data(), count, qcclFloat32, qcclSum, job.comm);
  CHECK(result == qcclRemoteError);
  CHECK_THAT(last_error(), Catch::Contains("rank " + std::to_string(victim)));
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("a stuck peer: the others time out after QCCL_TIMEOUT and the laggard learns of it", "[stuck-peer]") {
  // Run with QCCL_TIMEOUT=3.
  Job job;
  warm_up(job);
  const int laggard = job.size - 1;
  all_warmed_up(job, laggard);
  if (job.rank == laggard) std::this_thread::sleep_for(std::chrono::seconds(8));
  std::vector<float> x(1000, 1.0f), y(1000);
  qcclResult_t result = qcclAllReduce(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, job.comm);
  CHECK(result == qcclTimeout);
  CHECK_THAT(last_error(), Catch::Contains("no progress"));
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("abort on one rank fails the collective on the others", "[abort]") {
  Job job;
  warm_up(job);
  all_warmed_up(job, 1);
  if (job.rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(qcclCommAbort(job.comm) == qcclSuccess);
    return;
  }
  std::vector<float> x(1000, 1.0f), y(1000);
  qcclResult_t result = qcclAllReduce(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, job.comm);
  CHECK(result == qcclRemoteError);
  CHECK_THAT(last_error(), Catch::Contains("qcclCommAbort was called on rank 1"));
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

TEST_CASE("abort from another thread releases a blocked collective", "[abort-thread]") {
  Job job;
  warm_up(job);
  all_warmed_up(job, 0);
  // Rank 0 blocks in a collective nobody else joins; a second thread aborts it.
  if (job.rank == 0) {
    std::thread aborter = abort_soon(job.comm);
    std::vector<float> x(1000, 1.0f), y(1000);
    qcclResult_t result = qcclAllReduce(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, job.comm);
    aborter.join();
    CHECK(result == qcclAborted);
    CHECK_THAT(last_error(), Catch::Contains("qcclCommAbort"));
    return;
  }
  // The others learn of the abort through the control plane while idle.
  const qcclResult_t async = await_async_error(job.comm);
  CHECK(async == qcclRemoteError);
  CHECK(qcclCommDestroy(job.comm) == qcclSuccess);  // destroy of a broken communicator is local
}

// The split now holds its parent through the abort (a reference alone could dangle between its two
// exchanges once the abort freed the handle; that window was not reproduced): the blocked split is
// released with qcclAborted.
TEST_CASE("abort from another thread releases a blocked qcclCommSplit", "[abort-split]") {
  Job job;
  warm_up(job);
  all_warmed_up(job, 0);
  if (job.rank == 0) {
    // Rank 0 splits alone (the others do not join yet); a second thread aborts the parent.
    std::thread aborter = abort_soon(job.comm);
    qcclComm_t child = nullptr;
    const qcclResult_t result = qcclCommSplit(job.comm, 0, 0, &child, nullptr);
    const std::string error = last_error();
    aborter.join();
    INFO(error);
    CHECK(result == qcclAborted);
    CHECK(child == nullptr);
    return;
  }
  const qcclResult_t async = await_async_error(job.comm);
  CHECK(async == qcclRemoteError);
  CHECK(qcclCommDestroy(job.comm) == qcclSuccess);
}

// Both calls took the handle: the abort freed the communicator under the waiting destroy (use after
// free) and did not release it, which waited out QCCL_TIMEOUT (100 s here, past CTest's 60).
TEST_CASE("abort from another thread releases a blocked qcclCommDestroy", "[abort-destroy]") {
  Job job;
  warm_up(job);
  all_warmed_up(job, 0);
  if (job.rank == 0) {
    // Rank 0 waits in qcclCommDestroy for ranks that are not coming yet; a second thread aborts.
    std::thread aborter = abort_soon(job.comm);
    const qcclResult_t result = qcclCommDestroy(job.comm);
    const std::string error = last_error();
    aborter.join();
    CHECK(result == qcclAborted);
    CHECK_THAT(error, Catch::Contains("qcclCommAbort was called on rank 0"));
    return;
  }
  const qcclResult_t async = await_async_error(job.comm);
  CHECK(async == qcclRemoteError);
  CHECK(qcclCommDestroy(job.comm) == qcclSuccess);
}

// A communicator that a mismatch broke at its second call, the first still waiting for a rank that
// never joins it (rank 3 stays out): the failure concerns the second call and those after it. An
// abort then fails the first as well. It was left running with no executor, and qcclWait spun on it
// for ever (qcclTest said "not done"); a qcclCommDestroy driving it held the drive lock until
// QCCL_TIMEOUT (100 s here), and an abort from another thread waited as long. Rank 0 aborts; the
// other ranks' first calls, which wait for rank 0 as well, fail when its report arrives: it used to
// be ignored (the communicator had failed already), and they waited out QCCL_TIMEOUT.
struct BrokenAfterOne {
  Job job;
  qcclComm_t side = nullptr;  // a second communicator of the same ranks, for a barrier
  std::vector<float> a = std::vector<float>(100, 1.0f), b = std::vector<float>(100);
  std::vector<float> c = std::vector<float>(1000, 1.0f), d = std::vector<float>(1000);
  qcclRequest_t first = nullptr;
  BrokenAfterOne() {
    REQUIRE(job.size == 4);
    warm_up(job);
    side = fresh_comm(job.comm, job.rank, job.size);
    if (job.rank != 3)
      QCCL_REQUIRE_OK(qcclIAllReduce(a.data(), b.data(), a.size(), qcclFloat32, qcclSum, job.comm, &first));
    int token = 1;  // every first call issued before any rank's second can break the communicator
    QCCL_REQUIRE_OK(qcclAllReduce(&token, &token, 1, qcclInt32, qcclSum, side));
    if (job.rank != 3) {
      // Refused at once where another rank's report came first.
      qcclRequest_t second = nullptr;
      qcclResult_t result =
          qcclIAllReduce(c.data(), d.data(), job.rank == 0 ? 500 : 1000, qcclFloat32, qcclSum, job.comm, &second);
      if (result == qcclSuccess) result = qcclWait(&second);
      REQUIRE(result == qcclMismatch);
    }
    QCCL_REQUIRE_OK(qcclAllReduce(&token, &token, 1, qcclInt32, qcclSum, side));  // before rank 0 aborts
  }
  // Rank 3 aborts once every rank is done with the scenario (its abort would fail the first calls).
  ~BrokenAfterOne() {
    qcclCommDestroy(side);
    if (job.rank == 3) qcclCommAbort(job.comm);
  }
  // Rank 3, which made neither call, learns of the mismatch: true there, and the scenario is over for it.
  bool outsider_done() {
    if (job.rank != 3) return false;
    CHECK(await_async_error(job.comm) == qcclMismatch);
    return true;
  }
  // Ranks 1 and 2: their first call fails at once with rank 0's abort.
  void check_first_fails_with_rank_0s_abort(std::chrono::steady_clock::time_point begin);
};

double seconds_since(std::chrono::steady_clock::time_point begin) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

void BrokenAfterOne::check_first_fails_with_rank_0s_abort(std::chrono::steady_clock::time_point begin) {
  int done = 0;
  qcclResult_t result = qcclSuccess;
  while (!done && result == qcclSuccess && seconds_since(begin) < 10) result = qcclTest(&first, &done);
  CHECK(result == qcclRemoteError);
  CHECK(seconds_since(begin) < 5);
  CHECK_THAT(last_error(), Catch::Contains("rank 0") && Catch::Contains("qcclCommAbort was called on rank 0"));
}

TEST_CASE("an abort after a failure fails the calls older than it too, at once, on every rank", "[abort-older]") {
  BrokenAfterOne broken;
  Job& job = broken.job;
  if (broken.outsider_done()) return;
  const auto begin = std::chrono::steady_clock::now();
  if (job.rank != 0) {
    broken.check_first_fails_with_rank_0s_abort(begin);
    CHECK(qcclCommAbort(job.comm) == qcclSuccess);
    return;
  }
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
  int done = 0;
  qcclResult_t result = qcclSuccess;
  while (!done && result == qcclSuccess && seconds_since(begin) < 10) result = qcclTest(&broken.first, &done);
  CHECK(result == qcclAborted);
  CHECK(seconds_since(begin) < 5);
  CHECK_THAT(last_error(), Catch::Contains("qcclCommAbort was called on rank 0"));
}

TEST_CASE("an abort from another thread ends a qcclCommDestroy that drives a broken communicator's older call",
          "[abort-destroy-broken]") {
  BrokenAfterOne broken;
  Job& job = broken.job;
  if (broken.outsider_done()) return;
  const auto begin = std::chrono::steady_clock::now();
  if (job.rank != 0) {  // their qcclCommDestroy drives their first call, which rank 0's abort fails
    qcclCommDestroy(job.comm);
    broken.check_first_fails_with_rank_0s_abort(begin);
    return;
  }
  double aborted_after = -1;
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto asked = std::chrono::steady_clock::now();
    CHECK(qcclCommAbort(job.comm) == qcclSuccess);
    aborted_after = seconds_since(asked);
  });
  qcclCommDestroy(job.comm);  // its result: the mismatch's or the abort's, whichever it meets first
  aborter.join();
  CHECK(seconds_since(begin) < 5);
  CHECK(aborted_after >= 0);
  CHECK(aborted_after < 3);
  CHECK(qcclWait(&broken.first) == qcclAborted);
}

// A call that fails while a message is arriving: UCX cannot withdraw a receive that has matched, and
// it used to go on writing that message into the caller's buffer after the call had returned (during
// qcclCommDestroy, 2 s later). Rank 1 aborts while the others' all-gathers move 16 MiB each; every
// other rank marks its output once its call has failed, and no value may change after that.
TEST_CASE("a failed call's output buffer is the caller's when it returns", "[abort-buffers]") {
  Job job;
  warm_up(job);
  const size_t count = size_t{4} << 20;
  std::vector<float> x(count, 1.0f + static_cast<float>(job.rank)), y(count * static_cast<size_t>(job.size));
  std::thread aborter;
  if (job.rank == 1)
    aborter = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      CHECK(qcclCommAbort(job.comm) == qcclSuccess);
    });
  qcclResult_t result = qcclSuccess;
  for (int i = 0; i < 1000 && result == qcclSuccess; ++i)
    result = qcclAllGather(x.data(), y.data(), count, qcclFloat32, job.comm);
  if (aborter.joinable()) aborter.join();
  CHECK(result != qcclSuccess);
  if (job.rank == 1) return;
  std::fill(y.begin(), y.end(), -7.0f);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  qcclCommDestroy(job.comm);
  size_t changed = 0;
  for (float v : y) changed += v != -7.0f;
  CHECK(changed == 0);
}

// A zero count moves nothing and returns at once, but it is a call in the communicator's order: one
// rank passing 0 where the others pass a count must not pair their call with its next one, which
// took the next tensor's data with qcclSuccess (it now fails, by QCCL_TIMEOUT: 3 s here).
TEST_CASE("a zero count where the others pass a count fails the calls instead of pairing them with the next",
          "[zero-count]") {
  Job job;
  warm_up(job);
  std::vector<float> a(1000, 1.0f + static_cast<float>(job.rank)), b(1000, 100.0f), out(1000, -1.0f);
  const qcclResult_t first =
      qcclAllReduce(a.data(), out.data(), job.rank == 0 ? 0 : a.size(), qcclFloat32, qcclSum, job.comm);
  if (job.rank == 0)
    CHECK(first == qcclSuccess);
  else  // its own timeout, or another rank's, reported first
    CHECK((first == qcclTimeout || first == qcclRemoteError));
  const qcclResult_t second = qcclAllReduce(b.data(), out.data(), b.size(), qcclFloat32, qcclSum, job.comm);
  CHECK(second != qcclSuccess);
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

// A request polled with qcclTest alone must time out as qcclWait does. Its single passes never
// looked for calls past QCCL_TIMEOUT (each pass started a fresh 100 ms clock), and the progress
// thread rarely took the drive lock from a caller polling without pause: 5-7 s at QCCL_TIMEOUT=3.
TEST_CASE("a request polled only with qcclTest fails at QCCL_TIMEOUT", "[test-timeout]") {
  // Run with QCCL_TIMEOUT=3.
  Job job;
  warm_up(job);
  all_warmed_up(job, 0);
  if (job.rank != 0) {
    // Not joining: they learn of rank 0's timeout through the control plane.
    const qcclResult_t async = await_async_error(job.comm);
    CHECK(async == qcclTimeout);
    CHECK(qcclCommAbort(job.comm) == qcclSuccess);
    return;
  }
  std::vector<float> x(1000, 1.0f), y(1000);
  qcclRequest_t request = nullptr;
  const auto begin = std::chrono::steady_clock::now();
  QCCL_REQUIRE_OK(qcclIAllReduce(x.data(), y.data(), x.size(), qcclFloat32, qcclSum, job.comm, &request));
  int done = 0;
  qcclResult_t result = qcclSuccess;
  while (!done && result == qcclSuccess) result = qcclTest(&request, &done);
  const double seconds = seconds_since(begin);
  CHECK(result == qcclTimeout);
  CHECK_THAT(last_error(), Catch::Contains("no progress"));
  // QCCL_TIMEOUT and the driver's 100 ms between looks, with room for a loaded machine.
  CHECK(seconds < 4.5);
  CHECK(qcclCommAbort(job.comm) == qcclSuccess);
}

}  // namespace qccl::test
