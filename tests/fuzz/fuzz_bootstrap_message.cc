// libFuzzer target: everything the bootstrap decodes from bytes another process sent or the user
// copied: the 20-byte message header (parseHeader), the handshake's payloads (parseHandshake:
// HELLO, CHALLENGE, PROOF), the MAC'd envelope of every later message (openMessage),
// REJECT/ABORT reasons (parseReason) and the unique id (decodeUniqueId). Properties checked
// beyond "no crash, no sanitizer report":
//  - an accepted header has in-range fields and re-encodes to the same 20 bytes;
//  - a rejected header always comes with a reason;
//  - a handshake payload is accepted exactly when its header is a handshake type with its
//    fixed length and the bytes are that long, and then splits into the same bytes;
//  - no input opens as an authenticated message under the fuzzer's fixed session key unless it
//    is exactly what sealMessage makes (so: only inputs seeded as sealed messages), and a
//    payload taken from the input, sealed, opens to the same header and payload, but not under
//    the next sequence number, the other direction, or with any one byte changed;
//  - an accepted reason has a valid, non-success code;
//  - an accepted unique id re-encodes to an id that decodes to the same address and secret.
// Build and run: scripts/fuzz.sh (tests/fuzz/corpus/bootstrap_message is the seed corpus).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "bootstrap/auth.h"
#include "bootstrap/message.h"
#include "bootstrap/unique_id.h"

namespace {

void require(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "fuzz_bootstrap_message: property violated: %s\n", what);
    std::abort();  // the fuzzer's way to report a finding (test harness, not the library)
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace anyr;
  // Header.
  MsgHeader h;
  std::string err;
  if (parseHeader(data, size, &h, &err)) {
    require(h.magic == kMsgMagic && h.version == kMsgProtocolVersion, "magic/version");
    require(h.nranks >= 1 && h.nranks <= kMsgMaxRanks && h.rank < h.nranks, "rank range");
    require(h.length <= kMsgMaxPayload, "length bound");
    require(std::string(msgTypeName(h.type)) != "unknown", "known type");
    uint8_t again[kMsgHeaderBytes];
    encodeHeader(h, again);
    require(std::memcmp(again, data, kMsgHeaderBytes) == 0, "header round trip");
  } else {
    require(!err.empty(), "rejection without a reason");
  }
  // Handshake payload (whatever follows the header), under the input's own header and under
  // each handshake type's.
  const uint8_t* rest = size > kMsgHeaderBytes ? data + kMsgHeaderBytes : nullptr;
  const size_t restLen = size > kMsgHeaderBytes ? size - kMsgHeaderBytes : 0;
  for (int k = 0; k < 4; ++k) {
    MsgHeader hh = h;
    if (k > 0) {
      static const MsgType types[] = {MsgType::kHello, MsgType::kChallenge, MsgType::kProof};
      hh = MsgHeader();
      hh.type = static_cast<uint16_t>(types[k - 1]);
      hh.nranks = 2;
      hh.length = static_cast<uint32_t>(restLen);
    } else if (!parseHeader(data, size, &hh, nullptr)) {
      continue;
    }
    HandshakeFields f;
    std::string why;
    const size_t want = handshakePayloadBytes(hh.type);
    const bool ok = parseHandshake(hh, rest, restLen, &f, &why);
    require(ok == (want != 0 && hh.length == want && restLen == want && rest != nullptr),
            "handshake acceptance");
    require(ok || !why.empty(), "handshake rejection without a reason");
    if (ok && hh.type != static_cast<uint16_t>(MsgType::kProof)) {
      require(std::memcmp(f.nonce, rest, kNonceBytes) == 0, "handshake nonce");
    }
    if (ok && hh.type == static_cast<uint16_t>(MsgType::kChallenge)) {
      require(std::memcmp(f.mac, rest + kNonceBytes, kMacBytes) == 0, "challenge mac");
    }
    if (ok && hh.type == static_cast<uint16_t>(MsgType::kProof)) {
      require(std::memcmp(f.mac, rest, kMacBytes) == 0, "proof mac");
    }
  }
  // Authenticated envelope under a fixed key: the raw input, and the input's tail sealed.
  SessionKey key;
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(0x30 + i);
  {
    MsgHeader opened;
    std::string why;
    if (openMessage(key, Direction::kFromRoot, 0, data, size, &opened, &why)) {
      // Only a sealed message opens: re-sealing its header and payload gives the same bytes.
      std::vector<uint8_t> again =
          sealMessage(key, Direction::kFromRoot, 0, static_cast<MsgType>(opened.type), opened.rank,
                      opened.nranks, data + kMsgHeaderBytes, opened.length);
      require(again.size() == size && std::memcmp(again.data(), data, size) == 0,
              "an unsealed input opened");
    } else {
      require(!why.empty(), "envelope rejection without a reason");
    }
  }
  if (size >= 2) {
    static const MsgType sealed[] = {MsgType::kWelcome, MsgType::kGather, MsgType::kGatherAll,
                                     MsgType::kAbort};
    const MsgType t = sealed[data[0] % 4];
    const uint64_t seq = data[1];
    const size_t len = std::min<size_t>(size - 2, 4096);
    std::vector<uint8_t> msg = sealMessage(key, Direction::kToRoot, seq, t, 1, 2, data + 2, len);
    MsgHeader opened;
    std::string why;
    require(openMessage(key, Direction::kToRoot, seq, msg.data(), msg.size(), &opened, &why),
            "sealed message does not open");
    require(opened.type == static_cast<uint16_t>(t) && opened.length == len &&
                std::memcmp(msg.data() + kMsgHeaderBytes, data + 2, len) == 0,
            "sealed message round trip");
    require(
        !openMessage(key, Direction::kToRoot, seq + 1, msg.data(), msg.size(), nullptr, nullptr),
        "opened under the next sequence number");
    require(!openMessage(key, Direction::kFromRoot, seq, msg.data(), msg.size(), nullptr, nullptr),
            "opened in the other direction");
    const size_t at = (static_cast<size_t>(data[0]) * 131 + seq) % msg.size();
    msg[at] ^= static_cast<uint8_t>(1u << (data[1] % 8));
    require(!openMessage(key, Direction::kToRoot, seq, msg.data(), msg.size(), nullptr, nullptr),
            "opened with a changed byte");
  }
  // Reason payload (whatever follows the header, or the whole input).
  const uint8_t* payload = size > kMsgHeaderBytes ? data + kMsgHeaderBytes : data;
  const size_t payloadLen = size > kMsgHeaderBytes ? size - kMsgHeaderBytes : size;
  anyrResult_t code = anyrSuccess;
  std::string text;
  if (parseReason(payload, payloadLen, &code, &text)) {
    require(code != anyrSuccess && code < anyrNumResults, "reason code range");
    require(text.size() + 4 == payloadLen, "reason length");
  }
  // Unique id: the first 128 bytes (zero-padded).
  anyrUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::memcpy(id.internal, data, size < sizeof(id.internal) ? size : sizeof(id.internal));
  try {
    UniqueIdInfo info = decodeUniqueId(id);
    anyrUniqueId id2;
    encodeUniqueId(info, &id2);
    UniqueIdInfo info2 = decodeUniqueId(id2);
    require(secretsEqual(info.secret, info2.secret), "unique id secret round trip");
    require(info.addr.toString() == info2.addr.toString(), "unique id address round trip");
  } catch (const Error& e) {
    require(e.code() == anyrInvalidArgument || e.code() == anyrInternalError,
            "unique id error code");
    require(std::strlen(e.what()) > 0, "unique id error text");
  }
  return 0;
}
