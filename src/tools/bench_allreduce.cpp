// bench-allreduce: all-reduce bus bandwidth over a sweep of sizes, like nccl-tests'
// all_reduce_perf, from inside the container: checks a cluster's fabric (EFA or TCP) before a long
// job. NCCL on GPUs (the trainer's path), MPI on the CPU.
//   mpirun -np 16 bench-allreduce --min-bytes 1M --max-bytes 256M
// algbw = bytes / time; busbw = algbw x 2(N-1)/N, comparable with the link's speed.
// As an acceptance gate (scripts/k8s/render.sh allreduce-NODE-TYPE) it fails, exit 1, when any
// element sums wrong or the largest message's busbw falls short of --min-busbw.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <map>

#include "base/user_error.h"
#include "src/device.h"
#include "src/distributed/process_group.h"
#include "src/environment.h"

namespace trainer {
namespace {

struct Options {
  int64_t min_bytes = 8;
  int64_t max_bytes = 256 << 20;
  int64_t iters = 20;
  int64_t warmup = 5;
  std::string dtype = "float";
  DeviceChoice device = DeviceChoice::kAuto;
  double min_busbw = 0;  // GB/s at the largest message; 0: no gate
};

// Mean seconds per all-reduce of `tensor` over `iters` runs.
double time_allreduce(ProcessGroup& group, at::Tensor& tensor, const Options& o) {
  const bool cuda = tensor.is_cuda();
  cudaStream_t stream = cuda ? c10::cuda::getCurrentCUDAStream().stream() : nullptr;
  for (int64_t i = 0; i < o.warmup; ++i) group.allreduce_sum_(tensor, stream);
  group.sum(0);  // line the ranks up (host barrier)
  if (!cuda) {
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < o.iters; ++i) group.allreduce_sum_(tensor);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
           o.iters;
  }
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  start.record();
  for (int64_t i = 0; i < o.iters; ++i) group.allreduce_sum_(tensor, stream);
  stop.record();
  stop.synchronize();
  return start.elapsed_time(stop) / 1000.0 / o.iters;
}

// Elements whose all-reduced value is not the number of ranks (every rank gives ones: sums stay
// exact in fp16 and bf16 up to 256 ranks, where rank + 1 would round from 23).
int64_t count_wrong(ProcessGroup& group, at::Tensor& tensor) {
  tensor.fill_(1);
  group.allreduce_sum_(tensor,
                       tensor.is_cuda() ? c10::cuda::getCurrentCUDAStream().stream() : nullptr);
  const double expected = group.size();
  return group.sum(tensor.to(at::kDouble).ne(expected).sum().item<int64_t>());
}

// What a sweep found: the elements summed wrong, and the largest message's bus bandwidth.
struct Sweep {
  int64_t wrong_sums = 0;
  double busbw = 0;
  int64_t bytes = 0;
};

// All-reduces of each size from --min-bytes to --max-bytes, doubling, printed as a table.
Sweep sweep(ProcessGroup& group, c10::Device device, at::ScalarType dtype, const Options& o) {
  const double ring = group.size() > 1 ? 2.0 * (group.size() - 1) / group.size() : 1.0;
  if (group.rank() == 0)
    std::printf("# %12s %12s %6s %10s %10s %10s %6s\n", "bytes", "count", "type", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  Sweep found;
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const int64_t count = std::max<int64_t>(1, bytes / c10::elementSize(dtype));
    at::Tensor tensor = at::ones({count}, at::TensorOptions().device(device).dtype(dtype));
    const double seconds = time_allreduce(group, tensor, o);
    const int64_t wrong = count_wrong(group, tensor);
    const double algbw = count * c10::elementSize(dtype) / seconds / 1e9;
    if (group.rank() == 0)
      std::printf("  %12lld %12lld %6s %10.1f %10.2f %10.2f %6lld\n",
                  static_cast<long long>(count * c10::elementSize(dtype)),
                  static_cast<long long>(count), o.dtype.c_str(), seconds * 1e6, algbw,
                  algbw * ring, static_cast<long long>(wrong));
    found = {found.wrong_sums + wrong, algbw * ring,
             count * static_cast<int64_t>(c10::elementSize(dtype))};
  }
  return found;
}

// The gate: 0 when every sum was right and the largest message reached --min-busbw, else 1.
// Rank 0 judges by the figures it printed (each rank times its own calls) and tells the others,
// so that every rank exits alike and mpirun's status is the verdict.
int verdict(ProcessGroup& group, const Options& o, const Sweep& found) {
  const bool fast_enough = found.busbw >= o.min_busbw;
  const bool passed = found.wrong_sums == 0 && fast_enough;
  if (group.rank() == 0) {
    std::printf("# busbw at %lld bytes: %.2f GB/s (required: %g): %s\n",
                static_cast<long long>(found.bytes), found.busbw, o.min_busbw,
                passed ? "ok" : "FAILED");
    std::fflush(stdout);
    if (found.wrong_sums != 0)
      std::fprintf(stderr,
                   "bench-allreduce: FAILED: %lld element(s) summed wrong. HINT: a faulty GPU, "
                   "link or driver; run it again on the nodes apart to find which\n",
                   static_cast<long long>(found.wrong_sums));
    if (!fast_enough)
      std::fprintf(stderr,
                   "bench-allreduce: FAILED: bus bandwidth %.2f GB/s at %lld bytes, below the "
                   "required %g GB/s (--min-busbw). HINT: NCCL may be using TCP, not EFA "
                   "(scripts/k8s/check_efa.sh reads its log); or a node's link is degraded\n",
                   found.busbw, static_cast<long long>(found.bytes), o.min_busbw);
  }
  return group.sum(group.rank() == 0 && !passed ? 1 : 0) == 0 ? 0 : 1;
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"All-reduce bus bandwidth over a sweep of sizes (run under mpirun)"};
  app.add_option("--min-bytes", o.min_bytes, "smallest message (K, M, G suffixes)")
      ->transform(CLI::AsSizeValue(/*kb_is_1000=*/false))
      ->capture_default_str();
  app.add_option("--max-bytes", o.max_bytes, "largest message")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--iters", o.iters, "timed all-reduces per size")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed all-reduces per size")->capture_default_str();
  app.add_option("--dtype", o.dtype, "float | half | bf16")
      ->check(CLI::IsMember({"float", "half", "bf16"}))
      ->capture_default_str();
  std::map<std::string, DeviceChoice> devices;
  for (const auto& choice : choice_names(DeviceChoice{})) devices[choice.name] = choice.value;
  app.add_option("--device", o.device, "auto | cuda | cpu")
      ->transform(CLI::CheckedTransformer(devices))
      ->default_str("auto");
  app.add_option("--min-busbw", o.min_busbw,
                 "fail (exit 1) unless the largest message's bus bandwidth reaches this, GB/s")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  USER_CHECK(o.min_bytes > 0 && o.min_bytes <= o.max_bytes && o.iters > 0, "need 0 < --min-bytes",
             " <= --max-bytes and --iters > 0");
  const Environment env = read_environment();
  ProcessGroup group(env, std::chrono::seconds(300));
  const c10::Device device = select_device(o.device, group.local_rank());
  const at::ScalarType dtype = o.dtype == "half"   ? at::kHalf
                               : o.dtype == "bf16" ? at::kBFloat16
                                                   : at::kFloat;
  USER_CHECK(device.is_cuda() || dtype == at::kFloat, "--dtype ", o.dtype,
             " needs GPUs (NCCL); MPI on the CPU reduces float");
  const std::string nccl = group.init_nccl(device);
  if (group.rank() == 0)
    std::printf("# %d rank(s), %s%s%s\n", group.size(), describe_device(device).c_str(),
                nccl.empty() ? "" : ", ", nccl.c_str());
  c10::cuda::OptionalCUDAGuard guard;
  if (device.is_cuda()) guard.set_device(device);
  return verdict(group, o, sweep(group, device, dtype, o));
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  try {
    return trainer::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench-allreduce: %s\n", e.what());
    return 2;
  }
}
