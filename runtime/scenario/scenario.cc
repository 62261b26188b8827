#include "scenario/scenario.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace longhaul::netem {

int Scenario::SiteOf(int host) const {
  if (host < static_cast<int>(placement.size())) return placement[host];
  return host % static_cast<int>(sites.size());
}

Link Scenario::Between(int from, int to) const {
  const int a = SiteOf(from), b = SiteOf(to);
  return {delay_ms[a][b], jitter_ms.empty() ? 0.0 : jitter_ms[a][b], rate_mbit[a][b], loss};
}

double Scenario::EgressMbit(int host) const { return egress_mbit.empty() ? 0 : egress_mbit[SiteOf(host)]; }
double Scenario::IngressMbit(int host) const { return ingress_mbit.empty() ? 0 : ingress_mbit[SiteOf(host)]; }

absl::StatusOr<Scenario> ParseScenario(const std::string& toml_text, const std::string& name) {
  toml::table t;
  try {
    t = toml::parse(toml_text, name);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("scenario ", name, ": ", std::string(e.description())));
  }
  auto bad = [&](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat("scenario ", name, ": ", why)); };
  for (auto&& [k, _] : t) {
    static const char* known[] = {"description", "delays_are", "sites", "delay_ms", "rate_mbit", "jitter_ms", "loss",
                                  "placement", "nic_gbps", "egress_gbps", "ingress_gbps"};
    if (std::find(std::begin(known), std::end(known), std::string(k.str())) == std::end(known)) {
      return bad(absl::StrCat("unknown key ", std::string(k.str())));
    }
  }
  Scenario s;
  s.name = name;
  s.description = t["description"].value_or(std::string());
  const std::string kind = t["delays_are"].value_or(std::string());
  if (kind != "one-way" && kind != "round-trip") {
    return bad("delays_are must say \"one-way\" or \"round-trip\" (every scenario states which)");
  }
  if (const toml::array* sites = t["sites"].as_array()) {
    for (auto& e : *sites) s.sites.push_back(e.value_or(std::string("?")));
  }
  if (s.sites.empty()) return bad("sites must name at least one site");
  const size_t n = s.sites.size();
  auto matrix = [&](const char* key, std::vector<std::vector<double>>& out, bool required) -> absl::Status {
    const toml::array* rows = t[key].as_array();
    if (rows == nullptr) return required ? bad(absl::StrCat(key, " is required")) : absl::OkStatus();
    if (rows->size() != n) return bad(absl::StrFormat("%s has %d rows for %d sites", key, rows->size(), n));
    for (auto& row : *rows) {
      const toml::array* r = row.as_array();
      if (r == nullptr || r->size() != n) return bad(absl::StrFormat("%s must be %d x %d", key, n, n));
      std::vector<double> v;
      for (auto& x : *r) {
        auto d = x.value<double>();
        if (!d || *d < 0) return bad(absl::StrCat(key, " entries must be numbers >= 0"));
        v.push_back(*d);
      }
      out.push_back(v);
    }
    return absl::OkStatus();
  };
  if (auto st = matrix("delay_ms", s.delay_ms, true); !st.ok()) return st;
  if (auto st = matrix("rate_mbit", s.rate_mbit, true); !st.ok()) return st;
  if (auto st = matrix("jitter_ms", s.jitter_ms, false); !st.ok()) return st;
  if (kind == "round-trip") {
    for (auto& row : s.delay_ms)
      for (double& d : row) d /= 2;
    for (auto& row : s.jitter_ms)
      for (double& d : row) d /= 2;
  }
  s.loss = t["loss"].value_or(0.0);
  if (s.loss < 0 || s.loss >= 1) return bad("loss must be in [0, 1)");
  if (const toml::array* p = t["placement"].as_array()) {
    for (auto& e : *p) {
      const int site = static_cast<int>(e.value_or(int64_t{-1}));
      if (site < 0 || site >= static_cast<int>(n)) return bad("placement entries must be site indices");
      s.placement.push_back(site);
    }
  }
  // Cards: a number for every host or one per site, in Gbit/s, kept per site in Mbit/s.
  auto cards = [&](const char* key, std::vector<double>& out) -> absl::Status {
    auto v = t[key];
    if (!v) return absl::OkStatus();
    std::vector<double> gbps;
    if (const toml::array* a = v.as_array()) {
      for (auto& x : *a) gbps.push_back(x.value<double>().value_or(-1));
      if (gbps.size() != n) {
        return bad(absl::StrFormat("%s has %d entries for %d sites: give one per site, or one number for every host",
                                   key, gbps.size(), n));
      }
    } else {
      gbps.assign(n, v.value<double>().value_or(-1));
    }
    for (double g : gbps) {
      if (!(g > 0 && g < 1e5)) return bad(absl::StrCat(key, " entries must be Gbit/s above 0 (omit the key: unlimited)"));
    }
    out.clear();
    for (double g : gbps) out.push_back(g * 1000);
    return absl::OkStatus();
  };
  if (auto st = cards("nic_gbps", s.egress_mbit); !st.ok()) return st;
  s.ingress_mbit = s.egress_mbit;
  if (auto st = cards("egress_gbps", s.egress_mbit); !st.ok()) return st;
  if (auto st = cards("ingress_gbps", s.ingress_mbit); !st.ok()) return st;
  return s;
}

absl::StatusOr<Scenario> LoadScenario(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open scenario file ", path, " (see netem/scenarios/)"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseScenario(ss.str(), std::filesystem::path(path).stem().string());
}

}  // namespace longhaul::netem
