"""The tests' FAKE OpenAI-compatible streaming server.

It lives in the package (``servematrix.stages.bench_fake``) because ``bench.measure_ceiling`` starts it on the
benchmark host, where only the installed package may exist. Run as a script, it is the same server::

    python tests/fakes/fake_openai_server.py --port 0 [--token-delay 0.001] [--usage separate_chunk]
"""

from servematrix.stages.bench_fake import (
    USAGE_MODES,
    FakeBehavior,
    FakeOpenAIServer,
    RequestLog,
    main,
    request_index,
)

__all__ = ["USAGE_MODES", "FakeBehavior", "FakeOpenAIServer", "RequestLog", "main", "request_index"]

if __name__ == "__main__":
    main()
