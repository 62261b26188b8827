#pragma once
// Test helper: a plaintext gRPC server behind its gate (rpc_auth.h) on a free loopback port,
// serving `service` to holders of `secret`, as the coordinator serves its own.
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"

#include "transport/rpc_auth.h"

namespace longhaul::testing {

// The server; its "127.0.0.1:port" in `address`.
inline std::unique_ptr<CoordinatorServer> StartLoopbackServer(grpc::Service* service, std::string* address,
                                                              const JobSecret& secret = JobSecret()) {
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start("127.0.0.1:0", secret, grpc::InsecureServerCredentials(), service);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  *address = (*server)->address();
  return *std::move(server);
}

}  // namespace longhaul::testing
