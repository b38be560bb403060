#include "loratrain/util/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "loratrain/util/error.h"

namespace lt {

namespace {
std::filesystem::path make_temp_name(const std::filesystem::path& target) {
  std::random_device rd;
  auto name = target.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
              std::to_string(rd() % 1000000);
  return target.parent_path() / name;
}

void fsync_path(const std::filesystem::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}
}  // namespace

AtomicFile::AtomicFile(std::filesystem::path target) : target_(std::move(target)) {
  if (!target_.parent_path().empty()) std::filesystem::create_directories(target_.parent_path());
  temp_ = make_temp_name(target_);
  out_.open(temp_, std::ios::binary | std::ios::trunc);
  if (!out_) {
    throw Error(ExitCode::kRuntime, "cannot write " + temp_.string() + ": " + std::strerror(errno));
  }
}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    out_.close();
    std::error_code ec;
    std::filesystem::remove(temp_, ec);
  }
}

void AtomicFile::commit() {
  out_.flush();
  if (!out_) throw Error(ExitCode::kRuntime, "write failed: " + temp_.string());
  out_.close();
  fsync_path(temp_);
  std::error_code ec;
  std::filesystem::rename(temp_, target_, ec);
  if (ec) throw Error(ExitCode::kRuntime, "cannot rename " + temp_.string() + " to " + target_.string() + ": " + ec.message());
  committed_ = true;
  fsync_path(target_.parent_path().empty() ? std::filesystem::path(".") : target_.parent_path());
}

void write_file_atomic(const std::filesystem::path& path, const std::string& contents) {
  AtomicFile file(path);
  file.stream().write(contents.data(), static_cast<std::streamsize>(contents.size()));
  file.commit();
}

}  // namespace lt
