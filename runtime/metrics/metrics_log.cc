#include "metrics/metrics_log.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "util/files.h"
#include "metrics/loss_curve.h"
#include "util/atomic_file.h"
#include "util/median.h"
#include "util/status_macros.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

// Column order of the files written; readers go by name.
enum Column { kStep, kLoss, kFloor, kValLoss, kLr, kGradNorm, kSeconds, kTokensPerS, kSkipped, kNumColumns };
constexpr const char* kColumnNames[kNumColumns] = {"step",      "loss",    "floor",        "val_loss", "lr",
                                                   "grad_norm", "seconds", "tokens_per_s", "skipped"};

std::string FormatRow(const MetricsRow& r) {
  // Unknown values are empty cells, which spreadsheets and pandas read as missing.
  auto known = [](double v) { return v >= 0 ? absl::StrFormat("%.6f", v) : std::string(); };
  return absl::StrFormat("%d,%.6f,%s,%s,%.6g,%.6f,%.6f,%.1f,%d\n", r.step, r.loss, known(r.floor), known(r.val_loss),
                         r.lr, r.grad_norm, r.seconds, r.tokens_per_s, r.skipped ? 1 : 0);
}

// Parses one cell into its field of `r`; false when the text is not a value of that column.
bool SetField(Column c, absl::string_view text, MetricsRow& r) {
  switch (c) {
    case kStep:
      return absl::SimpleAtoi(text, &r.step);
    case kSkipped: {
      int v = 0;
      if (!absl::SimpleAtoi(text, &v) || (v != 0 && v != 1)) return false;
      r.skipped = v == 1;
      return true;
    }
    default: {
      static constexpr double MetricsRow::*kDoubles[kNumColumns] = {
          nullptr, &MetricsRow::loss, &MetricsRow::floor, &MetricsRow::val_loss, &MetricsRow::lr,
          &MetricsRow::grad_norm, &MetricsRow::seconds, &MetricsRow::tokens_per_s, nullptr};
      return absl::SimpleAtod(text, &(r.*kDoubles[c]));
    }
  }
}

absl::Status Malformed(const std::string& path, size_t line, const std::string& what) {
  return absl::DataLossError(absl::StrFormat(
      "%s line %d: %s; repair the file or move it away (the model's state is in the checkpoints, not here)", path, line,
      what));
}

}  // namespace

const std::string& MetricsHeader() {
  static const std::string header = absl::StrJoin(kColumnNames, ",");
  return header;
}

absl::StatusOr<std::vector<std::string>> ReadCompleteLines(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  const absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return absl::InternalError(text.status().message());
  std::vector<std::string> lines = absl::StrSplit(*text, '\n');
  // The text after the last newline is empty, or the row a killed process was writing: never a
  // complete row.
  lines.pop_back();
  return lines;
}

std::optional<double> SteadyStepSeconds(const std::vector<MetricsRow>& rows, int local_steps) {
  std::vector<double> seconds;
  for (const MetricsRow& r : rows) seconds.push_back(r.seconds);
  if (local_steps <= 1) {
    if (seconds.size() < 3) return std::nullopt;
    return Median(std::vector<double>(seconds.begin() + 2, seconds.end()));
  }
  const size_t rounds = seconds.size() / local_steps;
  if (rounds < 3) return std::nullopt;
  const auto first = seconds.begin() + local_steps, last = seconds.begin() + (rounds - 1) * local_steps;
  return std::accumulate(first, last, 0.0) / static_cast<double>(last - first);
}

absl::StatusOr<std::vector<MetricsRow>> ReadMetrics(const std::string& path) {
  LH_ASSIGN_OR_RETURN(const std::vector<std::string> lines, ReadCompleteLines(path));
  std::vector<MetricsRow> rows;
  if (lines.empty()) return rows;  // killed before the header was out: nothing was recorded

  // Where each known column sits in this file's rows, if anywhere.
  std::optional<size_t> where[kNumColumns];
  std::vector<absl::string_view> header = absl::StrSplit(lines[0], ',');
  for (size_t i = 0; i < header.size(); ++i) {
    const absl::string_view name = absl::StripAsciiWhitespace(header[i]);
    for (int c = 0; c < kNumColumns; ++c) {
      if (name != kColumnNames[c]) continue;
      if (where[c]) return Malformed(path, 1, absl::StrCat("column ", name, " appears twice"));
      where[c] = i;
    }
  }
  for (Column c : {kStep, kLoss}) {
    if (!where[c]) return Malformed(path, 1, absl::StrCat("the header has no column ", kColumnNames[c]));
  }

  for (size_t n = 1; n < lines.size(); ++n) {
    if (absl::StripAsciiWhitespace(lines[n]).empty()) continue;
    std::vector<absl::string_view> cells = absl::StrSplit(lines[n], ',');
    if (cells.size() != header.size()) {
      return Malformed(path, n + 1, absl::StrFormat("%d cells, the header names %d", cells.size(), header.size()));
    }
    MetricsRow r;
    for (int c = 0; c < kNumColumns; ++c) {
      if (!where[c]) continue;
      const absl::string_view cell = absl::StripAsciiWhitespace(cells[*where[c]]);
      if (cell.empty() && c != kStep && c != kLoss) continue;  // unknown: the default stands
      if (!SetField(static_cast<Column>(c), cell, r)) {
        return Malformed(path, n + 1, absl::StrFormat("'%s' is not a value of column %s", cell, kColumnNames[c]));
      }
    }
    if (!rows.empty() && r.step <= rows.back().step) {
      return Malformed(path, n + 1, absl::StrFormat("step %d follows step %d", r.step, rows.back().step));
    }
    rows.push_back(r);
  }
  return rows;
}

absl::StatusOr<MetricsLog> MetricsLog::Create(const std::string& path) { return Start(path, {}); }

absl::StatusOr<MetricsLog> MetricsLog::Resume(const std::string& path, int64_t step) {
  absl::StatusOr<std::vector<MetricsRow>> rows = ReadMetrics(path);
  if (absl::IsNotFound(rows.status())) return Start(path, {});
  if (!rows.ok()) return rows.status();
  std::erase_if(*rows, [&](const MetricsRow& r) { return r.step > step; });
  return Start(path, *std::move(rows));
}

absl::StatusOr<MetricsLog> MetricsLog::Start(const std::string& path, std::vector<MetricsRow> rows) {
  // Rewritten whole, so an interruption here leaves the previous file whole.
  std::string text = MetricsHeader() + "\n";
  for (const MetricsRow& r : rows) text += FormatRow(r);
  if (absl::Status s = WriteFileAtomically(path, text); !s.ok()) return s;
  MetricsLog log;
  log.path_ = path;
  log.rows_ = std::move(rows);
  log.out_.open(path, std::ios::app);
  if (!log.out_) return absl::InternalError(absl::StrCat("cannot append to ", path, ": ", std::strerror(errno)));
  return log;
}

absl::Status MetricsLog::Append(const MetricsRow& row) {
  if (!rows_.empty() && row.step <= rows_.back().step) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: step %d recorded after step %d", path_, row.step, rows_.back().step));
  }
  // One flush per row: the kernel holds every finished step even if this process is killed next.
  out_ << FormatRow(row) << std::flush;
  if (!out_) {
    return absl::InternalError(absl::StrCat("cannot append to ", path_, ": ", std::strerror(errno),
                                            " (is the disk of train.out_dir full?)"));
  }
  rows_.push_back(row);
  return absl::OkStatus();
}

absl::Status MetricsLog::DrawLossCurve(const std::string& svg_path) const {
  std::vector<LossPoint> train, val;
  train.reserve(rows_.size());
  double floor = -1;
  for (const MetricsRow& r : rows_) {
    train.push_back({static_cast<double>(r.step), r.loss});
    if (r.val_loss >= 0) val.push_back({static_cast<double>(r.step), r.val_loss});
    if (r.floor >= 0) floor = r.floor;
  }
  return WriteLossCurveSvg(svg_path, train, val, floor);
}

}  // namespace longhaul
