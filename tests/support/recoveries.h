#pragma once
// Test helper: the recoveries of a run's summary.json that changed its layout or its members.
#include <nlohmann/json.hpp>

namespace longhaul::testing {

// A survivor that finds a killed peer's connection closed reports it at once, and the coordinator
// may start the same layout again before it finds the peer lost: a recovery marked "restart",
// nobody lost and nothing changed. How often depends on the machine's scheduling (a 16-core GPU
// machine saw one in a re-cut test that 2 shared cores had not), so tests that count the changes
// of a failure leave those out.
inline nlohmann::json WithoutRestarts(const nlohmann::json& recoveries) {
  nlohmann::json changes = nlohmann::json::array();
  for (const nlohmann::json& r : recoveries)
    if (!r.value("restart", false)) changes.push_back(r);
  return changes;
}

}  // namespace longhaul::testing
