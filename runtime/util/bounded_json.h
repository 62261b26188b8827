#pragma once
// JSON that comes from a file or a peer. nlohmann parses any nesting without recursion, but
// dumping, comparing or copying the value recurses: a checkpoint's state.json or a job state nested
// 300000 deep overflowed the stack. Nesting deeper than kMaxJsonDepth is treated as unparseable
// JSON is: the value comes back discarded.
#include <string_view>

#include <nlohmann/json.hpp>

namespace longhaul {

inline constexpr int kMaxJsonDepth = 64;  // what longhaul writes nests 4 deep at most

nlohmann::json ParseBoundedJson(std::string_view text);

}  // namespace longhaul
