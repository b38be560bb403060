#include "loratrain/memory/oom.h"

#include <c10/util/Exception.h>

#include <cctype>
#include <cmath>
#include <new>
#include <nlohmann/json.hpp>

#include "loratrain/memory/compat.h"
#include "loratrain/util/strings.h"

namespace lt::memory {

namespace {

// Playbook §1 (and the variants issue 6 names), lower-case, most specific first.
struct Signature {
  const char* needle;
  const char* name;
};
constexpr Signature kGpuSignatures[] = {
    {"cpu simulated vram out of memory", "CPU simulated VRAM out of memory"},
    {"cuda out of memory", "CUDA out of memory"},
    {"cuda error: out of memory", "CUDA error: out of memory"},
    {"cudaerrormemoryallocation", "cudaErrorMemoryAllocation"},
    {"cublas_status_alloc_failed", "CUBLAS_STATUS_ALLOC_FAILED"},
    {"cudnn_status_alloc_failed", "CUDNN_STATUS_ALLOC_FAILED"},
    {"cudnn_status_not_enough_workspace", "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE"},
    {"hip out of memory", "HIP out of memory"},
    {"mps backend out of memory", "MPS backend out of memory"},
    {"torch.cuda.outofmemoryerror", "torch.cuda.OutOfMemoryError"},
    {"torch.outofmemoryerror", "torch.OutOfMemoryError"},
    {"oom during training step", "OOM during training step"},
    {"0 bytes is free", "0 bytes is free"},
};

// Units as allocator messages print them ("bytes", "KiB"...) and as people write them ("GB").
std::optional<std::pair<int64_t, size_t>> size_at(const std::string& s, size_t pos) {
  size_t i = pos;
  while (i < s.size() && s[i] == ' ') ++i;
  const size_t num_start = i;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == num_start) return std::nullopt;
  double value = 0;
  try {
    value = std::stod(s.substr(num_start, i - num_start));
  } catch (...) {
    return std::nullopt;
  }
  while (i < s.size() && s[i] == ' ') ++i;
  const size_t unit_start = i;
  while (i < s.size() && std::isalpha(static_cast<unsigned char>(s[i]))) ++i;
  const std::string unit = s.substr(unit_start, i - unit_start);
  double scale = 0;
  if (unit == "bytes" || unit == "byte" || unit == "b") scale = 1;
  else if (unit == "kib") scale = 1024.0;
  else if (unit == "mib") scale = 1048576.0;
  else if (unit == "gib") scale = 1073741824.0;
  else if (unit == "tib") scale = 1099511627776.0;
  else if (unit == "kb") scale = 1e3;
  else if (unit == "mb") scale = 1e6;
  else if (unit == "gb") scale = 1e9;
  else if (unit == "tb") scale = 1e12;
  else return std::nullopt;
  return std::make_pair(static_cast<int64_t>(std::llround(value * scale)), i);
}

// The size right after `needle` ("tried to allocate 2.00 gib").
std::optional<int64_t> size_after(const std::string& s, const char* needle) {
  const size_t p = s.find(needle);
  if (p == std::string::npos) return std::nullopt;
  auto r = size_at(s, p + std::string_view(needle).size());
  if (!r) return std::nullopt;
  return r->first;
}

// The size that ends right before `needle` ("1.40 gib is allocated by pytorch").
std::optional<int64_t> size_before(const std::string& s, const char* needle) {
  const size_t p = s.find(needle);
  if (p == std::string::npos) return std::nullopt;
  const size_t lo = p > 24 ? p - 24 : 0;
  for (size_t start = lo; start < p; ++start) {
    if (start > 0 && s[start - 1] != ' ' && s[start - 1] != '(' && s[start - 1] != ';' &&
        s[start - 1] != '.') {
      continue;
    }
    auto r = size_at(s, start);
    if (!r) continue;
    size_t end = r->second;
    while (end < p && s[end] == ' ') ++end;
    if (end == p) return r->first;
  }
  return std::nullopt;
}

// c10::Error's what() carries a backtrace in 1.13; the bare message is what callers mean.
std::string bare_message(const std::exception& e) {
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}

bool is_host_allocator_text(const std::string& lower) {
  for (const char* sig : compat::kHostAllocatorSignatures) {
    if (lower.find(to_lower(sig)) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::optional<int64_t> OomNumbers::needed() const {
  if (!allocated || !tried) return std::nullopt;
  return *allocated + *tried;
}

bool OomInfo::environment_signature() const {
  return numbers.zero_free || signature == "CUBLAS_STATUS_ALLOC_FAILED";
}

OomNumbers parse_oom_numbers(std::string_view text) {
  const std::string s = to_lower(text);
  OomNumbers n;
  n.tried = size_after(s, "tried to allocate");
  // 2.x sentences (and ours).
  if (auto p = s.find("total capacity of"); p != std::string::npos) {
    if (auto t = size_at(s, p + 17)) {
      n.total = t->first;
      const size_t of_which = s.find("of which", t->second);
      if (of_which != std::string::npos && of_which - t->second < 4) {
        if (auto f = size_at(s, of_which + 8)) n.free = f->first;
      }
    }
  }
  n.allocated = size_before(s, "is allocated by pytorch");
  n.reserved_unallocated = size_before(s, "is reserved by pytorch but unallocated");
  // 1.13: "(GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated; 8.75 MiB free;
  // 14.70 GiB reserved in total by PyTorch)".
  if (!n.total) n.total = size_before(s, "total capacity");
  if (!n.allocated) n.allocated = size_before(s, "already allocated");
  if (!n.free) n.free = size_before(s, "free;");
  if (!n.free) n.free = size_before(s, "free)");
  if (!n.reserved_unallocated) {
    if (auto reserved = size_before(s, "reserved in total by pytorch"); reserved && n.allocated) {
      n.reserved_unallocated = std::max<int64_t>(0, *reserved - *n.allocated);
    }
  }
  // Under set_per_process_memory_fraction 2.x adds "X allowed;": that is the real capacity.
  if (auto allowed = size_before(s, "allowed;")) {
    n.total = allowed;
    if (n.allocated) {
      const int64_t in_pool = *n.allocated + n.reserved_unallocated.value_or(0);
      const int64_t room = std::max<int64_t>(0, *allowed - in_pool);
      n.free = n.free ? std::min(*n.free, room) : room;
    }
  }
  n.other_process = size_after(s, "another process has");
  if (n.free && *n.free == 0) n.zero_free = true;
  if (s.find("0 bytes is free") != std::string::npos) n.zero_free = true;
  return n;
}

OomInfo inspect_message(std::string_view text) {
  OomInfo info;
  info.message = std::string(text);
  const std::string lower = to_lower(text);
  if (is_host_allocator_text(lower)) {
    info.kind = FailureKind::host_oom;
    info.signature = "DefaultCPUAllocator";
    info.numbers.tried = size_after(lower, "you tried to allocate");
    return info;
  }
  for (const auto& sig : kGpuSignatures) {
    if (lower.find(sig.needle) != std::string::npos) {
      info.kind = FailureKind::gpu_oom;
      info.signature = sig.name;
      break;
    }
  }
  if (info.kind == FailureKind::gpu_oom) {
    info.numbers = parse_oom_numbers(text);
    info.simulated = lower.find("cpu simulated vram") != std::string::npos;
    info.injected = lower.find("fault injected by the test hook") != std::string::npos;
  }
  return info;
}

OomInfo inspect_failure(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    OomInfo info;
    info.kind = FailureKind::host_oom;
    info.signature = "std::bad_alloc";
    info.message = e.what();
    return info;
  }
  OomInfo info = inspect_message(bare_message(e));
  if (info.kind == FailureKind::none && dynamic_cast<const compat::OutOfMemoryError*>(&e) != nullptr) {
    // The type alone is enough: a backend's OOM whose text we do not know yet.
    info.kind = FailureKind::gpu_oom;
    info.signature = "c10::OutOfMemoryError";
    info.numbers = parse_oom_numbers(info.message);
  }
  return info;
}

OomInfo inspect_failure(std::exception_ptr e) {
  if (!e) return {};
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return inspect_failure(ex);
  } catch (...) {
    return {};
  }
}

bool is_oom(const std::exception& e) { return inspect_failure(e).kind == FailureKind::gpu_oom; }

void to_json(nlohmann::json& j, const OomNumbers& n) {
  j = nlohmann::json::object();
  auto put = [&](const char* key, const std::optional<int64_t>& v) {
    j[key] = v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  put("tried", n.tried);
  put("total", n.total);
  put("free", n.free);
  put("allocated", n.allocated);
  put("reserved_unallocated", n.reserved_unallocated);
  put("other_process", n.other_process);
  j["zero_free"] = n.zero_free;
}

}  // namespace lt::memory
