// The shared harness of the nccl-tests-style benchmarks (all_reduce_perf, all_gather_perf, ...).
//
// Each binary is one process = one rank; ranks come from qcclCommInitEnv (qcclrun, torchrun, mpirun,
// srun, or a single rank when no launcher variable is set). A binary's own file only says, in a
// CollTest, how to size the buffers for a byte size, how to run the collective, where each expected
// output element comes from, and the bandwidth formulas; everything else (options, timing, checking,
// the nccl-tests table) lives in common.cc. Only the public API (qccl.h) is used.
//
// Output, timing and correctness follow NVIDIA/nccl-tests v2.14 (src/common.cu); where host memory and
// qccl differ from CUDA streams, `--help` says how (see -z and the in-place column of alltoall).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qccl.h"

namespace qccl_perf {

// Element counts for one benchmarked size, as nccl-tests' getCollByteCount. `param` is the count
// argument of the call; the in-place buffers are recvbuff + send_in_place * rank (what the rank sends)
// and recvbuff + recv_in_place * rank (where its result lands).
struct Counts {
  size_t send = 0;
  size_t recv = 0;
  size_t param = 0;
  size_t send_in_place = 0;
  size_t recv_in_place = 0;
};

// One call of the collective under test.
struct Call {
  const void* sendbuff;
  void* recvbuff;
  size_t count;  // Counts::param
  qcclDataType_t type;
  qcclRedOp_t op;  // ignored by collectives that do not reduce
  int root;        // ignored by rootless collectives
  int rank;
  int nranks;
  qcclComm_t comm;
  qcclCodec_t codec = nullptr;  // --codec: compress (only collectives with CollTest::compressible)
  qcclCodecState_t state = nullptr;  // the codec's state (Marsit's sign codec needs one)
};

// Requests of the operations issued in one timed batch (non-blocking mode, -z 0).
class Requests {
 public:
  qcclRequest_t* add() { return &list_.emplace_back(nullptr); }
  std::vector<qcclRequest_t>& list() { return list_; }

 private:
  std::vector<qcclRequest_t> list_;
};

// Where the expected value of output element i of this rank comes from: element `index` of the send
// buffer of `rank`, or, with rank == kAllRanks, the reduction over every rank of element `index`.
struct Source {
  static constexpr int kAllRanks = -1;
  int rank;
  size_t index;
};

// What a benchmark binary contributes. All function pointers are required.
struct CollTest {
  const char* name;           // "all_reduce": the binary is <name>_perf
  const char* call;           // "qcclAllReduce", for --help
  bool reduces;               // takes -o; otherwise the redop column says "none"
  bool rooted;                // takes -r; otherwise the root column says -1
  bool has_in_place;          // false: the in-place half of each row is N/A
  bool result_on_root_only;   // only the root's output is checked (reduce)
  const char* bw_help;        // the algbw and busbw formulas, one line each, for --help

  void (*get_counts)(size_t count, int nranks, Counts* out);
  // Blocking when requests is NULL; otherwise issues qcclI* calls and adds their requests.
  qcclResult_t (*run)(const Call& call, Requests* requests);
  Source (*source)(size_t out_index, const Call& call);
  // nccl-tests' <Coll>GetBw: count is Counts::param, GB = 1e9 bytes.
  void (*get_bw)(size_t count, size_t type_size, double seconds, int nranks, double* algbw, double* busbw);
  bool compressible = false;  // takes --codec (run() honours Call::codec)
  bool all_reduce_codecs = false;      // also Marsit's sign and IntSGD's int codecs (all-reduce only)
  bool point_to_point_codecs = false;  // also AQ-SGD's aq codecs (point-to-point only)
};

// The whole benchmark: parses argv, runs the sweep, prints the table on rank 0. Returns the exit
// status: 0 success, 1 wrong results / a failed qccl call / QCCL_TESTS_MIN_BW not met, 2 usage.
int run_benchmark(int argc, char** argv, const CollTest& test);

// ---- The table, open to extra columns ------------------------------------------------------------

// One half of a row (out-of-place or in-place).
struct Cell {
  bool ran = false;      // false: not defined for this collective (printed N/A)
  double seconds = 0;    // per operation, reduced across ranks per -a
  double algbw = 0;      // GB/s
  double busbw = 0;      // GB/s
  int64_t wrong = -1;    // wrong elements summed over ranks; -1 = not checked (N/A)
  double relerr = -1;    // --codec: ||out - exact||_2 / ||exact||_2 over all ranks; -1 = not checked
  int64_t nonfinite_calls = 0;  // --codec: timed calls that returned qcclNonFinite (in-place sums that grew)
  qcclStats_t stats{};   // this rank's qcclCommGetLastStats after the timed batch, for extra columns
  // --phases: where this rank's time went (qcclStats_t), the mean over the timed operations.
  struct Phases {
    double seconds = 0, encode = 0, decode = 0, reduce = 0, transport = 0, wait = 0, sleeps = 0;
  } phases;
};

// A column appended to each half of the table after #wrong: --codec adds wire bytes per rank,
// compression ratio and relative error, --link-rate the wire floor; the table prints any list of them.
struct ExtraColumn {
  std::string title;  // second header line
  std::string unit;   // third header line, e.g. "(B)"
  int width;          // characters
  std::function<std::string(const Cell&)> format;  // the cell text; at most `width` characters wanted
};

// The nccl-tests result table, printed on rank 0. Without extra columns the output is byte-for-byte
// nccl-tests v2.14's.
class Table {
 public:
  explicit Table(std::vector<ExtraColumn> extra = {}) : extra_(std::move(extra)) {}
  void print_header() const;
  void print_row_start(size_t bytes, size_t count, const char* type, const char* op, int root) const;
  void print_cell(const Cell& cell) const;
  void print_row_end() const;

 private:
  int extra_width() const;
  std::vector<ExtraColumn> extra_;
};

}  // namespace qccl_perf
