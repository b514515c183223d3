// Bootstrap wire format. Every message is a fixed 20-byte header followed by `length` bytes of
// payload and, for the authenticated types (msgTypeAuthenticated), a kMacBytes MAC of the
// header and payload (bootstrap/auth.h says how it is keyed). All integers are big-endian
// (network order) on the wire, so ranks of any byte order agree; the in-memory MsgHeader holds
// host-order values.
//
//   offset size field
//        0    4 magic            kMsgMagic ("ANYB")
//        4    2 version          kMsgProtocolVersion
//        6    2 type             MsgType
//        8    4 sender rank      < nranks
//       12    4 nranks           in [1, kMsgMaxRanks]
//       16    4 payload length   <= kMsgMaxPayload (the MAC, where there is one, not counted)
//
// The handshake (HELLO, CHALLENGE, PROOF) has payloads of fixed length (handshakePayloadBytes)
// and no trailing MAC: CHALLENGE and PROOF are MACs themselves. REJECT has no MAC either: rank 0
// sends it only to connections that have not proven the secret, so a rank treats it as
// unauthenticated. Everything else carries the MAC.
//
// parseHeader and parseHandshake are pure (no I/O, no allocation beyond the error text) so they
// can be fuzzed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"

namespace anyr {

constexpr uint32_t kMsgMagic = 0x414e5942u;  // "ANYB"
// 2: mutual challenge-response and a MAC on every later message (1 sent the secret in HELLO).
constexpr uint16_t kMsgProtocolVersion = 2;
constexpr size_t kMsgHeaderBytes = 20;
constexpr uint32_t kMsgMaxRanks = 4096;
// Largest payload of one message, GATHER_ALL included: 64 MiB. The bootstrap carries setup
// data (handles, topology), never tensors.
constexpr uint32_t kMsgMaxPayload = 64u << 20;
// Largest REJECT/ABORT payload (code + reason text) a receiver accepts.
constexpr uint32_t kMsgMaxReason = 64u << 10;
// Sizes of the handshake's nonces and of every MAC (HMAC-SHA-256).
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;

enum class MsgType : uint16_t {
  kHello = 1,      // rank -> 0: payload = the rank's nonce (kNonceBytes); nothing secret
  kWelcome = 2,    // 0 -> rank, MAC: every rank arrived; empty payload
  kReject = 3,     // 0 -> a connection not (yet) authenticated: payload = reason (encodeReason);
                   // no MAC; then closed
  kGather = 4,     // rank -> 0, MAC: payload = this rank's allGather contribution
  kGatherAll = 5,  // 0 -> rank, MAC: payload = every rank's contribution, in rank order
  kAbort = 6,      // 0 -> rank, MAC: the operation failed; payload = reason (encodeReason)
  kChallenge = 7,  // 0 -> rank: payload = rank 0's nonce, then its challenge MAC
  kProof = 8,      // rank -> 0: payload = the rank's proof MAC
};
constexpr uint16_t kMsgTypeFirst = 1;
constexpr uint16_t kMsgTypeLast = 8;

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

// Whether messages of this type carry a trailing MAC (WELCOME, GATHER, GATHER_ALL, ABORT).
bool msgTypeAuthenticated(uint16_t type);

// The payload length a handshake message must have (HELLO: kNonceBytes, CHALLENGE: kNonceBytes
// + kMacBytes, PROOF: kMacBytes); 0 for the other types.
size_t handshakePayloadBytes(uint16_t type);

// Writes the 20 wire bytes of `h` (no validation: tests use it to forge bad headers).
void encodeHeader(const MsgHeader& h, uint8_t out[kMsgHeaderBytes]);

// Decodes and validates a header from the first kMsgHeaderBytes of `data`: enough bytes,
// magic, version, known type, nranks in [1, kMsgMaxRanks], rank < nranks, length <=
// kMsgMaxPayload. On failure returns false and a one-line reason in *error (if non-null);
// *out is then unspecified.
bool parseHeader(const uint8_t* data, size_t len, MsgHeader* out, std::string* error);

// The fields of a handshake payload; those its type does not carry are left zero.
struct HandshakeFields {
  uint8_t nonce[kNonceBytes] = {};  // HELLO, CHALLENGE
  uint8_t mac[kMacBytes] = {};      // CHALLENGE, PROOF
};

// Checks that `h` is a HELLO, CHALLENGE or PROOF whose length is its type's
// (handshakePayloadBytes) and that `len` bytes of `payload` are exactly that payload, and
// splits it. On failure returns false and a one-line reason in *error (if non-null).
bool parseHandshake(const MsgHeader& h, const uint8_t* payload, size_t len, HandshakeFields* out,
                    std::string* error);

// REJECT and ABORT payloads: a 4-byte result code (anyrResult_t) then the reason text (not
// NUL-terminated), truncated to fit kMsgMaxReason.
std::vector<uint8_t> encodeReason(anyrResult_t code, const std::string& text);
// Returns false for a payload too short or with an out-of-range code.
bool parseReason(const uint8_t* data, size_t len, anyrResult_t* code, std::string* text);

}  // namespace anyr
