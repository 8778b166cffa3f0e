#include "step_tuner.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "common.h"

namespace swiftspec::cuda {

namespace {

struct Candidate {
  StepSetting setting;
  cudaGraphExec_t exec = nullptr;
  double median_ms = 0;
};

/// Owns the candidates' graphs until one is handed out. A deque-like list of
/// unique pointers: candidates keep their address while more are added.
struct Candidates {
  std::vector<std::unique_ptr<Candidate>> list;
  ~Candidates() {
    for (auto& c : list)
      if (c->exec) cudaGraphExecDestroy(c->exec);
  }
  Candidate* add(const StepSetting& s, const std::function<cudaGraphExec_t(const StepSetting&)>& capture) {
    list.push_back(std::make_unique<Candidate>());
    list.back()->setting = s;
    list.back()->exec = capture(s);
    return list.back().get();
  }
};

/// Sets each candidate's median device time (time_graphs).
void time_candidates(cudaStream_t stream, const std::vector<Candidate*>& which, int rounds) {
  std::vector<cudaGraphExec_t> graphs;
  for (const Candidate* c : which) graphs.push_back(c->exec);
  const std::vector<double> ms = time_graphs(stream, graphs, rounds);
  for (size_t i = 0; i < which.size(); ++i) which[i]->median_ms = ms[i];
}

/// Replays each candidate once and compares `outputs()` with the first's (tune_step's `outputs`).
void verify_candidates(cudaStream_t stream, const std::vector<TunerKnob>& knobs,
                       const std::vector<std::unique_ptr<Candidate>>& list,
                       const std::function<std::vector<uint8_t>()>& outputs) {
  std::vector<uint8_t> want;
  for (const auto& c : list) {
    SS_CUDA_CHECK(cudaGraphLaunch(c->exec, stream));
    SS_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<uint8_t> got = outputs();
    if (&c == &list.front())
      want = std::move(got);
    else if (got != want)
      throw Error("step tuner: the setting " + step_setting_name(knobs, c->setting) +
                  " changed the step's outputs (it must change only the timing)");
  }
}

}  // namespace

std::vector<double> time_graphs(cudaStream_t stream, const std::vector<cudaGraphExec_t>& graphs, int rounds) {
  rounds = std::max(rounds, 1);
  for (cudaGraphExec_t g : graphs) SS_CUDA_CHECK(cudaGraphLaunch(g, stream));
  const size_t n = graphs.size();
  std::vector<cudaEvent_t> ev(2 * n * rounds, nullptr);
  struct EventsGuard {
    std::vector<cudaEvent_t>& ev;
    ~EventsGuard() {
      for (auto e : ev)
        if (e) cudaEventDestroy(e);
    }
  } guard{ev};
  for (auto& e : ev) SS_CUDA_CHECK(cudaEventCreate(&e));
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < n; ++i) {
      const size_t k = 2 * (r * n + i);
      SS_CUDA_CHECK(cudaEventRecord(ev[k], stream));
      SS_CUDA_CHECK(cudaGraphLaunch(graphs[i], stream));
      SS_CUDA_CHECK(cudaEventRecord(ev[k + 1], stream));
    }
  SS_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> median(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<float> ms(rounds);
    for (int r = 0; r < rounds; ++r) {
      const size_t k = 2 * (r * n + i);
      SS_CUDA_CHECK(cudaEventElapsedTime(&ms[r], ev[k], ev[k + 1]));
    }
    std::sort(ms.begin(), ms.end());
    median[i] = ms[rounds / 2];
  }
  return median;
}

std::string step_setting_name(const std::vector<TunerKnob>& knobs, const StepSetting& s) {
  std::string out;
  for (size_t k = 0; k < knobs.size() && k < s.size(); ++k)
    if (s[k] != 0) out += (out.empty() ? "" : "+") + knobs[k].name + "=" + knobs[k].options[s[k]];
  return out.empty() ? "default" : out;
}

std::string StepTuning::summary() const {
  std::string s;
  char buf[32];
  for (const auto& [name, ms] : measured) {
    std::snprintf(buf, sizeof buf, " %.4f", ms);
    s += (s.empty() ? "" : ", ") + name + buf;
  }
  return s + " -> " + (measured.empty() ? std::string("default") : chosen_name);
}

StepTuning tune_step(cudaStream_t stream, const std::vector<TunerKnob>& knobs, const std::vector<StepSetting>& extra,
                     const std::function<cudaGraphExec_t(const StepSetting&)>& capture, cudaGraphExec_t* chosen,
                     int rounds, double min_gain, const std::function<std::vector<uint8_t>()>& outputs) {
  for (const TunerKnob& k : knobs)
    if (k.options.empty()) throw InvalidArgument("tune_step: knob " + k.name + " has no options");
  for (const StepSetting& s : extra)
    if (s.size() != knobs.size()) throw InvalidArgument("tune_step: an extra setting has the wrong size");
  rounds = std::max(rounds, 1);
  const StepSetting base(knobs.size(), 0);
  Candidates cands;
  std::vector<Candidate*> first{cands.add(base, capture)};
  for (const StepSetting& s : extra) first.push_back(cands.add(s, capture));
  for (size_t k = 0; k < knobs.size(); ++k)
    for (int o = 1; o < static_cast<int>(knobs[k].options.size()); ++o) {
      StepSetting s = base;
      s[k] = o;
      first.push_back(cands.add(s, capture));
    }
  time_candidates(stream, first, rounds);

  StepTuning out;
  for (const Candidate* c : first) out.measured.emplace_back(step_setting_name(knobs, c->setting), c->median_ms);
  const double bar = first[0]->median_ms * (1.0 - min_gain);
  Candidate* best = first[0];
  // Per knob, its best single option among those beating the default.
  std::vector<double> knob_best(knobs.size(), bar);
  StepSetting combined = base;
  for (Candidate* c : first) {
    if (c->median_ms < bar && c->median_ms < best->median_ms) best = c;
    const auto moved = std::count_if(c->setting.begin(), c->setting.end(), [](int o) { return o != 0; });
    if (moved != 1 || c == first[0]) continue;
    const size_t k =
        std::find_if(c->setting.begin(), c->setting.end(), [](int o) { return o != 0; }) - c->setting.begin();
    if (c->median_ms < knob_best[k]) {
      knob_best[k] = c->median_ms;
      combined[k] = c->setting[k];
    }
  }
  // Options that each pay alone may pay together: time their combination
  // against the round's winner (both again, within one set of rounds).
  const auto moved = std::count_if(combined.begin(), combined.end(), [](int o) { return o != 0; });
  if (moved >= 2 && combined != best->setting) {
    std::vector<Candidate*> second{best, cands.add(combined, capture)};
    time_candidates(stream, second, rounds);
    out.measured.emplace_back(step_setting_name(knobs, combined), second[1]->median_ms);
    if (second[1]->median_ms < second[0]->median_ms) best = second[1];
  }
  if (outputs) verify_candidates(stream, knobs, cands.list, outputs);  // list[0]: the default setting
  out.chosen = best->setting;
  out.chosen_name = step_setting_name(knobs, best->setting);
  *chosen = best->exec;
  best->exec = nullptr;  // handed out; the rest are destroyed with `cands`
  return out;
}

}  // namespace swiftspec::cuda
