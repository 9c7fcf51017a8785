// The registry of compression methods (collectives/method.h): one line per method.
#include "collectives/method.h"

namespace qccl::coll {

const Method& quantized_method();  // quantized_method.cc
const Method& marsit_method();     // marsit_method.cc
const Method& intsgd_method();     // intsgd_method.cc
const Method& fft_method();        // fft_method.cc

const std::vector<const Method*>& methods() {
  static const std::vector<const Method*> list = {&quantized_method(), &marsit_method(), &intsgd_method(), &fft_method()};
  return list;
}

const Method* method_for(const kernels::CodecConfig& codec) {
  for (const Method* m : methods())
    if (m->serves(codec)) return m;
  return nullptr;
}

const Method* find_method(const std::string& name) {
  for (const Method* m : methods())
    if (name == m->name()) return m;
  return nullptr;
}

}  // namespace qccl::coll
