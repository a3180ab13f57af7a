#include "kvtransfer/ucx_agent.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "core/shared_bytes.h"

namespace inferd::kvtransfer {

namespace {

// Active message ids. Every message is a little-endian byte string (Writer)
// sent eagerly, so it is whole in the receive callback.
enum MsgId : unsigned {
  kHello = 1,         // consumer -> producer: version, token, engine id, descriptor
  kHelloReply = 2,    // producer -> consumer: token, ok, why not, engine id, pool layout, rkeys
  kRelease = 3,       // consumer -> producer: pull id, lease id
  kReleaseReply = 4,  // producer -> consumer: pull id, whether the lease was still held
};
constexpr uint32_t kProtocolVersion = 4;  // 2: the hello reply tells the producer's pid and probe; 3: its memfds;
                                          // 4: blocks laid out head by head (kv::KVCacheSpec)
// Pull ids with this bit are release_lease's: counted apart and never
// reported through take_finished.
constexpr uint64_t kReleaseOnly = uint64_t{1} << 63;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string status_text(ucs_status_t s) { return ucs_status_string(s); }

// Whether an IPv4 address is this host's: a loopback address, or one of its
// interfaces'.
bool is_local_address(const sockaddr* addr) {
  if (addr->sa_family != AF_INET) return false;
  const in_addr_t a = reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr;
  if ((ntohl(a) >> 24) == 127) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool local = false;
  for (ifaddrs* i = list; i && !local; i = i->ifa_next)
    local = i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == a;
  freeifaddrs(list);
  return local;
}

// UCX's own report of something (ucp_context_print_info and the like), as text.
template <typename Print>
std::string ucx_report(Print print) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return {};
  print(f);
  fclose(f);
  std::string text(buf, len);
  free(buf);
  return text;
}

// Reads `remote` of process `pid` into `local` (pairs of the same lengths)
// with process_vm_readv, in batches of IOV_MAX and resuming after a partial
// transfer. Returns an empty string, or what failed.
std::string read_process_memory(pid_t pid, std::vector<iovec>& local, std::vector<iovec>& remote) {
  size_t i = 0;
  while (i < local.size()) {
    const size_t n = std::min<size_t>(local.size() - i, IOV_MAX);
    size_t want = 0;
    for (size_t k = i; k < i + n; ++k) want += local[k].iov_len;
    const ssize_t got = process_vm_readv(pid, &local[i], n, &remote[i], n, 0);
    if (got <= 0) return std::string("a read of the producer's memory failed: ") + (got < 0 ? strerror(errno) : "no bytes");
    if (static_cast<size_t>(got) == want) {
      i += n;
      continue;
    }
    // Partial: skip the whole pairs moved, then advance into the next one.
    size_t left = static_cast<size_t>(got);
    while (left >= local[i].iov_len) left -= local[i++].iov_len;
    for (iovec* v : {&local[i], &remote[i]}) {
      v->iov_base = static_cast<std::byte*>(v->iov_base) + left;
      v->iov_len -= left;
    }
  }
  return {};
}

}  // namespace

struct UcxAgent::Impl {
  struct Peer;
  struct Pull {
    PullSpec spec;
    std::shared_ptr<Peer> peer;
    enum class Phase { kWaitPeer, kReading, kReleasing } phase = Phase::kWaitPeer;
    int64_t outstanding = 0;  // reads in flight
    std::string error;        // first failure
    bool timed_out = false;
    double started = 0.0, deadline = 0.0;
    uint64_t bytes = 0;
  };
  struct Peer {
    std::string key;  // host:port
    ucp_ep_h ep = nullptr;       // by address and port: the handshake and the lease's release
    ucp_ep_h data_ep = nullptr;  // by the producer's worker address: the reads (see on_hello_reply)
    bool same_host = false;  // the producer's address is one of this host's
    pid_t direct_pid = 0;    // > 0: the reads are process_vm_readv calls on this process (see on_hello_reply)
    std::vector<SharedMapping> mapped;  // one per region: the reads are memcpy from these (see on_hello_reply)
    uint64_t token = 0;
    bool ready = false, failed = false;
    std::string expected_engine_id;
    int64_t remote_n_blocks = 0;
    std::vector<uint64_t> remote_bases;
    std::vector<ucp_rkey_h> rkeys;
    std::vector<uint64_t> waiting;  // pulls waiting for the handshake
  };

  AgentConfig config;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  int worker_fd = -1;  // UCX's event fd: readable when the worker has something to progress
  int wake_fd = -1;    // an eventfd: start_pull and the destructor wake the progress thread
  bool cma_allowed = false;  // UCX's configuration (UCX_TLS) allows cross-memory attach
  std::array<std::byte, 16> probe{};  // producer: random bytes a consumer on this host reads to prove it can
  std::vector<ucp_mem_h> memh;
  std::vector<std::vector<std::byte>> packed_rkeys;  // producer: one per region
  std::vector<std::byte> worker_address;             // producer: told in the handshake
  std::vector<std::unique_ptr<std::pair<Impl*, unsigned>>> handler_args;  // receive callbacks' (this, message id)

  std::thread thread;
  std::atomic<bool> stop{false};

  std::mutex mu;  // guards the fields below it, shared with other threads
  std::deque<PullSpec> incoming;
  std::vector<PullResult> finished;
  std::function<void()> on_finished;
  AgentStats stats;

  // Progress thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Pull>> pulls;
  std::map<std::string, std::shared_ptr<Peer>> peers;          // by host:port
  std::unordered_map<uint64_t, std::shared_ptr<Peer>> by_token;  // handshakes in flight and done
  std::vector<ucp_ep_h> accepted;                              // producer: consumers' endpoints
  std::vector<void*> closing;                                  // ep close requests in flight
  std::vector<std::shared_ptr<Peer>> dead;                     // failed peers whose rkeys wait for their reads
  struct Outgoing {
    ucp_ep_h ep;
    unsigned id;
    std::vector<std::byte> bytes;
  };
  std::vector<Outgoing> outbox;  // replies queued from receive callbacks
  uint64_t next_token = 1;

  // ---- setup ----
  Status init();
  void run();
  void teardown();

  // ---- progress thread ----
  void begin(PullSpec spec);
  std::shared_ptr<Peer> connect(const std::string& host, uint16_t port);
  void send(ucp_ep_h ep, unsigned id, std::vector<std::byte> bytes);
  void flush_outbox();
  void issue_reads(Pull& p);
  void read_done(uint64_t pull_id, ucs_status_t status);
  void after_reads(Pull& p);
  void finish(uint64_t pull_id, bool ok, const std::string& error);
  void fail_peer(std::shared_ptr<Peer> peer, const std::string& why);  // by value: it may erase the map entry passed
  void close_ep(ucp_ep_h ep);
  void wake_up() const;  // ends the progress thread's poll()
  bool can_read_directly(pid_t pid, uint64_t probe_address, const std::array<std::byte, 16>& expected) const;
  void check_deadlines();
  void bury_dead();

  // A consumer's endpoint failed: its peer fails.
  static void peer_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<Impl*>(arg);
    for (auto& [key, peer] : self->peers)
      if (peer->ep == ep || peer->data_ep == ep) {
        self->fail_peer(peer, "the connection to the producer failed (" + status_text(status) + ")");
        return;
      }
  }

  // Receive callbacks (run inside ucp_worker_progress on the progress thread).
  void on_hello(Reader& r, ucp_ep_h reply_ep);
  void on_hello_reply(Reader& r);
  void on_release(Reader& r, ucp_ep_h reply_ep);
  void on_release_reply(Reader& r);
};

// ---------------------------------------------------------------- setup

Result<std::unique_ptr<UcxAgent>> UcxAgent::create(const AgentConfig& config) {
  if (config.pool.regions.empty() || config.pool.n_blocks < 2 || config.pool.segment_bytes == 0)
    return make_error("KV transfer: the pool's memory is not described");
  if (config.listen && !config.leases) return make_error("KV transfer: a producer needs a lease table");
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  if (Status s = impl->init(); !s) {
    impl->teardown();
    return s.error();
  }
  std::unique_ptr<UcxAgent> agent(new UcxAgent(std::move(impl)));
  if (config.listen) {
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(agent->impl_->listener, &attr) == UCS_OK) {
      const auto* sa = reinterpret_cast<const sockaddr_in*>(&attr.sockaddr);
      agent->port_ = ntohs(sa->sin_port);
    }
  }
  agent->impl_->thread = std::thread([a = agent->impl_.get()] { a->run(); });
  return agent;
}

UcxAgent::UcxAgent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxAgent::~UcxAgent() {
  impl_->stop = true;
  if (impl_->wake_fd >= 0) impl_->wake_up();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->teardown();
}

Status UcxAgent::Impl::init() {
  ucp_config_t* cfg = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg); s != UCS_OK)
    return make_error("KV transfer: UCX configuration: " + status_text(s));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  // WAKEUP: the progress thread sleeps on UCX's event fd (see run()).
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucs_status_t s = ucp_init(&params, cfg, &context);
  ucp_config_release(cfg);
  if (s != UCS_OK) return make_error("KV transfer: ucp_init: " + status_text(s));
  {
    // Whether UCX's configuration (UCX_TLS) leaves its CMA transport in: the
    // reads on one host are CMA's (see on_hello_reply), so UCX_TLS=tcp keeps
    // them on TCP as it would with UCX's own transports.
    const std::string report = ucx_report([&](FILE* f) { ucp_context_print_info(context, f); });
    cma_allowed = report.find("cma/") != std::string::npos;
    std::random_device rd;
    for (auto& b : probe) b = static_cast<std::byte>(rd());
  }

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread calls UCX
  if ((s = ucp_worker_create(context, &wp, &worker)) != UCS_OK)
    return make_error("KV transfer: ucp_worker_create: " + status_text(s));
  if ((s = ucp_worker_get_efd(worker, &worker_fd)) != UCS_OK)
    return make_error("KV transfer: ucp_worker_get_efd: " + status_text(s));
  wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) return make_error(std::string("KV transfer: eventfd: ") + strerror(errno));

  // Receive handlers: one per message kind, all into this Impl.
  auto cb = [](void* arg, const void* /*header*/, size_t /*header_length*/, void* data, size_t length,
               const ucp_am_recv_param_t* param) -> ucs_status_t {
    auto* h = static_cast<std::pair<Impl*, unsigned>*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;  // never sent so: dropped
    Reader r(std::span<const std::byte>(static_cast<const std::byte*>(data), length));
    Impl* self = h->first;
    const ucp_ep_h reply = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
    switch (h->second) {
      case kHello: self->on_hello(r, reply); break;
      case kHelloReply: self->on_hello_reply(r); break;
      case kRelease: self->on_release(r, reply); break;
      case kReleaseReply: self->on_release_reply(r); break;
    }
    return UCS_OK;
  };
  for (unsigned id : {kHello, kHelloReply, kRelease, kReleaseReply}) {
    auto* arg = handler_args.emplace_back(std::make_unique<std::pair<Impl*, unsigned>>(this, id)).get();
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.cb = cb;
    hp.arg = arg;
    if ((s = ucp_worker_set_am_recv_handler(worker, &hp)) != UCS_OK)
      return make_error("KV transfer: ucp_worker_set_am_recv_handler: " + status_text(s));
  }

  // The pool is mapped on both sides: a producer's so that peers can read it
  // (its rkeys), a consumer's so that RDMA can write into it directly.
  for (std::byte* base : config.pool.regions) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = config.pool.region_bytes();
    ucp_mem_h h = nullptr;
    if ((s = ucp_mem_map(context, &mp, &h)) != UCS_OK)
      return make_error("KV transfer: ucp_mem_map of the KV pool: " + status_text(s));
    memh.push_back(h);
    if (config.listen) {
      void* buf = nullptr;
      size_t size = 0;
      if ((s = ucp_rkey_pack(context, h, &buf, &size)) != UCS_OK)
        return make_error("KV transfer: ucp_rkey_pack: " + status_text(s));
      const auto* b = static_cast<const std::byte*>(buf);
      packed_rkeys.emplace_back(b, b + size);
      ucp_rkey_buffer_release(buf);
    }
  }

  if (config.listen) {
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    if ((s = ucp_worker_get_address(worker, &addr, &len)) != UCS_OK)
      return make_error("KV transfer: ucp_worker_get_address: " + status_text(s));
    const auto* b = reinterpret_cast<const std::byte*>(addr);
    worker_address.assign(b, b + len);
    ucp_worker_release_address(worker, addr);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(config.port);
    if (inet_pton(AF_INET, config.ip.c_str(), &sa.sin_addr) != 1)
      return make_error("KV transfer: kv_ip '" + config.ip + "' is not an IPv4 address");
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    lp.sockaddr.addrlen = sizeof sa;
    lp.conn_handler.arg = this;
    lp.conn_handler.cb = [](ucp_conn_request_h req, void* arg) {
      auto* self = static_cast<Impl*>(arg);
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      ep.conn_request = req;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.arg = self;
      ep.err_handler.cb = [](void* arg, ucp_ep_h ep, ucs_status_t) {
        auto* self = static_cast<Impl*>(arg);
        std::erase(self->accepted, ep);
        self->close_ep(ep);
      };
      ucp_ep_h h = nullptr;
      if (ucp_ep_create(self->worker, &ep, &h) == UCS_OK) self->accepted.push_back(h);
    };
    if ((s = ucp_listener_create(worker, &lp, &listener)) != UCS_OK)
      return make_error("KV transfer: cannot listen on " + config.ip + ":" + std::to_string(config.port) + ": " +
                        status_text(s));
  }
  return {};
}

void UcxAgent::Impl::teardown() {
  // Endpoints first (their outstanding operations are cancelled), then what
  // they used.
  if (worker) {
    std::vector<std::shared_ptr<Peer>> live;
    for (auto& [key, peer] : peers) live.push_back(peer);
    for (const auto& peer : live) fail_peer(peer, "the transfer agent is shutting down");
    for (ucp_ep_h ep : accepted) close_ep(ep);
    accepted.clear();
    const double until = now_s() + 2.0;
    while ((!closing.empty() || !outbox.empty()) && now_s() < until) {
      ucp_worker_progress(worker);
      std::erase_if(closing, [](void* req) {
        if (ucp_request_check_status(req) == UCS_INPROGRESS) return false;
        ucp_request_free(req);
        return true;
      });
      outbox.clear();
    }
    for (auto& [token, peer] : by_token)
      for (ucp_rkey_h k : peer->rkeys) ucp_rkey_destroy(k);
    by_token.clear();
    peers.clear();
    if (listener) ucp_listener_destroy(listener);
  }
  for (ucp_mem_h h : memh) ucp_mem_unmap(context, h);
  memh.clear();
  if (worker) ucp_worker_destroy(worker);  // closes worker_fd, which is UCX's
  if (context) ucp_cleanup(context);
  if (wake_fd >= 0) close(wake_fd);
  wake_fd = -1;
  worker = nullptr;
  context = nullptr;
}

// ---------------------------------------------------------------- the thread

void UcxAgent::Impl::run() {
  // Event-driven: after progressing everything, the thread arms the worker
  // and sleeps in poll() on UCX's event fd and the wake fd (a new pull, the
  // destructor), or until the nearest pull deadline. It spins only while
  // reads over UCX are in flight and briefly after work, so on a decode
  // instance that shares its cores it costs the decode nothing while it
  // waits for a producer's reply or a producer for its next consumer. (The
  // one-host reads are process_vm_readv calls, not UCX's shared-memory
  // transports, which would have no event fd.)
  double last_work = 0.0;
  while (!stop) {
    std::deque<PullSpec> take;
    {
      std::lock_guard lock(mu);
      take.swap(incoming);
    }
    for (PullSpec& p : take) begin(std::move(p));
    unsigned events = 0;
    while (unsigned n = ucp_worker_progress(worker)) events += n;
    if (events > 0 || !take.empty()) last_work = now_s();
    flush_outbox();
    std::erase_if(closing, [](void* req) {
      if (ucp_request_check_status(req) == UCS_INPROGRESS) return false;
      ucp_request_free(req);
      return true;
    });
    check_deadlines();
    bury_dead();
    if (!take.empty() || !outbox.empty()) continue;
    // Reads in flight over UCX (TCP, RDMA) move as fast as they are
    // progressed, on both sides (UCX's TCP serves a read with the producer's
    // progress): the thread polls (yielding) until its reads are done, and
    // for 200 us after any work, when the next message is likely close.
    if (now_s() - last_work < 200e-6 ||
        std::any_of(pulls.begin(), pulls.end(),
                    [](const auto& p) { return p.second->phase == Pull::Phase::kReading; })) {
      std::this_thread::yield();
      continue;
    }
    {
      std::lock_guard lock(mu);
      if (!incoming.empty()) continue;
    }
    const ucs_status_t armed = ucp_worker_arm(worker);
    if (armed == UCS_ERR_BUSY) continue;  // events came in meanwhile
    // Wait for an event, at most until the nearest deadline; a closing
    // endpoint is looked at every millisecond, and an idle thread wakes
    // every 100 ms anyway (a missed event would cost no more).
    int timeout_ms = closing.empty() ? 100 : 1;
    const double t = now_s();
    for (const auto& [id, p] : pulls)
      timeout_ms = std::min(timeout_ms, std::max(0, static_cast<int>((p->deadline - t) * 1000.0) + 1));
    pollfd fds[2] = {{worker_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (armed != UCS_OK) timeout_ms = std::min(timeout_ms, 1);  // not armed: poll UCX every millisecond
    poll(fds, 2, timeout_ms);
    uint64_t n = 0;
    [[maybe_unused]] ssize_t r = ::read(wake_fd, &n, sizeof n);
  }
}

void UcxAgent::Impl::wake_up() const {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd, &one, sizeof one);
}

void UcxAgent::release_lease(const std::string& host, uint16_t port, const std::string& engine_id,
                             uint64_t lease_id) {
  // A pull of no blocks: the connection and handshake as for any pull, then
  // straight to the lease's release. Its id is outside the callers' range.
  PullSpec spec;
  spec.id = kReleaseOnly | lease_id;
  spec.host = host;
  spec.port = port;
  spec.engine_id = engine_id;
  spec.lease_id = lease_id;
  spec.timeout_s = 10.0;
  start_pull(std::move(spec));
}

void UcxAgent::start_pull(PullSpec spec) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->incoming.push_back(std::move(spec));
  }
  impl_->wake_up();
}

std::vector<PullResult> UcxAgent::take_finished() {
  std::lock_guard lock(impl_->mu);
  return std::exchange(impl_->finished, {});
}

void UcxAgent::set_on_finished(std::function<void()> f) {
  std::lock_guard lock(impl_->mu);
  impl_->on_finished = std::move(f);
}

AgentStats UcxAgent::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

std::shared_ptr<UcxAgent::Impl::Peer> UcxAgent::Impl::connect(const std::string& host, uint16_t port) {
  auto peer = std::make_shared<Peer>();
  peer->key = host + ":" + std::to_string(port);
  peer->token = next_token++;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) {
    peer->failed = true;
    return peer;
  }
  peer->same_host = is_local_address(res->ai_addr);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = res->ai_addr;
  ep.sockaddr.addrlen = res->ai_addrlen;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.arg = this;
  ep.err_handler.cb = peer_error;
  const ucs_status_t s = ucp_ep_create(worker, &ep, &peer->ep);
  freeaddrinfo(res);
  if (s != UCS_OK) {
    peer->ep = nullptr;
    peer->failed = true;
    return peer;
  }
  Writer w;
  w.u32(kProtocolVersion);
  w.u64(peer->token);
  w.str(config.engine_id);
  write(w, config.descriptor);
  send(peer->ep, kHello, std::move(w.bytes()));
  by_token[peer->token] = peer;
  return peer;
}

void UcxAgent::Impl::begin(PullSpec spec) {
  auto p = std::make_unique<Pull>();
  p->started = now_s();
  p->deadline = p->started + spec.timeout_s;
  const uint64_t id = spec.id;
  p->spec = std::move(spec);
  const std::string key = p->spec.host + ":" + std::to_string(p->spec.port);
  std::shared_ptr<Peer>& peer = peers[key];
  if (!peer || peer->failed) {
    peer = connect(p->spec.host, p->spec.port);
    peer->expected_engine_id = p->spec.engine_id;
  }
  p->peer = peer;
  Pull& pull = *p;
  pulls[id] = std::move(p);
  if (peer->failed) {
    peers.erase(key);
    finish(id, false, "cannot connect to the producer at " + key);
    return;
  }
  if (!pull.spec.engine_id.empty() && !peer->expected_engine_id.empty() &&
      pull.spec.engine_id != peer->expected_engine_id) {
    finish(id, false, "the producer at " + key + " is engine '" + peer->expected_engine_id + "', not '" +
                          pull.spec.engine_id + "'");
    return;
  }
  if (peer->ready)
    issue_reads(pull);
  else
    peer->waiting.push_back(id);
}

void UcxAgent::Impl::send(ucp_ep_h ep, unsigned id, std::vector<std::byte> bytes) {
  auto* buf = new std::vector<std::byte>(std::move(bytes));
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  rp.cb.send = [](void* req, ucs_status_t, void* user) {
    delete static_cast<std::vector<std::byte>*>(user);
    ucp_request_free(req);
  };
  rp.user_data = buf;
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, nullptr, 0, buf->data(), buf->size(), &rp);
  if (!UCS_PTR_IS_PTR(r)) delete buf;  // done at once, or failed (the peer's error handler says so)
}

void UcxAgent::Impl::flush_outbox() {
  std::vector<Outgoing> out = std::move(outbox);
  outbox.clear();
  for (Outgoing& o : out)
    if (std::find(accepted.begin(), accepted.end(), o.ep) != accepted.end()) send(o.ep, o.id, std::move(o.bytes));
}

// ---------------------------------------------------------------- producer side

void UcxAgent::Impl::on_hello(Reader& r, ucp_ep_h reply_ep) {
  if (!reply_ep) return;
  uint32_t version = 0;
  uint64_t token = 0;
  std::string engine_id;
  KVDescriptor peer;
  Writer w;
  const bool parsed = r.u32(version) && r.u64(token) && r.str(engine_id) && read(r, peer);
  std::optional<std::string> why;
  if (!parsed) why = "a malformed handshake";
  else if (version != kProtocolVersion) why = "protocol version " + std::to_string(version) + " (here " +
                                               std::to_string(kProtocolVersion) + ")";
  else why = config.descriptor.mismatch(peer);
  w.u64(token);
  w.u8(why ? 0 : 1);
  w.str(why.value_or(""));
  w.str(config.engine_id);
  w.u32(static_cast<uint32_t>(worker_address.size()));
  w.raw(worker_address.data(), worker_address.size());
  w.i64(config.pool.n_blocks);
  w.u32(static_cast<uint32_t>(config.pool.regions.size()));
  for (size_t i = 0; i < config.pool.regions.size(); ++i) {
    w.u64(reinterpret_cast<uint64_t>(config.pool.regions[i]));
    w.u32(static_cast<uint32_t>(packed_rkeys[i].size()));
    w.raw(packed_rkeys[i].data(), packed_rkeys[i].size());
  }
  w.u32(static_cast<uint32_t>(getpid()));
  w.u64(reinterpret_cast<uint64_t>(probe.data()));
  w.raw(probe.data(), probe.size());
  w.u32(static_cast<uint32_t>(config.pool.region_fds.size()));
  for (int fd : config.pool.region_fds) w.u32(static_cast<uint32_t>(fd));
  w.str(config.pool.shared_name);
  {
    std::lock_guard lock(mu);
    ++(why ? stats.peers_refused : stats.peers_accepted);
  }
  if (why) spdlog::warn("KV transfer: refused consumer '{}': {}", engine_id, *why);
  outbox.push_back({reply_ep, kHelloReply, std::move(w.bytes())});
}

void UcxAgent::Impl::on_release(Reader& r, ucp_ep_h reply_ep) {
  uint64_t pull_id = 0, lease_id = 0;
  if (!reply_ep || !r.u64(pull_id) || !r.u64(lease_id)) return;
  const bool held = config.leases && config.leases->release(lease_id);
  Writer w;
  w.u64(pull_id);
  w.u8(held ? 1 : 0);
  outbox.push_back({reply_ep, kReleaseReply, std::move(w.bytes())});
}

// ---------------------------------------------------------------- consumer side

void UcxAgent::Impl::on_hello_reply(Reader& r) {
  uint64_t token = 0;
  uint8_t ok = 0;
  std::string why, engine_id;
  if (!r.u64(token)) return;
  auto it = by_token.find(token);
  if (it == by_token.end()) return;
  std::shared_ptr<Peer> peer = it->second;
  if (peer->ready || peer->failed) return;
  int64_t n_blocks = 0;
  uint32_t n_regions = 0, address_len = 0;
  std::vector<std::byte> address;
  if (!r.u8(ok) || !r.str(why) || !r.str(engine_id) || !r.u32(address_len) || address_len > r.left())
    return fail_peer(peer, "a malformed handshake reply");
  address.resize(address_len);
  r.raw(address.data(), address_len);
  if (!r.i64(n_blocks) || !r.u32(n_regions)) return fail_peer(peer, "a malformed handshake reply");
  if (!ok) {
    {
      std::lock_guard lock(mu);
      ++stats.refusals;
    }
    spdlog::warn("KV transfer: the producer at {} refused this instance: {}", peer->key, why);
    return fail_peer(peer, "refused by the producer: " + why);
  }
  if (!peer->expected_engine_id.empty() && engine_id != peer->expected_engine_id)
    return fail_peer(peer, "the producer at " + peer->key + " is engine '" + engine_id + "', not '" +
                               peer->expected_engine_id + "'");
  if (n_regions != config.pool.regions.size() || n_blocks < 2)
    return fail_peer(peer, "the producer's pool has another shape");
  std::vector<std::vector<std::byte>> packed_keys;
  for (uint32_t i = 0; i < n_regions; ++i) {
    uint64_t base = 0;
    uint32_t size = 0;
    if (!r.u64(base) || !r.u32(size) || size > r.left() || size > (1u << 20))
      return fail_peer(peer, "a malformed handshake reply");
    packed_keys.emplace_back(size);
    r.raw(packed_keys.back().data(), size);
    peer->remote_bases.push_back(base);
  }
  uint32_t pid = 0;
  uint64_t probe_address = 0;
  std::array<std::byte, 16> probe_bytes{};
  if (!r.u32(pid) || !r.u64(probe_address) || r.left() < probe_bytes.size())
    return fail_peer(peer, "a malformed handshake reply");
  r.raw(probe_bytes.data(), probe_bytes.size());
  uint32_t n_fds = 0;
  std::vector<int> fds;
  std::string shared_name;
  if (!r.u32(n_fds) || n_fds > n_regions) return fail_peer(peer, "a malformed handshake reply");
  for (uint32_t i = 0, fd = 0; i < n_fds; ++i) {
    if (!r.u32(fd)) return fail_peer(peer, "a malformed handshake reply");
    fds.push_back(static_cast<int>(fd));
  }
  if (!r.str(shared_name)) return fail_peer(peer, "a malformed handshake reply");
  // On one host, the blocks are read with process_vm_readv (cross-memory
  // attach, the syscall of UCX's own CMA transport) rather than through UCX:
  // UCX 1.13 wires CMA only for endpoints without peer-failure handling, and
  // the reads of such an endpoint stay pending for ever when the producer
  // dies mid-pull, while process_vm_readv fails at once. Over UCX's TCP the
  // same pull runs at about a sixth of memcpy, with CMA about half. The probe
  // (random bytes the producer holds) proves the pid is the producer's and
  // that the kernel lets this process read it; the handshake, the lease's
  // release and everything off this host stay on UCX.
  //
  // Better still, a producer whose pool is on shared memory offers its memfds:
  // mapped here, a block's segments are copied out with memcpy, without a
  // system call each (docs/design.md). Whatever the producer does after, the
  // mapping stays valid (a dead producer's pages live until it is unmapped),
  // and a pull still counts only once its lease is released over UCX.
  if (peer->same_host && cma_allowed && can_read_directly(static_cast<pid_t>(pid), probe_address, probe_bytes)) {
    peer->direct_pid = static_cast<pid_t>(pid);
    if (fds.size() == n_regions) {
      const uint64_t region_bytes = static_cast<uint64_t>(config.pool.slabs) * n_blocks * config.pool.segment_bytes;
      std::vector<SharedMapping> maps;
      for (int fd : fds) {
        auto m = SharedMapping::open(static_cast<int>(pid), fd, region_bytes, shared_name);
        if (!m) {
          spdlog::info("KV transfer: the producer at {} offers shared memory, not mapped here: {}", peer->key,
                       m.error().message);
          break;
        }
        maps.push_back(std::move(*m));
      }
      if (maps.size() == n_regions) peer->mapped = std::move(maps);
    }
  } else {
    // The reads go over a second endpoint made from the producer's worker
    // address: UCX (1.13) wires an endpoint made from a socket address over
    // the network transports only, while one made from a worker address may
    // use the fastest one the two workers share (RDMA between hosts).
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.arg = this;
    ep.err_handler.cb = peer_error;
    if (ucs_status_t s = ucp_ep_create(worker, &ep, &peer->data_ep); s != UCS_OK) {
      peer->data_ep = nullptr;
      return fail_peer(peer, "cannot reach the producer's worker: " + status_text(s));
    }
    for (const std::vector<std::byte>& packed : packed_keys) {
      ucp_rkey_h rkey = nullptr;
      if (ucs_status_t s = ucp_ep_rkey_unpack(peer->data_ep, packed.data(), &rkey); s != UCS_OK)
        return fail_peer(peer, "cannot use the producer's memory key: " + status_text(s));
      peer->rkeys.push_back(rkey);
    }
  }
  // The descriptor matched on the producer's side (it compared); the block
  // size is what the consumer checks again here, against its own.
  peer->remote_n_blocks = n_blocks;
  peer->ready = true;
  {
    std::lock_guard lock(mu);
    ++stats.handshakes;
    if (peer->direct_pid > 0) ++stats.shared_memory_handshakes;
    if (!peer->mapped.empty()) ++stats.mapped_handshakes;
  }
  spdlog::info("KV transfer: connected to the producer at {}; its blocks are read {}", peer->key,
               !peer->mapped.empty()    ? "from its shared memory, mapped (same host)"
               : peer->direct_pid > 0 ? "by cross-memory attach (same host)"
                                      : "over UCX");
  std::vector<uint64_t> waiting = std::move(peer->waiting);
  for (uint64_t id : waiting)
    if (auto p = pulls.find(id); p != pulls.end()) issue_reads(*p->second);
}

bool UcxAgent::Impl::can_read_directly(pid_t pid, uint64_t probe_address,
                                       const std::array<std::byte, 16>& expected) const {
  if (pid <= 0) return false;
  std::array<std::byte, 16> got{};
  std::vector<iovec> local = {{got.data(), got.size()}};
  std::vector<iovec> remote = {{reinterpret_cast<void*>(probe_address), got.size()}};
  return read_process_memory(pid, local, remote).empty() && got == expected;
}

void UcxAgent::Impl::issue_reads(Pull& p) {
  const Peer& peer = *p.peer;
  const PoolMemory& pool = config.pool;
  for (const auto& [remote, local] : p.spec.blocks)
    if (remote < 1 || remote >= peer.remote_n_blocks || local < 1 || local >= pool.n_blocks)
      return finish(p.spec.id, false, "a block id out of range (remote " + std::to_string(remote) + ", local " +
                                          std::to_string(local) + ")");
  p.phase = Pull::Phase::kReading;
  const uint64_t seg = pool.segment_bytes;
  // Every run's segment in each slab of each region: where it goes here, and
  // its offset in the producer's region (both pools have pool.slabs slabs per
  // region, of their own block counts).
  const auto each_segment = [&](auto&& read) {
    for (const BlockRun& run : block_runs(p.spec.blocks))
      for (size_t region = 0; region < pool.regions.size(); ++region)
        for (int32_t slab = 0; slab < pool.slabs; ++slab) {
          const uint64_t len = static_cast<uint64_t>(run.count) * seg;
          p.bytes += len;
          read(region, pool.regions[region] + pool.offset(slab, run.local),
               (static_cast<uint64_t>(slab) * peer.remote_n_blocks + run.remote) * seg, len);
        }
  };
  if (!peer.mapped.empty()) {
    each_segment([&](size_t region, std::byte* dst, uint64_t remote, uint64_t len) {
      std::memcpy(dst, peer.mapped[region].data() + remote, len);
    });
    return after_reads(p);
  }
  if (peer.direct_pid > 0) {
    std::vector<iovec> local, remote;
    each_segment([&](size_t region, std::byte* dst, uint64_t offset, uint64_t len) {
      local.push_back({dst, len});
      remote.push_back({reinterpret_cast<void*>(peer.remote_bases[region] + offset), len});
    });
    p.error = read_process_memory(peer.direct_pid, local, remote);
    return after_reads(p);
  }
  const uint64_t id = p.spec.id;
  each_segment([&](size_t region, std::byte* dst, uint64_t offset, uint64_t len) {
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = [](void* req, ucs_status_t status, void* user) {
      auto* self_and_id = static_cast<std::pair<Impl*, uint64_t>*>(user);
      Impl* self = self_and_id->first;
      const uint64_t pull_id = self_and_id->second;
      delete self_and_id;
      ucp_request_free(req);
      self->read_done(pull_id, status);
    };
    auto* user = new std::pair<Impl*, uint64_t>(this, id);
    rp.user_data = user;
    ++p.outstanding;
    ucs_status_ptr_t r = ucp_get_nbx(peer.data_ep, dst, len, peer.remote_bases[region] + offset, peer.rkeys[region], &rp);
    if (!UCS_PTR_IS_PTR(r)) {
      delete user;
      --p.outstanding;
      if (UCS_PTR_IS_ERR(r) && p.error.empty()) p.error = "a read failed: " + status_text(UCS_PTR_STATUS(r));
    }
  });
  after_reads(p);
}

void UcxAgent::Impl::read_done(uint64_t pull_id, ucs_status_t status) {
  auto it = pulls.find(pull_id);
  if (it == pulls.end()) return;
  Pull& p = *it->second;
  --p.outstanding;
  if (status != UCS_OK && p.error.empty()) p.error = "a read failed: " + status_text(status);
  after_reads(p);
}

void UcxAgent::Impl::after_reads(Pull& p) {
  if (p.phase != Pull::Phase::kReading || p.outstanding > 0) return;
  if (!p.error.empty()) return finish(p.spec.id, false, p.error);
  if (p.peer->failed) return finish(p.spec.id, false, "the connection to the producer failed");
  // Every byte is here; it counts only if the lease still held.
  p.phase = Pull::Phase::kReleasing;
  Writer w;
  w.u64(p.spec.id);
  w.u64(p.spec.lease_id);
  send(p.peer->ep, kRelease, std::move(w.bytes()));
}

void UcxAgent::Impl::on_release_reply(Reader& r) {
  uint64_t pull_id = 0;
  uint8_t held = 0;
  if (!r.u64(pull_id) || !r.u8(held)) return;
  auto it = pulls.find(pull_id);
  if (it == pulls.end() || it->second->phase != Pull::Phase::kReleasing) return;
  if (held) return finish(pull_id, true, "");
  finish(pull_id, false, "the producer's lease had expired");
}

void UcxAgent::Impl::finish(uint64_t pull_id, bool ok, const std::string& error) {
  auto it = pulls.find(pull_id);
  if (it == pulls.end()) return;
  std::unique_ptr<Pull> p = std::move(it->second);
  pulls.erase(it);
  std::erase(p->peer->waiting, pull_id);
  if (pull_id & kReleaseOnly) {
    std::lock_guard lock(mu);
    if (ok) ++stats.leases_released_unused;
    return;
  }
  PullResult res{pull_id, ok, error, ok ? p->bytes : 0, now_s() - p->started};
  std::function<void()> notify;
  {
    std::lock_guard lock(mu);
    if (ok) {
      ++stats.pulls_ok;
      stats.blocks_received += static_cast<int64_t>(p->spec.blocks.size());
      stats.bytes_received += static_cast<int64_t>(p->bytes);
      stats.pull_seconds += res.seconds;
    } else {
      ++stats.pulls_failed;
      if (p->timed_out) ++stats.pulls_timed_out;
    }
    finished.push_back(std::move(res));
    notify = on_finished;
  }
  if (!ok) spdlog::warn("KV transfer: pull {} from {} failed: {}", pull_id, p->peer->key, error);
  if (notify) notify();
}

void UcxAgent::Impl::fail_peer(std::shared_ptr<Peer> peer, const std::string& why) {
  if (peer->failed) return;
  peer->failed = true;
  if (auto it = peers.find(peer->key); it != peers.end() && it->second == peer) peers.erase(it);
  // A forced close cancels the endpoint's reads in flight: their callbacks
  // run (with an error) before anything else can touch those buffers.
  if (peer->data_ep) close_ep(peer->data_ep);
  if (peer->ep) close_ep(peer->ep);
  dead.push_back(peer);
  std::vector<uint64_t> ids;
  for (auto& [id, p] : pulls)
    if (p->peer == peer) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = pulls.find(id);
    if (it == pulls.end()) continue;
    Pull& p = *it->second;
    if (p.error.empty()) p.error = why;
    if (p.phase == Pull::Phase::kReading)
      after_reads(p);  // reports once the last cancelled read is back
    else
      finish(id, false, p.error);
  }
}

void UcxAgent::Impl::close_ep(ucp_ep_h ep) {
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &rp);
  if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
}

void UcxAgent::Impl::bury_dead() {
  // A failed peer's rkeys go once no read can use them: its endpoint is
  // closed and no pull of it is left.
  if (dead.empty() || !closing.empty()) return;
  std::erase_if(dead, [&](const std::shared_ptr<Peer>& peer) {
    for (const auto& [id, p] : pulls)
      if (p->peer == peer) return false;
    for (ucp_rkey_h k : peer->rkeys) ucp_rkey_destroy(k);
    peer->rkeys.clear();
    by_token.erase(peer->token);
    return true;
  });
}

void UcxAgent::Impl::check_deadlines() {
  const double t = now_s();
  std::vector<std::shared_ptr<Peer>> to_fail;
  std::vector<uint64_t> to_finish;
  for (auto& [id, p] : pulls) {
    if (t < p->deadline) continue;
    p->timed_out = true;
    if (p->phase == Pull::Phase::kReading)
      to_fail.push_back(p->peer);  // its reads are cancelled with the connection
    else
      to_finish.push_back(id);
  }
  for (const auto& peer : to_fail) fail_peer(peer, "the transfer timed out");
  for (uint64_t id : to_finish) finish(id, false, "the transfer timed out");
}

}  // namespace inferd::kvtransfer
