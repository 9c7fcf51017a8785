// AQ-SGD's keyed message store (collectives/aqsgd_store.h), a sender and a receiver in one process
// passing messages as bytes: first sight full and later sends deltas, with the message sizes of the
// spec's P1/P5; warm-up; 10,000 random calls over random keys with a tiny budget and LRU eviction,
// the two stores bit-equal after every call (P4, P12); the budget refused without eviction; every
// protocol error of P11 (another store, configuration, key order, shape, a lost message, a delta for
// an unknown key, a truncated message) failing before either store changes; checkpoints; the file
// tier (row_arena.h): bit-equal with the memory tier, its file's life, a file that cannot grow; low-bit
// m (App. H.5): bit-equal, within the delta's bound; a message written and applied section by
// section, in any order, equal to the whole; bad sections and refusals failing with nothing changed;
// a key's new m beyond its type's range refused at both ends, the key going on from its old m; a
// checkpoint's m that is not finite sending its key whole.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "collectives/aqsgd_store.h"
#include "collectives/row_arena.h"
#include "kernels/convert.h"
#include "kernels/half.h"

namespace qccl::coll {
namespace {

using Kind = DeltaStoreError::Kind;

DeltaStore::Config config(const std::string& spec, size_t row, size_t budget = 0,
                          DeltaStore::Evict evict = DeltaStore::Evict::kNone) {
  DeltaStore::Config c;
  c.codec = kernels::parse_codec_spec(spec);
  c.row_values = row;
  c.budget_bytes = budget;
  c.evict = evict;
  c.id = 7;
  return c;
}

std::vector<float> rows_of(size_t nkeys, size_t row, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(nkeys * row);
  for (float& v : x) v = normal(rng);
  return x;
}

// Both stores hold the same keys with the same bits.
void require_equal(const DeltaStore& a, const DeltaStore& b, const std::vector<uint64_t>& universe) {
  REQUIRE(a.keys() == b.keys());
  REQUIRE(a.sequence() == b.sequence());
  for (uint64_t k : universe) {
    REQUIRE((a.row(k) == nullptr) == (b.row(k) == nullptr));
    if (a.row(k)) REQUIRE(std::memcmp(a.row(k), b.row(k), a.bytes() / a.keys()) == 0);
  }
}

Kind kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DeltaStoreError& e) {
    return e.kind();
  }
  FAIL("no DeltaStoreError");
  return Kind::kArgument;
}

TEST_CASE("delta store: first sight full, then deltas; message sizes (P1, P5)", "[aqsgd]") {
  const size_t row = 1024 * 16;  // 1024 tokens x 16 channels
  DeltaStore sender(config("aq4:channels=16", row)), receiver(config("aq4:channels=16", row));
  std::mt19937_64 rng(1);
  const std::vector<uint64_t> keys = {11, 22};
  std::vector<float> x = rows_of(2, row, rng), out(x.size());
  std::vector<uint8_t> msg(sender.max_message_bytes(2));
  // First sight: both rows full, float16 on the wire (2 bytes per value): the header, the bitmap, four
  // section headers (2 keys: sections 1 and 3 hold a row each, 0 and 2 none), the rows.
  const size_t sections = 4 * 16;
  size_t bytes = sender.send(x.data(), keys.data(), 2, {}, msg.data());
  CHECK(bytes == 64 + 1 + sections + 2 * row * 2);
  receiver.receive(msg.data(), bytes, keys.data(), 2, out.data());
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(out[i] == kernels::half_to_float(kernels::float_to_half(x[i])));
  require_equal(sender, receiver, keys);
  // Seen: deltas, the spec's size per section: a row of 1024 x 16 values at 4 bits + 16 fp16 scales.
  for (float& v : x) v += 0.01f;
  bytes = sender.send(x.data(), keys.data(), 2, {}, msg.data());
  CHECK(bytes == 64 + 1 + sections + 2 * (row / 2 + 16 * 2));
  receiver.receive(msg.data(), bytes, keys.data(), 2, out.data());
  require_equal(sender, receiver, keys);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(double{out[i]} - x[i]));
  CHECK(worst < 0.01);  // the delta (0.01) quantized to 4 bits, plus fp16 rounding of the store
  // A mix: a new key goes full, the others delta.
  const std::vector<uint64_t> three = {22, 33, 11};
  std::vector<float> x3 = rows_of(3, row, rng), out3(x3.size());
  std::vector<uint8_t> msg3(sender.max_message_bytes(3));
  bytes = sender.send(x3.data(), three.data(), 3, {}, msg3.data());
  CHECK(bytes == 64 + 1 + sections + row * 2 + 2 * kernels::parse_codec_spec("aq4:channels=16").encoded_bytes(row));
  receiver.receive(msg3.data(), bytes, three.data(), 3, out3.data());
  require_equal(sender, receiver, {11, 22, 33});
  // Warm-up: everything full again.
  sender.set_warmup(true);
  bytes = sender.send(x3.data(), three.data(), 3, {}, msg3.data());
  CHECK(bytes == 64 + 1 + sections + 3 * row * 2);
  receiver.receive(msg3.data(), bytes, three.data(), 3, out3.data());
  require_equal(sender, receiver, {11, 22, 33});
}

TEST_CASE("delta store: a message section by section, in any order, is the message whole", "[aqsgd]") {
  const size_t row = 256 * 8;
  for (const int store_bits : {0, 4}) {
    INFO("store bits " << store_bits);
    auto c = config("aq3:channels=8,round=stochastic", row);
    c.store_bits = store_bits;
    DeltaStore whole_sender(c), whole_receiver(c), sender(c), receiver(c);
    std::mt19937_64 rng(21);
    const std::vector<uint64_t> first = {1, 2, 3, 4, 5, 6}, second = {7, 3, 1, 6, 2, 4, 5};
    std::vector<float> x = rows_of(second.size(), row, rng), out(x.size()), whole_out(x.size());
    std::vector<uint8_t> whole(sender.max_message_bytes(second.size())), head(sender.max_head_bytes(second.size()));
    std::vector<std::vector<uint8_t>> sections(DeltaStore::kSections,
                                               std::vector<uint8_t>(sender.max_section_bytes(second.size())));
    const kernels::PhiloxKey key{99, 0, 0, 0};
    for (const auto& keys : {first, second}) {  // all full, then a full row (7) among deltas
      const size_t n = keys.size();
      for (float& v : x) v += 0.05f;
      const size_t whole_bytes = whole_sender.send(x.data(), keys.data(), n, key, whole.data());
      whole_receiver.receive(whole.data(), whole_bytes, keys.data(), n, whole_out.data());
      // The parts written backwards and received in another order: the same bytes, the same stores.
      const size_t head_bytes = sender.begin_send(x.data(), keys.data(), n, key, head.data());
      for (size_t s = DeltaStore::kSections; s-- > 0;) sender.send_section(s, sections[s].data());
      std::vector<uint8_t> joined(head.begin(), head.begin() + static_cast<long>(head_bytes));
      for (size_t s = 0; s < DeltaStore::kSections; ++s)
        joined.insert(joined.end(), sections[s].begin(), sections[s].begin() + static_cast<long>(sender.section_bytes(s)));
      REQUIRE(joined == std::vector<uint8_t>(whole.begin(), whole.begin() + static_cast<long>(whole_bytes)));
      sender.commit();
      receiver.receive_head(head.data(), head_bytes, keys.data(), n);
      for (size_t s : {2, 0, 3, 1}) receiver.receive_section(s, sections[s].data(), receiver.section_bytes(s), out.data());
      receiver.commit();
      CHECK(out == whole_out);
      require_equal(sender, receiver, second);
      require_equal(sender, whole_sender, second);
    }
  }
}

TEST_CASE("delta store: a call uses sections while their scales cost under 1/32 of its delta", "[aqsgd]") {
  // aq4 over 64 channels: a channel's scale is 2 bytes against its values' 4 bits each.
  DeltaStore one_token(config("aq4:channels=64", 64)), many_tokens(config("aq4:channels=64", 64 * 256));
  CHECK(one_token.sections(32) == 1);    // 32 values per channel in all: a set of scales is 1/8 of it
  CHECK(many_tokens.sections(1) == 1);   // one key: one section
  CHECK(many_tokens.sections(2) == 2);   // 256 values per channel per key: 1/64 each
  CHECK(many_tokens.sections(9) == 4);   // never more than kSections
  CHECK(many_tokens.sections(0) == 1);
  // 16 values per channel per key: 8 keys' delta is 4,096 bytes of codes and 128 of scales; a second
  // set of scales adds 128 bytes (3.03%, under 1/32), a third 256 (6%); 4 keys: 128 of 2,176 (5.9%).
  DeltaStore some_tokens(config("aq4:channels=64", 64 * 16));
  CHECK(some_tokens.sections(8) == 2);
  CHECK(some_tokens.sections(4) == 1);
  // The message holds what the rule says: a section header each, empty sections included.
  std::mt19937_64 rng(4);
  const uint64_t keys[] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> x = rows_of(8, 64 * 16, rng);
  std::vector<uint8_t> msg(some_tokens.max_message_bytes(8));
  some_tokens.send(x.data(), keys, 8, {}, msg.data());
  for (float& v : x) v += 0.01f;
  const size_t bytes = some_tokens.send(x.data(), keys, 8, {}, msg.data());
  CHECK(bytes == 64 + 1 + 4 * 16 + 2 * kernels::parse_codec_spec("aq4:channels=64").encoded_bytes(4 * 64 * 16));
}

TEST_CASE("delta store: a bad section, or a refusal, fails before the store changes", "[aqsgd]") {
  const size_t row = 1024;  // 128 values per channel and key: a section per key
  DeltaStore sender(config("aq4:channels=8", row)), receiver(config("aq4:channels=8", row));
  std::mt19937_64 rng(23);
  const uint64_t keys[] = {1, 2, 3, 4};
  std::vector<float> x = rows_of(4, row, rng), out(x.size());
  std::vector<uint8_t> msg(sender.max_message_bytes(4));
  size_t bytes = sender.send(x.data(), keys, 4, {}, msg.data());
  receiver.receive(msg.data(), bytes, keys, 4, out.data());
  REQUIRE(sender.sections(4) == 4);
  std::vector<uint8_t> head(sender.max_head_bytes(4));
  std::vector<std::vector<uint8_t>> sections(DeltaStore::kSections, std::vector<uint8_t>(sender.max_section_bytes(4)));
  const size_t head_bytes = sender.begin_send(x.data(), keys, 4, {}, head.data());
  for (size_t s = 0; s < DeltaStore::kSections; ++s) sender.send_section(s, sections[s].data());
  const std::vector<uint8_t> before = receiver.save();
  auto fails = [&](Kind kind, const std::function<void()>& damage) {
    receiver.receive_head(head.data(), head_bytes, keys, 4);
    receiver.receive_section(0, sections[0].data(), receiver.section_bytes(0), out.data());
    CHECK(kind_of(damage) == kind);
    receiver.abandon();
    CHECK(receiver.save() == before);
  };
  fails(Kind::kCorrupt, [&] { receiver.receive_section(2, sections[1].data(), receiver.section_bytes(1), out.data()); });
  fails(Kind::kCorrupt, [&] { receiver.receive_section(1, sections[1].data(), receiver.section_bytes(1) - 1, out.data()); });
  fails(Kind::kCorrupt, [&] { receiver.receive_section(0, sections[0].data(), receiver.section_bytes(0), out.data()); });
  fails(Kind::kArgument, [&] { receiver.commit(); });  // sections 1 .. 3 missing
  std::vector<uint8_t> refusal(DeltaStore::section_header_bytes());
  DeltaStore::write_section_refusal(1, refusal.data());
  CHECK(DeltaStore::is_section_refusal(refusal.data(), refusal.size()));
  CHECK_FALSE(DeltaStore::is_section_refusal(sections[1].data(), receiver.section_bytes(1)));
  fails(Kind::kCorrupt, [&] { receiver.receive_section(1, refusal.data(), refusal.size(), out.data()); });
  // The sender's NaN in its last section: that section throws; abandoned, the store is unchanged.
  const std::vector<uint8_t> sender_before = sender.save();
  sender.abandon();
  x[3 * row + 1] = NAN;
  sender.begin_send(x.data(), keys, 4, {}, head.data());
  for (size_t s = 0; s + 1 < DeltaStore::kSections; ++s) sender.send_section(s, sections[s].data());
  CHECK(kind_of([&] { sender.send_section(3, sections[3].data()); }) == Kind::kNonFinite);
  CHECK(kind_of([&] { sender.commit(); }) == Kind::kArgument);
  sender.abandon();
  CHECK(sender.save() == sender_before);
}

TEST_CASE("delta store: 10,000 random calls with a tiny budget stay bit-equal at both ends (P4, P12)", "[aqsgd]") {
  for (const char* spec : {"aq3:channels=8,round=stochastic,seed=4", "aq8:channels=8"}) {
    const size_t row = 32, budget_keys = 5;
    const auto c = config(spec, row, budget_keys * row * 2, DeltaStore::Evict::kLeastRecent);
    DeltaStore sender(c), receiver(c);
    std::mt19937_64 rng(2024);
    std::vector<uint64_t> universe(12);
    for (size_t k = 0; k < universe.size(); ++k) universe[k] = 1000 + 17 * k;
    std::vector<std::vector<float>> truth(universe.size());
    for (auto& t : truth) t = rows_of(1, row, rng);
    size_t evictions_seen = 0, deltas = 0;
    for (int call = 0; call < 10000; ++call) {
      // 1..3 distinct keys
      std::vector<size_t> pick(universe.size());
      for (size_t i = 0; i < pick.size(); ++i) pick[i] = i;
      std::shuffle(pick.begin(), pick.end(), rng);
      const size_t nkeys = 1 + rng() % 3;
      std::vector<uint64_t> keys(nkeys);
      std::vector<float> x(nkeys * row), out(nkeys * row);
      size_t held_before = 0;
      for (size_t r = 0; r < nkeys; ++r) {
        keys[r] = universe[pick[r]];
        held_before += sender.holds(keys[r]);
        for (float& v : truth[pick[r]]) v += 0.02f * std::normal_distribution<float>(0.0f, 1.0f)(rng);
        std::copy(truth[pick[r]].begin(), truth[pick[r]].end(), x.begin() + static_cast<long>(r * row));
      }
      sender.set_warmup(call % 1000 < 3);
      std::vector<uint8_t> msg(sender.max_message_bytes(nkeys));
      const size_t keys_before = sender.keys();
      const size_t bytes = sender.send(x.data(), keys.data(), nkeys, kernels::PhiloxKey{4, uint64_t(call), 0, 0}, msg.data());
      evictions_seen += keys_before + (nkeys - held_before) > sender.keys();
      deltas += held_before;
      receiver.receive(msg.data(), bytes, keys.data(), nkeys, out.data());
      INFO(spec << " call " << call);
      REQUIRE(sender.bytes() <= c.budget_bytes);
      require_equal(sender, receiver, universe);
    }
    CHECK(evictions_seen > 1000);  // the budget of 5 keys out of 12 evicts often
    CHECK(deltas > 5000);
  }
}

TEST_CASE("delta store: over the budget without eviction, the call fails and nothing changes", "[aqsgd]") {
  const size_t row = 16;
  DeltaStore sender(config("aq4:channels=16", row, 2 * row * 2));  // two keys of float16
  std::mt19937_64 rng(3);
  std::vector<float> x = rows_of(3, row, rng);
  std::vector<uint8_t> msg(sender.max_message_bytes(3));
  const uint64_t a[] = {1, 2}, b[] = {3}, all[] = {4, 5, 6};
  sender.send(x.data(), a, 2, {}, msg.data());
  CHECK(kind_of([&] { sender.send(x.data(), b, 1, {}, msg.data()); }) == Kind::kBudget);
  CHECK(kind_of([&] { sender.send(x.data(), all, 3, {}, msg.data()); }) == Kind::kBudget);
  CHECK(sender.keys() == 2);
  CHECK(sender.sequence() == 1);
  const uint64_t twice[] = {1, 1};
  CHECK(kind_of([&] { sender.send(x.data(), twice, 2, {}, msg.data()); }) == Kind::kArgument);
  // A call whose own keys exceed the budget fails even with eviction.
  DeltaStore lru(config("aq4:channels=16", row, 2 * row * 2, DeltaStore::Evict::kLeastRecent));
  CHECK(kind_of([&] { lru.send(x.data(), all, 3, {}, msg.data()); }) == Kind::kBudget);
  CHECK(lru.keys() == 0);
}

TEST_CASE("delta store: protocol errors fail before either store changes (P11)", "[aqsgd]") {
  const size_t row = 64;
  DeltaStore sender(config("aq4:channels=8", row)), receiver(config("aq4:channels=8", row));
  std::mt19937_64 rng(5);
  const uint64_t keys[] = {5, 6, 7};
  std::vector<float> x = rows_of(3, row, rng), out(x.size());
  std::vector<uint8_t> msg(sender.max_message_bytes(3));
  size_t bytes = sender.send(x.data(), keys, 3, {}, msg.data());
  receiver.receive(msg.data(), bytes, keys, 3, out.data());
  for (float& v : x) v *= 1.01f;
  bytes = sender.send(x.data(), keys, 3, {}, msg.data());  // deltas, message 1
  const std::vector<uint8_t> before = receiver.save();
  auto unchanged = [&] { CHECK(receiver.save() == before); };

  const uint64_t reordered[] = {6, 5, 7}, other[] = {5, 6, 8};
  CHECK(kind_of([&] { receiver.receive(msg.data(), bytes, reordered, 3, out.data()); }) == Kind::kMismatch);
  unchanged();
  CHECK(kind_of([&] { receiver.receive(msg.data(), bytes, other, 3, out.data()); }) == Kind::kMismatch);
  unchanged();
  CHECK(kind_of([&] { receiver.receive(msg.data(), bytes, keys, 2, out.data()); }) == Kind::kMismatch);
  unchanged();
  CHECK(kind_of([&] { receiver.receive(msg.data(), bytes - 1, keys, 3, out.data()); }) == Kind::kCorrupt);
  unchanged();
  CHECK(kind_of([&] { receiver.receive(msg.data(), 10, keys, 3, out.data()); }) == Kind::kCorrupt);
  unchanged();
  // Another store id, another configuration, another row size.
  auto other_id = config("aq4:channels=8", row);
  other_id.id = 8;
  DeltaStore wrong_id(other_id), wrong_codec(config("aq3:channels=8", row)), wrong_row(config("aq4:channels=8", row * 2));
  CHECK(kind_of([&] { wrong_id.receive(msg.data(), bytes, keys, 3, out.data()); }) == Kind::kMismatch);
  CHECK(kind_of([&] { wrong_codec.receive(msg.data(), bytes, keys, 3, out.data()); }) == Kind::kMismatch);
  CHECK(kind_of([&] { wrong_row.receive(msg.data(), bytes, keys, 3, out.data()); }) == Kind::kMismatch);
  // A lost message: the sender's next one arrives first.
  std::vector<uint8_t> next(sender.max_message_bytes(3));
  const size_t next_bytes = sender.send(x.data(), keys, 3, {}, next.data());
  CHECK(kind_of([&] { receiver.receive(next.data(), next_bytes, keys, 3, out.data()); }) == Kind::kSequence);
  unchanged();
  // In order, both apply.
  receiver.receive(msg.data(), bytes, keys, 3, out.data());
  receiver.receive(next.data(), next_bytes, keys, 3, out.data());
  require_equal(sender, receiver, {5, 6, 7});
  // A delta for a key the receiver does not hold: a fresh receiver given message 0 of another run
  // is at sequence 0 but holds nothing; the sender's deltas at its sequence are refused as a gap.
  DeltaStore fresh(config("aq4:channels=8", row));
  CHECK(kind_of([&] { fresh.receive(next.data(), next_bytes, keys, 3, out.data()); }) == Kind::kSequence);
  CHECK(fresh.keys() == 0);
  // A NaN in a delta row: the sender refuses, nothing sent, its store unchanged.
  const std::vector<uint8_t> sender_before = sender.save();
  x[70] = NAN;
  CHECK(kind_of([&] { sender.send(x.data(), keys, 3, {}, msg.data()); }) == Kind::kNonFinite);
  CHECK(sender.save() == sender_before);
}

// Writes a checkpoint's checksum anew after the test changed its bytes on purpose (FNV-1a over the rest).
void reseal(std::vector<uint8_t>& checkpoint) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i + 8 < checkpoint.size(); ++i) h = (h ^ checkpoint[i]) * 1099511628211ull;
  std::memcpy(checkpoint.data() + checkpoint.size() - 8, &h, 8);
}

TEST_CASE("delta store: a delta for a key the receiver lost is refused; checkpoints restore both ends",
          "[aqsgd]") {
  const size_t row = 32;
  DeltaStore sender(config("aq2:channels=4", row)), receiver(config("aq2:channels=4", row));
  std::mt19937_64 rng(9);
  const uint64_t keys[] = {1, 2};
  std::vector<float> x = rows_of(2, row, rng), out(x.size());
  std::vector<uint8_t> msg(sender.max_message_bytes(2));
  size_t bytes = sender.send(x.data(), keys, 2, {}, msg.data());
  receiver.receive(msg.data(), bytes, keys, 2, out.data());
  const std::vector<uint8_t> s_ckpt = sender.save(), r_ckpt = receiver.save();
  // Both ends restore the same checkpoint: they continue bit-equal.
  bytes = sender.send(x.data(), keys, 2, {}, msg.data());
  receiver.receive(msg.data(), bytes, keys, 2, out.data());
  DeltaStore s2(config("aq2:channels=4", row)), r2(config("aq2:channels=4", row));
  s2.load(s_ckpt.data(), s_ckpt.size());
  r2.load(r_ckpt.data(), r_ckpt.size());
  bytes = s2.send(x.data(), keys, 2, {}, msg.data());
  r2.receive(msg.data(), bytes, keys, 2, out.data());
  require_equal(s2, r2, {1, 2});
  // A receiver restored from an empty store's checkpoint at the same sequence does not hold the keys:
  // a delta for them is refused as out of sequence.
  DeltaStore empty(config("aq2:channels=4", row));
  std::vector<uint8_t> e = empty.save();
  std::memcpy(e.data() + 16, &s_ckpt[16], 8);  // the sequence number the sender is at
  reseal(e);
  DeltaStore r3(config("aq2:channels=4", row));
  r3.load(e.data(), e.size());
  CHECK(kind_of([&] { r3.receive(msg.data(), bytes, keys, 2, out.data()); }) == Kind::kSequence);
  // Corrupt and foreign checkpoints.
  DeltaStore other(config("aq3:channels=4", row));
  CHECK(kind_of([&] { other.load(s_ckpt.data(), s_ckpt.size()); }) == Kind::kMismatch);
  CHECK(kind_of([&] { r2.load(s_ckpt.data(), s_ckpt.size() - 3); }) == Kind::kCorrupt);
  CHECK(kind_of([] { DeltaStore bad(config("q4", 8)); }) == Kind::kArgument);
  // One flipped bit in a row: the two ends' stores would part silently; the checksum refuses it.
  std::vector<uint8_t> flipped = s_ckpt;
  flipped[flipped.size() - 8 - 5] ^= 0x10;
  CHECK(kind_of([&] { r2.load(flipped.data(), flipped.size()); }) == Kind::kCorrupt);
  require_equal(s2, r2, {1, 2});  // unchanged
  // A checkpoint of format 1 (no checksum) still loads.
  std::vector<uint8_t> old(s_ckpt.begin(), s_ckpt.end() - 8);
  const uint16_t one = 1;
  std::memcpy(old.data() + 4, &one, 2);
  DeltaStore r4(config("aq2:channels=4", row));
  r4.load(old.data(), old.size());
  DeltaStore s4(config("aq2:channels=4", row));
  s4.load(s_ckpt.data(), s_ckpt.size());
  require_equal(s4, r4, {1, 2});
  // Keys past the store's budget would leave every later call refused: the load is refused instead.
  DeltaStore small(config("aq2:channels=4", row, s2.bytes() / 2));  // room for one of the two keys
  CHECK(kind_of([&] { small.load(s_ckpt.data(), s_ckpt.size()); }) == Kind::kBudget);
}

// A file path in the test's temporary directory, unique per process.
std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/qccl_aqsgd_" + std::to_string(getpid()) + "_" + name;
}

off_t file_size(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

TEST_CASE("delta store: a message that evicts a key twice is refused before the store changes", "[aqsgd]") {
  const size_t row = 16;
  const auto c = config("aq4:channels=4", row, 2 * row * 2, DeltaStore::Evict::kLeastRecent);
  DeltaStore sender(c), receiver(c);
  std::mt19937_64 rng(3);
  std::vector<float> x = rows_of(2, row, rng), out(x.size());
  const uint64_t first[] = {1, 2}, second[] = {3, 4};
  std::vector<uint8_t> msg(sender.max_message_bytes(2));
  size_t bytes = sender.send(x.data(), first, 2, {}, msg.data());
  receiver.receive(msg.data(), bytes, first, 2, out.data());
  bytes = sender.send(x.data(), second, 2, {}, msg.data());  // evicts keys 1 and 2
  std::memcpy(msg.data() + 64 + 8, msg.data() + 64, 8);       // ... now key 1 twice
  const std::vector<uint8_t> before = receiver.save();
  CHECK(kind_of([&] { receiver.receive(msg.data(), bytes, second, 2, out.data()); }) == Kind::kCorrupt);
  CHECK(receiver.save() == before);
}

TEST_CASE("row arena: slots reused after release, blocks never move, allocation only after reserve", "[aqsgd]") {
  for (const std::string& file : {std::string(), temp_path("arena")}) {
    INFO((file.empty() ? "memory" : file));
    const size_t row = 3 << 20;  // 3 MiB: five rows to a file's 16 MiB block, one to a memory block
    RowArena arena(row, file);
    CHECK(file_size(file) == -1);  // a file's name is gone at once: nothing outlives the arena
    CHECK_THROWS_AS(arena.allocate(), std::logic_error);
    arena.reserve(12);
    CHECK(arena.file_bytes() >= (file.empty() ? 0 : 12 * row));
    std::vector<uint32_t> slots;
    for (int i = 0; i < 12; ++i) {
      slots.push_back(arena.allocate());
      std::memset(arena.row(slots.back()), i + 1, row);
    }
    const uint8_t* first = arena.row(slots[0]);
    arena.release(slots[3]);
    CHECK(arena.live() == 11);
    CHECK(arena.allocate() == slots[3]);  // reused, without growing
    arena.reserve(20);                    // more blocks: earlier rows stay where they were
    CHECK(arena.row(slots[0]) == first);
    for (int i = 0; i < 12; ++i) {
      INFO("row " << i);
      CHECK(arena.row(slots[i])[0] == i + 1);
      CHECK(arena.row(slots[i])[row - 1] == i + 1);
      arena.will_need(slots[i]);
    }
    arena.clear();
    CHECK(arena.live() == 0);
  }
  // Two arenas given one path each have a file of their own.
  RowArena a(64, temp_path("shared")), b(64, temp_path("shared"));
  a.reserve(1), b.reserve(1);
  const uint32_t sa = a.allocate(), sb = b.allocate();
  std::memset(a.row(sa), 1, 64), std::memset(b.row(sb), 2, 64);
  CHECK((a.row(sa)[63] == 1 && b.row(sb)[63] == 2));
  // An existing path is never truncated, replaced or removed: a file, a device, a directory.
  const std::string kept = temp_path("kept");
  {
    FILE* f = std::fopen(kept.c_str(), "w");
    REQUIRE(f);
    std::fputs("a user's data", f);
    std::fclose(f);
  }
  CHECK_THROWS_WITH(RowArena(8, kept), Catch::Contains(kept) && Catch::Contains("exists"));
  CHECK(file_size(kept) == 13);
  std::remove(kept.c_str());
  CHECK_THROWS_AS(RowArena(8, "/dev/null"), RowArenaError);
  CHECK_THROWS_AS(RowArena(8, "/tmp"), RowArenaError);
  CHECK_THROWS_WITH(RowArena(8, "/nonexistent-dir/rows"), Catch::Contains("/nonexistent-dir/rows"));
}

TEST_CASE("delta store: the file tier is the memory tier, bit for bit, at either end", "[aqsgd]") {
  const size_t row = 48, budget_keys = 6;
  const auto c = config("aq4:channels=8,round=stochastic,seed=9", row, budget_keys * row * 2,
                        DeltaStore::Evict::kLeastRecent);
  DeltaStore mem_sender(c), mem_receiver(c), file_sender(c), file_receiver(c);
  file_sender.set_file(temp_path("sender"));
  file_receiver.set_file(temp_path("receiver"));
  CHECK(file_sender.config().file == temp_path("sender"));
  std::mt19937_64 rng(77);
  std::vector<uint64_t> universe(15);
  for (size_t k = 0; k < universe.size(); ++k) universe[k] = 5 + 3 * k;
  for (int call = 0; call < 2000; ++call) {
    const size_t nkeys = 1 + rng() % 3;
    std::vector<uint64_t> keys;
    while (keys.size() < nkeys) {
      const uint64_t k = universe[rng() % universe.size()];
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
    const std::vector<float> x = rows_of(nkeys, row, rng);
    std::vector<float> out_mem(x.size()), out_file(x.size());
    std::vector<uint8_t> msg_mem(mem_sender.max_message_bytes(nkeys)), msg_file(file_sender.max_message_bytes(nkeys));
    const kernels::PhiloxKey key{9, uint64_t(call), 0, 0};
    const size_t a = mem_sender.send(x.data(), keys.data(), nkeys, key, msg_mem.data());
    const size_t b = file_sender.send(x.data(), keys.data(), nkeys, key, msg_file.data());
    INFO("call " << call);
    REQUIRE(a == b);
    REQUIRE(std::memcmp(msg_mem.data(), msg_file.data(), a) == 0);  // the same messages
    // Crossed: the file receiver takes the memory sender's messages, and the other way round.
    file_receiver.receive(msg_mem.data(), a, keys.data(), nkeys, out_file.data());
    mem_receiver.receive(msg_file.data(), b, keys.data(), nkeys, out_mem.data());
    REQUIRE(std::memcmp(out_mem.data(), out_file.data(), x.size() * sizeof(float)) == 0);
    require_equal(mem_sender, file_sender, universe);
    require_equal(file_sender, file_receiver, universe);
    require_equal(mem_receiver, file_receiver, universe);
  }
  // Checkpoints move between the tiers.
  const std::vector<uint8_t> ckpt = file_sender.save();
  CHECK(ckpt == mem_sender.save());
  DeltaStore restored(c);
  restored.set_file(temp_path("restored"));
  restored.load(ckpt.data(), ckpt.size());
  require_equal(restored, mem_sender, universe);
  // The tier changes only while the store is empty; its file has no name to leave behind.
  CHECK(kind_of([&] { file_sender.set_file(""); }) == Kind::kArgument);
  CHECK(file_size(temp_path("sender")) == -1);
  // Low-bit m in a file, and a change of m's width there (a new file, the same path).
  DeltaStore low(c);
  low.set_file(temp_path("low"));
  low.set_store_bits(4);
  low.set_store_bits(8);
  CHECK(low.config().file == temp_path("low"));
  std::vector<float> x = rows_of(1, row, rng), out(row);
  std::vector<uint8_t> msg(low.max_message_bytes(1));
  const uint64_t one = 1;
  low.send(x.data(), &one, 1, {}, msg.data());
  CHECK(low.bytes() == kernels::parse_codec_spec("aq8:channels=8").encoded_bytes(row));
}

TEST_CASE("delta store: a file that cannot be made or grow fails the call, and nothing changes", "[aqsgd]") {
  const size_t row = 1 << 20;  // 2 MiB rows in float16: eight to a block
  const auto c = config("aq4:channels=16", row);
  DeltaStore store(c);
  CHECK(kind_of([&] { store.set_file("/nonexistent-dir/rows"); }) == Kind::kSystem);
  CHECK(store.config().file.empty());  // still in memory
  // A file limited to 20 MiB (RLIMIT_FSIZE; SIGXFSZ ignored, so that growth fails with EFBIG): two
  // 16 MiB blocks do not fit.
  store.set_file(temp_path("limited"));
  struct rlimit saved;
  REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0);
  struct rlimit limited = saved;
  limited.rlim_cur = 20 << 20;
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  REQUIRE(setrlimit(RLIMIT_FSIZE, &limited) == 0);
  std::mt19937_64 rng(5);
  std::vector<uint8_t> msg;
  std::vector<uint64_t> keys;
  Kind failure = Kind::kArgument;
  try {
    for (uint64_t k = 0; k < 16; ++k) {
      keys = {k};
      const std::vector<float> x = rows_of(1, row, rng);
      msg.resize(store.max_message_bytes(1));
      store.send(x.data(), keys.data(), 1, {}, msg.data());
    }
  } catch (const DeltaStoreError& e) {
    failure = e.kind();
    CHECK_THAT(e.what(), Catch::Contains(temp_path("limited")) && Catch::Contains("nothing sent"));
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  CHECK(failure == Kind::kSystem);
  CHECK(store.keys() == 8);  // the first block's rows, the failed call's key not among them
  CHECK(store.sequence() == 8);
  CHECK_FALSE(store.holds(keys[0]));
  // and the store goes on: a delta for a key it holds needs no room
  const std::vector<uint64_t> held = {3};
  const std::vector<float> x = rows_of(1, row, rng);
  CHECK(store.send(x.data(), held.data(), 1, {}, msg.data()) < row);
}

TEST_CASE("delta store: low-bit m stays bit-equal, within the delta's bound, in bits/16 of the bytes", "[aqsgd]") {
  const size_t channels = 8, row = 4 * channels;  // a key's row: 4 tokens of 8 channels
  for (int bits : {2, 4, 8}) {
    INFO(bits << "-bit m");
    auto c = config("aq4:channels=8", row, 0, DeltaStore::Evict::kNone);
    c.store_bits = bits;
    DeltaStore sender(c), receiver(c);
    // m's codec: aq<bits> over the key's row, one fp16 scale per channel
    const kernels::CodecConfig m_codec = kernels::parse_codec_spec("aq" + std::to_string(bits) + ":channels=8");
    std::mt19937_64 rng(31 + bits);
    std::vector<uint64_t> universe(10);
    for (size_t k = 0; k < universe.size(); ++k) universe[k] = 900 + k;
    std::vector<std::vector<float>> truth(universe.size());
    for (auto& t : truth) t = rows_of(1, row, rng);
    double worst_share = 0;
    for (int call = 0; call < 1500; ++call) {
      const size_t nkeys = 1 + rng() % 3;
      std::vector<size_t> pick;
      while (pick.size() < nkeys) {
        const size_t i = rng() % universe.size();
        if (std::find(pick.begin(), pick.end(), i) == pick.end()) pick.push_back(i);
      }
      std::vector<uint64_t> keys;
      std::vector<float> x(nkeys * row), out(x.size());
      std::vector<float> m_prev(x.size(), NAN);
      for (size_t r = 0; r < nkeys; ++r) {
        keys.push_back(universe[pick[r]]);
        for (float& v : truth[pick[r]]) v += 0.05f * std::normal_distribution<float>(0.0f, 1.0f)(rng);
        std::copy(truth[pick[r]].begin(), truth[pick[r]].end(), x.begin() + static_cast<long>(r * row));
        if (receiver.holds(keys[r])) kernels::decode(m_codec, receiver.row(keys[r]), row, m_prev.data() + r * row);
      }
      std::vector<uint8_t> msg(sender.max_message_bytes(nkeys));
      const size_t bytes = sender.send(x.data(), keys.data(), nkeys, {}, msg.data());
      receiver.receive(msg.data(), bytes, keys.data(), nkeys, out.data());
      INFO("call " << call);
      require_equal(sender, receiver, universe);
      REQUIRE(sender.bytes() == sender.keys() * m_codec.encoded_bytes(row));  // codes and scales only
      // A delta row is m_prev + decode(Q(x - m_prev)): within the 4-bit delta's bound (include/qccl.h,
      // qcclSendCompressed), per channel s / 2^(4-1) (the top level's clip) + 2^-11 s (the scale's
      // float16 rounding), s = max |x - m_prev| over the call's delta rows; a full row is x as float16.
      std::vector<float> s(channels, 0.0f);
      for (size_t i = 0; i < x.size(); ++i)
        if (!std::isnan(m_prev[i])) s[i % channels] = std::max(s[i % channels], std::fabs(x[i] - m_prev[i]));
      for (size_t i = 0; i < x.size(); ++i) {
        if (std::isnan(m_prev[i])) {
          REQUIRE(out[i] == kernels::half_to_float(kernels::float_to_half(x[i])));
          continue;
        }
        const float scale = s[i % channels];
        REQUIRE(std::fabs(out[i] - x[i]) <= scale / 8 + 0x1p-11f * scale + 1e-6f);
        if (scale > 0) worst_share = std::max(worst_share, double{std::fabs(out[i] - x[i])} / scale);
      }
    }
    CHECK(worst_share > 1.0 / 32);  // the bound is not vacuous
    // Checkpoints keep the codes; a store with other bits is another configuration.
    const std::vector<uint8_t> ckpt = sender.save();
    DeltaStore restored(c);
    restored.load(ckpt.data(), ckpt.size());
    require_equal(restored, receiver, universe);
    auto other = c;
    other.store_bits = bits == 8 ? 4 : 8;
    DeltaStore foreign(other);
    CHECK(kind_of([&] { foreign.load(ckpt.data(), ckpt.size()); }) == Kind::kMismatch);
    std::vector<float> x = rows_of(1, row, rng), out(row);
    const std::vector<uint64_t> one = {universe[0]};
    std::vector<uint8_t> msg(sender.max_message_bytes(1));
    const size_t bytes = sender.send(x.data(), one.data(), 1, {}, msg.data());
    CHECK(kind_of([&] { foreign.receive(msg.data(), bytes, one.data(), 1, out.data()); }) == Kind::kMismatch);
    CHECK(kind_of([&] { sender.set_store_bits(0); }) == Kind::kArgument);  // it holds keys
  }
  DeltaStore plain(config("aq4:channels=8", row));
  CHECK(kind_of([&] { plain.set_store_bits(1); }) == Kind::kArgument);
  CHECK(kind_of([&] { plain.set_store_bits(9); }) == Kind::kArgument);
  plain.set_store_bits(8);
  CHECK(plain.config().store_bits == 8);
}

TEST_CASE("delta store: a new m beyond its type's range is refused, and the key's deltas go on", "[aqsgd]") {
  using kernels::DataType;
  const size_t channels = 8, row = 8 * channels;
  const uint64_t key = 3;
  struct Case {
    const char* what;
    DataType full;
    int store_bits;
  };
  for (const Case& k : {Case{"half rows, half m", DataType::kFloat16, 0}, Case{"half rows, 4-bit m", DataType::kFloat16, 4},
                        Case{"float rows, half m", DataType::kFloat32, 0}}) {
    INFO(k.what);
    auto c = config("aq8:channels=8", row);
    c.full_type = k.full;
    c.store_bits = k.store_bits;
    DeltaStore sender(c), receiver(c);
    const kernels::CodecConfig m_codec = kernels::parse_codec_spec("aq4:channels=8");
    std::mt19937_64 rng(5);
    std::vector<float> x(row), out(row), m_prev(row);
    std::vector<uint8_t> msg(sender.max_message_bytes(1));
    auto around = [&](float v) {
      for (float& e : x) e = v + std::uniform_real_distribution<float>(-100.0f, 100.0f)(rng);
    };
    auto pass = [&] {
      const bool delta = receiver.holds(key);
      if (delta && k.store_bits) kernels::decode(m_codec, receiver.row(key), row, m_prev.data());
      else if (delta) kernels::load_float(DataType::kFloat16, receiver.row(key), m_prev.data(), row);
      const size_t bytes = sender.send(x.data(), &key, 1, {}, msg.data());
      receiver.receive(msg.data(), bytes, &key, 1, out.data());
      require_equal(sender, receiver, {key});
      if (!delta) return;
      // aq8's bound per channel (qcclSendCompressed): s / 2^7 + 2^-11 s, s = max |x - m_prev| there
      std::vector<float> s(channels, 0.0f);
      for (size_t i = 0; i < row; ++i) s[i % channels] = std::max(s[i % channels], std::fabs(x[i] - m_prev[i]));
      for (size_t i = 0; i < row; ++i)
        REQUIRE(std::fabs(out[i] - x[i]) <= s[i % channels] / 128 + 0x1p-11f * s[i % channels] + 1e-3f);
    };
    // First sight at 70,000: half rows refuse it on the wire; float rows would make m Inf in half.
    around(70000.0f);
    CHECK(kind_of([&] { sender.send(x.data(), &key, 1, {}, msg.data()); }) == Kind::kNonFinite);
    CHECK(sender.keys() == 0);
    around(60000.0f);
    pass();
    // A delta of 10,000 fits (its scale is within float16's range), but m + delta does not: m would
    // be Inf (with 4-bit m, its fp16 scale NaN) at both ends, and every later delta refused.
    const std::vector<uint8_t> before = sender.save();
    around(70000.0f);
    CHECK(kind_of([&] { sender.send(x.data(), &key, 1, {}, msg.data()); }) == Kind::kNonFinite);
    CHECK(sender.save() == before);
    // The key goes on from the m that fits, in both directions, to the delta's bound.
    around(50000.0f);
    pass();
    around(64000.0f);
    pass();
  }
  // A receiver refuses a message that would make its m Inf (a sender never sends one): a float row's
  // value changed to 70,000 on the wire.
  auto c = config("aq8:channels=8", row);
  c.full_type = DataType::kFloat32;
  DeltaStore sender(c), receiver(c);
  std::vector<float> x(row, 1.25f), out(row);
  std::vector<uint8_t> msg(sender.max_message_bytes(1));
  const size_t bytes = sender.send(x.data(), &key, 1, {}, msg.data());
  const float value = 1.25f, big = 70000.0f;
  auto at = std::search(msg.begin(), msg.begin() + static_cast<long>(bytes), reinterpret_cast<const uint8_t*>(&value),
                        reinterpret_cast<const uint8_t*>(&value) + 4);
  REQUIRE(at != msg.begin() + static_cast<long>(bytes));
  std::memcpy(&*at, &big, 4);
  CHECK(kind_of([&] { receiver.receive(msg.data(), bytes, &key, 1, out.data()); }) == Kind::kCorrupt);
  CHECK(receiver.keys() == 0);
  CHECK(receiver.sequence() == 0);
}

TEST_CASE("delta store: a checkpoint's m that is not finite sends its key whole, at both ends", "[aqsgd]") {
  const size_t row = 64;
  const uint64_t keys[] = {3, 4};
  for (const int bits : {0, 4}) {
    INFO((bits ? "4-bit m" : "half m"));
    auto c = config("aq8:channels=8", row);
    c.store_bits = bits;
    DeltaStore sender(c), receiver(c);
    std::vector<float> x(2 * row, 0.75f), out(2 * row);
    std::vector<uint8_t> msg(sender.max_message_bytes(2));
    size_t bytes = sender.send(x.data(), keys, 2, {}, msg.data());
    receiver.receive(msg.data(), bytes, keys, 2, out.data());
    // Key 4's m made Inf (a half m) or its first scale NaN (low-bit m), as a checkpoint written
    // before such an m was refused could hold it: the checkpoint's layout is magic, version,
    // reserved, configuration hash, sequence, count, then (key, m) in LRU order (key 4 last).
    std::vector<uint8_t> ckpt = sender.save();
    const size_t row_bytes = sender.bytes() / sender.keys();
    const size_t key4_m = 4 + 2 + 2 + 8 + 8 + 8 + (8 + row_bytes) + 8;
    uint64_t key_there;
    std::memcpy(&key_there, ckpt.data() + key4_m - 8, 8);
    REQUIRE(key_there == 4);
    const uint16_t bad = bits ? 0x7E00 : 0x7C00;  // NaN scale / Inf
    std::memcpy(ckpt.data() + key4_m, &bad, 2);
    reseal(ckpt);
    sender.load(ckpt.data(), ckpt.size());
    receiver.load(ckpt.data(), ckpt.size());
    // The next call sends key 4 whole and key 3 as a delta; both stores finite and equal again.
    x[row + 1] = 0.5f;
    bytes = sender.send(x.data(), keys, 2, {}, msg.data());
    CHECK(sender.last_full_rows() == 1);
    receiver.receive(msg.data(), bytes, keys, 2, out.data());
    require_equal(sender, receiver, {3, 4});
    for (size_t i = row; i < 2 * row; ++i) REQUIRE(out[i] == x[i]);  // 0.75 and 0.5 are exact in half
    // Then deltas for both.
    bytes = sender.send(x.data(), keys, 2, {}, msg.data());
    CHECK(sender.last_full_rows() == 0);
    receiver.receive(msg.data(), bytes, keys, 2, out.data());
    require_equal(sender, receiver, {3, 4});
  }
}

}  // namespace
}  // namespace qccl::coll
