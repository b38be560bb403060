// Throughput and memory of `diagnose` on a generated log (run by hand, bench/README.md):
//   bench_diagnose [MB]   (default 100)
// Generates a log of tqdm redraws, INFO lines, ANSI colours and a CUDA OOM traceback at the end,
// writes it to a temporary file, diagnoses it from the file, and prints seconds, MB/s and the peak
// resident set size. The acceptance target is 100 MB in under 2 s with memory independent of size.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/diagnosis.h"

namespace {

// User + system CPU seconds of this process so far: on a shared machine the wall time also counts
// the time other processes held the cores.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

void write_log(const std::filesystem::path& path, size_t target_bytes) {
  std::ofstream out(path, std::ios::binary);
  size_t written = 0;
  int64_t step = 0;
  const int64_t total = 1'000'000;
  char buf[512];
  while (written < target_bytes) {
    // One physical line of 20 tqdm redraws, as kohya's "steps" bar prints them.
    std::string line;
    for (int r = 0; r < 20; ++r, ++step) {
      std::snprintf(buf, sizeof buf,
                    "steps:  %2d%%|\xe2\x96\x88\xe2\x96\x88        | %lld/%lld [01:%02d<10:00:00,  1.%02ds/it, avr_loss=0.0%03d]\r",
                    static_cast<int>(step * 100 / total), static_cast<long long>(step), static_cast<long long>(total),
                    static_cast<int>(step % 60), static_cast<int>(step % 100), static_cast<int>(step % 1000));
      line += buf;
    }
    line += "\n";
    std::snprintf(buf, sizeof buf,
                  "\x1b[32m2024-08-01 12:00:%02d INFO\x1b[0m     epoch 1/100 step %lld: saving checkpoint: "
                  "/data/output/lora-%06lld.safetensors   train_network.py:1234\n",
                  static_cast<int>(step % 60), static_cast<long long>(step), static_cast<long long>(step));
    line += buf;
    out << line;
    written += line.size();
  }
  out << "Traceback (most recent call last):\n"
         "  File \"/sd-scripts/train_network.py\", line 1115, in train\n"
         "    accelerator.backward(loss)\n"
         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
         "23.65 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 22.57 GiB memory in "
         "use. Of the allocated memory 21.30 GiB is allocated by PyTorch, and 800.50 MiB is reserved by PyTorch but "
         "unallocated.\n";
}

}  // namespace

int main(int argc, char** argv) {
  double mb = argc > 1 ? std::atof(argv[1]) : 100.0;
  auto path = std::filesystem::temp_directory_path() / "lt_bench_diagnose.log";
  write_log(path, static_cast<size_t>(mb * 1e6));
  auto size = std::filesystem::file_size(path);
  long rss_before = peak_rss_kib();
  const double cpu0 = cpu_seconds();
  auto t0 = std::chrono::steady_clock::now();
  lt::diagnose::Diagnosis d = lt::diagnose::diagnose_path(path.string());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = cpu_seconds() - cpu0;
  long rss_after = peak_rss_kib();
  std::filesystem::remove(path);
  std::printf("log: %.1f MB, %lld lines\n", size / 1e6, static_cast<long long>(d.lines));
  std::printf("diagnose: %.3f s (%.0f MB/s)  verdict: %s, phase %s, step %lld\n", s, size / 1e6 / s,
              lt::diagnose::cause_name(d.cause), lt::diagnose::phase_name(d.phase),
              static_cast<long long>(d.step.value_or(-1)));
  std::printf("cpu: %.3f s (user + system)\n", cpu);
  std::printf("peak RSS: %.1f MiB before, %.1f MiB after (growth %.1f MiB)\n", rss_before / 1024.0,
              rss_after / 1024.0, (rss_after - rss_before) / 1024.0);
  return d.oom ? 0 : 1;
}
