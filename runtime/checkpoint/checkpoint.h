#pragma once
// Training checkpoints: a directory per step holding
//   model.safetensors      parameters under PyTorch-style names (readable by other tools)
//   optimizer.safetensors  AdamW moments as exp_avg.<name> / exp_avg_sq.<name>
//   state.json             step, the iteration the data sampler resumes at, the run's config, and
//                          the size and CRC-32 of each file above
// Directories are written under a temporary name and renamed, so a crash never leaves a
// half-written checkpoint where a resume would find it; `latest` names the newest one.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/safetensors.h"
#include "model/param_layout.h"

namespace longhaul {

struct CheckpointData {
  int64_t step = 0;  // optimizer steps taken; training resumes at iteration `step`
  nlohmann::json run_config;
};

// Saves into root/step_<step>/ and points root/latest at it. m and v may be null (inference-only).
absl::Status SaveCheckpoint(const std::string& root, const CheckpointData& data, const ParamLayout& layout,
                            const float* params, const float* m, const float* v);

// "step_00000042": the directory name of step 42's checkpoint.
std::string CheckpointName(int64_t step);
// Points root/latest at step's checkpoint, atomically (written under another name, then renamed).
absl::Status SetLatestCheckpoint(const std::string& root, int64_t step);

// Path of the newest checkpoint under root, or NotFound; DataLoss when root/latest does not name a
// step directory.
absl::StatusOr<std::string> LatestCheckpoint(const std::string& root);
// The step of a checkpoint directory from its name (".../step_00000042" -> 42).
absl::StatusOr<int64_t> CheckpointStep(const std::string& dir);

// Under each directory of `root` that holds steps (a shard's, a replica's own), removes the step
// directories older than the `keep` newest up to `newest` (complete everywhere); later ones, still
// being written, stay. keep 0 keeps everything.
absl::Status PruneCheckpoints(const std::string& root, int64_t newest, int keep);

// Where parameter-server shard `shard` of stage `stage` keeps its checkpoints under `root`.
std::string ShardCheckpointRoot(const std::string& root, int stage, int shard);
// Where the worker of (stage, replica) keeps its own AdamW state under local updates
// (train.local_steps), written beside the shards' at every checkpoint.
std::string LocalCheckpointRoot(const std::string& root, int stage, int replica);

// Where the error-feedback residuals of the int8 gradient pushes of the job's replica
// `job_replica` of stage `stage` are kept under `root` (as parameters, laid out as the stage's):
// a run that goes back to a checkpoint resumes them with it, so int8 pushes continue bitwise.
std::string ResidualCheckpointRoot(const std::string& root, int stage, int job_replica);

// A directory under a cluster's checkpoints/ that one worker writes: a parameter-server shard's
// (stage_S_shard_K), the error-feedback residuals of a job replica's int8 pushes
// (residual_stage_S_replica_R), or a stage's own AdamW state under local updates
// (local_stage_S_replica_R).
struct CheckpointPieceRoot {
  enum class Kind { kShard, kResidual, kLocal };
  Kind kind = Kind::kShard;
  int stage = 0;
  int index = 0;  // the shard, or the replica
};
// The piece a name under checkpoints/ is, exactly as the three functions above spell it; anything
// else (a path, "..", a leading zero) is refused, so a name that comes over the network cannot
// point outside the run directory.
absl::StatusOr<CheckpointPieceRoot> ParseCheckpointPieceRoot(const std::string& name);
// The most bytes `file` of a piece's step directory may have where the piece holds `tensors`
// tensors of `floats` parameters in all; InvalidArgument for a file a checkpoint does not write
// ("optimizer.safetensors" only `with_moments`).
absl::StatusOr<uint64_t> MaxCheckpointFileBytes(const std::string& file, uint64_t floats, size_t tensors,
                                                bool with_moments);
// A shipped or fetched file travels in parts of at most this many bytes (proto::CheckpointChunk).
inline constexpr size_t kCheckpointChunkBytes = size_t{1} << 20;
// In a run directory: what tells a worker whether it shares the coordinator's (proto::Plan::run_dir_token).
inline constexpr char kRunDirIdFile[] = ".run_dir_id";
// The files of a step directory in the order they are written and shipped: state.json, which
// lists the others, last.
inline constexpr const char* kCheckpointFiles[] = {"model.safetensors", "optimizer.safetensors", "state.json"};
// Whether `name` is one of kCheckpointFiles.
bool IsCheckpointFile(const std::string& name);

// The checkpoint directory of step `name` (e.g. "step_00000042") under root whose state.json
// records the run's config: root/name for a one-process run, else the first parameter-server
// shard's, root/stage_0_shard_0/name (every shard of a step records the same config).
std::string CheckpointStateDir(const std::string& root, const std::string& name);

// Reads dir/state.json alone (no tensors): the step and the config the checkpoint was written
// with. A state.json that is not what longhaul writes is DataLoss, naming the file.
absl::StatusOr<CheckpointData> ReadCheckpointState(const std::string& dir);

// The parameters of a checkpoint directory by name, their file's size and CRC-32 verified against
// state.json: a shard's or a stage's tensors, whatever layout wrote them.
absl::StatusOr<Safetensors> LoadCheckpointParams(const std::string& dir);

// Whether every file dir/state.json lists, model.safetensors among them, has the size and CRC-32
// recorded there: each read through once, none parsed. DataLoss naming the first that has not, or
// is missing, or is no file a checkpoint holds; a state.json that is not what longhaul writes is
// named as for ReadCheckpointState.
absl::Status VerifyCheckpointDir(const std::string& dir);

// Loads a checkpoint directory into buffers laid out by `layout`, verifying sizes, checksums,
// tensor names and shapes; errors name the file and the fix.
absl::StatusOr<CheckpointData> LoadCheckpoint(const std::string& dir, const ParamLayout& layout, float* params,
                                              float* m, float* v);
// LoadCheckpoint of some of a directory's tensors, each to its own offset in the buffers: a
// checkpoint written under another cut of the model holds a stage's tensors in several. Without
// `params` only the moments are read (their file alone).
absl::StatusOr<CheckpointData> LoadCheckpointTensors(const std::string& dir, const std::vector<ParamTensor>& tensors,
                                                     float* params, float* m, float* v);

}  // namespace longhaul
