#include "coordinator/job_state_store.h"

#include <filesystem>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "layout/plan_layout.h"
#include "transport/job_secret.h"
#include "util/atomic_file.h"
#include "util/files.h"
#include "util/status_macros.h"

namespace longhaul {
namespace fs = std::filesystem;

std::string JobStatePath(const std::string& out_dir) { return (fs::path(out_dir) / "job_state.pb").string(); }

absl::StatusOr<std::string> RunDirToken(const std::string& out_dir) {
  const std::string path = (fs::path(out_dir) / kRunDirIdFile).string();
  if (absl::StatusOr<std::string> kept = ReadWholeFile(path); kept.ok() && kept->size() == 2 * kNonceBytes) return kept;
  LH_ASSIGN_OR_RETURN(const std::string nonce, RandomNonce());
  const std::string token = absl::BytesToHexString(nonce);
  LH_RETURN_IF_ERROR(WriteFileAtomically(path, token));
  return token;
}

absl::StatusOr<RestoredJob> ReadJobState(const std::string& path, const JobConfig& cfg) {
  const absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (!bytes.ok()) return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", bytes.status().message()));
  auto damaged = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, " is damaged", why, ": remove it to start the job anew, or to resume "
                                            "from the last checkpoint with --set train.resume=true"));
  };
  proto::JobState state;
  if (!state.ParseFromString(*bytes) || state.plan().version() == 0) return damaged("");
  if (state.plan().job_id() != cfg.cluster.job_id) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s holds the state of job '%s', not '%s': give this job another train.out_dir, or remove the file", path,
        state.plan().job_id(), cfg.cluster.job_id));
  }
  // Each restart publishes the version two past it.
  if (state.plan().version() > uint64_t{1} << 62) return damaged(absl::StrCat(" (plan version ", state.plan().version(), ")"));
  absl::StatusOr<JobConfig> run = ParseJobConfig(state.plan().config_toml(), "the job state's plan");
  if (!run.ok()) return damaged(absl::StrCat(" (", run.status().message(), ")"));
  // A relative train.out_dir the state holds may not resolve from this coordinator's directory:
  // only one that resolves elsewhere is another job's directory.
  std::error_code ec;
  if (fs::exists(run->train.out_dir, ec) && !fs::equivalent(run->train.out_dir, cfg.train.out_dir, ec)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is the state of the job whose train.out_dir is %s: a run directory copied or moved elsewhere goes on from "
        "its checkpoints, not from its job state (remove the file and --set train.resume=true)",
        path, run->train.out_dir));
  }
  if (const absl::Status layout = CheckPlanLayout(state.plan(), *run); !layout.ok()) {
    return damaged(absl::StrCat(" (", layout.message(), ")"));
  }
  std::set<int> recorded;
  for (const proto::WorkerRecord& w : state.workers()) {
    if (!recorded.insert(w.id()).second) return damaged(absl::StrFormat(" (worker %d recorded twice)", w.id()));
  }
  for (const proto::Assignment& a : state.plan().assignments()) {
    if (!recorded.count(a.worker_id())) {
      return damaged(absl::StrFormat(" (its plan places worker %d, which it does not record)", a.worker_id()));
    }
  }
  run->train.out_dir = cfg.train.out_dir;
  return RestoredJob{std::move(state), *std::move(run)};
}

JobStateStore::JobStateStore(const std::string& out_dir)
    : state_path_(JobStatePath(out_dir)), cluster_path_((fs::path(out_dir) / "cluster.json").string()) {}

absl::Status JobStateStore::Write(const proto::JobState& state, const std::string& cluster) {
  if (closed_) return absl::OkStatus();
  const uint64_t version = state.plan().version();
  const bool first = posted_version_ == 0, next = version != posted_version_;
  if (next && writer_.written() < version_post_) writer_.Flush();
  posted_version_ = version;
  std::string bytes;
  state.SerializeToString(&bytes);
  const uint64_t post = writer_.Post({{state_path_, std::move(bytes)}, {cluster_path_, cluster}});
  if (next) version_post_ = post;
  if (first) writer_.Flush();
  return writer_.status();
}

void JobStateStore::Close() {
  closed_ = true;
  writer_.Flush();
  std::error_code ec;
  fs::remove(state_path_, ec);
}

}  // namespace longhaul
