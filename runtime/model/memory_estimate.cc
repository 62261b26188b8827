#include "model/memory_estimate.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace longhaul {
namespace fs = std::filesystem;

void MemoryEstimate::Add(const std::string& name, double bytes) {
  for (Part& p : parts_) {
    if (p.name == name) {
      p.bytes += bytes;
      return;
    }
  }
  parts_.push_back({name, bytes});
}

void MemoryEstimate::Add(const MemoryEstimate& other, double times) {
  for (const Part& p : other.parts_) Add(p.name, times * p.bytes);
}

double MemoryEstimate::total() const {
  double sum = 0;
  for (const Part& p : parts_) sum += p.bytes;
  return sum;
}

double MemoryEstimate::bytes(const std::string& part) const {
  for (const Part& p : parts_)
    if (p.name == part) return p.bytes;
  return 0;
}

std::string MemoryEstimate::ToString() const {
  std::vector<std::string> shown;
  for (const Part& p : parts_)
    if (p.bytes >= (1 << 20)) shown.push_back(absl::StrCat(p.name, " ", FormatBytes(p.bytes)));
  return absl::StrCat(FormatBytes(total()), " (", absl::StrJoin(shown, ", "), ")");
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  return u == 0 ? absl::StrFormat("%.0f bytes", bytes) : absl::StrFormat("%.1f %s", bytes, units[u]);
}

double StageParamCount(const ModelConfig& m, const StageSpec& spec) {
  const double C = m.d_model, V = m.vocab_size;
  double n = (spec.end_block - spec.first_block) * (12 * C * C + 13 * C);
  if (spec.has_embedding) n += V * C + m.max_seq_len * C;
  if (spec.has_head) n += 2 * C + (m.tied_head ? 0 : V * C);
  return n;
}

bool CudaFlashAttention(const ModelConfig& m, Precision p) {
  const int hs = m.d_model / m.n_head;
  return p != Precision::kFp32 && hs % 8 == 0 && hs <= 128;
}

int CudaLogitsStride(const ModelConfig& m) { return (m.vocab_size + 7) / 8 * 8; }

MemoryEstimate EstimateStage(const StageMemoryRequest& r) {
  const double P = StageParamCount(r.model, r.spec), N = static_cast<double>(r.B) * r.T, C = r.model.d_model,
               V = r.model.vocab_size, NH = r.model.n_head, T = r.T, blocks = r.spec.end_block - r.spec.first_block;
  const double att = static_cast<double>(r.B) * NH * T * T;  // attention probabilities of one block
  MemoryEstimate e;
  // A subspace model's fixed embedding columns, which every stage draws (FixedEmbedding): in host
  // memory, and on a device stage after the first in the compute type too.
  const double fixed = r.model.subspace_divisor > 1 ? (V + r.model.max_seq_len) * (C - r.model.residual_width()) : 0;
  if (r.backend == Backend::kCpu) {
    if (fixed > 0) e.Add("fixed embedding", 4 * fixed);
    // GptStage::BlockActs: ln1, qkv (3), atty, res2, ln2, fch (4), fch_gelu (4), out = 16 NC; four
    // (N) statistics; the attention probabilities.
    const double block_acts = 4 * (16 * N * C + 4 * N + att);
    double slot = 4 * N * C;  // x0
    slot += r.recompute ? blocks * 4 * N * C : blocks * block_acts;
    if (r.spec.has_head) slot += 4 * (N * C + 3 * N + N * V);  // lnf, its statistics, losses; probs
    e.Add("parameters", 4 * P);
    e.Add("gradients", 4 * P);
    e.Add("activations", r.activation_slots * slot);
    // g_resid, g_ln, g_atty (1 each), g_qkv (3), g_fch (4); attention backward per thread; with
    // recompute, one block's activations rebuilt during backward.
    e.Add("backward scratch", 4 * (10 * N * C + static_cast<double>(r.threads) * T * T) +
                                  (r.recompute && blocks > 0 ? block_acts : 0));
    return e;
  }
  // CudaStage: activations and most scratch in the compute type; statistics, losses, the fp32
  // boundary copies and the logits in fp32.
  const double t = r.precision == Precision::kFp32 ? 4 : 2, Vs = CudaLogitsStride(r.model);
  e.Add("parameters", 4 * P + (t == 4 ? 0 : t * P));  // fp32 master weights (+ the compute copy)
  e.Add("gradients", 4 * P);
  if (!r.spec.has_embedding && fixed > 0) e.Add("fixed embedding", t * fixed);
  if (r.optimizer) e.Add("AdamW moments", 8 * P + P);  // m, v and a decay flag per parameter
  // Per block: ln1, atty, res2, ln2, out (1 each), qkv (3), fch, fch_gelu (4 each) = 16 NC and
  // four fp32 statistics; in the flash style one fp32 log-sum-exp per query and head, otherwise
  // q, k, v, y (1 each) and the attention probabilities. Each slot holds them for every block, or
  // with recompute only each block's input.
  const bool flash = CudaFlashAttention(r.model, r.precision);
  const double block_acts =
      t * 16 * N * C + 4 * 4 * N + (flash ? 4 * NH * N : t * (4 * N * C + att));
  // + x0, and the micro-batch's tokens, targets, loss weights and the token grouping (6 ints per position)
  double slot = (r.recompute ? blocks * t * N * C : blocks * block_acts) + t * N * C + 6 * 4 * N;
  if (r.spec.has_head) slot += t * N * C + 4 * 3 * N + 4 * N * Vs;  // lnf, statistics and losses, logits
  e.Add("activations", r.activation_slots * slot);
  // input, output and g (fp32); gT, g_ln, g_atty (1 each), g_qkv (3), g_fch (4); in the flash
  // style each query's delta (fp32 per head), otherwise dq, dk, dv, dy (1 each) and datt; losses;
  // dlogits; the norm's partial sums; with recompute, one block's activations rebuilt during
  // backward.
  e.Add("backward scratch", 12 * N * C + t * 10 * N * C + (flash ? 4 * NH * N : t * (4 * N * C + att)) + 16 * N +
                                (r.spec.has_head ? t * N * Vs : 0) + 1024 * 4 + 8 +
                                (r.recompute && blocks > 0 ? block_acts : 0));
  e.Add("cuBLAS workspace", 64.0 * (1 << 20));
  return e;
}

namespace {

std::optional<std::string> ReadText(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::optional<double> ReadNumber(const fs::path& p) {
  auto text = ReadText(p);
  double v = 0;
  if (!text || !absl::SimpleAtod(absl::StripAsciiWhitespace(*text), &v)) return std::nullopt;  // "max": no limit
  return v;
}

}  // namespace

MemoryLimit HostMemoryAvailable(const std::string& root) {
  MemoryLimit best{std::numeric_limits<double>::infinity(), "no figure (neither /proc/meminfo nor a cgroup limit)"};
  if (auto meminfo = ReadText(root + "/proc/meminfo")) {
    for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      double kib = 0;
      if (f.size() >= 2 && f[0] == "MemAvailable:" && absl::SimpleAtod(f[1], &kib)) {
        best = {kib * 1024, "MemAvailable in /proc/meminfo"};
      }
    }
  }
  // Lines "0::/path" (v2) or "N:...memory...:/path" (v1). A limit holds for the whole subtree, so
  // every ancestor's counts too; a container may see its own cgroup as the mount's root.
  auto cgroups = ReadText(root + "/proc/self/cgroup");
  for (absl::string_view line : absl::StrSplit(cgroups.value_or(""), '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const bool v2 = f[0] == "0" && f[1].empty();
    std::vector<std::string> controllers = absl::StrSplit(f[1], ',');
    if (!v2 && std::find(controllers.begin(), controllers.end(), "memory") == controllers.end()) continue;
    const fs::path mount = fs::path(root + "/sys/fs/cgroup") / (v2 ? "" : "memory");
    const char* limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
    const char* usage_file = v2 ? "memory.current" : "memory.usage_in_bytes";
    for (fs::path dir = mount / fs::path(f[2]).relative_path();; dir = dir.parent_path()) {
      const auto limit = ReadNumber(dir / limit_file), usage = ReadNumber(dir / usage_file);
      // v1 writes "no limit" as a number near 2^63.
      if (limit && *limit < 1e18 && *limit - usage.value_or(0) < best.bytes) {
        best = {std::max(0.0, *limit - usage.value_or(0)),
                absl::StrCat("the cgroup limit of ", FormatBytes(*limit), " in ", (dir / limit_file).string(),
                             ", less ", FormatBytes(usage.value_or(0)), " in use")};
      }
      if (dir == mount || dir.string().size() <= mount.string().size()) break;
    }
  }
  return best;
}

}  // namespace longhaul
