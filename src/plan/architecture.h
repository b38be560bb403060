// Inside the planner: what one model family contributes to a prediction. A family adds its own
// Architecture in one file (family_<name>.cpp) and one line in families.cpp; plan.cpp composes
// the phases from these numbers and names no family.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "loratrain/models/attention_blocks.h"
#include "loratrain/playbook/vocabulary.h"
#include "loratrain/util/cpu_features.h"

namespace lt::plan {

// Parameter counts (elements) of the frozen base and of the adapter.
struct Parameters {
  int64_t denoiser = 0;
  int64_t denoiser_linear = 0;  // in Linear weights: what model.quantize stores as int8
  // In stride-1 Conv2d weights larger than 1x1: what a training step on the CPU packs for oneDNN
  // (packed_conv.h: two more copies of each, from the first step on; 1x1 ones run as matrix products
  // on the plain weight). 0 for families without such convolutions.
  int64_t denoiser_packed_conv = 0;
  int64_t text_encoders = 0;
  int64_t vae = 0;
  // The largest tensor of each component: the loader copies one tensor at a time out of the file.
  int64_t largest_denoiser_tensor = 0;
  // The denoiser's largest Linear weight: what model.quantize converts one at a time (a UNet's
  // largest tensor is a convolution, which stays as it is). 0: largest_denoiser_tensor stands in.
  int64_t largest_denoiser_linear = 0;
  int64_t largest_text_tensor = 0;
  int64_t largest_vae_tensor = 0;
  // The text encoders' largest Linear weight: what quantize_te converts one at a time (their
  // largest tensor, a token embedding, stays as it is). 0: largest_text_tensor stands in.
  int64_t largest_text_linear = 0;
  // The text encoders' token and position embeddings: quantize_te converts Linears only, so these
  // stay in the compute dtype (0 where a family does not count them apart).
  int64_t text_embeddings = 0;
  int64_t adapter = 0;          // LoRA down + up (+ alpha) over every targeted module
  int64_t adapter_modules = 0;
};

struct AdapterShape {
  int linear_rank = 4;
  int conv_rank = 0;  // 0: no conv adapters
  // network.type and its LoKr options: each module's parameter count is the adapter type's
  // (lora::adapter_parameters).
  std::string type = "lora";
  int64_t lokr_factor = -1;
  bool lokr_full_rank = false;
};

// One adapter module on a layer `in` -> `out` (kernel k x k) at `rank`: its weights as the adapter
// type has them, and its alpha.
int64_t adapter_module_parameters(const AdapterShape& adapter, int64_t in, int64_t out, int64_t kernel, int64_t rank);

// One shape a phase computes at, in pixels; `batch` counts rows (classifier-free guidance's
// doubled batch included by the caller).
struct Shape {
  int64_t batch = 1;
  int64_t width = 512;
  int64_t height = 512;
  int64_t frames = 1;
};

struct Compute {
  int bytes = 4;                // activation element size in the compute dtype
  bool checkpointing = false;
  int64_t attention_chunk = 0;  // query rows at a time; 0 = whole sequence
  bool vae_tiling = false;
  int threads = 1;              // attention chunks run one head per thread, each with its own block
  int adapter_rank = 4;         // LoRA's rank-wide intermediates
  bool host = false;            // computing on the CPU: LibTorch's CPU kernels' own buffers count, long
                                // sequences run blocked on some CPUs (models/attention_blocks.h)
  bool simulated_device = false;  // a CPU run under memory.simulate_vram: attention as configured, as on a GPU
  bool mean_keeps_input = false;  // autograd's mean over a dimension keeps its input (LibTorch 1.13)

  // Query rows per attention block over `query_rows` queries (and as many keys: self-attention);
  // 0 or >= query_rows: plain attention.
  int64_t query_block(int64_t query_rows) const { return query_block(query_rows, query_rows); }
  // The same over `key_rows` keys (cross-attention).
  int64_t query_block(int64_t query_rows, int64_t key_rows) const {
    return models::query_block_rows(query_rows, key_rows, attention_chunk, host && !simulated_device, bytes);
  }
  // Whether training runs frozen stride-1 convolutions on packed oneDNN weights
  // (models/packed_conv.h: on the CPU in fp32, or in bf16 with AVX-512); a checkpointed resnet keeps
  // their outputs for its recomputation.
  bool packed_convolutions() const { return host && !simulated_device && (bytes == 4 || util::cpu_has_avx512_core()); }
};

class Architecture {
 public:
  virtual ~Architecture() = default;
  virtual Parameters parameters(const AdapterShape& adapter) const = 0;
  // Bytes the denoiser's forward + backward holds at its peak above the weights (saved tensors,
  // then the largest gradient buffers of backward).
  virtual int64_t training_activations(const Shape& s, const Compute& c) const = 0;
  // One denoiser evaluation without gradients.
  virtual int64_t inference_activations(const Shape& s, const Compute& c) const = 0;
  virtual int64_t vae_encode(const Shape& s, const Compute& c) const = 0;
  virtual int64_t vae_decode(const Shape& s, const Compute& c) const = 0;
  virtual int64_t text_encode(int64_t batch, const Compute& c) const = 0;
  // Elements of one caption's cached embeddings (kept in host memory: on the CPU, the device's).
  virtual int64_t text_embedding_elements() const = 0;
  // Whether previews run the denoiser on [uncond, cond] rows at once. lora-train's previews run a
  // guided preview's two branches one after the other (sample::sample), so no family does.
  virtual bool guidance_doubles_batch() const { return false; }
  virtual int latent_downscale() const { return 8; }
  virtual int bucket_divisibility() const { return 16; }  // bucket sides are multiples of this
};

// Where the shapes come from: a checkpoint on this machine, or nothing (the family's standard config).
struct ModelSource {
  playbook::ModelFamily family = playbook::ModelFamily::kUnknown;
  std::optional<std::filesystem::path> checkpoint;  // single file or diffusers folder
  std::optional<std::filesystem::path> vae;         // model.vae_path
  std::string name;                                 // model.name_or_path as written (a variant's name: "...-schnell")
};

// The family's architecture; throws lt::InputError for a family without an activation model.
// A family adds one make_<family>_architecture below and one case in families.cpp.
std::unique_ptr<Architecture> make_architecture(const ModelSource& source);

// families.cpp dispatches to one of these.
std::unique_ptr<Architecture> make_sd_architecture(const ModelSource& source);
std::unique_ptr<Architecture> make_flux_architecture(const ModelSource& source);
std::unique_ptr<Architecture> make_wan_architecture(const ModelSource& source);

}  // namespace lt::plan
