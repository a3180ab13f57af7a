// What the client observed of one request. Times are seconds on the steady
// clock, relative to the start of the benchmark.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace inferd::bench {

struct RequestResult {
  bool success = false;
  std::string error;        // why it failed ("" on success)
  int64_t prompt_len = 0;   // the server's usage.prompt_tokens, else the dataset's count
  int64_t output_len = 0;   // usage.completion_tokens, else one per chunk with text
  int64_t cached_len = 0;   // prompt tokens the server says it took from its prefix cache
  int64_t content_chunks = 0;  // chunks that carried output text
  bool usage_reported = false;
  double start_time = 0.0;  // request sent (after any wait for a concurrency slot)
  double queue_time = 0.0;  // waited for a concurrency slot after its arrival time
  double ttft = 0.0;        // first chunk with text, after start_time
  std::vector<double> itl;  // gaps between successive chunks with text
  double latency = 0.0;     // the whole response read, after start_time
  std::string generated_text;
};

}  // namespace inferd::bench
