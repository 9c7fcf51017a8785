// Splitting a --codec list: specs contain commas of their own (q8:bucket=256,round=stochastic), so a
// piece that is key=value (an '=' with no ':' before it) continues the spec before it, and any other
// piece starts a new one: "q8:bucket=256,q4,sign:eta_s=0.1,topology=torus:2x2" is three specs.
#pragma once

#include <string>
#include <vector>

namespace qccl_perf {

// The specs of `list` in order; an empty piece comes back as an empty spec (the caller refuses it).
inline std::vector<std::string> split_codec_list(const std::string& list) {
  std::vector<std::string> specs;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = list.find(',', at) == std::string::npos ? list.size() : list.find(',', at);
    const std::string piece = list.substr(at, comma - at);
    at = comma + 1;
    const size_t eq = piece.find('=');
    const bool continues = eq != std::string::npos && piece.find(':') > eq;
    if (continues && !specs.empty() && !specs.back().empty())
      specs.back() += "," + piece;
    else
      specs.push_back(piece);
  }
  return specs;
}

}  // namespace qccl_perf
