#include "bench/stats.h"

#include <algorithm>
#include <cmath>

namespace inferd::bench {

double Summary::at(double p) const {
  for (const auto& [q, v] : percentiles)
    if (q == p) return v;
  return 0.0;
}

double percentile_of_sorted(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Summary summarize(std::vector<double> values, const std::vector<double>& percentiles) {
  Summary s;
  s.count = values.size();
  for (double p : percentiles) s.percentiles.emplace_back(p, 0.0);
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  // Sum in ascending order: the smallest terms are added first.
  double sum = 0.0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  double sq = 0.0;
  for (double v : values) sq += (v - s.mean) * (v - s.mean);
  s.stddev = std::sqrt(sq / static_cast<double>(values.size()));
  s.median = percentile_of_sorted(values, 50.0);
  s.min = values.front();
  s.max = values.back();
  for (auto& [p, v] : s.percentiles) v = percentile_of_sorted(values, p);
  return s;
}

}  // namespace inferd::bench
