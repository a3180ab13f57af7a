// Each thread's share of a parallel phase, as units of work that its owner
// takes from the front, in shrinking chunks, and that a thread done with its
// own share takes from the back of (work stealing).
//
// Why: the phases of a forward pass end at a barrier, so each lasts as long
// as its slowest thread. Equal static shares are not equal times on a shared
// host: one core can run a few per cent slower than the other for seconds (the
// host's load), and a share's time moves by a microsecond from pass to pass.
// With stealing, a thread that finishes early takes what the slow one has not
// started. Owners start with a quarter of their share, so the shares' first
// parts stay where a static split (and the weight prefetch planned on it)
// puts them, and take a few claims a phase: each is one compare-and-swap on a
// cache line only the owner touches until a thief comes.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace inferd {

class WorkShares {
 public:
  // Room for n_slots phases of n_threads shares each; every share empty.
  void resize(int n_slots, int n_threads);
  int n_slots() const { return n_slots_; }

  // Thread ti's share of phase `slot`: units [begin, end) (< 2^32). Set every
  // share of a slot before the threads run it, and again before each run.
  void set(int slot, int ti, int64_t begin, int64_t end);

  // Called by thread ti of n_threads: runs work(u0, u1) on chunks of its own
  // share, front to back, then on chunks from the backs of the other shares
  // until none is left. Each unit is run by exactly one thread.
  // With steal false, each thread runs its own share in one call and no other.
  template <class Work>
  void run(int slot, int ti, Work&& work, bool steal = true) {
    int64_t u0 = 0, u1 = 0;
    Share& own = share(slot, ti);
    if (!steal) {
      if (take_all(own, &u0, &u1)) work(u0, u1);
      return;
    }
    while (take_front(own, &u0, &u1)) work(u0, u1);
    for (int k = 1; k < n_threads_; ++k) {
      Share& other = share(slot, (ti + k) % n_threads_);
      while (take_back(other, &u0, &u1)) work(u0, u1);
    }
  }

 private:
  struct alignas(64) Share {
    std::atomic<uint64_t> range{0};  // front << 32 | back: units [front, back) not taken yet
  };
  Share& share(int slot, int ti) { return shares_[static_cast<size_t>(slot) * n_threads_ + ti]; }
  // The owner's next chunk: a quarter of what is left of its share, at least one unit.
  static bool take_front(Share& s, int64_t* u0, int64_t* u1);
  // The whole share, when no other thread takes from it.
  static bool take_all(Share& s, int64_t* u0, int64_t* u1);
  // A thief's chunk: half of what is left of another share, at least one unit.
  static bool take_back(Share& s, int64_t* u0, int64_t* u1);

  std::unique_ptr<Share[]> shares_;
  int n_slots_ = 0;
  int n_threads_ = 1;
};

}  // namespace inferd
