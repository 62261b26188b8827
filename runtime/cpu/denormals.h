#pragma once
// Subnormal floats computed as zero (x86's flush-to-zero and denormals-are-zero) on the calling
// thread and on every OpenMP thread, where CPU stages, parameter-server shards and the optimizer
// compute. As a model trains, its softmax gives unlikely tokens probabilities below 1e-38 and
// AdamW's second moments fall as low; x86 handles each such operand in microcode, at many times
// the cost of a normal one, so training slows as it goes (README, "Notes on the machine"); with them
// flushed it keeps its pace and ends at the same loss.
// Threads inherit the setting from the thread that creates them. CUDA kernels are not affected.
namespace longhaul::cpu {

void FlushDenormals();

}  // namespace longhaul::cpu
