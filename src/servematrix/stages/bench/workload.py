"""What a benchmark sends: the workload of one profile, its prompts and request bodies."""

import dataclasses
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The streaming APIs the bench speaks: OpenAI's chat and completions, and "generate", SGLang's native
# `/generate` (what sglang's own bench_serving uses; an engine's data says which it serves: `bench_apis`).
APIS = ("chat", "completions", "generate")
_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}
# The bench's profiles, by the phase of serving each one loads. A mode is compared with the baseline on the
# figures of the phase it changes (engine data: `phases`): prefill on TTFT and input tok/s, decode on output
# tok/s. The decode profile's report is the stored record itself (as before profiles existed); another
# profile's report is stored inside it, under the profile's name.
PROFILES = ("decode", "prefill")
NESTED_PROFILES = ("prefill",)

# Common English words that are single tokens (with their leading space) in typical BPE vocabularies, so a
# prompt of N words is roughly N tokens. The server's usage.prompt_tokens reports the real count.
_PROMPT_TEXT = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work number night point home water "
    "room mother area money story fact month right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city name team minute idea body "
    "back parent face level office door health person art war history party result change morning reason "
    "girl moment air teacher force education foot boy age policy music market sense plan college interest "
    "death experience effect class control care field role effort rate heart show leader light voice wife "
    "mind price report son view town road arm value building action model season society tax player record "
    "paper space ground form event matter center couple site project star table need court oil cost street "
    "image phone data picture piece land product doctor wall worker news test movie north love support tree "
    "source river sea fish boat bread stone cloud wind gold map dog good new first last long great little "
    "own other old big high small large next early young few public bad same able late hard major better "
    "strong free true full special easy clear certain open red short single past fine common poor hot cold "
    "happy simple left blue dark green nice quick slow warm"
)
_PROMPT_WORDS = tuple(_PROMPT_TEXT.split())


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What to send. Per concurrency level ``c``: ``warmup`` uncounted requests (at most ``c`` in flight),
    then ``repeats`` times N measured requests with at most ``c`` in flight.

    N is ``prompts_per_concurrency`` (the floor in requests: an absolute number per level and repeat, not a
    multiplier; use at least ``c`` of them, or the level never reaches ``c`` streams in flight), raised when
    ``min_level_s`` > 0 so that each repeat lasts at least that long at the throughput measured in the warmup,
    up to ``max_level_requests``.

    ``ignore_eos`` sends sglang/vLLM's ``ignore_eos`` extra field. It is opt-in: ``transformers serve``
    validates request fields and answers 422 ``Unexpected fields in the request: {'ignore_eos'}``.

    ``client_processes`` worker processes share the streams of each level; ``client_cpus`` pins them (see
    :func:`split_cpus`).
    """

    concurrency: tuple[int, ...]
    input_len: int
    output_len: int
    prompts_per_concurrency: int
    warmup: int
    repeats: int
    temperature: float = 0.0
    api: str = "chat"
    timeout_s: float = 300.0
    ignore_eos: bool = False
    min_level_s: float = 0.0
    max_level_requests: int = 100_000
    client_processes: int = 1
    client_cpus: tuple[int, ...] = ()
    profile: str = "decode"
    # Warm-up until stable (`run.py`): a level whose repeats drift by more than drift_bound (first half against
    # second half) discards its oldest repeat as warm-up and runs one more, at most max_warmup_repeats times
    # (0 here: exactly `repeats`; a matrix's [bench] sets 3 by default).
    drift_bound: float = 0.10
    max_warmup_repeats: int = 0

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency must be a non-empty tuple of ints >= 1, got {self.concurrency!r}")
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {PROFILES}, got {self.profile!r}")
        if self.api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {self.api!r}")
        for name in ("input_len", "output_len", "prompts_per_concurrency", "repeats", "client_processes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.warmup < 0 or self.timeout_s <= 0 or self.temperature < 0 or self.min_level_s < 0:
            raise ValueError("warmup must be >= 0, timeout_s > 0, temperature >= 0, min_level_s >= 0")
        if self.max_level_requests < self.prompts_per_concurrency:
            raise ValueError("max_level_requests must be >= prompts_per_concurrency")
        if any(c < 0 for c in self.client_cpus):
            raise ValueError(f"client_cpus must be CPU numbers >= 0, got {self.client_cpus!r}")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], **given: Any) -> "Workload":
        """A workload from a matrix's validated `[bench]` table: every field of the same name, plus `given`
        (what the engine or the host decides: ignore_eos, client_cpus)."""
        names = {f.name for f in dataclasses.fields(cls)} - set(given)
        values = {name: value for name, value in settings.items() if name in names}
        values["concurrency"] = tuple(values["concurrency"])
        return cls(**values, **given)


def make_prompt(index: int, input_len: int) -> str:
    """A deterministic synthetic prompt of roughly ``input_len`` tokens, distinct per ``index``.

    The distinct part comes first, so no two prompts share a prefix beyond the chat template (no prefix-cache
    hits between requests).
    """
    rng = random.Random(index * 1_000_003 + input_len)
    head = f"Request {index}:"
    n_words = max(1, input_len - 4)
    return head + " " + " ".join(rng.choice(_PROMPT_WORDS) for _ in range(n_words))


def request_body(
    model: str, prompt: str, *, api: str, max_tokens: int, temperature: float, ignore_eos: bool = False
) -> dict[str, Any]:
    if api == "generate":
        # sglang's GenerateReqInput: sampling in `sampling_params`, the model is the server's own (no field);
        # streamed as cumulative `text` with `meta_info.completion_tokens` (sglang 0.5.12
        # srt/entrypoints/http_server.py generate_request, srt/managers/tokenizer_manager.py meta_info).
        sampling: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": temperature}
        if ignore_eos:
            sampling["ignore_eos"] = True
        return {"text": prompt, "sampling_params": sampling, "stream": True}
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def endpoint(base_url: str, api: str) -> str:
    return base_url.rstrip("/") + _PATHS[api]


class Prompts:
    """Request bodies (JSON bytes) with prompts numbered across the whole run: no two requests share one."""

    def __init__(self, model: str, workload: Workload) -> None:
        self.model, self.workload, self.index = model, workload, 0

    def take(self, n: int) -> list[bytes]:
        w = self.workload
        out = []
        for i in range(self.index, self.index + n):
            body = request_body(
                self.model,
                make_prompt(i, w.input_len),
                api=w.api,
                max_tokens=w.output_len,
                temperature=w.temperature,
                ignore_eos=w.ignore_eos,
            )
            out.append(json.dumps(body).encode())
        self.index += n
        return out
