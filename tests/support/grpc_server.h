#pragma once
// Test helper: a plaintext gRPC server on a free loopback port, serving `service`.
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

namespace longhaul::testing {

// The server; its "127.0.0.1:port" in `address`.
inline std::unique_ptr<grpc::Server> StartLoopbackServer(grpc::Service* service, std::string* address) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  *address = "127.0.0.1:" + std::to_string(port);
  return server;
}

}  // namespace longhaul::testing
