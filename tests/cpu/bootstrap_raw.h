// Raw bootstrap clients for the CPU tests: a connection that speaks the wire protocol by hand
// (bootstrap/message.h, bootstrap/auth.h), to play a stranger, a misbehaving rank, a fake rank 0
// or a man in the middle.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap/auth.h"
#include "bootstrap/message.h"
#include "bootstrap/socket.h"
#include "bootstrap/unique_id.h"

namespace anyr {
namespace rawtest {

inline std::vector<uint8_t> headerBytes(uint32_t magic, uint16_t version, MsgType type,
                                        uint32_t rank, uint32_t nranks, uint32_t length) {
  MsgHeader h;
  h.magic = magic;
  h.version = version;
  h.type = static_cast<uint16_t>(type);
  h.rank = rank;
  h.nranks = nranks;
  h.length = length;
  std::vector<uint8_t> out(kMsgHeaderBytes);
  encodeHeader(h, out.data());
  return out;
}

// A message without MAC (the handshake's, REJECT): header + payload.
inline std::vector<uint8_t> plainMessage(MsgType type, uint32_t rank, uint32_t nranks,
                                         const void* payload, size_t len) {
  std::vector<uint8_t> out =
      headerBytes(kMsgMagic, kMsgProtocolVersion, type, rank, nranks, static_cast<uint32_t>(len));
  const auto* p = static_cast<const uint8_t*>(payload);
  out.insert(out.end(), p, p + len);
  return out;
}

inline bool sendBytes(int fd, const std::vector<uint8_t>& bytes, int timeoutMs = 5000) {
  int err = 0;
  return sendAll(fd, bytes.data(), bytes.size(), Deadline(timeoutMs), &err) == IoResult::kDone;
}

// Bytes on the wire of the message whose header is `h`: header, payload and MAC if its type
// has one.
inline size_t wireBytes(const MsgHeader& h) {
  return kMsgHeaderBytes + h.length + (msgTypeAuthenticated(h.type) ? kMacBytes : 0);
}

// Reads one whole message (header, payload, MAC if its type has one) into *msg. Returns
// "ok", "EOF", "TIMEOUT" or what went wrong.
inline std::string recvWhole(int fd, std::vector<uint8_t>* msg, int timeoutMs) {
  Deadline deadline(timeoutMs);
  msg->assign(kMsgHeaderBytes, 0);
  int err = 0;
  IoResult r = recvAll(fd, msg->data(), kMsgHeaderBytes, deadline, &err);
  if (r == IoResult::kClosed) return "EOF";
  if (r == IoResult::kTimeout) return "TIMEOUT";
  if (r != IoResult::kDone) return ioResultText(r, err);
  MsgHeader h;
  std::string why;
  if (!parseHeader(msg->data(), kMsgHeaderBytes, &h, &why)) return "bad header: " + why;
  msg->resize(wireBytes(h));
  r = recvAll(fd, msg->data() + kMsgHeaderBytes, msg->size() - kMsgHeaderBytes, deadline, &err);
  if (r != IoResult::kDone) return "truncated " + std::string(msgTypeName(h.type));
  return "ok";
}

// What a raw client that never authenticates received: "REJECT: <reason>", "EOF", "TIMEOUT",
// or "OTHER ...". A CHALLENGE (the answer to its HELLO) is skipped.
inline std::string readReply(int fd, int timeoutMs) {
  for (;;) {
    std::vector<uint8_t> msg;
    std::string got = recvWhole(fd, &msg, timeoutMs);
    if (got != "ok") return got == "EOF" || got == "TIMEOUT" ? got : "OTHER " + got;
    MsgHeader h;
    parseHeader(msg.data(), msg.size(), &h, nullptr);
    if (h.type == static_cast<uint16_t>(MsgType::kChallenge)) continue;
    if (h.type != static_cast<uint16_t>(MsgType::kReject)) {
      return std::string("OTHER ") + msgTypeName(h.type);
    }
    anyrResult_t code;
    std::string text;
    if (!parseReason(msg.data() + kMsgHeaderBytes, h.length, &code, &text)) {
      return "OTHER bad reason";
    }
    return "REJECT: " + text;
  }
}

// A rank played by hand: a connection to rank 0 that completed the handshake.
struct RawRank {
  Socket sock;
  Session session;
};

// The handshake's first half: connect, HELLO, the CHALLENGE verified. rawProof sends the PROOF
// (a caller may hold it back, to be half-way through the handshake for a while).
struct RawChallenged {
  Nonce rankNonce, rootNonce;
  uint32_t rank = 0, nranks = 0;
};
inline std::string rawHello(const UniqueIdInfo& info, int rank, int nranks, RawRank* out,
                            RawChallenged* c) {
  std::string err;
  out->sock = connectWithRetry(info.addr, Deadline(5000), &err);
  if (!out->sock.valid()) return "connect: " + err;
  const Nonce rankNonce = randomNonce();
  if (!sendBytes(out->sock.fd(),
                 plainMessage(MsgType::kHello, static_cast<uint32_t>(rank),
                              static_cast<uint32_t>(nranks), rankNonce.data(), rankNonce.size()))) {
    return "send HELLO";
  }
  std::vector<uint8_t> msg;
  std::string got = recvWhole(out->sock.fd(), &msg, 5000);
  if (got != "ok") return "CHALLENGE: " + got;
  MsgHeader h;
  HandshakeFields f;
  std::string why;
  if (!parseHeader(msg.data(), msg.size(), &h, &why) ||
      !parseHandshake(h, msg.data() + kMsgHeaderBytes, msg.size() - kMsgHeaderBytes, &f, &why)) {
    return "CHALLENGE: " + why;
  }
  Nonce rootNonce;
  std::copy(f.nonce, f.nonce + kNonceBytes, rootNonce.begin());
  const auto r = static_cast<uint32_t>(rank);
  const auto n = static_cast<uint32_t>(nranks);
  if (!macMatches(challengeMac(info.secret, rankNonce, rootNonce, r, n), f.mac)) {
    return "CHALLENGE does not verify";
  }
  *c = RawChallenged{rankNonce, rootNonce, r, n};
  return "";
}

inline std::string rawProof(const UniqueIdInfo& info, const RawChallenged& c, RawRank* out) {
  const Mac proof = proofMac(info.secret, c.rankNonce, c.rootNonce, c.rank, c.nranks);
  if (!sendBytes(out->sock.fd(),
                 plainMessage(MsgType::kProof, c.rank, c.nranks, proof.data(), proof.size()))) {
    return "send PROOF";
  }
  out->session.key = deriveSessionKey(info.secret, c.rankNonce, c.rootNonce, c.rank, c.nranks);
  return "";
}

// Connects to `info.addr` and authenticates as `rank` of `nranks` with `info.secret`. Returns ""
// on success, else what failed.
inline std::string rawHandshake(const UniqueIdInfo& info, int rank, int nranks, RawRank* out) {
  RawChallenged c;
  const std::string hello = rawHello(info, rank, nranks, out, &c);
  return hello.empty() ? rawProof(info, c, out) : hello;
}

// Receives and verifies one message from rank 0 on a raw rank's connection. Returns "ok" and
// the header and payload, or what failed.
inline std::string recvFromRootRaw(RawRank* rr, MsgHeader* h, std::vector<uint8_t>* payload,
                                   int timeoutMs = 5000) {
  std::vector<uint8_t> msg;
  std::string got = recvWhole(rr->sock.fd(), &msg, timeoutMs);
  if (got != "ok") return got;
  std::string why;
  if (!openMessage(rr->session.key, Direction::kFromRoot, rr->session.recvSeq, msg.data(),
                   msg.size(), h, &why)) {
    return why;
  }
  ++rr->session.recvSeq;
  payload->assign(msg.begin() + kMsgHeaderBytes, msg.begin() + kMsgHeaderBytes + h->length);
  return "ok";
}

}  // namespace rawtest
}  // namespace anyr
