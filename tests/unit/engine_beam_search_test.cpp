// Beam search's bookkeeping with no model: hand-made candidate rows whose
// outcome is worked out in the comments (scores, which beams live on, which
// finish, when early stopping ends the search).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/beam_search.h"

namespace inferd {
namespace {

constexpr int32_t kEos = 0;

using Rows = std::vector<std::vector<TokenLogprob>>;

// Every candidate ending in kEos stops its beam; nothing else does.
BeamEnd eos_ends(int32_t, int32_t token) { return token == kEos ? BeamEnd::kStopToken : BeamEnd::kNone; }

std::vector<TokenLogprob> row(std::initializer_list<std::pair<int32_t, double>> tokens) {
  std::vector<TokenLogprob> r;
  for (auto [t, lp] : tokens) r.push_back({t, static_cast<float>(lp)});
  return r;
}

BeamSearchParams params(int32_t width, float length_penalty = 1.0f, EarlyStopping es = EarlyStopping::kFalse) {
  BeamSearchParams p;
  p.beam_width = width;
  p.length_penalty = length_penalty;
  p.early_stopping = es;
  return p;
}

TEST(BeamSearchScore, DividesByTheLengthWithThePromptToThePenalty) {
  EXPECT_DOUBLE_EQ(beam_search_score(-6.0, 3, 1.0), -2.0);
  EXPECT_DOUBLE_EQ(beam_search_score(-6.0, 4, 0.5), -3.0);
  EXPECT_DOUBLE_EQ(beam_search_score(-6.0, 10, 0.0), -6.0);
  EXPECT_DOUBLE_EQ(beam_search_score(-6.0, 2, -1.0), -12.0);
}

TEST(BeamSearchParams, ValidateNamesTheBadField) {
  EXPECT_TRUE(params(1).validate().ok());
  EXPECT_FALSE(params(0).validate().ok());
  EXPECT_NE(params(2, NAN).validate().error().message.find("length_penalty"), std::string::npos);
  EXPECT_FALSE(params(2, INFINITY).validate().ok());
}

TEST(BeamSearch, TheFirstStepForksTheOneBeamIntoTheBestCandidates) {
  BeamSearch bs(params(2), /*prompt_len=*/5, /*max_tokens=*/10);
  ASSERT_EQ(bs.live().size(), 1u);
  EXPECT_EQ(bs.candidates_per_beam(), 4);
  const std::vector<std::vector<TokenLogprob>> c = {row({{7, -0.5}, {8, -1.0}, {9, -2.0}, {10, -3.0}})};
  const std::vector<BeamChild> next = bs.step(c, eos_ends);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].parent, 0);
  EXPECT_EQ(next[0].token, 7);
  EXPECT_EQ(next[1].parent, 0);
  EXPECT_EQ(next[1].token, 8);
  ASSERT_EQ(bs.live().size(), 2u);
  EXPECT_EQ(bs.live()[0].token_ids, std::vector<int32_t>{7});
  EXPECT_DOUBLE_EQ(bs.live()[1].cumulative_logprob, -1.0);
  EXPECT_TRUE(bs.finished().empty());
  EXPECT_FALSE(bs.done());
}

TEST(BeamSearch, CandidatesCompeteAcrossBeamsByCumulativeLogprob) {
  BeamSearch bs(params(2), 5, 10);
  bs.step(Rows{row({{7, -0.5}, {8, -1.0}, {9, -4.0}, {10, -5.0}})}, eos_ends);
  // Beam 0 (7, -0.5) and beam 1 (8, -1.0). Beam 1's best candidate (-1.0 - 0.1
  // = -1.1) beats beam 0's second (-0.5 - 1.0 = -1.5): beam 0 is followed once,
  // by its best (-0.5 - 0.4 = -0.9).
  const std::vector<std::vector<TokenLogprob>> c = {row({{11, -0.4}, {12, -1.0}, {13, -2.0}, {14, -3.0}}),
                                                    row({{21, -0.1}, {22, -2.0}, {23, -3.0}, {24, -4.0}})};
  const std::vector<BeamChild> next = bs.step(c, eos_ends);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].parent, 0);
  EXPECT_EQ(next[0].token, 11);
  EXPECT_EQ(next[1].parent, 1);
  EXPECT_EQ(next[1].token, 21);
  EXPECT_EQ(bs.live()[0].token_ids, (std::vector<int32_t>{7, 11}));
  EXPECT_EQ(bs.live()[1].token_ids, (std::vector<int32_t>{8, 21}));
  EXPECT_NEAR(bs.live()[0].cumulative_logprob, -0.9, 1e-6);
  EXPECT_NEAR(bs.live()[1].cumulative_logprob, -1.1, 1e-6);

  // Both children of one beam when its candidates are the best two: the other dies.
  const std::vector<std::vector<TokenLogprob>> c2 = {row({{31, -0.1}, {32, -0.2}, {33, -5.0}, {34, -6.0}}),
                                                     row({{41, -1.0}, {42, -2.0}, {43, -3.0}, {44, -4.0}})};
  const std::vector<BeamChild> next2 = bs.step(c2, eos_ends);
  ASSERT_EQ(next2.size(), 2u);
  EXPECT_EQ(next2[0].parent, 0);
  EXPECT_EQ(next2[1].parent, 0);
  EXPECT_EQ(next2[1].token, 32);
}

TEST(BeamSearch, AStopTokenAtAnyRankFinishesItsBeamAndTheOthersStillFillTheWidth) {
  BeamSearch bs(params(2), 4, 10);
  // EOS is the best candidate: it finishes; 8 and 9 live on.
  bs.step(Rows{row({{kEos, -0.2}, {8, -1.0}, {9, -1.5}, {10, -3.0}})}, eos_ends);
  ASSERT_EQ(bs.live().size(), 2u);
  EXPECT_EQ(bs.live()[0].token_ids, std::vector<int32_t>{8});
  EXPECT_EQ(bs.live()[1].token_ids, std::vector<int32_t>{9});
  ASSERT_EQ(bs.finished().size(), 1u);
  EXPECT_EQ(bs.finished()[0].token_ids, std::vector<int32_t>{kEos});
  EXPECT_EQ(bs.finished()[0].end, BeamEnd::kStopToken);
  // Its length is the prompt alone: the stop token is not counted.
  EXPECT_NEAR(bs.finished()[0].score, -0.2 / 4, 1e-6);

  // An EOS ranked last of all candidates still finishes its beam (vLLM keeps
  // every EOS candidate as a completed beam).
  bs.step(Rows{row({{11, -0.1}, {12, -0.2}, {13, -0.3}, {kEos, -9.0}}),
                      row({{21, -0.1}, {22, -0.2}, {23, -0.3}, {24, -0.4}})},
          eos_ends);
  ASSERT_EQ(bs.finished().size(), 2u);
  EXPECT_EQ(bs.finished()[1].token_ids, (std::vector<int32_t>{8, kEos}));
  EXPECT_NEAR(bs.finished()[1].cumulative_logprob, -10.0, 1e-6);
  EXPECT_NEAR(bs.finished()[1].score, -10.0 / 5, 1e-6);
}

TEST(BeamSearch, OnlyTheBestWidthFinishedBeamsAreKept) {
  BeamSearch bs(params(2, 1.0f, EarlyStopping::kNever), 1, 10);
  bs.step(Rows{row({{5, -0.1}, {6, -0.2}, {kEos, -0.3}, {7, -0.4}})}, eos_ends);
  const auto stop_on_9 = [](int32_t, int32_t t) {
    return t == 9 ? BeamEnd::kStopString : t == kEos ? BeamEnd::kStopToken : BeamEnd::kNone;
  };
  // Three more finish (EOS after 5 and 6, the stop string "9" after 5): of the
  // four, the two best scores are kept.
  bs.step(Rows{row({{kEos, -0.1}, {9, -3.0}, {1, -4.0}, {2, -5.0}}),
                      row({{kEos, -2.0}, {3, -0.1}, {4, -0.2}, {8, -5.0}})},
          stop_on_9);
  ASSERT_EQ(bs.finished().size(), 2u);
  // Scores: [EOS] -0.3/1; [5 EOS] -0.2/2 = -0.1; [5 9] -3.1/3; [6 EOS] -2.2/2.
  EXPECT_EQ(bs.finished()[0].token_ids, (std::vector<int32_t>{5, kEos}));
  EXPECT_NEAR(bs.finished()[0].score, -0.1, 1e-6);
  EXPECT_EQ(bs.finished()[1].token_ids, std::vector<int32_t>{kEos});
  EXPECT_NEAR(bs.finished()[1].score, -0.3, 1e-6);
}

TEST(BeamSearch, MaxTokensEndsEveryBeamAndTheFinishedAreRankedByScore) {
  // Penalty 0: the score is the cumulative logprob, so a short finished beam
  // beats the longer ones; penalty 2: long beams are divided by more.
  for (const float penalty : {0.0f, 2.0f}) {
    BeamSearch bs(params(2, penalty, EarlyStopping::kNever), /*prompt_len=*/1, /*max_tokens=*/2);
    // (Logprobs that floats hold exactly, so that the tie below is one.)
    bs.step(Rows{row({{5, -1.0}, {kEos, -1.25}, {6, -1.5}, {7, -9.0}})}, eos_ends);
    EXPECT_FALSE(bs.done());
    const std::vector<BeamChild> next = bs.step(Rows{row({{11, -0.5}, {12, -0.75}, {13, -1.0}, {14, -1.25}}),
                                                            row({{21, -0.25}, {22, -1.0}, {23, -1.25}, {24, -1.5}})},
                                                 eos_ends);
    EXPECT_TRUE(next.empty());
    EXPECT_TRUE(bs.done());
    EXPECT_TRUE(bs.live().empty());
    ASSERT_EQ(bs.finished().size(), 2u);
    // Length-ended: [5 11] -1.5, [5 12] -1.75, [6 21] -1.75, ... at length 3;
    // [EOS] -1.25 at length 1.
    if (penalty == 0.0f) {
      EXPECT_EQ(bs.finished()[0].token_ids, std::vector<int32_t>{kEos});
      EXPECT_EQ(bs.finished()[1].token_ids, (std::vector<int32_t>{5, 11}));
      EXPECT_EQ(bs.finished()[1].end, BeamEnd::kLength);
    } else {
      EXPECT_EQ(bs.finished()[0].token_ids, (std::vector<int32_t>{5, 11}));
      EXPECT_NEAR(bs.finished()[0].score, -1.5 / 9, 1e-6);
      // [5 12] and [6 21] tie at -1.75: the one from the earlier beam first.
      EXPECT_EQ(bs.finished()[1].token_ids, (std::vector<int32_t>{5, 12}));
    }
  }
}

// After the first step two beams have finished and one live beam is about as
// good; the three settings of early_stopping then differ.
struct EarlyStoppingCase {
  EarlyStopping mode;
  float penalty;
  bool stops;
};

TEST(BeamSearch, EarlyStoppingTrueFalseAndNever) {
  // W = 2, prompt 1, max_tokens 8; EOS and the stop string "9" end a beam.
  const auto ends = [](int32_t, int32_t t) {
    return t == kEos ? BeamEnd::kStopToken : t == 9 ? BeamEnd::kStopString : BeamEnd::kNone;
  };
  const std::vector<std::vector<TokenLogprob>> first = {row({{kEos, -1.0}, {3, -1.1}, {9, -1.2}, {4, -5.0}})};
  // Finished: [EOS] at length 1 (the stop token is not counted), [9] at length 2.
  // Penalty 1: scores -1.0 and -0.6. Live: [3] at -1.1, [4] at -5.0, length 2.
  //  - true: two have finished: stop.
  //  - false: the best live beam now scores -1.1 / 2 = -0.55 > -1.0: go on.
  //  - never: it could reach -1.1 / (1 + 8) > -1.0: go on.
  // Penalty -1: scores -1.0 * 1 and -1.2 * 2 = -2.4; never: the best live beam
  // can do no better than now, -1.1 * 2 = -2.2 > -2.4: go on.
  for (const EarlyStoppingCase& c : {EarlyStoppingCase{EarlyStopping::kTrue, 1.0f, true},
                                     EarlyStoppingCase{EarlyStopping::kFalse, 1.0f, false},
                                     EarlyStoppingCase{EarlyStopping::kNever, 1.0f, false},
                                     EarlyStoppingCase{EarlyStopping::kNever, -1.0f, false}}) {
    BeamSearch bs(params(2, c.penalty, c.mode), 1, 8);
    bs.step(first, ends);
    EXPECT_EQ(bs.done(), c.stops) << static_cast<int>(c.mode) << " penalty " << c.penalty;
    ASSERT_EQ(bs.finished().size(), 2u);
  }

  // Step 2 makes the live beams poor: the best is [3 11] at -1.1 - 2.0 = -3.1, length 3.
  //  - false: -3.1 / 3 = -1.03 <= the worst finished -1.0: stop.
  //  - never, penalty 1: could still reach -3.1 / 9 = -0.34 > -1.0: go on.
  //  - never, penalty -1: at best -3.1 * 3 = -9.3 <= -2.4: stop.
  const std::vector<std::vector<TokenLogprob>> second = {row({{11, -2.0}, {12, -2.5}, {13, -3.0}, {14, -3.5}}),
                                                         row({{21, -0.1}, {22, -0.2}, {23, -0.3}, {24, -0.4}})};
  for (const EarlyStoppingCase& c : {EarlyStoppingCase{EarlyStopping::kFalse, 1.0f, true},
                                     EarlyStoppingCase{EarlyStopping::kNever, 1.0f, false},
                                     EarlyStoppingCase{EarlyStopping::kNever, -1.0f, true}}) {
    BeamSearch bs(params(2, c.penalty, c.mode), 1, 8);
    bs.step(first, ends);
    ASSERT_FALSE(bs.done());
    const std::vector<BeamChild> next = bs.step(second, ends);
    EXPECT_EQ(bs.done(), c.stops) << static_cast<int>(c.mode) << " penalty " << c.penalty;
    EXPECT_EQ(next.empty(), c.stops);
    EXPECT_EQ(bs.live().empty(), c.stops);
    if (!c.stops) EXPECT_EQ(bs.live()[0].token_ids, (std::vector<int32_t>{3, 11}));
  }
}

TEST(BeamSearch, EqualCandidatesKeepTheOrderOfBeamsThenTokens) {
  BeamSearch bs(params(2), 3, 10);
  bs.step(Rows{row({{5, -1.0}, {6, -1.0}, {7, -1.0}, {8, -1.0}})}, eos_ends);
  EXPECT_EQ(bs.live()[0].token_ids, std::vector<int32_t>{5});
  EXPECT_EQ(bs.live()[1].token_ids, std::vector<int32_t>{6});
  const std::vector<BeamChild> next = bs.step(Rows{row({{1, -2.0}, {2, -3.0}, {3, -3.0}, {4, -3.0}}),
                                                          row({{1, -2.0}, {2, -2.5}, {3, -3.0}, {4, -3.0}})},
                                              eos_ends);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].parent, 0);
  EXPECT_EQ(next[1].parent, 1);
}

TEST(BeamSearch, WidthOneIsNotGreedy) {
  // Width 1 keeps the best finished beam and the best live one apart: the most
  // likely token, EOS, finishes a beam, and the search goes on with the next.
  BeamSearch bs(params(1, 1.0f, EarlyStopping::kNever), 1, 4);
  const std::vector<BeamChild> next = bs.step(Rows{row({{kEos, -0.6}, {5, -0.8}})}, eos_ends);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].token, 5);
  ASSERT_EQ(bs.finished().size(), 1u);
  // [5] may still reach -0.8 / (1 + 4) = -0.16 > -0.6.
  EXPECT_FALSE(bs.done());
}

TEST(BeamSearch, AStepWithTheWrongNumberOfRowsDoesNothing) {
  BeamSearch bs(params(2), 3, 10);
  EXPECT_TRUE(bs.step(std::vector<std::vector<TokenLogprob>>{}, eos_ends).empty());
  EXPECT_EQ(bs.live().size(), 1u);
  EXPECT_FALSE(bs.done());
}

}  // namespace
}  // namespace inferd
