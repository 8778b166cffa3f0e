"""swiftspec: low-latency single-request LLM inference.

Speculative decoding with a small draft and a large target model, on a C++
runtime (CPU and CUDA backends) driven from Python.

    import swiftspec
    engine = swiftspec.Engine.from_pretrained()          # the reference Qwen2.5-Coder pair
    out = engine.generate([{"role": "user", "content": "Write quicksort in Python."}],
                          max_new_tokens=128)
    print(out.text)

Submodules are imported lazily so that tooling (``swiftspec.fetch``,
``swiftspec.convert``) works without the compiled extension.
"""

from swiftspec.errors import CheckpointError, FetchError, InvalidRequestError, SwiftspecError

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "GenerationResult",
    "CheckpointError",
    "FetchError",
    "InvalidRequestError",
    "SwiftspecError",
]


def __getattr__(name):
    if name in ("Engine", "GenerationResult"):
        from swiftspec import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'swiftspec' has no attribute {name!r}")
