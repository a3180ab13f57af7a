// A sequence slice's recurrent state around one layer's pass, shared by the
// recurrent mixers (cpu_executor_delta_net.cpp, cpu_executor_mamba2.cpp):
// before the slice, its state comes from load_state_from's slot (a prefix
// snapshot, or the checkpoint before rejected drafts), or is zeroed for a
// sequence starting at position 0, else its own slot's is continued; after
// it, the state is copied to save_state_to's slot when set (forward_batch.h).
#pragma once
#include <algorithm>
#include <cstdint>

#include "model/forward_batch.h"

namespace inferd {

// This thread's part of one layer's state in a slot: `rows` runs of floats
// [begin, end), `stride` apart. A convolution window is taps - 1 rows of C
// channels (this thread's channels); a recurrent matrix one run (this
// thread's heads).
struct StatePart {
  int64_t rows = 1, stride = 0, begin = 0, end = 0;

  void copy(const float* from, float* to) const {
    for (int64_t r = 0; r < rows; ++r) std::copy(from + r * stride + begin, from + r * stride + end, to + r * stride + begin);
  }
  void zero(float* state) const {
    for (int64_t r = 0; r < rows; ++r) std::fill(state + r * stride + begin, state + r * stride + end, 0.0f);
  }
};

// slot(s) is the layer's state in slot s.
template <class SlotState>
void begin_slice_state(const SequenceSlice& sl, bool fresh, const StatePart& part, SlotState slot) {
  if (sl.load_state_from >= 0)
    part.copy(slot(sl.load_state_from), slot(sl.state_slot));
  else if (fresh)
    part.zero(slot(sl.state_slot));
}

template <class SlotState>
void end_slice_state(const SequenceSlice& sl, const StatePart& part, SlotState slot) {
  if (sl.save_state_to >= 0) part.copy(slot(sl.state_slot), slot(sl.save_state_to));
}

}  // namespace inferd
