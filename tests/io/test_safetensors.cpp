#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>

#include "loratrain/io/safetensors.h"
#include "loratrain/util/error.h"
#include "test_support.h"

using lt::test::read_file;
using lt::test::write_file;

namespace {

// A file with a hand-written header (for hostile cases) and `data` bytes after it.
std::filesystem::path forge(const std::filesystem::path& dir, const std::string& name,
                            const std::string& header, const std::string& data, uint64_t claimed_len = 0) {
  std::string bytes(8, '\0');
  uint64_t n = claimed_len ? claimed_len : header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  bytes += header + data;
  auto p = dir / name;
  write_file(p, bytes);
  return p;
}

std::string open_error(const std::filesystem::path& p) {
  try {
    lt::io::SafetensorsFile::open(p);
  } catch (const lt::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

CATCH_TEST_CASE("safetensors round trip keeps names, shapes, dtypes, values and metadata", "[io]") {
  auto dir = lt::test::scratch_dir("safetensors_roundtrip");
  auto a = torch::randn({3, 4});
  auto b = torch::randn({2, 5}).to(torch::kHalf);
  auto c = torch::randn({7}).to(torch::kBFloat16);
  auto d = torch::arange(6, torch::kLong).reshape({2, 3});
  lt::io::save_safetensors(dir / "x.safetensors", {{"a", a}, {"b", b}, {"c", c}, {"d", d}}, {{"ss_network_dim", "4"}});
  auto f = lt::io::SafetensorsFile::open(dir / "x.safetensors");
  CATCH_REQUIRE(f->tensors().size() == 4);
  CATCH_CHECK(f->metadata().at("ss_network_dim") == "4");
  CATCH_CHECK(torch::equal(f->load("a"), a));
  CATCH_CHECK(torch::equal(f->load("b"), b));
  CATCH_CHECK(f->load("b").scalar_type() == torch::kHalf);
  CATCH_CHECK(torch::equal(f->load("c"), c));
  CATCH_CHECK(torch::equal(f->load("d"), d));
  // Conversion on load.
  CATCH_CHECK(f->load("b", torch::kFloat).scalar_type() == torch::kFloat);
  CATCH_CHECK(torch::allclose(f->load("b", torch::kFloat), b.to(torch::kFloat)));
  // The data section starts 8-byte aligned.
  auto bytes = read_file(dir / "x.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  CATCH_CHECK((8 + n) % 8 == 0);
}

CATCH_TEST_CASE("fp8 tensors decode by table", "[io]") {
  auto dir = lt::test::scratch_dir("safetensors_fp8");
  // E4M3FN: 0x38 = 1.0, 0xC0 = -2.0, 0x01 = 2^-9 (smallest subnormal), 0x7E = 448 (max), 0x7F = NaN.
  // E5M2:   0x3C = 1.0, 0xC0 = -2.0, 0x7C = inf.
  std::string data = std::string("\x38\xC0\x01\x7E\x7F", 5) + std::string("\x3C\xC0\x7C", 3);
  auto p = forge(dir, "f8.safetensors",
                 R"({"a":{"dtype":"F8_E4M3","shape":[5],"data_offsets":[0,5]},)"
                 R"("b":{"dtype":"F8_E5M2","shape":[3],"data_offsets":[5,8]}})",
                 data);
  auto f = lt::io::SafetensorsFile::open(p);
  auto a = f->load("a");
  CATCH_CHECK(a[0].item<float>() == 1.0f);
  CATCH_CHECK(a[1].item<float>() == -2.0f);
  CATCH_CHECK(a[2].item<float>() == std::ldexp(1.0f, -9));
  CATCH_CHECK(a[3].item<float>() == 448.0f);
  CATCH_CHECK(std::isnan(a[4].item<float>()));
  auto b = f->load("b", torch::kBFloat16);
  CATCH_CHECK(b.scalar_type() == torch::kBFloat16);
  CATCH_CHECK(b[0].item<float>() == 1.0f);
  CATCH_CHECK(b[1].item<float>() == -2.0f);
  CATCH_CHECK(std::isinf(b[2].item<float>()));
}

CATCH_TEST_CASE("broken and hostile safetensors files give one clear error", "[io]") {
  auto dir = lt::test::scratch_dir("safetensors_hostile");
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string ok_data(8, '\0');

  CATCH_SECTION("shorter than the length prefix") {
    write_file(dir / "tiny.safetensors", "abc");
    CATCH_CHECK_THAT(open_error(dir / "tiny.safetensors"), Catch::Contains("shorter than the 8-byte"));
  }
  CATCH_SECTION("header length beyond the file") {
    auto p = forge(dir, "long.safetensors", ok_header, ok_data, 4096);
    CATCH_CHECK_THAT(open_error(p), Catch::Contains("truncated"));
  }
  CATCH_SECTION("absurd header size") {
    auto p = forge(dir, "absurd.safetensors", ok_header, ok_data, 1ull << 60);
    CATCH_CHECK_THAT(open_error(p), Catch::Contains("absurd"));
  }
  CATCH_SECTION("header is not JSON") {
    auto p = forge(dir, "json.safetensors", "{not json", ok_data);
    CATCH_CHECK_THAT(open_error(p), Catch::Contains("not valid JSON"));
  }
  CATCH_SECTION("offsets outside the data") {
    auto p = forge(dir, "out.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}})", ok_data);
    CATCH_CHECK_THAT(open_error(p), Catch::Contains("outside"));
  }
  CATCH_SECTION("overlapping tensors") {
    auto p = forge(dir, "overlap.safetensors",
                   R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   ok_data);
    CATCH_CHECK_THAT(open_error(p), Catch::Contains("overlap"));
  }
  CATCH_SECTION("unknown dtype") {
    auto p = forge(dir, "dtype.safetensors", R"({"w":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}})", ok_data);
    CATCH_CHECK_THAT(open_error(p), Catch::Contains("unknown dtype 'F17'"));
  }
  CATCH_SECTION("shape and size disagree") {
    auto p = forge(dir, "shape.safetensors", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", ok_data);
    CATCH_CHECK_THAT(open_error(p), Catch::Contains("need 12"));
  }
  CATCH_SECTION("negative dimension") {
    auto p = forge(dir, "neg.safetensors", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", ok_data);
    CATCH_CHECK_THAT(open_error(p), Catch::Contains("negative"));
  }
  CATCH_SECTION("a real file cut short") {
    lt::io::save_safetensors(dir / "whole.safetensors", {{"a", torch::randn({64, 64})}});
    auto bytes = read_file(dir / "whole.safetensors");
    write_file(dir / "cut.safetensors", bytes.substr(0, bytes.size() - 100));
    CATCH_CHECK_THAT(open_error(dir / "cut.safetensors"), Catch::Contains("truncated"));
  }
  CATCH_SECTION("hostile bytes in the header are escaped in the message") {
    // Terminal escapes inside a JSON string (a name that clears the screen), then raw bytes that
    // are not UTF-8 where the parser stops: the message quotes both, escaped.
    auto names = forge(dir, "esc.safetensors", R"({"w\u001b[2J\u001b[31m":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
                       ok_data);
    const std::string named = open_error(names);
    CATCH_CHECK_THAT(named, Catch::Contains("'w\\x1B[2J\\x1B[31m'"));
    auto raw = forge(dir, "raw.safetensors", "{\"w\":\x1b]0;owned\a\xff\xfe}", ok_data);
    const std::string parsed = open_error(raw);
    CATCH_CHECK_THAT(parsed, Catch::Contains("not valid JSON"));
    auto bidi = forge(dir, "bidi.safetensors", "{\"w\":{\"dtype\":\"F32\xE2\x80\xAE\",\"shape\":[2],\"data_offsets\":[0,8]}}", ok_data);
    const std::string dtype = open_error(bidi);
    CATCH_CHECK_THAT(dtype, Catch::Contains("unknown dtype 'F32\\xE2\\x80\\xAE'"));
    for (const std::string& message : {named, parsed, dtype}) {
      for (unsigned char c : message) {
        CATCH_CHECK(c >= 0x20);
        CATCH_CHECK(c != 0x7F);
        CATCH_CHECK(c < 0x80);  // these three messages quote nothing but ASCII and escapes
      }
    }
  }
  CATCH_SECTION("missing file") {
    CATCH_CHECK_THAT(open_error(dir / "nope.safetensors"), Catch::Contains("cannot open"));
  }
}

CATCH_TEST_CASE("random corruption of a valid file never crashes", "[io]") {
  auto dir = lt::test::scratch_dir("safetensors_fuzz");
  lt::io::save_safetensors(dir / "base.safetensors",
                           {{"a", torch::randn({4, 4})}, {"b", torch::randn({3}).to(torch::kHalf)}}, {{"k", "v"}});
  const auto base = read_file(dir / "base.safetensors");
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string bytes = base;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) bytes[rng() % std::min<size_t>(bytes.size(), 160)] = static_cast<char>(rng());
    if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());
    write_file(dir / "fuzz.safetensors", bytes);
    try {
      auto f = lt::io::SafetensorsFile::open(dir / "fuzz.safetensors");
      for (const auto& t : f->tensors()) {
        if (t.dtype == lt::io::DType::F32 || t.dtype == lt::io::DType::F16 || t.dtype == lt::io::DType::F8_E4M3) {
          (void)f->load(t.name);
        }
      }
    } catch (const lt::InputError&) {
      // expected for most corruptions
    }
  }
  CATCH_SUCCEED("300 corrupted files handled without a crash");
}
