#include "util/bounded_json.h"

namespace longhaul {

nlohmann::json ParseBoundedJson(std::string_view text) {
  bool too_deep = false;
  nlohmann::json j = nlohmann::json::parse(
      text,
      [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        too_deep = too_deep || depth > kMaxJsonDepth;
        return !too_deep;
      },
      /*allow_exceptions=*/false);
  return too_deep ? nlohmann::json(nlohmann::json::value_t::discarded) : j;
}

}  // namespace longhaul
