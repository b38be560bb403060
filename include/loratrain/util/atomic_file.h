// Atomic file output: write to a temporary file beside the target, fsync, rename over the target.
// A crash, an exception or a failed write (disk full, a file-size limit, an I/O error) leaves
// either the old file or the new one, never a partial file, and no temporary file behind.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

namespace lt {

class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target);  // creates the temporary file; throws lt::Error
  ~AtomicFile();  // removes the temporary file unless commit() succeeded
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Every byte is written or lt::Error is thrown (target, operation, strerror; the temporary file
  // is removed and the target left as it was).
  void write(const void* data, size_t size);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // fsync, close, rename over the target, fsync the folder. Throws lt::Error as write() does.
  void commit();

  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const char* operation, int error);
  void discard();  // closes and removes the temporary file

  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Convenience: atomically replace `path` with `contents`.
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

}  // namespace lt
