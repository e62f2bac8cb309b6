#include "golden/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

namespace olmoref {

namespace {

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

struct Panel {
  double x0, y0, w, h;          // pixel box
  double xmin, xmax, ymin, ymax;
  double px(double x) const { return x0 + (xmax > xmin ? (x - xmin) / (xmax - xmin) : 0.5) * w; }
  double py(double y) const { return y0 + h - (ymax > ymin ? (y - ymin) / (ymax - ymin) : 0.5) * h; }
};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

void axes(std::ostringstream& o, const Panel& p, const std::string& ylabel) {
  o << "<rect x='" << p.x0 << "' y='" << p.y0 << "' width='" << p.w << "' height='" << p.h
    << "' fill='none' stroke='#444'/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double y = p.ymin + (p.ymax - p.ymin) * i / 4.0;
    const double x = std::round(p.xmin + (p.xmax - p.xmin) * i / 4.0);  // steps are integers
    o << "<line x1='" << p.x0 << "' x2='" << p.x0 + p.w << "' y1='" << p.py(y) << "' y2='" << p.py(y)
      << "' stroke='#ddd'/>\n";
    o << "<text x='" << p.x0 - 6 << "' y='" << p.py(y) + 4 << "' text-anchor='end' font-size='11'>" << num(y) << "</text>\n";
    o << "<text x='" << p.px(x) << "' y='" << p.y0 + p.h + 16 << "' text-anchor='middle' font-size='11'>"
      << num(x) << "</text>\n";
  }
  o << "<text x='" << p.x0 - 72 << "' y='" << p.y0 + p.h / 2 << "' font-size='12' transform='rotate(-90 "
    << p.x0 - 72 << " " << p.y0 + p.h / 2 << ")' text-anchor='middle'>" << esc(ylabel) << "</text>\n";
}

void polyline(std::ostringstream& o, const Panel& p, const std::vector<std::pair<double, double>>& pts,
              const char* color) {
  o << "<polyline fill='none' stroke='" << color << "' stroke-width='1.5' points='";
  for (auto& [x, y] : pts) o << p.px(x) << "," << p.py(y) << " ";
  o << "'/>\n";
}

}  // namespace

std::string loss_plot_svg(const std::vector<NamedTrace>& traces, const std::string& title) {
  const bool diff = traces.size() >= 2;
  const double W = 900, top_h = 360, bottom_h = diff ? 200 : 0, H = 70 + top_h + (diff ? bottom_h + 60 : 0) + 40;
  double xmin = std::numeric_limits<double>::max(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const auto& t : traces)
    for (const auto& r : t.records) {
      xmin = std::min(xmin, double(r.step));
      xmax = std::max(xmax, double(r.step));
      if (std::isfinite(r.loss)) {
        ymin = std::min(ymin, double(r.loss));
        ymax = std::max(ymax, double(r.loss));
      }
    }
  if (xmin > xmax) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  const double pad = (ymax - ymin) * 0.05 + 1e-12;
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n";
  o << "<text x='" << W / 2 << "' y='24' text-anchor='middle' font-size='16'>" << esc(title) << "</text>\n";
  Panel top{90, 50, W - 130, top_h, xmin, xmax, ymin - pad, ymax + pad};
  axes(o, top, "loss");
  for (size_t i = 0; i < traces.size(); ++i) {
    std::vector<std::pair<double, double>> pts;
    for (const auto& r : traces[i].records)
      if (std::isfinite(r.loss)) pts.emplace_back(r.step, r.loss);
    const char* color = kColors[i % 6];
    polyline(o, top, pts, color);
    o << "<text x='" << top.x0 + top.w - 10 << "' y='" << top.y0 + 18 + 16 * i << "' text-anchor='end' font-size='12' fill='"
      << color << "'>" << esc(traces[i].name) << "</text>\n";
  }
  if (diff) {
    // Per-step loss difference against the first trace, matched by step number.
    int64_t first_split = -1;
    double dmin = 0, dmax = 0;
    std::vector<std::vector<std::pair<double, double>>> series(traces.size());
    for (size_t i = 1; i < traces.size(); ++i)
      for (const auto& r : traces[i].records)
        for (const auto& a : traces[0].records)
          if (a.step == r.step) {
            const double d = double(r.loss) - double(a.loss);
            series[i].emplace_back(r.step, d);
            dmin = std::min(dmin, d);
            dmax = std::max(dmax, d);
            if (std::memcmp(&a.loss, &r.loss, 4) != 0 && (first_split < 0 || r.step < first_split)) first_split = r.step;
            break;
          }
    const double dpad = (dmax - dmin) * 0.05 + 1e-12;
    Panel bot{90, top.y0 + top_h + 50, W - 130, bottom_h, xmin, xmax, dmin - dpad, dmax + dpad};
    axes(o, bot, "loss − first trace's loss");
    o << "<line x1='" << bot.x0 << "' x2='" << bot.x0 + bot.w << "' y1='" << bot.py(0) << "' y2='" << bot.py(0)
      << "' stroke='#888' stroke-dasharray='2 2'/>\n";
    for (size_t i = 1; i < traces.size(); ++i) polyline(o, bot, series[i], kColors[i % 6]);
    const std::string note = first_split < 0 ? "loss bits identical at every common step"
                                             : "first differing step: " + std::to_string(first_split);
    if (first_split >= 0)
      o << "<line x1='" << bot.px(first_split) << "' x2='" << bot.px(first_split) << "' y1='" << top.y0 << "' y2='"
        << bot.y0 + bot.h << "' stroke='#d62728' stroke-dasharray='4 3'/>\n";
    o << "<text x='" << bot.x0 << "' y='" << bot.y0 - 8 << "' font-size='12'>" << esc(note) << "</text>\n";
  }
  o << "<text x='" << W / 2 << "' y='" << H - 10 << "' text-anchor='middle' font-size='12'>step</text>\n</svg>\n";
  return o.str();
}

}  // namespace olmoref
