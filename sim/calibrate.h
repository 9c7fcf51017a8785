// `qccl_sim calibrate`: this machine's CPU costs per step kind and per codec, measured with the
// kernels the host executor runs (the same calls, on one core, buffers larger than the caches).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "sim/model.h"

namespace qccl::sim {

struct CalibrateOptions {
  size_t values = size_t{1} << 22;  // per measurement (16 MiB of float32)
  int repeats = 5;                  // the median is kept
  std::vector<std::string> codecs;  // specs; empty: kDefaultCalibrationCodecs
};

// Codec specs measured by default: every codec family at its common settings.
extern const char* const kDefaultCalibrationCodecs[];

// Replaces model's CPU costs with measured ones (links untouched), logging each to `log` (may be
// null). A codec is stored under its name when its spec is the name alone ("q8"), else under its
// canonical spec. Throws std::invalid_argument for a spec that does not parse.
void calibrate(Model* model, const CalibrateOptions& options, std::ostream* log);

}  // namespace qccl::sim
