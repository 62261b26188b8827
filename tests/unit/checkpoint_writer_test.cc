// The checkpoint writer: jobs run on its own thread one at a time and in order, a job submitted
// while one is under way waits for it, a failure comes back at the next Submit or Wait (and its
// successor is not run), Forget drops the failures of jobs submitted before it, and destruction
// waits for the job under way.
#include "worker/checkpoint_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace longhaul {
namespace {

using std::chrono::milliseconds;

TEST(CheckpointWriter, RunsJobsInOrderOneAtATimeOffTheCallersThread) {
  CheckpointWriter w;
  std::vector<int> order;
  std::atomic<int> running{0}, most{0};
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> elsewhere{true};
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(w.Submit([&, i] {
                   if (std::this_thread::get_id() == caller) elsewhere = false;
                   most = std::max(most.load(), ++running);
                   std::this_thread::sleep_for(milliseconds(5));
                   order.push_back(i);
                   --running;
                   return absl::OkStatus();
                 }).ok());
  }
  ASSERT_TRUE(w.Wait().ok());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(most, 1);
  EXPECT_TRUE(elsewhere);
}

TEST(CheckpointWriter, AFailureComesBackOnceAndForgetDropsIt) {
  CheckpointWriter w;
  bool ran = false;
  ASSERT_TRUE(w.Submit([] { return absl::DataLossError("disk full"); }).ok());
  const absl::Status next = w.Submit([&] {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(next.code(), absl::StatusCode::kDataLoss) << next;
  EXPECT_FALSE(ran) << "the job after a failure is not run";
  EXPECT_TRUE(w.Wait().ok()) << "a failure comes back once";

  ASSERT_TRUE(w.Submit([] {
                 std::this_thread::sleep_for(milliseconds(20));
                 return absl::UnavailableError("report refused: a replaced plan");
               }).ok());
  w.Forget();
  EXPECT_TRUE(w.Wait().ok()) << "a job submitted before Forget fails no one";
}

TEST(CheckpointWriter, DestructionWaitsForTheJobUnderWay) {
  std::atomic<bool> done{false};
  {
    CheckpointWriter w;
    ASSERT_TRUE(w.Submit([&] {
                   std::this_thread::sleep_for(milliseconds(30));
                   done = true;
                   return absl::OkStatus();
                 }).ok());
  }
  EXPECT_TRUE(done);
}

}  // namespace
}  // namespace longhaul
