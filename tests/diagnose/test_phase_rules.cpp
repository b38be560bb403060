// Phase rules and environment verdicts on short logs written in the trainers' own formats (the
// functions and messages phase_rules.cpp names, with the files they come from).
#include <catch2/catch.hpp>

#include <string>

#include "loratrain/diagnose/analyzer.h"
#include "diagnose/oom_message.h"

using namespace lt::diagnose;

using lt::test::kOom;

namespace {

std::string traceback(std::initializer_list<std::pair<const char*, const char*>> frames) {
  std::string t = "Traceback (most recent call last):\n";
  for (const auto& [where, code] : frames) t += std::string("  File \"") + where + "\n    " + code + "\n";
  return t;
}

}  // namespace

CATCH_TEST_CASE("traceback functions of each trainer decide the phase", "[diagnose][phase]") {
  // diffusers examples: main() moving models, cut short at the accelerate call.
  Diagnosis load = diagnose_text(traceback({{"/ex/train_dreambooth_lora_flux.py\", line 1597, in main",
                                             "transformer, optimizer = accelerator.prepare("}}) +
                                 kOom);
  CATCH_CHECK(load.phase == Phase::kLoad);
  CATCH_CHECK(load.phase_confidence >= 0.9);

  // SimpleTuner: the validation on startup is the baseline.
  Diagnosis st = diagnose_text(traceback({{"/st/simpletuner/helpers/training/trainer.py\", line 6807, in _run_startup_validation",
                                           "return self.run_startup_validation()"},
                                          {"/st/simpletuner/helpers/training/validation.py\", line 4525, in validate_prompt",
                                           "images = self._pipeline_call(pipeline, kwargs)"}}) +
                               kOom);
  CATCH_CHECK(st.phase == Phase::kBaselineSample);

  // musubi-tuner: --sample_at_first goes through _do_sample(0, ...).
  Diagnosis mt = diagnose_text(traceback({{"/mt/src/musubi_tuner/training/trainer_base.py\", line 2001, in _run_training_loop",
                                           "_do_sample(0, global_step)"},
                                          {"/mt/src/musubi_tuner/training/trainer_base.py\", line 1992, in _do_sample",
                                           "self.sample_images(accelerator, args, epoch_arg, steps_arg, vae, transformer)"}}) +
                               kOom);
  CATCH_CHECK(mt.phase == Phase::kBaselineSample);

  // OneTrainer: previews during training.
  Diagnosis ot = diagnose_text("step:  40%|####      | 400/1000 [10:00<15:00, 1.5s/it, loss=0.1, smooth loss=0.1]\n" +
                               traceback({{"/ot/modules/trainer/GenericTrainer.py\", line 711, in train",
                                           "self.__sample_during_training(train_progress, train_device, sample_commands)"},
                                          {"/ot/modules/modelSampler/FluxSampler.py\", line 120, in __sample_base",
                                           "noise_pred = transformer("}}) +
                               kOom);
  CATCH_CHECK(ot.phase == Phase::kSampling);

  // The optimizer state appears on the first step (torch/optim/adamw.py).
  Diagnosis opt = diagnose_text(traceback({{"/sd-scripts/train_network.py\", line 1100, in train", "optimizer.step()"},
                                           {"/py/accelerate/optimizer.py\", line 170, in step", "self.optimizer.step(closure)"},
                                           {"/py/torch/optim/adamw.py\", line 480, in _multi_tensor_adamw",
                                            "exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)"}}) +
                                kOom);
  CATCH_CHECK(opt.stage == Stage::kTrainingStep);
  CATCH_CHECK(opt.step == 1);

  // AI Toolkit: a preview at step 250 (generate_single_image of a diffusion model extension).
  Diagnosis ait = diagnose_text("my_lora:  12%|#2        | 250/2000 [10:00<1:00:00, 2.1s/it, lr: 1.0e-04 loss: 3.495e-01]\n" +
                                traceback({{"/ai-toolkit/jobs/process/BaseSDTrainProcess.py\", line 2340, in run",
                                            "self.sample(self.step_num)"},
                                           {"/ai-toolkit/extensions_built_in/diffusion_models/qwen_image/qwen_image.py\", line 300, in generate_single_image",
                                            "img = pipeline(prompt_embeds=conditional_embeds.text_embeds,"}}) +
                                kOom);
  CATCH_CHECK(ait.phase == Phase::kSampling);

  // sd-scripts under fluxgym: "[INFO]" prefixes and no indentation; caching before training.
  Diagnosis fg = diagnose_text(
      "[2024-09-09 17:43:57] [INFO] Traceback (most recent call last):\n"
      "[2024-09-09 17:43:57] [INFO] File \"E:\\fluxgym\\sd-scripts\\train_network.py\", line 402, in train\n"
      "[2024-09-09 17:43:57] [INFO] self.cache_text_encoder_outputs_if_needed(args, accelerator, unet, vae, te, ds, dt)\n"
      "[2024-09-09 17:43:57] [INFO] File \"E:\\fluxgym\\env\\torch\\nn\\modules\\module.py\", line 1340, in to\n"
      "[2024-09-09 17:43:57] [INFO] return self._apply(convert)\n"
      "[2024-09-09 17:43:57] [INFO] " + std::string(kOom));
  CATCH_CHECK(fg.phase == Phase::kLoad);
  CATCH_CHECK(fg.stage == Stage::kCaching);
}

CATCH_TEST_CASE("rich tracebacks, plain tqdm and a bar printed after the error", "[diagnose][phase]") {
  const std::string side = "\xe2\x94\x82";
  Diagnosis rich = diagnose_text(
      "steps:  40%|####      | 400/1000 [10:00<15:00, 1.5s/it, avr_loss=0.1]\n"
      "\xe2\x95\xad\xe2\x94\x80 Traceback (most recent call last) \xe2\x94\x80\xe2\x95\xae\n" +
      side + " /sd-scripts/train_network.py:1012 in train          " + side + "\n" +
      side + "   1011 " + side + "   for step, batch in enumerate(loader):    " + side + "\n" +
      side + " \xe2\x9d\xb1 1012 " + side + "       self.sample_images(accelerator, args, None, step)  " + side + "\n" +
      side + " /sd-scripts/library/train_util.py:4233 in sample_image_inference " + side + "\n" +
      "\xe2\x95\xb0\xe2\x94\x80\xe2\x95\xaf\n"
      "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n");
  CATCH_CHECK(rich.stage == Stage::kSampling);
  CATCH_CHECK(rich.phase_confidence >= 0.9);

  // A notebook's tqdm has no bar characters, and the last state comes after the message.
  Diagnosis plain = diagnose_text(
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 14.00 MiB.\n"
      "steps:   0% 0/2300 [00:01<?, ?it/s]\n");
  CATCH_CHECK(plain.stage == Stage::kTrainingStep);
  CATCH_CHECK(plain.step == 1);
}

CATCH_TEST_CASE("activity messages of each trainer decide the phase", "[diagnose][phase]") {
  // diffusion-pipe: utils/dataset.py caching latents.
  Diagnosis dp = diagnose_text("caching latents: (512, 512, 1)\nMap (num_proc=8):  40%|####  | 40/100 [00:10<00:15]\n" +
                               std::string(kOom));
  CATCH_CHECK(dp.phase == Phase::kLoad);
  // ComfyUI: comfy/model_management.py load_models_gpu().
  Diagnosis cf = diagnose_text("got prompt\nRequested to load Flux\n" + std::string(kOom));
  CATCH_CHECK(cf.phase == Phase::kLoad);
  // StableCascade: "STARTING AT STEP: 1/40000" and an unnamed step bar.
  Diagnosis sc = diagnose_text("**TRAINING STARTING...**\nSTARTING AT STEP: 1/40000\n"
                               "  0%|          | 0/40000 [00:00<?, ?it/s]\n" + std::string(kOom));
  CATCH_CHECK(sc.stage == Stage::kTrainingStep);
  CATCH_CHECK(sc.step == 1);
  // x-flux: previews every sample_every steps.
  Diagnosis xf = diagnose_text("Steps:  25%|##5       | 250/1000 [10:00<30:00, 2.4s/it, step_loss=0.2, lr=1e-05]\n"
                               "Sampling images for step 250...\n" + std::string(kOom));
  CATCH_CHECK(xf.phase == Phase::kSampling);
}

CATCH_TEST_CASE("host RAM and kernel-logged GPU faults are not GPU OOMs", "[diagnose][signatures]") {
  // c10's CPU allocator says "tried to allocate" too.
  Diagnosis cpu = diagnose_text("RuntimeError: DefaultCPUAllocator: not enough memory: you tried to allocate 58982400 bytes.\n");
  CATCH_CHECK(cpu.cause == Cause::kHostOom);
  CATCH_CHECK_FALSE(cpu.oom);
  // NVRM lines are no Python errors, and still the cause.
  Diagnosis bus = diagnose_text("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
                                "               NVRM: fallen off the bus and is not responding to commands.\n");
  CATCH_CHECK(bus.cause == Cause::kGpuFault);
}

CATCH_TEST_CASE("a Windows crash status is an error of its own", "[diagnose][signatures]") {
  Diagnosis d = diagnose_text(
      "subprocess.CalledProcessError: Command '['python.exe', 'train_network.py']' returned non-zero exit status "
      "3221225477.\n");
  CATCH_CHECK(d.cause == Cause::kOther);
  CATCH_CHECK_FALSE(d.oom);
}

CATCH_TEST_CASE("ComfyUI reports an OOM as 'Allocation on device'", "[diagnose][signatures]") {
  Diagnosis d = diagnose_text("got prompt\n!!! Exception during processing !!! Allocation on device \n");
  CATCH_CHECK(d.oom);
  Diagnosis tip = diagnose_text("Got an OOM, unloading all loaded models.\n");
  CATCH_CHECK(tip.oom);
  // The words in a harmless sentence are not an OOM.
  CATCH_CHECK_FALSE(diagnose_text("INFO allocation on device cuda:0 done, continuing with the rest\n").oom);
}

CATCH_TEST_CASE("environment failures are not read as training failures", "[diagnose][environment]") {
  // Pinned host memory (torch/utils/data/_utils/pin_memory.py) under WSL.
  Diagnosis pin = diagnose_text(
      "Linux 5.15.153.1-microsoft-standard-WSL2\n"
      "steps:   0%|          | 0/1000 [00:00<?, ?it/s]\n"
      "RuntimeError: Caught RuntimeError in pin memory thread for device 0.\n"
      "RuntimeError: CUDA error: out of memory\n");
  CATCH_CHECK(pin.oom);
  CATCH_CHECK(pin.phase == Phase::kEnvironment);
  CATCH_CHECK(pin.environment == "pinned_memory");
  CATCH_REQUIRE_FALSE(pin.fixes.empty());
  CATCH_CHECK(pin.fixes[0].id == "disable_pin_memory");

  // A small request failing with gigabytes reported free.
  Diagnosis free = diagnose_text(
      "steps:   1%|          | 3/1000 [00:10<?, 1.0s/it, avr_loss=0.1]\n"
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.65 GiB "
      "of which 6.10 GiB is free. Including non-PyTorch memory, this process has 17.40 GiB memory in use. Of the "
      "allocated memory 16.90 GiB is allocated by PyTorch, and 200.00 MiB is reserved by PyTorch but unallocated.\n");
  CATCH_CHECK(free.phase == Phase::kEnvironment);
  CATCH_CHECK(free.environment == "free_but_failed");
  CATCH_CHECK(free.fixes[0].id == "free_gpu");

  // One rank of two.
  Diagnosis rank = diagnose_text(
      "[rank0]: steps:   1%|          | 5/1000 [00:10<?, 1.0s/it, avr_loss=0.1]\n"
      "[rank1]: steps:   1%|          | 5/1000 [00:10<?, 1.0s/it, avr_loss=0.1]\n"
      "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
      "23.65 GiB of which 100.00 MiB is free.\n");
  CATCH_CHECK(rank.phase == Phase::kEnvironment);
  CATCH_CHECK(rank.environment == "one_rank");

  // The CUDA context itself could not be created.
  Diagnosis ctx = diagnose_text(traceback({{"/ex/train.py\", line 30, in main", "x = torch.zeros(1).cuda()"},
                                           {"/py/torch/cuda/__init__.py\", line 319, in _lazy_init", "torch._C._cuda_init()"}}) +
                                "RuntimeError: CUDA error: out of memory\n");
  CATCH_CHECK(ctx.phase == Phase::kEnvironment);
  CATCH_CHECK(ctx.environment == "cuda_context");

  // Only rank 1's lines, but rank 1 proves two ranks; DeepSpeed's launcher then stops both
  // processes, which is not the kernel's OOM killer.
  Diagnosis r1 = diagnose_text(
      "[rank1]: steps: 12 loss: 0.0800 iter time (s): 9.100 samples/sec: 0.110\n"
      "[rank1]: RuntimeError: CUDA error: out of memory\n"
      "[2025-03-25 21:14:09,870] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 4412\n"
      "[2025-03-25 21:14:10,310] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 4413\n");
  CATCH_CHECK(r1.cause == Cause::kGpuOom);
  CATCH_CHECK(r1.environment == "one_rank");
  CATCH_CHECK(diagnose_text("[INFO] [launch.py:319:sigkill_handler] Killing subprocess 4412\n").cause == Cause::kNone);

  // Every rank out of memory: the config.
  Diagnosis all = diagnose_text(
      "[rank0]: steps:   1%|          | 5/1000 [00:10<?, 1.0s/it, avr_loss=0.1]\n"
      "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
      "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n");
  CATCH_CHECK(all.phase == Phase::kEarlySteps);

  // A little held by others while this run's tensors fill the card: the config, not the machine.
  Diagnosis ours = diagnose_text(
      "loading model\n"
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 108.00 MiB. GPU 0 has a total capacity of 23.51 "
      "GiB of which 96.94 MiB is free. Including non-PyTorch memory, this process has 21.02 GiB memory in use. Of the "
      "allocated memory 20.61 GiB is allocated by PyTorch, and 12.55 MiB is reserved by PyTorch but unallocated.\n");
  CATCH_CHECK(ours.phase == Phase::kLoad);
}

CATCH_TEST_CASE("a lora-train run the guard rescued is reported as recovered", "[diagnose][guard]") {
  Diagnosis d = diagnose_text(
      "W 10:15:20 oom-guard: OOM in phase train_step(step 3, bucket 1024x1024, batch 4) \xe2\x80\x94 early_steps; action: "
      "train.batch_size: 4 -> 1, train.gradient_accumulation: 1 -> 4 (effective batch 4 kept)\n"
      "I 10:54:02 the settings that worked: runs/a/effective.yaml\n"
      "I 10:54:02 oom-guard: 1 OOM handled, 1 configuration change\n"
      "I 10:54:02 oom-guard:   #1 train_step(step 3, bucket 1024x1024, batch 4) early_steps -> train.batch_size: 4 -> 1\n"
      "I 10:54:02 oom-guard:      price of #1 (batch_to_one): +35% s/step (2.100 -> 2.835 s), -41% peak (21.9 GiB -> 12.9 GiB)\n"
      "I 10:54:02 oom-guard: settings now: checkpointing on, batch 1 x accumulation 4, buckets [512,768], samples "
      "512x512/20 steps (no baseline), attention in chunks of 1024, VAE tiled, low_vram\n"
      "I 10:54:03 done: runs/a/a.safetensors (1000 steps)\n");
  CATCH_CHECK(d.oom);
  CATCH_CHECK(d.recovered);
  CATCH_CHECK(d.fixes.empty());
  CATCH_REQUIRE(d.recovery.changes.size() == 1);
  CATCH_CHECK(d.recovery.changes[0].find("train.batch_size: 4 -> 1") != std::string::npos);
  CATCH_CHECK(d.recovery.effective_config == "runs/a/effective.yaml");
  CATCH_CHECK(d.recovery.steps == 1000);
  CATCH_CHECK(d.settings.batch_size == 1);
  CATCH_CHECK(d.settings.gradient_accumulation == 4);
  CATCH_CHECK(d.settings.max_resolution == 768);
  CATCH_CHECK(d.settings.skip_first_sample == true);
  CATCH_CHECK(d.settings.low_vram == true);

  // The same events without the end of the run: still a failure with fixes.
  Diagnosis cut = diagnose_text(
      "W 10:15:20 oom-guard: OOM in phase train_step(step 3, bucket 1024x1024, batch 4) \xe2\x80\x94 early_steps; action: "
      "train.gradient_checkpointing: false -> true\n");
  CATCH_CHECK_FALSE(cut.recovered);
  CATCH_CHECK_FALSE(cut.fixes.empty());
}
