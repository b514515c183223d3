// libFuzzer target: everything the bootstrap decodes from bytes another process sent or the user
// copied: the 20-byte message header (parseHeader), REJECT/ABORT reasons (parseReason) and the
// unique id (decodeUniqueId). Properties checked beyond "no crash, no sanitizer report":
//  - an accepted header has in-range fields and re-encodes to the same 20 bytes;
//  - a rejected header always comes with a reason;
//  - an accepted reason has a valid, non-success code;
//  - an accepted unique id re-encodes to an id that decodes to the same address and secret.
// Build and run: scripts/fuzz.sh (tests/fuzz/corpus/bootstrap_message is the seed corpus).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bootstrap/message.h"
#include "bootstrap/unique_id.h"
#include "core/error.h"

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
