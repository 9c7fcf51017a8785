// Marsit (allreduce_marsit.cc, marsit_full_precision.cc) run by the real executor on a simulated
// network, on rings of 1 to 8 ranks and on tori: unanimous bits pass exactly; each output bit is 1
// with probability (ranks whose bit is 1) / M, whichever ring or torus position holds the ones
// (5-sigma binomial bounds, fixed seeds); identical bits on every rank and for every chunk size and
// pipeline depth; the compensation c <- (u + c) - g and its reset in full-precision rounds; the K
// schedule; wire bytes 2(M-1)/M * 4 ceil(D/32); and NaN reported on every rank with the state kept.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <cstring>
#include <random>
#include <string>

#include "collectives/marsit.h"
#include "kernels/codec.h"
#include "kernels/marsit.h"
#include "kernels/sign.h"
#include "tests/collectives/sim_runner.h"

namespace qccl::test {
namespace {

using coll::CollArgs;
using coll::CollKind;
using kernels::DataType;
using kernels::RedOp;

constexpr float kEta = 0.25f;

// An R x C grid (R = 1: the ring of C ranks).
struct Grid {
  int rows;
  int cols;
  int n() const { return rows * cols; }
  std::string name() const { return rows == 1 ? "ring of " + std::to_string(cols) : std::to_string(rows) + "x" + std::to_string(cols); }
};

kernels::CodecConfig sign_codec(Grid grid, uint32_t period = 0, uint64_t seed = 1) {
  std::string spec = "sign:eta_s=0.25,k=" + std::to_string(period) + ",seed=" + std::to_string(seed);
  if (grid.rows > 1) spec += ",topology=torus:" + std::to_string(grid.rows) + "x" + std::to_string(grid.cols);
  return kernels::parse_codec_spec(spec);
}

// Every rank's u, c (its compensation) and g for one round. The collective keeps c lazily (stored
// values and a pending round, kernels/marsit.h); c is what they stand for, and a test may set it.
struct Round {
  std::vector<std::vector<float>> u, c, g;
  std::shared_ptr<SimRun> sim;  // (shared: rounds are copied to rerun the same inputs)
  std::vector<std::vector<float>> stored, eta, c_seen;
  std::vector<std::vector<uint32_t>> words;

  kernels::Compensation compensation(int r) {
    const size_t count = c[r].size();
    if (stored.size() != c.size())
      stored.resize(c.size()), eta.resize(c.size()), words.resize(c.size()), c_seen.resize(c.size());
    if (c_seen[r].size() != count || std::memcmp(c_seen[r].data(), c[r].data(), count * sizeof(float)) != 0) {
      stored[r] = c[r];  // set by the test: nothing pending
      eta[r].assign(kernels::sign_words(count), 0.0f);
      words[r].assign(kernels::sign_words(count), 0);
    }
    return kernels::Compensation{stored[r].data(), words[r].data(), eta[r].data()};
  }
  void read_compensation(int r) {
    kernels::add_compensation(nullptr, kernels::Compensation{stored[r].data(), words[r].data(), eta[r].data()}, 0,
                              c[r].size(), c[r].data());
    c_seen[r] = c[r];
  }
};

void run_round(Round& round, const kernels::CodecConfig& codec, uint64_t step, size_t chunk_bytes = 4096,
               int depth = 2, bool in_place = false) {
  const int n = static_cast<int>(round.u.size());
  const size_t count = round.u[0].size();
  round.g.assign(n, std::vector<float>(count, -1234.5f));
  std::vector<CollArgs> args(n);
  std::vector<coll::MarsitCall> calls(n);  // the method's calls: each rank's compensation
  for (int r = 0; r < n; ++r) {
    CollArgs& a = args[r];
    a.kind = CollKind::kAllReduce, a.count = count, a.dtype = DataType::kFloat32, a.op = RedOp::kAvg;
    a.rank = r, a.nranks = n;
    if (in_place) round.g[r] = round.u[r];
    a.sendbuf = in_place ? round.g[r].data() : round.u[r].data();
    a.recvbuf = round.g[r].data();
    a.codec = &codec;
    calls[r].compensation = round.compensation(r);
    a.method_call = &calls[r];
    a.rng = kernels::PhiloxKey{codec.seed, step, static_cast<uint32_t>(r), 0};
  }
  round.sim = std::make_shared<SimRun>(run_on_sim(args, "marsit", chunk_bytes, depth));
  for (int r = 0; r < n; ++r) round.read_compensation(r);
}

Round make_round(int n, size_t count) {
  Round round;
  round.u.assign(n, std::vector<float>(count, 0.0f));
  round.c.assign(n, std::vector<float>(count, 0.0f));
  return round;
}

// The wire bytes of a sign round, from the grid alone: the row rings move the C row segments of the
// ceil(D/32) words, the column rings the R cells of this rank's row segment (balanced splits).
uint64_t sign_round_bytes(Grid grid, int rank, size_t count) {
  auto split = [](size_t total, int parts, int i) {
    return total / parts + (static_cast<size_t>(i) < total % parts ? 1 : 0);
  };
  const size_t words = (count + 31) / 32;
  const int row = rank / grid.cols, col = rank % grid.cols;
  uint64_t sent = 0;
  for (int s = 0; s < grid.cols - 1; ++s)
    sent += split(words, grid.cols, (col - s - 1 + 2 * grid.cols) % grid.cols) + split(words, grid.cols, (col - s + grid.cols) % grid.cols);
  const size_t mine = split(words, grid.cols, col);
  for (int s = 0; s < grid.rows - 1; ++s)
    sent += split(mine, grid.rows, (row - s - 1 + 2 * grid.rows) % grid.rows) + split(mine, grid.rows, (row - s + grid.rows) % grid.rows);
  return 4 * sent;
}

// The fragment that carries value i: its word's chunk within its cell (cells: the R parts of each of
// the C row segments of the ceil(D/32) words, balanced), `chunk` words per piece.
size_t fragment_of(Grid grid, size_t count, size_t i, size_t chunk) {
  auto begin = [](size_t total, int parts, int k) { return total / parts * k + std::min<size_t>(k, total % parts); };
  const size_t words = (count + 31) / 32, word = i / 32;
  int j = grid.cols - 1;
  while (begin(words, grid.cols, j) > word) --j;
  const size_t segment_begin = begin(words, grid.cols, j), segment = begin(words, grid.cols, j + 1) - segment_begin;
  int cell = grid.rows - 1;
  while (segment_begin + begin(segment, grid.rows, cell) > word) --cell;
  return (word - segment_begin - begin(segment, grid.rows, cell)) / chunk;
}

// The values rank r sends in a ring all-reduce of count values (balanced segments).
uint64_t ring_values(int r, int n, size_t count) {
  auto size = [&](int s) { return count / n + (static_cast<size_t>((s + n) % n) < count % n ? 1 : 0); };
  uint64_t sent = 0;
  for (int k = 0; k < n - 1; ++k) sent += size((r - k - 1 + n) % n) + size((r - k + n) % n);
  return sent;
}

const Grid kGrids[] = {{1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}, {1, 7}, {1, 8}, {2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}};

TEST_CASE("Marsit: unanimous signs pass exactly, c <- (u + c) - g, identical bits, closed-form bytes", "[marsit]") {
  for (Grid grid : kGrids)
    for (size_t count : {size_t{1}, size_t{31}, size_t{33}, size_t{100}, size_t{4099}, size_t{40000}}) {
      INFO(grid.name() << ", count " << count);
      const int n = grid.n();
      const kernels::CodecConfig codec = sign_codec(grid);
      Round round = make_round(n, count);
      std::mt19937 rng(static_cast<uint32_t>(count * 31 + n));
      std::uniform_real_distribution<float> magnitude(0.01f, 1.0f), start(-0.005f, 0.005f);
      std::vector<int> sign(count);
      for (int& s : sign) s = rng() & 1 ? 1 : -1;
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) {
          round.u[r][i] = static_cast<float>(sign[i]) * magnitude(rng);
          round.c[r][i] = start(rng);  // too small to flip a sign
        }
      const auto c_before = round.c;
      // 2 words per piece: a row message of `rows` pieces is an eighth of a chunk this small
      run_round(round, codec, 1, 64 * static_cast<size_t>(grid.rows), 2);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
          REQUIRE(round.g[r][i] == kEta * static_cast<float>(sign[i]));
          REQUIRE(round.c[r][i] == (round.u[r][i] + c_before[r][i]) - round.g[r][i]);  // c <- w - g
        }
        CHECK(round.sim->ops[r]->stats().nonfinite == 0);
        CHECK(round.sim->ops[r]->stats().bytes_sent == round.sim->plan_bytes[r]);
        CHECK(round.sim->plan_bytes[r] == sign_round_bytes(grid, r, count));
      }
    }
}

TEST_CASE("Marsit: wire bytes per rank are 2(M-1)/M * 4 ceil(D/32) when the words split evenly", "[marsit]") {
  for (Grid grid : kGrids) {
    const int n = grid.n();
    const size_t count = 32 * 6 * static_cast<size_t>(n) - 5;  // ceil(D/32) = 6n words; D itself not a multiple
    Round round = make_round(n, count);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) round.u[r][i] = std::sin(static_cast<float>(i * (r + 1)));
    const kernels::CodecConfig codec = sign_codec(grid);
    run_round(round, codec, 5);
    const uint64_t words = (count + 31) / 32;
    for (int r = 0; r < n; ++r) {
      INFO(grid.name() << ", rank " << r);
      CHECK(round.sim->plan_bytes[r] * static_cast<uint64_t>(n) == 2 * static_cast<uint64_t>(n - 1) * 4 * words);
      CHECK(round.sim->ops[r]->stats().bytes_sent == round.sim->plan_bytes[r]);
      // The uncompressed ring all-reduce of the same values: 4 bytes per value (32 times as many,
      // less the padding of the last word).
      CHECK(round.sim->raw_bytes[r] == 4 * ring_values(r, n, count));
    }
  }
}

// The number of output ones in each of n equal slices of the words must be Binomial(N, ones / M):
// within 5 standard deviations (a fixed seed makes the test deterministic; the band only guards
// against a legitimate change of random numbers). Rank-instead-of-hop merging misses by 1/(M-1) - 1/M
// or more, at least 7 sigma here for every M.
void check_fraction(const Round& round, const std::vector<int>& holders, Grid grid) {
  const int n = grid.n();
  const size_t count = round.u[0].size();
  const double p = static_cast<double>(holders.size()) / n;
  for (int r = 1; r < n; ++r) REQUIRE(std::memcmp(round.g[r].data(), round.g[0].data(), count * sizeof(float)) == 0);
  const size_t slice = count / static_cast<size_t>(n);
  for (int s = 0; s < n; ++s) {
    double ones = 0;
    for (size_t i = s * slice; i < (s + 1) * slice; ++i) ones += round.g[0][i] > 0 ? 1 : 0;
    const double mean = slice * p, sigma = std::sqrt(slice * p * (1 - p));
    INFO(grid.name() << ": ranks holding 1: " << holders.size() << " (first " << holders[0] << "), slice " << s
                     << ": " << ones << " ones, expected " << mean << " +- " << sigma);
    CHECK(std::abs(ones - mean) <= 5 * sigma);
  }
}

TEST_CASE("Marsit: each output bit is 1 with probability (ranks holding 1) / M, at every position", "[marsit]") {
  const size_t count = size_t{1} << 18;
  for (Grid grid : kGrids) {
    const int n = grid.n();
    if (n < 2) continue;
    const kernels::CodecConfig codec = sign_codec(grid, 0, 42);
    // One rank holds 1 (each rank in turn), then all but one (each in turn), then a scattered pattern.
    std::vector<std::vector<int>> patterns;
    for (int q = 0; q < n; ++q) patterns.push_back({q});
    for (int q = 0; q < n && n > 2; ++q) {
      std::vector<int> all_but;
      for (int r = 0; r < n; ++r)
        if (r != q) all_but.push_back(r);
      patterns.push_back(all_but);
    }
    if (n >= 4) patterns.push_back({0, n / 2, n - 1});
    uint64_t step = 1;
    for (const auto& holders : patterns) {
      Round round = make_round(n, count);
      for (int r = 0; r < n; ++r) {
        const bool one = std::find(holders.begin(), holders.end(), r) != holders.end();
        std::fill(round.u[r].begin(), round.u[r].end(), one ? 1.0f : -1.0f);
      }
      run_round(round, codec, step++, 16384 * static_cast<size_t>(grid.rows), 2);  // 512 words per piece
      check_fraction(round, holders, grid);
    }
  }
}

TEST_CASE("Marsit: a fragment's message is a chunk of input's words, at least 32 KiB or an eighth of the chunk",
          "[marsit]") {
  CHECK(coll::marsit_chunk_words(4) == 1);
  CHECK(coll::marsit_chunk_words(512) == 16);               // an eighth of a small chunk
  CHECK(coll::marsit_chunk_words(60 * 1024) == 1920);       // 100 Mbit/s: 60 KiB chunks, 7.5 KiB messages
  CHECK(coll::marsit_chunk_words(256 * 1024) == 8192);      // the default: 1 MiB of input, not 256 KiB
  CHECK(coll::marsit_chunk_words(4 << 20) == (4 << 20) / 128);  // a large chunk: 1/32 of its input
  CHECK(coll::marsit_chunk_words(256 * 1024, 2) == 4096);       // a 2-row torus: row messages of 32 KiB
  CHECK(coll::marsit_chunk_words(8192, 2) == 128);              // ... or of an eighth of the chunk
  // The plans take it: 4 Mi values on a ring of 2 are 65,536 words a rank's segment, 8 fragments.
  const kernels::CodecConfig codec = sign_codec(Grid{1, 2});
  Round round = make_round(2, size_t{4} << 20);
  run_round(round, codec, 1, 256 * 1024, 2);
  CHECK(round.sim->ops[0]->plan().fragments() == 8);
}

TEST_CASE("Marsit: the same bits for every chunk size, pipeline depth and buffer placement", "[marsit]") {
  for (Grid grid : {Grid{1, 5}, Grid{2, 3}}) {
    const int n = grid.n();
    const size_t count = 20000;
    const kernels::CodecConfig codec = sign_codec(grid, 0, 9);
    Round base = make_round(n, count);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    for (auto& u : base.u)
      for (float& x : u) x = normal(rng);
    for (auto& c : base.c)
      for (float& x : c) x = 0.1f * normal(rng);
    Round reference = base;
    run_round(reference, codec, 3, 1 << 20, 1);
    for (size_t chunk : {size_t{4}, size_t{128}, size_t{2048}, size_t{65536}})  // 1 to 64 words, and whole cells
      for (int depth : {1, 2, 4})
        for (bool in_place : {false, true}) {
          INFO(grid.name() << ", chunk " << chunk << ", depth " << depth << (in_place ? ", in place" : ""));
          Round round = base;
          run_round(round, codec, 3, chunk, depth, in_place);
          for (int r = 0; r < n; ++r) {
            REQUIRE(round.g[r] == reference.g[r]);
            REQUIRE(round.c[r] == reference.c[r]);
          }
        }
    // Another step or seed draws other bits (where the ranks disagree).
    Round other_step = base, other_seed = base;
    run_round(other_step, codec, 4);
    const kernels::CodecConfig reseeded = sign_codec(grid, 0, 10);
    run_round(other_seed, reseeded, 3);
    CHECK(other_step.g[0] != reference.g[0]);
    CHECK(other_seed.g[0] != reference.g[0]);
  }
}

TEST_CASE("Marsit: every K-th round (t = 0 included) is the full-precision average and resets c", "[marsit]") {
  for (Grid grid : {Grid{1, 1}, Grid{1, 3}, Grid{1, 4}, Grid{2, 2}}) {
    const int n = grid.n();
    const size_t count = 1001;
    const uint32_t period = 3;
    const kernels::CodecConfig codec = sign_codec(grid, period, 3);
    Round round = make_round(n, count);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    std::vector<std::vector<double>> given(n, std::vector<double>(count, 0.0)), applied = given;
    for (uint64_t t = 0; t < 8; ++t) {
      INFO(grid.name() << ", round " << t);
      for (auto& u : round.u)
        for (float& x : u) x = 0.3f * normal(rng);
      const auto c_before = round.c;
      run_round(round, codec, t, 128 * static_cast<size_t>(grid.rows), 2);  // 4 words per piece: several fragments
      const bool full = t % period == 0;
      for (int r = 0; r < n; ++r) {
        CHECK(round.g[r] == round.g[0]);
        CHECK(round.sim->ops[r]->stats().bytes_sent == round.sim->plan_bytes[r]);
        if (full) {
          CHECK(round.sim->plan_bytes[r] == round.sim->raw_bytes[r]);  // 4 bytes per value
          CHECK(round.sim->plan_bytes[r] == 4 * ring_values(r, n, count));  // a plain float32 ring
          for (size_t i = 0; i < count; ++i) {
            double average = 0, magnitude = 0;
            for (int q = 0; q < n; ++q) {
              average += (static_cast<double>(round.u[q][i]) + c_before[q][i]) / n;
              magnitude += (std::abs(round.u[q][i]) + std::abs(c_before[q][i])) / n;
            }
            // n float32 additions (w, then the ring's sum) and a division: a few ulps of the magnitudes
            REQUIRE(std::abs(round.g[r][i] - average) <= (n + 2) * 0x1p-24 * magnitude);
            REQUIRE(round.c[r][i] == 0.0f);
          }
        } else {
          CHECK(round.sim->plan_bytes[r] == sign_round_bytes(grid, r, count));
          for (size_t i = 0; i < count; ++i) {
            REQUIRE(std::abs(round.g[r][i]) == kEta);
            REQUIRE(round.c[r][i] == (round.u[r][i] + c_before[r][i]) - round.g[r][i]);  // c <- w - g
          }
        }
        // What each rank gave minus what was applied is its compensation, at every step.
        for (size_t i = 0; i < count; ++i) {
          given[r][i] += round.u[r][i];
          applied[r][i] += round.g[r][i];
          if (full) given[r][i] = applied[r][i] = 0;  // c = 0: the books are settled (to an average)
        }
      }
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) REQUIRE(std::abs(given[r][i] - applied[r][i] - round.c[r][i]) <= 1e-5);
    }
  }
}

TEST_CASE("Marsit: K = 0 never runs a full-precision round, not even at t = 0", "[marsit]") {
  const kernels::CodecConfig codec = sign_codec(Grid{1, 3}, 0);
  Round round = make_round(3, 64);
  for (auto& u : round.u) std::fill(u.begin(), u.end(), 0.7f);
  run_round(round, codec, 0);
  for (int r = 0; r < 3; ++r) {
    CHECK(round.g[r] == std::vector<float>(64, kEta));
    CHECK(round.sim->plan_bytes[r] == sign_round_bytes(Grid{1, 3}, r, 64));
  }
}

TEST_CASE("Marsit: NaN in one rank's update is NaN for its whole fragment on every rank, state kept", "[marsit]") {
  for (Grid grid : {Grid{1, 2}, Grid{1, 4}, Grid{1, 8}, Grid{2, 3}, Grid{4, 2}})
    for (size_t count : {size_t{40}, size_t{5000}})
      for (int holder = 0; holder < grid.n(); holder += 3) {
        const int n = grid.n();
        INFO(grid.name() << ", count " << count << ", NaN at rank " << holder);
        const kernels::CodecConfig codec = sign_codec(grid);
        Round round = make_round(n, count);
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) round.u[r][i] = std::cos(static_cast<float>(i + r));
        const size_t bad = count / 3;
        round.u[holder][bad] = std::numeric_limits<float>::quiet_NaN();
        const auto c_before = round.c;
        run_round(round, codec, 2, 128 * static_cast<size_t>(grid.rows), 2);  // 128 values, 4 words, per piece
        size_t nan_values = 0;
        for (size_t i = 0; i < count; ++i) nan_values += fragment_of(grid, count, i, 4) == fragment_of(grid, count, bad, 4);
        for (int r = 0; r < n; ++r) {
          CHECK(round.sim->ops[r]->stats().nonfinite == nan_values);
          for (size_t i = 0; i < count; ++i) {
            REQUIRE(std::isnan(round.g[r][i]) == (fragment_of(grid, count, i, 4) == fragment_of(grid, count, bad, 4)));
            if (std::isnan(round.g[r][i])) REQUIRE(round.c[r][i] == c_before[r][i]);
            else REQUIRE(round.c[r][i] == (round.u[r][i] + c_before[r][i]) - round.g[r][i]);  // c <- w - g
          }
        }
      }
}

TEST_CASE("Marsit: NaN in a full-precision round leaves c where the average is NaN", "[marsit]") {
  const kernels::CodecConfig codec = sign_codec(Grid{1, 3}, 10);
  Round round = make_round(3, 100);
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < 100; ++i) round.u[r][i] = 0.5f, round.c[r][i] = 0.125f;
  round.u[1][7] = std::numeric_limits<float>::infinity();
  round.u[2][7] = -std::numeric_limits<float>::infinity();
  run_round(round, codec, 20);
  for (int r = 0; r < 3; ++r) {
    CHECK(round.sim->ops[r]->stats().nonfinite == 1);
    CHECK(std::isnan(round.g[r][7]));
    CHECK(round.c[r][7] == 0.125f);
    CHECK(round.g[r][8] == 0.625f);
    CHECK(round.c[r][8] == 0.0f);
  }
}

}  // namespace
}  // namespace qccl::test
