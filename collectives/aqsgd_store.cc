// AQ-SGD's keyed message store (aqsgd_store.h).
#include "collectives/aqsgd_store.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "kernels/aq_codec.h"
#include "kernels/aq_delta.h"
#include "kernels/convert.h"

namespace qccl::coll {

namespace {

constexpr uint32_t kMagic = 0x44535141u;       // "AQSD"
constexpr uint32_t kCheckpointMagic = 0x43535141u;  // "AQSC"
constexpr uint32_t kSectionMagic = 0x53535141u;     // "AQSS"
constexpr uint16_t kVersion = 2;            // messages: 2, in sections (1: one delta run)
constexpr uint16_t kCheckpointVersion = 2;  // 2: a checksum after the rows (1: none; still read)
constexpr size_t kHeaderBytes = 64;
constexpr size_t kSectionHeaderBytes = 16;
constexpr uint16_t kWarmup = 1, kRefused = 2;  // header flags (a section's: kRefused)

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;  // the message format's
  uint16_t flags = 0;
  uint32_t id = 0;
  uint32_t nkeys = 0;
  uint64_t sequence = 0;
  uint64_t row_values = 0;
  uint64_t keys_hash = 0;
  uint64_t config_hash = 0;
  uint32_t evicted = 0;
  uint32_t full = 0;
  uint64_t payload = 0;
};

// Little-endian fields at fixed offsets (the layout of aqsgd_store.h), whatever the struct's padding.
class Writer {
 public:
  explicit Writer(uint8_t* p) : p_(p) {}
  template <typename T>
  void put(T v) {
    std::memcpy(p_ + at_, &v, sizeof v);
    at_ += sizeof v;
  }
  void put_bytes(const void* src, size_t n) {
    if (n) std::memcpy(p_ + at_, src, n);
    at_ += n;
  }
  uint8_t* here() { return p_ + at_; }
  void skip(size_t n) { at_ += n; }
  size_t size() const { return at_; }

 private:
  uint8_t* p_;
  size_t at_ = 0;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  template <typename T>
  T get() {
    T v;
    need(sizeof v);
    std::memcpy(&v, p_ + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  const uint8_t* take(size_t n) {
    need(n);
    const uint8_t* at = p_ + at_;
    at_ += n;
    return at;
  }
  size_t left() const { return n_ - at_; }

 private:
  void need(size_t n) const {
    if (n > n_ - at_) throw DeltaStoreError(DeltaStoreError::Kind::kCorrupt, "the message ends early");
  }
  const uint8_t* p_;
  size_t n_, at_ = 0;
};

void write_header(const Header& h, uint8_t* out) {
  Writer w(out);
  w.put(h.magic), w.put(h.version), w.put(h.flags), w.put(h.id), w.put(h.nkeys), w.put(h.sequence),
      w.put(h.row_values), w.put(h.keys_hash), w.put(h.config_hash), w.put(h.evicted), w.put(h.full),
      w.put(h.payload);
}

Header read_header(Reader& r) {
  Header h;
  h.magic = r.get<uint32_t>(), h.version = r.get<uint16_t>(), h.flags = r.get<uint16_t>();
  h.id = r.get<uint32_t>(), h.nkeys = r.get<uint32_t>(), h.sequence = r.get<uint64_t>();
  h.row_values = r.get<uint64_t>(), h.keys_hash = r.get<uint64_t>(), h.config_hash = r.get<uint64_t>();
  h.evicted = r.get<uint32_t>(), h.full = r.get<uint32_t>(), h.payload = r.get<uint64_t>();
  return h;
}

uint64_t fnv(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  return h;
}

bool storable(kernels::DataType t) {
  return t == kernels::DataType::kFloat32 || t == kernels::DataType::kFloat16 || t == kernels::DataType::kBfloat16;
}

std::string key_text(uint64_t key) { return std::to_string(key); }

[[noreturn]] void fail(DeltaStoreError::Kind kind, const std::string& what) { throw DeltaStoreError(kind, what); }

}  // namespace

DeltaStore::DeltaStore(const Config& config) : config_(config) {
  if (config_.codec.kind != kernels::CodecKind::kAq)
    fail(DeltaStoreError::Kind::kArgument, "codec '" + config_.codec.canonical() + "': a delta store takes aq2 .. aq8");
  if (config_.row_values == 0) fail(DeltaStoreError::Kind::kArgument, "row values = 0: a key's row holds at least one value");
  if (!storable(config_.store_type) || !storable(config_.full_type))
    fail(DeltaStoreError::Kind::kArgument, "store and full types are float32, float16 or bfloat16");
  const std::string file = config_.file;
  const int bits = config_.store_bits;
  config_.file.clear();
  config_.store_bits = 0;
  set_store_bits(bits);
  set_file(file);
}

void DeltaStore::set_store_bits(int bits) {
  if (bits != 0 && (bits < 2 || bits > 8))
    fail(DeltaStoreError::Kind::kArgument, "store bits = " + std::to_string(bits) + ": 0 (m in the store type) or 2 .. 8");
  if (!rows_.empty())
    fail(DeltaStoreError::Kind::kArgument, "the store holds " + std::to_string(rows_.size()) +
                                               " keys: m's precision changes only while it holds none");
  kernels::CodecConfig codec;
  if (bits) codec = kernels::parse_codec_spec("aq" + std::to_string(bits) + ":channels=" +
                                              std::to_string(config_.codec.channels));
  // The rows' size changes: a new arena in the same place, made before anything is assigned.
  std::unique_ptr<RowArena> arena;
  if (arena_) arena = make_arena(row_bytes_for(bits, codec), config_.file);
  pending_ = Pending{};
  config_.store_bits = bits, m_codec_ = std::move(codec);
  if (arena) arena_ = std::move(arena);
}

std::unique_ptr<RowArena> DeltaStore::make_arena(size_t row_bytes, const std::string& file) {
  try {
    return std::make_unique<RowArena>(row_bytes, file);
  } catch (const RowArenaError& e) {
    fail(DeltaStoreError::Kind::kSystem, e.what());
  }
}

void DeltaStore::load_m(const uint8_t* stored, float* m) const {
  if (config_.store_bits) kernels::decode(m_codec_, stored, config_.row_values, m);
  else kernels::load_float(config_.store_type, stored, m, config_.row_values);
}

size_t DeltaStore::store_m(const float* m, uint8_t* stored) const {
  if (config_.store_bits) return kernels::encode(m_codec_, m, config_.row_values, stored, {}, 0).nonfinite;  // nearest
  kernels::store_float(config_.store_type, m, stored, config_.row_values);
  return kernels::count_nonfinite(config_.store_type, stored, config_.row_values);
}

kernels::AqDeltaRows DeltaStore::delta_view(const uint64_t* keys, const std::vector<size_t>& delta_rows,
                                            uint8_t* pending) {
  const size_t row = config_.row_values, nd = delta_rows.size();
  row_m_.resize(nd), row_m_out_.resize(nd);
  if (config_.store_bits) {
    float* work = grow(work_m_, nd * row);
    for (size_t d = 0; d < nd; ++d) {
      load_m(m(keys[delta_rows[d]]), work + d * row);
      row_m_[d] = row_m_out_[d] = work + d * row;
    }
    return kernels::AqDeltaRows{nd, row, kernels::DataType::kFloat32, row_m_.data(), row_m_out_.data()};
  }
  for (size_t d = 0; d < nd; ++d) {
    uint8_t* stored = m(keys[delta_rows[d]]);
    row_m_[d] = stored;
    row_m_out_[d] = pending ? pending + delta_rows[d] * row_bytes() : stored;
  }
  return kernels::AqDeltaRows{nd, row, config_.store_type, row_m_.data(), row_m_out_.data()};
}

size_t DeltaStore::finish_delta_m(const std::vector<size_t>& delta_rows) {
  size_t nonfinite = 0;
  for (size_t d = 0; d < delta_rows.size(); ++d) {
    uint8_t* new_m = pending_m_.data() + delta_rows[d] * row_bytes();
    nonfinite += config_.store_bits ? store_m(work_m_.data() + d * config_.row_values, new_m)
                                    : kernels::count_nonfinite(config_.store_type, new_m, config_.row_values);
  }
  return nonfinite;
}

void DeltaStore::set_file(const std::string& file) {
  if (!rows_.empty())
    fail(DeltaStoreError::Kind::kArgument, "the store holds " + std::to_string(rows_.size()) +
                                               " keys: its rows move to a file (or back) only while it holds none");
  arena_ = make_arena(row_bytes(), file);
  pending_ = Pending{};
  config_.file = file;
}

void DeltaStore::reserve(size_t fresh, size_t keys) {
  try {
    arena_->reserve(fresh);
  } catch (const RowArenaError& e) {
    fail(DeltaStoreError::Kind::kSystem, std::string(e.what()) + ": nothing sent, the store unchanged");
  }
  rows_.reserve(rows_.size() + keys);  // no rehash while the new keys go in
  while (spare_lru_.size() < keys) spare_lru_.push_back(0);
  while (spare_entries_.size() < keys) {
    std::unordered_map<uint64_t, Entry> one;
    one.try_emplace(0);
    spare_entries_.push_back(one.extract(one.begin()));
  }
  // Low-bit m is re-quantized as the rows go in: this thread's codec scratch made now.
  if (config_.store_bits) kernels::aq_reserve(m_codec_, config_.row_values);
}

DeltaStore::Entry& DeltaStore::place(uint64_t key) {
  if (auto it = rows_.find(key); it != rows_.end()) return it->second;
  auto node = std::move(spare_entries_.back());  // reserve() made it: nothing below allocates
  spare_entries_.pop_back();
  node.key() = key;
  Entry& e = rows_.insert(std::move(node)).position->second;
  e.slot = arena_->allocate();
  e.whole = false;
  lru_.splice(lru_.end(), spare_lru_, spare_lru_.begin());
  e.lru = std::prev(lru_.end());
  *e.lru = key;
  return e;
}

void DeltaStore::forget(uint64_t key) {
  const Entry& e = rows_.at(key);
  arena_->release(e.slot);
  lru_.erase(e.lru);
  rows_.erase(key);
}

uint64_t DeltaStore::config_hash() const {
  const std::string text = config_.codec.canonical() + ";store=" + kernels::data_type_name(config_.store_type) +
                           ";full=" + kernels::data_type_name(config_.full_type) +
                           ";row=" + std::to_string(config_.row_values) +
                           (config_.store_bits ? ";bits=" + std::to_string(config_.store_bits) : "");
  return fnv(text.data(), text.size());
}

size_t DeltaStore::header_bytes() { return kHeaderBytes; }

size_t DeltaStore::section_header_bytes() { return kSectionHeaderBytes; }

void DeltaStore::write_refusal(uint8_t* header) {
  Header h;
  h.flags = kRefused;
  write_header(h, header);
}

bool DeltaStore::is_refusal(const uint8_t* header) {
  Reader r(header, kHeaderBytes);
  const Header h = read_header(r);
  return h.magic == kMagic && (h.flags & kRefused) != 0;
}

namespace {
void write_section_header(size_t s, uint16_t flags, uint64_t bytes, uint8_t* out) {
  Writer w(out);
  w.put(kSectionMagic), w.put(static_cast<uint16_t>(s)), w.put(flags), w.put(bytes);
}
}  // namespace

void DeltaStore::write_section_refusal(size_t s, uint8_t* section) { write_section_header(s, kRefused, 0, section); }

bool DeltaStore::is_section_refusal(const uint8_t* section, size_t bytes) {
  if (bytes < kSectionHeaderBytes) return false;
  Reader r(section, kSectionHeaderBytes);
  const uint32_t magic = r.get<uint32_t>();
  r.get<uint16_t>();
  return magic == kSectionMagic && (r.get<uint16_t>() & kRefused) != 0;
}

size_t DeltaStore::max_head_bytes(size_t nkeys) const {
  return kHeaderBytes + rows_.size() * sizeof(uint64_t) + (nkeys + 7) / 8;
}

size_t DeltaStore::sections(size_t nkeys) const {
  const size_t row = config_.row_values;
  const size_t whole = config_.codec.encoded_bytes(nkeys * row);  // one run: one set of scales
  for (size_t k = std::min(kSections, nkeys); k > 1; --k) {
    size_t bytes = 0;
    for (size_t s = 0; s < k; ++s) bytes += config_.codec.encoded_bytes(((s + 1) * nkeys / k - s * nkeys / k) * row);
    if (32 * (bytes - whole) <= whole) return k;
  }
  return 1;
}

size_t DeltaStore::max_section_bytes(size_t nkeys) const {
  const size_t k = sections(nkeys), rows = nkeys ? (nkeys + k - 1) / k : 0;  // the most rows a section holds
  const size_t full_row = config_.row_values * kernels::element_size(config_.full_type);
  return kSectionHeaderBytes + rows * full_row + config_.codec.encoded_bytes(rows * config_.row_values);
}

size_t DeltaStore::max_message_bytes(size_t nkeys) const {
  const size_t full_row = config_.row_values * kernels::element_size(config_.full_type);
  size_t bytes = max_head_bytes(nkeys);
  for (size_t s = 0; s < kSections; ++s) {
    size_t first, last;
    section_rows(s, nkeys, &first, &last);
    bytes += kSectionHeaderBytes + (last - first) * full_row +
             config_.codec.encoded_bytes((last - first) * config_.row_values);
  }
  return bytes;
}

void DeltaStore::lay_out(size_t head_bytes) {
  Pending& p = pending_;
  const size_t row = config_.row_values, nkeys = p.keys.size();
  const size_t full_row_bytes = row * kernels::element_size(config_.full_type);
  size_t bytes = head_bytes, delta_values = 0;
  for (size_t s = 0; s < kSections; ++s) {
    size_t first, last, full = 0;
    section_rows(s, nkeys, &first, &last);
    for (size_t r = first; r < last; ++r) full += p.full_row[r];
    const size_t delta = (last - first - full) * row;
    p.delta_before[s] = delta_values;
    p.section_bytes[s] = kSectionHeaderBytes + full * full_row_bytes + config_.codec.encoded_bytes(delta);
    delta_values += delta;
    bytes += p.section_bytes[s];
  }
  p.bytes = bytes;
}

const uint8_t* DeltaStore::row(uint64_t key) const {
  auto it = rows_.find(key);
  return it == rows_.end() ? nullptr : arena_->row(it->second.slot);
}

void DeltaStore::touch(uint64_t key) {
  Entry& e = rows_.at(key);
  lru_.splice(lru_.end(), lru_, e.lru);  // most recent at the back
}

std::vector<uint64_t> DeltaStore::evictions(const uint64_t* keys, size_t nkeys) const {
  std::vector<uint64_t> out;
  if (config_.budget_bytes == 0) return out;
  size_t fresh = 0;
  for (size_t r = 0; r < nkeys; ++r) fresh += holds(keys[r]) ? 0 : 1;
  if ((rows_.size() + fresh) * row_bytes() <= config_.budget_bytes) return out;
  if (nkeys * row_bytes() > config_.budget_bytes)
    fail(DeltaStoreError::Kind::kBudget, "the call's " + std::to_string(nkeys) + " rows take " +
                                             std::to_string(nkeys * row_bytes()) + " bytes, over the budget of " +
                                             std::to_string(config_.budget_bytes));
  if (config_.evict == Evict::kNone)
    fail(DeltaStoreError::Kind::kBudget, std::to_string(fresh) + " new keys would take the store to " +
                                             std::to_string((rows_.size() + fresh) * row_bytes()) +
                                             " bytes, over its budget of " + std::to_string(config_.budget_bytes) +
                                             " (no eviction)");
  const std::unordered_set<uint64_t> in_call(keys, keys + nkeys);
  size_t held = rows_.size() + fresh;
  for (auto it = lru_.begin(); it != lru_.end() && held * row_bytes() > config_.budget_bytes; ++it) {
    if (in_call.count(*it)) continue;
    out.push_back(*it);
    --held;
  }
  return out;
}

size_t DeltaStore::send(const float* x, const uint64_t* keys, size_t nkeys, const kernels::PhiloxKey& key,
                        uint8_t* out) {
  const size_t bytes = prepare(x, keys, nkeys, key, out);
  commit();
  return bytes;
}

size_t DeltaStore::prepare(const float* x, const uint64_t* keys, size_t nkeys, const kernels::PhiloxKey& key,
                           uint8_t* out) {
  try {
    size_t at = begin_send(x, keys, nkeys, key, out);
    for (size_t s = 0; s < kSections; ++s) {
      send_section(s, out + at);
      at += section_bytes(s);
    }
    return at;
  } catch (...) {
    pending_ = Pending{};
    throw;
  }
}

size_t DeltaStore::begin_send(const float* x, const uint64_t* keys, size_t nkeys, const kernels::PhiloxKey& key,
                              uint8_t* out) {
  pending_ = Pending{};
  if (nkeys == 0) fail(DeltaStoreError::Kind::kArgument, "nkeys = 0: nothing to send");
  if (!x || !keys || !out) fail(DeltaStoreError::Kind::kArgument, "a buffer is NULL");
  if (nkeys > 0xFFFFFFFFu) fail(DeltaStoreError::Kind::kArgument, "nkeys = " + std::to_string(nkeys) + " is too large");
  {
    std::unordered_set<uint64_t> seen;
    for (size_t r = 0; r < nkeys; ++r)
      if (!seen.insert(keys[r]).second)
        fail(DeltaStoreError::Kind::kArgument, "key " + key_text(keys[r]) + " appears twice in one call");
  }
  const std::vector<uint64_t> evicted = evictions(keys, nkeys);
  Pending p;
  p.keys.assign(keys, keys + nkeys);
  p.evicted = evicted;
  p.full_row.resize(nkeys);
  size_t fresh = 0;
  for (size_t r = 0; r < nkeys; ++r) {
    p.full_row[r] = warmup_ || !holds(keys[r]) || rows_.at(keys[r]).whole;
    p.full += p.full_row[r];
    fresh += holds(keys[r]) ? 0 : 1;
  }
  reserve(fresh, fresh);  // so that commit() cannot fail for want of room
  for (size_t r = 0; r < nkeys; ++r)
    if (!p.full_row[r]) arena_->will_need(rows_.at(keys[r]).slot);
  // Room for the sections' work, made before any is written.
  if (pending_m_.size() < nkeys * row_bytes()) pending_m_.resize(nkeys * row_bytes());
  section_delta_rows_.reserve(nkeys);
  as_sent_.resize(config_.row_values);
  p.x = x;
  p.key = key;
  pending_ = std::move(p);
  const size_t bitmap_bytes = (nkeys + 7) / 8;
  const size_t head_bytes = kHeaderBytes + evicted.size() * sizeof(uint64_t) + bitmap_bytes;
  lay_out(head_bytes);

  Header h;
  h.flags = warmup_ ? kWarmup : 0;
  h.id = config_.id;
  h.nkeys = static_cast<uint32_t>(nkeys);
  h.sequence = sequence_;
  h.row_values = config_.row_values;
  h.keys_hash = fnv(keys, nkeys * sizeof(uint64_t));
  h.config_hash = config_hash();
  h.evicted = static_cast<uint32_t>(evicted.size());
  h.full = static_cast<uint32_t>(pending_.full);
  h.payload = pending_.bytes - kHeaderBytes;
  Writer w(out);
  write_header(h, out);
  w.skip(kHeaderBytes);
  for (uint64_t k : evicted) w.put(k);
  uint8_t* bitmap = w.here();
  std::memset(bitmap, 0, bitmap_bytes);
  for (size_t r = 0; r < nkeys; ++r)
    if (pending_.full_row[r]) bitmap[r / 8] |= static_cast<uint8_t>(1u << (r % 8));
  pending_.ready = true;
  return head_bytes;
}

size_t DeltaStore::split_section(size_t s, size_t* first, size_t* last) {
  section_rows(s, pending_.keys.size(), first, last);
  section_delta_rows_.clear();
  size_t full = 0;
  for (size_t r = *first; r < *last; ++r) {
    if (pending_.full_row[r]) ++full;
    else section_delta_rows_.push_back(r);
  }
  return full;
}

void DeltaStore::send_section(size_t s, uint8_t* out) {
  Pending& p = pending_;
  if (!p.ready || s >= kSections || (p.sections_done >> s & 1u))
    fail(DeltaStoreError::Kind::kArgument, "section " + std::to_string(s) + " of no message begun, or written twice");
  const size_t row = config_.row_values;
  const size_t full_row_bytes = row * kernels::element_size(config_.full_type);
  size_t first, last;
  const size_t full = split_section(s, &first, &last);
  const std::vector<size_t>& delta_rows = section_delta_rows_;
  // The rows sent whole first, as the receiver will read them: one that holds NaN or Inf there (or a
  // value beyond float16's range) refuses the call, as a delta's would; it would become the key's m,
  // and every later delta against it would fail.
  size_t nonfinite = 0;
  uint8_t* wire = out + kSectionHeaderBytes;
  for (size_t r = first; r < last; ++r) {
    if (!p.full_row[r]) continue;
    kernels::store_float(config_.full_type, p.x + r * row, wire, row);
    nonfinite += kernels::count_nonfinite(config_.full_type, wire, row);
    wire += full_row_bytes;
  }
  if (nonfinite)
    fail(DeltaStoreError::Kind::kNonFinite, std::to_string(nonfinite) +
                                                " values of the rows sent whole are NaN or Inf (or exceed float16's "
                                                "range): the call refused, the store unchanged");
  // Then the delta rows: encoded straight from x and the stored m, their new m into pending_m_
  // (committed by commit()); kernels::aq_delta_send's arithmetic on the stored type, fused (aq_delta.h).
  uint8_t* delta_payload = out + kSectionHeaderBytes + full * full_row_bytes;
  if (!delta_rows.empty()) {
    const kernels::AqDeltaRows view = delta_view(p.keys.data(), delta_rows, pending_m_.data());
    row_x_.resize(delta_rows.size());
    for (size_t d = 0; d < delta_rows.size(); ++d) row_x_[d] = p.x + delta_rows[d] * row;
    if (size_t bad = kernels::aq_delta_send_rows(config_.codec, row_x_.data(), view, delta_payload, p.key,
                                                 p.delta_before[s]))
      fail(DeltaStoreError::Kind::kNonFinite, std::to_string(bad) +
                                                  " channels of the delta hold NaN or Inf (or exceed float16's "
                                                  "range): the call refused, the store unchanged");
    nonfinite += finish_delta_m(delta_rows);
  }
  wire = out + kSectionHeaderBytes;
  for (size_t r = first; r < last; ++r) {
    if (!p.full_row[r]) continue;
    // m = round_store(the value the receiver reads), as the receiver computes it
    kernels::load_float(config_.full_type, wire, as_sent_.data(), row);
    nonfinite += store_m(as_sent_.data(), pending_m_.data() + r * row_bytes());
    wire += full_row_bytes;
  }
  // Both ends would keep an m of Inf (a float16 m past 65504, from a full row of float32 or a delta
  // that carries m there) and refuse every later delta of the key: the sender refuses this call
  // instead, and the key's m stays the last one that fits.
  if (nonfinite)
    fail(DeltaStoreError::Kind::kNonFinite,
         std::to_string(nonfinite) +
             (config_.store_bits ? " channels of the keys' new low-bit m would need a scale beyond float16's range"
                                 : " values of the keys' new m would not be finite as " +
                                       std::string(kernels::data_type_name(config_.store_type))) +
             ": the call refused, the store unchanged (m of float32 or bfloat16, not low-bit, holds them)");
  write_section_header(s, 0, p.section_bytes[s] - kSectionHeaderBytes, out);
  p.sections_done |= 1u << s;
}

void DeltaStore::commit() {
  if (!pending_.ready || pending_.sections_done != (1u << kSections) - 1)
    throw DeltaStoreError(DeltaStoreError::Kind::kArgument, "no whole message to commit");
  for (uint64_t k : pending_.evicted) forget(k);
  for (size_t r = 0; r < pending_.keys.size(); ++r) {
    Entry& e = place(pending_.keys[r]);
    std::memcpy(arena_->row(e.slot), pending_m_.data() + r * row_bytes(), row_bytes());
    e.whole = false;  // a finite m, from a row as sent or a delta
  }
  for (uint64_t k : pending_.keys) touch(k);
  ++sequence_;
  last_bytes_ = pending_.bytes, last_full_ = pending_.full;
  pending_ = Pending{};
}

void DeltaStore::receive(const uint8_t* message, size_t bytes, const uint64_t* keys, size_t nkeys, float* x_out) {
  using Kind = DeltaStoreError::Kind;
  if (!message || !keys || !x_out) fail(Kind::kArgument, "a buffer is NULL");
  try {
    // The head's length from its header, within the message (receive_head checks it all, in order).
    Reader r(message, bytes);
    const Header h = read_header(r);
    const size_t evicted = std::min<size_t>(h.evicted, bytes / sizeof(uint64_t));
    const size_t head = std::min(bytes, kHeaderBytes + evicted * sizeof(uint64_t) + (nkeys + 7) / 8);
    receive_head(message, head, keys, nkeys);
    if (bytes != pending_.bytes) fail(Kind::kCorrupt, "the payload's length does not match the header's");
    // Every section's header checked before any is applied: x_out changes only for a whole message.
    size_t at = head;
    for (size_t s = 0; s < kSections; at += section_bytes(s), ++s) check_section(s, message + at, section_bytes(s));
    at = head;
    for (size_t s = 0; s < kSections; at += section_bytes(s), ++s) receive_section(s, message + at, section_bytes(s), x_out);
    commit();
  } catch (...) {
    pending_ = Pending{};
    throw;
  }
}

void DeltaStore::receive_head(const uint8_t* head, size_t bytes, const uint64_t* keys, size_t nkeys) {
  using Kind = DeltaStoreError::Kind;
  pending_ = Pending{};
  if (!head || !keys) fail(Kind::kArgument, "a buffer is NULL");
  Reader r(head, bytes);
  const Header h = read_header(r);
  if (h.magic != kMagic) fail(Kind::kCorrupt, "not a delta-store message (magic)");
  if (h.flags & kRefused) fail(Kind::kCorrupt, "the sender refused this call (a refusal, not a message)");
  if (h.version != kVersion)
    fail(Kind::kMismatch, "message format " + std::to_string(h.version) + ", this store reads " + std::to_string(kVersion));
  if (h.id != config_.id)
    fail(Kind::kMismatch, "a message of store " + std::to_string(h.id) + ", this is store " + std::to_string(config_.id));
  if (h.config_hash != config_hash())
    fail(Kind::kMismatch, "the sender's store has another codec, store type, full type or row size than this one (" +
                              config_.codec.canonical() + ", " + std::to_string(config_.row_values) + " values per key)");
  if (h.row_values != config_.row_values)
    fail(Kind::kMismatch, "rows of " + std::to_string(h.row_values) + " values, this store's hold " +
                              std::to_string(config_.row_values));
  if (h.nkeys != nkeys)
    fail(Kind::kMismatch, "a message of " + std::to_string(h.nkeys) + " keys, this call names " + std::to_string(nkeys));
  if (h.sequence != sequence_)
    fail(Kind::kSequence, "message " + std::to_string(h.sequence) + ", this store expects message " +
                              std::to_string(sequence_) + ": one was lost or repeated");
  if (h.keys_hash != fnv(keys, nkeys * sizeof(uint64_t)))
    fail(Kind::kMismatch, "the sender's keys are not this call's (in order)");
  if (h.evicted > r.left() / sizeof(uint64_t)) fail(Kind::kCorrupt, "more evicted keys than the message holds");
  if (h.evicted > rows_.size()) fail(Kind::kSequence, "the sender evicts more keys than this store holds");
  std::vector<uint64_t> evicted(h.evicted);
  for (uint64_t& k : evicted) k = r.get<uint64_t>();
  if (std::unordered_set<uint64_t>(evicted.begin(), evicted.end()).size() != evicted.size())
    fail(Kind::kCorrupt, "the message evicts a key twice");
  const uint8_t* bitmap = r.take((nkeys + 7) / 8);
  if (r.left() != 0) fail(Kind::kCorrupt, "bytes left over after the message's head");
  Pending p;
  p.full_row.resize(nkeys);
  for (size_t i = 0; i < nkeys; ++i) {
    p.full_row[i] = (bitmap[i / 8] >> (i % 8)) & 1;
    p.full += p.full_row[i];
  }
  if (p.full != h.full) fail(Kind::kCorrupt, "the bitmap's full rows do not match the header's count");
  const std::unordered_set<uint64_t> gone(evicted.begin(), evicted.end());
  for (uint64_t k : evicted)
    if (!holds(k)) fail(Kind::kSequence, "the sender evicted key " + key_text(k) + ", which this store does not hold");
  for (size_t i = 0; i < nkeys; ++i)
    if (!p.full_row[i] && (!holds(keys[i]) || gone.count(keys[i])))
      fail(Kind::kSequence, "a delta for key " + key_text(keys[i]) + ", which this store does not hold");
  size_t fresh = 0;
  for (size_t i = 0; i < nkeys; ++i) fresh += p.full_row[i] && (!holds(keys[i]) || gone.count(keys[i])) ? 1 : 0;
  // The sender's budget decides what is evicted; this store must hold what is kept (a receiver's
  // budget at least the sender's). A smaller one refuses before anything changes, and both fail.
  const size_t held = rows_.size() - evicted.size() + fresh;
  if (config_.budget_bytes && held * row_bytes() > config_.budget_bytes)
    fail(Kind::kBudget, "the message would leave this receiving store " + std::to_string(held) + " keys of " +
                            std::to_string(row_bytes()) + " bytes, over its budget of " +
                            std::to_string(config_.budget_bytes) + " (a receiver's budget must be at least its "
                            "sender's)");
  p.keys.assign(keys, keys + nkeys);
  p.evicted = std::move(evicted);
  // Room for the rows and keys commit() places, made before the sections come: commit() then
  // allocates nothing (a section that cannot allocate fails the call, the store unchanged).
  reserve(fresh, fresh);
  if (pending_m_.size() < nkeys * row_bytes()) pending_m_.resize(nkeys * row_bytes());
  section_delta_rows_.reserve(nkeys);
  for (size_t i = 0; i < nkeys; ++i)
    if (!p.full_row[i]) arena_->will_need(rows_.at(keys[i]).slot);
  pending_ = std::move(p);
  lay_out(bytes);
  if (h.payload != pending_.bytes - kHeaderBytes) {
    pending_ = Pending{};
    fail(Kind::kCorrupt, "the payload's length does not match the header's");
  }
  pending_.ready = true;
}

void DeltaStore::check_section(size_t s, const uint8_t* section, size_t bytes) const {
  using Kind = DeltaStoreError::Kind;
  if (!pending_.ready) fail(Kind::kArgument, "a section before its message's head");
  if (s >= kSections || (pending_.sections_done >> s & 1u))
    fail(Kind::kCorrupt, "section " + std::to_string(s) + " is not one of the message's, or came twice");
  Reader r(section, bytes);
  const uint32_t magic = r.get<uint32_t>();
  const uint16_t index = r.get<uint16_t>(), flags = r.get<uint16_t>();
  const uint64_t length = r.get<uint64_t>();
  if (magic != kSectionMagic) fail(Kind::kCorrupt, "not a section of a delta-store message (magic)");
  if (flags & kRefused) fail(Kind::kCorrupt, "the sender refused this call (a refusal, not a section)");
  if (index != s) fail(Kind::kCorrupt, "section " + std::to_string(index) + " where section " + std::to_string(s) + " was due");
  if (bytes != pending_.section_bytes[s] || length != bytes - kSectionHeaderBytes)
    fail(Kind::kCorrupt, "section " + std::to_string(s) + " of " + std::to_string(bytes) + " bytes, the head says " +
                             std::to_string(pending_.section_bytes[s]));
}

void DeltaStore::receive_section(size_t s, const uint8_t* section, size_t bytes, float* x_out) {
  if (!x_out) fail(DeltaStoreError::Kind::kArgument, "a buffer is NULL");
  check_section(s, section, bytes);
  apply_section(s, section, x_out);
}

void DeltaStore::apply_section(size_t s, const uint8_t* section, float* x_out) {
  Pending& p = pending_;
  const size_t row = config_.row_values;
  const size_t full_row_bytes = row * kernels::element_size(config_.full_type);
  size_t first, last;
  const size_t full = split_section(s, &first, &last);
  const std::vector<size_t>& delta_rows = section_delta_rows_;
  const uint8_t* whole_rows = section + kSectionHeaderBytes;
  if (kernels::count_nonfinite(config_.full_type, whole_rows, full * row))
    fail(DeltaStoreError::Kind::kCorrupt, "a row sent whole holds NaN or Inf (a sender never sends one)");
  // The delta rows into x_out and their new m aside (with low-bit m, a float32 m re-quantized
  // below): nothing is written when the delta decodes to NaN, which a sender never sends.
  if (!delta_rows.empty()) {
    const kernels::AqDeltaRows view = delta_view(p.keys.data(), delta_rows, pending_m_.data());
    row_x_out_.resize(delta_rows.size());
    for (size_t d = 0; d < delta_rows.size(); ++d) row_x_out_[d] = x_out + delta_rows[d] * row;
    if (kernels::aq_delta_receive_rows(config_.codec, section + kSectionHeaderBytes + full * full_row_bytes, view,
                                       row_x_out_.data()))
      fail(DeltaStoreError::Kind::kCorrupt, "the delta decodes to NaN (a sender never sends one)");
  }
  size_t nonfinite = finish_delta_m(delta_rows);
  const uint8_t* wire = section + kSectionHeaderBytes;
  for (size_t r = first; r < last; ++r) {
    if (!p.full_row[r]) continue;
    float* out_row = x_out + r * row;
    kernels::load_float(config_.full_type, wire, out_row, row);
    nonfinite += store_m(out_row, pending_m_.data() + r * row_bytes());
    wire += full_row_bytes;
  }
  if (nonfinite) fail(DeltaStoreError::Kind::kCorrupt, "a key's new m is not finite in the store (a sender never "
                                                       "sends such a message)");
  p.sections_done |= 1u << s;
}

size_t DeltaStore::checkpoint_bytes() const { return 4 + 2 + 2 + 8 + 8 + 8 + rows_.size() * (8 + row_bytes()) + 8; }

std::vector<uint8_t> DeltaStore::save() const {
  std::vector<uint8_t> out(checkpoint_bytes());
  save(out.data());
  return out;
}

void DeltaStore::save(uint8_t* out) const {
  Writer w(out);
  w.put(kCheckpointMagic), w.put(kCheckpointVersion), w.put(uint16_t{0}), w.put(config_hash()), w.put(sequence_),
      w.put(static_cast<uint64_t>(rows_.size()));
  for (uint64_t k : lru_) w.put(k), w.put_bytes(arena_->row(rows_.at(k).slot), row_bytes());
  w.put(fnv(out, checkpoint_bytes() - 8));
}

void DeltaStore::load(const uint8_t* data, size_t bytes) {
  using Kind = DeltaStoreError::Kind;
  if (!data) fail(Kind::kArgument, "the checkpoint is NULL");
  Reader head(data, bytes);
  if (head.get<uint32_t>() != kCheckpointMagic) fail(Kind::kCorrupt, "not a delta-store checkpoint (magic)");
  const uint16_t version = head.get<uint16_t>();
  if (version != 1 && version != kCheckpointVersion)
    fail(Kind::kMismatch, "checkpoint format " + std::to_string(version) + ", this store reads 1 to " +
                              std::to_string(kCheckpointVersion));
  if (version >= 2) {  // a flipped bit in a row would leave the two ends' stores apart without a word
    uint64_t sum = 0;
    if (bytes < 8 + 8) fail(Kind::kCorrupt, "the checkpoint is truncated");
    std::memcpy(&sum, data + bytes - 8, 8);
    if (fnv(data, bytes - 8) != sum) fail(Kind::kCorrupt, "the checkpoint's checksum does not match its bytes");
    bytes -= 8;
  }
  Reader r(data, bytes);
  r.take(4 + 2 + 2);  // magic, version and a reserved field: read above
  if (r.get<uint64_t>() != config_hash())
    fail(Kind::kMismatch, "a checkpoint of a store with another codec, types or row size");
  const uint64_t sequence = r.get<uint64_t>(), count = r.get<uint64_t>();
  if (count > r.left() / (8 + row_bytes()) || r.left() != count * (8 + row_bytes()))
    fail(Kind::kCorrupt, "the checkpoint's length does not match its " + std::to_string(count) + " keys");
  if (config_.budget_bytes && count * row_bytes() > config_.budget_bytes)  // every later call would be refused
    fail(Kind::kBudget, "the checkpoint's " + std::to_string(count) + " keys take " +
                            std::to_string(count * row_bytes()) + " bytes, over this store's budget of " +
                            std::to_string(config_.budget_bytes));
  // Checked whole, and room made, before the store changes.
  std::vector<std::pair<uint64_t, const uint8_t*>> entries(count);
  std::unordered_set<uint64_t> seen;
  for (auto& [k, m] : entries) {
    k = r.get<uint64_t>();
    m = r.take(row_bytes());
    if (!seen.insert(k).second) fail(Kind::kCorrupt, "key " + key_text(k) + " appears twice in the checkpoint");
  }
  std::vector<float> values(config_.store_bits ? config_.row_values : 0);  // low-bit m decoded, to check it
  reserve(count > rows_.size() ? count - rows_.size() : 0, count);  // every key is placed anew
  pending_ = Pending{};
  rows_.clear();
  lru_.clear();
  arena_->clear();
  for (const auto& [k, m] : entries) {
    Entry& e = place(k);
    std::memcpy(arena_->row(e.slot), m, row_bytes());
    e.whole = config_.store_bits ? kernels::decode(m_codec_, m, config_.row_values, values.data()) != 0
                                 : kernels::count_nonfinite(config_.store_type, m, config_.row_values) != 0;
  }
  sequence_ = sequence;
}

}  // namespace qccl::coll
