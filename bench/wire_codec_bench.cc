// The wire formats on the GPU (cuda/wire_codec.cuh) against the same formats on the host
// (format/wire_dtype.h), which is where a GPU worker's boundary tensors are encoded today; without
// a GPU the host's columns alone, the per-value rates the planner prices encoding at. One
// GPT-3 XL boundary tensor (micro-batch x 2048 x 2048), each format encoded and decoded on both,
// times side by side with the ratio, and the device's share of the stage's compute per
// micro-batch (2 blocks, the source layout's stage, from the GPU's planner profile). A middle
// stage encodes and decodes twice per micro-batch (its activation out and the gradient in, the
// gradient out and the activation in); the bench fails where that takes over 10% of the compute.
// Then the low-rank codec at ranks d_model / 4 and / 8: on the host's BLAS with every core
// (cpu/low_rank.h; the rate the planner prices a subspace model's narrowed boundaries at on a GPU
// worker, plan/cost_model.h's kHostLowRankFlops) and on the device (cuda/low_rank.cuh), with what
// the planner prices the device's at (kDeviceLowRankShare of the block's rate, kDevicePivotSeconds
// a pivot) and its share of the stage's compute; the bench fails where the device takes over 1.25x
// the planner's price, which the planner's constants must then follow.
//
//   wire_codec_bench [--micro-batch 1] [--profile runtime/plan/profiles/h200.toml]
#include <cuda_runtime.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cuda/cuda_stage.h"
#include "cpu/low_rank.h"
#include "cuda/cublas_api.h"
#include "cuda/low_rank.cuh"
#include "cuda/wire_codec.cuh"
#include "format/wire_dtype.h"
#include "metrics/flops.h"
#include "plan/cost_model.h"
#include "util/median.h"

namespace {

using longhaul::WireDtype;

using longhaul::Median;

// Median seconds of `reps` runs of `f`, each timed between events on the default stream.
template <class F>
double DeviceSeconds(int reps, F f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  for (int r = 0; r < reps + 1; ++r) {  // the first warms up
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (r > 0) t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Median(t);
}

template <class F>
double HostSeconds(int reps, F f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(t);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Boundary wire formats: encoded on the GPU against encoded on the host"};
  int micro_batch = 1;
  std::string profile = std::string(LONGHAUL_SOURCE_DIR) + "/runtime/plan/profiles/h200.toml";
  app.add_option("--micro-batch", micro_batch, "sequences of 2048 tokens per micro-batch")->capture_default_str();
  app.add_option("--profile", profile, "the GPU's planner profile, for the stage's compute")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::string why;
  const bool gpu = longhaul::CudaDeviceCount(&why) > 0;
  double stage_s = 0, block_flops_per_s = 0;
  std::string device_name = "no GPU";
  if (gpu) {
    absl::StatusOr<longhaul::DeviceCost> device = longhaul::DeviceCost::LoadProfile(profile);
    if (!device.ok()) {
      std::cerr << "wire_codec_bench: " << device.status().message() << "\n";
      return 2;
    }
    longhaul::WorkShape shape;
    shape.model.d_model = 2048;
    shape.model.n_head = 16;
    shape.seq_len = 2048;
    shape.micro_batch = micro_batch;
    shape.precision = longhaul::Precision::kBf16;
    absl::StatusOr<longhaul::ComputeTimes> block = device->Block(shape);
    if (!block.ok()) {
      std::cerr << "wire_codec_bench: " << block.status().message() << "\n";
      return 2;
    }
    stage_s = 2 * (block->forward_s + block->backward_s);
    block_flops_per_s = longhaul::BlockFlops(shape.model, micro_batch, shape.seq_len, false) /
                        (block->forward_s + block->backward_s);
    device_name = device->name();
  }

  const size_t n = static_cast<size_t>(micro_batch) * 2048 * 2048;
  std::vector<float> host(n), back(n);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0, 1);
  for (float& v : host) v = normal(gen);
  float *in = nullptr, *out = nullptr;
  void* wire = nullptr;
  if (gpu) {
    cudaMalloc(&in, 4 * n);
    cudaMalloc(&out, 4 * n);
    cudaMalloc(&wire, 4 * n);
    cudaMemcpy(in, host.data(), 4 * n, cudaMemcpyHostToDevice);
  }
  std::vector<uint8_t> host_wire(4 * n);
  // One core: the rate the planner prices a connection's thread at (the encoders share a large
  // tensor's blocks among the cores where they are free).
  omp_set_num_threads(1);

  std::printf("boundary tensor %zu values (micro-batch %d x 2048 x 2048); host: one core, ns a value (encoded to the "
              "nearest, stochastically, decoded: plan/cost_model.h's HostCodecSeconds)",
              n, micro_batch);
  if (gpu) std::printf("; stage compute %.2f ms per micro-batch (2 blocks, %s)", stage_s * 1e3, device_name.c_str());
  std::printf("\n%-6s %8s %10s %10s %10s %12s %12s %8s %10s\n", "format", "MB", "host enc", "host sr", "host dec",
              "gpu enc ms", "gpu dec ms", "host/gpu", "gpu share");
  bool failed = false;
  for (WireDtype d : {WireDtype::kF16, WireDtype::kBf16, WireDtype::kInt8, WireDtype::kInt4, WireDtype::kInt3,
                      WireDtype::kInt2, WireDtype::kInt3H, WireDtype::kInt2H}) {
    // Gradients in the few-level formats round stochastically (tensor_transport.cc): the costlier way.
    const longhaul::StochasticRounding sr{42, 0};
    const longhaul::StochasticRounding* rounding = longhaul::FewLevels(d) ? &sr : nullptr;
    const double host_enc = HostSeconds(5, [&] { longhaul::EncodeWire(host.data(), n, d, host_wire.data()); });
    const double host_sr = HostSeconds(5, [&] { longhaul::EncodeWire(host.data(), n, d, host_wire.data(), &sr); });
    const double host_dec = HostSeconds(5, [&] { longhaul::DecodeWire(host_wire.data(), n, d, back.data()); });
    const double ns = 1e9 / static_cast<double>(n);
    std::printf("%-6s %8.2f %10.2f %10.2f %10.2f", longhaul::WireDtypeName(d), longhaul::WireBytes(n, d) / 1e6,
                host_enc * ns, host_sr * ns, host_dec * ns);
    if (!gpu) {
      std::printf("\n");
      continue;
    }
    bool ok = true;
    const double enc = DeviceSeconds(20, [&] { ok = ok && longhaul::cuda::EncodeWire(nullptr, in, n, d, wire, rounding).ok(); });
    const double dec = DeviceSeconds(20, [&] { ok = ok && longhaul::cuda::DecodeWire(nullptr, wire, n, d, out).ok(); });
    const double share = 2 * (enc + dec) / stage_s;
    std::printf(" %12.3f %12.3f %7.0fx %9.1f%%\n", enc * 1e3, dec * 1e3,
                ((rounding ? host_sr : host_enc) + host_dec) / (enc + dec), 100 * share);
    if (!ok || cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("  %s: a kernel failed\n", longhaul::WireDtypeName(d));
      failed = true;
    }
    if (share > 0.10) {
      std::printf("  %s: encoding and decoding twice a micro-batch take %.1f%% of the stage's compute (target <= 10%%)\n",
                  longhaul::WireDtypeName(d), 100 * share);
      failed = true;
    }
  }
  omp_set_num_threads(omp_get_num_procs());
  std::printf("\nlow rank (encode: 8 T k r + 4 r^2 (2T + k) FLOPs; decode: 2 T k r); host: its BLAS, %d cores\n"
              "%-6s %8s %10s %10s %10s",
              omp_get_num_procs(), "rank", "MB fp32", "host enc", "host dec", "GFLOP/s");
  if (gpu) std::printf(" %12s %12s %10s %12s %10s", "gpu enc ms", "gpu dec ms", "GFLOP/s", "planned ms", "gpu share");
  std::printf("\n");
  cublasHandle_t blas = nullptr;
  if (gpu) {
    const absl::StatusOr<const longhaul::Cublas*> cublas = longhaul::LoadCublas();
    if (!cublas.ok() || (*cublas)->create(&blas) != CUBLAS_STATUS_SUCCESS) {
      std::cerr << "wire_codec_bench: no cuBLAS handle: " << cublas.status().message() << "\n";
      return 2;
    }
  }
  for (int divisor : {4, 8}) {
    const longhaul::BoundaryShape b{n / 2048, 2048, 2048, 2048 / divisor};
    std::vector<float> factors(b.sent());
    longhaul::cpu::LowRankCodec codec;
    bool ok = true;
    const double enc = HostSeconds(3, [&] { ok = ok && codec.Encode(host.data(), b.rows, 2048, b.rank, 7, factors.data()).ok(); });
    const double dec =
        HostSeconds(3, [&] { ok = ok && longhaul::cpu::LowRankCodec::Decode(factors.data(), b.rows, 2048, b.rank, back.data()).ok(); });
    const double flops = b.LowRankFlops(true) + b.LowRankFlops(false);
    std::printf("%-6d %8.2f %10.2f %10.2f %10.1f", b.rank, 4e-6 * b.sent(), enc * 1e3, dec * 1e3,
                flops / (enc + dec) / 1e9);
    if (gpu) {
      longhaul::cuda::LowRankCodec device;
      float* sent = static_cast<float*>(wire);
      const double gpu_enc = DeviceSeconds(10, [&] {
        ok = ok && device.Encode(blas, nullptr, in, b.rows, 2048, b.rank, 7, sent).ok();
      });
      const double gpu_dec = DeviceSeconds(10, [&] {
        ok = ok && longhaul::cuda::LowRankCodec::Decode(blas, sent, b.rows, 2048, b.rank, out).ok();
      });
      const double planned = flops / (block_flops_per_s * longhaul::kDeviceLowRankShare) +
                             6 * b.rank * longhaul::kDevicePivotSeconds;
      std::printf(" %12.3f %12.3f %10.1f %12.3f %9.1f%%", gpu_enc * 1e3, gpu_dec * 1e3,
                  flops / (gpu_enc + gpu_dec) / 1e9, planned * 1e3, 100 * 2 * (gpu_enc + gpu_dec) / stage_s);
      if (gpu_enc + gpu_dec > 1.25 * planned) {
        std::printf("\n  rank %d: the device takes %.2fx the planner's price (kDevicePivotSeconds, "
                    "kDeviceLowRankShare in plan/cost_model.h)", b.rank, (gpu_enc + gpu_dec) / planned);
        failed = true;
      }
    }
    std::printf("\n");
    if (!ok || (gpu && cudaDeviceSynchronize() != cudaSuccess)) {
      std::printf("  rank %d: the codec failed\n", b.rank);
      failed = true;
    }
  }
  if (blas != nullptr) longhaul::LoadedCublas().destroy(blas);
  if (gpu) {
    cudaFree(in);
    cudaFree(out);
    cudaFree(wire);
  } else {
    std::printf("wire_codec_bench: the device's columns skipped: %s\n", why.c_str());
  }
  return failed ? 1 : 0;
}
