#pragma once
// Where received tensors wait until the executor takes them. A tensor may arrive in parts (one per
// connection); each part's stream first reserves its range here, so a duplicate, an overlapping
// part or a part of a tensor already taken is refused before the receiver allocates anything.
// Take blocks until the whole tensor has arrived, the deadline passes, or the mailbox is closed.
//
// Only iterations inside the window [lo, lo + width) are accepted from the network: while a worker
// finishes iteration lo, its peers can be at most one iteration ahead (width 2), or with local
// updates another replica up to train.local_steps ahead; while the previous iteration's
// parameters are still to be pulled (an overlapped exchange), lo is that iteration and the width
// one more. Moving the window drops whatever older
// tensors are still held, so a peer cannot park memory here.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace longhaul {

struct TensorKey {
  int kind = 0;  // proto::TensorKind
  int64_t iteration = 0;
  int micro_batch = 0;
  int from_stage = 0;
  int from_replica = 0;
  int shard = 0;
  auto tie() const { return std::tie(kind, iteration, micro_batch, from_stage, from_replica, shard); }
  bool operator<(const TensorKey& o) const { return tie() < o.tie(); }
  std::string DebugString() const;
};

class Mailbox {
 public:
  static constexpr int64_t kWindowIterations = 2;
  // Iterations a worker's mailbox accepts from the one under way: the next too, or with local
  // updates every `local_steps` iteration, as far as another replica can run ahead of this one: to
  // the exchange after the last one this worker took part in (at the start, the initial broadcast).
  static int64_t WindowIterations(int local_steps) {
    return std::max<int64_t>(kWindowIterations, int64_t{local_steps} + 1);
  }

  // Accepts network tensors of iterations [lo, lo + width) from now on and drops held tensors of
  // earlier iterations. Until the first call every iteration is accepted.
  void SetWindow(int64_t lo, int64_t width = kWindowIterations) ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets every tensor, reservation and window, ends a Close, and from now on accepts only parts
  // of plan version `plan_version`: a worker's next plan starts from nothing, and a part of the old
  // plan whose header passed admission just before cannot slip in after.
  void Reopen(uint64_t plan_version) ABSL_LOCKS_EXCLUDED(mu_);

  // Reserves part [offset, offset + n) of `key`'s tensor of `total` elements, sent under plan
  // version `plan_version`, for one incoming stream. Refused (with the reason) when the plan
  // version is not the one Reopen set (any until then), the iteration is outside the window, the part is empty
  // or does not fit (overflow-safe), `total` disagrees with an earlier part's, or the range
  // overlaps a part already reserved or received.
  absl::Status BeginPart(const TensorKey& key, uint64_t plan_version, uint64_t total, uint64_t offset, uint64_t n)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The reserved part's data (n floats). Refused when the window moved past the key meanwhile, or
  // a Reopen forgot the reservation (another plan version's part may hold its place now).
  absl::Status CompletePart(const TensorKey& key, uint64_t plan_version, uint64_t offset, std::vector<float> data)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The reserved part's stream failed or was abandoned: its reservation goes, and the tensor's
  // entry too when nothing else of it is reserved or held.
  void AbandonPart(const TensorKey& key, uint64_t plan_version, uint64_t offset) ABSL_LOCKS_EXCLUDED(mu_);

  // Delivers a whole tensor from this process itself (no window, no reservation).
  void Put(const TensorKey& key, std::vector<float> tensor) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits for the whole tensor; errors name the key and say why (deadline, closed).
  absl::StatusOr<std::vector<float>> Take(const TensorKey& key, std::chrono::milliseconds timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes every Take with an error carrying `reason`.
  void Close(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Aborted with the reason once closed (until the next Reopen), else OK.
  absl::Status Closed() ABSL_LOCKS_EXCLUDED(mu_);

  // A buffer of n floats, reused from tensors handed back with Recycle when one of that size is
  // free (contents unspecified). Reuse keeps steady-state transfers off fresh pages, which the
  // kernel would fault in and zero at a cost comparable to the transfer itself.
  std::vector<float> Acquire(size_t n) ABSL_LOCKS_EXCLUDED(mu_);
  void Recycle(std::vector<float> buffer) ABSL_LOCKS_EXCLUDED(mu_);

  // Floats held in tensors not yet taken, for tests and leak checks.
  size_t HeldFloats() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::vector<float> AcquireLocked(size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecycleLocked(std::vector<float> buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether Take of `key` can return: the tensor is whole, or the mailbox is closed.
  bool TakeReady(const TensorKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Part {
    uint64_t elements = 0;
    bool arrived = false;
    uint64_t plan_version = 0;  // of the part's header
  };
  struct Entry {
    uint64_t total = 0;
    std::vector<float> data;         // allocated when the first part lands
    std::map<uint64_t, Part> parts;  // by offset, reserved or arrived
    uint64_t received = 0;
    bool taken = false;  // kept until the window moves, so a replayed tensor is refused
    bool ready() const { return total > 0 && received == total && !taken; }
  };
  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled when a tensor becomes whole or the mailbox closes
  std::map<TensorKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  bool windowed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t window_lo_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t window_width_ ABSL_GUARDED_BY(mu_) = kWindowIterations;
  std::string closed_ ABSL_GUARDED_BY(mu_);
  uint64_t plan_version_ ABSL_GUARDED_BY(mu_) = 0;  // 0: any
  std::multimap<size_t, std::vector<float>> pool_ ABSL_GUARDED_BY(mu_);  // by size
  size_t pooled_floats_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace longhaul
