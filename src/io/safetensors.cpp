#include "loratrain/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstring>
#include <set>

#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::io {

namespace {

struct DTypeRow {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {DType::F64, "F64", 8},     {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::I64, "I64", 8},     {DType::I32, "I32", 4},         {DType::I16, "I16", 2},
    {DType::I8, "I8", 1},       {DType::U64, "U64", 8},         {DType::U32, "U32", 4},
    {DType::U16, "U16", 2},     {DType::U8, "U8", 1},           {DType::BOOL, "BOOL", 1},
};

// Headers of real checkpoints are well under 10 MB (a Flux file's is ~100 KB).
constexpr uint64_t kMaxHeaderBytes = 100ull * 1024 * 1024;

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw InputError(path.string() + ": not a valid safetensors file: " + what);
}

// A name or value from the header, quoted: it is the file's bytes, so it is escaped.
std::string quote_from_file(const std::string& from_file) { return "'" + printable(from_file) + "'"; }

std::optional<at::ScalarType> native_type(DType d) {
  switch (d) {
    case DType::F64: return at::kDouble;
    case DType::F32: return at::kFloat;
    case DType::F16: return at::kHalf;
    case DType::BF16: return at::kBFloat16;
    case DType::I64: return at::kLong;
    case DType::I32: return at::kInt;
    case DType::I16: return at::kShort;
    case DType::I8: return at::kChar;
    case DType::U8: return at::kByte;
    case DType::BOOL: return at::kBool;
    default: return std::nullopt;
  }
}

// fp8 decoding tables: 256 entries each, built once from the bit layouts.
float decode_fp8(uint8_t bits, int exponent_bits, int mantissa_bits, int bias, bool e4m3fn) {
  int sign = bits >> 7;
  int exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1);
  int mantissa = bits & ((1 << mantissa_bits) - 1);
  float value;
  if (e4m3fn && exponent == 0xF && mantissa == 0x7) {
    value = std::numeric_limits<float>::quiet_NaN();  // E4M3FN: only S.1111.111 is NaN, no inf
  } else if (!e4m3fn && exponent == 0x1F) {
    value = mantissa == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), 1 - bias - mantissa_bits);
  } else {
    value = std::ldexp(1.0f + static_cast<float>(mantissa) / (1 << mantissa_bits), exponent - bias);
  }
  return sign ? -value : value;
}

const std::array<float, 256>& fp8_table(DType d) {
  static const auto build = [](bool e4m3) {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) {
      t[i] = e4m3 ? decode_fp8(static_cast<uint8_t>(i), 4, 3, 7, true)
                  : decode_fp8(static_cast<uint8_t>(i), 5, 2, 15, false);
    }
    return t;
  };
  static const std::array<float, 256> e4m3 = build(true);
  static const std::array<float, 256> e5m2 = build(false);
  return d == DType::F8_E4M3 ? e4m3 : e5m2;
}

}  // namespace

const char* dtype_name(DType d) {
  for (const auto& row : kDTypes) if (row.dtype == d) return row.name;
  return "?";
}

size_t dtype_size(DType d) {
  for (const auto& row : kDTypes) if (row.dtype == d) return row.size;
  return 0;
}

std::optional<DType> dtype_from_name(const std::string& name) {
  for (const auto& row : kDTypes) if (name == row.name) return row.dtype;
  return std::nullopt;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw InputError(path.string() + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path.string() + ": not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail(path, "file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }
  void* mapped = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) throw InputError(path.string() + ": cannot map: " + std::strerror(errno));
  file->map_ = static_cast<const uint8_t*>(mapped);
  file->map_size_ = file_size;

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file->map_[i];
  if (header_len > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(header_len) + " bytes is absurd (limit " +
                   std::to_string(kMaxHeaderBytes) + ")");
  }
  if (8 + header_len > file_size) {
    fail(path, "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                   std::to_string(file_size) + " bytes): the file is truncated");
  }
  const char* header_begin = reinterpret_cast<const char*>(file->map_ + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_len);
  } catch (const nlohmann::json::exception& e) {
    // The parser quotes the bytes it choked on.
    fail(path, "header is not valid JSON (" + printable(e.what()) + ")");
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");
  file->data_ = file->map_ + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) fail(path, "__metadata__ value " + quote_from_file(m.key()) + " is not a string");
        file->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const auto& entry = it.value();
    TensorInfo info;
    info.name = it.key();
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      fail(path, "tensor " + quote_from_file(info.name) + " lacks dtype, shape or data_offsets");
    }
    if (!entry["dtype"].is_string()) fail(path, "tensor " + quote_from_file(info.name) + " has a non-string dtype");
    auto dtype = dtype_from_name(entry["dtype"].get<std::string>());
    if (!dtype) fail(path, "tensor " + quote_from_file(info.name) + " has unknown dtype " + quote_from_file(entry["dtype"].get<std::string>()));
    info.dtype = *dtype;
    if (!entry["shape"].is_array()) fail(path, "tensor " + quote_from_file(info.name) + " shape is not an array");
    uint64_t numel = 1;
    for (const auto& dim : entry["shape"]) {
      if (!dim.is_number_unsigned()) fail(path, "tensor " + quote_from_file(info.name) + " has a negative or non-integer dimension");
      uint64_t d = dim.get<uint64_t>();
      if (d > (1ull << 40) || (d != 0 && numel > (1ull << 50) / d)) fail(path, "tensor " + quote_from_file(info.name) + " shape is absurdly large");
      numel *= d;
      info.shape.push_back(static_cast<int64_t>(d));
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      fail(path, "tensor " + quote_from_file(info.name) + " data_offsets is not a pair of non-negative integers");
    }
    info.begin = offsets[0].get<uint64_t>();
    info.end = offsets[1].get<uint64_t>();
    if (info.begin > info.end || info.end > data_size) {
      fail(path, "tensor " + quote_from_file(info.name) + " data [" + std::to_string(info.begin) + ", " +
                     std::to_string(info.end) + ") lies outside the " + std::to_string(data_size) +
                     "-byte data section (truncated file?)");
    }
    if (info.end - info.begin != numel * dtype_size(info.dtype)) {
      fail(path, "tensor " + quote_from_file(info.name) + " has " + std::to_string(info.end - info.begin) +
                     " bytes of data but its shape and dtype need " + std::to_string(numel * dtype_size(info.dtype)));
    }
    file->tensors_.push_back(std::move(info));
  }
  // Overlapping data ranges mean a forged or corrupt header.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& t : file->tensors_) if (t.end > t.begin) ranges.emplace_back(t.begin, t.end);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) fail(path, "two tensors' data ranges overlap");
  }
  // safetensors writers order tensors by data offset; keep header order stable by offset.
  std::stable_sort(file->tensors_.begin(), file->tensors_.end(),
                   [](const TensorInfo& a, const TensorInfo& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_[file->tensors_[i].name] = i;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw InputError(path_.string() + ": no tensor named " + quote_from_file(name));
  return tensors_[it->second];
}

namespace {
// Drops the mapping's pages of a tensor once it has been copied out: file-backed pages count in the
// process's resident memory, so without this loading a checkpoint holds it twice (mapping + module).
// The mapping stays valid; a later access simply reads the pages from the file again.
void release_pages(const uint8_t* begin, uint64_t size) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + size + page - 1) & ~(page - 1);
  if (size > 0) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}
}  // namespace

at::Tensor SafetensorsFile::load(const std::string& name, std::optional<at::ScalarType> as) const {
  const TensorInfo& t = info(name);
  const uint8_t* src = data(t);
  if (t.dtype == DType::F8_E4M3 || t.dtype == DType::F8_E5M2) {
    const auto& table = fp8_table(t.dtype);
    at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(at::kFloat));
    float* dst = out.data_ptr<float>();
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
    release_pages(src, t.end - t.begin);
    return as && *as != at::kFloat ? out.to(*as) : out;
  }
  auto native = native_type(t.dtype);
  if (!native) {
    throw InputError(path_.string() + ": tensor " + quote_from_file(name) + " has dtype " + dtype_name(t.dtype) +
                     ", which LibTorch cannot hold");
  }
  // from_blob views the mapping without copying; one copy then lands in the target dtype.
  at::Tensor view = at::from_blob(const_cast<uint8_t*>(src), t.shape, at::TensorOptions().dtype(*native));
  at::ScalarType target = as.value_or(*native);
  at::Tensor out = target == *native ? view.clone() : view.to(target);
  release_pages(src, t.end - t.begin);
  return out;
}

void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  cpu.reserve(tensors.size());
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (!seen.insert(name).second) throw Error(ExitCode::kRuntime, "save_safetensors: duplicate tensor name '" + name + "'");
    at::Tensor c = tensor.detach().to(at::kCPU).contiguous();
    std::string dtype;
    switch (c.scalar_type()) {
      case at::kDouble: dtype = "F64"; break;
      case at::kFloat: dtype = "F32"; break;
      case at::kHalf: dtype = "F16"; break;
      case at::kBFloat16: dtype = "BF16"; break;
      case at::kLong: dtype = "I64"; break;
      case at::kInt: dtype = "I32"; break;
      case at::kShort: dtype = "I16"; break;
      case at::kChar: dtype = "I8"; break;
      case at::kByte: dtype = "U8"; break;
      case at::kBool: dtype = "BOOL"; break;
      default: throw Error(ExitCode::kRuntime, "save_safetensors: unsupported dtype for '" + name + "'");
    }
    uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", dtype}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(std::move(c));
  }
  std::string header_text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  while ((8 + header_text.size()) % 8 != 0) header_text.push_back(' ');
  AtomicFile out(path);
  uint64_t n = header_text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out.write(len, 8);
  out.write(header_text);
  for (const auto& c : cpu) out.write(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  out.commit();
}

}  // namespace lt::io
