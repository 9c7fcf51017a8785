// AQ-SGD's keyed message store (Wang et al., NeurIPS 2022, Algorithm 1; shared/specs/aqsgd.md §1.5,
// §6-7): one end of one direction of a pipeline link keeps, per sample key, the last message m of
// that sample. The sender turns a call's rows (one per key) into one message: rows whose key it does
// not hold (first sight, an eviction, warm-up) go full, the others as AQ-SGD deltas Q(x - m) under
// the store's aq codec (kernels/aq_delta.h: the scales per channel over the call's delta rows, as
// the reference scales a micro-batch); the receiver applies the message to its own store. The two
// stores stay bit-equal because the sender alone decides (full or delta, which keys to evict) and
// writes every decision into the message, and both ends apply the same arithmetic to the same bytes.
//
// The message, little-endian:
//   header (64 bytes): u32 magic 'AQSD' | u16 version | u16 flags (bit 0: warm-up; bit 1: the sender
//     refused the call, nothing follows) | u32 store id |
//     u32 number of keys | u64 sequence number (per store, from 0) | u64 row values | u64 hash of the
//     keys in call order | u64 hash of the configuration (codec, store and full types, row values) |
//     u32 evicted keys | u32 rows sent full | u64 payload bytes after the header
//   evicted keys (u64 each: the receiver forgets them first) | a bitmap of the rows sent full (bit r %
//   8 of byte r / 8)            -- the head, then kSections sections: with k = sections(n) of
//   them in use, section s < k holds the call's rows [s n / k, (s + 1) n / k), the others none:
//   section header (16 bytes): u32 magic 'AQSS' | u16 section | u16 flags (bit 1: the sender refused
//     the call here; what follows is the caller's) | u64 bytes after the section header
//   the section's full rows in the full type | its delta rows' aq payload (their rows back to back,
//     in call order, as one run with its own scales; stochastic rounding keyed as if the call's
//     delta rows were one run)
// Sections let a transport send and apply a message piece by piece, the wire carrying section s
// while the sender encodes s + 1 and the receiver applies s - 1 (collectives/sendrecv_delta.cc);
// the receiver needs the head first, the sections in any order. Scales per section are the
// reference's per-channel scales over a smaller batch of rows: never coarser, but more bytes, so a
// call uses as many sections (up to kSections, at most one per key) as keep its scales' extra bytes
// under 1/32 of its delta's (both ends derive the number from the key count and the configuration).
// Every check a receiver makes (magic, version, store id, configuration, sequence, keys, shape, a
// delta for a key it does not hold, the lengths) comes before it changes anything: a bad message
// throws DeltaStoreError naming what differs, and the store is as it was.
//
// Budget: the store's rows may take at most budget bytes (0: no bound). A call that needs more,
// with Evict::kNone, throws kBudget before anything changes; with Evict::kLeastRecent the sender
// evicts the keys it used least recently (never the call's own) and the receiver mirrors it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "collectives/row_arena.h"
#include "kernels/aq_delta.h"
#include "kernels/codec.h"
#include "kernels/types.h"

namespace qccl::coll {

// v's first n values, v grown when it is shorter: a store's and a delta call's buffers are reused
// from call to call (megabytes whose fresh pages every call would pay for).
template <class T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Why a call on a store fails; the store is unchanged.
class DeltaStoreError : public std::runtime_error {
 public:
  // Values are on the wire (a receiver's answer, collectives/sendrecv_delta.cc): new kinds at the end.
  enum class Kind {
    kArgument,   // a bad call: duplicate keys, a null buffer, nothing to send
    kBudget,     // the rows would exceed the budget (Evict::kNone, or the call's own keys alone)
    kNonFinite,  // a delta held NaN or Inf (or a channel beyond float16's range), or a key's new m
                 // would not fit the store's type: nothing was sent
    kMismatch,   // the message does not belong to this store or call (id, configuration, keys, shape)
    kSequence,   // a message was lost or repeated, or a delta names a key this store does not hold
    kCorrupt,    // not a message, or its lengths do not add up
    kSystem,     // the rows' file cannot be made or grown (a full disk): nothing changed
  };
  DeltaStoreError(Kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

class DeltaStore {
 public:
  enum class Evict { kNone, kLeastRecent };
  struct Config {
    kernels::CodecConfig codec;  // an aq codec
    size_t row_values = 0;       // values per key (S x H)
    kernels::DataType store_type = kernels::DataType::kFloat16;  // m's type (float16: the reference's)
    kernels::DataType full_type = kernels::DataType::kFloat16;   // full rows on the wire
    size_t budget_bytes = 0;     // 0: unbounded
    Evict evict = Evict::kNone;
    uint32_t id = 0;             // the link's store id, the same at both ends
    std::string file;            // "": the rows in memory; else in this file, mapped (set_file)
    int store_bits = 0;          // 0: m in store_type; 2..8: m as low-bit codes (set_store_bits)
  };
  // Throws DeltaStoreError(kArgument) for a codec that is not aq, zero row values, a store or full
  // type other than float32, float16 or bfloat16; kSystem for a file that cannot be created.
  explicit DeltaStore(const Config& config);
  // The file tier (row_arena.h): the rows in a new file made at path `file` and unlinked at once,
  // mapped into memory, for a store larger than memory; "" back to memory. Only while the store holds
  // no key (kArgument otherwise; kSystem for a file that cannot be created; unchanged either way).
  void set_file(const std::string& file);
  // Low-bit m (the paper's App. H.5, the reference's delta-lowbits mode): each key's m kept as
  // `bits`-bit codes with an fp16 scale per channel (the store's aq codec's channels) over the key's
  // row, rounded to nearest: aq<bits>:channels=H of the row, what both ends re-quantize after every
  // message (m = Q_m(m + decode(delta)), or Q_m(the full row as sent)), deterministically, so the two
  // stores stay bit-equal; the row takes about bits/16 of float16's bytes. 0: store_type. Part of the
  // configuration both ends must share. Only while the store holds no key (kArgument otherwise, and
  // for bits other than 0 and 2..8).
  void set_store_bits(int bits);

  const Config& config() const { return config_; }
  size_t keys() const { return rows_.size(); }
  size_t bytes() const { return rows_.size() * row_bytes(); }
  bool holds(uint64_t key) const { return rows_.count(key) != 0; }
  uint64_t sequence() const { return sequence_; }
  // The last message this store sent (committed) or received: its bytes and rows sent full.
  size_t last_message_bytes() const { return last_bytes_; }
  size_t last_full_rows() const { return last_full_; }
  // The rows of keys a later call will use (one made now, queued behind others on the store): the
  // file tier starts reading them from the disk (RowArena::will_need); nothing else changes.
  void prefetch(const uint64_t* keys, size_t nkeys) const {
    for (size_t r = 0; r < nkeys; ++r)
      if (auto it = rows_.find(keys[r]); it != rows_.end()) arena_->will_need(it->second.slot);
  }
  // Warm-up: every row is sent full (the sender's setting; the message tells the receiver).
  void set_warmup(bool on) { warmup_ = on; }

  static constexpr size_t kSections = 4;
  // A message's fixed header, and a section's.
  static size_t header_bytes();
  static size_t section_header_bytes();
  // A header (or a section header for section s) that says the sender refused the call (flags bit 1:
  // the rest is the caller's), so that a transport can tell the receiver instead of leaving it waiting.
  static void write_refusal(uint8_t* header);
  static bool is_refusal(const uint8_t* header);
  static void write_section_refusal(size_t s, uint8_t* section);
  static bool is_section_refusal(const uint8_t* section, size_t bytes);
  // Bytes enough for a message of nkeys rows (every key the store holds evicted, and room for the
  // rows both full and as deltas); for its head; for any one of its sections.
  size_t max_message_bytes(size_t nkeys) const;
  size_t max_head_bytes(size_t nkeys) const;
  size_t max_section_bytes(size_t nkeys) const;

  // Sender: the message for nkeys rows of x (float32, row r for keys[r]) into out (max_message_bytes
  // capacity); returns its length. `key` keys stochastic rounding. Throws DeltaStoreError (the store
  // unchanged) for duplicate keys, the budget, a non-finite delta or row, or a key's new m that would
  // not be finite in the store (kNonFinite). send() is prepare() then
  // commit(): a sender that must hear the receiver accept the message first calls them apart (a
  // prepared message changes nothing until commit(); another prepare() or abandon() drops it).
  size_t send(const float* x, const uint64_t* keys, size_t nkeys, const kernels::PhiloxKey& key, uint8_t* out);
  size_t prepare(const float* x, const uint64_t* keys, size_t nkeys, const kernels::PhiloxKey& key, uint8_t* out);
  void commit();
  void abandon() { pending_ = Pending{}; }
  // Receiver: applies a message for the same keys, writing the rows (float32: full rows as sent,
  // delta rows as m + the decoded delta) to x_out. Throws DeltaStoreError, the store unchanged, and
  // x_out too (but for a delta that decodes to NaN, or a new m that is not finite, which no sender
  // sends: that section's rows and those before it may be written).
  void receive(const uint8_t* message, size_t bytes, const uint64_t* keys, size_t nkeys, float* x_out);

  // The message section by section (prepare() and receive() are these in order), for a transport
  // that overlaps the codec's work with the wire.
  // Sender: checks the call, decides what goes full and what to evict, and writes the head to out
  // (max_head_bytes) and returns its length; x must stay valid until the last section is written.
  // Then send_section(s, out) for every s, in any order, writes section_bytes(s) bytes; a section
  // may throw kNonFinite (the call is then dead: abandon()). commit() once all were written.
  size_t begin_send(const float* x, const uint64_t* keys, size_t nkeys, const kernels::PhiloxKey& key, uint8_t* out);
  void send_section(size_t s, uint8_t* out);
  // Receiver: checks the head (everything but the sections' bytes) and makes room; then every
  // section, in any order, is checked and applied (the rows of x_out it holds written, the new m
  // kept aside); commit() then changes the store. Any throw leaves the store unchanged (abandon()).
  void receive_head(const uint8_t* head, size_t bytes, const uint64_t* keys, size_t nkeys);
  void receive_section(size_t s, const uint8_t* section, size_t bytes, float* x_out);
  // The sections a call of nkeys keys uses (the others are empty): as many as keep their scales'
  // extra bytes under 1/32 of the call's delta, at most one per key and kSections.
  size_t sections(size_t nkeys) const;
  // Section s's length in the message begun or being received.
  size_t section_bytes(size_t s) const { return pending_.section_bytes[s]; }

  // m of one key, in the store type (for tests and checkpoints); nullptr when not held.
  const uint8_t* row(uint64_t key) const;

  // A checkpoint: the configuration's hash, the sequence number, and every key's row in LRU order.
  std::vector<uint8_t> save() const;
  void save(uint8_t* out) const;  // into checkpoint_bytes() bytes, without a copy of the store
  size_t checkpoint_bytes() const;  // save().size(), without making it
  // Restores a checkpoint of a store of the same configuration; throws DeltaStoreError (unchanged).
  void load(const uint8_t* data, size_t bytes);

 private:
  struct Entry {
    uint32_t slot = 0;                  // its row in arena_
    std::list<uint64_t>::iterator lru;  // position in lru_ (front: least recently used)
    // Its m is not finite (a checkpoint written before such an m was refused): the sender's next call
    // sends the key whole, which the receiver, holding the same m, follows (the message's bitmap).
    bool whole = false;
  };
  uint8_t* m(uint64_t key) { return arena_->row(rows_.at(key).slot); }
  static std::unique_ptr<RowArena> make_arena(size_t row_bytes, const std::string& file);  // kSystem
  // Room for `fresh` more rows (kSystem when the file cannot grow) and for `keys` new keys in the key
  // table and the LRU list (their nodes made now), and with low-bit m this thread's codec scratch,
  // before anything changes: place() and store_m() then allocate nothing, so that a commit cannot
  // stop half way for want of memory and leave the two ends apart.
  void reserve(size_t fresh, size_t keys);
  // A key's entry, its row taken if it is new (after reserve()), most recently used last.
  Entry& place(uint64_t key);
  void forget(uint64_t key);
  size_t row_bytes() const { return row_bytes_for(config_.store_bits, m_codec_); }
  // A key's row: store_type values, or with low-bit m (bits > 0) m_codec's encoding of them.
  size_t row_bytes_for(int bits, const kernels::CodecConfig& m_codec) const {
    return bits ? m_codec.encoded_bytes(config_.row_values)
                : config_.row_values * kernels::element_size(config_.store_type);
  }
  // A key's m as float32 from its stored form, and back (rounded to store_type, or re-quantized).
  // store_m returns how many stored values are not finite (beyond float16's range, or an fp16 scale
  // of low-bit m beyond it, counted per channel): such an m would refuse every later delta.
  void load_m(const uint8_t* stored, float* m) const;
  size_t store_m(const float* m, uint8_t* stored) const;
  // A call's delta rows as the fused kernels take them (kernels/aq_delta.h): each key's m where the
  // store keeps it, its new m into `pending` (row r of the call at r * row_bytes(); null: in place);
  // with low-bit m, m decoded into work_m_ (d * row_values for delta row d) and updated there, in
  // float32, for the caller to re-quantize (store_m).
  kernels::AqDeltaRows delta_view(const uint64_t* keys, const std::vector<size_t>& delta_rows, uint8_t* pending);
  // After the fused kernel wrote a section's delta rows' new m: with low-bit m, re-quantizes it from
  // work_m_ into pending_m_. Returns store_m's count over those rows' new m.
  size_t finish_delta_m(const std::vector<size_t>& delta_rows);
  uint64_t config_hash() const;
  // Keys to evict so that the call's new keys fit, least recently used first (throws kBudget).
  std::vector<uint64_t> evictions(const uint64_t* keys, size_t nkeys) const;
  void touch(uint64_t key);

  // The message a call sends or receives, and what it changes at commit().
  // (Every key's new m, in call order, is in pending_m_.)
  struct Pending {
    bool ready = false;  // a head was written or checked: sections may follow
    std::vector<uint64_t> keys, evicted;
    std::vector<uint8_t> full_row;  // per row of the call: sent full
    size_t bytes = 0, full = 0;     // the message's size and rows sent full
    size_t section_bytes[kSections] = {};
    size_t delta_before[kSections] = {};  // delta values in the sections before (stochastic rounding)
    unsigned sections_done = 0;           // bit s: section s written or applied
    const float* x = nullptr;             // the sender's rows
    kernels::PhiloxKey key;
  };
  // The rows of the call in section s, [first, last).
  void section_rows(size_t s, size_t nkeys, size_t* first, size_t* last) const {
    const size_t k = sections(nkeys);
    *first = s < k ? s * nkeys / k : nkeys, *last = s < k ? (s + 1) * nkeys / k : nkeys;
  }
  // Section s's rows [first, last) of the pending call: its delta rows into section_delta_rows_;
  // returns how many rows it sends full.
  size_t split_section(size_t s, size_t* first, size_t* last);
  // Sets pending_'s layout from its full_row: the sections' lengths, and the message's.
  void lay_out(size_t head_bytes);
  // Section s's header, checked against the call (kCorrupt).
  void check_section(size_t s, const uint8_t* section, size_t bytes) const;
  void apply_section(size_t s, const uint8_t* section, float* x_out);

  Config config_;
  Pending pending_;
  // Buffers a call reuses, grown to the largest call: a call's delta rows in float32 (m and x), and
  // prepare()'s new m per key, row_bytes() apart (a message is megabytes: fresh buffers every call
  // cost their page faults, more than the arithmetic).
  std::vector<float> work_m_;
  std::vector<uint8_t> pending_m_;
  std::vector<const void*> row_m_;  // delta_view's pointers
  std::vector<void*> row_m_out_;
  std::vector<const float*> row_x_;
  std::vector<float*> row_x_out_;
  std::vector<size_t> section_delta_rows_;
  std::vector<float> as_sent_;  // a full row as the receiver reads it
  bool warmup_ = false;
  uint64_t sequence_ = 0;
  size_t last_bytes_ = 0, last_full_ = 0;
  std::unordered_map<uint64_t, Entry> rows_;
  std::list<uint64_t> lru_;
  // Nodes reserve() made for new keys, which place() moves into rows_ and lru_.
  std::vector<std::unordered_map<uint64_t, Entry>::node_type> spare_entries_;
  std::list<uint64_t> spare_lru_;
  std::unique_ptr<RowArena> arena_;  // the rows' memory, or the file tier's mapping
  kernels::CodecConfig m_codec_;     // low-bit m: aq<store_bits>:channels=H, one block per row
};

}  // namespace qccl::coll
