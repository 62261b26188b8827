#include "worker/stage_factory.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/hf_gpt2.h"
#include "cpu/cpu_stage.h"
#include "model/memory_estimate.h"
#include "util/status_macros.h"
#ifdef LONGHAUL_WITH_CUDA
#include "cuda/cuda_ps_shard.h"
#include "cuda/cuda_stage.h"
#endif

namespace longhaul {

StageRequest StageRequestFor(const JobConfig& cfg, int stage, int device, int slots) {
  StageRequest r;
  r.model = cfg.model;
  r.spec = cfg.Stage(stage);
  r.B = cfg.train.micro_batch_size;
  r.T = cfg.train.seq_len;
  r.device = device;
  // The CPU backend computes in fp32 whatever the job asks of its GPU workers.
  r.precision = device < 0 ? Precision::kFp32 : cfg.train.precision;
  r.recompute = cfg.train.recompute;
  r.slots = slots;
  r.seed = cfg.train.seed;
  r.init_from = cfg.train.init_from;
  return r;
}

namespace {

absl::StatusOr<std::unique_ptr<Stage>> MakeBackendStage(const StageRequest& r) {
  if (r.device < 0) {
    LH_ASSIGN_OR_RETURN(std::unique_ptr<CpuStage> s,
                        CpuStage::Create(r.model, r.spec, r.B, r.T, r.recompute, r.slots, r.seed, r.init));
    return std::unique_ptr<Stage>(std::move(s));
  }
#ifdef LONGHAUL_WITH_CUDA
  CudaStage::Options o;
  o.B = r.B, o.T = r.T, o.precision = r.precision, o.device = r.device, o.slots = r.slots, o.recompute = r.recompute;
  o.seed = r.seed;
  o.init = r.init;
  o.optimizer = r.optimizer;
  LH_ASSIGN_OR_RETURN(std::unique_ptr<CudaStage> s, CudaStage::Create(r.model, r.spec, o));
  return std::unique_ptr<Stage>(std::move(s));
#else
  return absl::FailedPreconditionError(absl::StrFormat(
      "backend \"cuda:%d\" but this build has no CUDA backend (nvcc was not found when it was configured); rebuild "
      "where /usr/local/cuda/bin/nvcc exists, or use the \"cpu\" backend",
      r.device));
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const StageRequest& r) {
  LH_ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage, MakeBackendStage(r));
  if (r.init_from.empty()) return stage;
  std::vector<float> params(stage->layout().total());
  if (absl::Status s = ImportHfGpt2(r.init_from, r.model, stage->layout(), params.data()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("train.init_from = \"", r.init_from, "\": ", s.message()));
  }
  LH_RETURN_IF_ERROR(stage->SetParams(0, params.data(), params.size()));
  return stage;
}

double DeviceMemoryAvailable(int device) {
  if (device < 0) return HostMemoryAvailable().bytes;
#ifdef LONGHAUL_WITH_CUDA
  const absl::StatusOr<double> free_bytes = CudaFreeMemory(device);
  return free_bytes.ok() ? *free_bytes : 0;
#else
  return 0;
#endif
}

absl::StatusOr<std::unique_ptr<PsShard>> MakePsShard(int device, const AdamWConfig& adamw,
                                                     const ParamLayout& stage_layout, int stage, int shard,
                                                     int first_tensor, int end_tensor, int replicas) {
  if (device < 0) {
    return std::make_unique<HostPsShard>(adamw, stage_layout, stage, shard, first_tensor, end_tensor, replicas);
  }
#ifdef LONGHAUL_WITH_CUDA
  return MakeCudaPsShard(adamw, stage_layout, stage, shard, first_tensor, end_tensor, replicas, device);
#else
  return absl::FailedPreconditionError(absl::StrFormat(
      "a parameter-server shard on \"cuda:%d\" but this build has no CUDA backend; use the \"cpu\" backend", device));
#endif
}

}  // namespace longhaul
