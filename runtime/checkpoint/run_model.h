#pragma once
// A run's model from its checkpoints, whatever layout wrote them: a one-process run's
// checkpoints/step_N/, or a cluster's checkpoints/stage_S_shard_K/step_N/, one file per
// parameter-server shard (each shard holds whole, named tensors). A stage reads its tensors by
// name, so a job resumes under another cut of the model than the one that wrote the step.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace longhaul {

struct RunModel {
  ModelConfig model;
  int64_t step = 0;
  std::string checkpoint;     // the step's directory name, e.g. step_00000600
  std::vector<float> params;  // laid out by ParamLayout(model, StageSpec::Whole(model))
};

// The checkpoint of `step` (default: the newest complete one) under run_dir/checkpoints, or under
// run_dir itself where that is a checkpoints directory. Every file's size and CRC-32 are checked,
// and every tensor of the model must come exactly once; errors name the file and the fix. A
// subspace model's held floats read as the stages held them, so an export is the GPT-2 that trained.
absl::StatusOr<RunModel> LoadRunModel(const std::string& run_dir, std::optional<int64_t> step = std::nullopt);

// A directory of a checkpointed step and the model's names of the tensors its files hold.
struct CheckpointPiece {
  std::string dir;
  std::vector<std::string> tensors;
};

// Makes a step directory of a piece one this process may read: asked before every read, it brings
// the piece from where it is kept where this process lacks a copy it trusts (a worker that does
// not share the coordinator's run directory fetches it from there: worker/checkpoint_courier.h);
// NotFound where it is kept nowhere. `layout_only`: only its state.json is read (the layout it
// records), not its tensors.
using FetchPiece = std::function<absl::Status(const std::string& step_dir, bool layout_only)>;

// Where step `name` under the checkpoints directory `root` keeps each tensor, by the layout its
// state.json records, not the one reading it: root/name for a one-process run, else each
// parameter-server shard's stage_S_shard_K/name of the stages and shards that wrote the step. With
// `stage_root`, the whole stages under stage_root(S)/name instead (the residual or local state
// kept per stage). A directory of another cut's step (left from before a re-cut) is no piece.
// With `fetch`, the first shard's piece, whose state.json records the layout, is fetched first.
absl::StatusOr<std::vector<CheckpointPiece>> CheckpointPieces(
    const std::string& root, const std::string& name, const std::function<std::string(int stage)>& stage_root = {},
    const FetchPiece& fetch = {});

// Fetches every piece that holds a tensor of `layout`, all at once: each fetch waits a round trip
// to where the pieces are kept. NotFound of one is no error (LoadFromPieces names what is missing).
absl::Status FetchPieces(const std::vector<CheckpointPiece>& pieces, const ParamLayout& layout,
                         const FetchPiece& fetch);

// Reads `layout`'s tensors (and with m and v their AdamW moments; without params those alone) from
// the pieces that hold them, whatever stages and shards wrote them: a stage of a new cut of the
// model resumes from the old cut's files. Sizes, CRC-32s, names and shapes are checked; a tensor
// no piece holds, or a piece's missing directory, is named with the fix. With `skip_absent`, a
// piece whose directory is missing leaves its tensors as they were (error-feedback residuals a
// stage without int8 pushes never kept, which are zero). With `fetch`, every piece that holds a
// wanted tensor is fetched first.
absl::Status LoadFromPieces(const std::vector<CheckpointPiece>& pieces, const ParamLayout& layout, float* params,
                            float* m, float* v, bool skip_absent = false, const FetchPiece& fetch = {});

// Whether step `name` under the checkpoints directory `root` is whole and intact: every piece its
// recorded layout names is there (CheckpointPieces), and every piece that holds the step, the
// error-feedback residuals' and the stages' own AdamW state's too, has each file as its state.json
// records it (VerifyCheckpointDir). An error names the first that is not.
absl::Status VerifyCheckpointStep(const std::string& root, const std::string& name);

// The newest step under `root` older than step `before` that VerifyCheckpointStep finds intact: its
// directory name (step_NNNNNNNN). NotFound where none is.
absl::StatusOr<std::string> LastIntactCheckpoint(const std::string& root, int64_t before);

}  // namespace longhaul
