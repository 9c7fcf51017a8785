#include "src/policy.h"

#include <strings.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "base/errors.h"
#include "base/log.h"
#include "collectives/method.h"

namespace qccl {

namespace {

bool parse_collective(const std::string& name, coll::CollKind* out) {
  for (int k = 0; k < coll::kNumCollKinds; ++k) {
    auto kind = static_cast<coll::CollKind>(k);
    if (!strcasecmp(name.c_str(), coll::coll_name(kind))) {
      *out = kind;
      return true;
    }
  }
  return false;
}

std::string size_text(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace

AlgorithmPolicy::AlgorithmPolicy(const std::string& spec, const std::string& source) : source_(source) {
  const char* from = source.c_str();
  std::set<coll::CollKind> named;  // collectives given as COLLECTIVE=NAME: once each
  // What bare names force, applied after the loop to the collectives no COLLECTIVE=NAME names: an
  // explicit name wins wherever it stands ("allreduce=recursive_doubling,ring" kept ring for AllReduce).
  std::map<coll::CollKind, std::vector<std::string>> bare;  // each name once
  size_t at = 0;
  while (at < spec.size()) {
    size_t comma = spec.find(',', at);
    std::string token = spec.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? spec.size() : comma + 1;
    if (token.empty()) continue;
    size_t eq = token.find('=');
    if (eq == std::string::npos) {  // a bare name applies to every collective that has it
      bool any = false;
      for (const coll::Algorithm& a : coll::algorithms()) {
        if (token != a.name) continue;
        any = true;
        std::vector<std::string>& names = bare[a.collective];
        if (std::find(names.begin(), names.end(), token) == names.end()) names.push_back(token);
      }
      if (!any) fail(qcclInvalidArgument, "%s: no algorithm is named '%s' (qccl_info lists them)", from, token.c_str());
      continue;
    }
    coll::CollKind kind;
    std::string collective = token.substr(0, eq), name = token.substr(eq + 1);
    if (!parse_collective(collective, &kind)) {
      std::string names;
      for (int k = 0; k < coll::kNumCollKinds; ++k)
        names += (k ? ", " : "") + std::string(coll::coll_name(static_cast<coll::CollKind>(k)));
      fail(qcclInvalidArgument, "%s: '%s' is not a collective (%s)", from, collective.c_str(), names.c_str());
    }
    if (!named.insert(kind).second)
      fail(qcclInvalidArgument, "%s: %s is given twice", from, coll::coll_name(kind));
    if (!coll::find_algorithm(kind, name))
      fail(qcclInvalidArgument, "%s: %s has no algorithm named '%s' (qccl_info lists them)", from,
           coll::coll_name(kind), name.c_str());
    forced_[kind] = name;
  }
  for (const auto& [kind, names] : bare) {
    if (named.count(kind)) continue;
    // Two bare names of one collective's algorithms ("ring,hierarchical": AllGather has both) kept the last.
    if (names.size() > 1)
      fail(qcclInvalidArgument, "%s = '%s': '%s' and '%s' both force %s: drop one, or add %s=NAME", from, spec.c_str(),
           names[0].c_str(), names[1].c_str(), coll::coll_name(kind), coll::coll_name(kind));
    forced_[kind] = names[0];
  }
}

const coll::Algorithm& AlgorithmPolicy::choose(const coll::CollArgs& args) const {
  if (auto it = forced_.find(args.kind); it != forced_.end()) {
    const coll::Algorithm* forced = coll::find_algorithm(args.kind, it->second);
    const char* why = forced->cannot_run(args);
    if (!why) return *forced;
    // The user asked for this algorithm, so not getting it is worth a warning, but one per reason: it
    // came once per call, and under QCCL_CODEC=auto once per candidate codec of every call shape.
    bool first;
    {
      std::lock_guard<std::mutex> lock(warned_mutex_);
      first = warned_.emplace(args.kind, why).second;
    }
    if (first)
      QCCL_WARN("%s: forced algorithm %s (%s) declines (%s): such calls run the algorithm chosen by size "
                "(said once per communicator and reason)",
                coll::coll_name(args.kind), forced->name, source_.c_str(), why);
  }
  const size_t bytes = args.message_bytes();
  const coll::Algorithm* fallback = nullptr;
  for (const coll::Algorithm& a : coll::algorithms()) {
    if (a.collective != args.kind || a.cannot_run(args)) continue;
    if (a.default_max_bytes == 0 || bytes <= a.default_max_bytes) return a;
    if (!fallback) fallback = &a;
  }
  if (fallback) return *fallback;
  fail(qcclInternalError, "no algorithm can run %s with %d ranks", coll::coll_name(args.kind), args.nranks);
}

std::string AlgorithmPolicy::forced() const {
  std::string out;
  for (const auto& [kind, name] : forced_)
    out += (out.empty() ? "" : ",") + std::string(coll::coll_name(kind)) + "=" + name;
  return out;
}

std::string AlgorithmPolicy::describe() const {
  std::string out;
  for (int k = 0; k < coll::kNumCollKinds; ++k) {
    auto kind = static_cast<coll::CollKind>(k);
    std::string line = std::string(coll::coll_name(kind)) + ": ";
    if (auto it = forced_.find(kind); it != forced_.end()) {
      line += it->second + " (forced)";
    } else {
      bool first = true;
      for (const coll::Algorithm& a : coll::algorithms()) {
        if (a.collective != kind || !std::strcmp(a.name, "local")) continue;
        line += first ? "" : ", then ";
        line += a.name;
        if (a.default_max_bytes) line += " up to " + size_text(a.default_max_bytes);
        first = false;
      }
    }
    out += (out.empty() ? "" : "; ") + line;
  }
  return out;
}

CodecPolicy::CodecPolicy(const std::string& spec, size_t min_bytes, const std::string& source, int aggregators)
    : min_bytes_(min_bytes) {
  const char* from = source.c_str();
  static const std::pair<const char*, kernels::DataType> kTypes[] = {
      {"float", kernels::DataType::kFloat32}, {"half", kernels::DataType::kFloat16},
      {"bfloat16", kernels::DataType::kBfloat16}};
  size_t at = 0;
  std::set<std::string> named;  // the TYPE of each TYPE=SPEC (and "" for a spec for every type): once each
  std::shared_ptr<kernels::CodecConfig> every_type;  // null for `none`
  bool every_type_given = false;
  while (at < spec.size()) {
    const size_t semi = spec.find(';', at);
    const std::string entry = spec.substr(at, semi == std::string::npos ? std::string::npos : semi - at);
    at = semi == std::string::npos ? spec.size() : semi + 1;
    if (entry.empty()) continue;
    std::string codec_spec = entry;
    std::vector<kernels::DataType> types;
    const size_t eq = entry.find('='), colon = entry.find(':');
    const bool typed = eq != std::string::npos && (colon == std::string::npos || eq < colon);  // TYPE=SPEC
    if (typed) {
      const std::string type = entry.substr(0, eq);
      for (const auto& [name, t] : kTypes)
        if (type == name) types.push_back(t);
      if (types.empty())
        fail(qcclInvalidArgument, "%s: '%s' is not a datatype codecs take (float, half, bfloat16)", from, type.c_str());
      codec_spec = entry.substr(eq + 1);
      if (!named.insert(type).second) fail(qcclInvalidArgument, "%s: '%s' is given twice", from, type.c_str());
    } else {
      for (const auto& type : kTypes) types.push_back(type.second);
      if (!named.insert("").second) fail(qcclInvalidArgument, "%s: two specs for every datatype", from);
    }
    std::shared_ptr<kernels::CodecConfig> codec;
    try {
      codec = std::make_shared<kernels::CodecConfig>(kernels::parse_codec_spec(codec_spec));
    } catch (const kernels::CodecSpecError& e) {
      fail(qcclInvalidArgument, "%s: %s", from, e.what());
    }
    // `none` leaves the types it names exact (as the drop-in's QCCL_NCCL_CODEC does): compressing
    // with it would only widen half and bfloat16 to float32 on the wire.
    if (codec->kind == kernels::CodecKind::kNone) codec.reset();
    // The codec's method must accept a plain all-reduce without a state (error feedback, Marsit and
    // an adaptive IntSGD alpha keep one): refused here, at communicator creation.
    const coll::Method* method = codec ? coll::method_for(*codec) : nullptr;
    coll::CollArgs plain;
    plain.kind = coll::CollKind::kAllReduce, plain.count = 1, plain.nranks = 2, plain.codec = codec.get();
    plain.dtype = types.front(), plain.op = kernels::RedOp::kSum;
    if (codec && !method) fail(qcclInvalidArgument, "%s: '%s' has no method", from, codec_spec.c_str());
    if (auto refusal = codec ? method->refuse(plain, nullptr, aggregators) : std::nullopt)
      fail(qcclInvalidArgument, "%s: '%s' cannot compress plain qcclAllReduce calls: %s", from, codec_spec.c_str(),
           refusal->message.c_str());
    if (typed)
      by_type_[types.front()] = codec;
    else
      every_type = codec, every_type_given = true;
  }
  if (every_type_given)  // the types no TYPE=SPEC names, wherever it stands
    for (const auto& type : kTypes) by_type_.emplace(type.second, every_type);
}

const kernels::CodecConfig* CodecPolicy::choose(const coll::CollArgs& args) const {
  if (args.kind != coll::CollKind::kAllReduce || args.codec) return nullptr;
  if (args.op != kernels::RedOp::kSum && args.op != kernels::RedOp::kAvg) return nullptr;
  if (args.message_bytes() < min_bytes_) return nullptr;
  auto it = by_type_.find(args.dtype);
  return it == by_type_.end() ? nullptr : it->second.get();
}

std::string CodecPolicy::describe() const {
  if (by_type_.empty()) return "off";
  std::string out;
  for (const auto& [type, codec] : by_type_)
    out += (out.empty() ? "" : ", ") + std::string(kernels::data_type_name(type)) + " " +
           (codec ? codec->canonical() : std::string("exact"));
  return out + " from " + std::to_string(min_bytes_) + " bytes";
}

}  // namespace qccl
