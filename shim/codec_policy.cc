#include "shim/codec_policy.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "shim/shim.h"

namespace qccl_nccl {

namespace {

// A size by the core's grammar, mirrored from base/config.cc's parse_size (the shim sees only the public
// API): decimal digits with K, M or G (k, m, g; KiB, MiB, GiB), powers of 1024.
size_t parse_size(const char* name, const char* value) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(value, &end, 10);
  // strtoull skips blanks and negates after them: " -1" would be 2^64 - 1.
  if (!*value || std::strchr(value, '-') || end == value || errno == ERANGE)
    fail(ncclInvalidArgument, "%s = '%s' is not a size (e.g. 524288, 512K, 4M, 1G)", name, value);
  unsigned long long mult = 1;
  const std::string suffix(end);
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mult = 1ull << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    mult = 1ull << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    mult = 1ull << 30;
  else if (!suffix.empty())
    fail(ncclInvalidArgument, "%s = '%s' has an unknown suffix '%s' (use K, M or G)", name, value, suffix.c_str());
  if (n > ~0ull / mult) fail(ncclInvalidArgument, "%s = '%s' is too large", name, value);
  return static_cast<size_t>(n * mult);
}

std::string method_of(const std::string& spec) {
  std::string name = spec.substr(0, spec.find(':'));
  if (name.size() == 2 && name[0] == 'q' && name[1] >= '1' && name[1] <= '8') return "q";
  if (name == "int8" || name == "int16" || name == "int32") return "int";
  if (name.size() == 3 && name[0] == 'a' && name[1] == 'q') return "aq";
  return name;
}

}  // namespace

std::unique_ptr<CodecPolicy> CodecPolicy::from_env() {
  std::unique_ptr<CodecPolicy> p(new CodecPolicy);
  // Read whether or not QCCL_NCCL_CODEC is set, as the core reads its variables: a bad value fails the
  // communicator's creation, not a later run that sets the codec.
  if (const char* v = std::getenv("QCCL_NCCL_CODEC_MIN_BYTES"); v && *v)
    p->min_bytes_ = parse_size("QCCL_NCCL_CODEC_MIN_BYTES", v);
  if (const char* v = std::getenv("QCCL_NCCL_CODEC_STATE_BUDGET"); v && *v)
    p->state_budget_ = parse_size("QCCL_NCCL_CODEC_STATE_BUDGET", v);
  const char* env = std::getenv("QCCL_NCCL_CODEC");
  if (!env || !*env || !std::strcmp(env, "none")) return nullptr;
  std::string spec = env;
  // As QCCL_CODEC reads it (src/policy.cc): each TYPE once, one spec for every type ("" in `named`),
  // which serves the types no TYPE=SPEC names, wherever it stands.
  std::set<std::string> named;
  std::set<const Entry*> typed;
  size_t at = 0;
  while (at < spec.size()) {
    const size_t semi = spec.find(';', at);
    std::string item = spec.substr(at, semi == std::string::npos ? std::string::npos : semi - at);
    at = semi == std::string::npos ? spec.size() : semi + 1;
    if (item.empty()) continue;
    std::vector<Entry*> targets;
    const size_t eq = item.find('='), colon = item.find(':');
    if (eq != std::string::npos && (colon == std::string::npos || eq < colon)) {  // TYPE=SPEC
      const std::string type = item.substr(0, eq);
      if (type == "float") targets = {&p->float_};
      else if (type == "half") targets = {&p->half_};
      else if (type == "bfloat16") targets = {&p->bfloat16_};
      else
        fail(ncclInvalidArgument, "QCCL_NCCL_CODEC = '%s': '%s' is not a datatype codecs take (float, half, bfloat16)",
             env, type.c_str());
      if (!named.insert(type).second)
        fail(ncclInvalidArgument, "QCCL_NCCL_CODEC = '%s': '%s' is given twice", env, type.c_str());
      typed.insert(targets.front());
      item = item.substr(eq + 1);
    } else {
      if (!named.insert("").second)
        fail(ncclInvalidArgument, "QCCL_NCCL_CODEC = '%s': two specs for every datatype", env);
      for (Entry* e : {&p->float_, &p->half_, &p->bfloat16_})
        if (!typed.count(e)) targets.push_back(e);
    }
    // auto is QCCL_CODEC's choice per plain qcclAllReduce call, not a codec that qcclCodecCreate
    // makes (it would say "unknown codec 'auto'"): the policy needs one codec per datatype.
    if (method_of(item) == "auto")
      fail(ncclInvalidArgument, "QCCL_NCCL_CODEC = '%s': the drop-in does not take auto; name a codec such as q8",
           env);
    if (method_of(item) == "aq")  // else every compressed call would fail as it runs
      fail(ncclInvalidArgument, "QCCL_NCCL_CODEC = '%s': the aq codecs are AQ-SGD's point-to-point quantizer, which "
           "no collective takes", env);
    auto make = [&]() -> qcclCodec_t {  // nullptr for none: that type stays exact
      qcclCodec_t codec = nullptr;
      if (item != "none" && qcclCodecCreate(item.c_str(), &codec) != qcclSuccess)
        fail(ncclInvalidArgument, "QCCL_NCCL_CODEC = '%s': %s", env, qcclGetLastError(nullptr));
      return codec;
    };
    if (targets.empty()) {  // a spec for every type that TYPE=SPECs left no type: checked all the same
      if (qcclCodec_t codec = make()) qcclCodecDestroy(codec);
    }
    for (Entry* e : targets) {  // a TYPE=SPEC replaces the spec for every type before it
      qcclCodec_t codec = make();
      if (e->codec) qcclCodecDestroy(e->codec);
      *e = codec ? Entry{codec, item, method_of(item)} : Entry{};
    }
  }
  if (!p->float_.codec && !p->half_.codec && !p->bfloat16_.codec) return nullptr;
  return p;
}

CodecPolicy::~CodecPolicy() {
  for (Entry* e : {&float_, &half_, &bfloat16_})
    if (e->codec) qcclCodecDestroy(e->codec);
}

const CodecPolicy::Entry* CodecPolicy::entry(ncclDataType_t type) const {
  switch (type) {
    case ncclFloat32: return float_.codec ? &float_ : nullptr;
    case ncclFloat16: return half_.codec ? &half_ : nullptr;
    case ncclBfloat16: return bfloat16_.codec ? &bfloat16_ : nullptr;
    default: return nullptr;
  }
}

const std::string& CodecPolicy::spec_for(ncclDataType_t type) const {
  static const std::string kNone = "none";
  const Entry* e = entry(type);
  return e ? e->spec : kNone;
}

// Which calls a codec can serve (qccl.h, "Compressed collectives"): every codec all-reduces sum and
// avg; Marsit's sign codec only a float32 average; the int and fft codecs all-reduces only; the
// all-gather and reduce-scatter take the q, fp16, bf16 and none codecs.
qcclCodec_t CodecPolicy::codec_for(CollKind kind, ncclDataType_t type, ncclRedOp_t op, size_t bytes,
                                   const char** why) const {
  const Entry* e = entry(type);
  if (!e) return *why = "no codec for the datatype", nullptr;
  if (bytes < min_bytes_) return *why = "below QCCL_NCCL_CODEC_MIN_BYTES", nullptr;
  // (Even with QCCL_NCCL_CODEC_MIN_BYTES=0: a codec state holds at least one value.)
  if (bytes == 0) return *why = "no values", nullptr;
  const bool reduces = kind != CollKind::kAllGather;
  if (reduces && op != ncclSum && op != ncclAvg) return *why = "the op is neither sum nor avg", nullptr;
  if (e->method == "sign" && (kind != CollKind::kAllReduce || type != ncclFloat32 || op != ncclAvg))
    return *why = "the sign codec takes float32 average all-reduces only", nullptr;
  if (e->method == "int" && kind != CollKind::kAllReduce)
    return *why = "the int codecs take all-reduces only", nullptr;
  if (e->method == "fft" && kind != CollKind::kAllReduce)
    return *why = "the fft codec takes all-reduces only", nullptr;
  return e->codec;
}

std::string CodecPolicy::describe() const {
  std::string out;
  if (float_.codec) out += "float=" + float_.spec;
  if (half_.codec) out += (out.empty() ? "" : ";") + std::string("half=") + half_.spec;
  if (bfloat16_.codec) out += (out.empty() ? "" : ";") + std::string("bfloat16=") + bfloat16_.spec;
  return out + " from " + std::to_string(min_bytes_) + " bytes";
}

}  // namespace qccl_nccl
