#pragma once
// metrics.csv: one row per optimizer step, the same columns for the one-process trainer and for a
// cluster's coordinator. Rows are appended and flushed as each step completes, so a killed process
// loses at most the row it was writing; a resumed run keeps the rows its checkpoint covers and
// appends after them. Reading goes by column name, so columns may be reordered or added.
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul {

struct MetricsRow {
  int64_t step = 0;         // 1-based optimizer step
  double loss = 0;          // mean micro-batch training loss, nats/token
  double floor = -1;        // entropy floor of the same positions; -1 (an empty cell) when unknown
  double val_loss = -1;     // -1 (an empty cell) when not evaluated at this step
  double lr = 0;
  double grad_norm = 0;     // before clipping
  double seconds = 0;       // wall time of the step (a cluster: stage 0 of replica 0's)
  double tokens_per_s = 0;  // tokens of the step / seconds
  bool skipped = false;     // fp16 overflow: the update was skipped

  bool operator==(const MetricsRow&) const = default;
};

// The header line of metrics.csv, without the newline.
const std::string& MetricsHeader();

// The complete lines of a file that grows by appended rows (metrics.csv, samples.csv): the text
// after the last newline, the row a killed process was writing, is dropped. NotFound where the
// file does not exist; Internal where it does and cannot be read.
absl::StatusOr<std::vector<std::string>> ReadCompleteLines(const std::string& path);

// Every complete row of a metrics.csv. `step` and `loss` are required columns; any other column
// may be missing (its default is used) and unknown columns are ignored. A malformed file is a
// DataLoss error naming the file and line. A missing file is NotFound.
absl::StatusOr<std::vector<MetricsRow>> ReadMetrics(const std::string& path);

// A run's steady seconds a step: the median of its steps after the first two, which open
// connections and grow TCP's windows (and one slow step on a shared machine moves no median).
// With local updates (`local_steps` > 1) a round's steps differ by design: the mean over the
// run's whole rounds but the first (the connections' start) and the last (a run ends with a
// synchronous exchange), as the planner's simulator predicts a round. nullopt where the run is
// too short for that: under 3 steps, or under 3 whole rounds.
std::optional<double> SteadyStepSeconds(const std::vector<MetricsRow>& rows, int local_steps);

class MetricsLog {
 public:
  // A new run: `path` is (re)written with the header alone.
  static absl::StatusOr<MetricsLog> Create(const std::string& path);
  // A run resumed from the checkpoint of `step`: keeps the rows of steps <= step. Later rows were
  // written by the interrupted run after that checkpoint; the resumed run recomputes those steps,
  // so they are dropped. Without a file, the log starts empty.
  static absl::StatusOr<MetricsLog> Resume(const std::string& path, int64_t step);

  // Appends one row, on disk when this returns; steps must increase.
  absl::Status Append(const MetricsRow& row);
  // Draws the whole history into an SVG: training loss, validation loss where measured, the last
  // known entropy floor.
  absl::Status DrawLossCurve(const std::string& svg_path) const;

  const std::vector<MetricsRow>& rows() const { return rows_; }
  const std::string& path() const { return path_; }

 private:
  static absl::StatusOr<MetricsLog> Start(const std::string& path, std::vector<MetricsRow> rows);

  std::string path_;
  std::vector<MetricsRow> rows_;
  std::ofstream out_;
};

}  // namespace longhaul
