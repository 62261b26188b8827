#pragma once
// What every training process does the same way, one process or many: check the job fits in
// memory, load the data, and know the entropy floor of a micro-batch.
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "model/micro_batch.h"
#include "data/token_dataset.h"
#include "longhaul.pb.h"
#include "model/memory_estimate.h"

namespace longhaul {

// Host memory of `longhaul train`: the whole model as one stage on the CPU (on CUDA the stage is on
// the device: CudaStage checks it there), AdamW, the checkpoint's staging copies, the built-in
// corpus, and the process itself.
MemoryEstimate TrainerMemory(const JobConfig& cfg, int threads);
// Host memory of a worker of pipeline stage `stage` hosting `ps_floats` floats of parameter-server
// shards: its stage with the schedule's activation slots, the shards with their AdamW state, the
// transport's buffers, checkpoint staging, the built-in corpus and the process. A stage on cuda:N
// (`device` N; -1 is the CPU) counts only its host copies. A shrunk layout's replica runs `groups`
// of the job's replicas' micro-batches (layout/plan_layout.h GroupsPerReplica) and pushes each group.
MemoryEstimate WorkerMemory(const JobConfig& cfg, int stage, double ps_floats, int threads, int device = -1,
                            int groups = 1);
// Every process of `longhaul local` together: the workers (with `threads` threads each) and the
// coordinator.
MemoryEstimate LocalClusterMemory(const JobConfig& cfg, int threads);
// Floats of the parameter-server shards replica `replica` of `stage` hosts: the coordinator's cuts,
// each on the replica `plan` gives it (null: shard k on replica k, the config's own layout).
double HostedPsFloats(const JobConfig& cfg, int stage, int replica, const proto::Plan* plan = nullptr);

// ResourceExhausted, with the estimate, the memory available and the fix, when the job does not
// fit: `longhaul train`; one worker; every process of `longhaul local` on this machine together.
absl::Status CheckTrainerMemory(const JobConfig& cfg, const MemoryLimit& available = HostMemoryAvailable());
// `device`: -1 for a CPU stage (held in host memory), N for one on cuda:N (only its host copies).
absl::Status CheckWorkerMemory(const JobConfig& cfg, const proto::Plan* plan, int stage, int replica, int threads,
                               int device, const MemoryLimit& available = HostMemoryAvailable());
// A stage of `spec` holding one micro-batch, on the CPU (`device` -1; a GPU stage checks its own
// device): the compute probe's stages, before any is built.
absl::Status CheckProbeStageMemory(const JobConfig& cfg, const StageSpec& spec, int threads, int device,
                                   const MemoryLimit& available = HostMemoryAvailable());
absl::Status CheckLocalClusterMemory(const JobConfig& cfg, const MemoryLimit& available = HostMemoryAvailable());

// Loads config.data and checks every token fits model.vocab_size.
absl::StatusOr<TokenDataset> LoadDataset(const JobConfig& cfg);

// Entropy floor (nats/token) of the positions the loss counts, or -1 when the data has no known
// source.
double EntropyFloor(const TokenDataset& data, const MicroBatch& mb);

}  // namespace longhaul
