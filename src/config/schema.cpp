// The key tables: one row per YAML key, in the order of AI Toolkit's example files. A row names the
// key (AI Toolkit's spelling), binds it to its struct field (whose initializer is the default), and
// states its checks, support status, memory-lever mark and doc line. Keys AI Toolkit has and
// lora-train does not support yet are rows too (not_yet), so they are reported as such, never
// ignored and never "unknown".
#include "schema_tables.h"

#include <algorithm>

#include "loratrain/util/strings.h"

namespace lt::config::detail {

namespace {

const std::vector<std::string> kDtypes = {"fp32", "fp16", "bf16", "float32", "float16", "bfloat16"};

std::string lower_normalize(const std::string& s, const std::function<void(const std::string&)>&) {
  return to_lower(trim(s));
}

}  // namespace

const Table<NetworkKwargs>& network_kwargs_table() {
  static const Table<NetworkKwargs> t = [] {
    using S = NetworkKwargs;
    Table<S> t;
    t.push_back(field("only_if_contains", &S::only_if_contains,
                      "Adapt only modules whose name contains one of these strings."));
    t.push_back(field("ignore_if_contains", &S::ignore_if_contains,
                      "Never adapt modules whose name contains one of these strings (wins over only_if_contains)."));
    t.push_back(not_yet<S>("target_lin_modules", "list of strings", "null",
                           "Explicit module class names to adapt."));
    return t;
  }();
  return t;
}

const Table<NetworkConfig>& network_table() {
  static const Table<NetworkConfig> t = [] {
    using S = NetworkConfig;
    Table<S> t;
    t.push_back(field("type", &S::type,
                      "Adapter kind: lora (Linear layers), locon (also Conv layers, rank `conv`), lokr (LyCORIS "
                      "Kronecker product) or loha (LyCORIS Hadamard product of two low-rank pairs).")
                    .one_of({"lora", "locon", "lokr", "loha"})
                    .not_yet({"lorm", "lycoris"})
                    .normalize(lower_normalize));
    t.push_back(field("linear", &S::linear, "Rank of each Linear adapter. Memory grows with it (a little).")
                    .range(1, 4096)
                    .lever());
    t.push_back(input_only<S>("rank", "integer", "null", "Legacy spelling of `linear`.",
                              [](S& s, const Val& v, Ctx& c, const Rules&) {
                                Rules r;
                                r.min = 1;
                                r.max = 4096;
                                read_value(s.linear, v, c, r);
                              }));
    t.push_back(field("linear_alpha", &S::linear_alpha,
                      "Scale numerator of Linear adapters: the update is scaled by linear_alpha / linear.")
                    .above(0)
                    .default_is("= alpha"));
    t.push_back(field("alpha", &S::alpha, "Default for linear_alpha.").above(0));
    t.push_back(field("conv", &S::conv, "Rank of Conv adapters (locon); null = no Conv adapters.")
                    .range(1, 4096)
                    .lever());
    t.push_back(field("conv_alpha", &S::conv_alpha, "Scale numerator of Conv adapters.").above(0).default_is("= conv"));
    t.push_back(field("dropout", &S::dropout, "Dropout on the adapter's input during training; null = none.")
                    .range(0, 1));
    t.push_back(section("network_kwargs", &S::network_kwargs, &network_kwargs_table,
                        "Which modules get adapters."));
    t.push_back(field("transformer_only", &S::transformer_only,
                      "Transformer models: adapt only the transformer blocks, not the embedders and final layers."));
    t.push_back(field("lokr_full_rank", &S::lokr_full_rank,
                      "LoKr: both Kronecker factors are full matrices (rank and alpha unused, scale 1) and Conv "
                      "layers get adapters too; false: the larger factor is a rank-`linear` pair."));
    t.push_back(field("lokr_factor", &S::lokr_factor,
                      "LoKr: the side of the small factor w1 (-1: the most balanced split of each layer).")
                    .range(-1, 65536));
    t.push_back(not_yet<S>("old_lokr_format", "boolean", "false", "LoKr only."));
    t.push_back(not_yet<S>("split_multistage_loras", "boolean", "true", "Wan 2.2 MoE: one file per expert."));
    t.push_back(not_yet<S>("layer_offloading", "boolean", "false", "Offload adapter layers to the CPU."));
    t.push_back(not_yet<S>("pretrained_lora_path", "string", "null", "Start from an existing LoRA file."));
    t.push_back(not_yet<S>("all_layers", "boolean", "false", "Full-weight adapters on non-Linear/Conv layers."));
    t.push_back(not_yet<S>("lorm", "section", "null", "LoRM settings."));
    t.push_back(not_yet<S>("normalize", "boolean", "false", "Legacy adapter normalisation."));
    return t;
  }();
  return t;
}

const Table<SaveConfig>& save_table() {
  static const Table<SaveConfig> t = [] {
    using S = SaveConfig;
    Table<S> t;
    t.push_back(field("dtype", &S::dtype, "Precision of the saved adapter weights (does not change training memory).")
                    .one_of(kDtypes));
    t.push_back(input_only<S>("save_dtype", "string", "null", "Older AI Toolkit spelling of `dtype`.",
                              [](S& s, const Val& v, Ctx& c, const Rules&) {
                                Rules r;
                                r.one_of = kDtypes;
                                read_value(s.dtype, v, c, r);
                              }));
    t.push_back(field("save_every", &S::save_every, "Save a checkpoint every this many steps.").min(1));
    t.push_back(field("max_step_saves_to_keep", &S::max_step_saves_to_keep,
                      "Keep this many step checkpoints; older ones are deleted.")
                    .min(0));
    t.push_back(field("save_format", &S::save_format,
                      "Key layout of the LoRA file: safetensors = kohya keys (lora_unet_..., what ComfyUI and "
                      "A1111/Forge load); peft = diffusers/PEFT keys (unet....lora_A/lora_B). diffusers, what "
                      "AI Toolkit's UI writes, is read as peft.")
                    .one_of({"safetensors", "peft"})
                    .normalize([](const std::string& s, const std::function<void(const std::string&)>&) {
                      const std::string l = to_lower(trim(s));
                      return l == "diffusers" ? std::string("peft") : l;
                    })
                    .allowed_is("safetensors, peft, diffusers (= peft)"));
    t.push_back(not_yet<S>("push_to_hub", "boolean", "false", "Upload to the Hugging Face Hub."));
    t.push_back(not_yet<S>("hf_repo_id", "string", "null", "Hub repository for push_to_hub."));
    t.push_back(not_yet<S>("hf_private", "boolean", "false", "Private Hub repository."));
    return t;
  }();
  return t;
}

const Table<DatasetConfig>& dataset_table() {
  static const Table<DatasetConfig> t = [] {
    using S = DatasetConfig;
    Table<S> t;
    t.push_back(field("folder_path", &S::folder_path,
                      "Folder of images (or videos when num_frames > 1) with caption sidecars. Required.")
                    .default_is("required")
                    .allowed_is("an existing folder with images (checked when a run starts)"));
    t.push_back(not_yet<S>("dataset_path", "string", "null", "A JSON dataset description instead of a folder."));
    t.push_back(field("caption_ext", &S::caption_ext, "Extension of caption files beside each image.")
                    .normalize([](const std::string& s, const std::function<void(const std::string&)>&) {
                      return s.empty() || s[0] == '.' ? s : "." + s;
                    }));
    t.push_back(field("default_caption", &S::default_caption, "Caption for images without a caption file."));
    t.push_back(field("trigger_word", &S::trigger_word, "Trigger word for this dataset only."));
    t.push_back(field("caption_dropout_rate", &S::caption_dropout_rate,
                      "Probability of training an image with an empty caption.")
                    .range(0, 1));
    t.push_back(field("shuffle_tokens", &S::shuffle_tokens, "Shuffle the comma-separated parts of each caption."));
    t.push_back(field("token_dropout_rate", &S::token_dropout_rate,
                      "Probability of dropping each comma-separated part of a caption.")
                    .range(0, 1));
    t.push_back(field("keep_tokens", &S::keep_tokens,
                      "Leading caption parts that shuffling and token dropout never touch.")
                    .min(0));
    t.push_back(field("resolution", &S::resolution,
                      "Training resolutions (pixels per side); each one is a bucket set. Pixels scale "
                      "activation memory: 512->768 is x2.25, 512->1024 is x4.")
                    .range(32, 4096)
                    .min_items(1)
                    .lever());
    t.push_back(field("buckets", &S::buckets,
                      "Group images by aspect ratio instead of centre-cropping to squares. Buckets go up to 4:1; a "
                      "longer image trains on its centre 4:1 part (the log names it)."));
    t.push_back(field("bucket_tolerance", &S::bucket_tolerance,
                      "Bucket size step; as in AI Toolkit the model's own divisibility is used instead.")
                    .min(1)
                    .no_effect());
    t.push_back(field("random_crop", &S::random_crop, "Crop at a random position instead of the centre.").not_yet({"true"}));
    t.push_back(field("square_crop", &S::square_crop, "Scale the short side to the resolution and crop a square (buckets: false does this).").not_yet({"true"}));
    t.push_back(field("flip_x", &S::flip_x, "Also train on horizontally mirrored images."));
    t.push_back(field("flip_y", &S::flip_y, "Also train on vertically mirrored images.").not_yet({"true"}));
    t.push_back(field("num_repeats", &S::num_repeats, "Repeat each image this many times per epoch.").min(1));
    t.push_back(field("cache_latents", &S::cache_latents,
                      "Encode every image once and keep the latents in memory; the VAE then leaves the GPU.")
                    .lever());
    t.push_back(field("cache_latents_to_disk", &S::cache_latents_to_disk,
                      "Encode once and keep the latents in <folder>/_latent_cache; the VAE then leaves the GPU.")
                    .lever());
    t.push_back(field("cache_text_embeddings", &S::cache_text_embeddings,
                      "Encode every caption once; the text encoders can then leave the GPU.")
                    .lever());
    t.push_back(field("num_frames", &S::num_frames,
                      "Frames per training clip; > 1 makes this a video dataset. The biggest memory lever for video. Wan takes 4k+1 (1, 5, ..., 81); another count is rounded as diffusers' WanPipeline rounds it (40 -> 41), with a warning.")
                    .range(1, 1024)
                    .lever());
    t.push_back(field("shrink_video_to_frames", &S::shrink_video_to_frames,
                      "Take num_frames evenly spaced frames from each whole clip (otherwise a window at `fps`)."));
    t.push_back(field("fps", &S::fps, "Frame rate of the window when shrink_video_to_frames is false.").min(1));
    t.push_back(field("num_workers", &S::num_workers, "Threads that load and decode images.").range(0, 64));
    t.push_back(field("prefetch_factor", &S::prefetch_factor, "Batches each loader thread prepares ahead.").range(1, 64));
    t.push_back(field("cache_latents_num_workers", &S::cache_latents_num_workers,
                      "Threads that decode and resize images while caching latents.")
                    .range(1, 64));
    t.push_back(not_yet<S>("batch_size", "integer", "null", "Per-dataset batch size."));
    t.push_back(not_yet<S>("type", "string", "image", "Dataset kind."));
    t.push_back(not_yet<S>("caption_type", "string", "null", "Legacy spelling of caption_ext."));
    t.push_back(not_yet<S>("random_triggers", "list of strings", "[]", "Random trigger words added to captions."));
    t.push_back(not_yet<S>("random_triggers_max", "integer", "1", "Random trigger words per caption."));
    t.push_back(not_yet<S>("random_scale", "boolean", "false", "Random scaling augmentation."));
    t.push_back(not_yet<S>("scale", "number", "1.0", "Image scale factor."));
    t.push_back(not_yet<S>("is_reg", "boolean", "false", "Regularisation dataset."));
    t.push_back(not_yet<S>("prior_reg", "boolean", "false", "Prior-preservation regularisation."));
    t.push_back(not_yet<S>("network_weight", "number", "1.0", "Adapter strength for this dataset."));
    t.push_back(not_yet<S>("loss_multiplier", "number", "1.0", "Loss weight of this dataset."));
    t.push_back(not_yet<S>("augments", "list of strings", "[]", "Augmentations."));
    t.push_back(not_yet<S>("augmentations", "list", "null", "Albumentations augmentations."));
    t.push_back(not_yet<S>("shuffle_augmentations", "boolean", "false", "Shuffle augmentations."));
    t.push_back(not_yet<S>("control_path", "string", "null", "Control images (depth, pose, ...)."));
    t.push_back(not_yet<S>("control_path_1", "string", "null", "Control images."));
    t.push_back(not_yet<S>("control_path_2", "string", "null", "Control images."));
    t.push_back(not_yet<S>("control_path_3", "string", "null", "Control images."));
    t.push_back(not_yet<S>("controls", "list of strings", "[]", "Automatic control images."));
    t.push_back(not_yet<S>("control_from_same_folder", "boolean", "false", "Control image from the same folder."));
    t.push_back(not_yet<S>("inpaint_path", "string", "null", "Inpainting masks."));
    t.push_back(not_yet<S>("mask_path", "string", "null", "Loss masks."));
    t.push_back(field("mask_min_value", &S::mask_min_value,
                      "Lowest loss weight a mask gives (0..1). Used only with mask_path or alpha_mask, which "
                      "lora-train does not support yet; no effect otherwise.")
                    .range(0, 1)
                    .no_effect());
    t.push_back(not_yet<S>("alpha_mask", "boolean", "false", "Use the alpha channel as loss mask."));
    t.push_back(not_yet<S>("invert_mask", "boolean", "false", "Invert the loss mask."));
    t.push_back(not_yet<S>("unconditional_path", "string", "null", "Unconditional images."));
    t.push_back(not_yet<S>("clip_image_path", "string", "null", "Reference images for image adapters."));
    t.push_back(not_yet<S>("cache_tensors_to_disk", "boolean", "false", "Cache decoded video/audio tensors."));
    t.push_back(not_yet<S>("cache_clip_vision_to_disk", "boolean", "false", "Cache CLIP vision embeddings."));
    t.push_back(not_yet<S>("use_short_captions", "boolean", "false", "Short captions from JSON."));
    t.push_back(not_yet<S>("standardize_images", "boolean", "false", "Standardise image statistics."));
    t.push_back(not_yet<S>("auto_frame_count", "boolean", "false", "Use every frame of each clip."));
    t.push_back(not_yet<S>("do_i2v", "boolean", "false", "Image-to-video training."));
    t.push_back(not_yet<S>("do_audio", "boolean", "false", "Load audio from videos."));
    return t;
  }();
  return t;
}

const Table<EmaConfig>& ema_table() {
  static const Table<EmaConfig> t = [] {
    using S = EmaConfig;
    Table<S> t;
    t.push_back(field("use_ema", &S::use_ema,
                      "Keep an exponential moving average of the adapter weights, updated after every optimizer "
                      "step; saved adapters and previews use the average, training continues on the live "
                      "weights. The average is part of the resumable state. Costs one fp32 copy of the adapter."));
    t.push_back(field("ema_decay", &S::ema_decay,
                      "average = decay x average + (1 - decay) x weights, from the first step on (no warm-up, as "
                      "in AI Toolkit).")
                    .range(0, 1));
    t.push_back(field("use_feedback", &S::use_feedback,
                      "After each update, move the live weights toward the average by 10 x (1 - ema_decay) of "
                      "their difference."));
    t.push_back(field("param_multiplier", &S::param_multiplier,
                      "After each update, multiply the live weights by this (a decay for bias-free adapters such "
                      "as LoRA); 1 = off.")
                    .above(0));
    return t;
  }();
  return t;
}

const Table<TrainConfig>& train_table() {
  static const Table<TrainConfig> t = [] {
    using S = TrainConfig;
    Table<S> t;
    t.push_back(field("batch_size", &S::batch_size, "Images per step. Multiplies activation memory.")
                    .range(1, 1024)
                    .lever());
    t.push_back(field("steps", &S::steps, "Optimizer steps to train.").min(1));
    t.push_back(field("gradient_accumulation", &S::gradient_accumulation,
                      "Micro-batches accumulated per optimizer step (effective batch = batch_size x this). "
                      "Keeps the effective batch when batch_size is lowered.")
                    .range(1, 1024)
                    .lever());
    t.push_back(field("gradient_accumulation_steps", &S::gradient_accumulation_steps,
                      "Legacy accumulation; cannot be combined with gradient_accumulation.")
                    .range(1, 1024)
                    .not_yet({"-1"})
                    .lever());
    t.push_back(field("train_unet", &S::train_unet, "Train the UNet/transformer adapter."));
    t.back().read = [](S& s, const Val& v, Ctx& c, const Rules&) {
      read_value(s.train_unet, v, c, Rules{});
      if (!s.train_unet)
        c.fail(v.mark, v.path, "'false' (training only the text encoder) is an AI Toolkit setting that "
                               "lora-train does not support yet");
    };
    t.back().info.allowed = "true";
    t.back().info.not_yet_values = "false";
    t.push_back(field("train_text_encoder", &S::train_text_encoder,
                      "Also put adapters on the text encoder(s). Costs their activations and gradients.")
                    .lever());
    t.push_back(field("gradient_checkpointing", &S::gradient_checkpointing,
                      "Recompute activations in backward: -60..70% activation memory for +20..30% time. "
                      "The first rollback step of the OOM guard.")
                    .lever());
    t.push_back(field("noise_scheduler", &S::noise_scheduler,
                      "Noise schedule for training: ddpm (SD 1.5/SDXL) or flowmatch (Flux, Wan).")
                    .one_of({"ddpm", "ddim", "euler", "flowmatch"})
                    .not_yet({"euler_a", "pndm", "lms", "dpmsolver", "dpmsolver++", "dpmsingle", "heun", "dpm_2", "dpm_2_a",
                              "lcm", "custom_lcm", "mean_flow"})
                    .normalize(lower_normalize));
    t.push_back(field("timestep_type", &S::timestep_type,
                      "How flow-matching noise levels are drawn (Flux, Wan): sigmoid = sigmoid(N(0, 1)); linear = "
                      "uniform over the 1000-level table; shift / flux_shift = that table shifted as at inference (by "
                      "the image's token count where the family shifts dynamically). DDPM models ignore it, as AI "
                      "Toolkit does.")
                    .one_of({"sigmoid", "linear", "shift", "flux_shift"})
                    .not_yet({"weighted", "lognorm_blend", "lumina2_shift", "next_sample", "one_step", "two_step", "four_step",
                              "eight_step"})
                    .normalize(lower_normalize));
    t.push_back(field("optimizer", &S::optimizer,
                      "adamw8bit keeps optimizer state in 8 bits (a quarter of adamw's).")
                    .one_of({"adamw", "adam", "adamw8bit", "adafactor"})
                    .not_yet({"adam8bit", "ademamix8bit", "lion8bit", "adam8", "adamw8", "prodigy8bit", "lion",
                              "adagrad", "prodigy", "dadaptation", "dadaptadam", "dadaptlion", "automagic",
                              "automagic2", "automagic3", "sgd"})
                    .normalize(lower_normalize)
                    .lever());
    t.push_back(field("optimizer_params", &S::optimizer_params,
                      "Passed to the optimizer: weight_decay, betas, eps (Adafactor: relative_step, "
                      "scale_parameter, warmup_init)."));
    t.push_back(field("lr", &S::lr, "Learning rate.").above(0));
    t.push_back(field("unet_lr", &S::unet_lr, "Learning rate of the UNet/transformer adapter.")
                    .above(0)
                    .default_is("= lr"));
    t.push_back(field("text_encoder_lr", &S::text_encoder_lr, "Learning rate of the text-encoder adapter.")
                    .above(0)
                    .default_is("= lr"));
    t.push_back(field("lr_scheduler", &S::lr_scheduler, "Learning-rate schedule over `steps`.")
                    .one_of({"constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "step"})
                    .not_yet({"polynomial", "piecewise_constant"})
                    .normalize(lower_normalize));
    t.push_back(field("lr_scheduler_params", &S::lr_scheduler_params,
                      "Passed to the schedule (num_warmup_steps, num_cycles, step_size, gamma, ...)."));
    t.push_back(field("skip_first_sample", &S::skip_first_sample,
                      "Skip the baseline samples before step 1 (they are an OOM risk on tight cards).")
                    .lever());
    t.push_back(field("force_first_sample", &S::force_first_sample,
                      "Sample before training even when resuming."));
    t.push_back(field("disable_sampling", &S::disable_sampling, "Never generate samples.").lever());
    t.push_back(field("dtype", &S::dtype, "Compute precision of the frozen base (and of model.dtype).")
                    .one_of(kDtypes)
                    .lever());
    t.push_back(field("max_grad_norm", &S::max_grad_norm, "Gradient clipping norm; 0 = no clipping.").min(0));
    t.push_back(field("xformers", &S::xformers,
                      "lora-train always uses its memory-efficient attention; accepted for compatibility.")
                    .no_effect());
    t.push_back(field("sdp", &S::sdp,
                      "lora-train always uses its memory-efficient attention; accepted for compatibility.")
                    .no_effect());
    t.push_back(not_yet<S>("attention_backend", "string", "native", "diffusers attention backend (flash, sage, ...)."));
    t.push_back(field("unload_text_encoder", &S::unload_text_encoder,
                      "Encode the blank prompt, the trigger word and the sample prompts once, then move the text "
                      "encoders off the GPU. Every image then trains with the trigger word (the blank prompt "
                      "without one), not its caption, as in AI Toolkit, unless cache_text_embeddings is on and "
                      "captions do not change from step to step. Cannot be combined with train_text_encoder.")
                    .lever());
    t.push_back(field("cache_text_embeddings", &S::cache_text_embeddings,
                      "Turn on cache_text_embeddings for every dataset.")
                    .lever());
    t.push_back(field("start_step", &S::start_step, "Step number to start (or resume) counting from.").min(0));
    t.push_back(section("ema_config", &S::ema_config, &ema_table, "Exponential moving average of the adapter."));
    t.push_back(field("loss_type", &S::loss_type, "Training loss.")
                    .one_of({"mse"})
                    .not_yet({"mae", "wavelet", "pixelspace", "mean_flow", "pseudo_huber", "huber", "smooth_l1"})
                    .normalize(lower_normalize));
    t.push_back(field("min_snr_gamma", &S::min_snr_gamma, "Min-SNR loss weighting gamma (ddpm); null = off.").above(0));
    t.push_back(field("noise_offset", &S::noise_offset, "Offset noise strength.").min(0));
    t.push_back(not_yet<S>("content_or_style", "string", "balanced", "Timestep bias toward content or style."));
    t.push_back(not_yet<S>("snr_gamma", "number", "null", "SNR loss weighting."));
    t.push_back(not_yet<S>("linear_timesteps", "boolean", "false", "Bell-curved timestep weighting."));
    t.push_back(not_yet<S>("linear_timesteps2", "boolean", "false", "Timestep weighting variant."));
    t.push_back(not_yet<S>("min_denoising_steps", "integer", "0", "Lowest training timestep."));
    t.push_back(not_yet<S>("max_denoising_steps", "integer", "999", "Highest training timestep."));
    t.push_back(not_yet<S>("num_train_timesteps", "integer", "1000", "Timesteps of the training schedule."));
    t.push_back(accepted<S, int>("switch_boundary_every", 1,
                                 "Wan 2.2 MoE: steps between switches of the trained expert. No effect on the "
                                 "families lora-train supports, which have no experts.")
                    .min(1));
    t.push_back(not_yet<S>("do_paramiter_swapping", "boolean", "false", "Adafactor parameter swapping."));
    t.push_back(not_yet<S>("paramiter_swapping_factor", "number", "0.1", "Adafactor parameter swapping."));
    t.push_back(not_yet<S>("validation_config", "section", "null", "Validation loss at fixed sigmas."));
    t.push_back(not_yet<S>("weight_jitter", "number", "0.0", "Weight jitter."));
    t.push_back(not_yet<S>("merge_network_on_save", "boolean", "false", "Merge the adapter into a saved model."));
    t.push_back(not_yet<S>("free_u", "boolean", "false", "FreeU."));
    t.push_back(not_yet<S>("noise_multiplier", "number", "1.0", "Noise scale."));
    t.push_back(not_yet<S>("img_multiplier", "number", "1.0", "Image scale."));
    t.push_back(not_yet<S>("learnable_snr_gos", "boolean", "false", "Learnable SNR weighting."));
    t.push_back(not_yet<S>("train_refiner", "boolean", "true", "SDXL refiner training."));
    t.push_back(not_yet<S>("train_turbo", "boolean", "false", "Turbo training."));
    t.push_back(not_yet<S>("short_and_long_captions", "boolean", "false", "Train both caption lengths."));
    t.push_back(not_yet<S>("single_item_batching", "boolean", "false", "One item at a time, accumulated."));
    t.push_back(not_yet<S>("loss_target", "string", "noise", "Prediction target."));
    t.push_back(not_yet<S>("inverted_mask_prior", "boolean", "false", "Masked prior regularisation."));
    t.push_back(not_yet<S>("diff_output_preservation", "boolean", "false", "Differential output preservation."));
    t.push_back(field("diff_output_preservation_multiplier", &S::diff_output_preservation_multiplier,
                      "Loss weight of differential output preservation; used only with diff_output_preservation.")
                    .min(0)
                    .no_effect());
    t.push_back(field("diff_output_preservation_class", &S::diff_output_preservation_class,
                      "Class word that replaces the trigger word for differential output preservation (e.g. "
                      "person); used only with diff_output_preservation.")
                    .no_effect());
    t.push_back(accepted<S, double>("blank_prompt_preservation_multiplier", 1.0,
                                    "Loss weight of blank-prompt preservation; used only with "
                                    "blank_prompt_preservation."));
    t.push_back(not_yet<S>("blank_prompt_preservation", "boolean", "false", "Blank-prompt preservation."));
    t.push_back(not_yet<S>("do_cfg", "boolean", "false", "CFG during training."));
    t.push_back(not_yet<S>("correct_pred_norm", "boolean", "false", "Prediction norm correction."));
    t.push_back(not_yet<S>("target_norm_std", "number", "null", "Output std regulariser."));
    t.push_back(field("cfg_scale", &S::cfg_scale,
                      "Flux dev: the guidance value its guidance embedder gets while training (AI Toolkit's "
                      "guidance_embedding_scale). No effect on models without one.")
                    .min(0));
    t.push_back(field("bypass_guidance_embedding", &S::bypass_guidance_embedding,
                      "Flux family: run the transformer with its guidance embedder bypassed while training (for "
                      "bases without guidance distillation, such as Flex.1). No effect on SD, SDXL and Wan."));
    t.push_back(not_yet<S>("do_guidance_loss", "boolean", "false", "Guidance loss."));
    t.push_back(not_yet<S>("do_differential_guidance", "boolean", "false", "Differential guidance."));
    t.push_back(not_yet<S>("do_prior_divergence", "boolean", "false", "Prior divergence loss."));
    t.push_back(not_yet<S>("do_fft_loss", "boolean", "false", "Additional FFT loss."));
    t.push_back(not_yet<S>("max_loss", "number", "null", "Loss clipping."));
    t.push_back(not_yet<S>("negative_prompt", "string", "null", "Negative prompt during training."));
    t.push_back(not_yet<S>("adapter_assist_name_or_path", "string", "null", "Assistant adapter."));
    t.push_back(not_yet<S>("embedding_lr", "number", "null", "Embedding learning rate."));
    t.push_back(not_yet<S>("adapter_lr", "number", "null", "Adapter learning rate."));
    t.push_back(not_yet<S>("refiner_lr", "number", "null", "Refiner learning rate."));
    return t;
  }();
  return t;
}

namespace {
// The model families lora-train knows (lt::models::ModelFamily), as `arch` values.
const std::vector<std::string> kArchs = {"sd1", "sd2", "sdxl", "flux", "wan21"};
// AI Toolkit's other families (its Python arch names; the UI's names reduce to these once the
// ":tag" is stripped, e.g. qwen_image:2512, wan22_14b:t2v, zimage:turbo).
const std::vector<std::string> kNotYetArchs = {
    "sd3", "flex2", "flux_kontext", "flux2", "flux2_klein_4b", "flux2_klein_9b", "chroma", "chroma_radiance",
    "zeta_chroma", "lumina2", "wan21_i2v", "wan22_5b", "wan22_14b", "wan22_14b_i2v", "qwen_image",
    "qwen_image_edit", "qwen_image_edit_plus", "hidream", "hidream_e1", "hidream_o1", "zimage", "zimage_l2p",
    "ltx2", "ltx2.3", "ltx2.5", "pixart", "pixart_sigma", "auraflow", "vega", "ssd", "omnigen2", "anima",
    "cogview4", "f-lite", "minimax_h3", "minimax_h3_ref2va", "ernie_image", "ace_step_15", "ace_step_15_xl",
    "nucleus_image", "ideogram4", "prx_pixel", "krea2", "mageflow", "mageflow_edit", "boogu_image",
    "boogu_image_edit", "sapiens2_1b"};
const char* kArchsText = "sd1 (UI: sd15), sd2, sdxl, flux (also flex1), wan21 (UI: wan21:1b, wan21:14b)";

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// AI Toolkit's UI writes `arch: wan21:1b` (family:tag; the tag is stripped, as AI Toolkit does) and
// `arch: sd15` (built as sd1 there); flex1 is built as flux.
std::string normalize_arch(const std::string& s, const std::function<void(const std::string&)>& fail) {
  std::string a = to_lower(trim(s));
  if (auto colon = a.find(':'); colon != std::string::npos) a = a.substr(0, colon);
  if (a == "flex1") a = "flux";
  if (a == "sd15") a = "sd1";
  if (contains(kNotYetArchs, a))
    fail("'" + s + "' is an AI Toolkit model family that lora-train does not support yet (supported: " +
         kArchsText + ")");
  return a;
}

template <class S>
Key<S> legacy_flag(const char* name, const char* arch) {
  std::string a = arch;
  return input_only<S>(name, "boolean", "false",
                       "Legacy architecture flag; `true` means arch: the named family when arch is absent.",
                       [a](S& s, const Val& v, Ctx& c, const Rules&) {
                         bool on = false;
                         read_value(on, v, c, Rules{});
                         if (!on) return;
                         if (!contains(kArchs, a))
                           c.fail(v.mark, v.path, "'true' means arch " + a +
                                                      ", an AI Toolkit model family that lora-train does not "
                                                      "support yet (supported: " + kArchsText + ")");
                         s.arch_from_flags = a;
                       });
}
}  // namespace

const Table<ModelConfig>& model_table() {
  static const Table<ModelConfig> t = [] {
    using S = ModelConfig;
    Table<S> t;
    t.push_back(field("name_or_path", &S::name_or_path,
                      "The base model: a single .safetensors checkpoint, a diffusers folder, or a Hugging Face "
                      "repo id (org/name) already in the local Hugging Face cache: HF_HUB_CACHE, else "
                      "HF_HOME/hub, else ~/.cache/huggingface/hub. Nothing is downloaded. Required.")
                    .default_is("required")
                    .allowed_is("a file, a folder, or a repo id in the local Hugging Face cache (checked when a "
                                "run starts)"));
    t.push_back(field("arch", &S::arch,
                      "Model family. null = detect it from the checkpoint. AI Toolkit's UI names are read as "
                      "families: sd15 = sd1, flex1 = flux, a :tag is dropped (wan21:1b = wan21). Families known "
                      "here but not trainable in this version are reported when the run starts.")
                    .one_of(kArchs)
                    .normalize(normalize_arch));
    t.back().info.not_yet_values = Key<S>::join(kNotYetArchs);
    t.push_back(legacy_flag<S>("is_v2", "sd2"));
    t.push_back(legacy_flag<S>("is_xl", "sdxl"));
    t.push_back(legacy_flag<S>("is_v3", "sd3"));
    t.push_back(legacy_flag<S>("is_flux", "flux"));
    t.push_back(legacy_flag<S>("is_lumina2", "lumina2"));
    t.push_back(legacy_flag<S>("is_pixart", "pixart"));
    t.push_back(legacy_flag<S>("is_pixart_sigma", "pixart_sigma"));
    t.push_back(legacy_flag<S>("is_auraflow", "auraflow"));
    t.push_back(legacy_flag<S>("is_ssd", "ssd"));
    t.push_back(legacy_flag<S>("is_vega", "vega"));
    t.push_back(field("is_v_pred", &S::is_v_pred, "The base predicts v (v-prediction) instead of noise."));
    t.push_back(field("dtype", &S::dtype,
                      "AI Toolkit replaces it with train.dtype; lora-train accepts it when the two agree.")
                    .one_of(kDtypes)
                    .default_is("= train.dtype"));
    t.push_back(field("quantize", &S::quantize,
                      "Store the frozen base's Linear weights in 8 bits with one scale per output channel, a quarter "
                      "of fp32's memory: fp8 e4m3 codes for qfloat8 (decoded through a byte table), int8 for qint8. "
                      "The base is quantized on the host before it reaches the device. Flux and Wan with qfloat8: an fp8 "
                      "file's weights (e4m3fn or e5m2, plain or ComfyUI scaled) are kept as stored, never widened (AI "
                      "Toolkit widens fp8 files to the dtype first).")
                    .lever());
    t.push_back(field("qtype", &S::qtype, "Weight format when quantize is on.")
                    .one_of({"qfloat8", "float8", "qint8", "int8"})
                    .not_yet({"qint4", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7", "uint8", "nvfp4",
                              "convrot8", "convrot4"})
                    .normalize([](const std::string& s, const std::function<void(const std::string&)>& fail) {
                      if (s.find('|') != std::string::npos)
                        fail("'" + s + "': accuracy-recovery adapters (qtype|adapter) are an AI Toolkit setting "
                             "that lora-train does not support yet");
                      return to_lower(trim(s));
                    })
                    .lever());
    t.push_back(field("quantize_te", &S::quantize_te, "Quantize the text encoder(s) too.")
                    .default_is("= quantize")
                    .lever());
    t.push_back(field("qtype_te", &S::qtype_te, "Weight format of the text encoder(s) when quantize_te is on (the denoiser keeps qtype's).")
                    .one_of({"qfloat8", "float8", "qint8", "int8"})
                    .not_yet({"qint4", "uint4", "uint8", "nvfp4", "convrot8"})
                    .normalize(lower_normalize)
                    .lever());
    t.push_back(field("low_vram", &S::low_vram,
                      "Keep parts of the model on the CPU between phases (text encoders, VAE; quantize on the CPU). "
                      "Slower, much less VRAM.")
                    .lever());
    t.push_back(field("vae_path", &S::vae_path, "A separate VAE checkpoint."));
    t.push_back(field("tokenizer_path", &S::tokenizer_path,
                      "CLIP BPE vocabulary (bpe_simple_vocab_16e6.txt.gz or vocab.json + merges.txt folder) for "
                      "single-file checkpoints, which do not contain one.")
                    .ours());
    t.push_back(not_yet<S>("layer_offloading", "boolean", "false", "Stream layers from pinned CPU memory."));
    t.push_back(not_yet<S>("layer_offloading_transformer_percent", "number", "1.0", "Share of offloaded layers."));
    t.push_back(not_yet<S>("layer_offloading_text_encoder_percent", "number", "1.0", "Share of offloaded layers."));
    t.push_back(not_yet<S>("auto_memory", "boolean", "false", "Deprecated alias of layer_offloading."));
    t.push_back(not_yet<S>("te_device", "string", "null", "Device of the text encoders."));
    t.push_back(not_yet<S>("vae_device", "string", "null", "Device of the VAE."));
    t.push_back(not_yet<S>("te_dtype", "string", "null", "Precision of the text encoders."));
    t.push_back(not_yet<S>("vae_dtype", "string", "null", "Precision of the VAE."));
    t.push_back(not_yet<S>("text_encoder_bits", "integer", "16", "PixArt text-encoder bits."));
    t.push_back(not_yet<S>("te_name_or_path", "string", "null", "A separate text encoder."));
    t.push_back(not_yet<S>("extras_name_or_path", "string", "null", "Where text encoders/VAE come from."));
    t.push_back(field("assistant_lora_path", &S::assistant_lora_path,
                      "Flux only, as in AI Toolkit: an adapter merged into the base while training and taken out "
                      "for previews, never saved into the trained LoRA (FLUX.1-schnell needs "
                      "ostris/FLUX.1-schnell-training-adapter). A .safetensors file, a folder holding "
                      "pytorch_lora_weights.safetensors, or a Hugging Face repo id in the local cache."));
    t.push_back(not_yet<S>("inference_lora_path", "string", "null", "Adapter used only for sampling."));
    t.push_back(not_yet<S>("lora_path", "string", "null", "Adapter merged into the base."));
    t.push_back(not_yet<S>("unconditional_lora_path", "string", "null", "Adapter for the unconditional pass."));
    t.push_back(not_yet<S>("accuracy_recovery_adapter", "string", "null", "Accuracy-recovery adapter."));
    t.push_back(not_yet<S>("refiner_name_or_path", "string", "null", "SDXL refiner."));
    t.push_back(not_yet<S>("unet_path", "string", "null", "A separate UNet."));
    t.push_back(not_yet<S>("use_text_encoder_1", "boolean", "true", "SDXL text encoder 1."));
    t.push_back(not_yet<S>("use_text_encoder_2", "boolean", "true", "SDXL text encoder 2."));
    t.push_back(not_yet<S>("experimental_xl", "boolean", "false", "Experimental SDXL."));
    t.push_back(not_yet<S>("use_flux_cfg", "boolean", "false", "Flux CFG."));
    t.push_back(not_yet<S>("attn_masking", "boolean", "false", "Flux attention masking."));
    t.push_back(not_yet<S>("split_model_over_gpus", "boolean", "false", "Flux over several GPUs."));
    t.push_back(accepted<S, bool>("compile", false, "torch.compile of the model (speed only); lora-train has no "
                                                   "torch.compile."));
    t.push_back(accepted<S, bool>("block_compile", false, "torch.compile per block (speed only)."));
    t.push_back(accepted<S, std::string>("compile_mode", "default", "torch.compile mode (speed only)."));
    t.push_back(accepted<S, bool>("compile_fullgraph", false, "torch.compile option (speed only)."));
    t.push_back(accepted<S, bool>("compile_dynamic", true, "torch.compile option (speed only)."));
    t.push_back(accepted<S, std::optional<int>>("cache_size_limit", std::nullopt,
                                                "torch.compile cache size (speed only)."));
    t.push_back(not_yet<S>("model_kwargs", "mapping", "{}", "Model-specific options."));
    t.push_back(not_yet<S>("model_paths", "mapping", "{}", "Model-specific paths."));
    t.push_back(not_yet<S>("quantize_kwargs", "mapping", "{}", "Quantizer options."));
    t.push_back(not_yet<S>("ignore_if_contains", "list of strings", "null", "Model-level module filter."));
    t.push_back(not_yet<S>("only_if_contains", "list of strings", "null", "Model-level module filter."));
    t.push_back(not_yet<S>("in_context", "boolean", "false", "In-context training."));
    t.push_back(not_yet<S>("latent_space_version", "string", "null", "Latent cache version tag."));
    return t;
  }();
  return t;
}

const Table<SampleItem>& sample_item_table() {
  static const Table<SampleItem> t = [] {
    using S = SampleItem;
    Table<S> t;
    t.push_back(field("prompt", &S::prompt, "The prompt (inline flags allowed). Required.").default_is("required"));
    t.push_back(field("width", &S::width, "Width; null = sample.width.").range(32, 4096).lever());
    t.push_back(field("height", &S::height, "Height; null = sample.height.").range(32, 4096).lever());
    t.push_back(field("neg", &S::neg, "Negative prompt; null = sample.neg."));
    t.push_back(field("seed", &S::seed, "Seed; null = sample.seed (+ index with walk_seed)."));
    t.push_back(field("guidance_scale", &S::guidance_scale, "CFG scale; null = sample.guidance_scale.").min(0));
    t.push_back(field("sample_steps", &S::sample_steps, "Denoising steps; null = sample.sample_steps.")
                    .range(1, 1000)
                    .lever());
    t.push_back(field("num_frames", &S::num_frames, "Video frames; null = sample.num_frames.").range(1, 1024).lever());
    t.push_back(field("fps", &S::fps, "Video frame rate; null = sample.fps.").min(1));
    t.push_back(field("network_multiplier", &S::network_multiplier, "Adapter strength; null = sample's."));
    t.push_back(not_yet<S>("ctrl_img", "string", "null", "Control image."));
    t.push_back(not_yet<S>("ctrl_idx", "integer", "0", "Control image index."));
    t.push_back(not_yet<S>("ctrl_img_1", "string", "null", "Control image."));
    t.push_back(not_yet<S>("ctrl_img_2", "string", "null", "Control image."));
    t.push_back(not_yet<S>("ctrl_img_3", "string", "null", "Control image."));
    t.push_back(not_yet<S>("do_cfg_norm", "boolean", "false", "CFG normalisation."));
    return t;
  }();
  return t;
}

const Table<SampleConfig>& sample_table() {
  static const Table<SampleConfig> t = [] {
    using S = SampleConfig;
    Table<S> t;
    t.push_back(field("sampler", &S::sampler, "Sampler for previews. Flow-matching models (Flux, Wan) sample with flowmatch (Wan also with unipc, WanPipeline's own scheduler): another name gets a warning and flowmatch; flowmatch or unipc on SD 1.x/2.x/SDXL is an error.")
                    .one_of({"ddpm", "ddim", "euler", "flowmatch", "unipc"})
                    .not_yet({"euler_a", "pndm", "lms", "dpmsolver", "dpmsolver++", "dpmsingle", "heun", "dpm_2", "dpm_2_a",
                              "lcm", "custom_lcm", "mean_flow"})
                    .normalize(lower_normalize));
    t.push_back(field("sample_every", &S::sample_every, "Generate previews every this many steps.").min(1).lever());
    t.push_back(field("sample_start_step", &S::sample_start_step, "No periodic previews before this step.").min(0));
    t.push_back(field("width", &S::width, "Preview width.").range(32, 4096).lever());
    t.push_back(field("height", &S::height, "Preview height.").range(32, 4096).lever());
    t.push_back(field("prompts", &S::prompts,
                      "Preview prompts. [trigger] is replaced by the trigger word; inline flags --w --h --seed "
                      "--cfg --steps --n (negative) --m (multiplier) stay in the string."));
    t.push_back(section_list("samples", &S::samples, &sample_item_table,
                             "Previews with per-item settings (AI Toolkit's newer form of prompts)."));
    t.push_back(field("neg", &S::neg, "Negative prompt (AI Toolkit's default `false` means none).")
                    .normalize([](const std::string& s, const std::function<void(const std::string&)>&) {
                      return to_lower(s) == "false" ? std::string() : s;
                    }));
    t.push_back(field("seed", &S::seed, "Seed of the first preview."));
    t.push_back(field("walk_seed", &S::walk_seed, "Preview i uses seed + i."));
    t.push_back(field("guidance_scale", &S::guidance_scale, "Classifier-free guidance scale.").min(0));
    t.push_back(field("sample_steps", &S::sample_steps, "Denoising steps per preview.").range(1, 1000).lever());
    t.push_back(field("network_multiplier", &S::network_multiplier, "Adapter strength in previews."));
    t.push_back(field("format", &S::format, "Image file format of previews; lora-train writes PNG whatever is set.")
                    .one_of({"jpg", "png"})
                    .not_yet({"webp"})
                    .normalize(lower_normalize)
                    .no_effect());
    t.push_back(field("num_frames", &S::num_frames, "Frames per video preview; Wan's 4k+1 rule as datasets[].num_frames.").range(1, 1024).lever());
    t.push_back(field("fps", &S::fps, "Frame rate of video previews.").min(1));
    t.push_back(not_yet<S>("guidance_rescale", "number", "0.0", "CFG rescale."));
    t.push_back(not_yet<S>("adapter_conditioning_scale", "number", "1.0", "Image-adapter strength."));
    t.push_back(not_yet<S>("refiner_start_at", "number", "0.5", "SDXL refiner switch point."));
    t.push_back(not_yet<S>("extra_values", "list", "[]", "Extra conditioning values."));
    t.push_back(not_yet<S>("do_cfg_norm", "boolean", "false", "CFG normalisation."));
    return t;
  }();
  return t;
}

const Table<LoggingConfig>& logging_table() {
  static const Table<LoggingConfig> t = [] {
    using S = LoggingConfig;
    Table<S> t;
    t.push_back(field("log_every", &S::log_every, "Write a metrics line every this many steps.").min(1));
    t.push_back(field("verbose", &S::verbose, "Debug-level console output."));
    t.push_back(field("project_name", &S::project_name, "W&B project name; lora-train does not log to W&B.")
                    .no_effect());
    t.push_back(field("run_name", &S::run_name, "W&B run name; lora-train does not log to W&B.").no_effect());
    t.push_back(not_yet<S>("use_wandb", "boolean", "false", "Log to Weights & Biases."));
    t.push_back(ignored<S>("use_ui_logger", "boolean", "false",
                           "Sends losses to AI Toolkit's UI; lora-train writes metrics.jsonl and its log instead."));
    return t;
  }();
  return t;
}

const Table<OomGuardConfig>& oom_guard_table() {
  static const Table<OomGuardConfig> t = [] {
    using S = OomGuardConfig;
    Table<S> t;
    t.push_back(field("enabled", &S::enabled,
                      "On an out-of-memory error, apply the next rollback step (OOM_PLAYBOOK.md) and retry the "
                      "same step. Off: the run stops at the first OOM.")
                    .ours());
    t.push_back(field("max_attempts", &S::max_attempts,
                      "Rollback steps tried before the run saves its state and exits with code 3.")
                    .range(0, 100)
                    .ours());
    t.push_back(field("scale_up", &S::scale_up,
                      "After a stable stretch, add back one heavier setting at a time (playbook section 5).")
                    .ours());
    t.push_back(field("scale_up_after", &S::scale_up_after, "Stable steps before each scale-up.").min(1).ours());
    t.push_back(field("plan", &S::plan,
                      "Before loading, predict peak memory per phase (lora-train plan); when a VRAM budget is known "
                      "(simulate_vram, vram_limit or CUDA's free memory) and the config is predicted not to fit, "
                      "start from the ladder's first rung that fits (planned changes, listed in report.json).")
                    .ours());
    return t;
  }();
  return t;
}

const Table<MemoryConfig>& memory_table() {
  static const Table<MemoryConfig> t = [] {
    using S = MemoryConfig;
    Table<S> t;
    t.push_back(field("simulate_vram", &S::simulate_vram,
                      "device: cpu only. A budgeted allocator throws the same out-of-memory error as CUDA when "
                      "live tensors would exceed this size; 0 = off. Makes OOM behaviour testable on CPU.")
                    .ours());
    t.push_back(field("vram_limit", &S::vram_limit,
                      "CUDA: cap this process's GPU memory (e.g. to rehearse a 24 GB card on a bigger one); 0 = "
                      "the whole card.")
                    .ours()
                    .lever());
    t.push_back(field("alloc_conf", &S::alloc_conf,
                      "PYTORCH_CUDA_ALLOC_CONF for this run, e.g. "
                      "\"expandable_segments:True\" or \"max_split_size_mb:128,garbage_collection_threshold:0.8\" "
                      "against fragmentation. Empty = leave the environment as it is.")
                    .ours()
                    .lever());
    t.push_back(section("oom_guard", &S::oom_guard, &oom_guard_table, "The out-of-memory guard."));
    t.back().info.ours = true;
    t.push_back(field("attention_chunk", &S::attention_chunk,
                      "Compute attention this many query rows at a time (less memory for long sequences, e.g. "
                      "video); 0 = all at once. Exact: the results do not change beyond float rounding. The OOM guard sets it first. "
                      "On a CPU with AVX-512, attention over 256+ tokens (1024+ in bf16) runs in blocks of at most "
                      "128 rows whatever this says: faster there as well as lighter; not under simulate_vram, "
                      "which stands for a GPU.")
                    .min(0)
                    .ours()
                    .lever());
    t.push_back(field("vae_tiling", &S::vae_tiling,
                      "Encode and decode images in overlapping tiles of the VAE's native size, blended at "
                      "the seams (diffusers' enable_vae_tiling): far less memory for large images, results "
                      "within the VAE's tiling tolerance.")
                    .ours()
                    .lever());
    return t;
  }();
  return t;
}

const Table<ProcessConfig>& process_table() {
  static const Table<ProcessConfig> t = [] {
    using S = ProcessConfig;
    Table<S> t;
    t.push_back(field("type", &S::type, "Process kind. Required.")
                    .default_is("required")
                    .one_of({"sd_trainer", "diffusion_trainer", "ui_trainer"})
                    .not_yet({"textual_inversion_trainer", "slider", "concept_replacer", "esrgan_trainer",
                              "reference_trainer", "vae_trainer", "mod_lora_scale", "extract_lora"}));
    t.push_back(field("training_folder", &S::training_folder,
                      "Output root; the run writes to training_folder/<name>/ (adapter files, samples, "
                      "config.yaml, log, metrics.jsonl, report.json, report.html, state/)."));
    t.push_back(field("device", &S::device,
                      "cpu, cuda, cuda:N, or auto (cuda:0 when a GPU is visible, else cpu).")
                    .normalize([](const std::string& s, const std::function<void(const std::string&)>& fail) {
                      std::string d = to_lower(trim(s));
                      if (d == "auto" || d == "cpu" || d == "cuda") return d;
                      if (starts_with(d, "cuda:") && d.size() > 5 &&
                          d.find_first_not_of("0123456789", 5) == std::string::npos)
                        return d;
                      if (d == "mps" || starts_with(d, "mps:"))
                        fail("'" + s + "' is an AI Toolkit setting that lora-train does not support yet "
                             "(supported: auto, cpu, cuda, cuda:N)");
                      fail("'" + s + "' is not a device (allowed: auto, cpu, cuda, cuda:N)");
                      return d;
                    })
                    .allowed_is("auto, cpu, cuda, cuda:N"));
    t.push_back(field("trigger_word", &S::trigger_word,
                      "Replaces [trigger] in captions and prompts, and is added to captions that lack it."));
    t.push_back(field("training_seed", &S::training_seed, "Seed for noise, timesteps and data order; null = random."));
    t.push_back(section("network", &S::network, &network_table, "The adapter."));
    t.push_back(section("save", &S::save, &save_table, "Checkpoints."));
    t.push_back(section_list("datasets", &S::datasets, &dataset_table, "Training data; at least one."));
    t.push_back(section("train", &S::train, &train_table, "Optimisation."));
    t.push_back(section("model", &S::model, &model_table, "The frozen base model."));
    t.push_back(section("sample", &S::sample, &sample_table, "Previews during training."));
    t.push_back(section("logging", &S::logging, &logging_table, "Metrics."));
    t.push_back(section("memory", &S::memory, &memory_table,
                        "lora-train's memory settings: simulated VRAM, the CUDA cap and the OOM guard."));
    t.back().info.ours = true;
    t.push_back(ignored<S>("performance_log_every", "integer", "0",
                           "AI Toolkit prints its per-phase timers every N steps (console bookkeeping)."));
    t.push_back(not_yet<S>("first_sample", "section", "null", "A separate sample section for the first sample."));
    t.push_back(not_yet<S>("log_dir", "string", "null", "TensorBoard folder."));
    t.push_back(ignored<S>("sqlite_db_path", "string", "null",
                           "AI Toolkit UI's job database (job status, stop requests); lora-train has no UI."));
    t.push_back(not_yet<S>("torch_profiler", "boolean", "false", "PyTorch profiler."));
    t.push_back(not_yet<S>("embedding", "section", "null", "Textual-inversion embedding."));
    t.push_back(not_yet<S>("adapter", "section", "null", "Image adapters (IP-Adapter, T2I, ControlNet)."));
    t.push_back(not_yet<S>("decorator", "section", "null", "Decorator training."));
    t.push_back(not_yet<S>("guidance", "section", "null", "Guidance training."));
    t.push_back(not_yet<S>("slider", "section", "null", "Slider training."));
    t.push_back(not_yet<S>("do_lorm", "boolean", "false", "LoRM conversion."));
    return t;
  }();
  return t;
}

}  // namespace lt::config::detail
