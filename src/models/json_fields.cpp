#include "loratrain/models/json_fields.h"

#include <fstream>

#include "loratrain/util/strings.h"

namespace lt::models {

nlohmann::json read_json_file(const std::filesystem::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string() + ": cannot open " + what);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path.string() + ": invalid JSON in " + what + ": " + printable(e.what()));
  }
}

}  // namespace lt::models
