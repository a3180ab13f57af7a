// Summary statistics of a sample (latencies, throughputs), computed the way
// Python benchmark tools compute them, so figures agree with theirs: the
// population standard deviation (numpy.std) and percentiles by linear
// interpolation between closest ranks (numpy.percentile's default).
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

namespace inferd::bench {

struct Summary {
  size_t count = 0;
  double mean = 0.0;
  double median = 0.0;
  double stddev = 0.0;  // population (divides by n)
  double min = 0.0;
  double max = 0.0;
  std::vector<std::pair<double, double>> percentiles;  // (p in [0, 100], value)

  // The value at percentile p if it was asked for, else 0.
  double at(double p) const;
};

// The p-th percentile (p in [0, 100]) of an ascending sample; 0 for an empty one.
double percentile_of_sorted(const std::vector<double>& sorted, double p);

// Mean, median, stddev, min, max and the given percentiles; all 0 for an empty sample.
Summary summarize(std::vector<double> values, const std::vector<double>& percentiles);

}  // namespace inferd::bench
