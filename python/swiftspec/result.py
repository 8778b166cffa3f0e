"""The outcome of one request: :class:`GenerationResult`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationResult:
    """The outcome of one request.

    Attributes:
        text: the generated text (special tokens and any stop string removed).
        token_ids: the generated token ids (prompt excluded; an EOS token that
            ended generation is included).
        prompt_token_ids: the token ids the model was prompted with.
        finish_reason: "length" (max_new_tokens), "stop" (EOS or a stop
            string) or "cancelled".
        ttft_s: time to first token, seconds (prefill + first sample).
        decode_s: seconds from the first to the last new token.
        tokens_per_s: new tokens after the first, divided by decode_s.
        tpot_s: time per output token after the first, seconds.
        stats: the runtime's counters (verification_steps, draft_steps,
            acceptance_length, target_time, draft_time, wall_time, ...).
        timeline: async mode only: the per-round timeline of the draft and
            target groups (``swiftspec_core.Timeline``: ``summary()``,
            ``save_chrome_trace(path)``); None otherwise.
        report: the speculation report of async and auto modes (growth, verification,
            accepted_per_step, ...; auto mode also budget_per_round, 0 for a target-only round,
            round_reasons and caught_up_tokens: cpp/include/swiftspec/speculative.h
            SpeculationReport); None otherwise.
    """

    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    ttft_s: float
    decode_s: float
    stats: dict = field(default_factory=dict)
    timeline: object = None
    report: dict | None = None

    @property
    def tokens_per_s(self) -> float:
        n = len(self.token_ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def tpot_s(self) -> float:
        n = len(self.token_ids) - 1
        return self.decode_s / n if n > 0 else 0.0

    @property
    def acceptance_length(self) -> float:
        return float(self.stats.get("acceptance_length", 0.0))


def describe_auto_rounds(report: dict | None) -> str:
    """One line on what the auto mode chose: rounds per tree budget (0: target-only) and per
    reason, e.g. "auto: 40 rounds target-only, 12 speculative (budget 4: 9, 16: 3); reasons best 45,
    probe 6, measure 2". Empty when ``report`` is not an auto-mode report."""
    if not report or "budget_per_round" not in report:
        return ""
    budgets = list(report["budget_per_round"])
    spec = sorted({b for b in budgets if b > 0})
    per_budget = ", ".join(f"{b}: {budgets.count(b)}" for b in spec)
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(report.get("round_reasons", {}).items(), key=lambda kv: -kv[1]))
    return (
        f"auto: {budgets.count(0)} rounds target-only, {len(budgets) - budgets.count(0)} speculative"
        + (f" (budget {per_budget})" if per_budget else "")
        + (f"; reasons {reasons}" if reasons else "")
    )
