// Token sampling: greedy, temperature, top-k and top-p (nucleus), seeded.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace swiftspec {

struct SamplingParams {
  float temperature = 0.0f;  ///< 0: greedy (argmax); > 0: sample from softmax(logits / temperature)
  int top_k = 0;             ///< keep the k most likely tokens (0: all)
  float top_p = 1.0f;        ///< keep the smallest set whose probability reaches top_p, in (0, 1]
  uint64_t seed = 0;         ///< random seed of the request

  bool greedy() const { return temperature == 0.0f; }
  /// Throws InvalidArgument naming the field and value (negative or NaN
  /// temperature, top_k < 0, top_p outside (0, 1]).
  void validate() const;
};

/// Index of the largest logit; ties go to the smallest index. Throws Error
/// (not InvalidArgument: the request is not at fault) if a logit is NaN, which
/// every decode path (greedy, sampling, verification) goes through.
int argmax(const float* logits, int vocab);

/// The distribution sampling draws from: softmax(logits / T) restricted to
/// top-k then top-p and renormalised. fp32 [vocab] into `probs`. For greedy
/// params, a one-hot vector on argmax.
void sampling_distribution(const float* logits, int vocab, const SamplingParams& params,
                           std::vector<float>& probs);

/// A seeded random source with a platform-independent uniform draw.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  /// Uniform double in [0, 1).
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  /// Draws an index from the (not necessarily normalised) weights `p`.
  int categorical(const float* p, int n);

 private:
  std::mt19937_64 gen_;
};

/// Draws one token from logits under `params` (argmax when greedy).
int sample_token(const float* logits, int vocab, const SamplingParams& params, Rng& rng,
                 std::vector<float>& scratch);

/// Draws one token under non-greedy `params` with top_k >= 1 from a row's k = min(top_k, vocab)
/// best logits alone (`ids`, `top_logits` [k]: largest first, ties to the smaller id, as
/// Model::forward_top_k returns them): the distribution of sampling_distribution, since top-k's
/// renormalisation cancels the normaliser of the whole vocabulary (softmax(x / T) over the k,
/// then top-p in rank order, renormalised; weights in double). One rng draw, in rank order.
/// What lets a sampled step skip the [vocab] logits row. Throws InvalidArgument for k < 1, greedy
/// params, k > params.top_k (or top_k 0), a negative id, NaN or increasing top_logits; Error
/// when top_logits[0] is +-inf.
int sample_from_top_k(const int32_t* ids, const float* top_logits, int k, const SamplingParams& params, Rng& rng);

}  // namespace swiftspec
