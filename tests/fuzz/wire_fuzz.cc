// libFuzzer target for everything qccl parses from the network: frame headers, the bootstrap's peer
// information and unique ids, the fft codec's variable-length payloads, and AQ-SGD's delta-store
// messages (crafted, and real ones with bytes changed). Each parser must either accept the bytes or throw qccl::Error (the fft decoder instead
// decodes what it rejects to NaN; the delta store throws its DeltaStoreError and stays as it was);
// any crash, hang or sanitizer report is a bug. Built with clang (-DQCCL_FUZZ=ON); tools/fuzz.sh runs it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/errors.h"
#include "collectives/aqsgd_store.h"
#include "kernels/codec.h"
#include "kernels/fft_sparse.h"
#include "src/bootstrap.h"
#include "src/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  ++data, --size;
  try {
    switch (selector % 6) {
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
      case 3: {
        // An fft payload: the first segment's header gets the right magic, length and hash (what
        // the fuzzer would take long to guess), its flags and count and everything after come from
        // the input, which also chooses the run's length (several segments of 64 or fewer).
        static const qccl::kernels::CodecConfig codec = qccl::kernels::parse_codec_spec("fft:theta=0.5,bits=10,segment=64");
        if (size < 7) break;
        const size_t count = 1 + data[0] % 200;
        std::vector<uint8_t> payload(qccl::kernels::kFftHeaderBytes + size - 7);
        const uint16_t magic = 0x5146;
        const uint32_t length = count < 64 ? static_cast<uint32_t>(count) : 64, hash = static_cast<uint32_t>(codec.hash());
        std::memcpy(payload.data(), &magic, 2);
        std::memcpy(payload.data() + 2, data + 1, 2);  // flags
        std::memcpy(payload.data() + 4, &length, 4);
        std::memcpy(payload.data() + 8, data + 3, 4);  // count
        std::memcpy(payload.data() + 12, &hash, 4);
        std::memcpy(payload.data() + 16, data + 7, size - 7);
        auto ws = qccl::kernels::take_fft_workspace();
        std::vector<float> spectrum(qccl::kernels::fft_spectrum_floats(codec, count)), out(count);
        qccl::kernels::fft_decode_spectrum(codec, payload.data(), payload.size(), count, spectrum.data(), false, *ws);
        qccl::kernels::fft_decode(codec, payload.data(), payload.size(), count, out.data(), true, *ws);
        break;
      }
      case 4: {
        // A delta-store message for a receiver that holds keys 1..3: the header's identity (magic,
        // version, store id, sequence, keys and configuration hashes: what the fuzzer would take long
        // to guess) from a real message; its counts, payload length, flags and body from the input.
        using qccl::coll::DeltaStore;
        static DeltaStore::Config config = [] {
          DeltaStore::Config c;
          c.codec = qccl::kernels::parse_codec_spec("aq3:channels=4,rows=2");
          c.row_values = 16;
          return c;
        }();
        static const uint64_t keys[] = {1, 2, 3};
        static std::vector<uint8_t> checkpoint, templ;
        if (templ.empty()) {
          DeltaStore sender(config), receiver(config);
          std::vector<float> x(48, 0.5f), out(48);
          std::vector<uint8_t> msg(sender.max_message_bytes(3));
          receiver.receive(msg.data(), sender.send(x.data(), keys, 3, {}, msg.data()), keys, 3, out.data());
          checkpoint = receiver.save();
          templ.assign(msg.begin(), msg.begin() + static_cast<long>(DeltaStore::header_bytes()));
        }
        DeltaStore receiver(config);
        receiver.load(checkpoint.data(), checkpoint.size());
        std::vector<uint8_t> message = templ;
        message[16] = 1;  // the sequence number the receiver expects next
        message[6] = size ? data[0] : 0;  // flags
        const size_t counts = std::min<size_t>(size > 1 ? size - 1 : 0, 16);
        if (counts) std::memcpy(message.data() + 48, data + 1, counts);  // evicted, full, payload length
        if (size > 17) message.insert(message.end(), data + 17, data + size);
        std::vector<float> out(48);
        try {
          receiver.receive(message.data(), message.size(), keys, 3, out.data());
        } catch (const qccl::coll::DeltaStoreError&) {
          if (receiver.save() != checkpoint) __builtin_trap();  // a refused message changed the store
        }
        break;
      }
      case 5: {
        // A real delta message (deltas for keys 1..3, a section each, to a receiver that applied the
        // message before it) with bytes overwritten from the input, (16-bit offset, value) triples:
        // near-valid messages that reach the sections' checks and their apply.
        using qccl::coll::DeltaStore;
        static DeltaStore::Config config = [] {
          DeltaStore::Config c;
          c.codec = qccl::kernels::parse_codec_spec("aq3:channels=4");
          c.row_values = 1024;
          return c;
        }();
        static const uint64_t keys[] = {1, 2, 3};
        static std::vector<uint8_t> checkpoint, templ;
        if (templ.empty()) {
          DeltaStore sender(config), receiver(config);
          if (sender.sections(3) != 3) __builtin_trap();  // the message this case is about
          std::vector<float> x(3 * 1024), out(x.size());
          for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i % 7);
          std::vector<uint8_t> msg(sender.max_message_bytes(3));
          receiver.receive(msg.data(), sender.send(x.data(), keys, 3, {}, msg.data()), keys, 3, out.data());
          checkpoint = receiver.save();
          for (float& v : x) v += 0.01f;
          templ.assign(msg.begin(), msg.begin() + static_cast<long>(sender.send(x.data(), keys, 3, {}, msg.data())));
        }
        DeltaStore receiver(config);
        receiver.load(checkpoint.data(), checkpoint.size());
        std::vector<uint8_t> message = templ;
        for (size_t i = 0; i + 2 < size; i += 3) message[(data[i] | data[i + 1] << 8) % message.size()] = data[i + 2];
        if (size % 3) message.resize(message.size() - data[size - 1] % 8);  // and a shorter message
        std::vector<float> out(3 * 1024);
        try {
          receiver.receive(message.data(), message.size(), keys, 3, out.data());
        } catch (const qccl::coll::DeltaStoreError&) {
          if (receiver.save() != checkpoint) __builtin_trap();  // a refused message changed the store
        }
        break;
      }
    }
  } catch (const qccl::Error&) {
    // Rejected with a message: the expected outcome for most inputs.
  }
  return 0;
}
