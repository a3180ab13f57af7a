// The KV transfer's transport with no model: a producer and a consumer agent
// in one process (and one test with the producer in another), over loopback
// (UCX's TCP, and cross-memory attach), on pools laid out as the engine's
// (keys and values, a slab per layer).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "core/shared_bytes.h"
#include "kvtransfer/descriptor.h"
#include "kvtransfer/lease_table.h"
#include "kvtransfer/ucx_agent.h"

namespace inferd::kvtransfer {
namespace {

constexpr int32_t kSlabs = 3;
constexpr uint64_t kSegment = 4096;

struct Pool {
  explicit Pool(int64_t n_blocks, uint32_t seed) : n_blocks(n_blocks) {
    for (auto& r : bytes) {
      r.resize(kSlabs * n_blocks * kSegment);
      std::mt19937 rng(seed++);
      for (auto& b : r) b = static_cast<std::byte>(rng());
    }
  }
  PoolMemory memory() {
    return PoolMemory{{bytes[0].data(), bytes[1].data()}, kSlabs, n_blocks, kSegment};
  }
  // Block b's bytes, segment by segment.
  std::vector<std::byte> block(int64_t b) const {
    std::vector<std::byte> out;
    for (const auto& r : bytes)
      for (int32_t s = 0; s < kSlabs; ++s) {
        const std::byte* p = r.data() + (s * n_blocks + b) * kSegment;
        out.insert(out.end(), p, p + kSegment);
      }
    return out;
  }
  int64_t n_blocks;
  std::vector<std::byte> bytes[2];
};

// A producer's pool on shared memory (as a KV producer's KV cache is), with
// the bytes Pool gives for the same seed; memory() offers its memfds under
// `name` (a consumer on this host maps them when the name is the one it expects).
struct SharedPool {
  explicit SharedPool(int64_t n_blocks, uint32_t seed, std::string name = "inferd-kv") : n_blocks(n_blocks), name(name) {
    const Pool same(n_blocks, seed);
    for (int i = 0; i < 2; ++i) {
      auto b = SharedBytes::create(same.bytes[i].size(), "inferd-kv");
      EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.error().message);
      regions[i] = std::move(*b);
      std::memcpy(regions[i].data(), same.bytes[i].data(), same.bytes[i].size());
    }
  }
  PoolMemory memory() {
    PoolMemory m{{reinterpret_cast<std::byte*>(regions[0].data()), reinterpret_cast<std::byte*>(regions[1].data())},
                 kSlabs, n_blocks, kSegment};
    m.region_fds = {regions[0].fd(), regions[1].fd()};
    m.shared_name = name;
    return m;
  }
  int64_t n_blocks;
  std::string name;
  SharedBytes regions[2];
};

KVDescriptor descriptor() {
  KVDescriptor d;
  d.fingerprint = 0x1234;
  d.dtype = 1;
  d.block_size = 16;
  d.n_layers = kSlabs;
  d.n_kv_heads = 2;
  d.head_dim = 64;
  d.layers_per_block = kSlabs;
  d.block_bytes = 2 * kSlabs * kSegment;
  d.group_windows = {0};
  d.layer_group = {0, 0, 0};
  return d;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

PullResult wait_for(UcxAgent& agent, double timeout_s = 20.0) {
  const double until = now_s() + timeout_s;
  while (now_s() < until) {
    std::vector<PullResult> done = agent.take_finished();
    if (!done.empty()) return done[0];
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "no pull finished within " << timeout_s << " s";
  return {};
}

// A loopback TCP socket on a free port (*port): listening, or closed again
// (a port nobody listens on). Returns the socket, or -1 once closed.
int loopback_socket(bool listening, uint16_t* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  if (listening) {
    EXPECT_EQ(listen(fd, 4), 0);
  }
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *port = ntohs(sa.sin_port);
  if (listening) return fd;
  close(fd);
  return -1;
}

// Each test picks the UCX transports before its agents read the configuration.
class UcxAgentTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { setenv("UCX_TLS", GetParam(), 1); }
  void TearDown() override { unsetenv("UCX_TLS"); }

  template <class AnyPool>
  std::unique_ptr<UcxAgent> producer(AnyPool& pool, LeaseTable& leases, KVDescriptor d = descriptor()) {
    AgentConfig c;
    c.descriptor = d;
    c.pool = pool.memory();
    c.engine_id = "prefill-0";
    c.listen = true;
    c.ip = "127.0.0.1";
    c.port = 0;
    c.leases = &leases;
    auto a = UcxAgent::create(c);
    EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.error().message);
    EXPECT_NE((*a)->port(), 0);
    return std::move(*a);
  }
  // A pull from this process's producer on `port`, waited for.
  static PullResult pull(UcxAgent& cons, uint16_t port, const std::string& engine, uint64_t lease,
                         std::vector<std::pair<int32_t, int32_t>> blocks, double timeout_s = 10.0) {
    static uint64_t next_id = 1;
    cons.start_pull(PullSpec{next_id++, "127.0.0.1", port, engine, lease, std::move(blocks), timeout_s});
    return wait_for(cons);
  }
  static void expect_failure(const PullResult& r, const std::string& why) {
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find(why), std::string::npos) << r.error;
  }
  void kill_producer_mid_pull(bool shared);
  std::unique_ptr<UcxAgent> consumer(Pool& pool, KVDescriptor d = descriptor()) {
    AgentConfig c;
    c.descriptor = d;
    c.pool = pool.memory();
    c.engine_id = "decode-0";
    auto a = UcxAgent::create(c);
    EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.error().message);
    return std::move(*a);
  }
};

TEST_P(UcxAgentTest, BlocksArriveByteIdenticalAndTheLeaseEnds) {
  Pool prod_pool(40, 1), cons_pool(24, 100);
  LeaseTable leases;
  leases.add(7, now_s() + 60);
  auto prod = producer(prod_pool, leases);
  auto cons = consumer(cons_pool);
  const Pool before = cons_pool;
  // Scattered and consecutive blocks on both sides: runs and single blocks.
  std::vector<std::pair<int32_t, int32_t>> blocks = {{5, 3}, {6, 4}, {7, 5}, {30, 9}, {1, 10}, {39, 23}, {12, 1}};
  PullSpec spec{42, "127.0.0.1", prod->port(), "prefill-0", 7, blocks, 10.0};
  cons->start_pull(spec);
  PullResult r = wait_for(*cons);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.id, 42u);
  EXPECT_EQ(r.bytes, blocks.size() * 2 * kSlabs * kSegment);
  for (const auto& [remote, local] : blocks) EXPECT_EQ(cons_pool.block(local), prod_pool.block(remote)) << local;
  // Blocks not pulled are untouched.
  for (int64_t b : {0, 2, 6, 22}) EXPECT_EQ(cons_pool.block(b), before.block(b)) << b;
  // The release ended the lease, and the engine is told so.
  EXPECT_EQ(leases.stats().held, 0);
  EXPECT_EQ(leases.stats().released, 1);
  EXPECT_EQ(leases.take_ended(now_s()), std::vector<uint64_t>{7});
  const AgentStats s = cons->stats();
  EXPECT_EQ(s.handshakes, 1);
  // With CMA allowed (UCX_TLS), the reads on one host are process_vm_readv
  // calls; with UCX_TLS=tcp they stay on UCX's TCP.
  EXPECT_EQ(s.shared_memory_handshakes, std::string(GetParam()) == "tcp" ? 0 : 1);
  EXPECT_EQ(s.pulls_ok, 1);
  EXPECT_EQ(s.blocks_received, static_cast<int64_t>(blocks.size()));

  // A second pull reuses the connection (no second handshake).
  leases.add(8, now_s() + 60);
  cons->start_pull(PullSpec{43, "127.0.0.1", prod->port(), "prefill-0", 8, {{20, 2}}, 10.0});
  r = wait_for(*cons);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(cons_pool.block(2), prod_pool.block(20));
  EXPECT_EQ(cons->stats().handshakes, 1);
}

// A producer whose pool is on shared memory: on one host (UCX_TLS allowing
// shared memory) the consumer maps it and copies blocks with memcpy; a name it
// does not expect leaves it reading by cross-memory attach. The bytes are the
// same either way.
TEST_P(UcxAgentTest, AProducerOnSharedMemoryIsMappedWhereTheNameIsRight) {
  const bool shm = std::string(GetParam()) != "tcp";
  SharedPool prod_pool(40, 1), other_pool(40, 5, "not-inferd-kv");
  Pool cons_pool(24, 100);
  const Pool want(40, 1), want_other(40, 5);
  LeaseTable leases;
  for (uint64_t lease : {7, 8}) leases.add(lease, now_s() + 60);
  auto prod = producer(prod_pool, leases);
  auto cons = consumer(cons_pool);
  std::vector<std::pair<int32_t, int32_t>> blocks = {{5, 3}, {6, 4}, {7, 5}, {30, 9}, {1, 10}, {39, 23}, {12, 1}};
  PullResult r = pull(*cons, prod->port(), "prefill-0", 7, blocks);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.bytes, blocks.size() * 2 * kSlabs * kSegment);
  for (const auto& [remote, local] : blocks) EXPECT_EQ(cons_pool.block(local), want.block(remote)) << local;
  EXPECT_EQ(cons->stats().mapped_handshakes, shm ? 1 : 0);
  EXPECT_EQ(leases.stats().released, 1);

  auto other = producer(other_pool, leases);
  r = pull(*cons, other->port(), "prefill-0", 8, {{2, 2}, {39, 6}});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(cons_pool.block(2), want_other.block(2));
  EXPECT_EQ(cons_pool.block(6), want_other.block(39));
  const AgentStats s = cons->stats();
  EXPECT_EQ(s.handshakes, 2);
  EXPECT_EQ(s.shared_memory_handshakes, shm ? 2 : 0);
  EXPECT_EQ(s.mapped_handshakes, shm ? 1 : 0);
}

TEST_P(UcxAgentTest, AnUnusedLeaseIsGivenBackWithoutAResult) {
  Pool prod_pool(8, 1), cons_pool(8, 2);
  LeaseTable leases;
  leases.add(5, now_s() + 60);
  auto prod = producer(prod_pool, leases);
  auto cons = consumer(cons_pool);
  const Pool before = cons_pool;
  cons->release_lease("127.0.0.1", prod->port(), "prefill-0", 5);
  const double until = now_s() + 10.0;
  while (cons->stats().leases_released_unused == 0 && now_s() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(cons->stats().leases_released_unused, 1);
  EXPECT_EQ(leases.stats().held, 0);
  EXPECT_EQ(leases.stats().released, 1);
  EXPECT_TRUE(cons->take_finished().empty());  // not a pull: nobody waits for it
  EXPECT_EQ(cons->stats().pulls_ok, 0);
  for (int64_t b = 0; b < 8; ++b) EXPECT_EQ(cons_pool.block(b), before.block(b)) << b;
  // A pull after it on the same connection still works.
  leases.add(6, now_s() + 60);
  ASSERT_TRUE(pull(*cons, prod->port(), "prefill-0", 6, {{3, 4}}).ok);
  EXPECT_EQ(cons_pool.block(4), prod_pool.block(3));
}

TEST_P(UcxAgentTest, AMismatchedPeerIsRefusedByName) {
  Pool prod_pool(8, 1), cons_pool(8, 2);
  LeaseTable leases;
  leases.add(1, now_s() + 60);
  auto prod = producer(prod_pool, leases);
  KVDescriptor other = descriptor();
  other.block_size = 32;
  auto cons = consumer(cons_pool, other);
  const Pool before = cons_pool;
  expect_failure(pull(*cons, prod->port(), "", 1, {{1, 1}}), "block size differs");
  EXPECT_EQ(cons_pool.block(1), before.block(1));
  EXPECT_EQ(prod->stats().peers_refused, 1);
  EXPECT_EQ(cons->stats().refusals, 1);
  // The lease was not released by a refused peer: it expires on its own.
  EXPECT_EQ(leases.stats().held, 1);
}

// A consumer whose cache is another dtype (here q8_0 against the producer's
// f16) refuses the producer before reading a byte, even with pools of the
// same shape: the bytes would read as other numbers. (The engine then
// computes the prompt itself.)
TEST_P(UcxAgentTest, AConsumerOfAnotherKVDTypeRefusesTheProducer) {
  Pool prod_pool(8, 1), cons_pool(8, 2);
  LeaseTable leases;
  leases.add(1, now_s() + 60);
  KVDescriptor f16 = descriptor();
  f16.group_specs = {kv::KVCacheSpec::full_attention(DType::F16, 2, 64, 16)};
  auto prod = producer(prod_pool, leases, f16);
  KVDescriptor q8 = f16;
  q8.dtype = static_cast<int32_t>(DType::Q8_0);
  q8.group_specs = {kv::KVCacheSpec::full_attention(DType::Q8_0, 2, 64, 16)};
  auto cons = consumer(cons_pool, q8);
  const Pool before = cons_pool;
  expect_failure(pull(*cons, prod->port(), "", 1, {{1, 1}, {2, 2}}), "KV dtype differs");
  EXPECT_EQ(cons_pool.block(1), before.block(1));
  EXPECT_EQ(cons_pool.block(2), before.block(2));
  EXPECT_EQ(cons->stats().refusals, 1);
  EXPECT_EQ(prod->stats().peers_refused, 1);
  // Only the group specs differing (a descriptor whose dtype field agrees) is refused too.
  KVDescriptor specs_only = f16;
  specs_only.group_specs = q8.group_specs;
  auto cons2 = consumer(cons_pool, specs_only);
  expect_failure(pull(*cons2, prod->port(), "", 1, {{1, 1}}), "KV group 0 differs");
  EXPECT_EQ(cons_pool.block(1), before.block(1));
}

TEST_P(UcxAgentTest, AnotherEngineOnThePortIsRefused) {
  Pool prod_pool(8, 1), cons_pool(8, 2);
  LeaseTable leases;
  auto prod = producer(prod_pool, leases);
  auto cons = consumer(cons_pool);
  expect_failure(pull(*cons, prod->port(), "prefill-9", 1, {{1, 1}}), "prefill-9");
}

TEST_P(UcxAgentTest, AnExpiredLeaseFailsThePull) {
  Pool prod_pool(8, 1), cons_pool(8, 2);
  LeaseTable leases;
  leases.add(3, now_s() - 1);  // already past its deadline
  EXPECT_EQ(leases.take_ended(now_s()), std::vector<uint64_t>{3});
  EXPECT_EQ(leases.stats().expired, 1);
  auto prod = producer(prod_pool, leases);
  auto cons = consumer(cons_pool);
  expect_failure(pull(*cons, prod->port(), "prefill-0", 3, {{1, 1}}), "lease had expired");
}

TEST_P(UcxAgentTest, OutOfRangeBlocksAreRefusedBeforeAnyRead) {
  Pool prod_pool(8, 1), cons_pool(8, 2);
  LeaseTable leases;
  leases.add(1, now_s() + 60);
  auto prod = producer(prod_pool, leases);
  auto cons = consumer(cons_pool);
  expect_failure(pull(*cons, prod->port(), "", 1, {{8, 1}}), "out of range");
  expect_failure(pull(*cons, prod->port(), "", 1, {{0, 1}}), "out of range");  // the null block
}

TEST_P(UcxAgentTest, NoProducerFailsAtOnce) {
  Pool cons_pool(8, 2);
  auto cons = consumer(cons_pool);
  uint16_t port = 0;
  loopback_socket(false, &port);  // nobody listens there
  const double t0 = now_s();
  EXPECT_FALSE(pull(*cons, port, "", 1, {{1, 1}}, 3.0).ok);
  EXPECT_LT(now_s() - t0, 3.5);
}

TEST_P(UcxAgentTest, ASilentPeerTimesOut) {
  Pool cons_pool(8, 2);
  auto cons = consumer(cons_pool);
  // Listens (the kernel completes the TCP handshake) but never answers.
  uint16_t port = 0;
  const int fd = loopback_socket(true, &port);
  const double t0 = now_s();
  expect_failure(pull(*cons, port, "", 1, {{1, 1}}, 1.0), "timed out");
  EXPECT_GE(now_s() - t0, 0.9);
  EXPECT_LT(now_s() - t0, 3.0);
  EXPECT_EQ(cons->stats().pulls_timed_out, 1);
  close(fd);
}

TEST_P(UcxAgentTest, AProducerThatWentAwayFailsThePullAtOnce) {
  Pool prod_pool(64, 1), cons_pool(64, 2);
  LeaseTable leases;
  leases.add(1, now_s() + 60);
  auto prod = producer(prod_pool, leases);
  auto cons = consumer(cons_pool);
  const uint16_t port = prod->port();
  std::vector<std::pair<int32_t, int32_t>> one = {{1, 1}};
  cons->start_pull(PullSpec{1, "127.0.0.1", port, "", 1, one, 10.0});
  ASSERT_TRUE(wait_for(*cons).ok);
  prod.reset();  // the producer goes away; the consumer's connection breaks
  const double t0 = now_s();
  cons->start_pull(PullSpec{2, "127.0.0.1", port, "", 1, {{2, 2}, {3, 3}}, 3.0});
  PullResult r = wait_for(*cons);
  EXPECT_FALSE(r.ok);
  EXPECT_LT(now_s() - t0, 3.5);
}

// A producer in another process, killed (SIGKILL) while a consumer reads
// from it: the pulls in flight and after end, ok with the right bytes or
// failed, never hung, and the consumer recovers.
constexpr int64_t kProcessPoolBlocks = 1024;  // 24 MiB a pool: a pull of it takes a while
constexpr const char* kProducerPipeEnv = "INFERD_TEST_PRODUCER_PIPE";
constexpr const char* kProducerSharedEnv = "INFERD_TEST_PRODUCER_SHARED";  // its pool on shared memory

// The producer's pool on its own memory (read by process_vm_readv on one
// host), then on shared memory (mapped by the consumer): a consumer's mapping
// outlives the producer, and the pull still fails where its lease cannot end.
TEST_P(UcxAgentTest, AProducerProcessKilledMidPullNeverHangsTheConsumer) {
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "pool on shared memory" : "pool on the producer's own memory");
    kill_producer_mid_pull(shared);
  }
}

void UcxAgentTest::kill_producer_mid_pull(bool shared) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string filter = "--gtest_filter=UcxProducerProcess.ServesUntilKilled";
  const std::string env_pipe = std::string(kProducerPipeEnv) + "=" + std::to_string(fds[1]);
  const std::string env_tls = std::string("UCX_TLS=") + GetParam();
  std::vector<std::string> env_strings = {env_pipe, env_tls, std::string(kProducerSharedEnv) + (shared ? "=1" : "=0")};
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "UCX_TLS=", 8) != 0 && std::strncmp(*e, "GTEST_", 6) != 0 &&
        std::strncmp(*e, kProducerSharedEnv, std::strlen(kProducerSharedEnv)) != 0)
      env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  char* argv[] = {self.data(), const_cast<char*>(filter.c_str()), nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  close(fds[1]);
  uint16_t port = 0;
  ASSERT_EQ(::read(fds[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  close(fds[0]);

  Pool cons_pool(kProcessPoolBlocks, 2);
  const Pool prod_pool(kProcessPoolBlocks, 1);  // the child's pool: the same seed, the same bytes
  auto cons = consumer(cons_pool);
  // One pull while it lives: the right bytes.
  PullResult r = pull(*cons, port, "prefill-0", 1, {{1, 1}, {2, 2}});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(cons_pool.block(2), prod_pool.block(2));
  // Then every block in one pull, and the producer killed as it runs.
  std::vector<std::pair<int32_t, int32_t>> all;
  for (int32_t b = 1; b < kProcessPoolBlocks; ++b) all.emplace_back(b, b);
  const double t0 = now_s();
  cons->start_pull(PullSpec{1000, "127.0.0.1", port, "prefill-0", 2, all, 5.0});
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  r = wait_for(*cons);
  EXPECT_EQ(r.id, 1000u);
  EXPECT_LT(now_s() - t0, 5.5);
  if (r.ok) {  // it may have finished before the kill landed
    for (int32_t b : {1, 500, 1023}) EXPECT_EQ(cons_pool.block(b), prod_pool.block(b)) << b;
  }
  // A pull after the death fails at once, and the consumer is still usable.
  const double t1 = now_s();
  EXPECT_FALSE(pull(*cons, port, "prefill-0", 3, {{3, 3}}, 3.0).ok);
  EXPECT_LT(now_s() - t1, 3.5);
  EXPECT_GE(cons->stats().pulls_failed, 1);
  EXPECT_EQ(cons->stats().mapped_handshakes, shared && std::string(GetParam()) != "tcp" ? 1 : 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxAgentTest, ::testing::Values("tcp", "sm,tcp"),
                         [](const auto& info) { return std::string(info.param[0] == 's' ? "shm" : "tcp"); });

// The child of AProducerProcessKilledMidPullNeverHangsTheConsumer: a
// producer that tells its port through the pipe and serves until killed.
// Skipped in a normal run.
TEST(UcxProducerProcess, ServesUntilKilled) {
  const char* pipe_fd = std::getenv(kProducerPipeEnv);
  if (!pipe_fd) GTEST_SKIP() << "run by AProducerProcessKilledMidPullNeverHangsTheConsumer";
  const char* shared = std::getenv(kProducerSharedEnv);
  std::optional<Pool> own;
  std::optional<SharedPool> on_shared_memory;
  if (shared && shared[0] == '1') on_shared_memory.emplace(kProcessPoolBlocks, 1); else own.emplace(kProcessPoolBlocks, 1);
  LeaseTable leases;
  for (uint64_t lease : {1, 2, 3}) leases.add(lease, now_s() + 600);
  AgentConfig c;
  c.descriptor = descriptor();
  c.pool = own ? own->memory() : on_shared_memory->memory();
  c.engine_id = "prefill-0";
  c.listen = true;
  c.ip = "127.0.0.1";
  c.leases = &leases;
  auto a = UcxAgent::create(c);
  ASSERT_TRUE(a.ok()) << a.error().message;
  const uint16_t port = (*a)->port();
  const int fd = std::atoi(pipe_fd);
  ASSERT_EQ(::write(fd, &port, sizeof port), static_cast<ssize_t>(sizeof port));
  close(fd);
  for (;;) pause();
}

TEST(KVDescriptorTest, MismatchNamesTheField) {
  KVDescriptor a = descriptor(), b = a;
  EXPECT_EQ(a.mismatch(b), std::nullopt);
  b.n_kv_heads = 4;
  EXPECT_EQ(a.mismatch(b).value_or(""), "KV head count differs (here 2, peer 4)");
  b = a;
  b.fingerprint = 9;
  EXPECT_NE(a.mismatch(b).value_or("").find("fingerprint"), std::string::npos);
  b = a;
  b.group_windows = {0, 512};
  EXPECT_NE(a.mismatch(b).value_or("").find("KV group windows"), std::string::npos);
}

TEST(KVDescriptorTest, RoundTripsAndRefusesTruncation) {
  KVDescriptor a = descriptor();
  Writer w;
  write(w, a);
  KVDescriptor b;
  Reader r(w.bytes());
  ASSERT_TRUE(read(r, b));
  EXPECT_EQ(a.mismatch(b), std::nullopt);
  for (size_t n = 0; n < w.bytes().size(); ++n) {
    Reader cut(std::span<const std::byte>(w.bytes().data(), n));
    KVDescriptor c;
    EXPECT_FALSE(read(cut, c)) << n;
  }
}

TEST(BlockRunsTest, MergesWhereBothSidesAreConsecutive) {
  std::vector<std::pair<int32_t, int32_t>> blocks = {{5, 3}, {6, 4}, {7, 5}, {8, 7}, {1, 8}, {2, 9}};
  const std::vector<BlockRun> runs = block_runs(blocks);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].count, 3);
  EXPECT_EQ(runs[1].remote, 8);
  EXPECT_EQ(runs[1].count, 1);
  EXPECT_EQ(runs[2].local, 8);
  EXPECT_EQ(runs[2].count, 2);
}

TEST(LeaseTableTest, ReleasedOrExpiredEndOnceAndNeverHoldAgain) {
  LeaseTable t;
  t.add(1, 100.0);
  t.add(2, 200.0);
  EXPECT_TRUE(t.take_ended(50.0).empty());
  EXPECT_TRUE(t.release(1));
  EXPECT_FALSE(t.release(1));
  EXPECT_EQ(t.take_ended(50.0), std::vector<uint64_t>{1});
  EXPECT_EQ(t.take_ended(250.0), std::vector<uint64_t>{2});
  EXPECT_FALSE(t.release(2));  // expired: a late reader is told so
  EXPECT_EQ(t.stats().released, 1);
  EXPECT_EQ(t.stats().expired, 1);
  EXPECT_EQ(t.stats().held, 0);
  t.add(3, 300.0);
  EXPECT_EQ(t.take_all(), std::vector<uint64_t>{3});
}

}  // namespace
}  // namespace inferd::kvtransfer
