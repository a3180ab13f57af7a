// The serving benchmark's client end to end against a scripted HTTP server on
// a local socket: SSE split at awkward places and sent chunked or
// close-delimited, usage counted, errors recorded per request, kept-alive
// connections reused, and the concurrency cap respected. Nothing here depends
// on how fast anything runs.
#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <istream>
#include <mutex>
#include <thread>

#include "bench/serve_benchmark.h"

namespace inferd::bench {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// Answers each request by the "model" it names:
//   "chunked": 200, SSE in chunked encoding, three text chunks then usage and [DONE];
//   "close":   200, the same events ending with the connection (no length, not chunked);
//   "bad":     400 with a JSON error;
//   "midway":  200, one text chunk, then an error event.
// Counts connections and the most requests in flight at once.
class ScriptedServer {
 public:
  ScriptedServer() : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    thread_ = std::thread([this] { accept_loop(); });
  }
  ~ScriptedServer() {
    stopping_ = true;
    boost::system::error_code ec;
    // Wake the blocking accept with a throwaway connection.
    tcp::socket poke(io_);
    poke.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : handlers_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()); }
  int connections() const { return connections_; }
  int max_in_flight() const { return max_in_flight_; }

 private:
  void accept_loop() {
    for (;;) {
      tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (stopping_ || ec) return;
      ++connections_;
      std::lock_guard<std::mutex> lock(mu_);
      handlers_.emplace_back([this, s = std::move(socket)]() mutable { serve(std::move(s)); });
    }
  }

  static std::string sse(const std::string& json) { return "data: " + json + "\n\n"; }

  static std::string events() {
    return sse(R"({"choices":[{"text":"He","finish_reason":null}]})") + ": ping\n\n" +
           sse(R"({"choices":[{"text":"llo","finish_reason":null}]})") +
           sse(R"({"choices":[{"text":"!","finish_reason":null}]})") +
           sse(R"({"choices":[{"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":11,"completion_tokens":3}})") +
           sse("[DONE]");
  }

  // Writes `body` as HTTP chunks of a few bytes each, so lines and events straddle chunks.
  static void write_chunked(tcp::socket& s, const std::string& body) {
    for (size_t i = 0; i < body.size(); i += 7) {
      const std::string piece = body.substr(i, 7);
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
      asio::write(s, asio::buffer(std::string(size) + piece + "\r\n"));
    }
    asio::write(s, asio::buffer(std::string("0\r\n\r\n")));
  }

  void serve(tcp::socket s) {
    asio::streambuf buf;
    boost::system::error_code ec;
    for (;;) {  // requests on this connection, while it is kept alive
      const size_t head_len = asio::read_until(s, buf, "\r\n\r\n", ec);
      if (ec) return;
      std::string head(asio::buffers_begin(buf.data()), asio::buffers_begin(buf.data()) + head_len);
      buf.consume(head_len);
      size_t length = 0;
      if (const size_t at = head.find("Content-Length: "); at != std::string::npos)
        length = std::stoul(head.substr(at + 16));
      if (buf.size() < length) asio::read(s, buf, asio::transfer_exactly(length - buf.size()), ec);
      if (ec) return;
      std::string body(asio::buffers_begin(buf.data()), asio::buffers_begin(buf.data()) + length);
      buf.consume(length);
      const int now = ++in_flight_;
      for (int seen = max_in_flight_; now > seen && !max_in_flight_.compare_exchange_weak(seen, now);) {}
      // Hold the request a moment so requests allowed to overlap do overlap.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const std::string model = nlohmann::json::parse(body)["model"];
      bool keep = true;
      if (model == "chunked") {
        asio::write(s, asio::buffer(std::string(
                           "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")));
        write_chunked(s, events());
      } else if (model == "close") {
        asio::write(s, asio::buffer("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" +
                                    events()));
        keep = false;
      } else if (model == "midway") {
        const std::string b = sse(R"({"choices":[{"text":"x"}]})") + sse(R"({"error":{"message":"out of memory"}})");
        asio::write(s, asio::buffer("HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b));
      } else {
        const std::string b = R"({"error":{"message":"no such model"}})";
        asio::write(s, asio::buffer("HTTP/1.1 400 Bad Request\r\nContent-Length: " + std::to_string(b.size()) +
                                    "\r\n\r\n" + b));
      }
      --in_flight_;
      if (!keep) {
        s.shutdown(tcp::socket::shutdown_both, ec);
        return;
      }
    }
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::thread> handlers_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0}, in_flight_{0}, max_in_flight_{0};
};

std::vector<SampleRequest> token_prompts(int n) {
  std::vector<SampleRequest> reqs(static_cast<size_t>(n));
  for (SampleRequest& r : reqs) {
    r.prompt = std::vector<int32_t>{1, 2, 3};
    r.prompt_len = 3;
    r.expected_output_len = 3;
  }
  return reqs;
}

ServeBenchmarkConfig config_for(const ScriptedServer& server, const std::string& model) {
  ServeBenchmarkConfig c;
  c.base = *parse_base_url(server.url());
  c.request.model = model;
  c.request_timeout_s = 30;
  return c;
}

TEST(BenchServeClient, ChunkedStreamsAreTimedAndCountedByUsage) {
  ScriptedServer server;
  ServeBenchmarkConfig c = config_for(server, "chunked");
  c.max_concurrency = 2;
  c.num_warmups = 2;
  auto run = run_serve_benchmark(c, token_prompts(6));
  ASSERT_TRUE(run) << run.error().message;
  ASSERT_EQ(run->results.size(), 6u);
  for (const RequestResult& r : run->results) {
    EXPECT_TRUE(r.success) << r.error;
    EXPECT_EQ(r.content_chunks, 3);
    EXPECT_EQ(r.output_len, 3);   // from usage
    EXPECT_EQ(r.prompt_len, 11);  // the server's count wins over the dataset's
    EXPECT_TRUE(r.usage_reported);
    EXPECT_EQ(r.itl.size(), 2u);
    EXPECT_EQ(r.generated_text, "Hello!");
    EXPECT_GE(r.latency, r.ttft);
    EXPECT_GE(r.start_time, 0.0);
  }
  EXPECT_LE(server.max_in_flight(), 2);
  // Kept-alive connections are reused: two slots need two connections, not eight.
  EXPECT_LE(server.connections(), 2);
}

TEST(BenchServeClient, CloseDelimitedBodiesAndUnlimitedConcurrency) {
  ScriptedServer server;
  auto run = run_serve_benchmark(config_for(server, "close"), token_prompts(5));
  ASSERT_TRUE(run) << run.error().message;
  for (const RequestResult& r : run->results) {
    EXPECT_TRUE(r.success) << r.error;
    EXPECT_EQ(r.output_len, 3);
  }
  EXPECT_EQ(server.connections(), 5);  // the server closed every one
}

TEST(BenchServeClient, ErrorsAreRecordedPerRequest) {
  ScriptedServer server;
  auto bad = run_serve_benchmark(config_for(server, "bad"), token_prompts(2));
  ASSERT_TRUE(bad) << bad.error().message;
  for (const RequestResult& r : bad->results) {
    EXPECT_FALSE(r.success);
    EXPECT_NE(r.error.find("HTTP 400"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("no such model"), std::string::npos) << r.error;
    EXPECT_EQ(r.output_len, 0);
  }
  auto midway = run_serve_benchmark(config_for(server, "midway"), token_prompts(1));
  ASSERT_TRUE(midway);
  EXPECT_FALSE(midway->results[0].success);
  EXPECT_NE(midway->results[0].error.find("out of memory"), std::string::npos);
}

TEST(BenchServeClient, ReadyCheckGivesUpOnAServerThatNeverSucceeds) {
  ScriptedServer server;
  ServeBenchmarkConfig c = config_for(server, "bad");
  c.ready_check_timeout_s = 0.01;
  auto run = run_serve_benchmark(c, token_prompts(1));
  ASSERT_FALSE(run);
  EXPECT_NE(run.error().message.find("initial test run failed"), std::string::npos);
}

TEST(BenchServeClient, UnreachableServerFailsEachRequest) {
  ServeBenchmarkConfig c;
  c.base = *parse_base_url("http://127.0.0.1:1");
  c.request.model = "m";
  auto run = run_serve_benchmark(c, token_prompts(2));
  ASSERT_TRUE(run);
  for (const RequestResult& r : run->results) EXPECT_NE(r.error.find("cannot connect"), std::string::npos);
}

TEST(BenchArrivals, PoissonGapsAverageTheRate) {
  const std::vector<double> all_at_once = arrival_offsets(5, INFINITY, 1.0, 0);
  EXPECT_EQ(all_at_once, std::vector<double>(5, 0.0));
  const std::vector<double> t = arrival_offsets(20001, 50.0, 1.0, 7);
  EXPECT_EQ(t[0], 0.0);
  for (size_t i = 1; i < t.size(); ++i) EXPECT_GE(t[i], t[i - 1]);
  EXPECT_NEAR(t.back() / 20000, 1.0 / 50.0, 0.001);  // mean gap; 20,000 draws: ~0.7% standard error
  EXPECT_EQ(arrival_offsets(100, 50.0, 1.0, 7), arrival_offsets(100, 50.0, 1.0, 7));
  // Burstiness above 1 spaces arrivals more evenly: the gaps' spread shrinks.
  auto spread = [](const std::vector<double>& x) {
    double mean = x.back() / static_cast<double>(x.size() - 1), sq = 0;
    for (size_t i = 1; i < x.size(); ++i) sq += (x[i] - x[i - 1] - mean) * (x[i] - x[i - 1] - mean);
    return std::sqrt(sq / static_cast<double>(x.size() - 1)) / mean;
  };
  EXPECT_NEAR(spread(t), 1.0, 0.05);  // exponential: coefficient of variation 1
  EXPECT_NEAR(spread(arrival_offsets(20001, 50.0, 4.0, 7)), 0.5, 0.05);  // gamma(4): 1/sqrt(4)
}

}  // namespace
}  // namespace inferd::bench
