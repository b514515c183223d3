#include "bootstrap/bootstrap.h"

#include <cstring>

#include "base/error.h"

namespace anyr {

void Bootstrap::broadcast(void* buf, size_t bytes, int root) {
  if (root < 0 || root >= size()) {
    throwError(anyrInternalError,
               "bootstrap broadcast: root " + std::to_string(root) + " out of range");
  }
  std::vector<unsigned char> all(bytes * static_cast<size_t>(size()));
  allGather(buf, all.data(), bytes);
  std::memcpy(buf, all.data() + bytes * static_cast<size_t>(root), bytes);
}

}  // namespace anyr
