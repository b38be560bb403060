#include "loratrain/diagnose/line_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "loratrain/util/error.h"

namespace lt::diagnose {
namespace {

class FdSource : public ByteSource {
 public:
  FdSource(int fd, bool owned, std::string name) : fd_(fd), owned_(owned), name_(std::move(name)) {}
  ~FdSource() override {
    if (owned_) ::close(fd_);
  }
  size_t read(char* buffer, size_t capacity) override {
    for (;;) {
      ssize_t n = ::read(fd_, buffer, capacity);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      throw InputError("cannot read " + name_ + ": " + std::strerror(errno));
    }
  }

 private:
  int fd_;
  bool owned_;
  std::string name_;
};

class StringSource : public ByteSource {
 public:
  explicit StringSource(std::string bytes) : bytes_(std::move(bytes)) {}
  size_t read(char* buffer, size_t capacity) override {
    size_t n = std::min(capacity, bytes_.size() - pos_);
    std::memcpy(buffer, bytes_.data() + pos_, n);
    pos_ += n;
    return n;
  }

 private:
  std::string bytes_;
  size_t pos_ = 0;
};

bool is_csi_final(unsigned char c) { return c >= 0x40 && c <= 0x7E; }

}  // namespace

std::unique_ptr<ByteSource> open_source(const std::string& path) {
  if (path == "-") return std::make_unique<FdSource>(0, false, "standard input");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError("cannot open log '" + path + "': " + std::strerror(errno));
  // A directory opens fine on Linux but fails on read with EISDIR; report it here instead.
  char probe;
  if (::pread(fd, &probe, 0, 0) < 0 && errno == EISDIR) {
    ::close(fd);
    throw InputError("cannot read log '" + path + "': it is a directory");
  }
  return std::make_unique<FdSource>(fd, true, "'" + path + "'");
}

std::unique_ptr<ByteSource> string_source(std::string bytes) {
  return std::make_unique<StringSource>(std::move(bytes));
}

std::string clean_line(std::string_view raw) {
  std::string out;
  clean_line_into(raw, out);
  return out;
}

void clean_line_into(std::string_view raw, std::string& out) {
  out.clear();
  const size_t n = raw.size();
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(raw[i]);
    if (c == 0x1B) {  // ESC
      if (i + 1 >= n) break;
      unsigned char k = static_cast<unsigned char>(raw[i + 1]);
      if (k == '[') {  // CSI: parameters and intermediates, then one final byte
        size_t j = i + 2;
        while (j < n && !is_csi_final(static_cast<unsigned char>(raw[j]))) ++j;
        i = j;  // skips the final byte too (loop ++)
      } else if (k == ']') {  // OSC: up to BEL or ESC '\'
        size_t j = i + 2;
        while (j < n && raw[j] != '\a' && !(raw[j] == 0x1B && j + 1 < n && raw[j + 1] == '\\')) ++j;
        i = (j < n && raw[j] == 0x1B) ? j + 1 : j;
      } else {
        i += 1;  // two-byte sequence such as ESC 7, ESC =, ESC (B's first part
        if (k == '(' || k == ')') i += 1;
      }
      continue;
    }
    if (c == '[' && i + 2 < n) {
      // Orphan SGR ("[0m", "[1;32m") from a paste that lost ESC; only digits and ';' inside.
      size_t j = i + 1;
      while (j < n && j - i <= 12 && (std::isdigit(static_cast<unsigned char>(raw[j])) || raw[j] == ';')) ++j;
      if (j < n && raw[j] == 'm' && j > i + 1 && !(j + 1 < n && raw[j + 1] == ']')) {
        // "←[32m" (Windows consoles show ESC as an arrow) leaves the arrow behind; drop it too.
        if (out.size() >= 3 && out.compare(out.size() - 3, 3, "\xE2\x86\x90") == 0) out.resize(out.size() - 3);
        i = j;
        continue;
      }
    }
    if (c == '\t') {
      out.push_back(' ');
    } else if (c < 0x20 || c == 0x7F) {
      continue;  // NUL, BEL, backspace and other binary junk
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
}

std::string to_valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF.
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
               (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF))
      ok = false;
    if (ok) {
      out.append(text.data() + i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

LineReader::LineReader(std::unique_ptr<ByteSource> source)
    : source_(std::move(source)), buffer_(new char[kChunk]) {
  pending_.reserve(kMaxSegment);
}

bool LineReader::refill() {
  if (eof_) return false;
  end_ = source_->read(buffer_.get(), kChunk);
  pos_ = 0;
  bytes_read_ += static_cast<int64_t>(end_);
  if (end_ == 0) eof_ = true;
  return end_ > 0;
}

bool LineReader::emit(LogLine& out, bool redraw, int64_t number) {
  clean_line_into(pending_, cleaned_);
  pending_.clear();
  if (cleaned_.empty()) return false;
  out.text = cleaned_;
  out.number = number;
  out.redraw = redraw;
  return true;
}

bool LineReader::next(LogLine& out) {
  for (;;) {
    if (pos_ >= end_ && !refill()) {
      // End of input: the last line may lack its newline.
      if (!pending_.empty()) return emit(out, false, line_);
      return false;
    }
    const char* data = buffer_.get();
    while (pos_ < end_) {
      // Fast path: copy a run of ordinary bytes at once.
      const char* start = data + pos_;
      size_t room = kMaxSegment - pending_.size();
      size_t avail = std::min(end_ - pos_, room);
      const char* stop = start;
      const char* limit = start + avail;
      while (stop < limit && *stop != '\n' && *stop != '\r') ++stop;
      pending_.append(start, static_cast<size_t>(stop - start));
      pos_ += static_cast<size_t>(stop - start);
      if (pending_.size() >= kMaxSegment) {
        // Over-long line: hand out this piece now and keep reading the same line.
        if (emit(out, false, line_)) return true;
        continue;
      }
      if (pos_ >= end_) break;
      char c = data[pos_++];
      int64_t number = line_;
      if (c == '\n') {
        ++line_;
        if (emit(out, false, number)) return true;
      } else {  // '\r': a redraw, or the first half of CRLF (then the '\n' finds nothing pending)
        bool crlf = pos_ < end_ && data[pos_] == '\n';
        if (emit(out, !crlf, number)) return true;
      }
    }
  }
}

}  // namespace lt::diagnose
