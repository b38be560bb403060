// Parity runners for the text encoders (transformers CLIPTextModel, CLIPTextModelWithProjection,
// T5EncoderModel, UMT5EncoderModel) and transformers' slow CLIPTokenizer.
#include <torch/torch.h>

#include <fstream>

#include "loratrain/models/attention.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/models/text/clip_tokenizer.h"
#include "loratrain/models/text/t5.h"
#include "loratrain/models/text/t5_checkpoint.h"
#include "models/parity_runners.h"
#include "test_paths.h"

namespace lt::test::parity {
namespace {

using namespace lt::models;

// The call in meta.json: model(input_ids, output_hidden_states=True) and its named outputs.
Outputs clip_outputs(const CLIPTextOutput& o, bool projection) {
  Outputs out{{"out.last_hidden_state", o.last_hidden_state},
              {"out.penultimate_hidden_state", o.hidden_states.at(o.hidden_states.size() - 2)}};
  if (projection) {
    out["out.text_embeds"] = o.text_embeds;
  } else {
    out["out.pooler_output"] = o.pooler_output;
  }
  for (size_t i = 0; i < o.hidden_states.size(); ++i) out["out.hidden_states." + std::to_string(i)] = o.hidden_states[i];
  return out;
}

template <typename Model>
std::vector<Pass> run_clip(const Case& c, bool projection) {
  Model model(CLIPTextConfig::from_json(c.config, (c.dir / "config.json").string()));
  model->eval();
  load_state_dict(*model, *c.open("weights.safetensors"), clip_text_load_options());
  std::optional<at::Tensor> mask;
  if (c.has_input("in.attention_mask")) mask = c.input("in.attention_mask");
  return {{"weights.safetensors", clip_outputs(model->forward(c.input("in.input_ids"), true, mask), projection)}};
}

const RunnerRegistrar clip_text_runner("CLIPTextModel",
                                       [](const Case& c) { return run_clip<CLIPTextModel>(c, false); });
const RunnerRegistrar clip_projection_runner("CLIPTextModelWithProjection", [](const Case& c) {
  return run_clip<CLIPTextModelWithProjection>(c, true);
});

// The call in meta.json: no mask (as Flux calls it), the tokenizer's mask, and 160 tokens (the
// log-spaced buckets and the max_distance clamp). Passes: the transformers folder's config with
// load_state_dict; the single-file path (config detected from the shapes); and attention in
// 5-row query chunks (the memory guard's setting).
Outputs t5_outputs(T5EncoderModel& model, const Case& c) {
  return {{"out.last_hidden_state", model(c.input("in.input_ids"))},
          {"out.last_hidden_state_masked", model(c.input("in.input_ids"), c.input("in.attention_mask"))},
          {"out.long.last_hidden_state", model(c.input("in.long.input_ids"))}};
}

// T5EncoderModel (one bias table, block 0's) and UMT5EncoderModel (one per block) run alike; the
// model type comes from config.json in the first pass and from the shapes in the second.
std::vector<Pass> run_t5(const Case& c) {
  std::vector<Pass> passes;
  auto weights = c.open("weights.safetensors");
  T5EncoderModel model(T5Config::from_json(c.config, (c.dir / "config.json").string()));
  load_state_dict(*model, *weights, t5_load_options(*weights));
  model->eval();
  passes.push_back({"weights.safetensors, config.json", t5_outputs(model, c)});

  T5EncoderModel detected = load_t5_encoder(c.dir / "weights.safetensors");
  passes.push_back({"weights.safetensors as a single file", t5_outputs(detected, c)});

  struct ChunkScope {
    int64_t saved = default_query_chunk();
    explicit ChunkScope(int64_t rows) { set_default_query_chunk(rows); }
    ~ChunkScope() { set_default_query_chunk(saved); }
  } chunks(5);
  passes.push_back({"query chunks of 5 rows", t5_outputs(model, c)});
  return passes;
}

const RunnerRegistrar t5_encoder_runner("T5EncoderModel", run_t5);
const RunnerRegistrar umt5_encoder_runner("UMT5EncoderModel", run_t5);

// The OpenAI vocabulary is not part of the project: the case folder may hold it (a parity root
// outside the project), else ../shared/fixtures/<case> does; without it the case is skipped.
std::filesystem::path find_vocabulary(const Case& c) {
  const std::string name = "bpe_simple_vocab_16e6.txt.gz";
  if (c.has_file(name)) return c.dir / name;
  if (auto shared = shared_dir()) {
    auto p = *shared / "fixtures" / c.name / name;
    if (std::filesystem::exists(p)) return p;
    p = *shared / "fixtures" / "clip_tokenizer" / name;
    if (std::filesystem::exists(p)) return p;
  }
  throw SkipCase("the CLIP vocabulary " + name + " is not available (kept in ../shared/fixtures/clip_tokenizer)");
}

at::Tensor stack_rows(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<at::Tensor> t;
  for (const auto& r : rows) t.push_back(torch::tensor(r, torch::kLong));
  return torch::stack(t);
}

// tok(captions, padding="max_length", max_length=model_max_length, truncation=True), once with the
// config's pad token and once with tokenizer_2's "!" pad.
const RunnerRegistrar clip_tokenizer_runner("CLIPTokenizer (slow, pure Python)", [](const Case& c) {
  const auto vocab = find_vocabulary(c);
  std::ifstream in(c.dir / "captions.json");
  const nlohmann::json captions = nlohmann::json::parse(in);
  CLIPTokenizerOptions options;
  options.pad_token = c.config.value("pad_token", options.pad_token);
  options.model_max_length = c.config.value("model_max_length", options.model_max_length);
  CLIPTokenizerOptions options2 = options;
  options2.pad_token = c.config.value("pad_token_tokenizer_2", std::string("!"));
  const CLIPTokenizer tok = CLIPTokenizer::from_openai_bpe(vocab, options);
  const CLIPTokenizer tok2 = CLIPTokenizer::from_openai_bpe(vocab, options2);

  std::vector<std::vector<int64_t>> ids, mask, ids0, mask0;
  std::vector<int64_t> counts;
  for (const auto& caption : captions) {
    const auto text = caption.at("text").get<std::string>();
    auto e = tok.encode_padded(text);
    auto e2 = tok2.encode_padded(text);
    ids.push_back(e.input_ids);
    mask.push_back(e.attention_mask);
    ids0.push_back(e2.input_ids);
    mask0.push_back(e2.attention_mask);
    counts.push_back(static_cast<int64_t>(tok.encode(text).size()));
  }
  Outputs out{{"out.input_ids", stack_rows(ids)},
              {"out.attention_mask", stack_rows(mask)},
              {"out.input_ids_pad0", stack_rows(ids0)},
              {"out.attention_mask_pad0", stack_rows(mask0)},
              {"out.num_tokens_untruncated", torch::tensor(counts, torch::kLong)}};
  return std::vector<Pass>{{vocab.filename().string(), out}};
});

}  // namespace
}  // namespace lt::test::parity
