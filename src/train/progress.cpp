#include "loratrain/train/progress.h"

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>

#include "loratrain/util/strings.h"

namespace lt::train {

std::string format_duration(double seconds) {
  if (!(seconds >= 0)) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

ProgressLine::ProgressLine(int plain_every) : tty_(::isatty(STDERR_FILENO) == 1), plain_every_(plain_every) {}

void ProgressLine::update(const StepStats& s) {
  // Exponential smoothing: the raw loss of diffusion training is too noisy to read.
  const double a = seen_ == 0 ? 1.0 : 0.1;
  smoothed_ = a * s.loss + (1 - a) * smoothed_;
  smoothed_seconds_ = a * s.seconds + (1 - a) * smoothed_seconds_;
  ++seen_;
  const double eta = smoothed_seconds_ * static_cast<double>(s.total_steps - s.step);
  std::string line = fmt::format("step {}/{} | loss {:.4f} (avg {:.4f}) | lr {:.1e} | {:.2f} s/it | ETA {} | mem {} / {}",
                                 s.step, s.total_steps, s.loss, smoothed_, s.lr, smoothed_seconds_,
                                 format_duration(eta), format_bytes(s.mem_allocated), format_bytes(s.mem_peak));
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
    drawn_ = true;
  } else if (s.step == 1 || s.step == s.total_steps || (plain_every_ > 0 && s.step % plain_every_ == 0)) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void ProgressLine::finish() {
  if (tty_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

MetricsFile::MetricsFile(const std::filesystem::path& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc) {}

void MetricsFile::write(const StepStats& s, double smoothed_loss) {
  nlohmann::json j = {{"step", s.step},       {"loss", s.loss},           {"loss_avg", smoothed_loss},
                      {"lr", s.lr},           {"seconds", s.seconds},     {"mem_allocated", s.mem_allocated},
                      {"mem_peak", s.mem_peak}, {"batch_size", s.batch_size}, {"width", s.width},
                      {"height", s.height}};
  out_ << j.dump() << '\n';
  out_.flush();
}

}  // namespace lt::train
