#include "loratrain/util/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "loratrain/util/error.h"

namespace lt::log {

void init(const std::string& level) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("lora-train", console);
  auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    throw InputError("unknown --log-level '" + level + "' (trace, debug, info, warn, error, off)");
  }
  logger->set_level(parsed);
  logger->set_pattern("%^%L%$ %H:%M:%S %v");
  spdlog::set_default_logger(logger);
}

void add_file(const std::filesystem::path& path) {
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path.string(), false);
  file->set_pattern("%Y-%m-%d %H:%M:%S.%e %L %v");
  file->set_level(spdlog::level::trace);
  spdlog::default_logger()->sinks().push_back(file);
  spdlog::default_logger()->flush_on(spdlog::level::info);
}

void set_rank(int rank, const std::filesystem::path& path) {
  auto logger = spdlog::default_logger();
  const std::string prefix = "[rank" + std::to_string(rank) + "]: ";
  for (auto& sink : logger->sinks()) {
    sink->set_pattern(prefix + "%^%L%$ %H:%M:%S %v");
    sink->set_level(spdlog::level::warn);
  }
  add_file(path);
  logger->sinks().back()->set_pattern(prefix + "%Y-%m-%d %H:%M:%S.%e %L %v");
}

}  // namespace lt::log
