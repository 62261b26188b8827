#pragma once
// Subnormal floats computed as zero (x86's flush-to-zero and denormals-are-zero) on the calling
// thread and on every OpenMP thread, where CPU stages, parameter-server shards and the optimizer
// compute. As a model trains, its softmax gives unlikely tokens probabilities below 1e-38 and
// AdamW's second moments fall as low; x86 handles each such operand in microcode, at many times
// the cost of a normal one: the demo at d_model 512 (`longhaul train`, 150 steps) slowed from
// 0.18 to 0.33 s per step without this and stayed at 0.18 s with it, ending at the same loss.
// Threads inherit the setting from the thread that creates them. CUDA kernels are not affected.
namespace longhaul::cpu {

void FlushDenormals();

}  // namespace longhaul::cpu
