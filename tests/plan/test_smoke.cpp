// `lora-train run CONFIG --smoke N --junit PATH` end to end, as a CI job runs it: the binary as a
// child process on the tiny base with simulated VRAM. Exit 0 when the config fits as written, 3
// when it fits only after the guard changed something (fixed.yaml written); the JUnit file
// validates against tests/fixtures/junit/junit.xsd (libxml2) and agrees with report.json.
#include <catch2/catch.hpp>
#include <libxml/parser.h>
#include <libxml/xmlschemas.h>
#include <libxml/xpath.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../train/cli_process.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace {

const std::string kPlannedPreviews =
    "      sample:\n        sample_every: 1000\n        width: 64\n        height: 64\n        sample_steps: 2\n"
    "        prompts:\n          - a red square\n";

// libxml2's message callback: appends to the std::string behind `ctx`.
void collect(void* ctx, const char* msg, ...) {
  va_list args;
  va_start(args, msg);
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, msg, args);
  va_end(args);
  *static_cast<std::string*>(ctx) += buf;
}

// Validates `xml` against the schema; returns libxml2's messages ("" when valid).
std::string schema_errors(const fs::path& xml) {
  std::string errors;
  const std::string xsd = (lt::test::fixtures_dir() / "junit" / "junit.xsd").string();
  xmlSchemaParserCtxtPtr parser = xmlSchemaNewParserCtxt(xsd.c_str());
  xmlSchemaPtr schema = xmlSchemaParse(parser);
  if (!schema) return "schema " + xsd + " did not parse";
  xmlSchemaValidCtxtPtr valid = xmlSchemaNewValidCtxt(schema);
  xmlSchemaSetValidErrors(valid, collect, collect, &errors);
  xmlDocPtr doc = xmlReadFile(xml.c_str(), nullptr, XML_PARSE_NONET);
  if (!doc) {
    errors += "not well-formed XML";
  } else if (xmlSchemaValidateDoc(valid, doc) != 0 && errors.empty()) {
    errors = "invalid";
  }
  if (doc) xmlFreeDoc(doc);
  xmlSchemaFreeValidCtxt(valid);
  xmlSchemaFree(schema);
  xmlSchemaFreeParserCtxt(parser);
  return errors;
}

// The values an XPath expression selects (attribute values or element text).
std::vector<std::string> xpath(const fs::path& xml, const std::string& expression) {
  std::vector<std::string> out;
  xmlDocPtr doc = xmlReadFile(xml.c_str(), nullptr, XML_PARSE_NONET);
  if (!doc) return out;
  xmlXPathContextPtr ctx = xmlXPathNewContext(doc);
  xmlXPathObjectPtr result = xmlXPathEvalExpression(reinterpret_cast<const xmlChar*>(expression.c_str()), ctx);
  if (result && result->nodesetval) {
    for (int i = 0; i < result->nodesetval->nodeNr; ++i) {
      xmlChar* text = xmlNodeGetContent(result->nodesetval->nodeTab[i]);
      out.emplace_back(reinterpret_cast<const char*>(text));
      xmlFree(text);
    }
  }
  xmlXPathFreeObject(result);
  xmlXPathFreeContext(ctx);
  xmlFreeDoc(doc);
  return out;
}

struct Smoke {
  lt::test::ChildExit exit;
  fs::path junit;
  fs::path run_dir;
  nlohmann::json report;
  std::string log;
};

Smoke smoke(const fs::path& root, const std::string& name, const std::string& memory, std::vector<std::string> extra = {}) {
  const fs::path config =
      lt::test::write_tiny_config(root / name, name, 100, "", memory, kPlannedPreviews);
  ::setenv("TMPDIR", (root / name / "tmp").c_str(), 1);
  fs::create_directories(root / name / "tmp");
  Smoke s;
  s.junit = root / name / "junit.xml";
  std::vector<std::string> args = {"run", config.string(), "--set", "train.disable_sampling=false", "--smoke", "3",
                                   "--junit", s.junit.string()};
  for (auto& e : extra) args.push_back(e);
  const fs::path log = root / name / "log.txt";
  s.exit = lt::test::wait_child(lt::test::start_lora_train(args, log));
  s.log = lt::test::read_file(log);
  const auto dirs = xpath(s.junit, "//property[@name='run_dir']/@value");
  if (!dirs.empty()) s.run_dir = dirs.front();
  if (!s.run_dir.empty() && fs::exists(s.run_dir / "report.json")) {
    std::ifstream in(s.run_dir / "report.json");
    s.report = nlohmann::json::parse(in);
  }
  return s;
}

}  // namespace

CATCH_TEST_CASE("--smoke: exit 0 when the config fits as written, 3 when only the guard's changes make it fit",
                "[plan][smoke][e2e]") {
  const fs::path root = lt::test::scratch_dir("smoke");

  // Ample simulated VRAM: fits unchanged.
  const Smoke ok = smoke(root, "fits", "        simulate_vram: 2GiB\n");
  CATCH_INFO(ok.log);
  CATCH_REQUIRE(ok.exit.exited);
  CATCH_CHECK(ok.exit.code == 0);
  CATCH_CHECK(schema_errors(ok.junit).empty());
  CATCH_REQUIRE(ok.report.contains("smoke"));
  CATCH_CHECK(ok.report["smoke"]["exit_code"] == 0);
  CATCH_CHECK(ok.report["smoke"]["changes"].empty());
  CATCH_CHECK(ok.report["steps_completed"] == 3);  // N steps, not the config's 100
  CATCH_CHECK(ok.report["smoke"]["seconds_per_step"].get<double>() > 0);
  // One preview (after the last step, none before training) and one save, in the temporary folder.
  CATCH_CHECK(ok.report["peaks"].contains("sample"));
  CATCH_CHECK_FALSE(ok.report["peaks"].contains("baseline_sample"));
  CATCH_CHECK(ok.report["peaks"].contains("save"));
  CATCH_CHECK(fs::exists(ok.run_dir / "fits.safetensors"));
  CATCH_CHECK(ok.run_dir.string().rfind((root / "fits" / "tmp").string(), 0) == 0);
  CATCH_CHECK_FALSE(fs::exists(ok.run_dir / "fixed.yaml"));
  // The JUnit file: one case per phase that ran plus s/step and the verdict; no failure.
  CATCH_CHECK(xpath(ok.junit, "//testcase[@classname='smoke.memory']").size() == ok.report["peaks"].size());
  CATCH_CHECK(xpath(ok.junit, "//testcase[@name='fits_unchanged']").size() == 1);
  CATCH_CHECK(xpath(ok.junit, "//failure").empty());
  CATCH_CHECK(xpath(ok.junit, "/testsuites/@failures") == std::vector<std::string>{"0"});
  CATCH_CHECK(xpath(ok.junit, "//property[@name='peak_train_step']/@value") ==
              std::vector<std::string>{std::to_string(ok.report["peaks"]["train_step"]["peak_allocated"].get<int64_t>())});

  // A budget between the weights and what batch 2 without checkpointing needs: the guard (the
  // planner before the start, or the ladder after an OOM) changes something, and the run fits.
  const int64_t load = ok.report["peaks"]["load"]["peak_allocated"].get<int64_t>();
  const int64_t step = ok.report["peaks"]["train_step"]["peak_allocated"].get<int64_t>();
  const int64_t budget = load + (step - load) / 2;
  const Smoke changed = smoke(root, "changed", "        simulate_vram: " + std::to_string(budget) + "\n");
  CATCH_INFO(changed.log);
  CATCH_REQUIRE(changed.exit.exited);
  CATCH_CHECK(changed.exit.code == 3);
  CATCH_CHECK(schema_errors(changed.junit).empty());
  CATCH_REQUIRE(changed.report.contains("smoke"));
  CATCH_CHECK(changed.report["smoke"]["exit_code"] == 3);
  CATCH_CHECK(changed.report["outcome"] == "completed");
  CATCH_CHECK_FALSE(changed.report["smoke"]["changes"].empty());
  CATCH_CHECK(fs::exists(changed.run_dir / "fixed.yaml"));
  CATCH_CHECK(changed.report["smoke"]["fixed_yaml"] == (changed.run_dir / "fixed.yaml").string());
  CATCH_CHECK(xpath(changed.junit, "//testcase[@name='fits_unchanged']/failure").size() == 1);
  CATCH_CHECK(xpath(changed.junit, "/testsuites/@failures") == std::vector<std::string>{"1"});
  CATCH_CHECK(changed.log.find("smoke: change:") != std::string::npos);
  // The planner saw it coming: the run started from the first fitting rung, logged as planned
  // changes (no OOM happened), and they are in report.json apart from the guard's attempts.
  CATCH_CHECK(changed.log.find("plan: planned change") != std::string::npos);
  CATCH_CHECK_FALSE(changed.report["planned_changes"].empty());
  CATCH_CHECK(changed.report["attempts"].empty());
  CATCH_CHECK(changed.report["final_settings"]["gradient_checkpointing"] == true);
  CATCH_CHECK(changed.report["peaks"]["train_step"]["peak_allocated"].get<int64_t>() <= budget);
}

CATCH_TEST_CASE("the JUnit schema rejects what CI systems would not read", "[plan][smoke]") {
  const fs::path root = lt::test::scratch_dir("smoke_schema");
  std::ofstream(root / "no_counts.xml") << "<testsuites><testsuite name=\"x\"><testcase name=\"a\" classname=\"b\" "
                                           "time=\"0\"/></testsuite></testsuites>";
  std::ofstream(root / "two_verdicts.xml")
      << "<testsuites tests=\"1\" failures=\"1\" errors=\"1\"><testsuite name=\"x\" tests=\"1\" failures=\"1\" "
         "errors=\"1\" time=\"0\"><testcase name=\"a\" classname=\"b\" time=\"0\"><failure/><error/></testcase>"
         "</testsuite></testsuites>";
  std::ofstream(root / "not_xml.xml") << "<testsuites tests=\"1\"";
  CATCH_CHECK_FALSE(schema_errors(root / "no_counts.xml").empty());
  CATCH_CHECK_FALSE(schema_errors(root / "two_verdicts.xml").empty());
  CATCH_CHECK_FALSE(schema_errors(root / "not_xml.xml").empty());
}

CATCH_TEST_CASE("--smoke with a bad step count is a usage error", "[plan][smoke]") {
  const fs::path root = lt::test::scratch_dir("smoke_usage");
  const fs::path config = lt::test::write_tiny_config(root, "usage", 5);
  const fs::path log = root / "log.txt";
  const auto exit = lt::test::wait_child(lt::test::start_lora_train({"run", config.string(), "--smoke", "0"}, log));
  CATCH_CHECK(exit.exited);
  CATCH_CHECK(exit.code == 2);
  CATCH_CHECK(lt::test::read_file(log).find("--smoke 0") != std::string::npos);
}
