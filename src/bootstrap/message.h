// Bootstrap wire format. Every message is a fixed 20-byte header followed by `length` bytes of
// payload. All integers are big-endian (network order) on the wire, so ranks of any byte order
// agree; the in-memory MsgHeader holds host-order values.
//
//   offset size field
//        0    4 magic            kMsgMagic ("ANYB")
//        4    2 version          kMsgProtocolVersion
//        6    2 type             MsgType
//        8    4 sender rank      < nranks
//       12    4 nranks           in [1, kMsgMaxRanks]
//       16    4 payload length   <= kMsgMaxPayload
//
// parseHeader is pure (no I/O, no allocation beyond the error text) so it can be fuzzed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"

namespace anyr {

constexpr uint32_t kMsgMagic = 0x414e5942u;  // "ANYB"
constexpr uint16_t kMsgProtocolVersion = 1;
constexpr size_t kMsgHeaderBytes = 20;
constexpr uint32_t kMsgMaxRanks = 4096;
// Largest payload of one message, GATHER_ALL included: 64 MiB. The bootstrap carries setup
// data (handles, topology), never tensors.
constexpr uint32_t kMsgMaxPayload = 64u << 20;
// Largest REJECT/ABORT payload (code + reason text) a receiver accepts.
constexpr uint32_t kMsgMaxReason = 64u << 10;

enum class MsgType : uint16_t {
  kHello = 1,      // rank -> 0: payload = the unique id's secret (kUniqueIdSecretBytes)
  kWelcome = 2,    // 0 -> rank: every rank arrived; empty payload
  kReject = 3,     // 0 -> connecting peer: payload = reason (see encodeReason); then closed
  kGather = 4,     // rank -> 0: payload = this rank's allGather contribution
  kGatherAll = 5,  // 0 -> rank: payload = every rank's contribution, in rank order
  kAbort = 6,      // 0 -> rank: the operation failed; payload = reason (see encodeReason)
};

struct MsgHeader {
  uint32_t magic = kMsgMagic;
  uint16_t version = kMsgProtocolVersion;
  uint16_t type = 0;
  uint32_t rank = 0;
  uint32_t nranks = 0;
  uint32_t length = 0;
};

// "HELLO", "WELCOME", ...; "unknown" for other values.
const char* msgTypeName(uint16_t type);

// Writes the 20 wire bytes of `h` (no validation: tests use it to forge bad headers).
void encodeHeader(const MsgHeader& h, uint8_t out[kMsgHeaderBytes]);

// Decodes and validates a header from the first kMsgHeaderBytes of `data`: enough bytes,
// magic, version, known type, nranks in [1, kMsgMaxRanks], rank < nranks, length <=
// kMsgMaxPayload. On failure returns false and a one-line reason in *error (if non-null);
// *out is then unspecified.
bool parseHeader(const uint8_t* data, size_t len, MsgHeader* out, std::string* error);

// REJECT and ABORT payloads: a 4-byte result code (anyrResult_t) then the reason text (not
// NUL-terminated), truncated to fit kMsgMaxReason.
std::vector<uint8_t> encodeReason(anyrResult_t code, const std::string& text);
// Returns false for a payload too short or with an out-of-range code.
bool parseReason(const uint8_t* data, size_t len, anyrResult_t* code, std::string* text);

}  // namespace anyr
