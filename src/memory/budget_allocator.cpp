#include "loratrain/memory/budget_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "loratrain/memory/host_cache.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::memory {

namespace {

// Every block carries this header in front of the caller's bytes, so a free knows its size and
// its allocator without a lock-protected side table. 64 bytes keep c10's 64-byte alignment.
constexpr size_t kHeader = 64;

}  // namespace

struct CpuBudgetAllocator::State {
  // References: the allocator object plus one per live block. Whichever drops the last one frees
  // the state, so tensors may outlive the allocator that made them.
  std::atomic<int64_t> refs{1};
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> budget{0};
  std::atomic<int64_t> occupied{0};

  // Fault injection (slow path, only looked at while `faults_armed`).
  std::atomic<bool> faults_armed{false};
  std::atomic<int> fail_next{0};
  std::atomic<int64_t> fail_min_bytes{0};
  std::atomic<uint64_t> random_threshold{0};  // probability * 2^64
  std::atomic<uint64_t> random_seed{0};
  std::atomic<int> random_left{0};
  std::atomic<uint64_t> sequence{0};
  std::atomic<int> injected{0};

  c10::DeleterFnPtr underlying_deleter = nullptr;
};

namespace {

struct BlockHeader {
  CpuBudgetAllocator::State* state;
  int64_t size;
};
static_assert(sizeof(BlockHeader) <= kHeader, "block header must fit in front of the data");

void release(CpuBudgetAllocator::State* s) {
  if (s->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete s;
}

void budget_delete(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  auto* header = reinterpret_cast<BlockHeader*>(base);
  auto* state = header->state;
  state->allocated.fetch_sub(header->size, std::memory_order_relaxed);
  state->underlying_deleter(base);
  release(state);
}

// splitmix64: a fixed, well-mixed function of (seed, sequence number).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

std::string format_allocator_size(int64_t bytes) {
  // Same thresholds and precision as c10's format_size, so messages read like CUDA's.
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes <= 1024) std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  else if (bytes <= 1048576) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else if (bytes <= 1073741824LL) std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  return buf;
}

CpuBudgetAllocator::CpuBudgetAllocator(int64_t budget_bytes, c10::Allocator* underlying)
    : state_(new State), underlying_(underlying ? underlying : &HostCachingAllocator::instance()) {
  state_->budget.store(budget_bytes < 0 ? 0 : budget_bytes);
  state_->underlying_deleter = underlying_->raw_deleter();
  if (state_->underlying_deleter == nullptr) {
    delete state_;
    throw lt::Error(lt::ExitCode::kRuntime,
                    "CpuBudgetAllocator: the wrapped allocator has no raw deleter");
  }
}

CpuBudgetAllocator::~CpuBudgetAllocator() { release(state_); }

c10::DeleterFnPtr CpuBudgetAllocator::raw_deleter() const { return &budget_delete; }

int64_t CpuBudgetAllocator::budget() const { return state_->budget.load(std::memory_order_relaxed); }
void CpuBudgetAllocator::set_budget(int64_t bytes) { state_->budget.store(bytes < 0 ? 0 : bytes); }
int64_t CpuBudgetAllocator::allocated() const {
  return state_->allocated.load(std::memory_order_relaxed);
}
int64_t CpuBudgetAllocator::peak_allocated() const {
  return state_->peak.load(std::memory_order_relaxed);
}
void CpuBudgetAllocator::reset_peak() { state_->peak.store(allocated(), std::memory_order_relaxed); }
int64_t CpuBudgetAllocator::live_blocks() const {
  return state_->refs.load(std::memory_order_relaxed) - 1;
}
int64_t CpuBudgetAllocator::occupied() const {
  return state_->occupied.load(std::memory_order_relaxed);
}
void CpuBudgetAllocator::occupy(int64_t bytes) { state_->occupied.store(bytes < 0 ? 0 : bytes); }

int64_t CpuBudgetAllocator::free_bytes() const {
  const int64_t b = budget();
  if (b <= 0) return 0;
  return std::max<int64_t>(0, b - allocated() - occupied());
}

void CpuBudgetAllocator::fail_next_allocations(int n, int64_t min_bytes) {
  state_->fail_min_bytes.store(min_bytes);
  state_->fail_next.store(n < 0 ? 0 : n);
  state_->faults_armed.store(true);
}

void CpuBudgetAllocator::fail_randomly(double probability, uint64_t seed, int max_failures,
                                       int64_t min_bytes) {
  const double p = std::min(1.0, std::max(0.0, probability));
  state_->fail_min_bytes.store(min_bytes);
  state_->random_threshold.store(p >= 1.0 ? UINT64_MAX
                                          : static_cast<uint64_t>(p * 18446744073709551616.0));
  state_->random_seed.store(seed);
  state_->sequence.store(0);
  state_->random_left.store(max_failures < 0 ? 0 : max_failures);
  state_->faults_armed.store(true);
}

void CpuBudgetAllocator::clear_faults() {
  state_->faults_armed.store(false);
  state_->fail_next.store(0);
  state_->random_left.store(0);
  state_->random_threshold.store(0);
}

int CpuBudgetAllocator::injected_failures() const { return state_->injected.load(); }

bool CpuBudgetAllocator::should_inject(size_t n) const {
  State& s = *state_;
  if (static_cast<int64_t>(n) < s.fail_min_bytes.load(std::memory_order_relaxed)) return false;
  int pending = s.fail_next.load();
  while (pending > 0) {
    if (s.fail_next.compare_exchange_weak(pending, pending - 1)) {
      s.injected.fetch_add(1);
      return true;
    }
  }
  const uint64_t threshold = s.random_threshold.load(std::memory_order_relaxed);
  if (threshold == 0) return false;
  const uint64_t k = s.sequence.fetch_add(1);
  if (mix(s.random_seed.load(std::memory_order_relaxed) ^ mix(k)) >= threshold) return false;
  int left = s.random_left.load();
  while (left > 0) {
    if (s.random_left.compare_exchange_weak(left, left - 1)) {
      s.injected.fetch_add(1);
      return true;
    }
  }
  return false;
}

void CpuBudgetAllocator::throw_oom(size_t n, bool injected) const {
  const int64_t total = budget();
  const int64_t alloc = allocated();
  const int64_t held = occupied();
  const int64_t free = total > 0 ? std::max<int64_t>(0, total - alloc - held) : 0;
  // Field for field the sentences of PyTorch 2.x's CUDA message, so one parser (ours and
  // `diagnose`) reads both; nothing is cached, hence 0 bytes reserved-but-unallocated.
  std::ostringstream m;
  m << "CPU simulated VRAM out of memory. Tried to allocate " << format_allocator_size(n)
    << ". Simulated VRAM has a total capacity of " << format_allocator_size(total) << " of which "
    << format_allocator_size(free) << " is free. ";
  if (held > 0) m << "Another process has " << format_allocator_size(held) << " memory in use. ";
  m << "Of the allocated memory " << format_allocator_size(alloc)
    << " is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.";
  if (injected) m << " (fault injected by the test hook)";
  compat::throw_out_of_memory(m.str());
}

c10::DataPtr CpuBudgetAllocator::allocate_impl(size_t n) const {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (n == 0) return {nullptr, nullptr, &budget_delete, cpu};
  State& s = *state_;
  if (s.faults_armed.load(std::memory_order_relaxed) && should_inject(n)) throw_oom(n, true);

  const int64_t bytes = static_cast<int64_t>(n);
  const int64_t limit = s.budget.load(std::memory_order_relaxed);
  int64_t before = s.allocated.load(std::memory_order_relaxed);
  if (limit > 0) {
    const int64_t held = s.occupied.load(std::memory_order_relaxed);
    do {
      if (before + bytes + held > limit) throw_oom(n, false);
    } while (!s.allocated.compare_exchange_weak(before, before + bytes, std::memory_order_relaxed));
  } else {
    before = s.allocated.fetch_add(bytes, std::memory_order_relaxed);
  }
  const int64_t now = before + bytes;
  int64_t peak = s.peak.load(std::memory_order_relaxed);
  while (now > peak && !s.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }

  void* base = nullptr;
  try {
    base = underlying_->raw_allocate(n + kHeader);
  } catch (...) {
    s.allocated.fetch_sub(bytes, std::memory_order_relaxed);
    throw;  // host RAM exhausted: not simulated VRAM, reported as such by the guard
  }
  s.refs.fetch_add(1, std::memory_order_relaxed);
  auto* header = static_cast<BlockHeader*>(base);
  header->state = state_;
  header->size = bytes;
  void* data = static_cast<char*>(base) + kHeader;
  return {data, data, &budget_delete, cpu};
}

// Same priority for install and restore: c10 only lets an equal or higher priority replace the
// current allocator, and 100 is above the default registration (0).
constexpr uint8_t kInstallPriority = 100;

ScopedCpuAllocator::ScopedCpuAllocator(c10::Allocator* allocator) : previous_(c10::GetCPUAllocator()) {
  c10::SetCPUAllocator(allocator, kInstallPriority);
  if (c10::GetCPUAllocator() != allocator) {
    throw lt::Error(lt::ExitCode::kRuntime,
                    "could not install the counting CPU allocator (another allocator holds a "
                    "higher priority)");
  }
}

ScopedCpuAllocator::~ScopedCpuAllocator() { c10::SetCPUAllocator(previous_, kInstallPriority); }

namespace {

// MemTotal / MemAvailable from /proc/meminfo, in bytes; {0, 0} when unreadable.
FreeTotal host_memory() {
  std::ifstream in("/proc/meminfo");
  FreeTotal ft;
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemTotal:") ft.total = kib * 1024;
    else if (key == "MemAvailable:") ft.free = kib * 1024;
  }
  return ft;
}

}  // namespace

CpuMemory::CpuMemory(int64_t simulate_vram) : allocator_(simulate_vram), installed_(&allocator_) {}

std::string CpuMemory::name() const {
  if (allocator_.budget() > 0) return "cpu (simulated VRAM " + format_bytes(allocator_.budget()) + ")";
  return "cpu (host RAM " + format_bytes(host_memory().total) + ")";
}

FreeTotal CpuMemory::free_and_total() const {
  if (allocator_.budget() > 0) return {allocator_.free_bytes(), allocator_.budget()};
  return host_memory();
}

}  // namespace lt::memory
