// The parity harness's runner registry. A runner builds the model a case's meta.json names (its
// `class`), loads the case's weights, runs the inputs of io.safetensors (`in.*`) and returns the
// outputs under the reference's names (`out.*`). Each family adds a parity_<family>.cpp to the
// test_parity executable with a static RunnerRegistrar per class it implements.
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "loratrain/io/safetensors.h"

namespace lt::test::parity {

struct Case {
  std::filesystem::path dir;
  std::string name;                          // path relative to the parity root, e.g. "schedulers/ddim"
  nlohmann::json meta;                       // meta.json
  nlohmann::json config;                     // config.json (null when the case has none)
  std::shared_ptr<io::SafetensorsFile> io;   // io.safetensors: in.* and out.*

  bool has_input(const std::string& name) const { return io->contains(name); }
  at::Tensor input(const std::string& name) const;           // throws when absent
  bool has_file(const std::string& file) const { return std::filesystem::exists(dir / file); }
  std::shared_ptr<io::SafetensorsFile> open(const std::string& file) const;
};

using Outputs = std::map<std::string, at::Tensor>;

// One way of running a case (e.g. "weights.safetensors" and "weights_ldm.safetensors"); each pass's
// outputs are compared with every out.* of the case.
struct Pass {
  std::string label;
  Outputs outputs;
};

using Runner = std::function<std::vector<Pass>(const Case&)>;

// Thrown by a runner whose case cannot run on this machine (e.g. it needs the CLIP vocabulary, which
// is kept outside the project): the case is reported as skipped, with the message.
struct SkipCase : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void register_runner(const std::string& class_name, Runner runner);
const Runner* find_runner(const std::string& class_name);

struct RunnerRegistrar {
  RunnerRegistrar(const std::string& class_name, Runner runner) { register_runner(class_name, std::move(runner)); }
};

}  // namespace lt::test::parity
