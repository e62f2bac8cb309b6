// golden/plot.h — loss curves as a self-contained SVG (no plotting dependency).
#pragma once

#include <string>
#include <vector>

#include "golden/trace.h"

namespace olmoref {

struct NamedTrace {
  std::string name;
  std::vector<TraceRecord> records;
};

// Top panel: loss per step for every trace. With two or more traces a bottom panel shows, per
// step, trace[i].loss − trace[0].loss, and the first step where any trace's loss bits differ from
// the first trace's is marked, so a reader sees at a glance where two runs part.
std::string loss_plot_svg(const std::vector<NamedTrace>& traces, const std::string& title);

}  // namespace olmoref
