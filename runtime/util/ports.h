#pragma once
// Loopback ports for processes this one starts on the same machine.
namespace longhaul {

// A loopback TCP port nobody holds at the moment it is returned, below the kernel's ephemeral
// range where one is free there (else the kernel's pick), for a process that binds it later.
int FreeLoopbackPort();

}  // namespace longhaul
