#include "bootstrap/message.h"

#include <algorithm>
#include <cstdio>

#include "base/names.h"
#include "bootstrap/byte_order.h"

namespace anyr {

const char* msgTypeName(uint16_t type) {
  static constexpr Named<MsgType> kNames[] = {
      {MsgType::kHello, "HELLO"},          {MsgType::kWelcome, "WELCOME"},
      {MsgType::kReject, "REJECT"},        {MsgType::kGather, "GATHER"},
      {MsgType::kGatherAll, "GATHER_ALL"}, {MsgType::kAbort, "ABORT"},
      {MsgType::kChallenge, "CHALLENGE"},  {MsgType::kProof, "PROOF"}};
  return nameOf(kNames, static_cast<MsgType>(type), "unknown");
}

bool msgTypeAuthenticated(uint16_t type) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::kWelcome:
    case MsgType::kGather:
    case MsgType::kGatherAll:
    case MsgType::kAbort:
      return true;
    default:
      return false;
  }
}

size_t handshakePayloadBytes(uint16_t type) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::kHello:
      return kNonceBytes;
    case MsgType::kChallenge:
      return kNonceBytes + kMacBytes;
    case MsgType::kProof:
      return kMacBytes;
    default:
      return 0;
  }
}

void encodeHeader(const MsgHeader& h, uint8_t out[kMsgHeaderBytes]) {
  putU32(out + 0, h.magic);
  putU16(out + 4, h.version);
  putU16(out + 6, h.type);
  putU32(out + 8, h.rank);
  putU32(out + 12, h.nranks);
  putU32(out + 16, h.length);
}

static bool fail(std::string* error, const std::string& why) {
  if (error != nullptr) *error = why;
  return false;
}

static std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

bool parseHeader(const uint8_t* data, size_t len, MsgHeader* out, std::string* error) {
  if (data == nullptr || len < kMsgHeaderBytes) {
    return fail(error, "truncated header: " + std::to_string(data == nullptr ? 0 : len) + " of " +
                           std::to_string(kMsgHeaderBytes) + " bytes");
  }
  MsgHeader h;
  h.magic = getU32(data + 0);
  h.version = getU16(data + 4);
  h.type = getU16(data + 6);
  h.rank = getU32(data + 8);
  h.nranks = getU32(data + 12);
  h.length = getU32(data + 16);
  if (h.magic != kMsgMagic) {
    return fail(error, "bad magic " + hex32(h.magic) + " (not an anyreduce bootstrap message)");
  }
  if (h.version != kMsgProtocolVersion) {
    return fail(error, "protocol version " + std::to_string(h.version) + ", expected " +
                           std::to_string(kMsgProtocolVersion) +
                           " (are all ranks running the same anyreduce?)");
  }
  if (h.type < kMsgTypeFirst || h.type > kMsgTypeLast) {
    return fail(error, "unknown message type " + std::to_string(h.type));
  }
  if (h.nranks < 1 || h.nranks > kMsgMaxRanks) {
    return fail(error, "nranks " + std::to_string(h.nranks) + " outside [1, " +
                           std::to_string(kMsgMaxRanks) + "]");
  }
  if (h.rank >= h.nranks) {
    return fail(error, "rank " + std::to_string(h.rank) + " out of range for " +
                           std::to_string(h.nranks) + " ranks");
  }
  if (h.length > kMsgMaxPayload) {
    return fail(error, "payload length " + std::to_string(h.length) + " exceeds the maximum " +
                           std::to_string(kMsgMaxPayload));
  }
  if (out != nullptr) *out = h;
  return true;
}

bool parseHandshake(const MsgHeader& h, const uint8_t* payload, size_t len, HandshakeFields* out,
                    std::string* error) {
  const size_t want = handshakePayloadBytes(h.type);
  if (want == 0) {
    return fail(error, std::string(msgTypeName(h.type)) + " is not a handshake message");
  }
  if (h.length != want) {
    return fail(error, "malformed " + std::string(msgTypeName(h.type)) + ": payload of " +
                           std::to_string(h.length) + " bytes, expected " + std::to_string(want));
  }
  if (payload == nullptr || len != want) {
    return fail(error, "truncated " + std::string(msgTypeName(h.type)) + ": " +
                           std::to_string(payload == nullptr ? 0 : len) + " of " +
                           std::to_string(want) + " payload bytes");
  }
  HandshakeFields f;
  switch (static_cast<MsgType>(h.type)) {
    case MsgType::kHello:
      std::copy(payload, payload + kNonceBytes, f.nonce);
      break;
    case MsgType::kChallenge:
      std::copy(payload, payload + kNonceBytes, f.nonce);
      std::copy(payload + kNonceBytes, payload + kNonceBytes + kMacBytes, f.mac);
      break;
    default:  // PROOF
      std::copy(payload, payload + kMacBytes, f.mac);
      break;
  }
  if (out != nullptr) *out = f;
  return true;
}

std::vector<uint8_t> encodeReason(anyrResult_t code, const std::string& text) {
  size_t n = std::min<size_t>(text.size(), kMsgMaxReason - 4);
  std::vector<uint8_t> out(4 + n);
  putU32(out.data(), static_cast<uint32_t>(code));
  std::copy(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(n), out.begin() + 4);
  return out;
}

bool parseReason(const uint8_t* data, size_t len, anyrResult_t* code, std::string* text) {
  if (data == nullptr || len < 4 || len > kMsgMaxReason) return false;
  uint32_t c = getU32(data);
  if (c == anyrSuccess || c >= anyrNumResults) return false;
  *code = static_cast<anyrResult_t>(c);
  text->assign(reinterpret_cast<const char*>(data) + 4, len - 4);
  return true;
}

}  // namespace anyr
