// SpeculationPolicy: the auto mode's per-round choice (speculation_policy.h).
#include "swiftspec/speculation_policy.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "swiftspec/error.h"

namespace swiftspec {

namespace {

// Weight of a new measurement in the moving averages, once they hold 1 / weight values: acceptance
// follows the text (a code block, then prose) over tens of rounds; pass times are steadier but
// drift with the context. Acceptance decays per round, not per measurement: an arm measured
// again after g rounds weighs the new value 1 - (1 - kAcceptanceWeight)^g, so the sparse rounds
// that refresh an arm above the best move its estimate as far as g rounds of play would have.
constexpr double kAcceptanceWeight = 0.1;
constexpr double kTimeWeight = 0.3;
constexpr int kFirstProbeInterval = 4;
constexpr int kMaxProbeInterval = 512;
// Rounds of one probe: enough for the averages to move when the draft agrees again.
constexpr int kProbeRounds = 3;
// A probe ends at an empty round when its arm's acceptance estimate is below this (tokens a round).
constexpr double kProbeGiveUpAccepted = 0.05;
constexpr int kRefreshAboveEvery = 8;
// While the arm above the best was never measured: climb fast.
constexpr int kClimbEvery = 2;
// A prior from an earlier request counts as this many measurements at most: pass times carry over
// (the same machine), acceptance less (another text).
constexpr int kPriorTimeCount = 3;
constexpr int kPriorAcceptanceCount = 2;
constexpr int kRefreshTargetOnlyEvery = 128;

}  // namespace

void SpeculationPolicy::Estimate::add(double x, double weight) {
  ++count;
  value = count == 1 ? x : value + std::max(weight, 1.0 / count) * (x - value);
}

SpeculationPolicy::SpeculationPolicy(int max_budget, const Memory* prior) {
  if (max_budget < 1) throw InvalidArgument("tree_budget must be >= 1, got " + std::to_string(max_budget));
  for (int b = 1; b < max_budget; b *= 2) budgets_.push_back(b);
  budgets_.push_back(max_budget);
  draft_time_.resize(budgets_.size());
  accepted_.resize(budgets_.size());
  accepted_round_.assign(budgets_.size(), 0);
  probe_interval_ = kFirstProbeInterval;
  for (int i = 0; i < static_cast<int>(budgets_.size()); ++i)
    if (budgets_[i] <= std::max(1, max_budget / 4)) start_arm_ = i;
  if (prior == nullptr) return;
  auto capped = [](Estimate e, int cap) {
    e.count = std::min(e.count, cap);
    return e;
  };
  for (const auto& [rows, e] : prior->target_time)
    if (e.count > 0) target_time_[rows] = capped(e, kPriorTimeCount);
  overhead_off_ = capped(prior->overhead_off, kPriorTimeCount);
  overhead_spec_ = capped(prior->overhead_spec, kPriorTimeCount);
  if (prior->budgets == budgets_ && prior->draft_time.size() == budgets_.size() &&
      prior->accepted.size() == budgets_.size()) {
    for (size_t i = 0; i < budgets_.size(); ++i) {
      draft_time_[i] = capped(prior->draft_time[i], kPriorTimeCount);
      accepted_[i] = capped(prior->accepted[i], kPriorAcceptanceCount);
    }
    if (prior->probe_interval > 0) probe_interval_ = std::min(prior->probe_interval, kMaxProbeInterval);
  }
}

SpeculationPolicy::Memory SpeculationPolicy::memory() const {
  Memory m;
  m.budgets = budgets_;
  m.target_time = target_time_;
  m.draft_time = draft_time_;
  m.accepted = accepted_;
  m.overhead_off = overhead_off_;
  m.overhead_spec = overhead_spec_;
  m.probe_interval = probe_interval_;
  return m;
}

bool SpeculationPolicy::any_arm_measured() const {
  for (const Estimate& a : accepted_)
    if (a.count > 0) return true;
  return false;
}

int SpeculationPolicy::arm_index(int budget) const {
  const auto it = std::find(budgets_.begin(), budgets_.end(), budget);
  return it == budgets_.end() ? -1 : static_cast<int>(it - budgets_.begin());
}

double SpeculationPolicy::target_seconds(int rows) const {
  if (target_time_.empty()) return 0.0;
  const auto hi = target_time_.lower_bound(rows);
  if (hi == target_time_.end()) return std::prev(hi)->second.value;  // flat beyond the largest measured
  if (hi->first == rows || hi == target_time_.begin()) return hi->second.value;
  const auto lo = std::prev(hi);
  const double f = static_cast<double>(rows - lo->first) / (hi->first - lo->first);
  return lo->second.value + f * (hi->second.value - lo->second.value);
}

double SpeculationPolicy::estimated_rate(int budget) const {
  if (budget == 0) {
    const auto it = target_time_.find(1);
    const double seconds = it == target_time_.end() ? 0.0 : it->second.value + overhead_off_.value;
    return seconds <= 0.0 ? 0.0 : 1.0 / seconds;
  }
  const int i = arm_index(budget);
  if (i < 0 || accepted_[i].count == 0 || target_time_.empty()) return 0.0;
  // A larger tree holds a smaller one's nodes, so accepts at least as much: a larger arm's
  // average below a smaller one's is stale (measured in harder text, not since), not the truth.
  double accepted = 0.0;
  for (int j = 0; j <= i; ++j)
    if (accepted_[j].count > 0) accepted = std::max(accepted, accepted_[j].value);
  const double seconds = draft_time_[i].value + target_seconds(budget + 1) + overhead_spec_.value;
  return seconds <= 0.0 ? 0.0 : (1.0 + accepted) / seconds;
}

int SpeculationPolicy::best_speculative(int top) const {
  int best = budgets_[0];
  for (int i = 1; i <= top; ++i)
    if (estimated_rate(budgets_[i]) > estimated_rate(best)) best = budgets_[i];
  return best;
}

SpeculationPolicy::Choice SpeculationPolicy::play(int budget, Reason reason) {
  ++rounds_;
  ++reasons_[reason];
  if (budget == 0)
    last_off_round_ = rounds_;
  else
    off_streak_ = 0;
  return {budget, reason};
}

SpeculationPolicy::Choice SpeculationPolicy::choose(int allowed_budget) {
  if (allowed_budget < 1) return play(0, Reason::Limit);
  if (target_time_.find(1) == target_time_.end()) return play(0, Reason::Measure);
  // The largest arm the round may play.
  int top = -1;
  for (int i = 0; i < static_cast<int>(budgets_.size()); ++i)
    if (budgets_[i] <= allowed_budget) top = i;
  if (top < 0) return play(0, Reason::Limit);
  if (!any_arm_measured()) return play(budgets_[std::min(start_arm_, top)], Reason::Measure);

  const int best_spec = best_speculative(top);
  if (estimated_rate(0) >= estimated_rate(best_spec)) {
    if (probe_left_ > 0) {  // the rest of a probe
      --probe_left_;
      return play(best_spec, Reason::Probe);
    }
    if (++off_streak_ < probe_interval_) return play(0, Reason::Best);
    probe_interval_ = std::min(2 * probe_interval_, kMaxProbeInterval);
    probe_left_ = kProbeRounds - 1;
    // The best speculative arm, or the start arm where that is larger (it measures the arms
    // below it again, and a smaller arm's acceptance may be stale).
    return play(std::max(best_spec, budgets_[std::min(start_arm_, top)]), Reason::Probe);
  }
  probe_interval_ = kFirstProbeInterval;
  probe_left_ = 0;
  if (rounds_ - last_off_round_ >= kRefreshTargetOnlyEvery) return play(0, Reason::Refresh);
  // The arm above the best: its estimate is stale while smaller arms play (a round measures only
  // the arms up to its own), and it is the one to move to when the text gets easier.
  const int above = std::min(arm_index(best_spec) + 1, top);
  const int every = accepted_[above].count == 0 ? kClimbEvery : kRefreshAboveEvery;
  if (budgets_[above] != best_spec && rounds_ - last_above_round_ >= every) {
    last_above_round_ = rounds_ + 1;
    return play(budgets_[above], Reason::Refresh);
  }
  return play(best_spec, Reason::Best);
}

void SpeculationPolicy::observe_target_only(double seconds, double overhead_seconds) {
  if (!(seconds >= 0.0) || !(overhead_seconds >= 0.0))
    throw InvalidArgument("observe_target_only: seconds must be >= 0");
  target_time_[1].add(seconds, kTimeWeight);
  overhead_off_.add(overhead_seconds, kTimeWeight);
}

void SpeculationPolicy::observe_speculative(int played, int rows, double verify_seconds,
                                            const std::vector<double>& draft_seconds_at,
                                            const std::vector<int>& accepted_at, double overhead_seconds) {
  const int arm = arm_index(played);
  if (arm < 0) throw InvalidArgument("observe_speculative: budget " + std::to_string(played) + " is not an arm");
  const size_t arms = static_cast<size_t>(arm) + 1;
  if (draft_seconds_at.size() != arms || accepted_at.size() != arms)
    throw InvalidArgument("observe_speculative: expected " + std::to_string(arms) + " arms' measurements, got " +
                          std::to_string(draft_seconds_at.size()) + " and " + std::to_string(accepted_at.size()));
  if (rows < 1 || !(verify_seconds >= 0.0) || !(overhead_seconds >= 0.0))
    throw InvalidArgument("observe_speculative: rows must be >= 1 and seconds >= 0");
  for (size_t i = 0; i < arms; ++i) {
    const bool unmeasured = draft_seconds_at[i] == -1.0 && accepted_at[i] == -1;
    if (unmeasured && i + 1 == arms) throw InvalidArgument("observe_speculative: the played arm has no measurement");
    if (!unmeasured && (!(draft_seconds_at[i] >= 0.0) || accepted_at[i] < 0))
      throw InvalidArgument("observe_speculative: negative draft time or accepted count");
  }
  const double accepted_before = accepted_[arm].value;  // (what the arm accepted before this round)
  target_time_[rows].add(verify_seconds, kTimeWeight);
  overhead_spec_.add(overhead_seconds, kTimeWeight);
  for (size_t i = 0; i < arms; ++i) {
    if (accepted_at[i] < 0) continue;  // not measured by this round
    draft_time_[i].add(draft_seconds_at[i], kTimeWeight);
    const int gap = std::max(1, rounds_ - accepted_round_[i]);
    accepted_[i].add(accepted_at[i], 1.0 - std::pow(1.0 - kAcceptanceWeight, gap));
    accepted_round_[i] = rounds_;
  }
  // A probe round that accepted nothing, of an arm that had accepted next to nothing before, ends
  // its probe: the draft still does not agree, and the rest of the probe would cost speculative
  // rounds to learn nothing new. (An arm that accepts now and then keeps its whole probe: one
  // empty round of a fair draft is noise.)
  if (probe_left_ > 0 && accepted_at[arm] == 0 && accepted_before < kProbeGiveUpAccepted) probe_left_ = 0;
}

const char* SpeculationPolicy::reason_name(Reason reason) {
  switch (reason) {
    case Reason::Measure:
      return "measure";
    case Reason::Best:
      return "best";
    case Reason::Probe:
      return "probe";
    case Reason::Refresh:
      return "refresh";
    case Reason::Limit:
      return "limit";
  }
  return "unknown";
}

std::map<std::string, int> SpeculationPolicy::reason_counts() const {
  std::map<std::string, int> out;
  for (const auto& [reason, n] : reasons_) out[reason_name(reason)] = n;
  return out;
}

}  // namespace swiftspec
