// The CPU simulated-VRAM allocator and OOM detection: real torch allocations, real exceptions.
#include <catch2/catch.hpp>

#include <torch/torch.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <new>
#include <random>
#include <thread>

#include "loratrain/memory/budget_allocator.h"
#include "loratrain/memory/oom.h"
#include "loratrain/util/error.h"
#include "test_support.h"

using namespace lt::memory;

using lt::test::MiB;
using lt::test::GiB;

namespace {

std::string oom_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::OutOfMemoryError& e) {
    return e.what_without_backtrace();
  }
  return "";
}
}  // namespace

CATCH_TEST_CASE("budget allocator throws OutOfMemoryError from a real torch allocation", "[memory][allocator]") {
  CpuMemory mem(64 * MiB);
  CATCH_REQUIRE(c10::GetCPUAllocator() == &mem.allocator());
  auto a = torch::empty({8 * MiB}, torch::kFloat32);  // 32 MiB
  CATCH_CHECK(mem.allocated() == 32 * MiB);
  const std::string msg = oom_message([] { auto b = torch::empty({10 * MiB}, torch::kFloat32); });
  CATCH_REQUIRE_FALSE(msg.empty());
  CATCH_CHECK(msg.rfind("CPU simulated VRAM out of memory. Tried to allocate 40.00 MiB.", 0) == 0);
  CATCH_CHECK(msg.find("total capacity of 64.00 MiB of which 32.00 MiB is free") != std::string::npos);
  CATCH_CHECK(msg.find("32.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated") !=
              std::string::npos);
  // The failed allocation left no trace in the books.
  CATCH_CHECK(mem.allocated() == 32 * MiB);

  const OomInfo info = inspect_message(msg);
  CATCH_CHECK(info.kind == FailureKind::gpu_oom);
  CATCH_CHECK(info.simulated);
  CATCH_CHECK_FALSE(info.injected);
  CATCH_CHECK(info.numbers.tried == 40 * MiB);
  CATCH_CHECK(info.numbers.total == 64 * MiB);
  CATCH_CHECK(info.numbers.free == 32 * MiB);
  CATCH_CHECK(info.numbers.allocated == 32 * MiB);
  CATCH_CHECK(info.numbers.reserved_unallocated == 0);
  CATCH_CHECK(info.numbers.needed() == 72 * MiB);

  // An op's output allocation fails the same way (the allocation site inside ATen).
  auto big = torch::ones({6 * MiB}, torch::kFloat32);  // 24 MiB: 56 used
  CATCH_CHECK_THROWS_AS(big * 2, c10::OutOfMemoryError);
}

CATCH_TEST_CASE("budget allocator books are exact over allocate/free cycles", "[memory][allocator]") {
  CpuMemory mem(256 * MiB);
  std::mt19937 rng(7);
  {
    std::vector<torch::Tensor> live;
    int64_t expected = 0;
    for (int i = 0; i < 500; ++i) {
      if (!live.empty() && rng() % 3 == 0) {
        expected -= live.back().nbytes();
        live.pop_back();
      } else {
        const int64_t n = 1 + rng() % 5000;
        live.push_back(torch::empty({n}, torch::kFloat32));
        expected += n * 4;
      }
      CATCH_REQUIRE(mem.allocated() == expected);
    }
    CATCH_CHECK(mem.peak_allocated() >= expected);
  }
  CATCH_CHECK(mem.allocated() == 0);
  CATCH_CHECK(mem.allocator().live_blocks() == 0);

  // Peak and reset.
  mem.reset_peak();
  CATCH_CHECK(mem.peak_allocated() == 0);
  { auto t = torch::empty({MiB}, torch::kUInt8); }
  CATCH_CHECK(mem.peak_allocated() == MiB);
  CATCH_CHECK(mem.allocated() == 0);

  // Concurrent allocations from several threads: lock-free counters stay exact.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      std::mt19937 r(t);
      std::vector<torch::Tensor> mine;
      for (int i = 0; i < 2000; ++i) {
        mine.push_back(torch::empty({static_cast<int64_t>(1 + r() % 1000)}, torch::kUInt8));
        if (mine.size() > 16) mine.erase(mine.begin());
      }
    });
  }
  for (auto& th : threads) th.join();
  CATCH_CHECK(mem.allocated() == 0);
  CATCH_CHECK(mem.allocator().live_blocks() == 0);
}

CATCH_TEST_CASE("installation is scoped and tensors may outlive the allocator", "[memory][allocator]") {
  c10::Allocator* before = c10::GetCPUAllocator();
  torch::Tensor survivor;
  {
    CpuMemory mem(16 * MiB);
    CATCH_CHECK(c10::GetCPUAllocator() != before);
    survivor = torch::full({1000}, 3.0f);
    CATCH_CHECK(mem.allocated() == 4000);
  }
  CATCH_CHECK(c10::GetCPUAllocator() == before);
  CATCH_CHECK(survivor.sum().item<float>() == 3000.0f);
  survivor = torch::Tensor();  // freed through the allocator's state, which outlived the allocator
  auto after = torch::empty({64 * MiB}, torch::kUInt8);  // no budget any more
  CATCH_CHECK(after.numel() == 64 * MiB);
}

CATCH_TEST_CASE("occupy() holds budget like another process would", "[memory][allocator]") {
  CpuMemory mem(64 * MiB);
  mem.allocator().occupy(48 * MiB);
  const FreeTotal ft = mem.free_and_total();
  CATCH_CHECK(ft.total == 64 * MiB);
  CATCH_CHECK(ft.free == 16 * MiB);
  const std::string msg = oom_message([] { auto t = torch::empty({20 * MiB}, torch::kUInt8); });
  CATCH_CHECK(msg.find("Another process has 48.00 MiB memory in use") != std::string::npos);
  const OomNumbers n = parse_oom_numbers(msg);
  CATCH_CHECK(n.other_process == 48 * MiB);
  CATCH_CHECK(n.free == 16 * MiB);
  auto fits = torch::empty({15 * MiB}, torch::kUInt8);
  CATCH_CHECK(mem.free_and_total().free == MiB);
  mem.allocator().occupy(0);
  CATCH_CHECK(mem.free_and_total().free == 49 * MiB);
}

CATCH_TEST_CASE("fault injection fails exactly the requested allocations", "[memory][allocator]") {
  CpuMemory mem(0);  // counting only: every failure is injected
  mem.allocator().fail_next_allocations(3, 1024);
  int failures = 0;
  for (int i = 0; i < 10; ++i) {
    try {
      auto small = torch::empty({16}, torch::kUInt8);  // below min_bytes: never fails
      auto t = torch::empty({4096}, torch::kUInt8);
    } catch (const c10::OutOfMemoryError& e) {
      ++failures;
      const OomInfo info = inspect_failure(e);
      CATCH_CHECK(info.kind == FailureKind::gpu_oom);
      CATCH_CHECK(info.injected);
      CATCH_CHECK(info.numbers.tried == 4096);
    }
  }
  CATCH_CHECK(failures == 3);
  CATCH_CHECK(mem.allocator().injected_failures() == 3);
  CATCH_CHECK(mem.allocated() == 0);

  // Random faults: deterministic in the seed, capped at max_failures.
  auto run = [&](uint64_t seed) {
    mem.allocator().clear_faults();
    mem.allocator().fail_randomly(0.2, seed, 5);
    std::vector<int> failed_at;
    for (int i = 0; i < 200; ++i) {
      try {
        auto t = torch::empty({100}, torch::kUInt8);
      } catch (const c10::OutOfMemoryError&) {
        failed_at.push_back(i);
      }
    }
    return failed_at;
  };
  const auto first = run(42);
  CATCH_CHECK(first.size() == 5);
  CATCH_CHECK(run(42) == first);
  CATCH_CHECK(run(43) != first);
  mem.allocator().clear_faults();
  CATCH_CHECK_NOTHROW(torch::empty({100}, torch::kUInt8));
}

CATCH_TEST_CASE("host allocator failures are host RAM, not GPU OOM", "[memory][oom]") {
  CpuMemory mem(0);
  try {
    auto t = torch::empty({int64_t(1) << 46}, torch::kFloat32);  // 256 TiB: beyond the address space
    CATCH_FAIL("a 256 TiB allocation succeeded");
  } catch (const std::exception& e) {
    const OomInfo info = inspect_failure(e);
    CATCH_CHECK(info.kind == FailureKind::host_oom);
    CATCH_CHECK_FALSE(is_oom(e));
  }
  CATCH_CHECK(mem.allocated() == 0);
  CATCH_CHECK(inspect_failure(std::bad_alloc()).kind == FailureKind::host_oom);
  CATCH_CHECK(inspect_failure(std::make_exception_ptr(std::bad_alloc())).kind == FailureKind::host_oom);
  CATCH_CHECK(inspect_message("DefaultCPUAllocator: not enough memory: you tried to allocate 1024 bytes.").kind ==
              FailureKind::host_oom);
}

CATCH_TEST_CASE("every playbook signature is detected; look-alikes are not", "[memory][oom]") {
  const std::vector<std::pair<std::string, std::string>> oom = {
      {"CUDA out of memory. Tried to allocate 2.00 GiB", "CUDA out of memory"},
      {"RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
       "CUDA error: out of memory"},
      {"CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
       "CUBLAS_STATUS_ALLOC_FAILED"},
      {"cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED"},
      {"cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE", "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE"},
      {"torch.OutOfMemoryError: something", "torch.OutOfMemoryError"},
      {"torch.cuda.OutOfMemoryError: something", "torch.cuda.OutOfMemoryError"},
      {"GPU 0 has a total capacity of 23.65 GiB of which 0 bytes is free.", "0 bytes is free"},
      {"RuntimeError: OOM during training step 3 times in a row, aborting training",
       "OOM during training step"},
      {"CPU simulated VRAM out of memory. Tried to allocate 1.00 MiB.", "CPU simulated VRAM out of memory"},
      {"cuda OUT OF MEMORY", "CUDA out of memory"},
  };
  for (const auto& [text, sig] : oom) {
    const OomInfo info = inspect_message(text);
    CATCH_INFO(text);
    CATCH_CHECK(info.kind == FailureKind::gpu_oom);
    CATCH_CHECK(info.signature == sig);
  }
  CATCH_CHECK(inspect_message("cuDNN error: CUDNN_STATUS_ALLOC_FAILED").environment_signature() == false);
  CATCH_CHECK(inspect_message("CUBLAS_STATUS_ALLOC_FAILED").environment_signature());
  CATCH_CHECK(inspect_message("of which 0 bytes is free").environment_signature());
  for (const char* text : {"Killed", "DataLoader worker (pid 123) is killed by signal: Killed.",
                           "CUDA error: unspecified launch failure", "loss is nan",
                           "FileNotFoundError: model.safetensors", "CUDA error: an illegal memory access"}) {
    CATCH_INFO(text);
    CATCH_CHECK(inspect_message(text).kind == FailureKind::none);
  }
  // By type: c10::OutOfMemoryError with an unknown text is still an OOM; other errors are not.
  try {
    compat::throw_out_of_memory("some backend ran out");
  } catch (const std::exception& e) {
    CATCH_CHECK(is_oom(e));
  }
  CATCH_CHECK_FALSE(is_oom(std::runtime_error("shape mismatch")));
  CATCH_CHECK(inspect_failure(std::make_exception_ptr(42)).kind == FailureKind::none);
}

CATCH_TEST_CASE("allocator message numbers: PyTorch 2.x, 1.13 and the fraction cap", "[memory][oom]") {
  const OomNumbers v2 = parse_oom_numbers(
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total "
      "capacity of 23.65 GiB of which 1.02 GiB is free. Process 4242 has 22.62 GiB memory in use. "
      "Of the allocated memory 18.00 GiB is allocated by PyTorch, and 4.10 GiB is reserved by "
      "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.");
  CATCH_CHECK(v2.tried == int64_t(2.5 * GiB));
  CATCH_CHECK(v2.total == int64_t(std::llround(23.65 * GiB)));
  CATCH_CHECK(v2.free == int64_t(std::llround(1.02 * GiB)));
  CATCH_CHECK(v2.allocated == 18 * GiB);
  CATCH_CHECK(v2.reserved_unallocated == int64_t(std::llround(4.10 * GiB)));
  CATCH_CHECK_FALSE(v2.zero_free);
  CATCH_CHECK_FALSE(v2.other_process.has_value());

  const OomNumbers v113 = parse_oom_numbers(
      "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB "
      "already allocated; 8.75 MiB free; 14.70 GiB reserved in total by PyTorch) If reserved "
      "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.");
  CATCH_CHECK(v113.tried == 20 * MiB);
  CATCH_CHECK(v113.total == int64_t(std::llround(15.78 * GiB)));
  CATCH_CHECK(v113.allocated == int64_t(std::llround(14.56 * GiB)));
  CATCH_CHECK(v113.free == int64_t(std::llround(8.75 * MiB)));
  CATCH_CHECK(v113.reserved_unallocated ==
              int64_t(std::llround(14.70 * GiB)) - int64_t(std::llround(14.56 * GiB)));

  const OomNumbers capped = parse_oom_numbers(
      "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 139.80 GiB of "
      "which 115.00 GiB is free. Including non-PyTorch memory, this process has 24.50 GiB memory in "
      "use. 24.00 GiB allowed; Of the allocated memory 22.00 GiB is allocated by PyTorch, and 1.00 "
      "GiB is reserved by PyTorch but unallocated.");
  CATCH_CHECK(capped.total == 24 * GiB);
  CATCH_CHECK(capped.free == 1 * GiB);

  const OomNumbers full = parse_oom_numbers(
      "CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 23.65 GiB of "
      "which 0 bytes is free.");
  CATCH_CHECK(full.zero_free);
  CATCH_CHECK(full.free == 0);
  CATCH_CHECK_FALSE(full.allocated.has_value());
  CATCH_CHECK_FALSE(full.needed().has_value());
}

CATCH_TEST_CASE("allocator sizes print like PyTorch's", "[memory][allocator]") {
  CATCH_CHECK(format_allocator_size(0) == "0 bytes");
  CATCH_CHECK(format_allocator_size(1024) == "1024 bytes");
  CATCH_CHECK(format_allocator_size(1536) == "1.50 KiB");
  CATCH_CHECK(format_allocator_size(20 * MiB) == "20.00 MiB");
  CATCH_CHECK(format_allocator_size(GiB) == "1024.00 MiB");
  CATCH_CHECK(format_allocator_size(3 * GiB / 2) == "1.50 GiB");
}

CATCH_TEST_CASE("device memory factory and host tuning", "[memory][allocator]") {
  CATCH_CHECK(tune_host_allocator());
  {
    auto mem = make_device_memory({"cpu", 32 * MiB, 0});
    CATCH_CHECK(mem->name() == "cpu (simulated VRAM 32.00 MiB)");
    CATCH_CHECK(mem->free_and_total().total == 32 * MiB);
    CATCH_CHECK_FALSE(mem->is_host());
    CATCH_CHECK_THROWS_AS(torch::empty({33 * MiB}, torch::kUInt8), c10::OutOfMemoryError);
  }
  {
    auto host = make_device_memory({"CPU", 0, 0});
    CATCH_CHECK(host->is_host());
    CATCH_CHECK(host->free_and_total().total > 0);
  }
  CATCH_CHECK_THROWS_AS(make_device_memory({"tpu", 0, 0}), lt::InputError);
  CATCH_CHECK_THROWS_AS(make_device_memory({"cpu", 0, GiB}), lt::InputError);
#ifndef LT_WITH_CUDA
  CATCH_CHECK_THROWS_AS(make_device_memory({"cuda:0", 0, 0}), lt::InputError);
#endif
}
