#pragma once
// Loopback ports for processes this one starts on the same machine.
namespace longhaul {

// A loopback TCP port nobody listens on at the moment it is returned (the kernel's pick).
int FreeLoopbackPort();

}  // namespace longhaul
