#include "sim/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "base/config.h"
#include "base/errors.h"
#include "kernels/codec.h"

namespace qccl::sim {

namespace {

constexpr double kEthernetEfficiency = 1448.0 / 1538.0;  // model.h
constexpr double kNetemEfficiency = 1448.0 / 1514.0;

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A cost or a time no machine comes near (a second per value, 100 s of latency) is a typo: above
// `max` a model's times would overflow to "never", which reads as a deadlock.
double parse_number(const std::string& what, const std::string& text, double max = 1e15) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || errno || *end || !std::isfinite(v) || v < 0)
    throw std::invalid_argument(what + " = '" + text + "' is not a number >= 0");
  if (v > max)
    throw std::invalid_argument(what + " = '" + text + "' is above " + format("%g", max) + ", more than any machine");
  return v;
}

constexpr double kMaxSecondsPerValue = 1.0;  // cpu.* and codec steps: per value, per byte or per message
constexpr double kMaxLatency = 100.0;        // as qccl_sim --latency

}  // namespace

const double* Model::step_cost(const std::string& canonical, const std::string& step) const {
  for (const std::string& key : {canonical, canonical.substr(0, canonical.find(':'))}) {
    auto codec = codecs.find(key);
    if (codec == codecs.end()) continue;
    auto cost = codec->second.find(step);
    if (cost != codec->second.end()) return &cost->second;
  }
  return nullptr;
}

double parse_rate(const std::string& text) {
  const std::string t = trim(text);
  size_t digits = 0;
  while (digits < t.size() &&
         (std::isdigit(static_cast<unsigned char>(t[digits])) || t[digits] == '.' || t[digits] == 'e' ||
          ((t[digits] == '+' || t[digits] == '-') && digits && t[digits - 1] == 'e')))
    ++digits;
  const std::string number = t.substr(0, digits), unit = t.substr(digits);
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  auto bad = [&](const std::string& why) -> double { throw std::invalid_argument("rate '" + text + "': " + why); };
  if (number.empty() || *end || !(v > 0) || !std::isfinite(v))
    return bad("expected a positive number with a unit (10gbit, 40Gbit/s, 300GB/s)");
  if (unit.empty()) return bad("no unit: bits (10gbit, 40Gbit/s) or bytes (300GB/s) per second");
  // "/s" forms: a capital B counts bytes ("12.5GB/s", "1GiB/s"), "bit" or a small b bits ("40Gbit/s",
  // "100Mb/s"); without "/s", tc's units ("10gbit", "1gibit", "125mbps" = 125 MB/s, as qcclrun).
  double bits_per_unit = 0;
  if (unit.size() > 2 && unit.compare(unit.size() - 2, 2, "/s") == 0) {
    std::string base = unit.substr(0, unit.size() - 2);
    double per = 0;
    if (base.back() == 'B') {
      per = 8, base.pop_back();
    } else if (lower(base).size() >= 3 && lower(base).compare(base.size() - 3, 3, "bit") == 0) {
      per = 1, base.resize(base.size() - 3);
    } else if (base.back() == 'b') {
      per = 1, base.pop_back();
    }
    static const std::pair<const char*, double> kPrefixes[] = {
        {"", 1},     {"k", 1e3},         {"K", 1e3},            {"M", 1e6},
        {"G", 1e9},  {"T", 1e12},        {"Ki", 1024.0},        {"Mi", 1048576.0},
        {"Gi", 1073741824.0},            {"Ti", 1099511627776.0}};
    for (const auto& [prefix, scale] : kPrefixes)
      if (per > 0 && base == prefix) bits_per_unit = per * scale;
    // Bits may take a small prefix too, as tc's units do ("100mbit/s", "10gbit/s"): a milli-bit is no rate.
    static const std::pair<const char*, double> kSmallPrefixes[] = {{"m", 1e6}, {"g", 1e9}, {"t", 1e12}};
    for (const auto& [prefix, scale] : kSmallPrefixes)
      if (per == 1 && base == prefix) bits_per_unit = scale;
  } else {
    bits_per_unit = tc_rate_unit(unit);
  }
  if (bits_per_unit == 0)
    return bad("unknown unit '" + unit +
               "' (bits per second: bit, kbit, mbit, gbit, tbit as tc, or bit/s, Mbit/s, mbit/s, Gb/s; "
               "bytes per second: B/s, KB/s, MB/s, GB/s, TB/s, KiB/s .. TiB/s, or tc's bps, mbps, gbps)");
  const double bits = v * bits_per_unit;
  if (!(bits >= 1e3 && bits <= 1e15)) return bad("out of range (1 kbit/s to 1000 Tbit/s)");
  return bits / 8;
}

// A model file's rate: a bare number is bytes per second (the file's unit, as format_model writes it).
double parse_file_rate(const std::string& what, const std::string& text) {
  const std::string t = trim(text);
  if (t.empty() || !(std::isdigit(static_cast<unsigned char>(t.back())) || t.back() == '.')) return parse_rate(t);
  const double bytes = parse_number(what, t);
  if (!(bytes * 8 >= 1e3 && bytes * 8 <= 1e15))
    throw std::invalid_argument(what + " = " + t + " bytes/s is out of range (1 kbit/s to 1000 Tbit/s)");
  return bytes;
}

std::string describe_rate(double r) {
  char buf[64];
  const double bits = r * 8;
  if (r <= 0) return "unlimited";
  if (bits >= 1e12)
    std::snprintf(buf, sizeof buf, "%.3g GB/s", r / 1e9);
  else if (bits >= 1e9)
    std::snprintf(buf, sizeof buf, "%.3g Gbit/s", bits / 1e9);
  else if (bits >= 1e6)
    std::snprintf(buf, sizeof buf, "%.3g Mbit/s", bits / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.3g kbit/s", bits / 1e3);
  return buf;
}

namespace {

// Ethernet through one switch: a few microseconds of switching plus the kernel's TCP path on both
// ends, measured at 25-50 us round trip on cloud instances; we take 25 us one way.
constexpr double kEthernetLatency = 25e-6;
constexpr std::pair<const char*, double> kEthernetPresets[] = {
    {"100mbit", 100e6 / 8}, {"1gbit", 1e9 / 8}, {"10gbit", 10e9 / 8}, {"25gbit", 25e9 / 8}, {"100gbit", 100e9 / 8}};

LinkClass ethernet_preset(const char* preset, double rate, std::string* source) {
  if (source)
    *source = std::string(preset) +
              ": Ethernet line rate, TCP payload 1448 of 1538 bytes per frame (MTU 1500), "
              "25 us one-way latency (kernel TCP through one switch)";
  return LinkClass{rate, kEthernetLatency, kEthernetEfficiency};
}

}  // namespace

bool link_preset(const std::string& name, LinkClass* out, std::string* source) {
  const std::string typed = trim(name), n = lower(typed);
  for (const auto& [preset, rate] : kEthernetPresets)
    if (n == preset) {
      *out = ethernet_preset(preset, rate, source);
      return true;
    }
  // Only the prefix is case-blind: the rate's unit tells bytes (B) from bits (b) by its case.
  if (n.rfind("netem:", 0) == 0) {
    const double rate = parse_rate(typed.substr(6));
    // tools/netem.cc, tbf_params_for: a bucket of 2 ms of traffic, at least 16 KiB
    *out = LinkClass{rate, 30e-6, kNetemEfficiency, std::max(16384.0, std::floor(rate / 500))};
    if (source)
      *source = typed +
                ": qcclrun --netem token bucket at that rate (1448 payload bytes per 1514-byte frame, a "
                "burst of 2 ms of traffic), 30 us one-way through veth pairs and the hub namespace";
    return true;
  }
  if (n == "nvlink") {
    *out = LinkClass{300e9, 2e-6, 1.0};
    if (source)
      *source = "nvlink: 300 GB/s per GPU in each direction (NVLink 4, H100 SXM: 18 links x 25 GB/s / 1.5), 2 us";
    return true;
  }
  return false;
}

LinkClass parse_link(const std::string& text, std::string* source) {
  LinkClass link;
  if (link_preset(text, &link, source)) return link;
  // A bare rate has no latency, whatever it equals (matching presets by value made a rate 1% off a
  // preset's, or an --intra rate that happened to equal one, 25 us apart): --latency adds one.
  const double rate = parse_rate(text);
  if (source) *source = trim(text) + ": given rate, Ethernet TCP payload efficiency, no latency";
  return LinkClass{rate, 0, kEthernetEfficiency};
}

Model default_model() {
  Model m;
  std::string source;
  link_preset("10gbit", &m.inter, &source);
  m.sources.push_back("inter " + source);
  m.intra = LinkClass{10e9, 1e-6, 1.0};
  m.sources.push_back("intra: 10 GB/s shared-memory copies, 1 us");
  // CPU costs: `qccl_sim calibrate` on the development machine (a 2-core VM, 2026-11-26); the cost
  // of posting a transfer is UCX's tag send through its tcp transport, which calibrate cannot
  // measure alone (2 us: the validation's small messages, docs/PERF.md "Simulator").
  m.post = 2e-6;
  // Measured: 8-byte all-reduces (recursive doubling) under qcclrun --netem 1gbit took 35 us per round
  // with 2 ranks on 2 cores, 75 with 4 and 200 with 8; the ranks of an oversubscribed machine block
  // and wait for a core: 40-55 us per rank per core beyond one.
  m.wakeup = 5e-5;
  // The kernel's TCP path between emulated hosts (veth pairs and a bridge, MTU 1500), per byte at each
  // end: an unshaped 2-host all-reduce of 64 MiB, less the model's other costs, took 0.27 to 0.79 ns
  // per byte sent and received, with the machine's load (perf/validate_sim.sh measures it anew).
  m.wire = 4e-10;
  // Per message, beside its bytes: unshaped 2-host ring all-reduces of 16 MiB in chunks of 4, 8 and
  // 16 KiB (1,024 to 4,096 messages each way) took 7.4 to 9.5 us per message at each end more than
  // the same all-reduce in 64 KiB chunks, beyond what the model's other costs account for (2026-11-28,
  // docs/PERF.md "Simulator": Marsit's messages are of this size).
  m.message = 8e-6;
  m.copy = 1.54e-10;
  m.reduce = 6.4e-10;
  m.load = 4.99e-10;
  m.store = 4.31e-10;
  m.add = 4.89e-10;
  m.divide = 3.34e-10;
  m.codecs["aq2"] = {{"decode", 2.74e-10}, {"decode_add", 2.74e-10}, {"encode", 6.12e-10}};
  m.codecs["aq4"] = {{"decode", 2.82e-10}, {"decode_add", 2.86e-10}, {"encode", 6.14e-10}};
  m.codecs["aq8"] = {{"decode", 3.34e-10}, {"decode_add", 2.97e-10}, {"encode", 6.24e-10}};
  m.codecs["bf16"] = {{"decode", 4.38e-10}, {"decode_add", 3.71e-10}, {"encode", 5.13e-10}};
  m.codecs["fft"] = {{"add_spectrum", 1.11e-09}, {"decode", 1.04e-08},    {"decode_add", 1.04e-08},
                     {"encode", 1.74e-08},       {"fft_encode", 1.9e-08}, {"synthesize", 9.74e-09},
                     {"restore_residual", 4.11e-10}};
  m.codecs["fp16"] = {{"decode", 3.46e-10}, {"decode_add", 3.11e-10}, {"encode", 3.83e-10}};
  m.codecs["int16"] = {{"decode", 3.46e-10}, {"decode_add", 5.12e-10}, {"encode", 1.21e-09},
                       {"int_add", 1.7e-10}, {"int_decode", 7.8e-10},  {"int_encode", 1.21e-09}};
  m.codecs["int32"] = {{"decode", 5.31e-10},  {"decode_add", 6.04e-10}, {"encode", 1.18e-09},
                       {"int_add", 3.14e-10}, {"int_decode", 1.54e-09}, {"int_encode", 1.15e-09}};
  m.codecs["int8"] = {{"decode", 3.61e-10},  {"decode_add", 4.41e-10}, {"encode", 1.23e-09},
                      {"int_add", 6.49e-11}, {"int_decode", 8.16e-10}, {"int_encode", 1.23e-09}};
  m.codecs["none"] = {{"decode", 4.92e-10}, {"decode_add", 4.48e-10}, {"encode", 5.83e-10}};
  m.codecs["q1"] = {{"decode", 2.07e-10}, {"decode_add", 1.94e-10}, {"encode", 4.66e-10}};
  m.codecs["q2"] = {{"decode", 3.43e-10}, {"decode_add", 3.32e-10}, {"encode", 6.38e-10}};
  m.codecs["q4"] = {{"decode", 3.74e-10}, {"decode_add", 3.89e-10}, {"encode", 6.32e-10}};
  m.codecs["q8"] = {{"decode", 3.93e-10}, {"decode_add", 3.7e-10}, {"encode", 5.61e-10}};
  m.codecs["sign"] = {{"decode", 2.07e-10},         {"decode_add", 5.04e-09}, {"decode_signs", 4.5e-10},
                      {"encode", 3.17e-10},         {"merge", 5.22e-09},      {"pack", 9.22e-10},
                      {"add_compensation", 7.21e-10}, {"reset_compensation", 5.52e-10}};
  // fft's restore_residual (ef=on) and Marsit's full-precision round (k=1): calibrate --codec
  // "fft:ef=on,sign:eta_s=0.01,k=1", the same machine, 2026-11-29.
  m.sources.push_back("cpu: qccl_sim calibrate on the development machine (2-core VM), 2026-11-26 and -29");
  return m;
}

Model load_model(const std::string& path, const Model& base) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw std::invalid_argument("model file '" + path + "': not a regular file");
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("model file '" + path + "': cannot be read: " + std::strerror(errno));
  Model m = base;
  bool sources_replaced = false;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string where = path + ":" + std::to_string(number);
    const size_t hash = line.find('#');
    const std::string text = trim(line.substr(0, hash));
    if (text.empty()) continue;
    // a codec's canonical spec may hold '=' of its own ("codec.q4:bucket=256.encode = ...")
    const size_t eq = text.rfind("codec.", 0) == 0 ? text.rfind('=') : text.find('=');
    if (eq == std::string::npos) throw std::invalid_argument(where + ": expected 'key = value', got '" + text + "'");
    const std::string key = trim(text.substr(0, eq)), value = trim(text.substr(eq + 1));
    const std::string what = where + ": " + key;
    if (key == "source") {
      if (!sources_replaced) m.sources.clear(), sources_replaced = true;
      m.sources.push_back(value);
      continue;
    }
    try {
      auto link = [&](LinkClass& l, const std::string& field) {
        if (field == "rate")
          l.rate = parse_file_rate(what, value);
        else if (field == "latency")
          l.latency = parse_number(what, value, kMaxLatency);
        else if (field == "burst")
          l.burst = parse_number(what, value);
        else if (field == "efficiency") {
          l.efficiency = parse_number(what, value);
          if (!(l.efficiency > 0 && l.efficiency <= 1))
            throw std::invalid_argument(what + " = " + value + ": an efficiency is in (0, 1]");
        } else
          throw std::invalid_argument(what + ": unknown key (rate, latency, efficiency, burst)");
      };
      static const std::pair<const char*, double Model::*> kCpu[] = {
          {"cpu.post", &Model::post},       {"cpu.wakeup", &Model::wakeup}, {"cpu.wire", &Model::wire},
          {"cpu.message", &Model::message}, {"cpu.copy", &Model::copy},     {"cpu.reduce", &Model::reduce},
          {"cpu.load", &Model::load},       {"cpu.store", &Model::store},   {"cpu.add", &Model::add},
          {"cpu.divide", &Model::divide}};
      bool known = false;
      if (key.rfind("inter.", 0) == 0) {
        link(m.inter, key.substr(6)), known = true;
        if (key == "inter.rate") m.inter_rate_told = true;
      }
      else if (key.rfind("intra.", 0) == 0)
        link(m.intra, key.substr(6)), known = true;
      for (const auto& [name, field] : kCpu)
        if (key == name) m.*field = parse_number(what, value, kMaxSecondsPerValue), known = true;
      if (!known && key.rfind("codec.", 0) == 0) {
        const size_t dot = key.rfind('.');
        const std::string codec = key.substr(6, dot - 6), field = key.substr(dot + 1);
        if (dot <= 6 || codec.empty() || field.empty())
          throw std::invalid_argument(what + ": expected codec.NAME.STEP");
        // a name ("q4", "sign": the costs of every spec of it) or a canonical spec
        if (codec.find(':') == std::string::npos && !kernels::is_codec_name(codec))
          throw std::invalid_argument(what + ": '" + codec + "' is not a codec's name");
        try {
          if (codec.find(':') != std::string::npos) kernels::parse_codec_spec(codec);
        } catch (const kernels::CodecSpecError& e) {
          throw std::invalid_argument(what + ": not a codec spec: " + e.what());
        }
        m.codecs[codec][field] = parse_number(what, value, kMaxSecondsPerValue);
        known = true;
      }
      if (!known) throw std::invalid_argument(what + ": unknown key");
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      throw std::invalid_argument(message.rfind(where, 0) == 0 ? message : where + ": " + message);
    }
  }
  return m;
}

namespace {

// The fewest digits that read back as the same double (six digits wrote 1gibit's 134217728 B/s as
// 1.34218e+08, so a model file read back predicted otherwise).
std::string exact(double v) {
  char text[32];
  const auto written = std::to_chars(text, text + sizeof text, v);
  return std::string(text, written.ptr);
}

}  // namespace

std::string format_model(const Model& m) {
  std::ostringstream out;
  out << "# qccl_sim model (sim/model.h): rates in bytes per second, times in seconds, CPU costs per value\n";
  for (const std::string& s : m.sources) out << "source = " << s << "\n";
  auto link = [&](const char* name, const LinkClass& l, bool rate_told) {
    // A rate the library is not told stays a comment: read back, it would be told (the chunk follows
    // it), and the file would predict otherwise than the model it was written from.
    out << (rate_told ? "" : "# ") << name << ".rate = " << exact(l.rate) << "   # " << describe_rate(l.rate)
        << (rate_told ? "" : " (not told to the library; qccl_sim --link tells it)") << "\n"
        << name << ".latency = " << exact(l.latency) << "\n"
        << name << ".efficiency = " << exact(l.efficiency) << "\n"
        << name << ".burst = " << exact(l.burst) << "\n";
  };
  link("inter", m.inter, m.inter_rate_told);
  link("intra", m.intra, true);
  out << "cpu.post = " << exact(m.post) << "\ncpu.wakeup = " << exact(m.wakeup) << "\ncpu.wire = " << exact(m.wire)
      << "\ncpu.message = " << exact(m.message) << "\ncpu.copy = " << exact(m.copy)
      << "\ncpu.reduce = " << exact(m.reduce) << "\ncpu.load = " << exact(m.load) << "\ncpu.store = " << exact(m.store)
      << "\ncpu.add = " << exact(m.add) << "\ncpu.divide = " << exact(m.divide) << "\n";
  for (const auto& [name, steps] : m.codecs)
    for (const auto& [step, cost] : steps) out << "codec." << name << "." << step << " = " << exact(cost) << "\n";
  return out.str();
}

bool save_model(const Model& model, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  const std::string text = format_model(model);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace qccl::sim
