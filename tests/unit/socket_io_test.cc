// The data plane's socket helpers, where nothing else covers them: ProbePort tells a port something
// listens on from one nothing listens on (the coordinator's proof that a worker's process ended)
// and from an address it cannot tell about.
#include "transport/socket_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "absl/status/statusor.h"

namespace longhaul {
namespace {

Deadline Soon() { return std::chrono::steady_clock::now() + std::chrono::seconds(2); }

TEST(SocketIo, ProbePortTellsAListeningPortFromARefusingOneAndFromNoAnswer) {
  std::string bound;
  const absl::StatusOr<int> listening = ListenTcp("127.0.0.1:0", &bound);
  ASSERT_TRUE(listening.ok()) << listening.status();
  EXPECT_EQ(ProbePort(bound, Soon()), PortAnswer::kListening);
  close(*listening);
  EXPECT_EQ(ProbePort(bound, Soon()), PortAnswer::kRefused) << "nothing listens on " << bound << " any more";
  EXPECT_EQ(ProbePort("not an address", Soon()), PortAnswer::kNoAnswer);
}

}  // namespace
}  // namespace longhaul
