#!/usr/bin/env python3
"""Regenerates the diagnose test corpus: <name>.log + <name>.expected.json per case.

Each log is assembled from the trainers' real message and progress formats (AI Toolkit's
BaseSDTrainProcess prints, kohya/musubi train_network strings and tqdm "steps" bar, DeepSpeed's
"steps: N loss:" line, diffusers' "***** Running training *****" block, ComfyUI's "!!! Exception
during processing !!!"), PyTorch's allocator messages in both formats, tracebacks, tqdm redraws
joined by carriage returns, ANSI colours, CRLF and Windows paths. The expected JSON holds only the
fields the test compares (ground truth written by hand per case, not produced by the tool).

Run from anywhere: python3 tests/data/logs/generate_corpus.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
GiB = 1024 ** 3
MiB = 1024 ** 2


def bar(desc, start, end, total, post=None, sec=1.5):
    """A tqdm bar redrawn from start to end on one physical line (carriage returns)."""
    parts = []
    for n in range(start, end + 1):
        pct = int(n * 100 / total) if total else 0
        filled = int(pct / 10)
        b = "\u2588" * filled + " " * (10 - filled)
        rate = "?it/s" if n == 0 else f"{sec:.2f}s/it"
        p = f", {post(n)}" if (post and n > 0) else ""
        head = f"{desc}: " if desc else ""
        parts.append(f"{head}{pct:3d}%|{b}| {n}/{total} [00:{n % 60:02d}<00:10, {rate}{p}]")
    return "\r".join(parts)


def new_oom(tried, total, free, proc, alloc, ru, cls="torch.OutOfMemoryError", others=()):
    o = "".join(f" Process {pid} has {gb:.2f} GiB memory in use." for pid, gb in others)
    this = f" Including non-PyTorch memory, this process has {proc:.2f} GiB memory in use." if proc else ""
    free_s = "0 bytes" if free == 0 else (f"{free * 1024:.2f} MiB" if free < 1 else f"{free:.2f} GiB")
    return (f"{cls}: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of {total:.2f} GiB "
            f"of which {free_s} is free.{o}{this} Of the allocated memory {alloc:.2f} GiB is allocated by PyTorch, "
            f"and {ru} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
            f"setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
            f"for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def old_oom(tried, total, alloc, free, reserved, cls="torch.cuda.OutOfMemoryError"):
    return (f"{cls}: CUDA out of memory. Tried to allocate {tried} (GPU 0; {total} total capacity; {alloc} already "
            f"allocated; {free} free; {reserved} reserved in total by PyTorch) If reserved memory is >> allocated "
            f"memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management "
            f"and PYTORCH_CUDA_ALLOC_CONF")


def tb(frames, root="/workspace"):
    out = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        p = path if (path.startswith("/") or ":" in path) else f"{root}/{path}"
        out.append(f'  File "{p}", line {line}, in {func}')
        if code:
            out.append(f"    {code}")
    return out


TORCH_FWD = [
    ("/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", 1736, "_wrapped_call_impl",
     "return self._call_impl(*args, **kwargs)"),
    ("/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", 1747, "_call_impl",
     "return forward_call(*args, **kwargs)"),
]
TORCH_BWD = [
    ("/usr/local/lib/python3.10/dist-packages/torch/_tensor.py", 581, "backward", "torch.autograd.backward("),
    ("/usr/local/lib/python3.10/dist-packages/torch/autograd/__init__.py", 347, "backward", "_engine_run_backward("),
    ("/usr/local/lib/python3.10/dist-packages/torch/autograd/graph.py", 825, "_engine_run_backward",
     "return Variable._execution_engine.run_backward("),
]

CASES = []


def case(name, lines, expect, crlf=False):
    CASES.append((name, lines, expect, crlf))


# ------------------------------------------------------------------------------------------------
# AI Toolkit
AIT_HEAD = [
    "Running 1 job",
    "{",
    '    "type": "sd_trainer",',
    '    "training_folder": "output",',
    '    "device": "cuda:0",',
    '    "network": {',
    '        "type": "lora",',
    '        "linear": 16,',
    '        "linear_alpha": 16',
    "    },",
    '    "train": {',
    '        "batch_size": {batch},',
    '        "steps": 2000,',
    '        "gradient_accumulation_steps": 1,',
    '        "train_unet": true,',
    '        "train_text_encoder": false,',
    '        "gradient_checkpointing": {gc},',
    '        "noise_scheduler": "flowmatch",',
    '        "optimizer": "adamw8bit",',
    '        "lr": 0.0001,',
    '        "dtype": "bf16"',
    "    },",
    '    "model": {',
    '        "name_or_path": "black-forest-labs/FLUX.1-dev",',
    '        "is_flux": true,',
    '        "quantize": {quant}',
    "    },",
    '    "datasets": [ { "folder_path": "/workspace/dataset", "resolution": [ 512, 768, 1024 ] } ],',
    '    "sample": { "sampler": "flowmatch", "sample_every": 250, "width": 1024, "height": 1024, "sample_steps": 20 }',
    "}",
    "#############################################",
    "# Running job: my_first_flux_lora_v1",
    "#############################################",
    "",
    "",
    "Running  1 process",
    "Loading Flux model",
    "Loading transformer",
]
AIT_AFTER_LOAD = [
    "Quantizing transformer",
    "Loading vae",
    "Loading t5",
    bar("Loading checkpoint shards", 0, 2, 2, sec=1.1),
    "Quantizing T5",
    "Loading clip",
    "making pipe",
    "preparing",
    "create LoRA network. base dim (rank): 16, alpha: 16",
    "neuron dropout: p=None, rank dropout: p=None, module dropout: p=None",
    "create LoRA for Text Encoder: 0 modules.",
    "create LoRA for U-Net: 494 modules.",
    "enable LoRA for U-Net",
    "Dataset: /workspace/dataset",
    "  -  Preprocessing image dimensions",
    bar("", 0, 20, 20, sec=0.01),
    "  -  Found 20 images",
    "Bucket sizes for /workspace/dataset:",
    "1024x1024: 12 files",
    "768x1024: 8 files",
    "2 buckets made",
    "Caching latents for /workspace/dataset",
    " - Saving latents to disk",
    bar("Caching latents to disk", 0, 20, 20, sec=0.6),
]
AIT_ROOT = "/workspace/ai-toolkit"
AIT_OUTER = [
    ("run.py", 120, "<module>", "main()"),
    ("run.py", 108, "main", "raise e"),
    ("run.py", 96, "main", "job.run()"),
    ("jobs/ExtensionJob.py", 22, "run", "process.run()"),
]


def ait(batch=1, gc="true", quant="true"):
    return [l.replace("{batch}", str(batch)).replace("{gc}", gc).replace("{quant}", quant) for l in AIT_HEAD]


def ait_error(msg, frames):
    return [f"Error running job: {msg.split(': ', 1)[1]}", "", "========================================",
            "Result:", " - 0 completed jobs", " - 1 failure", "========================================"] + \
        [l.replace("/workspace/", AIT_ROOT + "/") for l in tb(frames, AIT_ROOT)] + [msg]


def ait_train_bar(start, end, total=2000):
    return bar("my_first_flux_lora_v1", start, end, total, post=lambda n: f"lr: 1.0e-04 loss: 4.{n % 10}21e-01", sec=5.5)


msg = new_oom("90.00 MiB", 23.54, 0.044, 23.49, 22.81, "211.11 MiB")
case("ait_flux_load_quantize_oom",
     ait() + [
         bar("Quantizing blocks (qfloat8)", 0, 11, 57, sec=2.0),
     ] + ait_error(msg, AIT_OUTER + [
         ("jobs/process/BaseSDTrainProcess.py", 1622, "run", "self.sd.load_model()"),
         ("toolkit/stable_diffusion_model.py", 745, "load_model", "quantize_model(self, transformer)"),
         ("toolkit/util/quantize.py", 461, "quantize_model", 'block.to(base_model.device_torch, dtype=dtype)'),
         ("/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", 1340, "to", "return self._apply(convert)"),
         ("/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", 927, "_apply", "param_applied = fn(param)"),
     ]),
     {"oom": True, "cause": "gpu_oom", "phase": "load", "trainer": "ai_toolkit", "model_family": "flux",
      "first_fix": "low_vram", "tried_to_allocate": 90 * MiB})

msg = new_oom("1.27 GiB", 23.54, 0.89, 22.64, 20.91, "1.28 GiB")
case("ait_flux_baseline_sample_oom",
     ait() + AIT_AFTER_LOAD + [
         "Generating baseline samples before training",
         bar("Generating Images", 0, 0, 10, sec=9.5),
     ] + ait_error(msg, AIT_OUTER + [
         ("jobs/process/BaseSDTrainProcess.py", 2481, "run", "self.sample(self.step_num)"),
         ("jobs/process/BaseSDTrainProcess.py", 296, "sample", "self.sd.generate_images(gen_img_config_list, sampler=sample_config.sampler)"),
         ("toolkit/stable_diffusion_model.py", 1605, "generate_images", "img = pipeline("),
     ] + TORCH_FWD),
     {"oom": True, "cause": "gpu_oom", "phase": "baseline_sample", "trainer": "ai_toolkit", "model_family": "flux",
      "first_fix": "allocator_config", "tried_to_allocate": int(1.27 * GiB)})

msg = new_oom("512.00 MiB", 23.54, 0.31, 23.22, 22.65, "112.40 MiB")
case("ait_flux_early_steps_no_checkpointing",
     ait(batch=2, gc="false") + AIT_AFTER_LOAD + [
         "Skipping first sample due to config setting",
         ait_train_bar(0, 1),
     ] + ait_error(msg, AIT_OUTER + [
         ("jobs/process/BaseSDTrainProcess.py", 2628, "run", "loss_dict = self.hook_train_loop(batch_list)"),
         ("extensions_built_in/sd_trainer/SDTrainer.py", 2245, "hook_train_loop", "loss = self.train_single_accumulation(batch)"),
         ("extensions_built_in/sd_trainer/SDTrainer.py", 2101, "train_single_accumulation", "self.accelerator.backward(loss)"),
     ] + TORCH_BWD),
     {"oom": True, "cause": "gpu_oom", "phase": "early_steps", "step": 2, "trainer": "ai_toolkit",
      "model_family": "flux", "first_fix": "gradient_checkpointing", "tried_to_allocate": 512 * MiB})

case("ait_flux_skip_then_abort_later_steps",
     ait() + AIT_AFTER_LOAD + ["Skipping first sample due to config setting", ait_train_bar(0, 40), ""] +
     sum([["", "################################################",
           f"# OOM during training step, skipping batch {k}/3 #",
           "################################################", "", ait_train_bar(40 + k, 40 + k)] for k in (1, 2, 3)], []) +
     ["Error running job: OOM during training step 3 times in a row, aborting training", "",
      "========================================", "Result:", " - 0 completed jobs", " - 1 failure",
      "========================================",
      "RuntimeError: OOM during training step 3 times in a row, aborting training"],
     {"oom": True, "cause": "gpu_oom", "phase": "later_steps", "trainer": "ai_toolkit", "model_family": "flux",
      "first_fix": "remove_largest_bucket"})

msg = new_oom("2.25 GiB", 23.54, 1.12, 22.41, 19.87, "2.04 GiB")
case("ait_flux_sampling_step_500",
     ait() + AIT_AFTER_LOAD + ["Skipping first sample due to config setting", ait_train_bar(0, 30),
                               ait_train_bar(499, 500), "Generating Images:   0%|          | 0/10 [00:00<?, ?it/s]"] +
     ait_error(msg, AIT_OUTER + [
         ("jobs/process/BaseSDTrainProcess.py", 2731, "run", "self.sample(self.step_num)"),
         ("jobs/process/BaseSDTrainProcess.py", 296, "sample", "self.sd.generate_images(gen_img_config_list)"),
         ("toolkit/stable_diffusion_model.py", 1605, "generate_images", "img = pipeline("),
     ] + TORCH_FWD),
     {"oom": True, "cause": "gpu_oom", "phase": "sampling", "trainer": "ai_toolkit", "model_family": "flux",
      "first_fix": "shrink_sampling"})

msg = new_oom("3.38 GiB", 31.36, 1.59, 29.75, 27.96, "1.30 GiB")
case("ait_wan21_video_spike",
     [l.replace("black-forest-labs/FLUX.1-dev", "Wan-AI/Wan2.1-T2V-14B-Diffusers").replace('"is_flux": true', '"arch": "wan21"')
      for l in ait()] +
     ['    datasets: num_frames: 81', "Loading transformer 1", "Quantizing Transformer", "Loading UMT5EncoderModel",
      "Dataset: /workspace/clips", "  -  Found 14 videos", "Bucket sizes for /workspace/clips:",
      "832x480x81f: 14 files", "1 buckets made", "Caching latents for /workspace/clips",
      bar("Caching latents to disk", 0, 14, 14, sec=4.0), "Skipping first sample due to config setting",
      bar("my_wan_lora", 0, 3, 2000, post=lambda n: f"lr: 1.0e-04 loss: 1.1{n}2e-01", sec=22.0)] +
     ait_error(msg, AIT_OUTER + [
         ("jobs/process/BaseSDTrainProcess.py", 2628, "run", "loss_dict = self.hook_train_loop(batch_list)"),
         ("extensions_built_in/sd_trainer/SDTrainer.py", 2245, "hook_train_loop", "loss = self.train_single_accumulation(batch)"),
     ] + TORCH_FWD),
     {"oom": True, "cause": "gpu_oom", "phase": "video_spike", "step": 4, "trainer": "ai_toolkit",
      "model_family": "wan", "first_fix": "num_frames"})

msg = new_oom("20.00 MiB", 23.99, 0, 0, 6.12, "14.31 MiB", others=[(2211, 6.71), (1871, 17.11)])
case("ait_environment_other_process",
     ait() + AIT_AFTER_LOAD[:3] + ait_error(msg, AIT_OUTER + [
         ("jobs/process/BaseSDTrainProcess.py", 1622, "run", "self.sd.load_model()"),
         ("toolkit/stable_diffusion_model.py", 702, "load_model", "transformer.to(self.device_torch, dtype=dtype)"),
     ]),
     {"oom": True, "cause": "gpu_oom", "phase": "environment", "trainer": "ai_toolkit", "first_fix": "free_gpu"})

case("ait_host_oom_killed_caching",
     ait() + AIT_AFTER_LOAD[:-1] + [bar("Caching latents to disk", 0, 7, 20, sec=0.6), "Killed"],
     {"oom": False, "cause": "host_oom", "phase": "load", "trainer": "ai_toolkit"})

case("ait_nan_loss",
     ait() + AIT_AFTER_LOAD + ["Skipping first sample due to config setting", ait_train_bar(0, 12),
                               "loss is nan", "loss is nan",
                               bar("my_first_flux_lora_v1", 13, 14, 2000, post=lambda n: "lr: 1.0e-04 loss: nan"),
                               "Job stopped"],
     {"oom": False, "cause": "nan_loss", "trainer": "ai_toolkit"})

# ------------------------------------------------------------------------------------------------
# kohya sd-scripts (rich logging) and the kohya_ss GUI
KOHYA_LOG = "{t} INFO     {m}"


def klog(msg, t="2024-09-12 10:15:22"):
    return KOHYA_LOG.format(t=t, m=msg)


def kohya_head(script="sdxl_train_network.py", extra="--gradient_checkpointing", batch=1, model="sd_xl_base_1.0.safetensors"):
    lines = _kohya_head(script, extra, batch, model)
    if script.startswith("flux"):
        lines = [l.replace("sdxl_train_util.py", "flux_train_network.py").replace("sdxl_model_util.py", "flux_utils.py")
                 .replace("building U-Net", "Building Flux model dev from BFL checkpoint")
                 .replace("loading U-Net from checkpoint", "Loading state dict from /models/flux1-dev.safetensors")
                 .replace("U-Net:  <All keys matched successfully>", "Loaded Flux: <All keys matched successfully>")
                 .replace("building text encoders", "Loading T5XXL and CLIP-L") for l in lines]
    elif not script.startswith("sdxl"):
        lines = [l.replace("sdxl_train_util.py", "model_util.py").replace("sdxl_model_util.py", "model_util.py")
                 .replace("building text encoders", "loading text encoder") for l in lines]
    return lines


def _kohya_head(script, extra, batch, model):
    return [
        f"accelerate launch --num_cpu_threads_per_process 1 {script} --pretrained_model_name_or_path=/models/{model} "
        f"--dataset_config=/data/dataset.toml --output_dir=/data/out --network_module=networks.lora --network_dim 32 "
        f"--network_alpha 16 --train_batch_size {batch} --mixed_precision bf16 --optimizer_type AdamW8bit "
        f"--learning_rate 1e-4 --max_train_steps 1600 --sample_every_n_steps 200 --sample_prompts /data/prompts.txt "
        f"--cache_latents --xformers {extra}",
        "The following values were not passed to `accelerate launch` and had defaults used instead:",
        "        `--num_processes` was set to a value of `1`",
        "        `--num_machines` was set to a value of `1`",
        "        `--mixed_precision` was set to a value of `'no'`",
        "        `--dynamo_backend` was set to a value of `'no'`",
        "To avoid this warning pass in values for each of the problematic parameters or run `accelerate config`.",
        klog("Loading settings from /data/dataset.toml...                                        train_util.py:4174"),
        klog("[Dataset 0]                                                                       config_util.py:572"),
        "                             batch_size: " + str(batch),
        "                             resolution: (1024, 1024)",
        "                             enable_bucket: True",
        "                             min_bucket_reso: 256",
        "                             max_bucket_reso: 2048",
        klog("loading image sizes.                                                                train_util.py:911"),
        bar("", 0, 40, 40, sec=0.01),
        klog("make buckets                                                                         train_util.py:917"),
        klog("number of images (including repeats) / 各bucketの画像枚数（繰り返し回数を含む）            train_util.py:963"),
        klog("bucket 0: resolution (832, 1216), count: 120                                       train_util.py:968"),
        klog("bucket 1: resolution (1024, 1024), count: 200                                      train_util.py:968"),
        klog("bucket 2: resolution (1216, 832), count: 80                                        train_util.py:968"),
        klog("mean ar error (without repeats): 0.0213                                             train_util.py:973"),
        klog("preparing accelerator                                                       train_network.py:225"),
        "accelerator device: cuda",
        klog("loading model for process 0/1                                                 sdxl_train_util.py:32"),
        klog(f"load StableDiffusion checkpoint: /models/{model}                           sdxl_train_util.py:73"),
        klog("building U-Net                                                                sdxl_model_util.py:192"),
        klog("loading U-Net from checkpoint                                                 sdxl_model_util.py:196"),
        "U-Net:  <All keys matched successfully>",
        klog("building text encoders                                                        sdxl_model_util.py:199"),
        klog("Enable xformers for U-Net                                                        train_util.py:2660"),
        "import network module: networks.lora",
        klog("[Dataset 0]                                                                        train_util.py:2079"),
        klog("caching latents.                                                                   train_util.py:974"),
        klog("checking cache validity...                                                          train_util.py:984"),
    ]


KOHYA_TRAIN_START = [
    bar("", 0, 400, 400, sec=0.02),
    klog("create LoRA network. base dim (rank): 32, alpha: 16                                     lora.py:935"),
    klog("create LoRA for Text Encoder 1: 72 modules.                                             lora.py:1043"),
    klog("create LoRA for U-Net: 722 modules.                                                      lora.py:1043"),
    "prepare optimizer, data loader etc.",
    klog("use 8-bit AdamW optimizer | {}                                                        train_util.py:4342"),
    "running training / 学習開始",
    "  num train images * repeats / 学習画像の数×繰り返し回数: 400",
    "  num reg images / 正則化画像の数: 0",
    "  num batches per epoch / 1epochのバッチ数: 400",
    "  num epochs / epoch数: 4",
    "  batch size per device / バッチサイズ: {batch}",
    "  gradient accumulation steps / 勾配を合計するステップ数 = 1",
    "  total optimization steps / 学習ステップ数: 1600",
]


def kohya_train_start(batch=1):
    return [l.replace("{batch}", str(batch)) for l in KOHYA_TRAIN_START]


def ksteps(start, end, total=1600):
    return bar("steps", start, end, total, post=lambda n: f"avr_loss=0.{100 + n % 50}", sec=1.9)


K_OUTER = [("/sd-scripts/sdxl_train_network.py", 185, "<module>", "trainer.train(args)"),
           ("/sd-scripts/train_network.py", 1115, "train", None)]
ACC_TAIL = [
    "Traceback (most recent call last):",
    '  File "/usr/local/bin/accelerate", line 8, in <module>',
    "    sys.exit(main())",
    '  File "/usr/local/lib/python3.10/dist-packages/accelerate/commands/launch.py", line 1106, in launch_command',
    "    simple_launcher(args)",
    '  File "/usr/local/lib/python3.10/dist-packages/accelerate/commands/launch.py", line 704, in simple_launcher',
    "    raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)",
]


def acc_fail(code=1):
    return ACC_TAIL + [f"subprocess.CalledProcessError: Command '['/usr/bin/python3', 'sdxl_train_network.py', "
                       f"'--dataset_config=/data/dataset.toml']' returned non-zero exit status {code}."]


msg = old_oom("1.50 GiB", "23.99 GiB", "20.11 GiB", "1.16 GiB", "21.04 GiB")
case("kohya_sdxl_early_steps_batch4",
     kohya_head(extra="", batch=4) + kohya_train_start(4) + [ksteps(0, 0), "", "epoch 1/4"] +
     tb(K_OUTER + [("/sd-scripts/train_network.py", 1051, "train", "accelerator.backward(loss)"),
                   ("/usr/local/lib/python3.10/dist-packages/accelerate/accelerator.py", 2151, "backward", "loss.backward(**kwargs)")] + TORCH_BWD) +
     [msg] + ["steps:   0%|          | 0/1600 [00:09<?, ?it/s]"] + acc_fail(),
     {"oom": True, "cause": "gpu_oom", "phase": "early_steps", "step": 1, "trainer": "kohya_sd_scripts",
      "model_family": "sdxl", "first_fix": "checkpointing_and_resolution", "tried_to_allocate": int(1.5 * GiB)})

msg = old_oom("20.00 MiB", "8.00 GiB", "7.12 GiB", "0 bytes", "7.28 GiB")
case("kohya_sdxl_sample_at_step_200",
     kohya_head() + kohya_train_start() + [ksteps(0, 1), "", "epoch 1/4", ksteps(1, 200),
                                          klog("generating sample images at step / サンプル画像生成 ステップ: 200     train_util.py:5383"),
                                          klog("prompt: a photo of sks dog, best quality                            train_util.py:5527"),
                                          klog("height: 1024                                                         train_util.py:5531"),
                                          klog("width: 1024                                                          train_util.py:5532"),
                                          klog("sample_steps: 30                                                     train_util.py:5533"),
                                          bar("", 0, 12, 30, sec=0.3)] +
     tb(K_OUTER + [("/sd-scripts/train_network.py", 1092, "train", "self.sample_images(accelerator, args, None, global_step, accelerator.device, vae, tokenizer, text_encoder, unet)"),
                   ("/sd-scripts/sdxl_train_network.py", 168, "sample_images", "sdxl_train_util.sample_images(accelerator, args, epoch, global_step, device, vae, tokenizer, text_encoder, unet)"),
                   ("/sd-scripts/library/train_util.py", 5449, "sample_images_common", "sample_image_inference("),
                   ("/sd-scripts/library/train_util.py", 5560, "sample_image_inference", "latents = pipeline(")] + TORCH_FWD) + [msg] + acc_fail(),
     {"oom": True, "cause": "gpu_oom", "phase": "sampling", "step": None, "trainer": "kohya_sd_scripts",
      "model_family": "sdxl", "first_fix": "shrink_sampling"})

msg = old_oom("2.00 GiB", "11.99 GiB", "8.64 GiB", "1.21 GiB", "9.70 GiB")
case("kohya_sd15_sample_at_first",
     kohya_head(script="train_network.py", model="v1-5-pruned-emaonly.safetensors", extra="--gradient_checkpointing --sample_at_first")
     + kohya_train_start() + [ksteps(0, 0), "", "epoch 1/4",
                              klog("generating sample images at step / サンプル画像生成 ステップ: 0     train_util.py:5383"),
                              bar("", 0, 3, 30, sec=0.3)] +
     tb([("/sd-scripts/train_network.py", 1010, "train", "self.sample_images(accelerator, args, 0, global_step, accelerator.device, vae, tokenizer, text_encoder, unet)"),
         ("/sd-scripts/library/train_util.py", 5449, "sample_images_common", "sample_image_inference(")]) + [msg] + acc_fail(),
     {"oom": True, "cause": "gpu_oom", "phase": "baseline_sample", "trainer": "kohya_sd_scripts",
      "model_family": "sd15", "first_fix": "skip_baseline_sample"})

msg = new_oom("3.00 GiB", 23.64, 2.21, 21.41, 17.20, "3.75 GiB")
case("kohya_sdxl_later_steps_fragmented",
     kohya_head() + kohya_train_start() + [ksteps(0, 1), "", "epoch 1/4", ksteps(1, 20), ksteps(1330, 1337)] +
     tb(K_OUTER + [("/sd-scripts/train_network.py", 1040, "train", "noise_pred = self.call_unet(")] + TORCH_FWD) + [msg] + acc_fail(),
     {"oom": True, "cause": "gpu_oom", "phase": "later_steps", "step": 1338, "trainer": "kohya_sd_scripts",
      "model_family": "sdxl", "first_fix": "allocator_config", "tried_to_allocate": 3 * GiB})

msg = old_oom("128.00 MiB", "23.99 GiB", "22.77 GiB", "0 bytes", "23.03 GiB")
case("kohya_flux_caching_latents_gpu_oom",
     kohya_head(script="flux_train_network.py", model="flux1-dev.safetensors", extra="--gradient_checkpointing --fp8_base")
     + [bar("", 0, 5, 400, sec=0.2)] +
     tb([("/sd-scripts/flux_train_network.py", 519, "<module>", "trainer.train(args)"),
         ("/sd-scripts/train_network.py", 432, "train", "self.cache_latents(accelerator, args, train_dataset_group, vae)"),
         ("/sd-scripts/library/train_util.py", 2420, "cache_latents", "dataset.cache_latents(vae, vae_batch_size, cache_to_disk, is_main_process)"),
         ("/sd-scripts/library/strategy_base.py", 598, "_default_cache_batch_latents", "latents = encode_by_vae(img_tensors)")] + TORCH_FWD)
     + [msg] + acc_fail(),
     {"oom": True, "cause": "gpu_oom", "phase": "load", "trainer": "kohya_sd_scripts", "model_family": "flux"})

case("kohya_host_oom_exit_minus9",
     kohya_head(script="flux_train_network.py", model="flux1-dev.safetensors") +
     [klog("loading model for process 0/1                                                  flux_train_network.py:89"),
      klog("Building Flux model dev from BFL checkpoint                                       flux_utils.py:74")] + acc_fail(-9),
     {"oom": False, "cause": "host_oom", "phase": "load", "trainer": "kohya_sd_scripts", "model_family": "flux"})

case("kohya_missing_model_file",
     kohya_head()[:30] + tb([("/sd-scripts/sdxl_train_network.py", 185, "<module>", "trainer.train(args)"),
                             ("/sd-scripts/library/sdxl_train_util.py", 73, "load_target_model", None)]) +
     ["FileNotFoundError: [Errno 2] No such file or directory: '/models/sd_xl_base_1.0.safetensors'"] + acc_fail(),
     {"oom": False, "cause": "missing_file", "trainer": "kohya_sd_scripts"})

case("kohya_version_mismatch_import",
     ["A matching Triton is not available, some optimizations will not be enabled",
      "Traceback (most recent call last):",
      '  File "C:\\kohya_ss\\sd-scripts\\train_network.py", line 20, in <module>',
      "    from library import deepspeed_utils, model_util, strategy_base, strategy_sd",
      '  File "C:\\kohya_ss\\sd-scripts\\library\\model_util.py", line 16, in <module>',
      "    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline  # , UNet2DConditionModel",
      "ImportError: cannot import name 'cached_download' from 'huggingface_hub' (C:\\kohya_ss\\venv\\lib\\site-packages\\huggingface_hub\\__init__.py)"]
     + [l.replace("/usr/local/lib/python3.10/dist-packages", "C:\\kohya_ss\\venv\\lib\\site-packages") for l in acc_fail()],
     {"oom": False, "cause": "version_mismatch", "trainer": "kohya_sd_scripts"}, crlf=True)

gui = ["\x1b[34m15:22:01-114286\x1b[0m \x1b[32mINFO    \x1b[0m Kohya_ss GUI version: v24.1.7",
       "\x1b[34m15:22:09-662231\x1b[0m \x1b[32mINFO    \x1b[0m Start training LoRA Standard ...",
       "\x1b[34m15:22:09-672230\x1b[0m \x1b[32mINFO    \x1b[0m Validating lr scheduler arguments...",
       "\x1b[34m15:22:09-683232\x1b[0m \x1b[32mINFO    \x1b[0m Executing command: E:\\kohya_ss\\venv\\Scripts\\accelerate.EXE launch --dynamo_backend no "
       "--dynamo_mode default --mixed_precision fp16 --num_processes 1 --num_machines 1 --num_cpu_threads_per_process 2 "
       "E:/kohya_ss/sd-scripts/sdxl_train_network.py --config_file E:/lora/model/config_lora-20240912-152209.toml",
       "\x1b[34m15:22:09-700230\x1b[0m \x1b[32mINFO    \x1b[0m Command executed."]
msg = new_oom("36.00 MiB", 12.00, 0, 24.53, 10.94, "261.92 MiB")
case("kohya_gui_windows_early_step_sysmem",
     gui + [l.replace("/sd-scripts/", "E:\\kohya_ss\\sd-scripts\\") for l in kohya_head(extra="")[11:]] +
     kohya_train_start(2) + [ksteps(0, 3), "", "epoch 1/4"] +
     [l.replace("/sd-scripts/", "E:\\kohya_ss\\sd-scripts\\") for l in tb(K_OUTER + [("/sd-scripts/train_network.py", 1051, "train", "accelerator.backward(loss)")] + TORCH_BWD)]
     + [msg.replace("this process has 24.53 GiB", "this process has 24.53 GiB")] + ["steps:   0%|          | 3/1600 [00:29<4:20:16,  9.78s/it, avr_loss=0.114]"]
     + [l.replace("/usr/local/lib/python3.10/dist-packages", "E:\\kohya_ss\\venv\\lib\\site-packages") for l in acc_fail()],
     {"oom": True, "cause": "gpu_oom", "phase": "early_steps", "step": 4, "trainer": "kohya_sd_scripts",
      "model_family": "sdxl", "first_fix": "gradient_checkpointing"}, crlf=True)

# ------------------------------------------------------------------------------------------------
# musubi-tuner (Wan, HunyuanVideo)


def mlog(m):
    return f"INFO:musubi_tuner.hv_train_network:{m}"


MUSUBI_HEAD = [
    "accelerate launch --num_cpu_threads_per_process 1 --mixed_precision bf16 src/musubi_tuner/wan_train_network.py "
    "--task t2v-14B --dit /models/wan2.1_t2v_14B_bf16.safetensors --dataset_config /data/video.toml --sdpa "
    "--mixed_precision bf16 --fp8_base --optimizer_type adamw8bit --learning_rate 2e-4 --gradient_checkpointing "
    "--max_data_loader_n_workers 2 --persistent_data_loader_workers --network_module networks.lora_wan "
    "--network_dim 32 --timestep_sampling shift --discrete_flow_shift 3.0 --max_train_epochs 16 --save_every_n_epochs 1",
    "INFO:musubi_tuner.dataset.config_utils:Loading dataset config from /data/video.toml",
    "INFO:musubi_tuner.dataset.config_utils:[VideoDataset 0]",
    "    video_directory: \"/data/clips\"",
    "    resolution: (960, 544)",
    "    batch_size: 1",
    "    target_frames: (1, 25, 45, 81)",
    "    frame_extraction: head",
    "INFO:musubi_tuner.dataset.image_video_dataset:bucket: (960, 544, 81), count: 24",
    "INFO:musubi_tuner.dataset.image_video_dataset:bucket: (960, 544, 45), count: 10",
    "INFO:musubi_tuner.hv_train_network:preparing accelerator",
    "accelerator device: cuda",
    "INFO:musubi_tuner.hv_train_network:DiT precision: torch.bfloat16, weight precision: torch.float8_e4m3fn",
    "INFO:musubi_tuner.hv_train_network:Loading DiT model from /models/wan2.1_t2v_14B_bf16.safetensors",
    "INFO:musubi_tuner.wan.modules.model:Creating WanModel",
    "INFO:musubi_tuner.wan.modules.model:Loading DiT model from /models/wan2.1_t2v_14B_bf16.safetensors, device=cuda, dit_dtype=torch.bfloat16",
]
MUSUBI_TRAIN = [
    "INFO:musubi_tuner.wan.modules.model:Loaded DiT model from /models/wan2.1_t2v_14B_bf16.safetensors, info=<All keys matched successfully>",
    "import network module: networks.lora_wan",
    "INFO:musubi_tuner.networks.lora:create LoRA for U-Net/DiT: 400 modules.",
    "prepare optimizer, data loader etc.",
    "INFO:musubi_tuner.hv_train_network:use 8-bit AdamW optimizer | {}",
    "running training / 学習開始",
    "  num train items * repeats / 学習画像、動画の数×繰り返し回数: 34",
    "  num batches per epoch / 1epochのバッチ数: 34",
    "  num epochs / epoch数: 16",
    "  batch size per device / バッチサイズ: 1",
    "  gradient accumulation steps / 勾配を合計するステップ数 = 1",
    "  total optimization steps / 学習ステップ数: 544",
]
M_OUTER = [("/musubi-tuner/src/musubi_tuner/wan_train_network.py", 580, "<module>", "main()"),
           ("/musubi-tuner/src/musubi_tuner/hv_train_network.py", 2241, "train", None)]

msg = new_oom("4.53 GiB", 23.52, 3.44, 20.07, 15.62, "3.97 GiB")
case("musubi_wan_video_spike",
     MUSUBI_HEAD + MUSUBI_TRAIN + [bar("steps", 0, 2, 544, post=lambda n: "avr_loss=0.0912", sec=31.0), "", "epoch 1/16"] +
     tb(M_OUTER + [("/musubi-tuner/src/musubi_tuner/hv_train_network.py", 2185, "train", "model_pred, target = self.call_dit(")] + TORCH_FWD)
     + [msg] + [l.replace("sdxl_train_network.py", "src/musubi_tuner/wan_train_network.py") for l in acc_fail()],
     {"oom": True, "cause": "gpu_oom", "phase": "video_spike", "step": 3, "trainer": "musubi_tuner",
      "model_family": "wan", "first_fix": "allocator_config"})

msg = new_oom("270.00 MiB", 15.99, 0.12, 15.86, 15.58, "24.20 MiB")
case("musubi_wan_load_dit_oom",
     [l.replace(" --fp8_base", "") for l in MUSUBI_HEAD] +
     tb([("/musubi-tuner/src/musubi_tuner/wan_train_network.py", 580, "<module>", "main()"),
         ("/musubi-tuner/src/musubi_tuner/hv_train_network.py", 1720, "train", "transformer = self.load_transformer("),
         ("/musubi-tuner/src/musubi_tuner/wan_train_network.py", 301, "load_transformer", "model = load_wan_model("),
         ("/musubi-tuner/src/musubi_tuner/wan/modules/model.py", 1301, "load_wan_model", "sd = load_safetensors_with_lora_and_fp8(")])
     + [msg],
     {"oom": True, "cause": "gpu_oom", "phase": "load", "trainer": "musubi_tuner", "model_family": "wan",
      "first_fix": "low_vram"})

msg = new_oom("7.91 GiB", 23.52, 5.01, 18.50, 17.95, "108.40 MiB")
case("musubi_hunyuan_sampling",
     [l.replace("wan_train_network.py", "hv_train_network.py").replace("wan2.1_t2v_14B_bf16", "mp_rank_00_model_states")
      .replace("networks.lora_wan", "networks.lora") for l in MUSUBI_HEAD] + MUSUBI_TRAIN[:-1] +
     ["  total optimization steps / 学習ステップ数: 2000", bar("steps", 0, 1, 2000, post=lambda n: "avr_loss=0.08", sec=9.0),
      "", "epoch 1/16", bar("steps", 1, 250, 2000, post=lambda n: "avr_loss=0.07", sec=9.0),
      mlog("generating sample images at step: 250"), mlog("prompt: a cat walks on the grass, realistic style."),
      mlog("height: 720"), mlog("width: 1280"), mlog("frame count: 129"), bar("", 0, 4, 30, sec=28.0)] +
     tb([("/musubi-tuner/src/musubi_tuner/hv_train_network.py", 2302, "train", "self.sample_images(accelerator, args, None, global_step, vae, transformer, sample_parameters, dit_dtype)"),
         ("/musubi-tuner/src/musubi_tuner/hv_train_network.py", 1230, "sample_images", "self.sample_image_inference(")] + TORCH_FWD) + [msg],
     {"oom": True, "cause": "gpu_oom", "phase": "sampling", "trainer": "musubi_tuner", "model_family": "hunyuan",
      "first_fix": "shrink_sampling"})

case("musubi_cache_latents_killed",
     ["python src/musubi_tuner/wan_cache_latents.py --dataset_config /data/video.toml --vae /models/wan_2.1_vae.safetensors",
      "INFO:musubi_tuner.dataset.config_utils:Loading dataset config from /data/video.toml",
      "INFO:musubi_tuner.wan_cache_latents:Loading VAE model from /models/wan_2.1_vae.safetensors",
      "INFO:musubi_tuner.cache_latents:Encoding dataset [0]",
      bar("", 0, 3, 34, sec=12.0),
      "./cache.sh: line 1: 48211 Killed                  python src/musubi_tuner/wan_cache_latents.py --dataset_config /data/video.toml"],
     {"oom": False, "cause": "host_oom", "phase": "load", "trainer": "musubi_tuner", "model_family": "wan"})

# ------------------------------------------------------------------------------------------------
# diffusion-pipe (DeepSpeed)
DP_HEAD = [
    "NCCL_P2P_DISABLE=\"1\" NCCL_IB_DISABLE=\"1\" deepspeed --num_gpus=1 train.py --deepspeed --config examples/wan_video.toml",
    "[2025-03-02 11:20:14,102] [INFO] [real_accelerator.py:219:get_accelerator] Setting ds_accelerator to cuda (auto detect)",
    "[2025-03-02 11:20:16,550] [WARNING] [runner.py:215:fetch_hostfile] Unable to find hostfile, will proceed with training with local resources only.",
    "[2025-03-02 11:20:16,550] [INFO] [runner.py:607:main] cmd = /usr/bin/python3 -u -m deepspeed.launcher.launch --world_info=eyJsb2NhbGhvc3QiOiBbMF19 --master_addr=127.0.0.1 --master_port=29500 --enable_each_rank_log=None train.py --deepspeed --config examples/wan_video.toml",
    "[2025-03-02 11:20:21,887] [INFO] [comm.py:652:init_distributed] cdb=None",
    "{'output_dir': '/data/diffusion-pipe-training-runs', 'dataset': 'examples/dataset.toml', 'epochs': 1000, "
    "'micro_batch_size_per_gpu': 1, 'pipeline_stages': 1, 'gradient_accumulation_steps': 4, 'gradient_clipping': 1.0, "
    "'warmup_steps': 100, 'activation_checkpointing': True, 'save_dtype': 'bfloat16', 'caching_batch_size': 1, "
    "'model': {'type': 'wan', 'ckpt_path': '/models/Wan2.1-T2V-14B', 'dtype': 'bfloat16', 'transformer_dtype': 'float8', "
    "'timestep_sample_method': 'logit_normal'}, 'adapter': {'type': 'lora', 'rank': 32, 'dtype': 'bfloat16'}, "
    "'optimizer': {'type': 'adamw_optimi', 'lr': 2e-05, 'betas': [0.9, 0.99], 'weight_decay': 0.01, 'eps': 1e-08}}",
    "Loading checkpoint shards: 100%|██████████| 6/6 [00:22<00:00,  3.70s/it]",
    "{'resolutions': [512], 'enable_ar_bucket': True, 'min_ar': 0.5, 'max_ar': 2.0, 'num_ar_buckets': 7, 'frame_buckets': [1, 33, 65], "
    "'directory': [{'path': '/data/clips', 'num_repeats': 5}]}",
    "caching metadata",
    "Map (num_proc=8): 100%|██████████| 120/120 [00:01<00:00, 95.11 examples/s]",
    "caching latents: /data/clips",
    "Map: 100%|██████████| 120/120 [03:40<00:00,  1.84s/ examples]",
    "[2025-03-02 11:27:44,310] [INFO] [engine.py:141:__init__] is_pipe_partitioned= False is_grad_partitioned= False",
]
msg = new_oom("1.88 GiB", 23.55, 1.17, 22.37, 20.60, "1.31 GiB", cls="[rank0]: torch.OutOfMemoryError")
case("diffusion_pipe_wan_video_spike",
     DP_HEAD + ["[2025-03-02 11:28:51,225] [INFO] [logging.py:128:log_dist] [Rank 0] step=1, skipped=0, lr=[2e-07], mom=[(0.9, 0.99)]",
                "steps: 1 loss: 0.1184 iter time (s): 61.204 samples/sec: 0.065",
                "steps: 2 loss: 0.0962 iter time (s): 58.771 samples/sec: 0.068"] +
     ["[rank0]: " + l for l in tb([("/diffusion-pipe/train.py", 775, "<module>", "loss = engine.train_batch(iterator=train_dataloader).item()"),
                                    ("/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/pipe/engine.py", 391, "train_batch", "self._exec_schedule(sched)"),
                                    ("/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/pipe/engine.py", 1433, "_exec_schedule", "self._exec_instr(**cmd.kwargs)"),
                                    ("/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/pipe/engine.py", 1103, "_exec_backward_pass", "torch.autograd.backward(tensors=(outputs, ), grad_tensors=(grad_tensors, ))")])] +
     [msg, "[2025-03-02 11:31:02,118] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 2201",
      "[2025-03-02 11:31:02,119] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', '--local_rank=0', '--deepspeed', '--config', 'examples/wan_video.toml'] exits with return code = 1"],
     {"oom": True, "cause": "gpu_oom", "phase": "video_spike", "step": 3, "trainer": "diffusion_pipe",
      "model_family": "wan", "first_fix": "num_frames"})

case("diffusion_pipe_caching_killed",
     DP_HEAD[:12] + ["Map (num_proc=8):  40%|████      | 48/120 [01:20<02:00,  1.67s/ examples]",
                     "[2025-03-02 11:25:02,118] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 2201",
                     "[2025-03-02 11:25:02,119] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', '--local_rank=0', '--deepspeed', '--config', 'examples/wan_video.toml'] exits with return code = -9"],
     {"oom": False, "cause": "host_oom", "phase": "load", "trainer": "diffusion_pipe"})

# ------------------------------------------------------------------------------------------------
# diffusers examples
DIFF_HEAD = [
    "accelerate launch train_dreambooth_lora_flux.py --pretrained_model_name_or_path=black-forest-labs/FLUX.1-dev "
    "--instance_data_dir=dog --output_dir=trained-flux-lora --mixed_precision=bf16 --instance_prompt=\"a photo of sks dog\" "
    "--resolution=1024 --train_batch_size=1 --guidance_scale=1 --gradient_accumulation_steps=4 --optimizer=prodigy "
    "--learning_rate=1. --report_to=wandb --lr_scheduler=constant --lr_warmup_steps=0 --max_train_steps=500 "
    "--validation_prompt=\"A photo of sks dog in a bucket\" --validation_epochs=25 --seed=0",
    "09/12/2024 10:01:02 - INFO - __main__ - Distributed environment: NO",
    "Num processes: 1",
    "Process index: 0",
    "Device: cuda",
    "Mixed precision type: bf16",
    "You set `add_prefix_space`. The tokenizer needs to be converted from the slow tokenizers",
    "Downloading shards: 100%|██████████| 2/2 [00:00<00:00, 3581.29it/s]",
    "Loading checkpoint shards: 100%|██████████| 2/2 [00:04<00:00,  2.10s/it]",
    "Fetching 3 files: 100%|██████████| 3/3 [00:00<00:00, 41120.63it/s]",
]
DIFF_TRAIN = [
    "09/12/2024 10:03:40 - INFO - __main__ - ***** Running training *****",
    "09/12/2024 10:03:40 - INFO - __main__ -   Num examples = 5",
    "09/12/2024 10:03:40 - INFO - __main__ -   Num batches each epoch = 5",
    "09/12/2024 10:03:40 - INFO - __main__ -   Num Epochs = 400",
    "09/12/2024 10:03:40 - INFO - __main__ -   Instantaneous batch size per device = 1",
    "09/12/2024 10:03:40 - INFO - __main__ -   Total train batch size (w. parallel, distributed & accumulation) = 4",
    "09/12/2024 10:03:40 - INFO - __main__ -   Gradient Accumulation steps = 4",
    "09/12/2024 10:03:40 - INFO - __main__ -   Total optimization steps = 500",
]
msg = new_oom("126.00 MiB", 39.38, 0.049, 39.33, 37.93, "904.26 MiB")
case("diffusers_flux_dreambooth_early",
     DIFF_HEAD + DIFF_TRAIN + [bar("Steps", 0, 0, 500, sec=0.0)] +
     tb([("/diffusers/examples/dreambooth/train_dreambooth_lora_flux.py", 1891, "<module>", "main(args)"),
         ("/diffusers/examples/dreambooth/train_dreambooth_lora_flux.py", 1686, "main", "model_pred = transformer(")] + TORCH_FWD)
     + [msg, "Steps:   0%|          | 0/500 [00:11<?, ?it/s]"] +
     [l.replace("sdxl_train_network.py", "train_dreambooth_lora_flux.py") for l in acc_fail()],
     {"oom": True, "cause": "gpu_oom", "phase": "early_steps", "step": 1, "trainer": "diffusers",
      "model_family": "flux", "first_fix": "allocator_config"})

msg = new_oom("4.00 GiB", 23.68, 2.83, 20.84, 18.82, "1.56 GiB")
case("diffusers_sdxl_validation",
     [l.replace("train_dreambooth_lora_flux.py", "train_dreambooth_lora_sdxl.py").replace("black-forest-labs/FLUX.1-dev", "stabilityai/stable-diffusion-xl-base-1.0")
      .replace("--guidance_scale=1 ", "--gradient_checkpointing ") for l in DIFF_HEAD] + DIFF_TRAIN +
     [bar("Steps", 0, 125, 500, post=lambda n: f"loss=0.0{n % 9 + 1}, lr=1", sec=1.2),
      "09/12/2024 10:09:12 - INFO - __main__ - Running validation... ",
      " Generating 4 images with prompt: A photo of sks dog in a bucket.",
      "Loading pipeline components...: 100%|██████████| 7/7 [00:00<00:00, 38.12it/s]",
      bar("", 0, 6, 25, sec=0.2)] +
     tb([("/diffusers/examples/dreambooth/train_dreambooth_lora_sdxl.py", 1980, "<module>", "main(args)"),
         ("/diffusers/examples/dreambooth/train_dreambooth_lora_sdxl.py", 1901, "main", "images = log_validation("),
         ("/diffusers/examples/dreambooth/train_dreambooth_lora_sdxl.py", 205, "log_validation", "images = [pipeline(**pipeline_args, generator=generator).images[0] for _ in range(args.num_validation_images)]")]
        + TORCH_FWD) + [msg],
     {"oom": True, "cause": "gpu_oom", "phase": "sampling", "trainer": "diffusers", "model_family": "sdxl",
      "first_fix": "shrink_sampling"})

msg = new_oom("72.00 MiB", 23.68, 0.0468, 23.61, 23.30, "19.88 MiB")
case("diffusers_flux_load_to_device",
     DIFF_HEAD + tb([("/diffusers/examples/dreambooth/train_dreambooth_lora_flux.py", 1891, "<module>", "main(args)"),
                     ("/diffusers/examples/dreambooth/train_dreambooth_lora_flux.py", 1180, "main", "transformer.to(accelerator.device, dtype=weight_dtype)"),
                     ("/usr/local/lib/python3.10/dist-packages/diffusers/models/modeling_utils.py", 1077, "to", "return super().to(*args, **kwargs)"),
                     ("/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", 1340, "to", "return self._apply(convert)"),
                     ("/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", 927, "_apply", "param_applied = fn(param)"),
                     ("/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", 1326, "convert", "return t.to(")]) + [msg],
     {"oom": True, "cause": "gpu_oom", "phase": "load", "trainer": "diffusers", "model_family": "flux", "first_fix": "low_vram"})

case("diffusers_dataloader_worker_killed",
     DIFF_HEAD + DIFF_TRAIN + [bar("Steps", 0, 7, 500, post=lambda n: "loss=0.31, lr=0.0001", sec=2.0)] +
     tb([("/diffusers/examples/dreambooth/train_dreambooth_lora_flux.py", 1650, "main", "for step, batch in enumerate(train_dataloader):"),
         ("/usr/local/lib/python3.10/dist-packages/torch/utils/data/dataloader.py", 1133, "_try_get_data", "raise RuntimeError(f'DataLoader worker (pid(s) {pids_str}) exited unexpectedly') from e")]) +
     ["RuntimeError: DataLoader worker (pid 30177) is killed by signal: Killed. "],
     {"oom": False, "cause": "dataloader_worker", "trainer": "diffusers"})

# ------------------------------------------------------------------------------------------------
# OneTrainer, SimpleTuner, ComfyUI
OT_HEAD = ["python scripts/train.py --config-path training_presets/sdxl_lora.json",
           "Clearing cache directory workspace-cache/run! You can disable this if you want to continue using the same cache.",
           "Fetching 17 files: 100%|██████████| 17/17 [00:00<?, ?it/s]",
           "Loading pipeline components...: 100%|██████████| 7/7 [00:03<00:00,  2.23it/s]",
           "enumerating sample paths: 100%|██████████| 1/1 [00:00<00:00, 501.29it/s]",
           "caching: 100%|██████████| 56/56 [00:31<00:00,  1.79it/s]",
           "caching: 100%|██████████| 56/56 [00:03<00:00, 15.33it/s]"]
msg = new_oom("640.00 MiB", 15.99, 0.21, 15.76, 14.80, "360.27 MiB")
case("onetrainer_sdxl_early",
     OT_HEAD + [bar("epoch", 0, 0, 100, sec=0.0), bar("step", 0, 2, 56, post=lambda n: "loss=0.0877, smooth loss=0.121", sec=2.3)] +
     [l.replace("/workspace/", "C:\\OneTrainer\\") for l in tb([
         ("C:\\OneTrainer\\scripts\\train.py", 38, "<module>", "main()"),
         ("C:\\OneTrainer\\modules\\trainer\\GenericTrainer.py", 682, "train", "loss.backward()")] + TORCH_BWD)] + [msg],
     {"oom": True, "cause": "gpu_oom", "phase": "early_steps", "step": 3, "trainer": "onetrainer", "model_family": "sdxl",
      "first_fix": "gradient_checkpointing"}, crlf=True)

case("onetrainer_illegal_memory_access",
     OT_HEAD + [bar("epoch", 0, 0, 100, sec=0.0), bar("step", 0, 30, 56, post=lambda n: "loss=0.0877, smooth loss=0.121", sec=2.3)] +
     tb([("C:\\OneTrainer\\modules\\trainer\\GenericTrainer.py", 682, "train", "loss.backward()")] + TORCH_BWD) +
     ["RuntimeError: CUDA error: an illegal memory access was encountered",
      "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
      "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
      "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."],
     {"oom": False, "cause": "gpu_fault", "trainer": "onetrainer"})

ST_HEAD = ["2024-10-02 09:12:01,332 [INFO] (__main__) Using model family: flux",
           "--model_family=flux --model_type=lora --pretrained_model_name_or_path=black-forest-labs/FLUX.1-dev "
           "--resolution=1024 --train_batch_size=1 --gradient_checkpointing --validation_steps=100 --lora_rank=16",
           "2024-10-02 09:12:20,001 [INFO] (helpers.training.trainer) Load VAE: black-forest-labs/FLUX.1-dev",
           "2024-10-02 09:12:31,774 [INFO] (helpers.training.trainer) Loading diffusion model..",
           "2024-10-02 09:13:02,120 [INFO] (helpers.data_backend.factory) (id=my-dataset) Loading bucket manager.",
           "2024-10-02 09:13:44,004 [INFO] (helpers.training.trainer) ***** Running training *****"]
msg = new_oom("1.50 GiB", 23.65, 0.92, 22.72, 20.80, "560.10 MiB")
case("simpletuner_flux_validation",
     ST_HEAD + [bar("Epoch 1/10, Steps", 0, 100, 1000, post=lambda n: "lr=0.0001, step_loss=0.31", sec=2.5),
                "2024-10-02 09:20:12,552 [INFO] (helpers.training.validation) Running validation at step 100",
                bar("", 0, 5, 28, sec=0.9)] +
     tb([("/SimpleTuner/train.py", 49, "<module>", "trainer.train()"),
         ("/SimpleTuner/helpers/training/trainer.py", 2755, "train", "self.validation.run_validations("),
         ("/SimpleTuner/helpers/training/validation.py", 1021, "run_validations", "self.process_prompts()")] + TORCH_FWD) + [msg],
     {"oom": True, "cause": "gpu_oom", "phase": "sampling", "trainer": "simpletuner", "model_family": "flux",
      "first_fix": "shrink_sampling"})

case("comfyui_train_lora_node_oom",
     ["got prompt", "Using pytorch attention in VAE", "Requested to load SDXLClipModel",
      "loaded completely 9.5367431640625e+25 1560.802734375 True", "Requested to load SDXL", "loaded partially 9914.2 9913.7 0",
      bar("Training LoRA", 0, 0, 100, sec=0.0),
      "!!! Exception during processing !!! Allocation on device ",
      "Traceback (most recent call last):",
      '  File "E:\\ComfyUI\\execution.py", line 496, in execute',
      "    output_data, output_ui, has_subgraph, has_pending_tasks = await get_output_data(prompt_id, unique_id, obj, input_data_all, execution_block_cb=execution_block_cb, pre_execute_cb=pre_execute_cb, hidden_inputs=hidden_inputs)",
      '  File "E:\\ComfyUI\\comfy_extras\\nodes_train.py", line 612, in execute',
      "    guider.sample(",
      '  File "E:\\ComfyUI\\comfy_extras\\nodes_train.py", line 263, in sample',
      "    self._train_step_standard_mode(model_wrap, cond, extra_args, noisegen, latent_image, dataset_size, pbar)",
      '  File "E:\\ComfyUI\\comfy_extras\\nodes_train.py", line 210, in fwd_bwd',
      "    bwd_loss.backward()",
      "torch.OutOfMemoryError: Allocation on device ",
      "", "Got an OOM, unloading all loaded models.", "Prompt executed in 41.03 seconds"],
     {"oom": True, "cause": "gpu_oom", "phase": "early_steps", "trainer": "comfyui", "model_family": "sdxl"}, crlf=True)

# ------------------------------------------------------------------------------------------------
# lora-train's own OOM guard
case("lora_train_guard_exhausted",
     ["lora-train run configs/sdxl_lora.yaml",
      "[info] config: configs/sdxl_lora.yaml (model sdxl, rank 16, batch 4, resolution [512, 768, 1024])",
      "[info] phase load: UNet, text encoders, VAE",
      "step 1/2000 | loss 0.1234 | lr 1.0e-04 | 2.1 s/it | mem 14.2/15.1 GiB",
      "[warning] oom-guard: OOM in phase train_step(step 2, bucket 1024x1024, batch 4) \u2014 early_steps; action: enable gradient_checkpointing",
      "[warning] oom-guard: OOM in phase train_step(step 2, bucket 1024x1024, batch 4) \u2014 early_steps; action: batch_size 4 -> 1, gradient_accumulation_steps 1 -> 4",
      "[warning] oom-guard: OOM in phase train_step(step 2, bucket 1024x1024, batch 1) \u2014 early_steps; action: remove the largest bucket 1024",
      "[error] oom-guard: OOM in phase train_step(step 2, bucket 768x768, batch 1) \u2014 early_steps; action: give up: 3 OOM recoveries in this run (guard max_attempts); settings: batch 1, checkpointing on, resolution [512, 768]"],
     {"oom": True, "cause": "gpu_oom", "phase": "early_steps", "step": 2, "trainer": "lora_train", "model_family": "sdxl"})

case("lora_train_guard_baseline",
     ["lora-train run configs/flux_lora.yaml",
      "[warning] oom-guard: only 6.20 GiB of 23.99 GiB is free at start on cuda:0: 17.10 GiB is held by something else (another process, a dirty worker); borderline settings may not fit",
      "[warning] oom-guard: OOM in phase baseline_sample(step 0, bucket 0x0, batch 0) \u2014 load; action: skip the baseline sample (train.skip_first_sample: true)"],
     {"oom": True, "cause": "gpu_oom", "phase": "environment", "trainer": "lora_train", "model_family": "flux",
      "first_fix": "free_gpu"})

case("lora_train_guard_sometimes_fragmentation",
     ["lora-train run configs/wan_lora.yaml",
      "step 400/2000 | loss 0.0912 | lr 1.0e-04 | 9.1 s/it | mem 20.2/23.1 GiB",
      "[warning] oom-guard: OOM in phase train_step(step 412, bucket 832x480, batch 1) \u2014 fragmentation; action: empty cache and retry the step",
      "[warning] oom-guard: OOM in phase train_step(step 413, bucket 832x480, batch 1) \u2014 sometimes; action: remove the largest bucket 832"],
     {"oom": True, "cause": "gpu_oom", "phase": "later_steps", "step": 413, "trainer": "lora_train", "model_family": "wan"})

case("lora_train_guard_host_ram",
     ["lora-train run configs/flux_lora.yaml",
      "[error] oom-guard: host RAM exhausted in phase cache(step 0, bucket 0x0, batch 0); action: give up: host RAM is exhausted, not device memory (std::bad_alloc); cache latents to disk, use fewer data workers or a machine with more RAM"],
     {"oom": False, "cause": "host_oom", "phase": "load", "trainer": "lora_train"})

# A run the guard rescued, in lora-train's console format (src/util/log.cpp: level letter, time):
# the OOM line, the guard's summary at the end (src/memory/guard.cpp summary()) and "done:".
case("lora_train_guard_recovered_finished",
     ["I 10:15:01 lora-train 0.1.0 (LibTorch 2.5.1): run runs/sdxl_lora in /work",
      "I 10:15:09 training 1000 steps from step 1; memory settings: checkpointing off, batch 4 x accumulation 1, buckets [512,768,1024], samples 1024x1024/20 steps",
      "step 2/1000 | loss 0.1311 | lr 1.0e-04 | 2.2 s/it | mem 21.9/23.4 GiB",
      "W 10:15:20 oom-guard: OOM in phase train_step(step 3, bucket 1024x1024, batch 4) \u2014 early_steps; action: train.gradient_checkpointing: false -> true",
      "I 10:15:20 oom-guard:   evidence: the first steps fail in backward; at the failure 22.10 GiB allocated, after cleanup 14.02 GiB",
      "step 1000/1000 | loss 0.0712 | lr 1.0e-04 | 2.9 s/it | mem 15.1/17.8 GiB",
      "I 10:54:02 the settings that worked: runs/sdxl_lora/effective.yaml",
      "I 10:54:02 oom-guard: 1 OOM handled, 1 configuration change",
      "I 10:54:02 oom-guard:   #1 train_step(step 3, bucket 1024x1024, batch 4) early_steps -> train.gradient_checkpointing: false -> true",
      "I 10:54:02 oom-guard: settings now: checkpointing on, batch 4 x accumulation 1, buckets [512,768,1024], samples 1024x1024/20 steps",
      "I 10:54:02 oom-guard: peak memory per phase on cuda:0:",
      "I 10:54:03 done: runs/sdxl_lora/sdxl_lora.safetensors (1000 steps)"],
     {"oom": True, "cause": "gpu_oom", "phase": "early_steps", "step": 3, "trainer": "lora_train",
      "model_family": "sdxl", "recovered": True, "first_fix": None})

# ------------------------------------------------------------------------------------------------
# Look-alikes and edge cases
case("windows_paging_file_host_oom",
     ["Traceback (most recent call last):", '  File "<string>", line 1, in <module>',
      '  File "C:\\Python310\\lib\\multiprocessing\\spawn.py", line 116, in spawn_main',
      "OSError: [WinError 1455] The paging file is too small for this operation to complete. Error loading "
      "\"C:\\kohya_ss\\venv\\lib\\site-packages\\torch\\lib\\cudnn_adv_infer64_8.dll\" or one of its dependencies."],
     {"oom": False, "cause": "host_oom"}, crlf=True)

case("xid_gpu_fault", ["steps:  12%|█▏        | 190/1600 [05:31<40:52,  1.74s/it, avr_loss=0.0812]",
                       "[ 8123.551210] NVRM: Xid (PCI:0000:01:00): 79, pid=2811, GPU has fallen off the bus.",
                       "RuntimeError: CUDA error: unspecified launch failure"],
     {"oom": False, "cause": "gpu_fault"})

case("other_keyerror", ["running training / 学習開始", "Traceback (most recent call last):",
                        '  File "/sd-scripts/train_network.py", line 900, in train', "    x = batch['latents']",
                        "KeyError: 'latents'"],
     {"oom": False, "cause": "other"})

case("clean_run_no_error", ["running training / 学習開始", ksteps(0, 1), ksteps(1, 100, 100),
                            "saving checkpoint: /data/out/last.safetensors", "model saved."],
     {"oom": False, "cause": "none"})

case("bare_pasted_oom_old_format",
     ["RuntimeError: CUDA out of memory. Tried to allocate 58.00 MiB (GPU 0; 6.00 GiB total capacity; 5.23 GiB already "
      "allocated; 0 bytes free; 5.30 GiB reserved in total by PyTorch)"],
     {"oom": True, "cause": "gpu_oom", "tried_to_allocate": 58 * MiB})

case("cublas_alloc_failed_conservative",
     ait(batch=1, gc="true") + ["Loading transformer", "Quantizing transformer",
                                "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"],
     {"oom": True, "cause": "gpu_oom", "phase": "environment", "trainer": "ai_toolkit", "first_fix": "free_gpu"})

case("mps_oom_macos",
     ["python run.py config/train_lora_flux.yaml", "Loading transformer", ait_train_bar(0, 2),
      "RuntimeError: MPS backend out of memory (MPS allocated: 17.83 GB, other allocations: 1.31 GB, max allowed: 18.13 GB). "
      "Tried to allocate 1024.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations (may cause system failure)."],
     {"oom": True, "cause": "gpu_oom", "phase": "early_steps", "tried_to_allocate": 1024 * MiB})


def main():
    for name, lines, expect, crlf in CASES:
        nl = "\r\n" if crlf else "\n"
        text = nl.join(lines) + nl
        with open(os.path.join(HERE, name + ".log"), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        with open(os.path.join(HERE, name + ".expected.json"), "w", encoding="utf-8") as f:
            json.dump(expect, f, indent=2, ensure_ascii=False)
            f.write("\n")
    print(f"{len(CASES)} cases written to {HERE}")


if __name__ == "__main__":
    main()
