#pragma once
// Test helper: reads Prometheus's text exposition format (0.0.4) as a Prometheus server would,
// strictly: every sample belongs to a family declared by a TYPE line before it, names and label
// names are legal, label values are quoted with the format's escapes, values are numbers. Returns
// the samples as "name{labels}" -> value, or why the text is not valid.
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace longhaul::testing {

inline absl::StatusOr<std::map<std::string, double>> ParsePrometheusText(const std::string& text) {
  static const std::regex name_re("[a-zA-Z_:][a-zA-Z0-9_:]*");
  static const std::regex type_re("# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)");
  static const std::regex help_re("# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*");
  static const std::regex label_re(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)")re");
  std::map<std::string, double> out;
  std::set<std::string> typed;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("line ", n, ": ", why, ": ", line));
  };
  if (text.empty() || text.back() != '\n') return absl::InvalidArgumentError("the text does not end with a newline");
  while (std::getline(in, line)) {
    ++n;
    std::smatch m;
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (std::regex_match(line, m, type_re)) {
        if (!typed.insert(m[1]).second) return bad("a second TYPE line for one family");
      } else if (!std::regex_match(line, help_re)) {
        return bad("a comment that is neither HELP nor TYPE");
      }
      continue;
    }
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) return bad("no value");
    const std::string name = line.substr(0, name_end);
    if (!std::regex_match(name, name_re)) return bad("an illegal metric name");
    if (typed.count(name) == 0) return bad("a sample of a family without a TYPE line before it");
    std::string key = name, rest = line.substr(name_end);
    if (rest[0] == '{') {
      const size_t close = rest.rfind('}');
      if (close == std::string::npos) return bad("labels without a closing brace");
      std::string labels = rest.substr(1, close - 1);
      key += rest.substr(0, close + 1);
      rest = rest.substr(close + 1);
      while (!labels.empty()) {
        if (!std::regex_search(labels, m, label_re) || m.position(0) != 0) return bad("an illegal label");
        labels = labels.substr(m.length(0));
        if (!labels.empty()) {
          if (labels[0] != ',') return bad("labels not separated by commas");
          labels = labels.substr(1);
        }
      }
    }
    if (rest.size() < 2 || rest[0] != ' ') return bad("no value after the name");
    const std::string value = rest.substr(1);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0') return bad("a value that is no number");
    if (!out.emplace(key, v).second) return bad("a sample repeated");
  }
  return out;
}

}  // namespace longhaul::testing
