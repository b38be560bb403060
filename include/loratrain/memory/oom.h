// Detection (OOM_PLAYBOOK.md §1): is this exception a GPU out-of-memory, host RAM exhaustion, or
// something else; and the numbers the allocator message states.
#pragma once
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace lt::memory {

enum class FailureKind {
  none,      // not a memory failure: let it propagate
  gpu_oom,   // device memory (CUDA, or the simulated VRAM): the guard's business
  host_oom,  // host RAM (std::bad_alloc, c10's DefaultCPUAllocator): not fixed by the ladder
};

// What an allocator message says about memory (bytes; nullopt when the message does not say).
// Reads PyTorch 2.x ("GPU 0 has a total capacity of X of which Y is free ... Z is allocated by
// PyTorch, and W is reserved by PyTorch but unallocated"), 1.13 ("(GPU 0; X total capacity; Y
// already allocated; Z free; W reserved in total by PyTorch)") and our simulated-VRAM message.
struct OomNumbers {
  std::optional<int64_t> tried;                 // the request that failed
  std::optional<int64_t> total;                 // capacity (the allowed amount under a fraction cap)
  std::optional<int64_t> free;
  std::optional<int64_t> allocated;             // by this process's tensors
  std::optional<int64_t> reserved_unallocated;  // cached by the allocator but not in use
  std::optional<int64_t> other_process;         // held by another process, when stated
  bool zero_free = false;                       // "0 bytes is free": the card is completely full

  // allocated + tried: the least this step would have needed.
  std::optional<int64_t> needed() const;
};

struct OomInfo {
  FailureKind kind = FailureKind::none;
  std::string signature;  // the playbook signature that matched ("CUDA out of memory", ...)
  std::string message;    // the error text without LibTorch's backtrace
  OomNumbers numbers;
  bool simulated = false;  // our CPU simulated VRAM
  bool injected = false;   // a fault injected by the test hook
  bool environment_signature() const;  // "0 bytes is free" or a cuBLAS allocation failure
};

// Classifies an exception by type (c10::OutOfMemoryError, std::bad_alloc) and by text (every
// signature of playbook §1, case-insensitive).
OomInfo inspect_failure(const std::exception& e);
OomInfo inspect_failure(std::exception_ptr e);  // rethrows internally; non-std exceptions: none
bool is_oom(const std::exception& e);           // gpu_oom only

// The text half of the above, for messages without an exception object.
OomInfo inspect_message(std::string_view text);
OomNumbers parse_oom_numbers(std::string_view text);

void to_json(nlohmann::json& j, const OomNumbers& n);

}  // namespace lt::memory
