#include "advice.h"

#include <algorithm>
#include <string>

namespace lt::diagnose::detail {
namespace {

const std::string kTriedPrefix = "Already tried: ";

const char* look_alike_advice(Cause c) {
  switch (c) {
    case Cause::kHostOom:
      return "System RAM ran out (the OS killed the process), not GPU memory: cache latents/text embeddings to "
             "disk, lower dataloader workers, load fp8/quantized checkpoints, add RAM or swap (Windows: enlarge "
             "the paging file).";
    case Cause::kDataLoaderWorker:
      return "A DataLoader worker died: lower the number of workers (or 0), enlarge /dev/shm (docker --shm-size), "
             "check host RAM.";
    case Cause::kNanLoss:
      return "The loss became NaN/inf: lower the learning rate, use bf16 instead of fp16, keep the VAE in fp32 "
             "(--no_half_vae for SDXL), check the dataset for broken images.";
    case Cause::kGpuFault:
      return "A GPU fault (illegal access, launch failure, Xid): not memory. Check driver, power and temperature, "
             "update the driver, try without custom kernels (xformers/flash/sage).";
    case Cause::kMissingFile:
      return "A file, model or dataset could not be found or read: check the paths in the config and that "
             "downloads are complete (re-download a truncated .safetensors).";
    case Cause::kVersionMismatch:
      return "A package or model version mismatch: reinstall the trainer's pinned requirements (torch, diffusers, "
             "transformers, bitsandbytes, xformers) and check the model variant.";
    default: return nullptr;
  }
}

}  // namespace

void add_tried_notes(Diagnosis& d) {
  d.notes.erase(std::remove_if(d.notes.begin(), d.notes.end(),
                               [](const std::string& n) { return n.rfind(kTriedPrefix, 0) == 0; }),
                d.notes.end());
  if (!d.oom) return;
  for (const TriedLever& t : d.tried) {
    std::string note = kTriedPrefix + t.setting + " was on in this run, so it is not recommended again";
    if (!t.price.empty()) note += " (the OOM guard's " + t.price + ")";
    d.notes.push_back(note + ".");
  }
}

void add_advice(Diagnosis& d) {
  if (d.recovered) {
    const Recovery& r = d.recovery;
    std::string note = "The run recovered: the OOM guard handled " + std::to_string(r.oom_events) + " OOM" +
                       (r.oom_events == 1 ? "" : "s") + " and training finished";
    if (r.steps) note += " (" + std::to_string(*r.steps) + " steps)";
    note += ". Nothing to fix; start the next run with the settings it ended on";
    if (!r.final_settings.empty()) note += " (" + r.final_settings + ")";
    if (!r.effective_config.empty()) note += ": " + r.effective_config;
    d.notes.push_back(note + ".");
    return;
  }
  add_tried_notes(d);
  if (d.oom && d.phase == Phase::kEarlySteps && d.step && *d.step == 1 && d.kind != ModelKind::kVideo)
    d.notes.push_back("It died on step 1: the forward pass fits but the gradients do not. Turn on gradient "
                      "checkpointing AND lower the resolution together, not one at a time.");
  if (const char* advice = look_alike_advice(d.cause)) d.notes.push_back(advice);
}

}  // namespace lt::diagnose::detail
