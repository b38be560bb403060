// Model paths: local paths, and Hugging Face repo ids resolved in a fake local cache laid out as
// huggingface_hub leaves it (models--org--name/{refs/main, snapshots/<commit>/}).
#include <catch2/catch.hpp>

#include <fstream>
#include <thread>

#include "loratrain/config/model_path.h"
#include "loratrain/util/error.h"
#include "scoped_env.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace lt::config;

using lt::test::write_file;
using lt::test::input_error_of;

namespace {

// Only the cache variables this test sets are in effect.
void clear_cache_env(lt::test::ScopedEnv& env) {
  for (const char* v : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"}) env.set(v, std::nullopt);
}

}  // namespace

CATCH_TEST_CASE("what reads as a Hugging Face repo id", "[config][model_path]") {
  for (const char* id : {"black-forest-labs/FLUX.1-dev", "stabilityai/stable-diffusion-xl-base-1.0",
                         "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "ostris/FLUX.1-schnell-training-adapter", "a/b",
                         "stable-diffusion-v1-5/stable-diffusion-v1-5"}) {
    CATCH_INFO(id);
    CATCH_CHECK(looks_like_repo_id(id));
  }
  for (const char* not_id : {"model.safetensors", "/models/flux", "./org/name", "../org/name", "~/org/name",
                             "org/name/file.safetensors", "models/sd15.safetensors", "data/base.ckpt", "org/",
                             "/name", "org//name", "org/na me", "org--x/name", "org/name-", "org/.name", "org/a..b",
                             "C:\\models\\x"}) {
    CATCH_INFO(not_id);
    CATCH_CHECK_FALSE(looks_like_repo_id(not_id));
  }
  CATCH_CHECK_FALSE(looks_like_repo_id("org/" + std::string(100, 'x')));  // longer than 96
  // An existing local path is never a repo id.
  const fs::path dir = lt::test::scratch_dir("model_path_local");
  fs::create_directories(dir / "org" / "name");
  CATCH_CHECK_FALSE(looks_like_repo_id((dir / "org" / "name").string()));
}

CATCH_TEST_CASE("the cache root follows huggingface_hub's settings", "[config][model_path]") {
  lt::test::ScopedEnv env;
  clear_cache_env(env);
  env.set("HOME", "/home/u");
  CATCH_CHECK(hub_cache().root == fs::path("/home/u/.cache/huggingface/hub"));
  CATCH_CHECK(hub_cache().chosen_by.find("the default location") == 0);
  env.set("XDG_CACHE_HOME", "/xdg");
  CATCH_CHECK(hub_cache().root == fs::path("/xdg/huggingface/hub"));
  env.set("HF_HOME", "~/hf");
  CATCH_CHECK(hub_cache().root == fs::path("/home/u/hf/hub"));
  CATCH_CHECK(hub_cache().chosen_by == "HF_HOME");
  env.set("HUGGINGFACE_HUB_CACHE", "/legacy");
  CATCH_CHECK(hub_cache().root == fs::path("/legacy"));
  env.set("HF_HUB_CACHE", "/hub");
  CATCH_CHECK(hub_cache().root == fs::path("/hub"));
  CATCH_CHECK(hub_cache().chosen_by == "HF_HUB_CACHE");
  env.set("HF_HUB_CACHE", "");  // empty counts as unset
  CATCH_CHECK(hub_cache().root == fs::path("/legacy"));
}

CATCH_TEST_CASE("a repo id resolves to the snapshot refs/main names, without network", "[config][model_path]") {
  const fs::path hub = lt::test::scratch_dir("model_path_hub");
  lt::test::ScopedEnv env;
  clear_cache_env(env);
  env.set("HF_HOME", (hub / "home").string());
  const fs::path repo = hub / "home" / "hub" / "models--black-forest-labs--FLUX.1-dev";
  write_file(repo / "snapshots" / "1111" / "flux1-dev.safetensors", "old");
  write_file(repo / "snapshots" / "2222" / "flux1-dev.safetensors", "new");
  write_file(repo / "refs" / "main", "1111\n");  // refs/main decides, not the newest folder

  ResolvedPath r = resolve_model_path("black-forest-labs/FLUX.1-dev", "model.name_or_path");
  CATCH_CHECK(r.from_hub_cache);
  CATCH_CHECK(r.path == repo / "snapshots" / "1111");
  CATCH_CHECK(r.commit == "1111");
  CATCH_CHECK(r.repo_id == "black-forest-labs/FLUX.1-dev");
  CATCH_CHECK(r.note.empty());

  CATCH_SECTION("without refs/main the newest snapshot is used, and said") {
    fs::remove(repo / "refs" / "main");
    fs::last_write_time(repo / "snapshots" / "1111", fs::file_time_type::clock::now() + std::chrono::hours(1));
    r = resolve_model_path("black-forest-labs/FLUX.1-dev", "model.name_or_path");
    CATCH_CHECK(r.path == repo / "snapshots" / "1111");
    CATCH_CHECK(r.note == "black-forest-labs/FLUX.1-dev: no refs/main in the cache; using the newest of 2 "
                          "snapshots, 1111");
    fs::remove_all(repo / "snapshots" / "1111");
    r = resolve_model_path("black-forest-labs/FLUX.1-dev", "model.name_or_path");
    CATCH_CHECK(r.path == repo / "snapshots" / "2222");
    CATCH_CHECK(r.note.find("using the only snapshot, 2222") != std::string::npos);
  }
  CATCH_SECTION("refs/main naming a snapshot that is not there falls back too") {
    write_file(repo / "refs" / "main", "3333");
    r = resolve_model_path("black-forest-labs/FLUX.1-dev", "");
    CATCH_CHECK(r.commit == "2222");  // the newest by modification time (created last)
    CATCH_CHECK(r.note.find("refs/main names 3333, which has no snapshot folder") != std::string::npos);
  }
  CATCH_SECTION("a local path is used as it is") {
    r = resolve_model_path((repo / "snapshots" / "2222").string(), "");
    CATCH_CHECK_FALSE(r.from_hub_cache);
    CATCH_CHECK(r.path == repo / "snapshots" / "2222");
  }
}

CATCH_TEST_CASE("a repo id missing from the cache says where it looked and how to get it", "[config][model_path]") {
  const fs::path hub = lt::test::scratch_dir("model_path_missing");
  lt::test::ScopedEnv env;
  clear_cache_env(env);
  env.set("HF_HUB_CACHE", hub.string());
  const std::string msg = input_error_of([] { resolve_model_path("black-forest-labs/FLUX.1-dev", "model.name_or_path"); });
  CATCH_CHECK(msg.find("model.name_or_path: 'black-forest-labs/FLUX.1-dev' is not a local path, so it is read as a "
                       "Hugging Face repo id") == 0);
  CATCH_CHECK(msg.find("lora-train never downloads") != std::string::npos);
  CATCH_CHECK(msg.find((hub / "models--black-forest-labs--FLUX.1-dev").string() + " does not exist (cache root from "
                       "HF_HUB_CACHE)") != std::string::npos);
  CATCH_CHECK(msg.find("`huggingface-cli download black-forest-labs/FLUX.1-dev`") != std::string::npos);
  CATCH_CHECK(msg.find("copy its ~/.cache/huggingface/hub/models--black-forest-labs--FLUX.1-dev folder into " +
                       hub.string()) != std::string::npos);
  CATCH_CHECK(msg.find('\n') == std::string::npos);

  fs::create_directories(hub / "models--org--name" / "snapshots");
  CATCH_CHECK(input_error_of([] { resolve_model_path("org/name", ""); }).find("holds no snapshot in snapshots/") !=
              std::string::npos);
  fs::create_directories(hub / "models--org--name" / "snapshots" / "abc");
  CATCH_CHECK(input_error_of([] { resolve_model_path("org/name", ""); }).find("the cached snapshot") != std::string::npos);

  CATCH_CHECK(input_error_of([] { resolve_model_path("/models/sd15.safetensors", "model.name_or_path"); }) ==
              "model.name_or_path: '/models/sd15.safetensors' does not exist");
  CATCH_CHECK(input_error_of([] { resolve_model_path("org/na me", ""); }) ==
              "'org/na me' does not exist (nor is it a valid Hugging Face repo id: org/name of letters, digits, '-', "
              "'_', '.')");
}

CATCH_TEST_CASE("an adapter is a file, a folder holding pytorch_lora_weights.safetensors, or a repo id",
                "[config][model_path]") {
  const fs::path dir = lt::test::scratch_dir("model_path_adapter");
  lt::test::ScopedEnv env;
  clear_cache_env(env);
  env.set("HF_HUB_CACHE", (dir / "hub").string());
  write_file(dir / "file.safetensors", "x");
  write_file(dir / "folder" / "pytorch_lora_weights.safetensors", "x");
  const fs::path repo = dir / "hub" / "models--ostris--FLUX.1-schnell-training-adapter";
  write_file(repo / "refs" / "main", "beef");
  write_file(repo / "snapshots" / "beef" / "pytorch_lora_weights.safetensors", "x");

  CATCH_CHECK(resolve_adapter_file((dir / "file.safetensors").string(), "").path == dir / "file.safetensors");
  CATCH_CHECK(resolve_adapter_file((dir / "folder").string(), "").path ==
              dir / "folder" / "pytorch_lora_weights.safetensors");
  const ResolvedPath r = resolve_adapter_file("ostris/FLUX.1-schnell-training-adapter", "");
  CATCH_CHECK(r.from_hub_cache);
  CATCH_CHECK(r.path == repo / "snapshots" / "beef" / "pytorch_lora_weights.safetensors");

  fs::remove(repo / "snapshots" / "beef" / "pytorch_lora_weights.safetensors");
  write_file(repo / "snapshots" / "beef" / "README.md", "x");
  const std::string msg = input_error_of([] { resolve_adapter_file("ostris/FLUX.1-schnell-training-adapter", "a"); });
  CATCH_CHECK(msg.find("a: 'ostris/FLUX.1-schnell-training-adapter': ") == 0);
  CATCH_CHECK(msg.find("holds no pytorch_lora_weights.safetensors") != std::string::npos);
  CATCH_CHECK(msg.find("`huggingface-cli download ostris/FLUX.1-schnell-training-adapter "
                       "pytorch_lora_weights.safetensors`") != std::string::npos);
  CATCH_CHECK(input_error_of([&] { resolve_adapter_file((dir / "empty").string(), ""); }).find("does not exist") !=
              std::string::npos);
}
