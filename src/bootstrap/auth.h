// The bootstrap's authentication: HMAC-SHA-256 (OpenSSL libcrypto) keyed by the unique id's
// secret for the handshake, and by a per-connection session key for every later message.
//
// Handshake (one connection; K is the secret, Np and Nr fresh 32-byte nonces of the rank and
// of rank 0, r and n the rank and world size the connecting rank claims, big-endian):
//
//   rank -> 0   HELLO      Np                                       (nothing secret)
//   0 -> rank   CHALLENGE  Nr | challengeMac = HMAC(K, "root" | Np | Nr | r | n)
//   rank -> 0   PROOF      proofMac = HMAC(K, "peer" | Nr | Np | r | n)
//
// The rank checks the challenge before it answers: a process that does not hold K (another
// program that bound the id's port, say) learns nothing from the HELLO it received and
// cannot produce the PROOF. Rank 0 checks the proof before it counts the rank. Both sides then
// derive the session key HMAC(K, "session" | Nr | Np | r | n); every later message carries
// messageMac = HMAC(session, "message" | direction | sequence | header | payload), where the
// sequence counts the messages already sent in that direction on that connection (from 0), so
// that a message replayed from an earlier exchange, from another connection, reflected back to
// its sender or delivered out of order does not verify. Labels differ so that no MAC of one
// kind can stand for another. Traffic is authenticated, not encrypted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap/message.h"
#include "bootstrap/unique_id.h"

namespace anyr {

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;
using SessionKey = std::array<uint8_t, kMacBytes>;

// Which way a message travels on a rank's connection to rank 0 (bound into its MAC).
enum class Direction : uint8_t { kFromRoot = 1, kToRoot = 2 };

// A fresh nonce from OpenSSL's generator (RAND_bytes). Throws anyrSystemError if it fails.
Nonce randomNonce();

Mac challengeMac(const UniqueIdSecret& secret, const Nonce& rankNonce, const Nonce& rootNonce,
                 uint32_t rank, uint32_t nranks);
Mac proofMac(const UniqueIdSecret& secret, const Nonce& rankNonce, const Nonce& rootNonce,
             uint32_t rank, uint32_t nranks);
SessionKey deriveSessionKey(const UniqueIdSecret& secret, const Nonce& rankNonce,
                            const Nonce& rootNonce, uint32_t rank, uint32_t nranks);

// MAC of one message after the handshake: `header` is its kMsgHeaderBytes wire bytes,
// `payload` its `len` bytes (may be null when len is 0).
Mac messageMac(const SessionKey& key, Direction dir, uint64_t seq, const uint8_t* header,
               const void* payload, size_t len);

// Constant-time comparison (CRYPTO_memcmp) of a computed MAC with kMacBytes received bytes.
bool macMatches(const Mac& expected, const uint8_t* received);

// A whole authenticated message in memory: header (type, rank, nranks, payload length), payload
// and its MAC for (key, dir, seq). For tests and the fuzzer; the bootstrap streams messages
// and uses messageMac.
std::vector<uint8_t> sealMessage(const SessionKey& key, Direction dir, uint64_t seq, MsgType type,
                                 uint32_t rank, uint32_t nranks, const void* payload, size_t len);

// Checks a whole message held in memory (`len` bytes at `msg`): the header parses, the type is
// one that carries a MAC, `len` is exactly header + payload + MAC, and the MAC verifies for
// (key, dir, seq). On success *h holds the header and the payload is at msg + kMsgHeaderBytes;
// on failure returns false and a one-line reason in *error (if non-null).
bool openMessage(const SessionKey& key, Direction dir, uint64_t seq, const uint8_t* msg, size_t len,
                 MsgHeader* h, std::string* error);

// A connection's authentication state after the handshake (one per rank's connection).
struct Session {
  SessionKey key{};
  uint64_t sendSeq = 0;  // sequence number of the next message sent
  uint64_t recvSeq = 0;  // sequence number the next message received must carry
};

}  // namespace anyr
