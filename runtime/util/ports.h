#pragma once
// Loopback ports for processes this one starts on the same machine.
#include <vector>

namespace longhaul {

// `n` distinct loopback TCP ports nobody holds at the moment they are returned, below the
// kernel's ephemeral range where free ones are there (else the kernel's picks), for processes
// that bind them later.
std::vector<int> FreeLoopbackPorts(int n);

// One such port.
int FreeLoopbackPort();

}  // namespace longhaul
