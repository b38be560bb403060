// Pretraining of the tiny SD1 demo base on generated shapes. Small enough to run in a few minutes on
// two CPU cores: 32x32 images, 8x8 latents (DemoPretrainOptions' defaults). The autoencoder learns shapes in random colours (so it can
// draw colours the diffusion model never saw), the UNet learns "a red circle on a blue background"
// from captioned shapes in the caption palette (reading the features of the text encoder as it was
// initialised), with a tenth of captions blank so that classifier-free guidance has an unconditional
// branch to push against.
#include "demo_pretrain.h"

#include <torch/torch.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <thread>

#include "loratrain/data/demo_data.h"
#include "loratrain/data/rng.h"
#include "loratrain/io/image.h"
#include "loratrain/sample/scheduler.h"
#include "loratrain/util/blas_threads.h"

namespace lt::train {

namespace {

at::Tensor stack_images(const std::vector<data::ShapeImage>& items) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(items.size());
  for (const auto& item : items) tensors.push_back(io::image_to_tensor(item.image));
  return torch::stack(tensors);
}

// Linear warm-up over the first `warmup` steps, then cosine decay to a tenth.
double learning_rate(double peak, int step, int steps, int warmup) {
  if (step < warmup) return peak * (step + 1) / warmup;
  const double progress = static_cast<double>(step - warmup) / std::max(1, steps - warmup);
  return peak * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

void set_lr(torch::optim::Adam& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
}

at::Tensor batch_indices(data::Rng& rng, int64_t count, int batch) {
  std::vector<int64_t> idx(static_cast<size_t>(batch));
  for (auto& i : idx) i = static_cast<int64_t>(rng.below(static_cast<uint64_t>(count)));
  return torch::tensor(idx, torch::kLong);
}

// A `size`-pixel square from a random place in each image (whole images when `size` is 0 or theirs):
// the autoencoder's convolutions see the shapes at their own scale for a fraction of the cost.
at::Tensor random_crops(const at::Tensor& images, int size, data::Rng& rng) {
  const int64_t full = images.size(2);
  if (size <= 0 || size >= full) return images;
  std::vector<at::Tensor> crops;
  crops.reserve(static_cast<size_t>(images.size(0)));
  for (int64_t i = 0; i < images.size(0); ++i) {
    const auto y = static_cast<int64_t>(rng.below(static_cast<uint64_t>(full - size + 1)));
    const auto x = static_cast<int64_t>(rng.below(static_cast<uint64_t>(full - size + 1)));
    crops.push_back(images[i].narrow(1, y, size).narrow(2, x, size));
  }
  return torch::stack(crops);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs backward for a batch's loss as two halves side by side, each on one thread, and returns the
// batch's mean loss; loss_of(begin, end) is the mean loss of rows [begin, end). The demo's tensors
// are too small for LibTorch's or OpenBLAS's threads to split (the pretraining ran as fast on one
// thread as on two, docs/benchmarks.md); two halves keep two cores busy. Autograd accumulates both
// halves' gradients into the shared weights under its own lock.
double backward_in_halves(int64_t batch, const std::function<at::Tensor(int64_t, int64_t)>& loss_of) {
  if (std::thread::hardware_concurrency() < 2 || batch < 2) {
    const at::Tensor loss = loss_of(0, batch);
    loss.backward();
    return loss.item<double>();
  }
  double losses[2] = {0.0, 0.0};
  std::exception_ptr errors[2];
  auto half = [&](int i, int64_t begin, int64_t end) {
    try {
      at::set_num_threads(1);
      const at::Tensor loss = loss_of(begin, end) * (static_cast<double>(end - begin) / static_cast<double>(batch));
      loss.backward();
      losses[i] = loss.item<double>();
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::thread first(half, 0, 0, batch / 2);
  std::thread second(half, 1, batch / 2, batch);
  first.join();
  second.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return losses[0] + losses[1];
}

void train_autoencoder(models::sd::AutoencoderKL& vae, const DemoPretrainOptions& o, uint64_t seed) {
  const at::Tensor images =
      stack_images(data::make_shape_images(o.images, o.vae_image_size, seed + 1, data::ShapeColours::random));
  data::Rng rng(data::mix_seed({seed, 0x564145ull}));
  vae->train();
  torch::optim::Adam optimizer(vae->parameters(), torch::optim::AdamOptions(o.vae_lr));
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < o.vae_steps; ++step) {
    // No warm-up: the autoencoder learned faster without (docs/benchmarks.md).
    set_lr(optimizer, learning_rate(o.vae_lr, step, o.vae_steps, 0));
    const at::Tensor x = random_crops(images.index_select(0, batch_indices(rng, images.size(0), o.vae_batch)),
                                      o.vae_crop, rng);
    // A deterministic autoencoder: the posterior's mean is decoded (its variance is pinned below).
    optimizer.zero_grad();
    const double loss = backward_in_halves(x.size(0), [&](int64_t begin, int64_t end) {
      const at::Tensor part = x.slice(0, begin, end);
      return torch::mse_loss(vae->decode(vae->encode(part).mean), part);
    });
    optimizer.step();
    if (step % 50 == 0 || step + 1 == o.vae_steps) {
      spdlog::info("pretrain vae: step {}/{} loss {:.4f} ({:.0f} s)", step + 1, o.vae_steps, loss, seconds_since(start));
    }
  }
  vae->eval();
  {
    // At the diffusion model's image size, on shapes it never saw; predicting mid-grey everywhere scores
    // the images' mean square, each image's mean colour their variance.
    torch::NoGradGuard no_grad;
    const at::Tensor held_out =
        stack_images(data::make_shape_images(64, o.image_size, seed + 3, data::ShapeColours::random));
    const double mse = (vae->decode(vae->encode(held_out).mean) - held_out).pow(2).mean().item<double>();
    const double mean_colour = (held_out - held_out.mean({2, 3}, true)).pow(2).mean().item<double>();
    spdlog::info("pretrain vae: {} levels, {} GroupNorm groups, held-out reconstruction MSE {:.4f} (grey: {:.4f}, "
                 "mean colour: {:.4f}), {:.0f} s",
                 vae->config.block_out_channels.size(), vae->config.norm_num_groups, mse, held_out.pow(2).mean().item<double>(),
                 mean_colour, seconds_since(start));
  }
  // The posterior's log-variance: e^-20, so that a latent sampled from it (as the trainer's latent
  // cache may do) is its mean.
  torch::NoGradGuard no_grad;
  const int64_t c = vae->config.latent_channels;
  vae->quant_conv->weight.narrow(0, c, c).zero_();
  vae->quant_conv->bias.narrow(0, c, c).fill_(-20.0);
}

// Folds a per-channel affine map into quant_conv (and its inverse into post_quant_conv) so that the
// latents' means times the scaling factor have zero mean and unit variance on `images`; decode(encode(x))
// is unchanged.
void normalize_latents(models::sd::AutoencoderKL& vae, const at::Tensor& images) {
  torch::NoGradGuard no_grad;
  const at::Tensor mean = vae->encode(images).mean;                     // [N, C, h, w]
  const at::Tensor mu = mean.mean({0, 2, 3});                            // [C]
  const at::Tensor sigma = mean.std(std::vector<int64_t>{0, 2, 3}, true);  // [C]
  const at::Tensor a = 1.0 / (sigma * vae->config.scaling_factor);       // z' = a (z - mu)
  const int64_t c = mu.size(0);
  auto& q = vae->quant_conv;
  auto& post = vae->post_quant_conv;
  // quant_conv's first C outputs are the mean, the next C the log-variance (var scales by a^2).
  q->weight.narrow(0, 0, c).mul_(a.view({c, 1, 1, 1}));
  q->bias.narrow(0, 0, c).sub_(mu).mul_(a);
  q->bias.narrow(0, c, c).add_(2.0 * a.log());  // the (tiny) variance scales with the mean
  // post_quant_conv(z) = W z + b with z = z' / a + mu.
  post->bias.add_(torch::matmul(post->weight.flatten(1), mu));
  post->weight.div_(a.view({1, c, 1, 1}));
}

// Each caption with another word in the colour's place (ShapeImage::other_word) reads a word of its
// own: the placeholder's token embedding is replaced by a fresh draw from the distribution all the
// (untrained) encoder's token embeddings were drawn from, so the UNet learns to draw a shape for any
// word there, the trigger word included, whose embedding is one more such draw. Overwrites those
// captions' rows of `contexts`.
void read_other_words(models::CLIPTextModel& text_encoder, const models::CLIPTokenizer& tokenizer, const at::Tensor& tokens,
                      const std::vector<data::ShapeImage>& items, const std::string& placeholder, at::Tensor& contexts) {
  torch::NoGradGuard no_grad;
  at::Tensor table = text_encoder->text_model->embeddings->token_embedding->weight;
  const int64_t id = tokenizer.encode_batch({placeholder}).front().input_ids.at(1);  // after the start token
  const at::Tensor kept = table[id].clone();
  const double spread = table.std().item<double>();
  int64_t others = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].other_word) continue;
    table[id].copy_(torch::randn_like(kept) * spread);
    contexts[static_cast<int64_t>(i)].copy_(
        text_encoder->forward(tokens.narrow(0, static_cast<int64_t>(i), 1)).last_hidden_state[0]);
    ++others;
  }
  table[id].copy_(kept);
  spdlog::info("pretrain: {} of {} captions with another word in the colour's place", others, items.size());
}

void train_diffusion(models::sd::UNet2DConditionModel& unet, models::sd::AutoencoderKL& vae,
                     models::CLIPTextModel& text_encoder, const models::CLIPTokenizer& tokenizer,
                     const DemoPretrainOptions& o, uint64_t seed) {
  // The other word's place is taken by a placeholder (a word of the demo vocabulary that names no
  // colour or drawn shape) whose token embedding is drawn anew for each such caption below.
  const std::string placeholder = "photo";
  auto items = data::make_shape_images(o.images, o.image_size, seed + 2, data::ShapeColours::palette,
                                       {{placeholder}, o.other_words_share});
  const at::Tensor images = stack_images(items);
  normalize_latents(vae, images);
  at::Tensor latents;
  {
    torch::NoGradGuard no_grad;
    latents = vae->scale_latents(vae->encode(images).mean);
  }
  spdlog::info("pretrain: latents mean {:.3f} std {:.3f}", latents.mean().item<double>(), latents.std().item<double>());
  // Every caption and the blank prompt, tokenized once.
  std::vector<std::string> captions;
  for (const auto& item : items) captions.push_back(item.caption);
  captions.emplace_back("");
  std::vector<int64_t> ids;
  const auto encodings = tokenizer.encode_batch(captions);
  for (const auto& e : encodings) ids.insert(ids.end(), e.input_ids.begin(), e.input_ids.end());
  const at::Tensor tokens = torch::tensor(ids, torch::kLong).view({static_cast<int64_t>(captions.size()), -1});
  const int64_t blank = static_cast<int64_t>(items.size());
  // The text encoder stays as initialised: a random CLIP already gives every word (and its place in
  // the caption) features of its own, and the UNet learns to read them. Its outputs are computed once,
  // which keeps pretraining within a few minutes of two cores.
  at::Tensor contexts;
  {
    torch::NoGradGuard no_grad;
    text_encoder->eval();
    contexts = text_encoder->forward(tokens).last_hidden_state;
    if (o.other_words_share > 0) read_other_words(text_encoder, tokenizer, tokens, items, placeholder, contexts);
  }

  const sample::DDPMScheduler schedule(sample::DDPMSchedulerConfig::from_json(sample::default_scheduler_config("sd15")));
  const at::Tensor alphas_cumprod = schedule.alphas_cumprod().to(at::kFloat);
  const int64_t timesteps = alphas_cumprod.size(0);

  torch::optim::Adam optimizer(unet->parameters(), torch::optim::AdamOptions(o.unet_lr));
  unet->train();
  data::Rng rng(data::mix_seed({seed, 0x554e4554ull}));
  const auto start = std::chrono::steady_clock::now();
  double running = 0.0;
  for (int step = 0; step < o.unet_steps; ++step) {
    set_lr(optimizer, learning_rate(o.unet_lr, step, o.unet_steps, std::max(1, o.unet_steps / 20)));
    at::Tensor idx = batch_indices(rng, latents.size(0), o.unet_batch);
    at::Tensor caption_idx = idx.clone();
    for (int64_t i = 0; i < caption_idx.size(0); ++i) {
      if (rng.below(10) == 0) caption_idx[i] = blank;
    }
    const at::Tensor x0 = latents.index_select(0, idx);
    const at::Tensor noise = torch::randn_like(x0);
    const at::Tensor t = torch::randint(0, timesteps, {x0.size(0)}, torch::kLong);
    const at::Tensor acp = alphas_cumprod.index_select(0, t).view({-1, 1, 1, 1});
    const at::Tensor noisy = acp.sqrt() * x0 + (1.0 - acp).sqrt() * noise;
    const at::Tensor context = contexts.index_select(0, caption_idx);
    optimizer.zero_grad();
    const double loss = backward_in_halves(x0.size(0), [&](int64_t begin, int64_t end) {
      return torch::mse_loss(unet->forward(noisy.slice(0, begin, end), t.slice(0, begin, end), context.slice(0, begin, end)),
                             noise.slice(0, begin, end));
    });
    optimizer.step();
    running = step == 0 ? loss : 0.95 * running + 0.05 * loss;
    if (step % 100 == 0 || step + 1 == o.unet_steps) {
      spdlog::info("pretrain unet: step {}/{} loss {:.4f} ({:.0f} s)", step + 1, o.unet_steps, running,
                   seconds_since(start));
    }
  }
  unet->eval();
}

}  // namespace

void pretrain_sd_demo(models::sd::UNet2DConditionModel& unet, models::sd::AutoencoderKL& vae,
                      models::CLIPTextModel& text_encoder, const models::CLIPTokenizer& tokenizer,
                      const DemoPretrainOptions& options, uint64_t seed) {
  // backward_in_halves puts one half of each batch on each core: OpenBLAS's own threads would only
  // contend with them (the pretraining took 35 s with two, 22.5 s with one, docs/benchmarks.md).
  util::set_openblas_threads(1);
  train_autoencoder(vae, options, seed);
  train_diffusion(unet, vae, text_encoder, tokenizer, options, seed);
}

}  // namespace lt::train
