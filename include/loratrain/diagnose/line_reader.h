// Streaming reader for trainer logs as users save and paste them: splits on '\n' and on '\r'
// (tqdm redraws a bar many times on one physical line with carriage returns), strips ANSI escape
// codes, drops control bytes, and caps segment length so memory stays flat whatever the input.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace lt::diagnose {

// One logical line: a '\n'-terminated line, or one '\r'-separated redraw inside it, or one
// kMaxSegment-sized piece of an over-long line. `number` is the 1-based physical line number
// (count of '\n' before it + 1), which is what a user sees in an editor.
struct LogLine {
  std::string_view text;  // cleaned: no ANSI codes, no control bytes, no trailing blanks
  int64_t number = 0;
  bool redraw = false;    // followed by '\r' rather than '\n' (an overwritten progress bar)
};

// Where bytes come from: a file descriptor (file or stdin) or an in-memory string (tests).
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Up to `capacity` bytes into `buffer`; 0 at end of input. Throws lt::InputError on read errors.
  virtual size_t read(char* buffer, size_t capacity) = 0;
};

// `path` or "-" for standard input. Throws lt::InputError when it cannot be opened.
std::unique_ptr<ByteSource> open_source(const std::string& path);
std::unique_ptr<ByteSource> string_source(std::string bytes);

class LineReader {
 public:
  static constexpr size_t kMaxSegment = 16 * 1024;  // longer lines are cut into pieces
  static constexpr size_t kChunk = 1 << 20;

  explicit LineReader(std::unique_ptr<ByteSource> source);
  // The next non-empty cleaned line; false at end of input.
  bool next(LogLine& out);
  int64_t bytes_read() const { return bytes_read_; }
  int64_t physical_lines() const { return line_ + (pending_.empty() ? 0 : 1); }

 private:
  bool refill();
  bool emit(LogLine& out, bool redraw, int64_t number);

  std::unique_ptr<ByteSource> source_;
  std::unique_ptr<char[]> buffer_;
  size_t pos_ = 0;
  size_t end_ = 0;
  bool eof_ = false;
  std::string pending_;  // raw bytes of the segment being assembled (<= kMaxSegment)
  std::string cleaned_;  // storage behind the returned string_view
  int64_t line_ = 1;
  int64_t bytes_read_ = 0;
};

// Strips ANSI escape sequences (CSI, OSC, two-byte ESC x) and orphan SGR fragments such as "[32m"
// left when a paste lost the ESC byte, turns tabs into spaces, drops other C0 controls and DEL,
// and trims trailing blanks. Bytes >= 0x80 are kept as they are (see to_valid_utf8).
std::string clean_line(std::string_view raw);
void clean_line_into(std::string_view raw, std::string& out);  // reuses out's capacity

// Replaces invalid UTF-8 sequences with U+FFFD so text can go into JSON.
std::string to_valid_utf8(std::string_view text);

}  // namespace lt::diagnose
