// What anyrUniqueId.internal[] holds: rank 0's bootstrap address and a random secret with which
// rank 0 and every other rank prove to each other that they hold the same id (bootstrap/auth.h;
// the secret itself never crosses the wire). The id is copied between processes (and hosts) by
// the user, so the layout is explicit bytes, big-endian, with a checksum; decode rejects
// anything else.
//
//   offset size field
//        0    4 magic         kUniqueIdMagic ("ANUI")
//        4    2 version       kUniqueIdVersion
//        6    1 family        4 (IPv4) or 6 (IPv6)
//        7    1 reserved      0
//        8    2 port          rank 0's TCP port, never 0
//       10    2 reserved      0
//       12    4 scope id      IPv6 scope (link-local addresses), else 0
//       16   16 address       IPv4 in the first 4 bytes (rest 0), or IPv6
//       32   32 secret        from getrandom()
//       64    4 checksum      FNV-1a over bytes [0, 64)
//       68   60 (unused)      0
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "anyreduce/anyreduce.h"
#include "bootstrap/socket.h"

namespace anyr {

constexpr uint32_t kUniqueIdMagic = 0x414e5549u;  // "ANUI"
constexpr uint16_t kUniqueIdVersion = 1;
constexpr size_t kUniqueIdSecretBytes = 32;

using UniqueIdSecret = std::array<uint8_t, kUniqueIdSecretBytes>;

// The byte layout above; only uint8_t members, so no padding.
struct UniqueIdWire {
  uint8_t magic[4];
  uint8_t version[2];
  uint8_t family;
  uint8_t reserved0;
  uint8_t port[2];
  uint8_t reserved1[2];
  uint8_t scopeId[4];
  uint8_t addr[16];
  uint8_t secret[kUniqueIdSecretBytes];
  uint8_t checksum[4];
};
static_assert(sizeof(UniqueIdWire) == 68, "unique id layout changed: bump kUniqueIdVersion");
static_assert(sizeof(UniqueIdWire) <= sizeof(anyrUniqueId::internal),
              "unique id layout must fit in anyrUniqueId.internal");

struct UniqueIdInfo {
  SocketAddress addr;  // rank 0's address and port
  UniqueIdSecret secret{};
};

// Writes `info` into `id` (all unused bytes zero). Throws anyrInternalError for an address
// that is neither IPv4 nor IPv6 or has port 0.
void encodeUniqueId(const UniqueIdInfo& info, anyrUniqueId* id);

// Validates and decodes. Throws anyrInvalidArgument: "unique id: bad magic (not an anyreduce
// unique id)", a version mismatch, a checksum mismatch, a bad family or port 0.
UniqueIdInfo decodeUniqueId(const anyrUniqueId& id);

// Fills `buf` from the kernel's random source (getrandom, /dev/urandom as a fallback).
// Throws anyrSystemError.
void randomBytes(void* buf, size_t len);

// Constant-time comparison of two secrets (CRYPTO_memcmp: no early exit on the first differing
// byte).
bool secretsEqual(const UniqueIdSecret& a, const UniqueIdSecret& b);

}  // namespace anyr
