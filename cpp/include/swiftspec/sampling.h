// Token sampling: greedy, temperature, top-k and top-p (nucleus), seeded.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "swiftspec/top_k_logits.h"

namespace swiftspec {

struct SamplingParams {
  float temperature = 0.0f;  ///< 0: greedy (argmax); > 0: sample from softmax(logits / temperature)
  int top_k = 0;             ///< keep the k most likely tokens (0: all)
  float top_p = 1.0f;        ///< keep the smallest set whose probability reaches top_p, in (0, 1]
  uint64_t seed = 0;         ///< random seed of the request

  bool greedy() const { return temperature == 0.0f; }
  /// Throws InvalidArgument naming the field and value: SamplingRequest::params's rule, but for
  /// the bounds of a request's values (a denormal temperature is valid here: the best token alone).
  void validate() const;
};

/// A sampling parameter as a caller gives it, before it becomes a SamplingParams field: the Python
/// binding makes one of each Python value (after Python converted numpy numbers to int or float).
struct GivenNumber {
  enum class Kind {
    Real,     ///< a number with a fraction (a float)
    Integer,  ///< a whole number, of any size
    Other,    ///< not a number (a string, a bool, None, ...)
  };
  Kind kind = Kind::Real;
  double value = 0;               ///< Real, Integer: the value (an Integer's rounded to a double)
  std::optional<uint64_t> exact;  ///< Integer in [0, 2**64): the value exactly
  std::string shown;              ///< the value as messages show it, as the caller writes it ("0.5", "'hot'")

  /// A float, shown as the shortest text that reads back as it (show_number).
  static GivenNumber real(double value);
  static GivenNumber real(double value, std::string shown);
  static GivenNumber integer(int64_t value);
  static GivenNumber integer(uint64_t value);
};

/// How messages name the sampling parameters: the Python keywords, unless a caller names them as
/// its user wrote them ("--top-p" on a command line, "swiftspec.top_k" in the HTTP API).
struct SamplingNames {
  std::string temperature = "temperature", top_p = "top_p", top_k = "top_k", seed = "seed";
};

/// The sampling parameters of a request as its caller gave them, and the one check of their
/// ranges for every caller (Engine::generate's binding, swiftspec.Engine.generate, swiftspec
/// generate, swiftspec bench, swiftspec serve through swiftspec_core.check_sampling).
struct SamplingRequest {
  GivenNumber temperature = GivenNumber::real(0.0), top_p = GivenNumber::real(1.0);
  GivenNumber top_k = GivenNumber::integer(int64_t{0}), seed = GivenNumber::integer(int64_t{0});
  SamplingNames names;
  /// Messages state each parameter's whole domain and its "off" value ("top_p must be a number in
  /// (0, 1] (1: off), got 0.0"), as swiftspec bench words them; false: the type first, then the
  /// range ("top_p must be in (0, 1], got 1.5").
  bool explain = false;
  /// The request samples with seeds seed .. seed + seeds - 1 (swiftspec bench: one per prompt),
  /// each of which must fit in 64 bits (>= 1).
  uint64_t seeds = 1;
  std::string seed_note;  ///< why, in the seed's range message ("request i of a data set samples with seed + i")

  /// The parameters as the runtime samples with them: temperature a number >= 0, finite, at most
  /// float32's largest and not below its smallest normal number (but 0: the runtime samples in
  /// float32, where a smaller one is 0 or a denormal whose logits / T overflow); top_p a number
  /// in (0, 1] (below float32's smallest normal number it becomes that number: the same nucleus,
  /// the most likely token alone); top_k an integer in [0, 2**31 - 1]; seed an integer >= 0
  /// with seed + seeds - 1 within 64 bits. What a value means at temperature 0 (nothing) is
  /// refuse_unused_under_greedy's. Throws InvalidArgument, one line naming the parameter (as
  /// `names` spells it) and the value given.
  SamplingParams params() const;

  /// Refuses top_p / top_k / seed set under greedy decoding (temperature 0), where they have no
  /// effect: `given` names the ones the caller set ("top_p", "top_k", "seed"; others ignored).
  /// Throws InvalidArgument naming each: "top_p=0.9 has no effect under greedy decoding
  /// (temperature 0); give temperature > 0 to sample, or drop it" ("--top-p 0.9 ..." for names
  /// that are flags). Nothing when the temperature is not 0 or none was given.
  void refuse_unused_under_greedy(const std::vector<std::string>& given) const;
};

/// Index of the largest logit; ties go to the smallest index. Throws Error
/// (not InvalidArgument: the request is not at fault) if a logit is NaN, which
/// every decode path (greedy, sampling, verification) goes through.
int argmax(const float* logits, int vocab);

/// The distribution sampling draws from: softmax(logits / T) restricted to
/// top-k then top-p and renormalised. fp32 [vocab] into `probs`. For greedy
/// params, a one-hot vector on argmax.
void sampling_distribution(const float* logits, int vocab, const SamplingParams& params, std::vector<float>& probs);

/// A seeded random source with a platform-independent uniform draw.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  /// Uniform double in [0, 1).
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  /// Draws an index from the (not necessarily normalised) weights `p`: categorical_at(p, n, uniform()).
  int categorical(const float* p, int n);

 private:
  std::mt19937_64 gen_;
};

/// The index Rng::categorical draws for the uniform u in [0, 1): the first i (in index order,
/// skipping zero weights) whose cumulative weight exceeds u * sum(p); the last nonzero one when
/// rounding leaves u at the very top.
int categorical_at(const float* p, int n, double u);

/// Draws one token from logits under `params` (argmax when greedy).
int sample_token(const float* logits, int vocab, const SamplingParams& params, Rng& rng, std::vector<float>& scratch);

/// Draws one token under non-greedy `params` with top_k >= 1 from a row's k = min(top_k, vocab)
/// best logits alone (`ids`, `top_logits` [k]: largest first, ties to the smaller id, as
/// Model::forward_top_k returns them): the distribution of sampling_distribution, since top-k's
/// renormalisation cancels the normaliser of the whole vocabulary (softmax(x / T) over the k,
/// then top-p in rank order, renormalised; weights in double). One rng draw, in rank order.
/// What lets a sampled step skip the [vocab] logits row. Throws InvalidArgument for k < 1, greedy
/// params, k > params.top_k (or top_k 0), a negative id, NaN or increasing top_logits; Error
/// when top_logits[0] is +-inf.
int sample_from_top_k(const int32_t* ids, const float* top_logits, int k, const SamplingParams& params, Rng& rng);

/// The k that sampled decoding without top-k reads of each row (Model::forward_top_k, then
/// sample_from_head): the most the CUDA backend selects on the GPU (kTopKMax). On sampled
/// trajectories of the 0.5B model (MT-Bench prompts, tools/bench_sampling.py) the whole row was
/// read on almost no steps at T = 0.7 with top_p, and on a few percent at T = 1 alone
/// (benchmarks/README.md, "how often real trajectories read the row").
constexpr int kSampleHeadK = 64;

/// Fills `row` with the whole fp32 [vocab] logits row (sample_from_head's fallback; e.g.
/// Model::read_logits_row of the step that produced the head).
using LogitsRowReader = std::function<void(std::vector<float>& row)>;

/// Draws one token under non-greedy `params` without top-k (top_k 0 or >= vocab) from a row's
/// head: its k best logits (`ids`, `top_logits` [k], largest first, ties to the smaller id, as
/// Model::forward_top_k returns them) and `log_normalizer` = ln sum_v exp(logit_v / T) of the
/// whole row at the request's temperature (forward_top_k with inv_temperature = 1 / T). Reads
/// the whole row through `read_row` only when the head does not determine the draw. The draw is
/// a function of the one uniform `u` in [0, 1), always from the exact distribution of
/// sampling_distribution:
/// - top_p < 1: with q_j = exp(v_j / T - log_normalizer), if q_0 + ... + q_{m-1} reaches top_p
///   (of the row's mass 1) for some m <= k, the nucleus is those m tokens: the token at u over
///   their weights, in rank order. Otherwise (or when a cumulative mass lies within 1e-6 of
///   top_p, where float rounding could move the cut) the whole row: categorical_at(
///   sampling_distribution(row), u).
/// - top_p == 1 (temperature alone): the token whose interval holds u, the intervals (each a
///   token's softmax(logits / T) mass) laid out with the k best first in rank order, then every
///   other token in id order. The head settles u < C_k = q_0 + ... + q_{k-1}; u in the tail
///   (u >= C_k: probability 1 - C_k) or within 1e-8 of an interval's end (rounding; also C_k
///   above 1) reads the whole row and walks the same intervals with weights in double from it,
///   so a tail draw is from the tail renormalised (u rescaled (u - C_k) / (1 - C_k), in effect).
/// `*read_whole_row` (when given) tells whether the row was read. A non-finite largest logit or
/// normaliser always reads the row (whatever sampling_distribution makes of it). Throws
/// InvalidArgument for k outside [1, vocab], greedy params, top_k in [1, vocab), an id outside
/// [0, vocab), NaN or increasing top_logits, a log_normalizer below top_logits[0] / T (not the
/// row's at this temperature), u outside [0, 1), a row of another size than vocab; what
/// sampling_distribution throws for the row (NaN logits: Error).
int sample_from_head(const int32_t* ids, const float* top_logits, int k, double log_normalizer, int vocab,
                     const SamplingParams& params, double u, const LogitsRowReader& read_row,
                     bool* read_whole_row = nullptr);

/// sample_from_head of row `row` of `top` (Model::forward_top_k's output with the log-normalizer
/// at top.inv_temperature, which must be 1 / params.temperature: InvalidArgument otherwise, or
/// when it holds no log-normalizer or no row `row`), with u = rng.uniform() (one draw).
int sample_from_head(const TopKLogits& top, int row, int vocab, const SamplingParams& params, Rng& rng,
                     const LogitsRowReader& read_row, bool* read_whole_row = nullptr);

// ---------------------------------------------------------------------------------------------
// The children of a node under top-k tree growth of a stochastic request (DraftTree, TreeGrowth::
// TopK): the `count` most likely tokens of the request's sampling distribution q, each with its
// probability q(t). A tree without draws is then verified by target sampling (SpecInfer's naive
// sampling: Miao et al., "SpecInfer", ASPLOS 2024, §4; verify_by_target_sampling in
// verification.h), which is lossless for any choice of children, so the children only have to be
// likely; q(t) only ranks the nodes (cumulative log q: best-first growth, subtree selection).

/// The host reference, from the whole fp32 [vocab] logits row: q = sampling_distribution(logits,
/// params) (softmax at T, then top-k, then top-p, renormalised; greedy: one-hot), then
/// top_k_indices(q, vocab, count) (largest q first, ties to the smaller id), keeping only tokens
/// with q > 0. `tokens` [<= count] int32 ids and `probs` [same] fp32 q of each. What top-k growth
/// of a stochastic request computed for every drafted node before the head path below.
void top_sampling_tokens(const float* logits, int vocab, const SamplingParams& params, int count,
                         std::vector<int32_t>& tokens, std::vector<float>& probs);

/// top_sampling_tokens from a row's head alone: its k best logits (`ids`, `top_logits` [k],
/// largest first, ties to the smaller id, as Model::forward_top_k returns them) and
/// `log_normalizer` = ln sum_v exp(logit_v / T) of the whole row at the request's temperature
/// (forward_top_k with inv_temperature = 1 / T). Returns true with `tokens` / `probs` bit-identical
/// to top_sampling_tokens of the whole row, or false (both cleared) when the head does not
/// determine them: it never guesses. With p_j = fp32(fp32(exp((v_j - v_0) / T)) / Z_T), the
/// untruncated probability rounded as sampling_distribution rounds it (Z_T = exp(log_normalizer -
/// v_0 / T)): top-k keeps the head's first top_k, top-p's nucleus is the head's first m (their p
/// summed in rank order reaches top_p of the kept mass), q = p renormalised over the nucleus, and
/// the children are the nucleus's first `count` by q (ties to the smaller id). Returns false when
/// - a set boundary it needs (the top_k-th token, the nucleus's last, the count-th child) is the
///   head's last entry or beyond (k < vocab), or the probabilities on its two sides are not
///   strictly apart (a token outside the head could tie and win by its smaller id);
/// - the nucleus's cumulative mass comes within 1e-6 (of the kept mass) of its cut, as in
///   sample_from_head;
/// - a probability it returns or sums might round differently from the host's: its quotient lies
///   within the normaliser's error (4e-12 x |log_normalizer|, relative: Model::forward_top_k's is
///   below 1e-12) of a float rounding boundary — about 1 value in 500 at |ln Z| ~ 30;
/// - the order of two such probabilities is not the host's (a tie with the larger id first, which a
///   monotone rounding never makes), or a child's probability is 0.
/// On real rows of the 0.5B draft at T 0.7 / top-p 0.8 it decides nearly all of them
/// (tests/test_sampling.py, test_top_sampling_tokens_from_the_head_equal_the_host_path's counts).
/// Throws InvalidArgument for k outside [1, vocab], greedy params, count < 0, an id outside
/// [0, vocab), a repeated id, NaN or increasing top_logits, a log_normalizer below
/// top_logits[0] / T (not the row's at this temperature).
bool top_sampling_tokens_from_head(const int32_t* ids, const float* top_logits, int k, double log_normalizer, int vocab,
                                   const SamplingParams& params, int count, std::vector<int32_t>& tokens,
                                   std::vector<float>& probs);

/// top_sampling_tokens of row `row` of `top` (Model::forward_top_k's output with the log-normalizer
/// at top.inv_temperature == 1 / params.temperature: InvalidArgument otherwise, or when it holds no
/// log-normalizer or no row `row`): from the head when it decides, else from the whole row read
/// through `read_row` (`*read_whole_row` tells which). Always bit-identical to top_sampling_tokens
/// of the whole row. Throws what the two functions above throw (InvalidArgument for a row of
/// another size than vocab).
void top_sampling_tokens_from_head(const TopKLogits& top, int row, int vocab, const SamplingParams& params, int count,
                                   const LogitsRowReader& read_row, std::vector<int32_t>& tokens,
                                   std::vector<float>& probs, bool* read_whole_row = nullptr);

}  // namespace swiftspec
