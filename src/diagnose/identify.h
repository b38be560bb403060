// Which trainer wrote the log and which model family it trained: weighted markers (script names,
// paths, a trainer's own messages) summed over the log, each marker counted once.
#pragma once
#include <array>
#include <vector>

#include "loratrain/diagnose/diagnosis.h"

namespace lt::diagnose::detail {

struct TrainerMarker {
  const char* text;  // lowercase
  Trainer trainer;
  int weight;        // how specific the marker is
  bool kohya_gui = false;  // written by the kohya_ss GUI around sd-scripts
};
const std::vector<TrainerMarker>& trainer_markers();

struct FamilyMarker {
  const char* text;
  ModelFamily family;
  int weight;
};
const std::vector<FamilyMarker>& family_markers();

constexpr int kTrainerCount = static_cast<int>(Trainer::kLoraTrain) + 1;
constexpr int kFamilyCount = static_cast<int>(ModelFamily::kMochi) + 1;

struct IdentityScores {
  std::array<int, kTrainerCount> trainer{};
  std::array<int, kFamilyCount> family{};
  bool kohya_gui = false;  // "kohya_ss" / "kohya_gui" seen: sd-scripts run by the GUI
};

// The best-scoring trainer and family (unknown below the minimum score), and the model kind.
void identify(const IdentityScores& scores, const Settings& settings, Diagnosis& d);

}  // namespace lt::diagnose::detail
