#include "signatures.h"

#include "text.h"

namespace lt::diagnose::detail {
namespace {

// ---- qualifying conditions (each used by the rows below) ----

bool on_error_line(const LineFacts& f) { return f.fatal(); }

// "Tried to allocate" only with a size (the words alone appear in docs and warnings), and not in
// c10's CPU allocator message ("DefaultCPUAllocator: not enough memory: you tried to allocate N
// bytes", c10/core/impl/alloc_cpu.cpp): that one is host RAM.
bool has_size_unit(const LineFacts& f) {
  if (contains(f.low, "cpuallocator") || contains(f.low, "you tried to allocate")) return false;
  for (std::string_view u : {"gib", "mib", "kib", "bytes", " gb", " mb"})
    if (contains(f.low, u)) return true;
  return false;
}

// PyTorch's memory-fraction message ("Allocation on device 0 would exceed allowed memory. (out of
// memory)") and the bare text cudaMallocAsync gives a torch.OutOfMemoryError, which ComfyUI (its
// default allocator) prints after "!!! Exception during processing !!!" (ComfyUI: execution.py).
bool allocation_on_device(const LineFacts& f) {
  if (contains(f.low, "out of memory") || contains(f.low, "exceed") || f.fatal() || contains(f.low, "!!!"))
    return true;
  std::string_view rest = f.low.substr(f.end);
  while (!rest.empty() && (rest.front() == ' ' || is_digit(rest.front()))) rest.remove_prefix(1);
  return rest.empty();
}

// AI Toolkit: "OOM during training step 3 times in a row, aborting training".
bool oom_in_a_row(const LineFacts& f) { return contains(f.low, "oom"); }

// "MemoryError" as a word ("OutOfMemoryError" is the GPU one), or numpy's ArrayMemoryError.
bool memory_error_word(const LineFacts& f) {
  return f.pos == 0 || !is_word(f.low[f.pos - 1]) || contains(f.low, "arraymemoryerror");
}

bool not_about_a_worker(const LineFacts& f) { return !contains(f.low, "worker"); }

// deepspeed/launcher/launch.py sigkill_handler() ("Killing subprocess N") stops the other ranks
// after one failed: the launcher's doing, not the kernel's OOM killer.
bool not_the_launcher(const LineFacts& f) { return !contains(f.low, "sigkill_handler"); }

bool host_memory_failure(const LineFacts& f) {
  return f.fatal() || contains(f.low, "too small") || contains(f.low, "out of memory");
}

// numpy: "Unable to allocate 3.2 GiB for an array with shape ...".
bool numpy_allocation(const LineFacts& f) { return contains(f.low, "array") || contains(f.low, "gib for"); }

// "Killed", "./train.sh: line 3: 1234 Killed  python train.py", "zsh: killed  python ...",
// "[1]+  Killed   accelerate launch ...". Not "DataLoader worker (pid 1) is killed by signal".
bool shell_killed(const LineFacts& f) {
  std::string_view t = f.low;
  while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
  if (contains(t, "worker") || t.size() > 400) return false;
  if (t == "killed" || starts_with(t, "killed ")) return true;
  const size_t p = t.find("killed");
  if (p == std::string_view::npos || !whole_word(t, p, p + 6)) return false;
  size_t b = p;
  while (b > 0 && t[b - 1] == ' ') --b;
  if (b > 0 && (is_digit(t[b - 1]) || t[b - 1] == ':' || t[b - 1] == '+' || t[b - 1] == ']')) return true;
  for (std::string_view w : {"process killed", "was killed", "got killed", "been killed", "killed by the",
                             "signal: killed"})
    if (contains(t, w)) return true;
  return false;
}

// Exit status 137 / -9 / 247 (128+9, -9, its unsigned byte): the kernel's SIGKILL.
bool sigkill_exit_code(const LineFacts& f) {
  const auto code = int_after(f.low, f.end, 12);
  return code && (*code == 137 || *code == -9 || *code == 247);
}

bool mentions_worker(const LineFacts& f) { return contains(f.low, "worker"); }
bool worker_or_shm(const LineFacts& f) {
  return contains(f.low, "worker") || contains(f.low, "shm") || contains(f.low, "shared memory");
}
bool shm_failure(const LineFacts& f) {
  return contains(f.low, "no space") || contains(f.low, "error") || contains(f.low, "insufficient");
}
bool worker_died(const LineFacts& f) { return contains(f.low, "killed") || contains(f.low, "exited"); }

// "loss=nan", "loss: nan", "avr_loss=nan", "loss is nan", "loss = inf", "loss/current: nan".
bool nan_after_loss(const LineFacts& f) {
  const std::string_view low = f.low;
  size_t i = f.end;
  const size_t lim = std::min(low.size(), i + 14);
  while (i < lim && (is_word(low[i]) || low[i] == '/')) ++i;
  while (i < lim && (low[i] == ' ' || low[i] == '=' || low[i] == ':' || low[i] == '"' || low[i] == '\'')) ++i;
  if (low.compare(i, 3, "is ") == 0) i += 3;
  for (std::string_view w : {"nan", "inf", "-inf", "+inf"}) {
    if (low.compare(i, w.size(), w) != 0) continue;
    const size_t e = i + w.size();
    if (e >= low.size() || !is_word(low[e])) return true;
  }
  return false;
}

// " Xid 79" / " Xid (PCI:...)" in a kernel log line.
bool xid_code(const LineFacts& f) { return f.end < f.low.size() && (is_digit(f.low[f.end]) || f.low[f.end] == '('); }

bool exception_or_error(const LineFacts& f) { return f.exception || f.error_level; }
// Words that also appear in harmless warnings count on exception lines only.
bool on_exception_line(const LineFacts& f) { return f.exception; }
bool module_attribute(const LineFacts& f) { return contains(f.low, "module ") && f.fatal(); }

}  // namespace

const std::vector<Signature>& signatures() {
  using C = Cause;
  using O = OomKind;
  static const std::vector<Signature> table = {
      // ---- GPU out of memory (playbook §1 and the variants of other backends) ----
      {"cuda out of memory", C::kGpuOom, O::kHard},  // PyTorch caching allocator
      {"outofmemoryerror", C::kGpuOom, O::kHard},    // torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
      {"cuda error: out of memory", C::kGpuOom, O::kHard},
      {"cuda_error_out_of_memory", C::kGpuOom, O::kHard},
      {"cudaerrormemoryallocation", C::kGpuOom, O::kHard},
      {"cublas_status_alloc_failed", C::kGpuOom, O::kHard},
      {"cudnn_status_alloc_failed", C::kGpuOom, O::kHard},
      {"hip out of memory", C::kGpuOom, O::kHard},
      {"mps backend out of memory", C::kGpuOom, O::kHard},
      {"xpu out of memory", C::kGpuOom, O::kHard},
      {"allocation on device", C::kGpuOom, O::kHard, allocation_on_device},
      {"driver error: out of memory", C::kGpuOom, O::kHard},
      {"0 bytes is free", C::kGpuOom, O::kHard},
      {"tried to allocate", C::kGpuOom, O::kHard, has_size_unit},
      {"out of memory on device", C::kGpuOom, O::kHard},
      {"cuda oom", C::kGpuOom, O::kHard},
      {"gpu out of memory", C::kGpuOom, O::kHard},
      {"cuda memory error", C::kGpuOom, O::kHard},
      {"out of gpu memory", C::kGpuOom, O::kHard},
      {"ran out of gpu memory", C::kGpuOom, O::kHard},
      {"ran out of vram", C::kGpuOom, O::kHard},
      {"out of vram", C::kGpuOom, O::kHard},
      // ComfyUI: execution.py logs this after any torch OOM exception, and adds this tip to it.
      {"got an oom, unloading all loaded models", C::kGpuOom, O::kHard},
      {"you ran out of memory on your gpu", C::kGpuOom, O::kHard},
      // AI Toolkit: jobs/process/BaseSDTrainProcess.py gives up after 3 skipped OOM steps in a row.
      {"times in a row", C::kGpuOom, O::kHard, oom_in_a_row},
      // AI Toolkit: the banner of an OOM step it skipped ("# OOM during training step, skipping batch 1/3 #").
      {"oom during training step, skipping", C::kGpuOom, O::kRecovered},
      {"cublas_status_not_initialized", C::kGpuOom, O::kWeak},
      {"cudnn_status_internal_error", C::kGpuOom, O::kWeak},
      {"cudnn_status_not_initialized", C::kGpuOom, O::kWeak},

      // ---- system RAM ----
      {"the paging file is too small", C::kHostOom},
      {"winerror 1455", C::kHostOom},
      {"defaultcpuallocator", C::kHostOom},
      {"cannot allocate memory", C::kHostOom},
      {"std::bad_alloc", C::kHostOom},
      {"out of memory: killed process", C::kHostOom},
      {"oom-kill", C::kHostOom},
      {"oom_kill", C::kHostOom},
      {"oom killer", C::kHostOom},
      {"oom-killer", C::kHostOom},
      {"memoryerror", C::kHostOom, O::kNone, memory_error_word},
      {"unable to allocate", C::kHostOom, O::kNone, numpy_allocation},
      {"sigkill", C::kHostOom, O::kNone, not_the_launcher},
      {"signal 9", C::kHostOom, O::kNone, not_about_a_worker},
      {"not enough memory: you tried", C::kHostOom},
      {"out of host memory", C::kHostOom},
      {"paging file", C::kHostOom, O::kNone, host_memory_failure},
      {"killed process", C::kHostOom, O::kNone, host_memory_failure},
      {"system ram", C::kHostOom, O::kNone, host_memory_failure},
      {"arraymemoryerror", C::kHostOom},
      {"killed", C::kHostOom, O::kNone, shell_killed},
      {"exit status", C::kHostOom, O::kNone, sigkill_exit_code},
      {"exit code", C::kHostOom, O::kNone, sigkill_exit_code},
      {"exitcode", C::kHostOom, O::kNone, sigkill_exit_code},
      {"return code", C::kHostOom, O::kNone, sigkill_exit_code},
      {"returncode", C::kHostOom, O::kNone, sigkill_exit_code},
      {"exited with code", C::kHostOom, O::kNone, sigkill_exit_code},
      {"exit_code", C::kHostOom, O::kNone, sigkill_exit_code},
      {"exit value", C::kHostOom, O::kNone, sigkill_exit_code},

      // ---- DataLoader workers ----
      {"dataloader worker", C::kDataLoaderWorker},
      {"exited unexpectedly", C::kDataLoaderWorker, O::kNone, mentions_worker},
      {"insufficient shared memory", C::kDataLoaderWorker},
      {"bus error", C::kDataLoaderWorker, O::kNone, worker_or_shm},
      {"/dev/shm", C::kDataLoaderWorker, O::kNone, shm_failure},
      {"unable to write to file </torch_", C::kDataLoaderWorker},
      {"worker (pid", C::kDataLoaderWorker, O::kNone, worker_died},

      // ---- NaN / inf loss ----
      {"nan detected", C::kNanLoss},
      {"detected nan", C::kNanLoss},
      {"returned nan values", C::kNanLoss},
      {"non-finite loss", C::kNanLoss},
      {"nan loss", C::kNanLoss},
      {"nan in loss", C::kNanLoss},
      {"nan values in", C::kNanLoss},
      {"loss is nan", C::kNanLoss},
      {"loss became nan", C::kNanLoss},
      {"loss is inf", C::kNanLoss},
      {"contains nan", C::kNanLoss},
      {"nan or inf", C::kNanLoss},
      {"nan/inf", C::kNanLoss},
      {"inf or nan", C::kNanLoss},
      {"loss_nan", C::kNanLoss},
      {"nan_loss", C::kNanLoss},
      {"loss", C::kNanLoss, O::kNone, nan_after_loss},

      // ---- GPU faults ----
      {"illegal memory access", C::kGpuFault},
      {"unspecified launch failure", C::kGpuFault},
      {"nvrm: xid", C::kGpuFault},
      {" xid ", C::kGpuFault, O::kNone, xid_code},
      {"fallen off the bus", C::kGpuFault},
      {"misaligned address", C::kGpuFault},
      {"illegal instruction was encountered", C::kGpuFault},
      {"launch timed out", C::kGpuFault},
      {"uncorrectable ecc", C::kGpuFault},
      {"cudnn_status_execution_failed", C::kGpuFault},
      {"cuda error: unknown error", C::kGpuFault},
      {"gpu is lost", C::kGpuFault},
      {"cudaerrorlaunchfailure", C::kGpuFault},
      {"cuda_error_illegal_address", C::kGpuFault},
      {"cuda error: an illegal", C::kGpuFault},
      {"ecc error", C::kGpuFault, O::kNone, on_error_line},
      {"nvidia-smi has failed", C::kGpuFault},
      {"device-side assert", C::kGpuFault, O::kNone, on_error_line},
      {"cuda error: launch failure", C::kGpuFault},
      {"cublas_status_internal_error", C::kGpuFault},

      // ---- missing or unreadable files (on error lines only) ----
      {"filenotfounderror", C::kMissingFile, O::kNone, on_error_line},
      {"no such file or directory", C::kMissingFile, O::kNone, on_error_line},
      {"does not appear to have a file", C::kMissingFile, O::kNone, on_error_line},
      {"is not a valid model identifier", C::kMissingFile, O::kNone, on_error_line},
      {"repository not found", C::kMissingFile, O::kNone, on_error_line},
      {"entrynotfounderror", C::kMissingFile, O::kNone, on_error_line},
      {"repositorynotfounderror", C::kMissingFile, O::kNone, on_error_line},
      {"headertoolarge", C::kMissingFile, O::kNone, on_error_line},
      {"safetensorerror", C::kMissingFile, O::kNone, on_error_line},
      {"pytorchstreamreader failed", C::kMissingFile, O::kNone, on_error_line},
      {"invalid load key", C::kMissingFile, O::kNone, on_error_line},
      {"incomplete metadata", C::kMissingFile, O::kNone, on_error_line},
      {"[errno 2]", C::kMissingFile, O::kNone, on_error_line},
      {"no images found", C::kMissingFile, O::kNone, on_error_line},
      {"file not found", C::kMissingFile, O::kNone, on_error_line},
      {"cannot find the file", C::kMissingFile, O::kNone, on_error_line},
      {"could not find the file", C::kMissingFile, O::kNone, on_error_line},
      {"does not exist", C::kMissingFile, O::kNone, on_error_line},
      {"not a directory", C::kMissingFile, O::kNone, on_error_line},
      {"is not a file", C::kMissingFile, O::kNone, on_error_line},
      {"no valid images", C::kMissingFile, O::kNone, on_error_line},
      {"gatedrepoerror", C::kMissingFile, O::kNone, on_error_line},
      {"401 client error", C::kMissingFile, O::kNone, on_error_line},
      {"404 client error", C::kMissingFile, O::kNone, on_error_line},
      {"localentrynotfounderror", C::kMissingFile, O::kNone, on_error_line},
      {"couldn't connect to", C::kMissingFile, O::kNone, on_error_line},
      {"cannot load model", C::kMissingFile, O::kNone, on_error_line},
      {"unable to load weights", C::kMissingFile, O::kNone, on_error_line},
      {"checkpoint not found", C::kMissingFile, O::kNone, on_error_line},
      {"model not found", C::kMissingFile, O::kNone, on_error_line},
      {"path not found", C::kMissingFile, O::kNone, on_error_line},
      {"no such file", C::kMissingFile, O::kNone, on_error_line},

      // ---- crashes without a Python error: Windows NTSTATUS exit codes of the training process ----
      {"3221225477", C::kOther},   // 0xC0000005 access violation (also printed as -1073741819)
      {"-1073741819", C::kOther},
      {"3221225725", C::kOther},   // 0xC00000FD stack overflow

      // ---- package / model version mismatches (on error lines only) ----
      {"modulenotfounderror", C::kVersionMismatch, O::kNone, exception_or_error},
      {"no module named", C::kVersionMismatch, O::kNone, exception_or_error},
      {"importerror", C::kVersionMismatch, O::kNone, exception_or_error},
      {"cannot import name", C::kVersionMismatch, O::kNone, exception_or_error},
      {"has no attribute", C::kVersionMismatch, O::kNone, module_attribute},
      {"unexpected keyword argument", C::kVersionMismatch, O::kNone, exception_or_error},
      {"no kernel image is available", C::kVersionMismatch, O::kNone, exception_or_error},
      {"not compiled with cuda", C::kVersionMismatch, O::kNone, exception_or_error},
      {"driver version is insufficient", C::kVersionMismatch, O::kNone, exception_or_error},
      {"undefined symbol", C::kVersionMismatch, O::kNone, exception_or_error},
      {"dll load failed", C::kVersionMismatch, O::kNone, exception_or_error},
      {"size mismatch for", C::kVersionMismatch, O::kNone, exception_or_error},
      {"error(s) in loading state_dict", C::kVersionMismatch, O::kNone, exception_or_error},
      {"version mismatch", C::kVersionMismatch, O::kNone, exception_or_error},
      {"requires torch", C::kVersionMismatch, O::kNone, exception_or_error},
      {"requires a version", C::kVersionMismatch, O::kNone, exception_or_error},
      {"please upgrade", C::kVersionMismatch, O::kNone, exception_or_error},
      {"incompatible", C::kVersionMismatch, O::kNone, on_exception_line},
      {"missing key(s) in state_dict", C::kVersionMismatch, O::kNone, exception_or_error},
      {"unexpected key(s) in state_dict", C::kVersionMismatch, O::kNone, exception_or_error},
      {"is not supported", C::kVersionMismatch, O::kNone, on_exception_line},
      {"not supported on this", C::kVersionMismatch, O::kNone, exception_or_error},
      {"notimplementederror", C::kVersionMismatch, O::kNone, exception_or_error},
      {"deprecated and has been removed", C::kVersionMismatch, O::kNone, exception_or_error},
      {"got an unexpected", C::kVersionMismatch, O::kNone, exception_or_error},
      {"requires python", C::kVersionMismatch, O::kNone, exception_or_error},
      {"procedure could not be found", C::kVersionMismatch, O::kNone, exception_or_error},
      {"was compiled against", C::kVersionMismatch, O::kNone, exception_or_error},
      {"unsupported gpu", C::kVersionMismatch, O::kNone, exception_or_error},
      {"compute capability", C::kVersionMismatch, O::kNone, exception_or_error},
      {"minimum cuda capability", C::kVersionMismatch, O::kNone, exception_or_error},
  };
  return table;
}

}  // namespace lt::diagnose::detail
