#include "bootstrap/unique_id.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "base/error.h"
#include "bootstrap/byte_order.h"

namespace anyr {

// FNV-1a: catches ids truncated or mangled in transit. Not a security measure: the secret is.
static uint32_t fnv1a(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 16777619u;
  }
  return h;
}

void encodeUniqueId(const UniqueIdInfo& info, anyrUniqueId* id) {
  std::memset(id, 0, sizeof(*id));
  UniqueIdWire w;
  std::memset(&w, 0, sizeof(w));
  putU32(w.magic, kUniqueIdMagic);
  putU16(w.version, kUniqueIdVersion);
  if (info.addr.family() == AF_INET) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(&info.addr.storage);
    w.family = 4;
    std::memcpy(w.addr, &sin->sin_addr, 4);
  } else if (info.addr.family() == AF_INET6) {
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&info.addr.storage);
    w.family = 6;
    std::memcpy(w.addr, &sin6->sin6_addr, 16);
    putU32(w.scopeId, sin6->sin6_scope_id);
  } else {
    throwError(anyrInternalError, "unique id: address family " +
                                      std::to_string(info.addr.family()) +
                                      " is neither IPv4 nor IPv6");
  }
  if (info.addr.port() == 0) throwError(anyrInternalError, "unique id: port 0");
  putU16(w.port, info.addr.port());
  std::memcpy(w.secret, info.secret.data(), kUniqueIdSecretBytes);
  putU32(w.checksum, fnv1a(reinterpret_cast<const uint8_t*>(&w), offsetof(UniqueIdWire, checksum)));
  std::memcpy(id->internal, &w, sizeof(w));
}

UniqueIdInfo decodeUniqueId(const anyrUniqueId& id) {
  UniqueIdWire w;
  std::memcpy(&w, id.internal, sizeof(w));
  if (getU32(w.magic) != kUniqueIdMagic) {
    throwError(anyrInvalidArgument, "unique id: bad magic (not an anyreduce unique id)");
  }
  if (getU16(w.version) != kUniqueIdVersion) {
    throwError(anyrInvalidArgument,
               "unique id: format version " + std::to_string(getU16(w.version)) +
                   ", this library reads version " + std::to_string(kUniqueIdVersion) +
                   " (every rank must run the same anyreduce)");
  }
  uint32_t sum = fnv1a(reinterpret_cast<const uint8_t*>(&w), offsetof(UniqueIdWire, checksum));
  if (getU32(w.checksum) != sum) {
    throwError(anyrInvalidArgument, "unique id: checksum mismatch (the id was altered in transit)");
  }
  for (size_t i = sizeof(w); i < sizeof(id.internal); ++i) {
    if (id.internal[i] != 0) {
      throwError(anyrInvalidArgument, "unique id: unused byte " + std::to_string(i) +
                                          " is not zero (the id was altered in transit)");
    }
  }
  uint16_t port = getU16(w.port);
  if (port == 0) throwError(anyrInvalidArgument, "unique id: port 0");

  UniqueIdInfo info;
  if (w.family == 4) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&info.addr.storage);
    sin->sin_family = AF_INET;
    std::memcpy(&sin->sin_addr, w.addr, 4);
    info.addr.len = sizeof(sockaddr_in);
  } else if (w.family == 6) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&info.addr.storage);
    sin6->sin6_family = AF_INET6;
    std::memcpy(&sin6->sin6_addr, w.addr, 16);
    sin6->sin6_scope_id = getU32(w.scopeId);
    info.addr.len = sizeof(sockaddr_in6);
  } else {
    throwError(anyrInvalidArgument,
               "unique id: address family " + std::to_string(w.family) + " (expected 4 or 6)");
  }
  info.addr.setPort(port);
  std::memcpy(info.secret.data(), w.secret, kUniqueIdSecretBytes);
  return info;
}

void randomBytes(void* buf, size_t len) {
  uint8_t* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < len) {
    ssize_t n = getrandom(p + done, len - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ENOSYS) break;  // very old kernel: fall back to /dev/urandom
    throwErrno("unique id: getrandom");
  }
  if (done == len) return;
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throwErrno("unique id: open /dev/urandom");
  while (done < len) {
    ssize_t n = ::read(fd, p + done, len - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    int e = n < 0 ? errno : EIO;
    ::close(fd);
    errno = e;
    throwErrno("unique id: read /dev/urandom");
  }
  ::close(fd);
}

bool secretsEqual(const UniqueIdSecret& a, const UniqueIdSecret& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace anyr
