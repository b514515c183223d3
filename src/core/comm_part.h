// The common shape of a communicator's parts (its capabilities, peer workspace, host
// transport): each is made for one communicator and works on its shared state for life.
#pragma once

namespace anyr {

struct CommContext;

// A part of one communicator: it reads and writes the communicator's state (configuration,
// facts, bootstrap, streams) through ctx_, which outlives it. Bound to that communicator, so not
// copyable. A part derives from it privately and takes its constructor (using CommPart::CommPart).
class CommPart {
 public:
  explicit CommPart(CommContext& ctx) : ctx_(ctx) {}
  CommPart(const CommPart&) = delete;
  CommPart& operator=(const CommPart&) = delete;

 protected:
  ~CommPart() = default;

  CommContext& ctx_;
};

}  // namespace anyr
