"""The Hugging Face transformers peers: target-only ``generate`` and assisted generation
(``generate(assistant_model=draft)``), greedy or sampled, on exactly the prompt ids swiftspec
decodes.

The models are loaded from the same converted checkpoint folders swiftspec runs (they are
HF-loadable: config.json + model.safetensors), in the same dtype, so both engines see the same
weights. The prompt is passed as token ids (our chat template rendering), and generation stops
at the same EOS ids and ``max_new_tokens``, so outputs are comparable token for token.

Timing comes from a streamer: transformers calls ``put`` once with the prompt, then with the
tokens of every step (one token for plain decoding; the accepted tokens plus the bonus token
for assisted generation), so the timestamps give TTFT, decode time and the number of target
verification steps with the same definitions as swiftspec (see :mod:`swiftspec.bench.schema`).
Assisted generation keeps transformers' own defaults for the draft length schedule (what a user
gets by passing ``assistant_model``); they are recorded in the result's settings.

Sampled decoding (a run's ``sampling`` settings): ``do_sample=True`` with the same temperature,
top_p and top_k as swiftspec (top_k 0 is passed as 0, which transformers reads as "no top-k
filter"; None would let the model's generation_config or transformers' default of 50 apply), and
``torch.manual_seed(seed)`` with the request's seed before each generate. transformers applies
temperature, then top-k, then top-p, as swiftspec's sampler does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from swiftspec.errors import SwiftspecError


class PeerUnavailableError(SwiftspecError, RuntimeError):
    """The HF peer cannot run here (transformers, torch or accelerate missing, or loading failed)."""


@dataclass
class PeerResult:
    """One HF request. Times in seconds; ``emissions`` are the token counts of each streamer
    ``put`` after the prompt (the first one is the first emission)."""

    token_ids: list[int]
    ttft_s: float
    decode_s: float
    wall_s: float
    emissions: list[int] = field(default_factory=list)

    @property
    def counted_tokens(self) -> int:
        return sum(self.emissions)


def _timing_streamer(t0: float):
    """A transformers streamer that records when, and how many, tokens are emitted."""
    from transformers.generation.streamers import BaseStreamer

    class TimingStreamer(BaseStreamer):
        def __init__(self):
            self.t0 = t0
            self.prompt_seen = False
            self.times: list[float] = []
            self.counts: list[int] = []

        def put(self, value) -> None:
            now = time.perf_counter()
            if not self.prompt_seen:  # the first put is the prompt
                self.prompt_seen = True
                return
            n = int(value.numel())
            if n:
                self.times.append(now)
                self.counts.append(n)

        def end(self) -> None:
            pass

    return TimingStreamer()


_DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}


class HFPeer:
    """HF transformers target model (and optional assistant), on the CPU or a CUDA GPU.

    Args:
        target_dir: an HF-loadable folder (our checkpoint folders are).
        draft_dir: the assistant model's folder, or None (then only ``hf:target`` runs).
        dtype: "bfloat16" or "float32" (torch dtype of the loaded weights).
        threads: torch intra-op threads during generate (0: torch's current setting); the
            process-wide setting is restored after each request.
        device: "cpu" or "cuda" (the first visible GPU).
        sampling: None (greedy), or ``{"temperature", "top_p", "top_k", "seed"}`` (the run's
            settings; each request's seed is passed to :meth:`generate`).

    Raises:
        PeerUnavailableError: a package is missing or a model cannot be loaded (names it).
    """

    def __init__(
        self,
        target_dir: str | Path,
        draft_dir: str | Path | None,
        dtype: str = "bfloat16",
        threads: int = 0,
        device: str = "cpu",
        sampling: dict | None = None,
    ):
        try:
            import torch
            import transformers
            from transformers import AutoModelForCausalLM
        except ImportError as exc:
            raise PeerUnavailableError(f"the HF peer needs torch and transformers: {exc}") from None
        if dtype not in _DTYPES:
            raise PeerUnavailableError(f"HF peer dtype must be bfloat16 or float32, got {dtype!r}")
        self.torch = torch
        if device == "cuda" and not torch.cuda.is_available():
            raise PeerUnavailableError("the HF peer on cuda needs a CUDA build of torch and a visible GPU")
        if device not in ("cpu", "cuda"):
            raise PeerUnavailableError(f"HF peer device must be cpu or cuda, got {device!r}")
        self.device = device
        torch_dtype = getattr(torch, _DTYPES[dtype])
        self.dtype = dtype

        def load(folder):
            try:
                model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
            except Exception as exc:  # transformers raises many kinds; name the folder
                raise PeerUnavailableError(f"HF transformers could not load {folder}: {exc}") from None
            return model.to(device).eval()

        self.target = load(target_dir)
        self.draft = load(draft_dir) if draft_dir is not None else None
        self.versions = {"transformers": transformers.__version__, "torch": torch.__version__}
        # Applied around each generate() and restored after: torch's thread count is process-wide.
        self.threads = threads if threads > 0 else torch.get_num_threads()
        self.sampling = dict(sampling) if sampling else None

    def settings(self) -> dict:
        """What the result file records about the peer."""
        gc = self.target.generation_config
        assist = {}
        if self.draft is not None:
            # Unset fields take transformers' defaults at generate() time; record those values.
            try:
                defaults = type(gc)._get_default_generation_params()
            except AttributeError:
                defaults = {}
            dgc = self.draft.generation_config
            for key in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
                value = getattr(dgc, key, None)
                assist[key] = value if value is not None else defaults.get(key)
        gpu = self.torch.cuda.get_device_name(0) if self.device == "cuda" else None
        sampling = None
        if self.sampling:
            sampling = {k: v for k, v in self._sampling_kwargs().items() if k != "do_sample"}
            sampling = {
                **sampling,
                "seed": f"torch.manual_seed({self.sampling['seed']} + prompt index) before each generate",
            }
        return {
            "dtype": self.dtype,
            "device": self.device,
            "gpu": gpu,
            "torch_threads": self.threads,
            **self.versions,
            "do_sample": self.sampling is not None,
            "sampling": sampling,
            "cache_implementation": getattr(gc, "cache_implementation", None),
            "assisted": assist or None,
        }

    def _sampling_kwargs(self) -> dict:
        """generate()'s decoding arguments: greedy, or sampling as swiftspec samples."""
        if not self.sampling:
            return dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        s = self.sampling
        # top_k 0 (swiftspec: off) stays 0: transformers adds no top-k filter for 0, while None would
        # take the model's generation_config value or transformers' default (50).
        return dict(do_sample=True, temperature=float(s["temperature"]), top_p=float(s["top_p"]), top_k=int(s["top_k"]))

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: list[int], assisted: bool, seed: int = 0
    ) -> PeerResult:
        """Generation of at most ``max_new_tokens`` tokens after ``prompt_ids``, stopping after an
        EOS id (included in the output, as swiftspec does): greedy, or sampled (the peer's
        ``sampling``) after ``torch.manual_seed(seed)``.

        Raises:
            PeerUnavailableError: ``assisted`` without a draft model.
        """
        torch = self.torch
        if assisted and self.draft is None:
            raise PeerUnavailableError("hf:assisted needs a draft model")
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        kwargs = dict(
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            **self._sampling_kwargs(),
            eos_token_id=list(eos_token_ids),
            pad_token_id=eos_token_ids[0],
        )
        if assisted:
            kwargs["assistant_model"] = self.draft
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            if self.sampling:
                torch.manual_seed(seed)  # all devices' generators
            t0 = time.perf_counter()
            streamer = _timing_streamer(t0)
            with torch.inference_mode():
                out = self.target.generate(input_ids, streamer=streamer, **kwargs)
            if self.device == "cuda":
                torch.cuda.synchronize()
            t_end = time.perf_counter()
        finally:
            torch.set_num_threads(previous)
        new = out[0, len(prompt_ids) :].cpu().tolist()
        # transformers pads nothing for batch 1, but be safe: cut after the first EOS.
        for i, t in enumerate(new):
            if t in eos_token_ids:
                new = new[: i + 1]
                break
        if not streamer.times:
            raise PeerUnavailableError("HF generate emitted no tokens")
        return PeerResult(
            token_ids=new,
            ttft_s=streamer.times[0] - t0,
            decode_s=streamer.times[-1] - streamer.times[0],
            wall_s=t_end - t0,
            emissions=list(streamer.counts),
        )
