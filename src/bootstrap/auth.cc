#include "bootstrap/auth.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <cstring>
#include <memory>
#include <string>

#include "base/error.h"
#include "bootstrap/byte_order.h"
#include "bootstrap/message.h"

namespace anyr {

namespace {

// The text of OpenSSL's most recent error (its queue is cleared), for messages.
std::string opensslError() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no OpenSSL error recorded";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

// The HMAC implementation, fetched once (EVP_MAC objects may be used from several threads;
// each computation has its own context).
EVP_MAC* hmacAlgorithm() {
  static EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) {
    throwError(anyrSystemError,
               "bootstrap: OpenSSL has no HMAC implementation (EVP_MAC_fetch): " + opensslError());
  }
  return mac;
}

struct CtxFree {
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};

// HMAC-SHA-256 over the concatenation of the parts, keyed by `key`.
class Hmac {
 public:
  Hmac(const uint8_t* key, size_t keyLen) : ctx_(EVP_MAC_CTX_new(hmacAlgorithm())) {
    if (!ctx_) fail("EVP_MAC_CTX_new");
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    if (EVP_MAC_init(ctx_.get(), key, keyLen, params) != 1) fail("EVP_MAC_init");
  }
  Hmac& add(const void* data, size_t len) {
    if (len > 0 && EVP_MAC_update(ctx_.get(), static_cast<const unsigned char*>(data), len) != 1) {
      fail("EVP_MAC_update");
    }
    return *this;
  }
  Hmac& add(const char* label) { return add(label, std::char_traits<char>::length(label)); }
  Hmac& addU32(uint32_t v) {
    uint8_t b[4];
    putU32(b, v);
    return add(b, sizeof(b));
  }
  Mac finish() {
    Mac out{};
    size_t len = 0;
    if (EVP_MAC_final(ctx_.get(), out.data(), &len, out.size()) != 1) fail("EVP_MAC_final");
    if (len != out.size()) {
      throwError(anyrInternalError, "bootstrap: HMAC-SHA-256 gave " + std::to_string(len) +
                                        " bytes, expected " + std::to_string(out.size()));
    }
    return out;
  }

 private:
  [[noreturn]] static void fail(const char* step) {
    throwError(anyrSystemError,
               std::string("bootstrap: HMAC-SHA-256 failed (") + step + "): " + opensslError());
  }
  std::unique_ptr<EVP_MAC_CTX, CtxFree> ctx_;
};

// Every label starts with the protocol's name and version, so that MACs of this protocol are
// never valid in another one that uses the same secret.
constexpr const char* kRootLabel = "anyreduce bootstrap v2 root";
constexpr const char* kPeerLabel = "anyreduce bootstrap v2 peer";
constexpr const char* kSessionLabel = "anyreduce bootstrap v2 session";
constexpr const char* kMessageLabel = "anyreduce bootstrap v2 message";

// HMAC-SHA-256 under the unique id's secret of {label, first nonce, second nonce, rank, world
// size}: the handshake's three keyed values differ only in their label and nonce order.
Mac secretMac(const UniqueIdSecret& secret, const char* label, const Nonce& first,
              const Nonce& second, uint32_t rank, uint32_t nranks) {
  return Hmac(secret.data(), secret.size())
      .add(label)
      .add(first.data(), first.size())
      .add(second.data(), second.size())
      .addU32(rank)
      .addU32(nranks)
      .finish();
}

}  // namespace

Nonce randomNonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    throwError(anyrSystemError,
               "bootstrap: OpenSSL's random generator failed (RAND_bytes): " + opensslError());
  }
  return n;
}

Mac challengeMac(const UniqueIdSecret& secret, const Nonce& rankNonce, const Nonce& rootNonce,
                 uint32_t rank, uint32_t nranks) {
  return secretMac(secret, kRootLabel, rankNonce, rootNonce, rank, nranks);
}

Mac proofMac(const UniqueIdSecret& secret, const Nonce& rankNonce, const Nonce& rootNonce,
             uint32_t rank, uint32_t nranks) {
  return secretMac(secret, kPeerLabel, rootNonce, rankNonce, rank, nranks);
}

SessionKey deriveSessionKey(const UniqueIdSecret& secret, const Nonce& rankNonce,
                            const Nonce& rootNonce, uint32_t rank, uint32_t nranks) {
  return secretMac(secret, kSessionLabel, rootNonce, rankNonce, rank, nranks);
}

Mac messageMac(const SessionKey& key, Direction dir, uint64_t seq, const uint8_t* header,
               const void* payload, size_t len) {
  uint8_t prefix[1 + 8];
  prefix[0] = static_cast<uint8_t>(dir);
  putU32(prefix + 1, static_cast<uint32_t>(seq >> 32));
  putU32(prefix + 5, static_cast<uint32_t>(seq));
  return Hmac(key.data(), key.size())
      .add(kMessageLabel)
      .add(prefix, sizeof(prefix))
      .add(header, kMsgHeaderBytes)
      .add(payload, len)
      .finish();
}

std::vector<uint8_t> sealMessage(const SessionKey& key, Direction dir, uint64_t seq, MsgType type,
                                 uint32_t rank, uint32_t nranks, const void* payload, size_t len) {
  MsgHeader h;
  h.type = static_cast<uint16_t>(type);
  h.rank = rank;
  h.nranks = nranks;
  h.length = static_cast<uint32_t>(len);
  std::vector<uint8_t> out(kMsgHeaderBytes + len + kMacBytes);
  encodeHeader(h, out.data());
  if (len > 0) std::memcpy(out.data() + kMsgHeaderBytes, payload, len);
  Mac mac = messageMac(key, dir, seq, out.data(), payload, len);
  std::memcpy(out.data() + kMsgHeaderBytes + len, mac.data(), mac.size());
  return out;
}

bool openMessage(const SessionKey& key, Direction dir, uint64_t seq, const uint8_t* msg, size_t len,
                 MsgHeader* h, std::string* error) {
  MsgHeader hdr;
  std::string why;
  if (!parseHeader(msg, len, &hdr, &why)) {
    if (error != nullptr) *error = why;
    return false;
  }
  if (!msgTypeAuthenticated(hdr.type)) {
    if (error != nullptr) *error = std::string(msgTypeName(hdr.type)) + " carries no MAC";
    return false;
  }
  const size_t want = kMsgHeaderBytes + static_cast<size_t>(hdr.length) + kMacBytes;
  if (len != want) {
    if (error != nullptr) {
      *error = "message of " + std::to_string(len) + " bytes, its header announces " +
               std::to_string(want) + " with the MAC";
    }
    return false;
  }
  Mac mac = messageMac(key, dir, seq, msg, msg + kMsgHeaderBytes, hdr.length);
  if (!macMatches(mac, msg + kMsgHeaderBytes + hdr.length)) {
    if (error != nullptr) *error = "MAC does not verify (forged, replayed or reordered)";
    return false;
  }
  if (h != nullptr) *h = hdr;
  return true;
}

bool macMatches(const Mac& expected, const uint8_t* received) {
  return received != nullptr && CRYPTO_memcmp(expected.data(), received, expected.size()) == 0;
}

}  // namespace anyr
