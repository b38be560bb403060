#include "loratrain/lora/format.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "loratrain/io/safetensors.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::lora {

namespace {

constexpr const char* kDown = ".lora_down.weight";
constexpr const char* kUp = ".lora_up.weight";
constexpr const char* kAlpha = ".alpha";
constexpr const char* kA = ".lora_A.weight";
constexpr const char* kB = ".lora_B.weight";
constexpr const char* kAdapterMetadata = "lora_adapter_metadata";
// LyCORIS' LoKr and LoHa weights, as ComfyUI and A1111/Forge read them (no ".weight" suffix).
constexpr const char* kProductParts[] = {"lokr_w1",   "lokr_w1_a", "lokr_w1_b", "lokr_w2",   "lokr_w2_a", "lokr_w2_b",
                                         "lokr_t2",   "hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1",
                                         "hada_t2"};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// Python's str(float) for the values kohya writes: "1.0", "0.5", "16.0".
std::string float_text(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < 1e15) return fmt::format("{:.1f}", v);
  return fmt::format("{}", v);
}

// kohya stems: lora_unet_..., lora_te_..., lora_te1_..., lora_transformer_...; PEFT: first segment.
// ComfyUI's `diffusion_model.` (musubi's Wan layout, either key style) is the transformer, as the
// PEFT names call it.
std::string component_of(const std::string& stem, LoRAFormat format) {
  if (starts_with(stem, "diffusion_model.")) return "transformer";
  if (format == LoRAFormat::PEFT) return stem.substr(0, stem.find('.'));
  for (const char* c : {"unet", "te1", "te2", "te3", "te", "transformer"}) {
    if (starts_with(stem, std::string("lora_") + c + "_")) return c;
  }
  return stem.substr(0, stem.find('_', stem.find('_') + 1));
}

// diffusers' lora_adapter_metadata: {"<component>.lora_alpha": a, "<component>.alpha_pattern": {...}}.
std::optional<double> peft_alpha(const nlohmann::json& meta, const std::string& stem) {
  if (!meta.is_object()) return std::nullopt;
  const size_t dot = stem.find('.');
  if (dot == std::string::npos) return std::nullopt;
  const std::string comp = stem.substr(0, dot);
  const std::string path = stem.substr(dot + 1);
  auto pattern = meta.find(comp + ".alpha_pattern");
  if (pattern != meta.end() && pattern->is_object()) {
    auto it = pattern->find(path);
    if (it != pattern->end() && it->is_number()) return it->get<double>();
  }
  auto alpha = meta.find(comp + ".lora_alpha");
  if (alpha != meta.end() && alpha->is_number()) return alpha->get<double>();
  return std::nullopt;
}

// The LoKr/LoHa part a key names ("<stem>.lokr_w1" -> "lokr_w1"), or empty.
std::string product_part(const std::string& key) {
  for (const char* part : kProductParts) {
    if (ends_with(key, std::string(".") + part)) return part;
  }
  return "";
}

std::vector<int64_t> part_shape(const LoRAFileModule& m, const std::string& part) {
  auto it = m.parts.find(part);
  return it == m.parts.end() ? std::vector<int64_t>{} : it->second;
}

// The rank ComfyUI and A1111 divide alpha by: LoHa's pair rank; LoKr's decomposed factor's
// (w2 wins), 0 when both factors are full matrices (then alpha is not used).
int64_t product_rank(const LoRAFileModule& m) {
  if (m.type == AdapterType::LoHa) {
    const auto b = part_shape(m, "hada_w1_b");
    return b.empty() ? 0 : b[0];
  }
  const auto w2b = part_shape(m, "lokr_w2_b");
  if (!w2b.empty()) return w2b[0];
  const auto w1b = part_shape(m, "lokr_w1_b");
  return w1b.empty() ? 0 : w1b[0];
}

// The leaf of `peft_name` in `components`: its spec and module path (nullptr when none owns it).
const ComponentSpec* owner_of(const std::vector<ComponentSpec>& components, const std::string& peft_name,
                              std::string* path) {
  for (const auto& c : components) {
    if (starts_with(peft_name, c.peft_prefix + ".")) {
      *path = peft_name.substr(c.peft_prefix.size() + 1);
      return &c;
    }
  }
  return nullptr;
}

std::optional<FusedFileModule> fused_of(const std::vector<ComponentSpec>& components, const LoRAModuleImpl& m) {
  if (m.type() != AdapterType::LoRA || m.is_conv()) return std::nullopt;
  std::string path;
  const ComponentSpec* spec = owner_of(components, m.peft_name, &path);
  if (!spec || !spec->kohya_fused_of) return std::nullopt;
  return spec->kohya_fused_of(path);
}

// `up` [sum(rows), sum(ranks)] holds its parts' ups on the diagonal and zeros elsewhere.
bool block_diagonal(const at::Tensor& up, const std::vector<int64_t>& rows, const std::vector<int64_t>& ranks) {
  at::Tensor rest = up.clone();
  int64_t row = 0, col = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    rest.narrow(0, row, rows[i]).narrow(1, col, ranks[i]).zero_();
    row += rows[i];
    col += ranks[i];
  }
  return rest.numel() == 0 || !rest.any().item<bool>();
}

// The ranks of a fused file module's parts: an even block-diagonal split of its rank (kohya's
// split_qkv layout, which this project writes), else every part shares the whole down (a kohya
// module trained on the fused weight).
std::vector<int64_t> fused_part_ranks(const at::Tensor& up, const std::vector<int64_t>& rows) {
  const auto n = static_cast<int64_t>(rows.size());
  const int64_t rank = up.size(1);
  if (n > 1 && rank % n == 0) {
    std::vector<int64_t> even(rows.size(), rank / n);
    if (block_diagonal(up, rows, even)) return even;
  }
  return std::vector<int64_t>(rows.size(), rank);
}

}  // namespace

std::string kohya_name(const std::string& kohya_prefix, const std::string& module_path) {
  std::string name = kohya_prefix + "." + module_path;
  std::replace(name.begin(), name.end(), '.', '_');
  return name;
}

std::string peft_name(const std::string& peft_prefix, const std::string& module_path) {
  return peft_prefix + "." + module_path;
}

std::optional<LoRAFormat> detect_lora_format(const io::SafetensorsFile& file) {
  bool peft = false;
  for (const auto& t : file.tensors()) {
    if (ends_with(t.name, kDown) || ends_with(t.name, kUp) || !product_part(t.name).empty()) return LoRAFormat::Kohya;
    if (ends_with(t.name, kA) || ends_with(t.name, kB)) peft = true;
  }
  if (peft) return LoRAFormat::PEFT;
  return std::nullopt;
}

std::vector<LoRAFileModule> read_lora_modules(const io::SafetensorsFile& file) {
  const auto format = detect_lora_format(file);
  if (!format) {
    throw InputError(file.path().string() + ": not a LoRA file (no .lora_down/.lora_up or .lora_A/.lora_B weights)");
  }
  nlohmann::json adapter_meta;
  if (auto it = file.metadata().find(kAdapterMetadata); it != file.metadata().end()) {
    adapter_meta = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  }
  std::vector<LoRAFileModule> modules;
  std::map<std::string, size_t> index;
  auto entry = [&](const std::string& stem) -> LoRAFileModule& {
    auto [it, inserted] = index.emplace(stem, modules.size());
    if (inserted) {
      modules.push_back({});
      modules.back().stem = stem;
      modules.back().component = component_of(stem, *format);
    }
    return modules[it->second];
  };
  const bool kohya = *format == LoRAFormat::Kohya;
  const std::string down = kohya ? kDown : kA;
  const std::string up = kohya ? kUp : kB;
  for (const auto& t : file.tensors()) {
    if (ends_with(t.name, down)) {
      entry(t.name.substr(0, t.name.size() - down.size())).down_shape = t.shape;
    } else if (ends_with(t.name, up)) {
      entry(t.name.substr(0, t.name.size() - up.size())).up_shape = t.shape;
    } else if (const std::string part = kohya ? product_part(t.name) : ""; !part.empty()) {
      LoRAFileModule& m = entry(t.name.substr(0, t.name.size() - part.size() - 1));
      m.type = part.compare(0, 4, "hada") == 0 ? AdapterType::LoHa : AdapterType::LoKr;
      m.parts[part] = t.shape;
    } else if (kohya && ends_with(t.name, kAlpha)) {
      entry(t.name.substr(0, t.name.size() - std::string(kAlpha).size())).alpha =
          file.load(t.name, at::kFloat).reshape({}).item<double>();
    }
  }
  if (!kohya) {
    for (auto& m : modules) m.alpha = peft_alpha(adapter_meta, m.stem);
  }
  return modules;
}

std::map<std::string, ModuleDims> module_dims_from_file(const io::SafetensorsFile& file,
                                                        const std::vector<ComponentSpec>& components) {
  const auto format = detect_lora_format(file);
  std::map<std::string, ModuleDims> dims;
  for (const auto& m : read_lora_modules(file)) {
    if (m.type != AdapterType::LoRA) {
      ModuleDims d;
      d.type = m.type;
      d.rank = product_rank(m);
      d.alpha = m.alpha.value_or(static_cast<double>(d.rank));
      d.tucker = m.parts.count("lokr_t2") > 0 || m.parts.count("hada_t1") > 0;
      if (m.type == AdapterType::LoKr) {
        const auto w1 = part_shape(m, "lokr_w1"), w1a = part_shape(m, "lokr_w1_a"), w1b = part_shape(m, "lokr_w1_b");
        if (w1.size() >= 2) {
          d.lokr.out_l = w1[0];
          d.lokr.in_m = w1[1];
        } else if (w1a.size() == 2 && w1b.size() == 2) {
          d.lokr.out_l = w1a[0];
          d.lokr.in_m = w1b[1];
          d.lokr.w1_rank = w1b[0];
        } else {
          continue;  // no w1: inspect reports it, loading reports the module missing
        }
        const auto w2b = part_shape(m, "lokr_w2_b");
        if (!w2b.empty()) d.lokr.w2_rank = w2b[0];
      }
      dims[m.stem] = d;
      continue;
    }
    if (m.down_shape.empty()) continue;
    std::string name;
    if (*format == LoRAFormat::Kohya) {
      name = m.stem;
      // A fused module (Flux's lora_unet_double_blocks_0_img_attn_qkv): one entry per part.
      bool fused = false;
      for (const auto& c : components) {
        if (!c.kohya_fused_parts || m.up_shape.size() != 2 || m.down_shape.size() != 2) continue;
        const auto parts = c.kohya_fused_parts(m.stem, m.up_shape[0], m.down_shape[1]);
        if (parts.empty()) continue;
        std::vector<int64_t> rows;
        for (const auto& p : parts) rows.push_back(p.second);
        const auto ranks = fused_part_ranks(file.load(m.stem + kUp, at::kFloat), rows);
        const double scale = m.alpha.value_or(static_cast<double>(m.down_shape[0])) / static_cast<double>(m.down_shape[0]);
        for (size_t i = 0; i < parts.size(); ++i) {
          ModuleDims d;
          d.rank = ranks[i];
          d.alpha = scale * static_cast<double>(ranks[i]);
          dims[c.kohya_name_of(parts[i].first)] = d;
        }
        fused = true;
      }
      if (fused) continue;
    } else {
      for (const auto& c : components) {
        if (starts_with(m.stem, c.peft_prefix + ".")) name = c.kohya_name_of(m.stem.substr(c.peft_prefix.size() + 1));
      }
      if (name.empty()) continue;
    }
    const int64_t rank = m.down_shape[0];
    ModuleDims d;
    d.rank = rank;
    d.alpha = m.alpha.value_or(static_cast<double>(rank));
    dims[name] = d;
  }
  return dims;
}

// ---------------------------------------------------------------------------------------------
// Save

std::vector<std::pair<std::string, at::Tensor>> LoRANetworkImpl::state_dict(LoRAFormat format,
                                                                              at::ScalarType dtype) const {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(modules_.size() * 3);
  // kohya: leaves that are parts of one module in kohya's own model (Flux's q, k, v of BFL's fused
  // qkv) are written as that module, when every part is adapted: the downs stacked, the ups on the
  // block diagonal, alpha such that alpha / (stacked rank) is the parts' scale. ComfyUI, diffusers
  // and kohya then apply exactly the trained update (kohya's own split_qkv keeps the parts' alpha,
  // which these tools read as a third of it).
  std::map<std::string, std::vector<const LoRAModuleImpl*>> groups;
  if (format == LoRAFormat::Kohya) {
    for (const auto& m : modules_) {
      if (auto f = fused_of(components_, *m)) {
        auto& g = groups[f->stem];
        g.resize(f->parts, nullptr);
        g[f->part] = m.get();
      }
    }
  }
  std::set<std::string> written;
  for (const auto& m : modules_) {
    const auto f = format == LoRAFormat::Kohya ? fused_of(components_, *m) : std::nullopt;
    if (f && std::count(groups.at(f->stem).begin(), groups.at(f->stem).end(), nullptr) == 0) {
      if (!written.insert(f->stem).second) continue;
      const auto& parts = groups.at(f->stem);
      int64_t rows = 0, rank = 0;
      bool same_scale = true;
      for (const auto* p : parts) {
        rows += p->lora_up.size(0);
        rank += p->rank;
        same_scale = same_scale && p->scale() == parts[0]->scale();
      }
      at::Tensor up = torch::zeros({rows, rank}, parts[0]->lora_up.options());
      std::vector<at::Tensor> downs;
      int64_t row = 0, col = 0;
      for (const auto* p : parts) {
        downs.push_back(p->lora_down.detach());
        const at::Tensor u = same_scale ? p->lora_up.detach() : p->lora_up.detach() * p->scale();
        up.narrow(0, row, u.size(0)).narrow(1, col, p->rank).copy_(u);
        row += u.size(0);
        col += p->rank;
      }
      const double alpha = (same_scale ? parts[0]->scale() : 1.0) * static_cast<double>(rank);
      out.emplace_back(f->stem + kDown, torch::cat(downs, 0).to(dtype));
      out.emplace_back(f->stem + kUp, up.to(dtype));
      out.emplace_back(f->stem + kAlpha, torch::full({}, alpha, torch::kFloat).to(dtype));
      continue;
    }
    if (format == LoRAFormat::Kohya) {
      for (const auto& [part, t] : m->file_parts()) out.emplace_back(m->lora_name + "." + part, t.detach().to(dtype));
      out.emplace_back(m->lora_name + kAlpha, torch::full({}, m->alpha, torch::kFloat).to(dtype));
    } else {
      if (m->type() != AdapterType::LoRA) {
        throw InputError(std::string("the PEFT/diffusers format holds LoRA adapters only, not ") + to_string(m->type()) +
                         "; save in the kohya layout (save.save_format: safetensors)");
      }
      // PEFT has no alpha tensor: fold alpha/rank into lora_B (in fp32, before the cast).
      out.emplace_back(m->peft_name + kA, m->lora_down.detach().to(dtype));
      out.emplace_back(m->peft_name + kB, (m->lora_up.detach() * m->scale()).to(dtype));
    }
  }
  return out;
}

std::map<std::string, std::string> LoRANetworkImpl::network_metadata(LoRAFormat format) const {
  std::map<std::string, std::string> meta;
  const bool lycoris = config_.type != AdapterType::LoRA;
  // kohya records LyCORIS networks as lycoris.kohya with their algo and options in the args.
  meta["ss_network_module"] = lycoris ? "lycoris.kohya" : "networks.lora";
  meta["ss_network_dim"] = std::to_string(config_.linear);
  meta["ss_network_alpha"] = float_text(config_.linear_alpha);
  if (config_.dropout > 0.0) meta["ss_network_dropout"] = float_text(config_.dropout);
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  if (lycoris) args["algo"] = to_string(config_.type);
  if (config_.type == AdapterType::LoKr) {
    args["factor"] = std::to_string(config_.lokr_factor);
    if (config_.lokr_full_rank) args["full_matrix"] = "True";
    if (config_.lokr_decompose_both) args["decompose_both"] = "True";
  }
  if (config_.conv) {
    args["conv_dim"] = std::to_string(*config_.conv);
    args["conv_alpha"] = float_text(config_.conv_alpha.value_or(static_cast<double>(*config_.conv)));
  }
  if (!config_.only_if_contains.empty()) args["only_if_contains"] = config_.only_if_contains;
  if (!config_.ignore_if_contains.empty()) args["ignore_if_contains"] = config_.ignore_if_contains;
  if (!args.empty()) meta["ss_network_args"] = args.dump();
  if (format == LoRAFormat::PEFT) {
    // Folded weights need scale 1 in every tool: lora_alpha = r for every module. diffusers takes
    // the most common rank as `r` and lists the others in rank_pattern; alpha_pattern mirrors it.
    nlohmann::ordered_json adapter = nlohmann::ordered_json::object();
    for (const auto& spec : components_) {
      std::map<int64_t, size_t> rank_count;
      std::vector<const LoRAModuleImpl*> mine;
      for (const auto& m : modules_) {
        if (starts_with(m->peft_name, spec.peft_prefix + ".")) {
          mine.push_back(m.get());
          ++rank_count[m->rank];
        }
      }
      if (mine.empty()) continue;
      const int64_t common = std::max_element(rank_count.begin(), rank_count.end(), [](auto& a, auto& b) {
                               return a.second < b.second;
                             })->first;
      nlohmann::ordered_json rank_pattern = nlohmann::ordered_json::object();
      std::vector<std::string> targets;
      for (const auto* m : mine) {
        const std::string path = m->peft_name.substr(spec.peft_prefix.size() + 1);
        targets.push_back(path);
        if (m->rank != common) rank_pattern[path] = m->rank;
      }
      const std::string p = spec.peft_prefix + ".";
      adapter[p + "r"] = common;
      adapter[p + "lora_alpha"] = common;
      adapter[p + "rank_pattern"] = rank_pattern;
      adapter[p + "alpha_pattern"] = rank_pattern;
      adapter[p + "target_modules"] = targets;
      adapter[p + "lora_dropout"] = config_.dropout;
      adapter[p + "init_lora_weights"] = true;
      adapter[p + "use_dora"] = false;
    }
    meta[kAdapterMetadata] = adapter.dump();
  }
  return meta;
}

void LoRANetworkImpl::save(const std::filesystem::path& path, const SaveOptions& options) const {
  if (modules_.empty()) throw Error(ExitCode::kRuntime, "LoRA network has no modules to save");
  std::map<std::string, std::string> meta = options.metadata;
  for (auto& [k, v] : network_metadata(options.format)) meta[k] = v;
  io::save_safetensors(path, state_dict(options.format, options.dtype), meta);
}

// ---------------------------------------------------------------------------------------------
// Load

LoadReport LoRANetworkImpl::load_weights(const io::SafetensorsFile& file, bool strict) {
  LoadReport report;
  const auto format = detect_lora_format(file);
  if (!format) throw InputError(file.path().string() + ": not a LoRA file");
  report.format = *format;
  const bool kohya = *format == LoRAFormat::Kohya;
  std::map<std::string, LoRAFileModule> by_stem;
  for (auto& m : read_lora_modules(file)) by_stem.emplace(m.stem, m);

  std::vector<std::string> mismatched;
  std::vector<std::pair<LoRAModuleImpl*, const LoRAFileModule*>> matches;
  std::set<std::string> used;
  // Leaves the file holds as parts of fused modules (kohya's Flux qkv / linear1), by file stem.
  std::map<std::string, std::vector<LoRAModuleImpl*>> fused;
  for (auto& m : modules_) {
    const std::string& stem = kohya ? m->lora_name : m->peft_name;
    auto it = by_stem.find(stem);
    if (it == by_stem.end() && kohya) {
      if (auto f = fused_of(components_, *m); f && by_stem.count(f->stem)) {
        auto& g = fused[f->stem];
        g.resize(f->parts, nullptr);
        g[f->part] = m.get();
        used.insert(f->stem);
        continue;
      }
    }
    if (it == by_stem.end()) {
      report.missing.push_back(stem);
      continue;
    }
    used.insert(stem);
    const auto& f = it->second;
    if (m->type() != AdapterType::LoRA || f.type != AdapterType::LoRA) {
      std::map<std::string, std::vector<int64_t>> mine;
      for (const auto& [part, t] : m->file_parts()) mine[part] = t.sizes().vec();
      if (f.type != m->type() || f.parts != mine) {
        auto text = [](const std::map<std::string, std::vector<int64_t>>& parts) {
          std::string s;
          for (const auto& [k, v] : parts) s += (s.empty() ? "" : " ") + k + " " + c10::str(at::IntArrayRef(v));
          return s.empty() ? std::string("lora") : s;
        };
        mismatched.push_back(stem + ": file " + text(f.parts) + ", network " + text(mine));
        continue;
      }
      matches.emplace_back(m.get(), &f);
      continue;
    }
    if (f.down_shape != m->lora_down.sizes().vec() || f.up_shape != m->lora_up.sizes().vec()) {
      mismatched.push_back(stem + ": file down " + c10::str(at::IntArrayRef(f.down_shape)) + " up " +
                           c10::str(at::IntArrayRef(f.up_shape)) + ", network down " + c10::str(m->lora_down.sizes()) +
                           " up " + c10::str(m->lora_up.sizes()));
      continue;
    }
    matches.emplace_back(m.get(), &f);
  }
  for (const auto& [stem, f] : by_stem) {
    if (!used.count(stem)) report.unexpected.push_back(printable(stem));
  }
  // Each fused file module split into its parts: (module, down, up, alpha).
  struct FusedPart {
    LoRAModuleImpl* module;
    at::Tensor down, up;
    double alpha;
  };
  std::vector<FusedPart> fused_parts;
  for (const auto& [stem, parts] : fused) {
    const LoRAFileModule& f = by_stem.at(stem);
    if (std::count(parts.begin(), parts.end(), nullptr) > 0) {
      mismatched.push_back(stem + ": a fused module, but this network adapts only some of its parts");
      continue;
    }
    const at::Tensor down = file.load(stem + kDown, at::kFloat);
    const at::Tensor up = file.load(stem + kUp, at::kFloat);
    std::vector<int64_t> rows, ranks;
    int64_t rank_sum = 0;
    bool dense = true;
    for (const auto* p : parts) {
      rows.push_back(p->lora_up.size(0));
      ranks.push_back(p->rank);
      rank_sum += p->rank;
      dense = dense && p->rank == down.size(0);
    }
    const int64_t file_rank = down.size(0);
    const bool shapes_fit = down.dim() == 2 && up.dim() == 2 && up.size(1) == file_rank &&
                            up.size(0) == std::accumulate(rows.begin(), rows.end(), int64_t{0}) &&
                            down.size(1) == parts[0]->lora_down.size(1);
    const bool split = shapes_fit && rank_sum == file_rank && (parts.size() == 1 || block_diagonal(up, rows, ranks));
    if (!shapes_fit || (!split && !dense)) {
      mismatched.push_back(stem + ": file down " + c10::str(down.sizes()) + " up " + c10::str(up.sizes()) +
                           ", network parts of rank " + c10::str(at::IntArrayRef(ranks)) + " and rows " +
                           c10::str(at::IntArrayRef(rows)));
      continue;
    }
    const double scale = f.alpha.value_or(static_cast<double>(file_rank)) / static_cast<double>(file_rank);
    int64_t row = 0, col = 0;
    for (auto* p : parts) {
      FusedPart fp{p, split ? down.narrow(0, col, p->rank) : down,
                   up.narrow(0, row, p->lora_up.size(0)).narrow(1, split ? col : 0, p->rank),
                   scale * static_cast<double>(p->rank)};
      fused_parts.push_back(fp);
      row += p->lora_up.size(0);
      col += p->rank;
    }
  }
  const bool fail = !mismatched.empty() || (strict && (!report.missing.empty() || !report.unexpected.empty()));
  if (fail) {
    std::string msg = file.path().string() + " does not match the LoRA network:";
    auto list = [&msg](const char* what, const std::vector<std::string>& items) {
      if (items.empty()) return;
      msg += fmt::format("\n  {} {}:", items.size(), what);
      for (size_t i = 0; i < items.size() && i < 10; ++i) msg += "\n    " + items[i];
      if (items.size() > 10) msg += fmt::format("\n    ... and {} more", items.size() - 10);
    };
    list("with different shapes", mismatched);
    if (strict) {
      list("network modules missing from the file", report.missing);
      list("file modules the network does not have", report.unexpected);
    }
    throw InputError(msg);
  }
  torch::NoGradGuard no_grad;
  for (const auto& fp : fused_parts) {
    fp.module->lora_down.copy_(fp.down.to(fp.module->lora_down.device()));
    fp.module->lora_up.copy_(fp.up.to(fp.module->lora_up.device()));
    fp.module->alpha = fp.alpha;
    ++report.loaded;
  }
  const std::string down = kohya ? kDown : kA;
  const std::string up = kohya ? kUp : kB;
  for (auto [m, f] : matches) {
    if (m->type() != AdapterType::LoRA) {
      for (auto& [part, t] : m->file_parts()) t.copy_(file.load(f->stem + "." + part, at::kFloat).to(t.device()));
      if (f->alpha) m->alpha = *f->alpha;
      ++report.loaded;
      continue;
    }
    m->lora_down.copy_(file.load(f->stem + down, at::kFloat).to(m->lora_down.device()));
    at::Tensor u = file.load(f->stem + up, at::kFloat).to(m->lora_up.device());
    if (kohya) {
      if (f->alpha) m->alpha = *f->alpha;
    } else {
      // Unfold: the file means (alpha_file / rank) * B; this module applies scale() * up.
      const double file_scale = f->alpha.value_or(static_cast<double>(m->rank)) / static_cast<double>(m->rank);
      const double factor = file_scale / m->scale();
      if (factor != 1.0) u = u * factor;
    }
    m->lora_up.copy_(u);
    ++report.loaded;
  }
  return report;
}

std::map<std::string, std::string> kohya_base_model_metadata(const std::string& family, bool v_prediction) {
  std::map<std::string, std::string> m;
  m["modelspec.sai_model_spec"] = "1.0.1";
  if (family == "sd1") {
    m["ss_v2"] = "False";
    m["ss_base_model_version"] = "sd_v1";
    m["modelspec.architecture"] = "stable-diffusion-v1/lora";
    m["modelspec.implementation"] = "diffusers";
    m["modelspec.resolution"] = "512x512";
  } else if (family == "sd2") {
    m["ss_v2"] = "True";
    m["ss_base_model_version"] = v_prediction ? "sd_v2_v" : "sd_v2";
    m["modelspec.architecture"] = std::string(v_prediction ? "stable-diffusion-v2-768-v" : "stable-diffusion-v2-512") + "/lora";
    m["modelspec.implementation"] = "diffusers";
    m["modelspec.resolution"] = v_prediction ? "768x768" : "512x512";
  } else if (family == "sdxl") {
    m["ss_v2"] = "False";
    m["ss_base_model_version"] = "sdxl_base_v1-0";
    m["modelspec.architecture"] = "stable-diffusion-xl-v1-base/lora";
    m["modelspec.implementation"] = "https://github.com/Stability-AI/generative-models";
    m["modelspec.resolution"] = "1024x1024";
  } else if (family == "flux" || family == "flux_schnell") {
    // kohya's flux_train_network: one base-model version for both, the variant in modelspec.
    m["ss_base_model_version"] = "flux1";
    m["modelspec.architecture"] = std::string(family == "flux" ? "flux-1-dev" : "flux-1-schnell") + "/lora";
    m["modelspec.implementation"] = "https://github.com/black-forest-labs/flux";
    m["modelspec.resolution"] = "1024x1024";
    return m;
  } else if (family == "wan21_1.3b" || family == "wan21_14b") {
    // musubi-tuner's sai_model_spec names the Wan 2.1 task and size in the architecture.
    m["ss_base_model_version"] = "wan21";
    m["modelspec.architecture"] = std::string(family == "wan21_14b" ? "wan2.1-t2v-14b" : "wan2.1-t2v-1.3b") + "/lora";
    m["modelspec.implementation"] = "https://github.com/Wan-Video/Wan2.1";
    m["modelspec.resolution"] = "832x480";
    return m;
  } else {
    throw InputError("no kohya base-model metadata for the '" + family + "' family");
  }
  m["modelspec.prediction_type"] = v_prediction ? "v" : "epsilon";
  return m;
}

// ---------------------------------------------------------------------------------------------
// Inspect

LoRAFileInfo inspect_lora(const io::SafetensorsFile& file) {
  LoRAFileInfo info;
  const auto modules = read_lora_modules(file);  // throws when the file is not a LoRA
  info.format = *detect_lora_format(file);
  std::set<std::string> dtypes;
  for (const auto& t : file.tensors()) {
    if ((ends_with(t.name, ".weight") && t.name.find(".lora_") != std::string::npos) || !product_part(t.name).empty())
      dtypes.insert(io::dtype_name(t.dtype));
  }
  info.dtype = dtypes.size() == 1 ? *dtypes.begin() : (dtypes.empty() ? "" : "mixed");
  for (const auto& m : modules) {
    ++info.types[to_string(m.type)];
    if (m.type != AdapterType::LoRA) {
      const bool lokr = m.type == AdapterType::LoKr;
      const bool has_w1 = lokr ? (m.parts.count("lokr_w1") || (m.parts.count("lokr_w1_a") && m.parts.count("lokr_w1_b")))
                               : (m.parts.count("hada_w1_a") && m.parts.count("hada_w1_b"));
      const bool has_w2 = lokr ? (m.parts.count("lokr_w2") || (m.parts.count("lokr_w2_a") && m.parts.count("lokr_w2_b")))
                               : (m.parts.count("hada_w2_a") && m.parts.count("hada_w2_b"));
      if (!has_w1 || !has_w2) {
        info.problems.push_back(printable(m.stem) + ": incomplete " + to_string(m.type) + " weights (no " +
                                (has_w1 ? "w2" : "w1") + ")");
        --info.types[to_string(m.type)];
        continue;
      }
      ++info.modules;
      ++info.modules_by_component[m.component];
      ++info.ranks[product_rank(m)];
      if (m.alpha) {
        ++info.alphas[*m.alpha];
      } else {
        ++info.modules_without_alpha;
      }
      const auto w2 = part_shape(m, "lokr_w2");
      if ((w2.size() == 4 && (w2[2] > 1 || w2[3] > 1)) || m.parts.count("lokr_t2") || m.parts.count("hada_t1")) ++info.conv_modules;
      continue;
    }
    if (m.down_shape.empty() || m.up_shape.empty()) {
      info.problems.push_back(printable(m.stem) + ": " + (m.down_shape.empty() ? "no down/A weight" : "no up/B weight"));
      continue;
    }
    const int64_t rank = m.down_shape[0];
    if (m.up_shape.size() < 2 || m.up_shape[1] != rank) {
      info.problems.push_back(fmt::format("{}: rank mismatch (down {}, up {})", printable(m.stem), rank,
                                          m.up_shape.size() >= 2 ? m.up_shape[1] : -1));
    }
    ++info.modules;
    ++info.modules_by_component[m.component];
    ++info.ranks[rank];
    if (m.alpha) {
      ++info.alphas[*m.alpha];
    } else {
      ++info.modules_without_alpha;
    }
    if (m.down_shape.size() == 4 && (m.down_shape[2] > 1 || m.down_shape[3] > 1)) ++info.conv_modules;
  }
  for (const auto& [k, v] : file.metadata()) {
    if (starts_with(k, "ss_") || starts_with(k, "modelspec.")) info.training[k] = v;
  }
  return info;
}

std::string describe(const LoRAFileInfo& info) {
  auto counts = [](const auto& map, auto fmt_key) {
    std::string s;
    for (const auto& [k, n] : map) s += (s.empty() ? "" : ", ") + printable(fmt_key(k)) + " (" + std::to_string(n) + ")";
    return s;
  };
  std::string kind;
  for (const auto& [type, n] : info.types) {
    if (n == 0) continue;
    const std::string name = type == "lokr" ? "LoKr" : (type == "loha" ? "LoHa" : "LoRA");
    kind += (kind.empty() ? "" : " + ") + name;
  }
  if (kind.empty()) kind = "LoRA";
  std::string out = fmt::format("{}, {} format: {} modules", kind, info.format == LoRAFormat::Kohya ? "kohya" : "PEFT/diffusers",
                                info.modules);
  out += " [" + counts(info.modules_by_component, [](const std::string& k) { return k; }) + "]";
  if (!info.dtype.empty()) out += ", " + info.dtype;
  // Rank 0: a LoKr module whose factors are both full matrices.
  out += "\n  rank: " + counts(info.ranks, [](int64_t k) { return k == 0 ? std::string("full") : std::to_string(k); });
  if (!info.alphas.empty()) out += "\n  alpha: " + counts(info.alphas, [](double k) { return float_text(k); });
  if (info.modules_without_alpha > 0) {
    out += fmt::format("\n  {} module(s) without alpha{}", info.modules_without_alpha,
                       info.format == LoRAFormat::Kohya ? " (ComfyUI/A1111 then use scale 1.0, diffusers differs)"
                                                        : " (alpha folded into lora_B or PEFT default)");
  }
  if (info.conv_modules > 0) out += fmt::format("\n  conv (LoCon) modules: {}", info.conv_modules);
  for (const char* key : {"ss_base_model_version", "ss_output_name", "ss_steps", "ss_learning_rate", "ss_optimizer",
                          "ss_training_started_at"}) {
    auto it = info.training.find(key);
    if (it != info.training.end()) out += fmt::format("\n  {}: {}", key, printable(it->second));
  }
  for (const auto& p : info.problems) out += "\n  problem: " + p;
  return out;
}

}  // namespace lt::lora
