// libFuzzer target for everything qccl parses from the network: frame headers, the bootstrap's peer
// information and unique ids. Each parser must either accept the bytes or throw qccl::Error; any
// crash, hang or sanitizer report is a bug. Built with clang (-DQCCL_FUZZ=ON); tools/fuzz.sh runs it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/errors.h"
#include "src/bootstrap.h"
#include "src/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  ++data, --size;
  try {
    switch (selector % 3) {
      case 0: {
        qccl::FrameHeader h = qccl::FrameHeader::decode(data, size, "fuzz");
        uint8_t again[qccl::FrameHeader::kBytes];
        h.encode(again);  // what decodes must re-encode to the same header
        qccl::FrameHeader back = qccl::FrameHeader::decode(again, sizeof(again), "fuzz");
        if (!qccl::frame_mismatch(h, back).empty()) __builtin_trap();
        break;
      }
      case 1:
        qccl::PeerInfo::parse(std::vector<uint8_t>(data, data + size), 0);
        break;
      case 2: {
        qcclUniqueId id;
        std::memset(&id, 0, sizeof(id));
        std::memcpy(id.internal, data, size < sizeof(id.internal) ? size : sizeof(id.internal));
        qccl::decode_unique_id(id);
        break;
      }
    }
  } catch (const qccl::Error&) {
    // Rejected with a message: the expected outcome for most inputs.
  }
  return 0;
}
