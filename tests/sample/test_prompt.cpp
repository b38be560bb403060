// Sample prompt resolution: AI Toolkit / kohya inline flags, defaults, walk_seed, triggers.
#include <catch2/catch.hpp>

#include "loratrain/sample/prompt.h"
#include "loratrain/util/error.h"

using namespace lt::sample;

CATCH_TEST_CASE("inline prompt flags override the sample defaults", "[sample][prompt]") {
  SampleDefaults d;
  d.width = 512;
  d.height = 512;
  d.guidance_scale = 4.0;
  d.sample_steps = 30;
  d.neg = "ugly";
  SampleItem item;
  item.prompt = "a photo of x --w 512 --h 768 --seed 42 --cfg 7 --steps 20 --n blurry, low quality";
  auto p = resolve_sample_prompt(item, d, 3);
  CATCH_CHECK(p.text == "a photo of x");
  CATCH_CHECK(p.width == 512);
  CATCH_CHECK(p.height == 768);
  CATCH_CHECK(p.seed == 42);
  CATCH_CHECK(p.guidance_scale == 7.0);
  CATCH_CHECK(p.steps == 20);
  CATCH_CHECK(p.negative == "blurry, low quality");

  item.prompt = "  portrait  ";
  p = resolve_sample_prompt(item, d, 0);
  CATCH_CHECK(p.text == "portrait");
  CATCH_CHECK(p.width == 512);
  CATCH_CHECK(p.height == 512);
  CATCH_CHECK(p.guidance_scale == 4.0);
  CATCH_CHECK(p.steps == 30);
  CATCH_CHECK(p.negative == "ugly");
  CATCH_CHECK(p.seed == 0);

  // kohya's short forms and AI Toolkit's extras.
  item.prompt = "cat --d 7 --l 5.5 --s 12 --m 0.8 --gr 0.7 --p2 second text --n2 neg two --frames 9 --fps 8";
  p = resolve_sample_prompt(item, d, 0);
  CATCH_CHECK(p.text == "cat");
  CATCH_CHECK(p.seed == 7);
  CATCH_CHECK(p.guidance_scale == 5.5);
  CATCH_CHECK(p.steps == 12);
  CATCH_CHECK(p.network_multiplier == 0.8);
  CATCH_CHECK(p.guidance_rescale == 0.7);
  CATCH_CHECK(p.text_2 == "second text");
  CATCH_CHECK(p.negative_2 == "neg two");
  CATCH_CHECK(p.num_frames == 9);
  CATCH_CHECK(p.fps == 8);
}

CATCH_TEST_CASE("seeds: fixed, walked, per item, inline", "[sample][prompt]") {
  SampleDefaults d;
  d.seed = 100;
  std::vector<SampleItem> items(4);
  items[0].prompt = "a";
  items[1].prompt = "b";
  items[2].prompt = "c";
  items[2].seed = 7;
  items[3].prompt = "d --seed 9";
  auto fixed = resolve_sample_prompts(items, d);
  CATCH_CHECK(fixed[0].seed == 100);
  CATCH_CHECK(fixed[1].seed == 100);
  CATCH_CHECK(fixed[2].seed == 7);
  CATCH_CHECK(fixed[3].seed == 9);
  d.walk_seed = true;
  auto walked = resolve_sample_prompts(items, d);
  CATCH_CHECK(walked[0].seed == 100);
  CATCH_CHECK(walked[1].seed == 101);
  CATCH_CHECK(walked[2].seed == 7);
  CATCH_CHECK(walked[3].seed == 9);
  d.seed = -1;  // random per image, never negative
  auto random = resolve_sample_prompt(items[0], d, 0);
  CATCH_CHECK(random.seed >= 0);
}

CATCH_TEST_CASE("item fields and trigger words", "[sample][prompt]") {
  SampleDefaults d;
  d.trigger_word = "sks";
  SampleItem item;
  item.prompt = "a photo of [trigger] in [name]'s garden";
  item.width = 768;
  item.guidance_scale = 3.0;
  item.neg = "dark";
  auto p = resolve_sample_prompt(item, d, 0);
  CATCH_CHECK(p.text == "a photo of sks in sks's garden");
  CATCH_CHECK(p.width == 768);
  CATCH_CHECK(p.height == 512);
  CATCH_CHECK(p.guidance_scale == 3.0);
  CATCH_CHECK(p.negative == "dark");
  d.trigger_word.reset();
  CATCH_CHECK(inject_trigger("[trigger] dog", d.trigger_word) == " dog");
}

CATCH_TEST_CASE("bad prompt flags are named", "[sample][prompt]") {
  SampleDefaults d;
  SampleItem item;
  item.prompt = "x --width 512";
  CATCH_CHECK_THROWS_WITH(resolve_sample_prompt(item, d, 0), Catch::Contains("unknown flag '--width'"));
  item.prompt = "x --stesp 20";
  CATCH_CHECK_THROWS_WITH(resolve_sample_prompt(item, d, 0), Catch::Contains("did you mean '--steps'"));
  item.prompt = "x --w big";
  CATCH_CHECK_THROWS_WITH(resolve_sample_prompt(item, d, 0), Catch::Contains("--w needs an integer"));
  item.prompt = "x --steps 0";
  CATCH_CHECK_THROWS_AS(resolve_sample_prompt(item, d, 0), lt::InputError);
  item.prompt = "x --cfg 7x";
  CATCH_CHECK_THROWS_AS(resolve_sample_prompt(item, d, 0), lt::InputError);
}
