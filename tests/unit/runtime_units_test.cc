// Unit tests of the runtime's small parts: frame headers, message keys, wire readers, configuration
// parsing, algorithm policy, the segment arithmetic every ring relies on, and the node map.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <random>
#include <thread>

#include "base/config.h"
#include "base/errors.h"
#include "base/socket.h"
#include "base/wire.h"
#include "collectives/ring.h"
#include "src/aggregator.h"
#include "src/bootstrap.h"
#include "src/control.h"
#include "src/frame.h"
#include "src/link_probe.h"
#include "src/message_key.h"
#include "src/node_map.h"
#include "src/policy.h"

namespace qccl::test {
namespace {

coll::CollArgs args_for(coll::CollKind kind, size_t count, int nranks = 4) {
  coll::CollArgs a;
  a.kind = kind;
  a.count = count;
  a.nranks = nranks;
  a.rank = 1;
  a.root = 2;
  return a;
}

// Runs `body` with environment variable `name` set to `value`, then restores it.
template <class F>
void with_env(const char* name, const char* value, F&& body) {
  const char* old = std::getenv(name);
  std::string saved = old ? old : "";
  setenv(name, value, 1);
  try {
    body();
  } catch (...) {
    old ? setenv(name, saved.c_str(), 1) : unsetenv(name);
    throw;
  }
  old ? setenv(name, saved.c_str(), 1) : unsetenv(name);
}

}  // namespace

TEST_CASE("frame header: encode/decode round trip and mismatch messages", "[frame]") {
  FrameHeader h = FrameHeader::for_call(args_for(coll::CollKind::kReduce, 1000), 42, 0xabc);
  uint8_t bytes[FrameHeader::kBytes];
  h.encode(bytes);
  FrameHeader back = FrameHeader::decode(bytes, sizeof(bytes), "rank 9");
  CHECK(frame_mismatch(h, back).empty());
  CHECK(back.sender == 1);
  CHECK(back.sequence == 42);
  CHECK(back.fingerprint() == h.fingerprint());

  FrameHeader other = h;
  other.count = 1001;
  CHECK_THAT(frame_mismatch(h, other), Catch::Contains("count=1001") && Catch::Contains("count=1000"));
  CHECK(other.fingerprint() != h.fingerprint());  // (these two differ; 12 bits cannot always)
  other = h;
  other.root = 3;
  CHECK_THAT(frame_mismatch(h, other), Catch::Contains("root=3"));

  // A receive expects the matching send, and says so as a Recv.
  coll::CollArgs recv = args_for(coll::CollKind::kRecv, 10);
  coll::CollArgs send = args_for(coll::CollKind::kSend, 20);
  CHECK_THAT(frame_mismatch(FrameHeader::for_call(recv, 0, 0), FrameHeader::for_call(send, 0, 0)),
             Catch::Contains("Send(count=20") && Catch::Contains("Recv(count=10"));
  const FrameHeader matching_send = FrameHeader::for_call(args_for(coll::CollKind::kSend, 10), 0, 0);
  CHECK(frame_mismatch(FrameHeader::for_call(recv, 0, 0), matching_send).empty());
  // A keyed delta call (count 1, uint8, as the library makes them) meets only a delta call, either
  // end of it; its role travels in the header and names it.
  coll::CollArgs delta_send = args_for(coll::CollKind::kSend, 1), delta_recv = args_for(coll::CollKind::kRecv, 1);
  coll::DeltaCall* const any_call = reinterpret_cast<coll::DeltaCall*>(&delta_send);  // only compared with null
  for (coll::CollArgs* a : {&delta_send, &delta_recv}) a->dtype = kernels::DataType::kUint8, a->delta = any_call;
  FrameHeader dsend = FrameHeader::for_call(delta_send, 4, 0), drecv = FrameHeader::for_call(delta_recv, 4, 0);
  dsend.encode(bytes);
  CHECK(FrameHeader::decode(bytes, sizeof(bytes), "rank 9").delta);
  drecv.encode(bytes);
  CHECK(FrameHeader::decode(bytes, sizeof(bytes), "rank 9").receiver);
  CHECK(frame_mismatch(dsend, drecv).empty());
  CHECK(frame_mismatch(drecv, dsend).empty());
  CHECK(dsend.fingerprint() == drecv.fingerprint());
  coll::CollArgs plain_recv = delta_recv;
  plain_recv.delta = nullptr;
  CHECK_THAT(frame_mismatch(FrameHeader::for_call(plain_recv, 4, 0), dsend),
             Catch::Contains("called DeltaSend #4 but this rank called Recv(count=1, uint8) #4") &&
                 Catch::Contains("call order"));
  CHECK_THAT(frame_mismatch(drecv, FrameHeader::for_call(args_for(coll::CollKind::kSend, 16), 4, 0)),
             Catch::Contains("called Send(count=16, float) #4 but this rank called DeltaRecv #4"));
  CHECK(FrameHeader::for_call(plain_recv, 4, 0).fingerprint() != dsend.fingerprint());  // (these two differ)
  // Arguments a collective ignores do not make a mismatch.
  coll::CollArgs a = args_for(coll::CollKind::kAllGather, 5), b = a;
  b.op = kernels::RedOp::kMax;
  b.root = 0;
  CHECK(frame_mismatch(FrameHeader::for_call(a, 1, 0), FrameHeader::for_call(b, 1, 0)).empty());
}

TEST_CASE("frame header: a mismatch names the codec's step or scale only when that is what differs", "[frame]") {
  // Uncompressed: codec hash, step and scale are 0 on both sides, and none of them is mentioned.
  FrameHeader h = FrameHeader::for_call(args_for(coll::CollKind::kAllReduce, 1000), 7, 0);
  FrameHeader other = h;
  other.count = 100;
  std::string text = frame_mismatch(h, other);
  CHECK_THAT(text, Catch::Contains("count=100") && Catch::Contains("count=1000"));
  CHECK_THAT(text, !Catch::Contains("alpha") && !Catch::Contains("steps"));
  other = h;
  other.root = 3;  // ignored by AllReduce, but a header that says otherwise still differs
  CHECK_THAT(frame_mismatch(h, other), !Catch::Contains("alpha"));

  // Compressed, states at different steps.
  FrameHeader c = FrameHeader::for_call(args_for(coll::CollKind::kAllReduce, 1000), 7, 0xc0dec, 5);
  other = c;
  other.codec_step = 4;
  text = frame_mismatch(c, other);
  CHECK_THAT(text, Catch::Contains("step 4") && Catch::Contains("step 5") &&
                       Catch::Contains("codec states are at different steps"));
  CHECK_THAT(text, !Catch::Contains("alpha"));

  // Compressed, everything equal but the shared scale: the sentence names both values.
  c.codec_scale = 0.25;
  other = c;
  other.codec_scale = 0.5;
  text = frame_mismatch(c, other);
  CHECK_THAT(text, Catch::Contains("shared scale alpha = 0.5, but this rank's is 0.25") &&
                       Catch::Contains("codec states diverged"));
  // ... and with the count differing too, the count is the story, not the scale.
  other.count = 999;
  CHECK_THAT(frame_mismatch(c, other), Catch::Contains("count=999") && !Catch::Contains("alpha"));
  // Equal scales, bit for bit, agree.
  other = c;
  CHECK(frame_mismatch(c, other).empty());

  // Compressed by different codecs (or one codec on different FFT libraries): the hint says where
  // such a difference comes from; with the count differing too, the count is the story.
  other.codec_hash = 0xfff;
  text = frame_mismatch(c, other);
  CHECK_THAT(text, Catch::Contains("their codecs differ") && Catch::Contains("QCCL_GPU_FFT=cufft"));
  other.count = 999;
  CHECK_THAT(frame_mismatch(c, other), Catch::Contains("count=999") && !Catch::Contains("their codecs differ"));
}

TEST_CASE("frame header: corrupted or truncated bytes are a clear error, never a crash", "[frame]") {
  FrameHeader h = FrameHeader::for_call(args_for(coll::CollKind::kAllReduce, 7), 1, 0);
  uint8_t bytes[FrameHeader::kBytes];
  h.encode(bytes);
  CHECK_THROWS_WITH(FrameHeader::decode(bytes, 47, "rank 2"), Catch::Contains("47 bytes"));
  uint8_t bad[FrameHeader::kBytes];
  std::memcpy(bad, bytes, sizeof(bad));
  bad[0] ^= 0xff;
  CHECK_THROWS_WITH(FrameHeader::decode(bad, sizeof(bad), "rank 2"), Catch::Contains("magic"));
  std::memcpy(bad, bytes, sizeof(bad));
  bad[6] = 99;  // collective kind
  CHECK_THROWS_WITH(FrameHeader::decode(bad, sizeof(bad), "rank 2"), Catch::Contains("collective 99"));
  // Random bytes: decode either succeeds or throws Error; nothing else.
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    for (auto& b : bad) b = static_cast<uint8_t>(rng());
    if (i % 2) std::memcpy(bad, bytes, 6);  // half of them with a valid magic and version
    try {
      FrameHeader::decode(bad, sizeof(bad), "fuzz");
    } catch (const Error& e) {
      CHECK(e.code() == qcclRemoteError);
    }
  }
}

TEST_CASE("message keys: keyed delta calls and plain point-to-point calls never share a key", "[frame]") {
  using message_key::keyed_sequence;
  using message_key::make;
  using message_key::p2p_sequence;
  // Every plain call's number against every delta call's of either direction, over a window wider
  // than the 13 bits they keep.
  for (uint64_t plain = 0; plain < 3 * message_key::kKeyedBit; plain += 97)
    for (uint64_t keyed = 0; keyed < 3 * message_key::kKeyedBit; keyed += 89)
      for (bool high : {false, true})
        REQUIRE(make(true, p2p_sequence(plain), false, 1, 0) != make(true, keyed_sequence(keyed, high), false, 1, 0));
  // The delta calls of the two directions between a pair, numbered alike, never share a key.
  for (uint64_t a = 0; a < 3 * message_key::kKeyedBit; a += 31)
    for (uint64_t b = 0; b < 3 * message_key::kKeyedBit; b += 37)
      REQUIRE(keyed_sequence(a, false) != keyed_sequence(b, true));
  // Calls of one direction stay apart within 8192 (plain) and 4096 (delta) of each other, and the
  // field is what they share with collectives, which keep 14 bits (and differ by the p2p bit).
  CHECK(p2p_sequence(5) != p2p_sequence(5 + 4096));
  CHECK(p2p_sequence(5) == p2p_sequence(5 + message_key::kKeyedBit));
  CHECK(keyed_sequence(5, true) != keyed_sequence(5 + 4095, true));
  CHECK(keyed_sequence(5, true) == keyed_sequence(5 + 4096, true));
  CHECK(make(false, 5, false, 1, 0) != make(true, p2p_sequence(5), false, 1, 0));
  CHECK(make(false, 5, false, 1, 0) != make(false, 5 + message_key::kKeyedBit, false, 1, 0));
  // Where keys repeat, the fingerprint, which covers the whole number, tells the calls apart.
  const FrameHeader early = FrameHeader::for_call(args_for(coll::CollKind::kSend, 16), 5, 0);
  for (uint64_t later : {5 + message_key::kP2pWindow, 5 + message_key::kKeyedBit, uint64_t{5} + (1 << 14)})
    CHECK(FrameHeader::for_call(args_for(coll::CollKind::kSend, 16), later, 0).fingerprint() !=
          early.fingerprint());  // (these differ; 12 bits cannot always)
  // What receives ignore (taint, fingerprint) never makes two calls' keys equal.
  CHECK(message_key::chunk_id(make(true, keyed_sequence(7, false), true, 3, 0xabc)) ==
        message_key::chunk_id(make(true, keyed_sequence(7, false), false, 3, 0)));
}

TEST_CASE("a communicator's failures: each call fails with the first that concerns it", "[failure]") {
  Failures failures;
  CHECK(failures.empty());
  CHECK(failures.concerning(true, 0) == nullptr);
  // A mismatch in collective #9: #9 and later, and every point-to-point call; not #5 .. #8.
  REQUIRE(failures.add(Failure{qcclMismatch, "nine", 9}));
  CHECK(failures.concerning(false, 8) == nullptr);
  CHECK(failures.concerning(false, 9)->message == "nine");
  CHECK(failures.concerning(false, 100)->message == "nine");
  CHECK(failures.concerning(true, 3)->message == "nine");
  // A later report about #12 or #9 concerns nothing new; one about #5 concerns #5 .. #8.
  CHECK_FALSE(failures.add(Failure{qcclTimeout, "twelve", 12}));
  CHECK_FALSE(failures.add(Failure{qcclTimeout, "nine again", 9}));
  REQUIRE(failures.add(Failure{qcclTimeout, "five", 5}));
  CHECK(failures.concerning(false, 4) == nullptr);
  CHECK(failures.concerning(false, 5)->message == "five");
  CHECK(failures.concerning(false, 8)->message == "five");
  CHECK(failures.concerning(false, 9)->message == "nine");
  CHECK(failures.concerning(true, 0)->message == "nine");
  CHECK(failures.first().message == "nine");  // the communicator's own, for calls made from now on
  // An abort (or a dead peer) concerns every call: kept once, and nothing after it.
  REQUIRE(failures.add(Failure{qcclAborted, "abort", 0}));
  CHECK(failures.concerning(false, 1)->message == "abort");
  CHECK(failures.concerning(false, 7)->message == "five");
  CHECK_FALSE(failures.add(Failure{qcclRemoteError, "dead peer", 0}));
  CHECK_FALSE(failures.add(Failure{qcclMismatch, "two", 2}));
  CHECK(failures.first().message == "nine");
}

TEST_CASE("byte reader: every read is bounds-checked", "[wire]") {
  ByteWriter w;
  w.put<uint32_t>(7);
  w.put_string("hello");
  ByteReader r(w.bytes().data(), w.bytes().size(), "test message");
  CHECK(r.get<uint32_t>() == 7);
  CHECK(r.get_string(100) == "hello");
  CHECK_THROWS_WITH(r.get<uint8_t>(), Catch::Contains("truncated"));
  ByteReader limited(w.bytes().data(), w.bytes().size(), "test message");
  limited.get<uint32_t>();
  CHECK_THROWS_WITH(limited.get_string(3), Catch::Contains("exceeds its limit"));
}

TEST_CASE("configuration: environment values are parsed strictly and errors name them", "[config]") {
  CHECK(parse_size("x", "64K") == 65536);
  CHECK(parse_size("x", "3M") == 3u << 20);
  CHECK(parse_size("x", "123") == 123);
  CHECK_THROWS_WITH(parse_size("QCCL_CHUNK_BYTES", "12x"), Catch::Contains("QCCL_CHUNK_BYTES") && Catch::Contains("'x'"));
  CHECK_THROWS_WITH(parse_size("QCCL_CHUNK_BYTES", "-5"), Catch::Contains("not a size"));
  // strtoull skips the blank and negates: this was 2^64 - 1, which switched QCCL_CODEC off silently.
  CHECK_THROWS_WITH(parse_size("QCCL_CODEC_MIN_BYTES", " -1"),
                    Catch::Contains("QCCL_CODEC_MIN_BYTES = ' -1' is not a size"));
  CHECK_THROWS_WITH(parse_int("QCCL_PIPELINE_DEPTH", "0", 1, 64), Catch::Contains("out of range"));
  CHECK(parse_int("QCCL_RANK", "-3", -5, 5) == -3);
  for (const char* odd : {" 0", "+1", "\t2", "-", "- 1"})  // strtoll's blanks and sign
    CHECK_THROWS_WITH(parse_int("QCCL_RANK", odd, -5, 5), Catch::Contains("is not an integer"));
  CHECK_THROWS_WITH(parse_double("QCCL_TIMEOUT", "soon", 0, 1e9), Catch::Contains("'soon'"));
  // Sizes and numbers take what integers take: strtoull and strtod also skipped blanks and took a
  // '+', strtod hex, "inf" and "nan" too; " 5" and 0x10 were accepted as QCCL_TIMEOUT.
  for (const char* odd : {" 64K", "+64K", "\t1", "0x10"})
    CHECK_THROWS_WITH(parse_size("QCCL_CHUNK_BYTES", odd), Catch::Contains("QCCL_CHUNK_BYTES = '" + std::string(odd)));
  for (const char* odd : {" 5", "+5", "\t5", "0x10", "0x1p-3", "-0x1", "inf", "-inf", "nan", "infinity", "- 1", "-"})
    CHECK_THROWS_WITH(parse_double("QCCL_TIMEOUT", odd, -10, 1e9),
                      Catch::Contains("QCCL_TIMEOUT = '" + std::string(odd) + "' is not a number"));
  // Overflow, and underflow to 0 (which a positive bound would have taken as 0).
  for (const char* odd : {"1e400", "1e-400", "-1e400"})
    CHECK_THROWS_WITH(parse_double("QCCL_TIMEOUT", odd, -10, 1e9),
                      Catch::Contains("QCCL_TIMEOUT = '" + std::string(odd) + "' is too large or too small"));
  CHECK(parse_double("x", "5", 0, 10) == 5);
  CHECK(parse_double("x", ".5", 0, 10) == 0.5);
  CHECK(parse_double("x", "5.", 0, 10) == 5);
  CHECK(parse_double("x", "1e-3", 0, 10) == 1e-3);
  CHECK(parse_double("x", "-.5", -1, 10) == -0.5);
  CHECK_THROWS_WITH(parse_double("QCCL_TIMEOUT", "-1", 0, 10),
                    Catch::Contains("QCCL_TIMEOUT = -1 is out of range [0, 10]"));
  with_env("QCCL_TIMEOUT", " 5", [] {
    CHECK_THROWS_WITH(Config::resolve(nullptr), Catch::Contains("QCCL_TIMEOUT = ' 5' is not a number"));
  });
  with_env("QCCL_CHUNK_BYTES", "+64K", [] {
    CHECK_THROWS_WITH(Config::resolve(nullptr), Catch::Contains("QCCL_CHUNK_BYTES = '+64K' is not a size"));
  });

  with_env("QCCL_CHUNK_BYTES", "32K", [] { CHECK(Config::resolve(nullptr).chunk_bytes == 32768); });
  with_env("QCCL_CHUNK_BYTES", "1", [] {
    CHECK_THROWS_WITH(Config::resolve(nullptr), Catch::Contains("QCCL_CHUNK_BYTES = 1"));
  });
  with_env("QCCL_TIMEOUT", "abc", [] { CHECK_THROWS_WITH(Config::resolve(nullptr), Catch::Contains("QCCL_TIMEOUT")); });
  CHECK(Config::resolve(nullptr).gpu_fft == "host");
  with_env("QCCL_GPU_FFT", "cufft", [] { CHECK(Config::resolve(nullptr).gpu_fft == "cufft"); });
  with_env("QCCL_GPU_FFT", "cuda", [] {
    CHECK_THROWS_WITH(Config::resolve(nullptr), Catch::Contains("QCCL_GPU_FFT = 'cuda' is not host or cufft"));
  });
  // tc's rate units, and the chunk sized to 5 ms of the link where QCCL_CHUNK_BYTES is not set.
  uint64_t bits = 0;
  CHECK((parse_bit_rate("100mbit", &bits) && bits == 100000000));
  CHECK((parse_bit_rate("1GBit", &bits) && bits == 1000000000));
  CHECK((parse_bit_rate("125mbps", &bits) && bits == 1000000000));  // bytes per second
  CHECK((parse_bit_rate("1gibit", &bits) && bits == 1073741824));
  CHECK_FALSE(parse_bit_rate("999bit", &bits));
  CHECK_FALSE(parse_bit_rate("1e9", &bits));
  CHECK_FALSE(parse_bit_rate("fast", &bits));
  CHECK(chunk_for_link_rate(100000000) == 61440);      // 62,500 bytes in 5 ms, down to 4 KiB pages
  CHECK(chunk_for_link_rate(1000000000) == 262144);    // 625,000: the largest chunk
  CHECK(chunk_for_link_rate(10000000) == 16384);       // 6,250: the smallest
  CHECK(chunk_for_link_rate(7999999999) == 262144);    // just below a fast link
  CHECK(chunk_for_link_rate(8000000000) == 1048576);   // 8 Gbit/s (a 10 Gbit/s link as a probe sees it): 1 MiB
  CHECK(chunk_for_link_rate(10000000000) == 1048576);
  CHECK(chunk_for_link_rate(100000000000) == 1048576);
  with_env("QCCL_LINK_RATE", "100mbit", [] {
    const Config c = Config::resolve(nullptr);
    CHECK(c.link_rate_bits == 100000000);
    CHECK(c.chunk_bytes == 61440);
    with_env("QCCL_CHUNK_BYTES", "128K", [] { CHECK(Config::resolve(nullptr).chunk_bytes == 131072); });
    qcclConfig_t over = QCCL_CONFIG_INITIALIZER;
    over.chunkBytes = 4096;
    CHECK(Config::resolve(&over).chunk_bytes == 4096);
  });
  with_env("QCCL_LINK_RATE", "10gbit", [] { CHECK(Config::resolve(nullptr).chunk_bytes == 1048576); });
  with_env("QCCL_LINK_RATE", "1gbit", [] { CHECK(Config::resolve(nullptr).chunk_bytes == 262144); });
  with_env("QCCL_LINK_RATE", "quick", [] {
    CHECK_THROWS_WITH(Config::resolve(nullptr),
                      Catch::Contains("QCCL_LINK_RATE = 'quick'") && Catch::Contains("neither probe nor a rate"));
  });
  // Beyond 1e15 bit/s the message said "of at least 1kbit", which the rate was.
  with_env("QCCL_LINK_RATE", "2000tbit", [] {
    CHECK_THROWS_WITH(Config::resolve(nullptr),
                      Catch::Contains("QCCL_LINK_RATE = '2000tbit'") && Catch::Contains("from 1kbit to 1000tbit"));
  });
  with_env("QCCL_LINK_RATE", "1000tbit", [] { CHECK(Config::resolve(nullptr).link_rate_bits == 1000000000000000ull); });
  // probe: measured when the communicator is made (src/link_probe.h); the chunk follows unless set.
  with_env("QCCL_LINK_RATE", "probe", [] {
    const Config c = Config::resolve(nullptr);
    CHECK(c.probe_link_rate);
    CHECK(c.link_rate_bits == 0);
    CHECK(c.chunk_bytes == 262144);
    CHECK_FALSE(c.chunk_explicit);
    with_env("QCCL_CHUNK_BYTES", "64K", [] { CHECK(Config::resolve(nullptr).chunk_explicit); });
    qcclConfig_t over = QCCL_CONFIG_INITIALIZER;
    over.chunkBytes = 4096;
    CHECK(Config::resolve(&over).chunk_explicit);
  });
  with_env("QCCL_LINK_RATE", "1gbit", [] { CHECK_FALSE(Config::resolve(nullptr).probe_link_rate); });
  // A config field wins over the environment.
  with_env("QCCL_PIPELINE_DEPTH", "7", [] {
    qcclConfig_t c = QCCL_CONFIG_INITIALIZER;
    CHECK(Config::resolve(&c).pipeline_depth == 7);
    c.pipelineDepth = 2;
    CHECK(Config::resolve(&c).pipeline_depth == 2);
  });
  // A config of a smaller size (an older header's) is read only as far as it goes: what lies beyond
  // its size is not the caller's, and was read (here a chunk of 10 bytes, refused).
  qcclConfig_t truncated = QCCL_CONFIG_INITIALIZER;
  truncated.size = offsetof(qcclConfig_t, timeoutSeconds);  // size, magic and version only
  truncated.chunkBytes = 10;
  CHECK(Config::resolve(&truncated).chunk_bytes == Config::resolve(nullptr).chunk_bytes);
  // A config field is held to the range of its variable.
  qcclConfig_t big = QCCL_CONFIG_INITIALIZER;
  big.chunkBytes = (1 << 30) + 1;
  CHECK_THROWS_WITH(Config::resolve(&big), Catch::Contains("config->chunkBytes = 1073741825 is out of range"));
  big.chunkBytes = 1 << 30;
  CHECK(Config::resolve(&big).chunk_bytes == size_t{1} << 30);
  // As QCCL_TIMEOUT: a longer one overflowed the clock into the past, and every wait failed at once.
  qcclConfig_t slow = QCCL_CONFIG_INITIALIZER;
  slow.timeoutSeconds = 1e10;
  CHECK_THROWS_WITH(Config::resolve(&slow),
                    Catch::Contains("config->timeoutSeconds = 1e+10 is out of range [0, 1e+09]"));
  slow.timeoutSeconds = 1e9;
  CHECK(Config::resolve(&slow).timeout_seconds == 1e9);
  // 2^64 bytes or more has no size_t: the cast came out 0, and "compress nothing below 1e20 bytes"
  // compressed every call.
  qcclConfig_t huge = QCCL_CONFIG_INITIALIZER;
  huge.codecMinBytes = 1e20;
  CHECK_THROWS_WITH(Config::resolve(&huge), Catch::Contains("config->codecMinBytes = 1e+20 must be in [0, 2^64)"));
  huge.codecMinBytes = 1e19;
  CHECK(Config::resolve(&huge).codec_min_bytes == size_t{10000000000000000000ull});
}

TEST_CASE("deadlines: beyond the clock's range is never, and sooner() keeps an expired one expired", "[socket]") {
  CHECK(net::Deadline::after(1e10).poll_ms() == -1);  // was in the past: 1e10 s overflows the clock's nanoseconds
  CHECK(net::Deadline::after(1e300).poll_ms() == -1);
  CHECK(net::Deadline::after(1e9).poll_ms() == 1 << 30);  // far, not never
  CHECK(net::Deadline::after(0).poll_ms() == -1);
  const net::Deadline past = net::Deadline::after(1e-6);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  REQUIRE(past.expired());
  CHECK(past.sooner(10).expired());  // was a fresh 10 s, or never for a negative time left
  const int half = net::Deadline::never().sooner(0.5).poll_ms();
  CHECK((half > 0 && half <= 501));
  CHECK(net::Deadline::after(100).sooner(0.5).poll_ms() <= 501);
  CHECK(net::Deadline::after(0.2).sooner(100).poll_ms() <= 201);
}

TEST_CASE("algorithm policy: forcing by name, falling back with a reason, and parse errors", "[policy]") {
  AlgorithmPolicy by_size("");
  CHECK(std::string(by_size.choose(args_for(coll::CollKind::kAllReduce, 16)).name) == "recursive_doubling");
  CHECK(std::string(by_size.choose(args_for(coll::CollKind::kAllReduce, 1 << 20)).name) == "ring");
  CHECK(std::string(by_size.choose(args_for(coll::CollKind::kAllReduce, 1 << 20, 1)).name) == "local");

  AlgorithmPolicy forced("allreduce=recursive_doubling,broadcast=chain");
  CHECK(std::string(forced.choose(args_for(coll::CollKind::kAllReduce, 1 << 20)).name) == "recursive_doubling");
  CHECK(std::string(forced.choose(args_for(coll::CollKind::kBroadcast, 4)).name) == "chain");
  // A forced algorithm that cannot run (one rank) declines, and the policy picks one that can.
  CHECK(std::string(forced.choose(args_for(coll::CollKind::kAllReduce, 4, 1)).name) == "local");
  AlgorithmPolicy bare("ring");
  CHECK(std::string(bare.choose(args_for(coll::CollKind::kAllGather, 4)).name) == "ring");
  CHECK(std::string(bare.choose(args_for(coll::CollKind::kAllReduce, 4)).name) == "ring");

  CHECK_THROWS_WITH(AlgorithmPolicy("warp"), Catch::Contains("'warp'"));
  CHECK_THROWS_WITH(AlgorithmPolicy("allreduce=chain"), Catch::Contains("AllReduce has no algorithm named 'chain'"));
  CHECK_THROWS_WITH(AlgorithmPolicy("allgatherv=ring"), Catch::Contains("'allgatherv' is not a collective"));
  CHECK_THROWS_WITH(AlgorithmPolicy("allgatherv=ring"), Catch::Contains("Gather, Scatter"));
  // The same collective twice: the later one won silently.
  CHECK_THROWS_WITH(AlgorithmPolicy("allreduce=ring,allreduce=recursive_doubling"),
                    Catch::Contains("AllReduce is given twice"));
  // A bare name, then one collective's own: "ring everywhere but here" stays allowed.
  AlgorithmPolicy mixed("ring,allreduce=recursive_doubling");
  CHECK(std::string(mixed.choose(args_for(coll::CollKind::kAllReduce, 1 << 20)).name) == "recursive_doubling");
  // ... wherever it stands: after it, the bare name overrode the collective's own.
  AlgorithmPolicy after("allreduce=recursive_doubling,ring");
  CHECK(std::string(after.choose(args_for(coll::CollKind::kAllReduce, 1 << 20)).name) == "recursive_doubling");
  CHECK(std::string(after.choose(args_for(coll::CollKind::kAllGather, 4)).name) == "ring");
  CHECK(after.forced() == "AllReduce=recursive_doubling,AllGather=ring,ReduceScatter=ring");
  // Two bare names forcing one collective (AllGather has both): the last won.
  CHECK_THROWS_WITH(AlgorithmPolicy("ring,hierarchical"),
                    Catch::Contains("QCCL_ALGO = 'ring,hierarchical': 'ring' and 'hierarchical' both force AllGather"));
  CHECK_THROWS_WITH(AlgorithmPolicy("hierarchical,allreduce=ring,ring", "config->algorithms"),
                    Catch::Contains("config->algorithms = 'hierarchical,allreduce=ring,ring'"));
  // ... unless that collective names its own, or the two are the same name.
  AlgorithmPolicy own("ring,hierarchical,allgather=ring,reducescatter=ring");
  CHECK(std::string(own.choose(args_for(coll::CollKind::kAllGather, 4)).name) == "ring");
  CHECK(std::string(AlgorithmPolicy("ring,ring").choose(args_for(coll::CollKind::kAllReduce, 4)).name) == "ring");
}

// Run with QCCL_DEBUG=WARN by the test runtime_units_fallback_warns_once (tests/unit/CMakeLists.txt),
// which counts the warnings: one per collective and reason, not one per call (an INFO per call before).
TEST_CASE("algorithm policy: a forced algorithm that declines warns once per collective and reason", "[fallback]") {
  AlgorithmPolicy forced("allreduce=recursive_doubling,broadcast=chain");
  for (int call = 0; call < 3; ++call) {
    CHECK(std::string(forced.choose(args_for(coll::CollKind::kAllReduce, 4, 1)).name) == "local");
    CHECK(std::string(forced.choose(args_for(coll::CollKind::kBroadcast, 4, 1)).name) != "chain");
  }
  AlgorithmPolicy another("allreduce=recursive_doubling");  // another communicator's: warns again
  CHECK(std::string(another.choose(args_for(coll::CollKind::kAllReduce, 4, 1)).name) == "local");
}

TEST_CASE("codec policy: `none` leaves its types exact", "[policy]") {
  // It compressed with the none codec, which widens half and bfloat16 to float32 on the wire.
  coll::CollArgs half = args_for(coll::CollKind::kAllReduce, 1 << 20), single = half;
  half.dtype = kernels::DataType::kFloat16;
  single.dtype = kernels::DataType::kFloat32;
  CHECK(CodecPolicy("none", 0).choose(half) == nullptr);
  CHECK(CodecPolicy("none", 0).choose(single) == nullptr);
  const CodecPolicy mixed("float=none;q8", 0);
  CHECK(mixed.choose(single) == nullptr);
  REQUIRE(mixed.choose(half) != nullptr);
  CHECK(mixed.choose(half)->canonical().rfind("q8:", 0) == 0);
  CHECK_THAT(mixed.describe(), Catch::Contains("float exact"));
}

TEST_CASE("QCCL_AGGREGATORS: host:port entries, each once", "[config]") {
  CHECK(parse_aggregator_list("127.0.0.1:1,127.0.0.1:2").size() == 2);
  // Twice the same: one aggregator told two indexes; the job failed or not by the ranks' arrival order.
  CHECK_THROWS_WITH(parse_aggregator_list("127.0.0.1:9,127.0.0.1:9"), Catch::Contains("names 127.0.0.1:9 twice"));
  CHECK_THROWS_WITH(parse_aggregator_list("127.0.0.1:9,"), Catch::Contains("empty entry"));
}

TEST_CASE("segments: n near-equal parts that tile the count, independent of chunking", "[ring]") {
  for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{8}, size_t{1001}}) {
    for (int n : {1, 2, 3, 7, 8}) {
      coll::Segments s{count, n};
      size_t next = 0, largest = 0;
      for (int i = 0; i < n; ++i) {
        CHECK(s.begin(i) == next);
        next += s.size(i);
        largest = std::max(largest, s.size(i));
        CHECK(s.size(i) + 1 >= s.max_size());
      }
      CHECK(next == count);
      CHECK(largest == s.max_size());
    }
  }
  const coll::Ring ring = coll::Ring::whole(0, 5);
  CHECK(ring.at(-1) == 4);
  CHECK(ring.at(-11) == 4);
  CHECK(ring.at(7) == 2);
  CHECK(ring.position_at(7) == 2);
  CHECK(coll::piece(10, 4, 2).offset == 8);
  CHECK(coll::piece(10, 4, 2).count == 2);
  CHECK(coll::piece(10, 4, 3).count == 0);
}

TEST_CASE("a ring over a member list: positions index blocks, next/prev/at return communicator ranks") {
  const coll::Ring ring({6, 2, 9, 4}, 9);  // position i -> rank members[i]
  CHECK(ring.size() == 4);
  CHECK(ring.position() == 2);
  CHECK(ring.rank() == 9);
  CHECK(ring.next() == 4);
  CHECK(ring.prev() == 2);
  CHECK(ring.at(2) == 6);
  CHECK(ring.at(-3) == 4);
  CHECK(ring.position_at(-3) == 3);
  CHECK(ring.member(1) == 2);
  CHECK(ring.position_of(4) == 3);
  CHECK(ring.position_of(5) == -1);
  std::vector<int> to, from;
  ring.links(&to, &from);
  CHECK(to == std::vector<int>{4});
  CHECK(from == std::vector<int>{2});
  to.clear(), from.clear();
  coll::Ring({3}, 3).links(&to, &from);  // a ring of one has no links
  CHECK(to.empty());
  CHECK(from.empty());
}

TEST_CASE("grid rows and columns are member-list rings") {
  // 2 x 3 grid: rank 4 sits at row 1, column 1.
  const coll::Ring row = coll::grid_row(4, 3), column = coll::grid_column(4, 2, 3);
  CHECK(row.members() == std::vector<int>{3, 4, 5});
  CHECK(row.position() == 1);
  CHECK(row.next() == 5);
  CHECK(row.prev() == 3);
  CHECK(column.members() == std::vector<int>{1, 4});
  CHECK(column.position() == 1);
  CHECK(column.next() == 1);
}

TEST_CASE("binomial trees over a member list") {
  // Over the whole communicator of 6 ranks rooted at 2 (v = rank - 2 mod 6): v=0 has children
  // v=1, 2, 4; v=2 (rank 4) has parent v=0 and child v=3 (rank 5); v=5 (rank 1) has parent v=4 (rank 0).
  const coll::BinomialTree root(coll::Ring::whole(2, 6), 2);
  CHECK(root.parent == -1);
  CHECK(root.children == std::vector<int>{3, 4, 0});
  const coll::BinomialTree four(coll::Ring::whole(4, 6), 2);
  CHECK(four.parent == 2);
  CHECK(four.children == std::vector<int>{5});
  const coll::BinomialTree one(coll::Ring::whole(1, 6), 2);
  CHECK(one.parent == 0);
  CHECK(one.children.empty());
  // Over members {7, 3, 5} rooted at rank 3 (position 1): 3 -> 5 and 3 -> 7.
  const coll::BinomialTree sub_root(coll::Ring({7, 3, 5}, 3), 3);
  CHECK(sub_root.children == std::vector<int>{5, 7});
  const coll::BinomialTree sub_leaf(coll::Ring({7, 3, 5}, 7), 3);
  CHECK(sub_leaf.parent == 3);
  CHECK(sub_leaf.children.empty());
}

TEST_CASE("a node map from labels: nodes numbered by their lowest rank, ranks, local indexes, leaders") {
  const coll::NodeMap m = coll::NodeMap::from_labels({7, 3, 7, 3, 5});
  CHECK(m.nranks() == 5);
  CHECK(m.nodes() == 3);
  CHECK(m.node_of_rank() == std::vector<int>{0, 1, 0, 1, 2});
  CHECK(m.ranks_of(0) == std::vector<int>{0, 2});
  CHECK(m.ranks_of(1) == std::vector<int>{1, 3});
  CHECK(m.ranks_of(2) == std::vector<int>{4});
  CHECK(m.local_index(2) == 1);
  CHECK(m.local_index(3) == 1);
  CHECK(m.local_index(4) == 0);
  CHECK(m.leaders() == std::vector<int>{0, 1, 4});
  CHECK(m.leader(1) == 1);
  CHECK(m.same_node(1, 3));
  CHECK_FALSE(m.same_node(0, 1));
  CHECK(m.describe() == "3 nodes: 0,1,0,1,2");
  CHECK(coll::NodeMap::single_node(3).describe() == "1 node: 0,0,0");
}

PeerInfo peer_on(const std::string& host, const std::string& boot) {
  PeerInfo p;
  p.hostname = host;
  p.boot_id = boot;
  return p;
}

TEST_CASE("the communicator's node map: by host name and boot id, or QCCL_NODE_MAP") {
  // Host b with two boot ids is two hosts (clones that share a name).
  const std::vector<PeerInfo> peers = {peer_on("a", "1"), peer_on("b", "1"), peer_on("a", "1"), peer_on("b", "2")};
  CHECK(compute_node_map(peers, "").describe() == "3 nodes: 0,1,0,2");
  // One host: one node (what qcclrun on one machine gives).
  CHECK(compute_node_map({peer_on("h", "x"), peer_on("h", "x")}, "").nodes() == 1);
  // The override wins over the hosts; labels need not be dense or sorted.
  CHECK(compute_node_map(peers, "0,0,1,1").describe() == "2 nodes: 0,0,1,1");
  CHECK(compute_node_map(peers, "9,4,9,4").describe() == "2 nodes: 0,1,0,1");
  CHECK(compute_node_map(peers, "0,1,2,3").nodes() == 4);
}

TEST_CASE("QCCL_NODE_MAP's grammar: one non-negative integer per rank, comma-separated") {
  CHECK(parse_node_map("0,0,1,1", 4) == std::vector<int>{0, 0, 1, 1});
  CHECK(parse_node_map("12", 1) == std::vector<int>{12});
  for (const char* bad : {"", "0,,1", "0,1,", ",0", "0, 1", "-1,0", "a,b", "0;1", "2x2", "1234567890,0"}) {
    INFO(bad);
    try {
      parse_node_map(bad, 2);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == qcclInvalidArgument);
      CHECK_THAT(e.message(), Catch::Contains("QCCL_NODE_MAP") && Catch::Contains(std::string("\"") + bad + "\""));
    }
  }
  CHECK_THROWS_WITH(parse_node_map("0,0,1", 4), Catch::Contains("QCCL_NODE_MAP = \"0,0,1\" lists 3 ranks") &&
                                                    Catch::Contains("the communicator has 4"));
  CHECK_THROWS_WITH(compute_node_map({peer_on("h", "x")}, "0,1"), Catch::Contains("lists 2 ranks"));
  // A split child keeps its members' nodes.
  CHECK(node_map_of_members(coll::NodeMap::from_labels({0, 0, 1, 1}), {3, 1, 2}) == "1,0,1");
}

TEST_CASE("auto's CPU model: the ranks that share a host's CPUs, also in a split child", "[split][auto]") {
  // Two hosts of two ranks on one CPU each: the parent detects oversubscription (-1: not set).
  std::vector<PeerInfo> parent(4);
  for (size_t r = 0; r < parent.size(); ++r) {
    parent[r].hostname = "host" + std::to_string(r / 2);
    parent[r].boot_id = "boot" + std::to_string(r / 2);
    parent[r].cpus = 1;
  }
  for (size_t r = 0; r < parent.size(); ++r) CHECK(ranks_sharing_cpus(parent, r) == 2);
  // A child of all four sent QCCL_OVERSUBSCRIBED's 1, so that it would yield too, and its model
  // divided each host's CPU among all four ranks: twice its parent's costs. It now sends what its
  // parent found (Config::parent_host_ranks), and detects.
  std::vector<PeerInfo> child = parent;
  for (PeerInfo& p : child) p.parent_host_ranks = 2;
  for (size_t r = 0; r < child.size(); ++r) CHECK(ranks_sharing_cpus(child, r) == 2);
  // A child of one rank per host: the parent's other rank still shares the CPU.
  const std::vector<PeerInfo> one_per_host = {child[0], child[2]};
  CHECK(ranks_sharing_cpus(one_per_host, 0) == 2);
  CHECK(ranks_sharing_cpus({parent[0], parent[2]}, 1) == 1);  // (a communicator of its own)
  // QCCL_OVERSUBSCRIBED=1 as set (qcclrun --nodes on too few CPUs): the "hosts" share one machine.
  for (PeerInfo& p : parent) p.oversubscribed = 1;
  CHECK(ranks_sharing_cpus(parent, 3) == 4);
}

TEST_CASE("link probe: the rate from the agreed timings stays near the average and within QCCL_LINK_RATE's range",
          "[probe]") {
  const double wire = 1538.0 / 1448.0;  // Ethernet framing
  // The slope: 3 MiB more in 30 ms more.
  CHECK(probed_link_rate(1 << 20, 0.010, 4 << 20, 0.040) == static_cast<uint64_t>(3.0 * (1 << 20) / 0.030 * 8 * wire));
  // One size only, or a larger size no slower: its average.
  CHECK(probed_link_rate(0, 0, 1 << 20, 0.010) == static_cast<uint64_t>((1 << 20) / 0.010 * 8 * wire));
  CHECK(probed_link_rate(1 << 20, 0.010, 4 << 20, 0.010) == static_cast<uint64_t>((4 << 20) / 0.010 * 8 * wire));
  // Two close timings: the slope was 76 times the average (4.3e12 bit/s against 5.6e10).
  const uint64_t close = probed_link_rate(16 << 20, 0.0100, 64 << 20, 0.0101);
  CHECK(close == static_cast<uint64_t>(4 * (64 << 20) / 0.0101 * 8 * wire));
  // Worst case: beyond any link (and the 1e15 bit/s QCCL_LINK_RATE takes), now capped there.
  CHECK(probed_link_rate(16 << 20, 1e-9, 64 << 20, 1.0000001e-9) == kMaxLinkBits);
  CHECK(probed_link_rate(0, 0, 64 << 20, 1e-12) == kMaxLinkBits);
  CHECK(probed_link_rate(0, 0, 64 * 1024, 1e6) == kMinLinkBits);  // never 0, which reads "unset"
  // The same timings give the same rate on every rank (a function of them alone).
  CHECK(probed_link_rate(1 << 20, 0.0123, 4 << 20, 0.0456) == probed_link_rate(1 << 20, 0.0123, 4 << 20, 0.0456));
}

}  // namespace qccl::test
