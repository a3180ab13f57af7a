// Summary statistics and the serving benchmark's aggregate metrics, against
// values worked out by hand (numpy's definitions: linear-interpolated
// percentiles, population standard deviation).
#include <gtest/gtest.h>

#include <cmath>

#include "bench/serve_metrics.h"
#include "bench/stats.h"

namespace inferd::bench {
namespace {

TEST(BenchStats, PercentilesInterpolateBetweenClosestRanks) {
  const std::vector<double> sorted = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sorted, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sorted, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sorted, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sorted, 90), 3.7);  // rank 2.7
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sorted, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile_of_sorted({7.0}, 99), 7.0);
  EXPECT_DOUBLE_EQ(percentile_of_sorted({}, 50), 0.0);
}

TEST(BenchStats, SummarizeSortsAndUsesPopulationStddev) {
  const Summary s = summarize({4, 1, 3, 2}, {90, 99});
  EXPECT_EQ(s.count, 4u);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_DOUBLE_EQ(s.stddev, std::sqrt(1.25));
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 4);
  EXPECT_DOUBLE_EQ(s.at(90), 3.7);
  EXPECT_DOUBLE_EQ(s.at(99), 3.97);
  EXPECT_DOUBLE_EQ(s.at(50), 0.0);  // not asked for
}

TEST(BenchStats, EmptySampleIsAllZero) {
  const Summary s = summarize({}, {99});
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.mean, 0.0);
  EXPECT_EQ(s.stddev, 0.0);
  ASSERT_EQ(s.percentiles.size(), 1u);
  EXPECT_EQ(s.percentiles[0].second, 0.0);
}

RequestResult ok(double start, double ttft, std::vector<double> itl, int64_t in, int64_t out) {
  RequestResult r;
  r.success = true;
  r.start_time = start;
  r.ttft = ttft;
  r.itl = std::move(itl);
  r.content_chunks = static_cast<int64_t>(r.itl.size()) + 1;
  r.latency = ttft;
  for (double g : r.itl) r.latency += g;
  r.prompt_len = in;
  r.output_len = out;
  return r;
}

TEST(BenchServeMetrics, AggregatesCompletedRequestsOnly) {
  std::vector<RequestResult> rs;
  rs.push_back(ok(0.0, 0.1, {0.2, 0.2}, 10, 3));  // latency 0.5, TPOT (0.5-0.1)/2 = 0.2
  rs.push_back(ok(0.5, 0.3, {}, 20, 1));           // one token: no TPOT
  RequestResult bad;
  bad.error = "HTTP 500: boom";
  rs.push_back(bad);
  const ServeMetrics m = compute_serve_metrics(rs, 2.0, {50});
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 30);
  EXPECT_EQ(m.total_output, 4);
  EXPECT_EQ(m.output_lens, (std::vector<int64_t>{3, 1, 0}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 2.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 17.0);
  EXPECT_EQ(m.ttft.count, 2u);
  EXPECT_DOUBLE_EQ(m.ttft.mean, 0.2);
  EXPECT_EQ(m.tpot.count, 1u);
  EXPECT_DOUBLE_EQ(m.tpot.mean, 0.2);
  EXPECT_EQ(m.itl.count, 2u);
  EXPECT_DOUBLE_EQ(m.e2el.max, 0.5);
  // [0, 0.5) and [0.5, 0.8): they touch but never overlap.
  EXPECT_EQ(m.max_concurrent_requests, 1);
  // Tokens at 0.1, 0.3, 0.5 (second 0) and 0.8 (second 0): all in the first second.
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 4.0);
}

TEST(BenchServeMetrics, ResultBlockHasVllmLayout) {
  std::vector<RequestResult> rs = {ok(0.0, 0.1, {0.2}, 10, 2)};
  const ServeMetrics m = compute_serve_metrics(rs, 1.0, {90, 99});
  ServeRunInfo info;
  info.request_rate = INFINITY;
  info.max_concurrency = 4;
  info.percentile_metrics = {"ttft", "itl"};
  info.percentiles = {90, 99};
  const std::string block = format_result_block(m, info);
  EXPECT_EQ(block.substr(0, 51), "============ Serving Benchmark Result ============\n");
  EXPECT_NE(block.find("Successful requests:                     1         \n"), std::string::npos);
  EXPECT_NE(block.find("Maximum request concurrency:             4"), std::string::npos);
  EXPECT_EQ(block.find("Request rate configured"), std::string::npos);  // infinite rate
  EXPECT_NE(block.find("---------------Time to First Token----------------\n"), std::string::npos);
  EXPECT_NE(block.find("Mean TTFT (ms):                          100.00"), std::string::npos);
  EXPECT_NE(block.find("P99 ITL (ms):                            200.00"), std::string::npos);
  EXPECT_EQ(block.find("TPOT"), std::string::npos);  // not selected
  EXPECT_TRUE(block.ends_with(std::string(50, '=') + "\n"));
}

TEST(BenchServeMetrics, JsonCarriesTotalsAndPerRequestArrays) {
  std::vector<RequestResult> rs = {ok(0.0, 0.1, {0.2}, 10, 2), ok(0.1, 0.1, {}, 5, 1)};
  const ServeMetrics m = compute_serve_metrics(rs, 1.0, {99.9});
  ServeRunInfo info;
  info.request_rate = INFINITY;
  info.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  info.percentiles = {99.9};
  const nlohmann::json j = result_json(m, info, rs, false);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["total_output_tokens"], 3);
  EXPECT_EQ(j["output_lens"], nlohmann::json({2, 1}));
  EXPECT_EQ(j["input_lens"], nlohmann::json({10, 5}));
  EXPECT_EQ(j["ttfts"].size(), 2u);
  EXPECT_EQ(j["itls"][0].size(), 1u);
  EXPECT_TRUE(j.contains("p99.9_ttft_ms"));
  EXPECT_TRUE(j.contains("std_e2el_ms"));
  EXPECT_FALSE(j.contains("generated_texts"));
}

TEST(BenchServeMetrics, ParsesMetricNamesAndPercentiles) {
  auto names = parse_metric_names("ttft, itl");
  ASSERT_TRUE(names);
  EXPECT_EQ(*names, (std::vector<std::string>{"ttft", "itl"}));
  EXPECT_FALSE(parse_metric_names("ttft,latency"));
  auto ps = parse_percentiles("50,90,99.9");
  ASSERT_TRUE(ps);
  EXPECT_EQ(*ps, (std::vector<double>{50, 90, 99.9}));
  EXPECT_FALSE(parse_percentiles("101"));
  EXPECT_FALSE(parse_percentiles("9x"));
}

}  // namespace
}  // namespace inferd::bench
