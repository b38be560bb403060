// Atomic file output: write to a temporary file beside the target, fsync, rename over the target.
// A crash or an exception leaves either the old file or the new one, never a partial file.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>

namespace lt {

class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target);
  ~AtomicFile();  // removes the temporary file unless commit() succeeded
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  std::ofstream& stream() { return out_; }
  const std::filesystem::path& temp_path() const { return temp_; }
  void commit();  // flush, fsync, rename; throws lt::Error on failure

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  std::ofstream out_;
  bool committed_ = false;
};

// Convenience: atomically replace `path` with `contents`.
void write_file_atomic(const std::filesystem::path& path, const std::string& contents);

}  // namespace lt
