#include "coordinator/sample_audit.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "metrics/metrics_log.h"
#include "util/atomic_file.h"

namespace longhaul {

namespace {
constexpr char kHeader[] = "step,stages,stage,replica,worker,micro_batches\n";
constexpr int kMostStages = 65536;  // cluster.stages' range

}  // namespace

absl::StatusOr<SampleAudit> SampleAudit::Open(const std::string& path, int micro_batches, int64_t keep_through) {
  SampleAudit audit;
  audit.path_ = path;
  audit.micro_batches_ = micro_batches;
  absl::StatusOr<std::vector<std::string>> lines = ReadCompleteLines(path);
  if (absl::IsNotFound(lines.status())) lines = std::vector<std::string>();
  if (!lines.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(lines.status().message(), ": the audit so far is there; make it readable"));
  }
  for (int n = 1; n <= static_cast<int>(lines->size()); ++n) {
    const absl::string_view line = (*lines)[n - 1];
    if (n == 1 || line.empty()) continue;
    const std::vector<std::string> cells = absl::StrSplit(line, ',');
    int64_t step = 0;
    Row row;
    bool ok = cells.size() == 6 && absl::SimpleAtoi(cells[0], &step) && absl::SimpleAtoi(cells[1], &row.stages) &&
              absl::SimpleAtoi(cells[2], &row.stage) && absl::SimpleAtoi(cells[3], &row.replica) &&
              absl::SimpleAtoi(cells[4], &row.worker) && row.stages >= 1 && row.stages <= kMostStages &&
              row.stage >= 0 && row.stage < row.stages;
    for (absl::string_view g : absl::StrSplit(ok ? cells[5] : "", ' ', absl::SkipEmpty())) {
      int64_t index = 0;
      ok = ok && absl::SimpleAtoi(g, &index) && index >= 0 && index < micro_batches;
      row.micro_batches.push_back(index);
    }
    if (!ok) {
      return absl::DataLossError(absl::StrFormat("%s line %d is no audit row (%s): the file is damaged; move it away "
                                                 "to start the audit afresh",
                                                 path, n, kHeader));
    }
    if (ok && audit.steps_.count(step) && audit.steps_[step].front().stages != row.stages) {
      return absl::DataLossError(absl::StrFormat("%s line %d: step %d ran under one plan, not %d and %d stages: the "
                                                 "file is damaged; move it away to start the audit afresh",
                                                 path, n, step, audit.steps_[step].front().stages, row.stages));
    }
    if (step <= keep_through) audit.steps_[step].push_back(std::move(row));
  }
  for (const auto& [step, rows] : audit.steps_) audit.counts_[step] = audit.CountOf(rows);
  if (absl::Status s = audit.Rewrite(); !s.ok()) return s;
  return audit;
}

SampleAudit::Count SampleAudit::CountOf(const std::vector<Row>& rows) const {
  std::vector<std::vector<int>> seen(rows.empty() ? 1 : rows.front().stages, std::vector<int>(micro_batches_, 0));
  Count c;
  for (const Row& r : rows)
    for (int64_t g : r.micro_batches) {
      // A stage or index outside the plan (Record takes what workers report) counts as repeated.
      if (r.stage < static_cast<int>(seen.size()) && g >= 0 && g < micro_batches_) {
        ++seen[r.stage][g];
      } else {
        ++c.repeated;
      }
    }
  for (const std::vector<int>& stage : seen)
    for (int n : stage) c.lost += n == 0, c.repeated += std::max(0, n - 1);
  return c;
}

std::string SampleAudit::Format(int64_t step, const Row& r) {
  return absl::StrCat(step, ",", r.stages, ",", r.stage, ",", r.replica, ",", r.worker, ",",
                      absl::StrJoin(r.micro_batches, " "), "\n");
}

absl::Status SampleAudit::Rewrite() {
  std::string text = kHeader;
  for (const auto& [step, rows] : steps_)
    for (const Row& r : rows) text += Format(step, r);
  if (out_.is_open()) out_.close();
  if (absl::Status s = WriteFileAtomically(path_, text); !s.ok()) return s;
  out_.open(path_, std::ios::app);
  if (!out_) return absl::InternalError(absl::StrCat("cannot append to ", path_, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

absl::StatusOr<SampleAudit::Count> SampleAudit::Record(int64_t it, int stages,
                                                       const std::map<int, proto::IterationReport>& reports) {
  const int64_t step = it + 1;
  std::vector<Row>& rows = steps_[step];
  rows.clear();
  std::string text;
  for (const auto& [id, r] : reports) {
    Row row{stages, r.stage(), r.replica(), id, {r.micro_batches().begin(), r.micro_batches().end()}};
    text += Format(step, row);
    rows.push_back(std::move(row));
  }
  const Count c = counts_[step] = CountOf(rows);
  out_ << text << std::flush;
  if (!out_) return absl::InternalError(absl::StrCat("cannot append to ", path_, " (disk full?)"));
  return c;
}

absl::Status SampleAudit::Rewind(int64_t step) {
  // A recovery rewinds before it publishes the next plan version: the file, of every step so far,
  // is rewritten only where it holds steps to forget.
  if (steps_.upper_bound(step) == steps_.end()) return absl::OkStatus();
  steps_.erase(steps_.upper_bound(step), steps_.end());
  counts_.erase(counts_.upper_bound(step), counts_.end());
  return Rewrite();
}

SampleAudit::Totals SampleAudit::totals() const {
  Totals t;
  t.steps = static_cast<int64_t>(counts_.size());
  for (const auto& [step, c] : counts_) t.lost += c.lost, t.repeated += c.repeated;
  return t;
}

}  // namespace longhaul
