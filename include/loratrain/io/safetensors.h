// safetensors: memory-mapped reading and atomic writing of the format every diffusion checkpoint
// and LoRA file uses (8-byte little-endian header length, JSON header, raw little-endian data).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lt::io {

enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, U8, BOOL };

const char* dtype_name(DType d);           // "F32", ...
size_t dtype_size(DType d);                // bytes per element
std::optional<DType> dtype_from_name(const std::string& name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section, [begin, end)
  uint64_t end = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps the file and validates the whole header; throws lt::InputError naming the file and the
  // problem for anything malformed (never reads outside the file).
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in header order
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Copies one tensor out of the mapping (one copy, converted on the way when `as` is given;
  // fp8 is decoded by table into `as`, default float32).
  at::Tensor load(const std::string& name, std::optional<at::ScalarType> as = std::nullopt) const;

  // A raw view of the tensor's bytes inside the mapping (valid while this object lives).
  const uint8_t* data(const TensorInfo& info) const { return data_ + info.begin; }

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (in the given order) atomically, with `metadata` as __metadata__.
// Tensors are written in their own dtype (contiguous, little-endian, CPU copy made as needed).
void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace lt::io
