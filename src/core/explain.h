// Explain: what the communicator chose and why, from every part (the selector's tables, the
// capabilities' probes, the transports), as JSON (anyrCommExplain) and as the dispatch text
// (select/explain.h) inside it. Reads only; takes the selector's table lock, since
// anyrCommTune may be installing a table.
#pragma once

#include <string>

namespace anyr {

struct CommContext;
class Selector;
class Capabilities;
class PeerWorkspace;
class HostTransport;
class FusedPlan;
class Fabric;

class Explainer {
 public:
  Explainer(const CommContext& ctx, const Selector& sel, const Capabilities& caps,
            const PeerWorkspace& workspace, const HostTransport& host, const FusedPlan& fused,
            const Fabric& fabric, const std::string& selfTestJson)
      : ctx_(ctx),
        sel_(sel),
        caps_(caps),
        workspace_(workspace),
        host_(host),
        fused_(fused),
        fabric_(fabric),
        selfTestJson_(selfTestJson) {}

  std::string explainJson() const;
  std::string explainText() const;        // takes the table lock
  std::string explainTextLocked() const;  // with the table lock held

 private:
  const CommContext& ctx_;
  const Selector& sel_;
  const Capabilities& caps_;
  const PeerWorkspace& workspace_;
  const HostTransport& host_;
  const FusedPlan& fused_;
  const Fabric& fabric_;
  const std::string& selfTestJson_;  // the startup self-test's report (core/selftest.cc)
};

}  // namespace anyr
