#include "loratrain/dist/group.h"

#include <spdlog/spdlog.h>

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "c10d_compat.h"
#include "loratrain/util/error.h"

namespace lt::dist {

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

double env_seconds(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || value <= 0) throw InputError(std::string(name) + "=" + text + ": expected seconds > 0");
  return value;
}

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

c10::intrusive_ptr<c10d::Store> connect_store(const DistEnv& env, bool serve, double timeout_seconds, bool count_worker) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = serve;
  if (count_worker) options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = count_worker;
  options.timeout = millis(timeout_seconds);
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

GroupOptions group_options_from_env() {
  GroupOptions options;
  options.rendezvous_seconds = env_seconds("LT_DIST_RENDEZVOUS_TIMEOUT", options.rendezvous_seconds);
  options.collective_seconds = env_seconds("LT_DIST_TIMEOUT", options.collective_seconds);
  options.heartbeat_seconds = env_seconds("LT_DIST_HEARTBEAT_TIMEOUT", options.heartbeat_seconds);
  return options;
}

// The heartbeat: every rank bumps its counter in the store once a second, on a connection of its
// own, and watches the others'. A rank whose counter stands still for heartbeat_seconds is lost
// (its process ended, or its machine is unreachable); when the store itself is gone, rank 0 (which
// serves it) is. A lost rank ends this one from here: the main thread may be waiting inside a
// collective that only its timeout would end.
class Heartbeat {
 public:
  Heartbeat(const DistEnv& env, double lost_after) : env_(env), lost_after_(lost_after) {
    store_ = connect_store(env, false, lost_after, false);
    const auto now = Clock::now();
    for (int r = 0; r < env.world_size; ++r) seen_[r] = {-1, now};
    thread_ = std::thread([this] { loop(); });
  }
  ~Heartbeat() { stop(); }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // The lost rank's description, waiting up to `wait` for the heartbeat to notice one.
  std::string lost(double wait) {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait_for(lock, millis(wait), [this] { return !lost_.empty(); });
    return lost_;
  }

 private:
  void loop() {
    const std::string own = "lt/alive/" + std::to_string(env_.rank);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      std::string found;
      try {
        store_->add(own, 1);
        const auto now = Clock::now();
        for (int r = 0; r < env_.world_size && found.empty(); ++r) {
          if (r == env_.rank) continue;
          const int64_t count = store_->add("lt/alive/" + std::to_string(r), 0);
          auto& [last, since] = seen_[r];
          if (count != last) {
            last = count;
            since = now;
          } else if (std::chrono::duration<double>(now - since).count() > lost_after_) {
            found = "rank " + std::to_string(r) + " is lost: no heartbeat for " +
                    std::to_string(static_cast<int>(lost_after_)) + " s (its process ended or its machine is unreachable)";
          }
        }
      } catch (const std::exception& e) {
        found = env_.rank == 0 ? std::string("the rendezvous store failed: ") + e.what()
                               : "rank 0 is lost: the rendezvous store it serves at " + env_.master_addr + ":" +
                                     std::to_string(env_.master_port) + " stopped answering";
      }
      lock.lock();
      if (!found.empty() && !stopping_) {
        lost_ = found;
        wake_.notify_all();
        lock.unlock();
        // Give the main thread a moment to report it through its own error path; then end here.
        std::this_thread::sleep_for(std::chrono::seconds(3));
        lock.lock();
        if (stopping_) return;
        spdlog::error("{}: ending rank {}", found, env_.rank);
        spdlog::default_logger()->flush();
        std::_Exit(static_cast<int>(ExitCode::kRuntime));
      }
      wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; });
    }
  }

  DistEnv env_;
  double lost_after_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::map<int, std::pair<int64_t, Clock::time_point>> seen_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::string lost_;
  std::thread thread_;
};

struct Group::Impl {
  DistEnv env;
  GroupOptions options;
  c10::Device device = c10::Device(c10::kCPU);
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::Collectives> backend;
  std::unique_ptr<Heartbeat> heartbeat;
  at::Tensor codes;  // gather_codes' buffer, [world_size] int32 on the device
  int64_t shares = 0;
  bool finished = false;
};

Group::Group(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Group::~Group() {
  if (impl_ && impl_->heartbeat) impl_->heartbeat->stop();
}

std::unique_ptr<Group> Group::open(const DistEnv& env, const c10::Device& device, const GroupOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->options = options;
  impl->device = device;
  const bool serve = env.rank == 0 && !env.agent_store;
  try {
    impl->store = connect_store(env, serve, options.rendezvous_seconds, true);
  } catch (const std::exception& e) {
    throw Error(ExitCode::kEnvironment, "rank " + std::to_string(env.rank) + ": rendezvous at " + env.master_addr + ":" +
                                            std::to_string(env.master_port) + " failed (" + e.what() +
                                            "); check MASTER_ADDR/MASTER_PORT and that every rank was started");
  }
  // Collectives wait for slow ranks (rank 0's previews and saves) up to their own timeout; the
  // store's blocking reads do too.
  impl->store->setTimeout(millis(options.collective_seconds));
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("lora-train", impl->store);
  if (device.is_cuda()) {
#ifdef USE_C10D_NCCL
    auto nccl = c10d::ProcessGroupNCCL::Options::create();
    nccl->timeout = millis(options.collective_seconds);
    impl->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, env.rank, env.world_size, nccl);
#else
    throw Error(ExitCode::kEnvironment, "this build has no NCCL backend (USE_C10D_NCCL): data-parallel training on CUDA "
                                        "needs a LibTorch with NCCL");
#endif
  } else {
#ifdef USE_C10D_GLOO
    auto gloo = c10d::ProcessGroupGloo::Options::create(millis(options.collective_seconds));
    // The interface Gloo connects over: GLOO_SOCKET_IFNAME as in PyTorch, loopback for a local
    // launch, else the one the host name resolves to.
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else if (is_loopback(env.master_addr)) {
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface("lo"));
    } else {
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    try {
      impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, env.rank, env.world_size, gloo);
    } catch (const std::exception& e) {
      throw Error(ExitCode::kEnvironment, "rank " + std::to_string(env.rank) + ": Gloo could not connect the ranks: " + e.what());
    }
#else
    throw Error(ExitCode::kEnvironment, "this build has no Gloo backend (USE_C10D_GLOO): data-parallel training on the "
                                        "CPU needs LibTorch's Gloo headers (Debian: libgloo-dev)");
#endif
  }
  impl->codes = at::zeros({env.world_size}, at::TensorOptions().dtype(at::kInt).device(device));
  impl->heartbeat = std::make_unique<Heartbeat>(env, options.heartbeat_seconds);
  spdlog::debug("rank {} of {} joined ({} over {}:{})", env.rank, env.world_size, device.is_cuda() ? "NCCL" : "Gloo",
               env.master_addr, env.master_port);
  return std::unique_ptr<Group>(new Group(std::move(impl)));
}

int Group::rank() const { return impl_->env.rank; }
int Group::size() const { return impl_->env.world_size; }

void Group::fail(const std::string& during, const std::exception& error) {
  std::string lost = impl_->heartbeat ? impl_->heartbeat->lost(impl_->options.heartbeat_seconds + 2) : "";
  if (lost.empty()) lost = "a rank stopped answering";
  throw Error(ExitCode::kRuntime, "rank " + std::to_string(rank()) + ": " + lost + "; " + during + " failed: " +
                                      std::string(error.what()).substr(0, 300));
}

Packed Group::pack(const std::vector<at::Tensor>& tensors) const {
  // Buckets of consecutive tensors of one dtype, each flattened into one buffer.
  Packed packed;
  size_t first = 0;
  int64_t bytes_in = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    bytes_in += tensors[i].numel() * static_cast<int64_t>(tensors[i].element_size());
    const bool dtype_changes = i + 1 < tensors.size() && tensors[i + 1].scalar_type() != tensors[i].scalar_type();
    if (bytes_in >= impl_->options.bucket_bytes || dtype_changes || i + 1 == tensors.size()) {
      std::vector<at::Tensor> views;
      for (size_t j = first; j <= i; ++j) views.push_back(tensors[j].reshape({-1}));
      packed.buffers.push_back(at::cat(views));
      packed.ranges.emplace_back(first, i + 1);
      first = i + 1;
      bytes_in = 0;
    }
  }
  return packed;
}

void Group::all_reduce_sum(Packed& packed) {
  // One call per buffer, all sent before the first wait (Gloo runs them on its own threads).
  try {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& buffer : packed.buffers) {
      std::vector<at::Tensor> one = {buffer};
      c10d::AllreduceOptions options;
      options.reduceOp = c10d::ReduceOp::SUM;
      works.push_back(impl_->backend->allreduce(one, options));
    }
    for (auto& work : works) work->wait();
  } catch (const std::exception& e) {
    fail("the gradient all-reduce", e);
  }
}

void Group::unpack(const Packed& packed, const std::vector<at::Tensor>& tensors) const {
  for (size_t b = 0; b < packed.ranges.size(); ++b) {
    int64_t offset = 0;
    for (size_t i = packed.ranges[b].first; i < packed.ranges[b].second; ++i) {
      const int64_t n = tensors[i].numel();
      tensors[i].copy_(packed.buffers[b].narrow(0, offset, n).view(tensors[i].sizes()));
      offset += n;
    }
  }
}

std::vector<int> Group::gather_codes(int code) {
  // The buffer is allocated once: this runs right after an out-of-memory failure, and must not
  // need memory itself (on the CPU nothing here allocates from the device budget).
  at::Tensor& codes = impl_->codes;
  codes.zero_();
  codes.narrow(0, rank(), 1).fill_(code);
  try {
    std::vector<at::Tensor> one = {codes};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    impl_->backend->allreduce(one, options)->wait();
  } catch (const std::exception& e) {
    fail("agreeing on the step's outcome", e);
  }
  std::vector<int> out(static_cast<size_t>(size()));
  if (codes.is_cpu()) {
    const int* values = codes.data_ptr<int>();
    out.assign(values, values + size());
  } else {
    const at::Tensor host = codes.to(at::kCPU);
    out.assign(host.data_ptr<int>(), host.data_ptr<int>() + size());
  }
  return out;
}

std::string Group::share(const std::string& text, int from) {
  const std::string key = "lt/share/" + std::to_string(impl_->shares++);
  try {
    if (rank() == from) {
      impl_->store->set(key, bytes(text));
      return text;
    }
    const auto value = impl_->store->get(key);
    return {value.begin(), value.end()};
  } catch (const std::exception& e) {
    fail("reading rank " + std::to_string(from) + "'s message", e);
  }
}

void Group::barrier() {
  try {
    impl_->backend->barrier()->wait();
  } catch (const std::exception& e) {
    fail("waiting for the other ranks", e);
  }
}

void Group::finish() {
  if (impl_->finished) return;
  barrier();
  impl_->heartbeat->stop();
  barrier();  // rank 0 keeps serving the store until every heartbeat has stopped
  impl_->finished = true;
}

}  // namespace lt::dist
