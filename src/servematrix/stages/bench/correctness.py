"""Are a mode's answers right? Its greedy answers against the baseline's, before any figure is published.

A graph mode can serve wrong tokens and still start, answer and be timed (sglang #17839, #13469; vLLM #27057;
TensorRT-LLM #12949). So every mode's server gets a fixed, built-in prompt set (`PROMPTS`, no download),
greedily (temperature 0, ``max_tokens`` fixed, ``ignore_eos`` where the engine knows it), once at one stream
and once with every prompt in flight together (a batch: different batch sizes take different graphs), asking
for the top-k logprobs where the API gives them:

* sglang's ``/generate``: ``return_logprob``, ``top_logprobs_num``, ``return_text_in_logprobs``; tokens are ids;
* OpenAI completions: ``logprobs: k``; chat: ``logprobs: true, top_logprobs: k``; tokens are strings.

The baseline mode's answers are stored in its row's metrics (``correctness``), keyed by the environment, the
model and the prompt set (`CorrectnessKey`), so a mode can be checked against them in another run or on another
runner of the same kind.

The rule is vLLM's ``check_logprobs_close`` (tests/models/utils.py): position by position, the two tokens are
equal up to the first divergence; at every position up to and including it, each side's token must be in the
other side's top-k. Otherwise the mode is ``fail:wrong-output``, with the prompt, the position, both tokens and
their logprobs. Two answers that agree to the shorter one's end but differ in length fail too (a mode that stops
early is not the same answer). Where the API gives no logprobs (``transformers serve`` 5.24 accepts the fields
and returns none), the rule falls back to greedy text equality, and the result says so.

For real weights there is also an accuracy probe (`arithmetic_prompts`, `score_arithmetic`): exact match on
generated multi-digit additions, against a floor the matrix sets. On random weights it measures nothing (every
mode scores about 0): the matrices here serve random weights, so the probe is off in them.
"""

from __future__ import annotations

import concurrent.futures
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from servematrix.stages.bench.workload import APIS, endpoint

PROMPT_SET = "greedy-v1"
# Built in and deterministic: plain text with some structure (lists, counting, code, prose), so a real model's
# greedy answer is stable and a random model's is still a fixed function of its weights.
PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "List the first five prime numbers: 2, 3,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a village by the river, there lived a miller who",
    "Translate to French: 'The cat sleeps on the warm stone.' ->",
    "Q: What is 12 times 12?\nA:",
    "Monday, Tuesday, Wednesday, Thursday,",
    "The three states of water are solid, liquid and",
)
MAX_TOKENS = 16
TOP_K = 5


@dataclass(frozen=True, kw_only=True)
class CorrectnessKey:
    """What a stored baseline answers: the environment (its id holds the versions and GPU kind), the model, the
    prompt set and how it was asked."""

    env_id: str
    model: str
    prompt_set: str = PROMPT_SET
    api: str = "chat"
    max_tokens: int = MAX_TOKENS
    top_k: int = TOP_K

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Answer:
    """One prompt's greedy answer. ``tokens`` (ids or strings, as the API names them), their ``logprobs`` and
    each position's ``top`` ([token, logprob] pairs) are empty when the API gave no logprobs."""

    prompt: int
    text: str
    tokens: list[Any] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    top: list[list[list[Any]]] = field(default_factory=list)
    finish: str | None = None

    @property
    def has_logprobs(self) -> bool:
        return bool(self.tokens) and len(self.top) == len(self.tokens)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Answer:
        return cls(
            prompt=int(data["prompt"]),
            text=str(data.get("text", "")),
            tokens=list(data.get("tokens") or []),
            logprobs=list(data.get("logprobs") or []),
            top=[[list(pair) for pair in position] for position in data.get("top") or []],
            finish=data.get("finish"),
        )


@dataclass(frozen=True, kw_only=True)
class Mismatch:
    """Where a mode's answer leaves the baseline's."""

    prompt: int
    concurrency: int
    position: int
    baseline_token: Any
    mode_token: Any
    baseline_logprob: float | None
    mode_logprob: float | None
    why: str

    def text(self) -> str:
        prompt = PROMPTS[self.prompt] if 0 <= self.prompt < len(PROMPTS) else f"#{self.prompt}"

        def lp(value: float | None) -> str:
            return "?" if value is None else f"{value:.3f}"

        return (
            f"prompt {self.prompt} ({prompt[:60]!r}) at {self.concurrency} stream(s), position {self.position}: "
            f"baseline {self.baseline_token!r} (logprob {lp(self.baseline_logprob)}), mode {self.mode_token!r} "
            f"(logprob {lp(self.mode_logprob)}): {self.why}"
        )


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """A mode's answers against the baseline's: ``ok``, the ``method`` that judged them (``top-k logprobs``, or
    ``greedy text equality`` where the API gives no logprobs), how many answers were compared, and the first
    mismatch of each failing answer."""

    ok: bool
    method: str
    compared: int
    mismatches: tuple[Mismatch, ...] = ()
    note: str = ""

    def excerpt(self) -> str:
        head = f"{len(self.mismatches)} of {self.compared} greedy answers differ from the baseline's ({self.method})"
        return "\n".join([head, *(m.text() for m in self.mismatches[:5])])

    def summary(self) -> str:
        if self.ok:
            return f"correctness: {self.compared} greedy answers match the baseline's ({self.method}){self.note}"
        return f"correctness: {self.excerpt()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "method": self.method,
            "compared": self.compared,
            "mismatches": [asdict(m) for m in self.mismatches],
            "note": self.note,
        }


# ------------------------------------------------------------------------------------------- requests


def request_body(
    model: str, prompt: str, *, api: str, max_tokens: int, top_k: int, ignore_eos: bool, logprobs: bool = True
) -> dict[str, Any]:
    """A greedy, non-streamed request asking for the top-k logprobs of every generated token."""
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, got {api!r}")
    if api == "generate":
        sampling: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": 0.0}
        if ignore_eos:
            sampling["ignore_eos"] = True
        body: dict[str, Any] = {"text": prompt, "sampling_params": sampling, "stream": False}
        if logprobs:
            body.update(return_logprob=True, top_logprobs_num=top_k, return_text_in_logprobs=True)
        return body
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": False}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        if logprobs:
            body.update(logprobs=True, top_logprobs=top_k)
    else:
        body["prompt"] = prompt
        if logprobs:
            body["logprobs"] = top_k
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def parse_answer(index: int, api: str, data: Any) -> Answer:
    """One non-streamed answer of ``api``, with its tokens and top-k logprobs where the server sent them."""
    if api == "generate":
        item = data[0] if isinstance(data, list) else data
        meta = item.get("meta_info") or {}
        tokens, logprobs, top = [], [], []
        for entry in meta.get("output_token_logprobs") or []:
            logprobs.append(entry[0])
            tokens.append(entry[1])
        for position in meta.get("output_top_logprobs") or []:
            top.append([[pair[1], pair[0]] for pair in position or []])
        finish = meta.get("finish_reason")
        return Answer(
            prompt=index,
            text=str(item.get("text", "")),
            tokens=tokens,
            logprobs=logprobs,
            top=top,
            finish=finish.get("type") if isinstance(finish, dict) else finish,
        )
    choice = (data.get("choices") or [{}])[0]
    raw = choice.get("logprobs") or {}
    tokens, logprobs, top = [], [], []
    if api == "chat":
        text = str((choice.get("message") or {}).get("content") or "")
        for entry in raw.get("content") or []:
            tokens.append(entry.get("token"))
            logprobs.append(entry.get("logprob"))
            top.append([[t.get("token"), t.get("logprob")] for t in entry.get("top_logprobs") or []])
    else:
        text = str(choice.get("text") or "")
        tokens = list(raw.get("tokens") or [])
        logprobs = list(raw.get("token_logprobs") or [])
        top = [[[k, v] for k, v in (position or {}).items()] for position in raw.get("top_logprobs") or []]
    return Answer(
        prompt=index, text=text, tokens=tokens, logprobs=logprobs, top=top, finish=choice.get("finish_reason")
    )


def collect(
    base_url: str,
    model: str,
    *,
    api: str,
    concurrency: Sequence[int],
    prompts: Sequence[str] = PROMPTS,
    max_tokens: int = MAX_TOKENS,
    top_k: int = TOP_K,
    ignore_eos: bool = False,
    logprobs: bool = True,
    timeout_s: float = 120.0,
) -> dict[int, list[Answer]]:
    """Every prompt's greedy answer at each concurrency (at ``c``, ``c`` requests in flight at once). A request
    that fails raises ``RuntimeError`` (the server could not answer: not a question of right answers)."""
    url = endpoint(base_url, api)
    out: dict[int, list[Answer]] = {}
    # A server that refuses the logprobs fields (one that validates request fields answers 4xx) is asked
    # again without them: its answers are then compared as text.
    ask_logprobs = [logprobs]
    with httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=max(concurrency))) as client:

        def ask(index: int) -> Answer:
            def post(with_logprobs: bool) -> httpx.Response:
                body = request_body(
                    model,
                    prompts[index],
                    api=api,
                    max_tokens=max_tokens,
                    top_k=top_k,
                    ignore_eos=ignore_eos,
                    logprobs=with_logprobs,
                )
                return client.post(url, json=body)

            response = post(ask_logprobs[0])
            if ask_logprobs[0] and 400 <= response.status_code < 500:
                retry = post(False)
                if retry.status_code == 200:
                    ask_logprobs[0] = False
                    response = retry
            if response.status_code != 200:
                raise RuntimeError(
                    f"correctness request {index} answered {response.status_code}: {response.text[:300]}"
                )
            return parse_answer(index, api, response.json())

        for c in concurrency:
            with concurrent.futures.ThreadPoolExecutor(max_workers=c) as pool:
                out[c] = list(pool.map(ask, range(len(prompts))))
    return out


# ------------------------------------------------------------------------------------------- the rule


def _logprob_of(top: Sequence[Sequence[Any]], token: Any) -> float | None:
    return next((float(lp) for t, lp in top if t == token and lp is not None), None)


def compare_answer(base: Answer, mode: Answer, *, concurrency: int) -> Mismatch | None:
    """vLLM's check_logprobs_close for one prompt; greedy text equality where a side has no logprobs."""
    if not (base.has_logprobs and mode.has_logprobs):
        if base.text == mode.text:
            return None
        position = next((i for i, (a, b) in enumerate(zip(base.text, mode.text, strict=False)) if a != b), None)
        position = min(len(base.text), len(mode.text)) if position is None else position
        return Mismatch(
            prompt=base.prompt,
            concurrency=concurrency,
            position=position,
            baseline_token=base.text[position : position + 12],
            mode_token=mode.text[position : position + 12],
            baseline_logprob=None,
            mode_logprob=None,
            why="the greedy texts differ at this character (no logprobs from the API)",
        )
    for i, (tb, tm) in enumerate(zip(base.tokens, mode.tokens, strict=False)):
        base_top, mode_top = base.top[i], mode.top[i]
        in_base, in_mode = any(t == tm for t, _ in base_top), any(t == tb for t, _ in mode_top)
        if tb == tm and (not base_top or not mode_top):
            continue  # equal tokens at a position whose top-k the server left out
        if not (in_base and in_mode):
            missing = []
            if not in_base:
                missing.append("the mode's token is not in the baseline's top-k")
            if not in_mode:
                missing.append("the baseline's token is not in the mode's top-k")
            return Mismatch(
                prompt=base.prompt,
                concurrency=concurrency,
                position=i,
                baseline_token=tb,
                mode_token=tm,
                baseline_logprob=base.logprobs[i] if i < len(base.logprobs) else None,
                mode_logprob=mode.logprobs[i] if i < len(mode.logprobs) else None,
                why="; ".join(missing),
            )
        if tb != tm:
            return None  # a divergence inside each other's top-k: the sequences part here, as vLLM allows
    if len(base.tokens) != len(mode.tokens):
        n = min(len(base.tokens), len(mode.tokens))
        return Mismatch(
            prompt=base.prompt,
            concurrency=concurrency,
            position=n,
            baseline_token=base.tokens[n] if n < len(base.tokens) else "<end>",
            mode_token=mode.tokens[n] if n < len(mode.tokens) else "<end>",
            baseline_logprob=base.logprobs[n] if n < len(base.logprobs) else None,
            mode_logprob=mode.logprobs[n] if n < len(mode.logprobs) else None,
            why=f"equal up to here, then one answer ends ({len(base.tokens)} against {len(mode.tokens)} tokens)",
        )
    return None


def check(baseline: Mapping[int, Sequence[Answer]], mode: Mapping[int, Sequence[Answer]]) -> CheckResult:
    """A mode's answers against the baseline's, at every concurrency both have."""
    mismatches: list[Mismatch] = []
    compared = 0
    logprobs = True
    for c in sorted(set(baseline) & set(mode)):
        for base, answer in zip(baseline[c], mode[c], strict=True):
            compared += 1
            logprobs = logprobs and base.has_logprobs and answer.has_logprobs
            found = compare_answer(base, answer, concurrency=c)
            if found is not None:
                mismatches.append(found)
    if not compared:
        return CheckResult(ok=False, method="none", compared=0, note=": no concurrency in common with the baseline")
    method = "top-k logprobs" if logprobs else "greedy text equality (the API gave no logprobs)"
    return CheckResult(ok=not mismatches, method=method, compared=compared, mismatches=tuple(mismatches))


def answers_to_dict(answers: Mapping[int, Sequence[Answer]]) -> dict[str, list[dict[str, Any]]]:
    return {str(c): [asdict(a) for a in values] for c, values in answers.items()}


def answers_from_dict(data: Mapping[str, Any]) -> dict[int, list[Answer]]:
    return {int(c): [Answer.from_dict(a) for a in values] for c, values in data.items()}


def stored_answers(record: Mapping[str, Any] | None, key: CorrectnessKey) -> dict[int, list[Answer]] | None:
    """The baseline answers a stored metrics record holds for ``key``, if any."""
    found = (record or {}).get("correctness")
    if not isinstance(found, Mapping) or found.get("key") != key.to_dict() or not found.get("answers"):
        return None
    try:
        return answers_from_dict(found["answers"])
    except (KeyError, TypeError, ValueError):
        return None


def batch_concurrency(levels: Sequence[int], prompts: int = len(PROMPTS)) -> int:
    """The concurrency the batched pass uses: the bench's highest level, at most one stream per prompt, at
    least 2."""
    return max(2, min(max(levels), prompts))


# ------------------------------------------------------------------------------------------- accuracy probe


def arithmetic_prompts(count: int = 50, *, digits: int = 4, seed: int = 0) -> list[tuple[str, int]]:
    """Generated multi-digit additions and their answers (deterministic for a seed): an exact-match probe of a
    real model's accuracy, for which no dataset is downloaded."""
    rng = random.Random(seed)
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    out = []
    for _ in range(count):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        out.append((f"Q: What is {a} + {b}? Answer with the number only.\nA:", a + b))
    return out


_NUMBER = re.compile(r"-?\d[\d,]*")


def score_arithmetic(texts: Sequence[str], problems: Sequence[tuple[str, int]]) -> float:
    """Exact match: the fraction of answers whose first number (commas allowed) is the right sum."""
    if not problems:
        return math.nan
    right = 0
    for text, (_, answer) in zip(texts, problems, strict=True):
        found = _NUMBER.search(text or "")
        if found is not None and found.group().replace(",", "") == str(answer):
            right += 1
    return right / len(problems)


@dataclass(frozen=True, kw_only=True)
class AccuracyResult:
    """Both modes' exact-match scores on the arithmetic probe, against the matrix's floor."""

    score: float
    baseline_score: float | None
    floor: float
    problems: int

    @property
    def ok(self) -> bool:
        return self.score >= self.floor

    def summary(self) -> str:
        base = "" if self.baseline_score is None else f", baseline {self.baseline_score:.3f}"
        verdict = "meets" if self.ok else "is under"
        return f"accuracy probe: {self.score:.3f} exact match on {self.problems} additions{base}; {verdict} the floor {self.floor}"


def accuracy(
    base_url: str, model: str, *, api: str, count: int = 50, timeout_s: float = 120.0
) -> tuple[float, list[str]]:
    """The arithmetic probe's score on a server (greedy, 16 tokens, at most 8 in flight), and its answers."""
    problems = arithmetic_prompts(count)
    prompts = [p for p, _ in problems]
    answers = collect(
        base_url, model, api=api, concurrency=(min(8, count),), prompts=prompts, logprobs=False, timeout_s=timeout_s
    )
    texts = [a.text for a in next(iter(answers.values()))]
    return score_arithmetic(texts, problems), texts
