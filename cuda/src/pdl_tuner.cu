#include "pdl_tuner.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "common.h"

namespace swiftspec::cuda {

namespace {

const char* const kKindNames[kPdlKinds] = {"qkv", "attn", "o", "gate_up", "down", "lm_head"};

struct Candidate {
  unsigned mask = 0;
  cudaGraphExec_t exec = nullptr;
  double median_ms = 0;
};

/// Owns the candidates' graphs until one is handed out.
struct Candidates {
  std::vector<Candidate> list;
  ~Candidates() {
    for (auto& c : list)
      if (c.exec) cudaGraphExecDestroy(c.exec);
  }
  Candidate& add(unsigned mask, const std::function<cudaGraphExec_t(unsigned)>& capture) {
    list.push_back(Candidate{mask, nullptr, 0});
    list.back().exec = capture(mask);
    return list.back();
  }
};

/// Replays each of `which` once (warm-up), then `rounds` interleaved rounds;
/// sets each candidate's median device time (CUDA events on `stream`).
void time_candidates(cudaStream_t stream, std::vector<Candidate*>& which, int rounds) {
  for (Candidate* c : which) SS_CUDA_CHECK(cudaGraphLaunch(c->exec, stream));
  const size_t n = which.size();
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
      SS_CUDA_CHECK(cudaGraphLaunch(which[i]->exec, stream));
      SS_CUDA_CHECK(cudaEventRecord(ev[k + 1], stream));
    }
  SS_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < n; ++i) {
    std::vector<float> ms(rounds);
    for (int r = 0; r < rounds; ++r) {
      const size_t k = 2 * (r * n + i);
      SS_CUDA_CHECK(cudaEventElapsedTime(&ms[r], ev[k], ev[k + 1]));
    }
    std::sort(ms.begin(), ms.end());
    which[i]->median_ms = ms[rounds / 2];
  }
}

}  // namespace

std::string pdl_mask_name(unsigned off_mask) {
  if (off_mask == 0) return "none";
  if ((off_mask & kPdlAllOff) == kPdlAllOff) return "all";
  std::string s;
  for (unsigned k = 0; k < kPdlKinds; ++k)
    if (off_mask & (1u << k)) s += (s.empty() ? "" : "+") + std::string(kKindNames[k]);
  return s;
}

std::string PdlTuning::summary() const {
  std::string s;
  char buf[64];
  for (const auto& [mask, ms] : measured) {
    std::snprintf(buf, sizeof buf, "%.4f", ms);
    s += (s.empty() ? "" : ", ") + pdl_mask_name(mask) + " " + buf;
  }
  return s + " -> off: " + pdl_mask_name(off_mask);
}

PdlTuning tune_pdl_edges(cudaStream_t stream, const std::function<cudaGraphExec_t(unsigned)>& capture,
                         cudaGraphExec_t* chosen, int rounds, double min_gain) {
  if (rounds < 1) rounds = 1;
  Candidates cands;
  cands.list.reserve(kPdlKinds + 3);  // pointers into the list stay valid
  std::vector<Candidate*> first;
  first.push_back(&cands.add(0, capture));
  first.push_back(&cands.add(kPdlAllOff, capture));
  for (unsigned k = 0; k < kPdlKinds; ++k) first.push_back(&cands.add(1u << k, capture));
  time_candidates(stream, first, rounds);

  PdlTuning out;
  for (const Candidate* c : first) out.measured.emplace_back(c->mask, c->median_ms);
  const double base = first[0]->median_ms;
  const double bar = base * (1.0 - min_gain);
  Candidate* best = first[0];
  unsigned union_mask = 0;
  int singles = 0;
  for (Candidate* c : first) {
    if (c->median_ms < bar && c->median_ms < best->median_ms) best = c;
    if (c->mask != kPdlAllOff && c->mask != 0 && c->median_ms < bar) {
      union_mask |= c->mask;
      ++singles;
    }
  }
  // Edges that each pay alone may pay together: time their union against the
  // round's winner (both again, so they are compared within one round set).
  if (singles >= 2 && union_mask != kPdlAllOff) {
    std::vector<Candidate*> second{best, &cands.add(union_mask, capture)};
    time_candidates(stream, second, rounds);
    out.measured.emplace_back(union_mask, second[1]->median_ms);
    if (second[1]->median_ms < second[0]->median_ms) best = second[1];
  }
  out.off_mask = best->mask;
  *chosen = best->exec;
  best->exec = nullptr;  // handed out; the rest are destroyed with `cands`
  return out;
}

}  // namespace swiftspec::cuda
