#include "phase_rules.h"

#include "text.h"

namespace lt::diagnose::detail {

using S = Stage;

const std::vector<ActivityMessage>& activity_messages() {
  static const std::vector<ActivityMessage> table = {
      // ---- ai-toolkit ----
      // ai-toolkit: toolkit/models/base_model.py, toolkit/stable_diffusion_model.py and
      // extensions_built_in/diffusion_models/*: print_and_status_update() while load_model() runs.
      {"loading transformer", S::kModelLoad},
      {"loading vae", S::kModelLoad},
      {"loading t5", S::kModelLoad},
      {"loading clip", S::kModelLoad},
      {"loading te", S::kModelLoad},
      {"loading text encoder", S::kModelLoad},
      {"loading flux", S::kModelLoad},
      {"loading sd3", S::kModelLoad},
      {"loading qwen", S::kModelLoad},
      {"loading wan", S::kModelLoad},
      {"loading umt5", S::kModelLoad},
      {"making pipe", S::kModelLoad},
      {"preparing model", S::kModelLoad},
      {"model loaded", S::kModelLoad},
      {"moving transformer", S::kModelLoad},
      {"moving text encoder", S::kModelLoad},
      {"moving everything to device", S::kModelLoad},
      {"fusing in lora", S::kModelLoad},
      {"loading assistant lora", S::kModelLoad},
      // ai-toolkit: the same files, "Quantizing transformer" / "Quantizing T5" / ...;
      // toolkit/models/v2/_mixin.py: the "Quantizing blocks" bar.
      {"quantiz", S::kQuantize, true, true},
      // ai-toolkit: toolkit/dataloader_mixins.py cache_latents_all_latents(), cache_text_embeddings().
      {"caching latents", S::kCaching},
      {"caching text_embeddings", S::kCaching},
      {"caching clip vision", S::kCaching},
      // ai-toolkit: jobs/process/BaseSDTrainProcess.py run(): the previews before the first step.
      {"generating baseline samples", S::kBaselineSample},
      {"generating first sample", S::kBaselineSample},
      // ai-toolkit: toolkit/models/base_model.py generate_images(): the "Generating Samples" bar.
      {"generating samples", S::kSampling},
      {"generating images", S::kSampling},

      // ---- kohya sd-scripts (and musubi-tuner, which keeps its messages) ----
      // sd-scripts: library/train_util.py load_target_model() / _load_target_model().
      {"load stablediffusion checkpoint", S::kModelLoad},
      {"load diffusers pretrained", S::kModelLoad},
      {"loading model for process", S::kModelLoad},
      // sd-scripts: library/flux_utils.py, library/sd3_utils.py: building and loading the parts.
      {"building flux model", S::kModelLoad},
      {"building autoencoder", S::kModelLoad},
      {"building clip-l", S::kModelLoad},
      {"building u-net", S::kModelLoad},
      {"building dit", S::kModelLoad},
      {"loaded flux", S::kModelLoad},
      {"loaded ae", S::kModelLoad},
      {"loaded t5xxl", S::kModelLoad},
      {"loaded clip-l", S::kModelLoad},
      {"loaded fp8", S::kModelLoad},
      {"loading state dict", S::kModelLoad},
      // sd-scripts: train_network.py train(): network creation, accelerator, fp8 and block swap.
      {"import network module", S::kModelLoad},
      {"create lora network", S::kModelLoad},
      {"enable lora for", S::kModelLoad},
      {"preparing accelerator", S::kModelLoad},
      {"prepare optimizer", S::kModelLoad},
      {"enable fp8 training", S::kModelLoad},
      {"enable block swap", S::kModelLoad},
      {"for fp8: set to", S::kQuantize, true, true},  // "prepare T5XXL for fp8: set to ..."
      // sd-scripts: library/train_util.py / strategy_base.py: latent and text encoder caching,
      // with the models moved around for it (sdxl_train_util.py).
      {"caching latents", S::kCaching},
      {"cache latents", S::kCaching},
      {"caching text encoder outputs", S::kCaching},
      {"cache text encoder outputs", S::kCaching},
      {"checking cache validity", S::kCaching},
      {"checking cache existence", S::kCaching},
      {"move vae and unet to cpu", S::kCaching},
      {"move text encoders to gpu", S::kCaching},
      // sd-scripts: train_network.py train(): the loop begins.
      {"running training", S::kTrainingStep},
      {"\xe5\xad\xa6\xe7\xbf\x92\xe9\x96\x8b\xe5\xa7\x8b", S::kTrainingStep},  // 学習開始
      // sd-scripts / musubi: saving.
      {"saving checkpoint", S::kSaving},

      // ---- musubi-tuner ----
      // musubi-tuner: src/musubi_tuner/training/trainer_base.py _load_dit_and_swap() and the
      // architectures' load_transformer()/load_vae() (hv_train_network.py, wan_train_network.py, ...).
      {"loading dit", S::kModelLoad},
      {"loaded dit model", S::kModelLoad},
      {"moving weights to", S::kModelLoad},
      {"prepare block swap", S::kModelLoad},
      {"casting model weights to", S::kModelLoad},
      // musubi-tuner: src/musubi_tuner/modules/fp8_optimization_utils.py.
      {"number of optimized linear layers", S::kQuantize},
      // musubi-tuner: trainer_base.py process_sample_prompts(): the sample prompts' text encoder
      // outputs are computed before training; cache_latents.py / cache_text_encoder_outputs.py.
      {"cache text encoder outputs for sample prompt", S::kCaching},
      {"encoding with text encoder", S::kCaching},
      {"encoding dataset [", S::kCaching},

      // ---- diffusers examples ----
      // diffusers: examples/*/train_*.py log_validation(): "Running validation... Generating N images".
      {"running validation", S::kSampling},
      // diffusers: examples/*/train_*.py main(): the training block ("***** Running training *****"
      // is matched by "running training" above).
      {"number of class images to sample", S::kCaching},

      // ---- SimpleTuner ----
      // SimpleTuner: simpletuner/helpers/training/trainer.py init_* and move_models().
      {"loading our accelerator", S::kModelLoad},
      {"load vae:", S::kModelLoad},
      {"moving ema model", S::kModelLoad},
      {"unloading text encoders", S::kModelLoad},
      {"connecting optimizer to", S::kModelLoad},
      {"model moved to", S::kModelLoad},
      // SimpleTuner: helpers/training/validation.py and helpers/caching/*.py: embeddings and latents.
      {"precomput", S::kCaching, true, true},
      // SimpleTuner: trainer.py run_startup_validation().
      {"running startup validation", S::kBaselineSample},
      {"validation on startup", S::kBaselineSample},

      // ---- diffusion-pipe ----
      // diffusion-pipe: utils/dataset.py cache_latents() / cache_text_embeddings().
      {"caching text embeddings", S::kCaching},
      // diffusion-pipe: train.py _evaluate() (an eval-loss pass; before step 1 when
      // eval_before_first_step is set).
      {"running eval", S::kSampling},

      // ---- ComfyUI ----
      // ComfyUI: comfy/model_management.py load_models_gpu(): "Requested to load X", then
      // "loaded completely" / "loaded partially".
      {"requested to load", S::kModelLoad},
      {"loaded completely", S::kModelLoad},
      {"loaded partially", S::kModelLoad},

      // ---- x-flux ----
      // x-flux: train_flux_lora_deepspeed.py main(): previews every sample_every steps.
      {"sampling images for step", S::kSampling},
      {"is generated", S::kSampling},  // "Result for prompt #0 is generated"

      // ---- StableCascade ----
      // StableCascade: core/__init__.py "**TRAINING STARTING...**"; train/base.py and
      // core/templates/diffusion.py train(): "STARTING AT STEP: N/M", then an unnamed step bar.
      {"training starting", S::kTrainingStep},
      {"starting at step:", S::kTrainingStep},

      // ---- lora-train ----
      // lora-train: src/train/trainer.cpp run(): "training 1000 steps from step 1; memory settings: ...".
      {" steps from step", S::kTrainingStep, true, true},

      // ---- several trainers (generic wording) ----
      {"loading checkpoint shards", S::kModelLoad},  // transformers / diffusers from_pretrained
      {"loading pipeline components", S::kModelLoad},
      {"loading model", S::kModelLoad},
      {"loading unet", S::kModelLoad},
      {"loading u-net", S::kModelLoad},
      {"loading sdxl", S::kModelLoad},
      {"loading llm", S::kModelLoad},
      {"loading weights", S::kModelLoad},
      {"loading diffusion model", S::kModelLoad},
      {"loading base model", S::kModelLoad},
      {"load model", S::kModelLoad},
      {"loading the model", S::kModelLoad},
      {"moving model", S::kModelLoad},
      {"loaded model", S::kModelLoad},
      {"loading hunyuan", S::kModelLoad},
      {"loading ltx", S::kModelLoad},
      {"load_model", S::kModelLoad},
      {"loading tokenizer", S::kModelLoad},
      {"from_pretrained", S::kModelLoad},
      {"loading lora", S::kModelLoad},
      {"loading network", S::kModelLoad},
      {"load the model", S::kModelLoad},
      {"loading encoder", S::kModelLoad},
      {"loading safetensors", S::kModelLoad},
      {"instantiating", S::kModelLoad},
      {"fp8 optimization", S::kQuantize, true, true},
      {"optimizing model weights to fp8", S::kQuantize, true, true},
      {"converting to fp8", S::kQuantize, true, true},
      {"casting to fp8", S::kQuantize, true, true},
      {"convert to fp8", S::kQuantize, true, true},
      {"caching text", S::kCaching},
      {"caching embeddings", S::kCaching},
      {"caching:", S::kCaching},
      {"encoding latents", S::kCaching},
      {"cache_latents", S::kCaching},
      {"caching clip", S::kCaching},
      {"vae cache", S::kCaching},
      {"caching t", S::kCaching},
      {"cache text", S::kCaching},
      {"caching the", S::kCaching},
      {"encoding images", S::kCaching},
      {"encoding batch", S::kCaching},
      {"caching metadata", S::kCaching},
      {"latent cache", S::kCaching},
      {"text embed cache", S::kCaching},
      {"caching validation", S::kCaching},
      {"caching sample", S::kCaching},
      {"encode latents", S::kCaching},
      {"baseline sample", S::kBaselineSample},
      {"initial validation", S::kBaselineSample},
      {"validation before training", S::kBaselineSample},
      {"sample before training", S::kBaselineSample},
      {"generating sample", S::kSampling},
      {"sample_images", S::kSampling},
      {"log_validation", S::kSampling},
      {"validation images", S::kSampling},
      {"sampling:", S::kSampling},
      {"sampling images", S::kSampling},
      {"generating validation", S::kSampling},
      {"generating image", S::kSampling},
      {"sample image", S::kSampling},
      {"generating video", S::kSampling},
      {"generating preview", S::kSampling},
      {"preview image", S::kSampling},
      {"validation prompt", S::kSampling},
      {"running inference", S::kSampling},
      {"generate_images", S::kSampling},
      {"sampling with", S::kSampling},
      {"denoising", S::kSampling},
      {"start training", S::kTrainingStep},
      {"starting training", S::kTrainingStep},
      {"training started", S::kTrainingStep},
      {"begin training", S::kTrainingStep},
      {"beginning training", S::kTrainingStep},
      {"train loop", S::kTrainingStep},
      {"training loop", S::kTrainingStep},
      {"start of training", S::kTrainingStep},
      {"starting the training", S::kTrainingStep},
      {"training lora", S::kTrainingStep, false},  // ComfyUI's bar text: progress comes from the bar
      {"saving model", S::kSaving},
      {"saving at step", S::kSaving},
      {"saving state", S::kSaving},
      {"save trained model", S::kSaving},
      {"saving lora", S::kSaving},
      {"saving the model", S::kSaving},
      {"saving weights", S::kSaving},
      {"saving to", S::kSaving},
  };
  return table;
}

const std::vector<BarRule>& bar_rules() {
  using B = BarKind;
  static const std::vector<BarRule> table = {
      // diffusion-pipe: utils/dataset.py maps the dataset through the VAE/text encoders with
      // Hugging Face datasets ("Map (num_proc=8):", "Filter", "Adding captions").
      {"map", B::kActivity, S::kCaching, true},
      {"filter", B::kActivity, S::kCaching, true},
      {"split", B::kActivity, S::kCaching},
      // diffusers: examples/dreambooth/*: prior-preservation images made before training.
      {"generating class images", B::kActivity, S::kCaching},
      // SimpleTuner: helpers/caching/vae.py process_buckets(): "Processing bucket 1024x1024".
      {"processing bucket", B::kActivity, S::kCaching},
      // ai-toolkit "Caching latents", OneTrainer/mgds "caching", diffusers "Caching latents",
      // SimpleTuner "Precomputing validation prompt embeddings" / "Processing bucket".
      {"cach", B::kActivity, S::kCaching},
      {"precomput", B::kActivity, S::kCaching},
      {"encod", B::kActivity, S::kCaching},
      {"latent", B::kActivity, S::kCaching},
      {"embed", B::kActivity, S::kCaching},
      // ai-toolkit "Quantizing blocks", OneTrainer "Quantizing model weights".
      {"quantiz", B::kActivity, S::kQuantize},
      // Loading-like work (transformers "Loading checkpoint shards", downloads, dataset scans).
      {"load", B::kBeforeTraining, S::kModelLoad},
      {"shard", B::kBeforeTraining, S::kModelLoad},
      {"fetch", B::kBeforeTraining, S::kModelLoad},
      {"download", B::kBeforeTraining, S::kModelLoad},
      {"prepar", B::kBeforeTraining, S::kModelLoad},
      {"bucket", B::kBeforeTraining, S::kModelLoad},
      {"scan", B::kBeforeTraining, S::kModelLoad},
      {"check", B::kBeforeTraining, S::kModelLoad},
      {"resiz", B::kBeforeTraining, S::kModelLoad},
      {"extract", B::kBeforeTraining, S::kModelLoad},
      {"caption", B::kBeforeTraining, S::kModelLoad},
      {"process", B::kBeforeTraining, S::kModelLoad},
      {"convert", B::kBeforeTraining, S::kModelLoad},
      {"attach", B::kBeforeTraining, S::kModelLoad},
      // sd-scripts: train_network.py "validation steps" / "epoch validation steps"; OneTrainer:
      // modules/trainer/GenericTrainer.py "validation_step": validation loss, not previews.
      {"validation step", B::kIgnore},
      {"validation_step", B::kIgnore},
      // Previews: musubi "Sampling timesteps for prompt N" / "Denoising steps", OneTrainer
      // "sampling", ai-toolkit "Generating Images".
      {"generat", B::kActivity, S::kSampling},
      {"sampl", B::kActivity, S::kSampling},
      {"validat", B::kActivity, S::kSampling},
      {"inference", B::kActivity, S::kSampling},
      {"denois", B::kActivity, S::kSampling},
      {"preview", B::kActivity, S::kSampling},
      {"sav", B::kActivity, S::kSaving},
      // OneTrainer: modules/trainer/GenericTrainer.py train(): the outer "epoch" bar.
      {"epoch", B::kEpochs},
      // sd-scripts/musubi "steps", diffusers "Steps", OneTrainer "step", ComfyUI "Training LoRA".
      {"step", B::kTrainingProgress},
      {"train", B::kTrainingProgress},
  };
  return table;
}

const std::vector<FrameRule>& frame_rules() {
  using N = NameMatch;
  const Strength weak = Strength::kWeak;
  const Strength strong = Strength::kStrong;
  static const std::vector<FrameRule> table = {
      // ======== previews / validation ========
      // ai-toolkit: jobs/process/BaseSDTrainProcess.py sample(); toolkit/models/base_model.py and
      // toolkit/stable_diffusion_model.py generate_images(); extensions_built_in/diffusion_models/*
      // generate_single_image().
      {"sample", N::kExact, S::kSampling, strong, "basesdtrainprocess"},
      {"generate_images", N::kExact, S::kSampling},
      {"generate_single_image", N::kExact, S::kSampling},
      // sd-scripts: train_network.py / flux_train_network.py sample_images(); library/train_util.py
      // sample_images_common(), sample_image_inference(); library/flux_train_utils.py likewise.
      // musubi-tuner: training/trainer_base.py sample_images(), sample_image_inference(), _do_sample();
      // the architectures' do_inference() (hv_train_network.py, wan_train_network.py, ...).
      {"sample_image", N::kContains, S::kSampling},
      {"_do_sample", N::kExact, S::kSampling},
      {"do_inference", N::kExact, S::kSampling},
      // diffusers: examples/*/train_*.py log_validation().
      {"validation", N::kContains, S::kSampling, strong, nullptr, "init_"},  // not SimpleTuner init_validations()
      // OneTrainer: modules/trainer/GenericTrainer.py __sample_during_training(), __sample_loop();
      // modules/modelSampler/*.py __sample_base().
      {"__sample_during_training", N::kExact, S::kSampling},
      {"__sample_loop", N::kExact, S::kSampling},
      {"__sample_base", N::kExact, S::kSampling},
      // SimpleTuner: helpers/training/validation.py run_validations(), process_prompts(),
      // validate_prompt(), _pipeline_call(); trainer.py _run_intermediary_validation() (matched by
      // "validation" above).
      {"process_prompts", N::kExact, S::kSampling, strong, "validation"},
      {"validate_prompt", N::kExact, S::kSampling},
      {"_pipeline_call", N::kExact, S::kSampling},
      // SimpleTuner: trainer.py run_startup_validation(): the preview before training.
      {"startup_validation", N::kContains, S::kBaselineSample},
      // diffusion-pipe: train.py evaluate(), _evaluate(), evaluate_single(): the eval-loss pass.
      {"evaluate", N::kExact, S::kSampling, strong, "train"},
      {"_evaluate", N::kExact, S::kSampling},
      {"evaluate_single", N::kExact, S::kSampling},
      // ComfyUI-FluxTrainer: nodes.py FluxTrainValidate.validate() / FluxTrainAndValidateLoop.validate().
      {"validate", N::kExact, S::kSampling, strong, "nodes"},
      // x-flux: src/flux/xflux_pipeline.py XFluxSampler (__call__, forward).
      {"__call__", N::kExact, S::kSampling, strong, "xflux_pipeline"},
      {"forward", N::kExact, S::kSampling, strong, "xflux_pipeline"},
      // diffusers: pipelines/*/pipeline_*.py DiffusionPipeline.__call__ (previews of the example
      // scripts, AI Toolkit's and SimpleTuner's validation pipelines).
      {"__call__", N::kExact, S::kSampling, strong, "pipeline_"},
      // Generic names.
      {"generate_image", N::kExact, S::kSampling},
      {"do_sample", N::kExact, S::kSampling},
      {"generate_sample_images", N::kExact, S::kSampling},
      {"sample_video", N::kExact, S::kSampling},
      {"run_sampling", N::kExact, S::kSampling},
      {"sample_prompt", N::kContains, S::kSampling},

      // ======== training step ========
      // ai-toolkit: extensions_built_in/sd_trainer/SDTrainer.py hook_train_loop(),
      // train_single_accumulation(), calculate_loss(), predict_noise(), get_guided_loss(),
      // get_prior_prediction(); BaseSDTrainProcess.py process_general_training_batch().
      {"hook_train_loop", N::kExact, S::kTrainingStep},
      {"train_single_accumulation", N::kExact, S::kTrainingStep},
      {"calculate_loss", N::kExact, S::kTrainingStep},
      {"predict_noise", N::kExact, S::kTrainingStep},
      {"get_guided_loss", N::kExact, S::kTrainingStep},
      {"get_prior_prediction", N::kExact, S::kTrainingStep},
      {"process_general_training_batch", N::kExact, S::kTrainingStep},
      // sd-scripts: train_network.py process_batch(), get_noise_pred_and_target(), call_unet();
      // musubi-tuner: the architectures' call_dit().
      {"process_batch", N::kExact, S::kTrainingStep},
      {"get_noise_pred_and_target", N::kExact, S::kTrainingStep},
      {"call_unet", N::kExact, S::kTrainingStep},
      {"call_dit", N::kExact, S::kTrainingStep},
      // OneTrainer: modules/modelSetup/*.py predict(), calculate_loss() (called from GenericTrainer.train).
      {"predict", N::kExact, S::kTrainingStep, strong, "setup"},
      // SimpleTuner: helpers/training/trainer.py model_predict(), _compute_model_prediction_loss().
      {"model_predict", N::kContains, S::kTrainingStep},
      {"_compute_model_prediction_loss", N::kExact, S::kTrainingStep},
      // diffusion-pipe (DeepSpeed): deepspeed/runtime/pipe/engine.py train_batch(), _exec_schedule(),
      // _exec_forward_pass(), _exec_backward_pass().
      {"train_batch", N::kExact, S::kTrainingStep},
      {"_exec_schedule", N::kExact, S::kTrainingStep, strong, "engine"},
      {"_exec_forward_pass", N::kContains, S::kTrainingStep},
      {"_exec_backward_pass", N::kContains, S::kTrainingStep},
      // ComfyUI: comfy_extras/nodes_train.py TrainSampler.sample() is the training loop and
      // fwd_bwd() one step.
      {"fwd_bwd", N::kExact, S::kTrainingStep},
      {"sample", N::kExact, S::kTrainingStep, strong, "nodes_train"},
      // ComfyUI-FluxTrainer: train_network.py init_train()'s training_loop().
      {"training_loop", N::kExact, S::kTrainingStep},
      // torch: the backward pass (torch/_tensor.py backward, torch/autograd/__init__.py backward),
      // accelerate's Accelerator.backward().
      {"backward", N::kContains, S::kTrainingStep},
      // torch: torch/optim/adamw.py and adam.py (_single_tensor_adamw, _multi_tensor_adamw,
      // _fused_adamw: the optimizer state is allocated on the first step); accelerate:
      // optimizer.py AcceleratedOptimizer.step(); bitsandbytes: optim/optimizer.py step().
      {"_single_tensor_adam", N::kContains, S::kTrainingStep},
      {"_multi_tensor_adam", N::kContains, S::kTrainingStep},
      {"_fused_adam", N::kContains, S::kTrainingStep},
      {"step", N::kExact, S::kTrainingStep, strong, "optimizer"},
      // StableCascade: train/base.py and core/templates/diffusion.py forward_pass().
      {"forward_pass", N::kExact, S::kTrainingStep},
      // Generic names.
      {"training_step", N::kExact, S::kTrainingStep},
      {"train_step", N::kContains, S::kTrainingStep},
      {"train_one_step", N::kExact, S::kTrainingStep},
      {"_train_epoch", N::kExact, S::kTrainingStep},
      {"compute_loss", N::kExact, S::kTrainingStep},
      {"loss_fn", N::kExact, S::kTrainingStep},
      {"get_loss", N::kExact, S::kTrainingStep},

      // ======== caching latents / text embeddings ========
      // ai-toolkit: toolkit/dataloader_mixins.py cache_latents_all_latents(), cache_text_embeddings(),
      // cache_clip_vision_to_disk(); SDTrainer.py cache_sample_prompts().
      // sd-scripts: library/train_util.py cache_latents(), cache_text_encoder_outputs(),
      // strategy_*.py cache_batch_latents(); train_network.py cache_text_encoder_outputs_if_needed().
      // diffusion-pipe: utils/dataset.py cache(), cache_latents(), cache_text_embeddings().
      {"cache", N::kContains, S::kCaching, strong, nullptr, "empty_cache"},
      // sd-scripts: strategy_base.py encode_images_to_latents() via the caching strategy.
      {"encode_images_to_latents", N::kExact, S::kCaching},
      // musubi-tuner: cache_latents.py / cache_text_encoder_outputs.py encode_and_save_batch();
      // training/trainer_base.py process_sample_prompts() (sample prompts encoded before training).
      {"encode_and_save_batch", N::kContains, S::kCaching},
      {"process_sample_prompts", N::kExact, S::kCaching},
      // OneTrainer (mgds): src/mgds/MGDS.py start_next_epoch() fills the caches (DiskCache.py).
      {"start_next_epoch", N::kExact, S::kCaching},
      // SimpleTuner: helpers/caching/text_embeds.py compute_embeddings_for_prompts(),
      // compute_prompt_embeddings_with_model(); helpers/caching/vae.py process_buckets(),
      // _encode_images_in_batch(); trainer.py init_data_backend().
      {"compute_embeddings_for_prompts", N::kExact, S::kCaching},
      {"compute_prompt_embeddings_with_model", N::kExact, S::kCaching},
      {"process_buckets", N::kExact, S::kCaching},
      {"_encode_images_in_batch", N::kExact, S::kCaching},
      {"init_data_backend", N::kExact, S::kCaching},
      {"configure_multi_databackend", N::kExact, S::kCaching},
      // diffusers: examples/dreambooth/*.py compute_text_embeddings() runs before training (instance
      // prompt) and also inside the loop for custom prompts: only weak evidence.
      {"compute_text_embeddings", N::kExact, S::kCaching, weak},
      // Generic names.
      {"encode_images", N::kExact, S::kCaching},
      {"encode_latents", N::kExact, S::kCaching},
      {"precompute", N::kContains, S::kCaching},

      // ======== quantising the base ========
      // ai-toolkit: toolkit/util/quantize.py quantize(), quantize_model(); optimum-quanto freeze(),
      // requantize(). OneTrainer: modules/util/quantization_util.py quantize_*.
      {"quantiz", N::kContains, S::kQuantize},
      // SimpleTuner: helpers/training/quantisation/__init__.py quantise_model().
      {"quantis", N::kContains, S::kQuantize},
      {"requantize", N::kExact, S::kQuantize},
      {"freeze", N::kExact, S::kQuantize},
      // sd-scripts / musubi-tuner: fp8_optimization_utils.py optimize_state_dict_with_fp8(),
      // load_safetensors_with_fp8_optimization(); sd-scripts prepare_text_encoder_fp8().
      {"with_fp8", N::kContains, S::kQuantize},
      {"fp8_optimization", N::kContains, S::kQuantize},
      {"prepare_text_encoder_fp8", N::kExact, S::kQuantize},

      // ======== loading and moving the model ========
      // ai-toolkit: load_model() of toolkit/models/base_model.py, toolkit/stable_diffusion_model.py,
      // extensions_built_in/diffusion_models/*; SDTrainer.py hook_before_train_loop() moves the
      // models for training.
      {"hook_before_train_loop", N::kExact, S::kModelLoad},
      // sd-scripts: library/train_util.py load_target_model(); library/flux_utils.py
      // load_flow_model(), load_ae(), load_clip_l(), load_t5xxl(); flux_train_network.py
      // prepare_unet_with_accelerator(); library/custom_offloading_utils.py
      // move_to_device_except_swap_blocks().
      {"prepare_unet_with_accelerator", N::kExact, S::kModelLoad},
      {"move_to_device_except_swap_blocks", N::kExact, S::kModelLoad},
      // musubi-tuner: training/trainer_base.py _load_dit_and_swap(), _build_network(),
      // _prepare_with_accelerator(), _prepare_sampling(); the architectures' load_transformer().
      {"_load_dit_and_swap", N::kExact, S::kModelLoad},
      {"_build_network", N::kExact, S::kModelLoad},
      {"_prepare_with_accelerator", N::kExact, S::kModelLoad},
      {"_prepare_sampling", N::kExact, S::kModelLoad},
      // accelerate: accelerator.py Accelerator.prepare() / prepare_model() moves the model to the GPU.
      {"prepare", N::kExact, S::kModelLoad, strong, "accelerator"},
      {"prepare_model", N::kExact, S::kModelLoad},
      // torch: torch/nn/modules/module.py Module.to() / cuda() -> _apply() -> convert().
      {"to", N::kExact, S::kModelLoad, strong, "module"},
      {"cuda", N::kExact, S::kModelLoad, strong, "module"},
      {"_apply", N::kExact, S::kModelLoad, strong, "module"},
      {"convert", N::kExact, S::kModelLoad, strong, "module"},
      // diffusers: models/modeling_utils.py from_pretrained(), _load_pretrained_model(),
      // models/model_loading_utils.py load_model_dict_into_meta(); loaders/single_file_model.py
      // from_single_file().
      {"from_pretrained", N::kContains, S::kModelLoad},
      {"from_single_file", N::kExact, S::kModelLoad},
      {"load_model_dict_into_meta", N::kExact, S::kModelLoad},
      // OneTrainer: modules/modelLoader/*.py load(), __load_internal(), __load_diffusers();
      // modules/modelSetup/*.py setup_model(), setup_train_device().
      {"setup_model", N::kExact, S::kModelLoad},
      {"setup_train_device", N::kExact, S::kModelLoad},
      // SimpleTuner: helpers/training/trainer.py init_load_base_model(), init_vae(),
      // init_text_encoder(), init_precision(), init_prepare_models(), move_models(),
      // _move_model_with_block_swap().
      {"init_", N::kPrefix, S::kModelLoad, strong, "trainer"},
      {"move_models", N::kExact, S::kModelLoad},
      {"_move_model_with_block_swap", N::kExact, S::kModelLoad},
      // diffusion-pipe: models/*.py load_diffusion_model(); deepspeed/__init__.py initialize().
      {"initialize", N::kExact, S::kModelLoad, strong, "__init__"},
      // ComfyUI: comfy/model_management.py load_models_gpu(), comfy/model_patcher.py
      // partially_load(), patch_model(); comfy/sd.py load_diffusion_model().
      {"load_models_gpu", N::kExact, S::kModelLoad},
      {"partially_load", N::kExact, S::kModelLoad},
      {"patch_model", N::kExact, S::kModelLoad},
      // ComfyUI-FluxTrainer: nodes.py InitFluxLoRATraining.init_training() -> train_network.py init_train().
      {"init_train", N::kPrefix, S::kModelLoad},
      // x-flux: train_flux_lora_deepspeed.py get_models() -> src/flux/util.py load_flow_model2().
      {"get_models", N::kExact, S::kModelLoad},
      // Generic names: load_model, load_target_model, load_vae, load_transformer, load_state_dict, ...
      {"load", N::kPrefix, S::kModelLoad},
      {"_load", N::kPrefix, S::kModelLoad},
      {"__load", N::kPrefix, S::kModelLoad},
      {"move_to_device", N::kExact, S::kModelLoad},
      {"set_device_state", N::kExact, S::kModelLoad},

      // ======== weak: names that usually, not always, mean this ========
      {"sample", N::kExact, S::kSampling, weak},
      {"generate", N::kExact, S::kSampling, weak},
      {"denoise", N::kExact, S::kSampling, weak},
      {"sample_euler", N::kExact, S::kSampling, weak},
      {"to", N::kExact, S::kModelLoad, weak},
      {"cuda", N::kExact, S::kModelLoad, weak},
      {"_apply", N::kExact, S::kModelLoad, weak},
      {"prepare", N::kExact, S::kModelLoad, weak},
      {"convert", N::kExact, S::kModelLoad, weak},
  };
  return table;
}

const std::vector<CodeRule>& code_rules() {
  const Strength strong = Strength::kStrong;
  const Strength weak = Strength::kWeak;
  static const std::vector<CodeRule> table = {
      // The previews before step 1, by the call that makes them: sd-scripts train_network.py
      // train() "self.sample_images(accelerator, args, 0, global_step, ..." (--sample_at_first);
      // musubi-tuner training/trainer_base.py "_do_sample(0, global_step)"; ai-toolkit
      // BaseSDTrainProcess.run() "self.sample(0, is_first=True)"; diffusion-pipe train.py
      // "evaluate(model, model_engine, eval_dataloaders, tb_writer, 0, ..." (eval_before_first_step).
      {"sample_images(accelerator, args, 0,", S::kBaselineSample, strong},
      {"_do_sample(0,", S::kBaselineSample, strong},
      {"self.sample(0, is_first=true", S::kBaselineSample, strong},
      {"eval_dataloaders, tb_writer, 0,", S::kBaselineSample, strong},
      // diffusers: examples/*/train_*.py main() calls log_validation() and moves and prepares the
      // models inline; a paste that keeps only main()'s frame still shows the call.
      {"log_validation(", S::kSampling, strong},
      {"sample_images(", S::kSampling, strong},  // sd-scripts / musubi train()
      {"self.sample(", S::kSampling, strong},    // ai-toolkit BaseSDTrainProcess.run()
      {"accelerator.backward(", S::kTrainingStep, strong},
      {".backward(", S::kTrainingStep, strong},
      {"accelerator.prepare(", S::kModelLoad, strong},
      {"deepspeed.initialize(", S::kModelLoad, strong},  // diffusion-pipe train.py
      {".to(accelerator.device", S::kModelLoad, weak},
      {".to(device", S::kModelLoad, weak},
      {".to(self.device", S::kModelLoad, weak},
      {".to(\"cuda", S::kModelLoad, weak},
      {".to('cuda", S::kModelLoad, weak},
      {".cuda()", S::kModelLoad, weak},
  };
  return table;
}

namespace {

bool name_matches(const FrameRule& r, const std::string& func) {
  switch (r.match) {
    case NameMatch::kExact: return func == r.name;
    case NameMatch::kPrefix: return starts_with(func, r.name);
    case NameMatch::kContains: return contains(func, r.name);
  }
  return false;
}

bool frame_matches(const FrameRule& r, const Frame& f) {
  if (!name_matches(r, f.func)) return false;
  if (r.except && contains(f.func, r.except)) return false;
  return !r.file || contains(f.file, r.file);
}

// The functions a source line calls ("images = log_validation(" -> log_validation): when a paste
// drops inner frames, the call in the last frame kept still names the next one.
std::vector<Frame> callees_of(const std::vector<Frame>& frames) {
  std::vector<Frame> out;
  for (const Frame& f : frames) {
    const std::string& c = f.code;
    for (size_t open = c.find('('); open != std::string::npos; open = c.find('(', open + 1)) {
      size_t b = open;
      while (b > 0 && is_word(c[b - 1])) --b;
      if (b == open || is_digit(c[b])) continue;
      Frame callee;
      callee.func = c.substr(b, open - b);
      if (out.size() < 64) out.push_back(std::move(callee));
    }
  }
  return out;
}

// Stages in the order a traceback decides them: a preview or a training step anywhere in the stack
// is what was running, even when loading or caching functions are called from inside it.
constexpr Stage kPriority[] = {S::kBaselineSample, S::kSampling, S::kTrainingStep, S::kCaching, S::kQuantize,
                               S::kModelLoad};

}  // namespace

FrameVerdict stage_from_frames(const std::vector<Frame>& frames) {
  FrameVerdict v;
  const std::vector<Frame> callees = callees_of(frames);
  for (Strength strength : {Strength::kStrong, Strength::kWeak}) {
    for (Stage stage : kPriority) {
      for (const FrameRule& r : frame_rules()) {
        if (r.stage != stage || r.strength != strength) continue;
        for (const Frame& f : frames) {
          if (!frame_matches(r, f)) continue;
          v = {stage, strength, "in " + f.func + " (" + f.file + ")"};
          return v;
        }
      }
      for (const CodeRule& r : code_rules()) {
        if (r.stage != stage || r.strength != strength) continue;
        for (const Frame& f : frames) {
          if (!contains(f.code, r.text)) continue;
          v = {stage, strength, std::string("calls ") + r.text + " (" + f.file + ")"};
          return v;
        }
      }
      for (const FrameRule& r : frame_rules()) {
        if (r.stage != stage || r.strength != strength || r.file) continue;  // a callee's file is unknown
        for (size_t i = 0; i < callees.size(); ++i) {
          if (!frame_matches(r, callees[i])) continue;
          v = {stage, strength, "calls " + callees[i].func + "()"};
          return v;
        }
      }
    }
  }
  return v;
}

}  // namespace lt::diagnose::detail
