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

// The folder's entry for the renamed file reaches the disk. Best effort: by now the new file has
// replaced the old one, so a failure here cannot be undone and is not an error of this save.
void fsync_folder(const std::filesystem::path& folder) {
  int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

AtomicFile::AtomicFile(std::filesystem::path target) : target_(std::move(target)) {
  std::error_code ec;
  if (!target_.parent_path().empty()) std::filesystem::create_directories(target_.parent_path(), ec);
  if (ec) throw Error(ExitCode::kRuntime, "cannot save " + target_.string() + ": cannot create its folder: " + ec.message());
  // O_EXCL: a name another writer picked is never shared; retried with a new name.
  for (int tries = 0; fd_ < 0; ++tries) {
    temp_ = make_temp_name(target_);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || tries >= 100)) {
      throw Error(ExitCode::kRuntime, "cannot save " + target_.string() + ": cannot create " + temp_.string() + ": " +
                                          std::strerror(errno));
    }
  }
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

void AtomicFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicFile::fail(const char* operation, int error) {
  discard();
  std::error_code ec;
  const bool previous = std::filesystem::exists(target_, ec);
  throw Error(ExitCode::kRuntime, "cannot save " + target_.string() + ": " + operation + " failed: " + std::strerror(error) +
                                      (previous ? "; the previous " + target_.filename().string() + " is unchanged"
                                                : "; no partial file was left"));
}

void AtomicFile::write(const void* data, size_t size) {
  if (fd_ < 0) throw Error(ExitCode::kRuntime, "cannot save " + target_.string() + ": the file is already closed");
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    // write() may take less than asked (a signal, a nearly full disk); a full disk or a file-size
    // limit then fails the next call with ENOSPC or EFBIG.
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw Error(ExitCode::kRuntime, "cannot save " + target_.string() + ": the file is already closed");
  // Delayed allocation and network filesystems report a full disk only here.
  if (::fsync(fd_) != 0) fail("fsync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close", errno);
  if (::rename(temp_.c_str(), target_.c_str()) != 0) fail("rename", errno);
  committed_ = true;
  fsync_folder(target_.parent_path());
}

void write_file_atomic(const std::filesystem::path& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents);
  file.commit();
}

}  // namespace lt
