// Checks of tuning at the context in use (issue 27): the step tuner tunes each context band
// the model's context reaches (cuda/src/context_bands.h) and no other, every band's graphs
// compute the untuned model's bits, tree steps in long bands commit nothing, and the
// megakernel hands single-token steps to the layered step where its measured limit says
// (or where an explicit megakernel_max_keys, or the default without autotune, says).
#include "check_context_bands.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check_harness.h"
#include "context_bands.h"

namespace swiftspec::cuda_check {

namespace {

using swiftspec::cuda::band_upper;
using swiftspec::cuda::kBandLengths;
using swiftspec::cuda::kContextBands;

/// Every model here: 40000 keys, so bands 0-3 are reached (the synthetic steps sit at 512,
/// 4096, 16384 and 32768 committed keys) and band 4 (65536) is not.
constexpr int kMaxContext = 40000;
constexpr int kReachedBands = 4;

ModelOptions band_options() {
  ModelOptions opt;
  opt.max_context = kMaxContext;
  opt.max_tree = 128;
  return opt;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && !a.empty() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

/// The lines of a tuning log.
std::vector<std::string> log_lines(const std::string& log) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < log.size()) {
    const size_t end = log.find('\n', at);
    lines.push_back(log.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return lines;
}

bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

/// The logits of a decode step of `tok` after `committed` random keys (the same seed gives
/// every model the same K/V).
std::vector<float> decode_at(CudaModel& m, int committed, int tok, uint64_t seed) {
  m.debug_fill_committed_random(committed, seed);
  std::vector<float> lg;
  m.forward(append_batch({tok}, committed, LogitsMode::Last), lg);
  return lg;
}

/// The tuned model's log: a tuning line (not a failure) per reached band and bucket, 128 attention
/// rows among the candidates of tree buckets only, none
/// for a band past the context.
void check_band_log(const std::string& log) {
  int missing = 0, failed = 0, beyond = 0, rows_wrong = 0;
  const std::vector<std::string> lines = log_lines(log);
  for (int b = 0; b < kContextBands; ++b)
    for (int nt : {1, 2, 4, 8}) {
      const std::string head = "band=" + std::to_string(kBandLengths[b]) + " nt=" + std::to_string(nt) + ": ";
      int found = 0;
      for (const std::string& l : lines)
        if (starts_with(l, head)) {
          ++found;
          if (l.find("tuning failed") != std::string::npos) ++failed;
          // The attention's rows are a candidate in trees' buckets only (step_choice.h, attn_rows_knob).
          if ((l.find("attn.rows=128") != std::string::npos) != (nt > 1)) ++rows_wrong;
        }
      if (b < kReachedBands && found != 1) ++missing;
      if (b >= kReachedBands) beyond += found;
    }
  char det[200];
  std::snprintf(det, sizeof det,
                "(%d of %d lines missing or repeated, %d failed, %d past max_context, %d with attn.rows wrong)",
                missing, 4 * kReachedBands, failed, beyond, rows_wrong);
  record("bands: max_context 40000 tunes bands 512..32768 x 4 buckets only", missing + failed + beyond + rows_wrong, 0,
         missing == 0 && failed == 0 && beyond == 0 && rows_wrong == 0, det);
}

/// At committed lengths in each reached band: a decode step and trees of every bucket give
/// bitwise the untuned model's logits, and a tree commits nothing.
void check_band_bits(CudaModel& tuned, CudaModel& plain, int vocab, Rng& rng) {
  const int lengths[kReachedBands] = {700, 5000, 20000, 39000};  // bands 0, 1, 2, 3
  const ModelOptions opt = band_options();
  for (int c : lengths) {
    int differ = 0, steps = 0, moved = 0;
    const uint64_t seed = 900 + c;
    const int tok = rng.below(vocab);
    ++steps;
    if (!same_bits(decode_at(tuned, c, tok, seed), decode_at(plain, c, tok, seed))) ++differ;
    for (int nodes : {6, 16, 30, 64}) {  // buckets 1, 2, 4, 8
      tuned.truncate_committed(c);
      plain.truncate_committed(c);
      const Tree t = make_tree(nodes, c, vocab, opt.max_tree, rng);
      std::vector<float> a, b;
      tuned.forward(t.batch, a);
      plain.forward(t.batch, b);
      ++steps;
      if (!same_bits(a, b)) ++differ;
      if (tuned.committed_len() != c || plain.committed_len() != c) ++moved;
    }
    char name[160], det[160];
    std::snprintf(name, sizeof name, "bands: at %d committed (band %d), tuned == untuned (bitwise)", c,
                  swiftspec::cuda::context_band(c));
    std::snprintf(det, sizeof det, "(%d of %d steps differ; %d trees moved committed_len)", differ, steps, moved);
    record(name, differ + moved, 0, differ == 0 && moved == 0, det);
  }
}

/// A tuned model (autotune_verify: every candidate of every band bitwise the default's, or
/// the model is not made) against an untuned one.
void check_band_tuning(const ModelConfig& cfg, uint64_t seed) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  CudaModelOptions tuned_opt, plain_opt;
  tuned_opt.autotune = true;
  tuned_opt.autotune_verify = true;
  plain_opt.autotune = false;
  auto tuned = tiny_model(cfg, tw, band_options(), tuned_opt);
  auto plain = tiny_model(cfg, tw, band_options(), plain_opt);
  const std::string log = tuned->debug_step_tuning();
  std::printf("step tuning per band (max_context %d):\n%s", kMaxContext, log.c_str());
  check_band_log(log);
  check_band_bits(*tuned, *plain, cfg.vocab_size, rng);
}

/// The references of the megakernel checks: the megakernel at every length, the layered step.
struct PathRefs {
  std::unique_ptr<CudaModel> megakernel, layered;
};

/// A decode step of `m` over `keys` keys (committed keys - 1) gives bitwise the megakernel's
/// logits (`want_megakernel`) or the layered step's.
void check_path_at(const std::string& what, CudaModel& m, PathRefs& refs, int keys, bool want_megakernel, int vocab,
                   Rng& rng) {
  const int c = keys - 1;
  const int tok = rng.below(vocab);
  const uint64_t seed = 700 + keys;
  const std::vector<float> got = decode_at(m, c, tok, seed);
  const std::vector<float> want = decode_at(want_megakernel ? *refs.megakernel : *refs.layered, c, tok, seed);
  const bool same = same_bits(got, want);
  char name[200];
  std::snprintf(name, sizeof name, "%s: a step over %d keys == the %s (bitwise)", what.c_str(), keys,
                want_megakernel ? "megakernel" : "layered step");
  record(name, same ? 0 : 1, 0, same);
}

/// The limit the log names ("megakernel_max_keys: N (measured...)") and whether the
/// comparison lines before it agree with it: one per band from band 1 up, in order, each
/// "-> megakernel" but possibly the last, and the limit the upper boundary of the last band
/// the megakernel kept (band 0's when it kept none). -1 when the log has no limit line.
int measured_limit(const std::string& log, bool* consistent) {
  const std::vector<std::string> lines = log_lines(log);
  int limit = -1, limits = 0, band = 0;
  bool lost = false, ok = true;
  for (const std::string& l : lines) {
    if (starts_with(l, "megakernel vs layered at ")) {
      ++band;
      const int keys = std::atoi(l.c_str() + std::strlen("megakernel vs layered at "));
      ok = ok && !lost && band < kContextBands && keys == kBandLengths[band];
      if (l.find("-> layered") != std::string::npos)
        lost = true;
      else if (l.find("-> megakernel") == std::string::npos)
        ok = false;
    } else if (starts_with(l, "megakernel_max_keys: ")) {
      limit = std::atoi(l.c_str() + std::strlen("megakernel_max_keys: "));
      ++limits;
    }
  }
  const int kept = lost ? band - 1 : band;  // bands past band 0 the megakernel kept
  // with max_context 40000 the megakernel is compared at bands 1..3 unless it loses one
  ok = ok && limits == 1 && (lost || band == kReachedBands - 1) && limit == band_upper(kept);
  *consistent = ok;
  return limit;
}

/// megakernel_max_keys -1 with autotune: measured and logged; decode steps take the
/// megakernel up to the limit and the layered step past it.
void check_measured_hand_over(const ModelConfig& cfg, TinyWeights& tw, PathRefs& refs, Rng& rng) {
  CudaModelOptions o;
  o.megakernel = true;
  auto m = tiny_model(cfg, tw, band_options(), o);
  const std::string log = m->debug_step_tuning();
  std::printf("megakernel hand-over (max_context %d):\n%s", kMaxContext, log.c_str());
  bool consistent = false;
  const int limit = measured_limit(log, &consistent);
  char det[120];
  std::snprintf(det, sizeof det, "(limit %d)", limit);
  record("megakernel hand-over: measured per band and logged", consistent ? 0 : 1, 0, consistent, det);
  if (limit < 0) return;
  check_path_at("megakernel hand-over measured", *m, refs, 1000, true, cfg.vocab_size, rng);
  if (limit > 0 && limit < kMaxContext) {
    check_path_at("megakernel hand-over measured", *m, refs, limit, true, cfg.vocab_size, rng);
    check_path_at("megakernel hand-over measured", *m, refs, limit + 1, false, cfg.vocab_size, rng);
  } else {
    check_path_at("megakernel hand-over measured", *m, refs, kMaxContext - 1000, true, cfg.vocab_size, rng);
  }
}

/// A limit not measured (an explicit megakernel_max_keys, or the default without autotune):
/// nothing timed or logged about it, and the limit holds.
void check_fixed_hand_over(const std::string& what, const ModelConfig& cfg, TinyWeights& tw, PathRefs& refs,
                           const CudaModelOptions& o, int limit, Rng& rng) {
  auto m = tiny_model(cfg, tw, band_options(), o);
  const std::string log = m->debug_step_tuning();
  const bool quiet =
      log.find("megakernel vs layered") == std::string::npos && log.find("megakernel_max_keys:") == std::string::npos;
  record(what + ": no hand-over measured", quiet ? 0 : 1, 0, quiet);
  check_path_at(what, *m, refs, limit, true, cfg.vocab_size, rng);
  check_path_at(what, *m, refs, limit + 1, false, cfg.vocab_size, rng);
}

void check_hand_over(const ModelConfig& cfg, uint64_t seed) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  CudaModelOptions every, layered;
  every.megakernel = true;
  every.megakernel_max_keys = 0;  // no limit
  every.autotune = false;
  layered.autotune = false;
  PathRefs refs{tiny_model(cfg, tw, band_options(), every), tiny_model(cfg, tw, band_options(), layered)};
  check_measured_hand_over(cfg, tw, refs, rng);
  CudaModelOptions explicit_limit;
  explicit_limit.megakernel = true;
  explicit_limit.megakernel_max_keys = 3000;
  check_fixed_hand_over("megakernel_max_keys 3000 (autotune)", cfg, tw, refs, explicit_limit, 3000, rng);
  CudaModelOptions untuned;
  untuned.megakernel = true;
  untuned.autotune = false;
  check_fixed_hand_over("megakernel_max_keys -1 without autotune", cfg, tw, refs, untuned, kMegakernelDefaultMaxKeys,
                        rng);
}

}  // namespace

void check_context_bands() {
  try {
    check_band_tuning(tiny_config("llama", 256, 512, 8, 2, 64, 1000, false, false, RopeStyle::NeoX, true), 600);
    check_hand_over(tiny_config("qwen2", 448, 1216, 7, 1, 64, 1536, true, true, RopeStyle::NeoX, false), 601);
  } catch (const std::exception& e) {
    record("context band checks (aborted)", NAN, 0.0, false, std::string("exception: ") + e.what());
  }
}

}  // namespace swiftspec::cuda_check
