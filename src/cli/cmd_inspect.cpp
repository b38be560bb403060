// lora-train inspect FILE|FOLDER: what a checkpoint or LoRA file holds.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "commands.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/lora/format.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/registry.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::cli {

namespace {

std::string human_count(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f} M", n / 1e6);
  if (n >= 1'000) return fmt::format("{:.1f} K", n / 1e3);
  return std::to_string(n);
}

void print_detection(const models::Detection& d) {
  std::cout << fmt::format("family:  {}\nformat:  {}\nbecause: {}\n", (d.is_lora() ? "lora" : playbook::to_string(d.family)),
                           models::format_name(d.format), d.evidence);
  int64_t total = 0;
  for (const auto& c : d.components) {
    std::string dtypes;
    for (const auto& [name, count] : c.dtypes) dtypes += fmt::format("{}{} x{}", dtypes.empty() ? "" : ", ", name, count);
    std::cout << fmt::format("  {:<14} {:>10} parameters in {:>5} tensors  [{}]{}\n", c.name, human_count(c.parameters),
                             c.tensors, dtypes, c.prefix.empty() ? "" : "  prefix " + printable(c.prefix));
    total += c.parameters;
  }
  std::cout << fmt::format("total:   {} parameters\n", human_count(total));
}

int inspect(const std::filesystem::path& target) {
  if (!std::filesystem::exists(target)) throw InputError(target.string() + ": no such file or folder");
  if (std::filesystem::is_directory(target)) {
    print_detection(models::detect_diffusers_folder(target));
    return 0;
  }
  auto file = io::SafetensorsFile::open(target);
  std::cout << fmt::format("file:    {} ({} tensors)\n", target.string(), file->tensors().size());
  auto detection = models::detect_checkpoint(*file);
  print_detection(detection);
  if (detection.is_lora()) {
    std::string text = lora::describe(lora::inspect_lora(*file));
    if (!text.empty() && text.back() != '\n') text += '\n';
    std::cout << text;
    return 0;  // describe() lists the training metadata itself
  } else if (detection.family == models::ModelFamily::kSD1 || detection.family == models::ModelFamily::kSD2) {
    // The configuration the weights imply (what `run` builds).
    for (const auto& c : detection.components) {
      if (c.name == "unet") {
        std::cout << "unet config: " << models::sd::UNetConfig::detect_from_weights(*file, c.prefix).to_json().dump() << "\n";
      } else if (c.name == "vae") {
        std::cout << "vae config:  " << models::sd::VAEConfig::detect_from_weights(*file, c.prefix).to_json().dump() << "\n";
      }
    }
  }
  if (!file->metadata().empty()) {
    std::cout << "metadata:\n";
    for (const auto& [k, v] : file->metadata()) {
      std::cout << fmt::format("  {}: {}\n", printable(k), printable(v, 117));
    }
  }
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, Action& chosen) {
  auto* sub = app.add_subcommand("inspect", "Show a checkpoint's or LoRA file's family, format, dtypes and sizes");
  auto target = std::make_shared<std::string>();
  sub->add_option("path", *target, "a .safetensors file or a diffusers folder")->required();
  sub->callback([&chosen, target] { chosen = [target] { return inspect(*target); }; });
}

}  // namespace lt::cli
