"""Build a tiny, deterministic Llama model (random weights + byte-level BPE tokenizer) for CPU serving tests.

This file is SELF-CONTAINED on purpose: it imports only the standard library at module level, so that the
harness (which has no torch) can import it for :func:`builder_path` / :func:`input_hash`, and a cell
environment's interpreter can run it as a script::

    ENV/bin/python /path/to/tinymodel.py OUT_DIR [--seed N] [--force] [--size tiny|gpu-1b]

``tokenizers``, ``transformers`` and ``torch`` are imported only inside :func:`build`. When they do not import
(the environment's own stack is broken, e.g. transformers 5.6.0 with kernels 0.17.2), the script prints that
traceback alone and exits with :data:`STACK_IMPORT_EXIT`: the failure is the stack's, not the builder's, and
the harness classifies it as it classifies an import check (servematrix.run.models).

Determinism:

* the tokenizer training text is generated here from an embedded word list and paragraph with a fixed LCG
  (no ``random`` module, no files read);
* every weight tensor is filled by its own ``torch.Generator`` seeded from ``(seed, tensor name)``,
  independently of transformers' own initialisation order, so the safetensors bytes are the same for the same
  seed and torch version;
* the ``lm_head`` row of the EOS token is zeroed, so its logit is exactly 0 while the maximum over ~1500
  random logits is almost surely positive: greedy decoding practically never stops early, and benchmarks get
  ``max_tokens`` tokens per request. Clients must still count tokens from the server's ``usage``.

The output directory also gets ``servematrix-tiny-model.json``, a marker with :func:`input_hash` (a content
hash of every builder input), so callers can skip a rebuild when the marker matches.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

BUILDER_VERSION = "1"
# The exit status that says "the environment's stack did not import" (read by servematrix.run.models).
STACK_IMPORT_EXIT = 3
MARKER_NAME = "servematrix-tiny-model.json"
DEFAULT_SEED = 0

VOCAB_SIZE = 1536
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|pad|>", "<|bos|>", "<|eos|>"

# Small enough for ~1 MB of float32 weights; 2 KV heads exercise grouped-query attention.
MODEL_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
}
# Weights are drawn from N(0, WEIGHT_STD); norms are ones. A larger std than initializer_range gives more
# varied (less repetitive) greedy output from random weights.
WEIGHT_STD = 0.5

# Other sizes, for serving tests on a GPU: the same tokenizer and template, a bigger Llama. `gpu-1b` is about
# 0.76 B parameters in bfloat16 (1.5 GB), the model the first H200 runs used; a small std keeps 16 bf16
# layers finite.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"model_config": MODEL_CONFIG, "dtype": "float32", "weight_std": WEIGHT_STD},
    "gpu-1b": {
        "model_config": {
            **MODEL_CONFIG,
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 16,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
        },
        "dtype": "bfloat16",
        "weight_std": 0.02,
    },
}
DEFAULT_SIZE = "tiny"

# The chat template accepts plain-string content and OpenAI-style lists of {"type": "text"} parts.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|end|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)

# Plain prose written for this file (no third-party text), plus a fixed word list.
_PARAGRAPH = """\
The river runs past the old mill and turns toward the sea. In the morning the fog lies low on the water,
and the fishing boats leave the harbour one after another. A small dog waits on the stone wall for its owner
to come back. Bread is baked before sunrise, and the smell of it fills the narrow streets. Children walk to
school in pairs, talking about numbers, stories, maps and the weather. By noon the market is loud with
voices: apples, onions, cheese, rope, nails, paper and lamps are sold from wooden tables. In the afternoon
the wind rises, the clouds move quickly from the west, and the light changes from white to gold. The
teacher writes a question on the board: how far is it from the mill to the lighthouse, if a cart travels
twelve miles in three hours? Some answer at once; others count on their fingers. In the evening the
lamps are lit, the boats come home, and the dog runs down to the harbour to meet them. Machines that serve
language models read text as tokens, compute a little at a time, and write new tokens one by one; a
benchmark counts how many tokens arrive each second, how long the first one takes, and how steady the gaps
between them are. A careful test repeats each measurement, reports the spread, and never trusts one number.
"""

_WORDS = """\
time year people way day man thing woman life child world school state family student group country problem
hand part place case week company system program question work government number night point home water room
mother area money story fact month lot right study book eye job word business issue side kind head house
service friend father power hour game line end member law car city community name president team minute idea
kid body information back parent face others level office door health person art war history party result
change morning reason research girl guy moment air teacher force education foot boy age policy everything
process music market sense nation plan college interest death experience effect use class control care field
development role effort rate heart drug show leader light voice wife police mind price report decision son
view relationship town road arm difference value building action model season society tax director position
player record paper space ground form event official matter center couple site project activity star table
need court oil situation cost industry figure street image phone data picture practice piece land product
doctor wall patient worker news test movie north love support technology step baby computer type attention
film tree source organization hair window evidence population site river sea fish boat bread stone cloud
wind light gold lamp rope nail apple onion cheese map harbour mill fog dog cart mile token server batch cache
be have do say go get make know think take see come want look use find give tell work call try ask need feel
become leave put mean keep let begin seem help talk turn start show hear play run move like live believe hold
bring happen write provide sit stand lose pay meet include continue set learn change lead understand watch
follow stop create speak read allow add spend grow open walk win offer remember love consider appear buy wait
serve die send expect build stay fall cut reach kill remain suggest raise pass sell require report decide pull
good new first last long great little own other old right big high different small large next early young
important few public bad same able late hard major better economic strong possible whole free military true
federal international full special easy clear recent certain personal open red difficult available likely
short single medical current wrong private past foreign fine common poor natural significant similar hot dead
central happy serious ready simple left physical general environmental financial blue democratic dark various
entire close legal religious cold final main green nice huge popular traditional cultural quick slow warm
the of and to a in for is on that by this with you it not or be are from at as your all have new more an was
we will home can us about if page my has search free but our one other do no information time they site he up
may what which their news out use any there see only so his when contact here business who web also now help
"""


class _Lcg:
    """A 64-bit linear congruential generator, fully specified here so it never changes across Pythons."""

    def __init__(self, seed: int) -> None:
        self.state = (seed * 6364136223846793005 + 1442695040888963407) % (1 << 64)

    def next(self, n: int) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (self.state >> 33) % n


def training_text(n_sentences: int = 6000) -> str:
    """The tokenizer training corpus: the paragraph, the word list, and LCG-generated sentences (~250 KB)."""
    words = _WORDS.split()
    rng = _Lcg(12345)
    sentences = []
    for _ in range(n_sentences):
        n = 4 + rng.next(12)
        sent = " ".join(words[rng.next(len(words))] for _ in range(n))
        punct = ".?!,;:"[rng.next(6)]
        num = f" {rng.next(10000)}" if rng.next(4) == 0 else ""
        sentences.append(sent.capitalize() + num + punct)
    return _PARAGRAPH + "\n" + " ".join(words) + "\n" + "\n".join(sentences) + "\n"


def builder_path() -> Path:
    """The path of this file, to be run by a cell environment's interpreter."""
    return Path(__file__).resolve()


def input_hash(seed: int = DEFAULT_SEED, size: str = DEFAULT_SIZE) -> str:
    """A sha256 over every builder input: this file's source (code, configs, template, corpus text), seed
    and size.

    Stdlib only, so the harness can compare it with a model directory's marker without torch.
    """
    h = hashlib.sha256()
    payload: dict[str, object] = {
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "vocab_size": VOCAB_SIZE,
        "special_tokens": list(SPECIAL_TOKENS),
        "model_config": MODEL_CONFIG,
        "weight_std": WEIGHT_STD,
        "chat_template": CHAT_TEMPLATE,
    }
    if size != DEFAULT_SIZE:  # the tiny model's hash is what it always was
        payload["size"] = {"name": size, **SIZES[size]}
    h.update(json.dumps(payload, sort_keys=True).encode())
    h.update(builder_path().read_bytes())
    return h.hexdigest()


def read_marker(out_dir: str | os.PathLike[str]) -> dict | None:
    """The marker of a built model directory, or None."""
    try:
        return json.loads((Path(out_dir) / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None


def is_built(out_dir: str | os.PathLike[str], seed: int = DEFAULT_SEED, size: str = DEFAULT_SIZE) -> bool:
    """True if ``out_dir`` holds a model built from the current builder inputs."""
    marker = read_marker(out_dir)
    return marker is not None and marker.get("input_hash") == input_hash(seed, size)


def not_replaceable(out_dir: str | os.PathLike[str]) -> str | None:
    """Why the builder must not replace what is at ``out_dir``, or None if it may.

    The builder replaces only what it built (a directory holding its marker, whatever its inputs were) or
    an empty directory. Anything else is someone's data: a file, or a directory without the marker.
    """
    out = Path(out_dir)
    if not out.exists() and not out.is_symlink():
        return None
    if not out.is_dir():
        return f"{out} exists and is not a directory: not replacing it with a model"
    if (out / MARKER_NAME).is_file() or not any(out.iterdir()):
        return None
    return (
        f"{out} exists and was not built by servematrix (it has no {MARKER_NAME}): not replacing it; "
        "move it away or choose another model path"
    )


class NotReplaceableError(FileExistsError):
    pass


class StackImportError(RuntimeError):
    """The environment's torch/transformers/tokenizers did not import; the cause is chained."""


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text().splitlines(keepends=True), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)],
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(
    out_dir: str | os.PathLike[str], seed: int = DEFAULT_SEED, *, force: bool = False, size: str = DEFAULT_SIZE
) -> Path:
    """Build the model into ``out_dir`` (atomically: a temporary sibling directory, then a rename).

    Skips the build when ``out_dir`` already holds a model with the same :func:`input_hash`, unless ``force``.
    """
    out = Path(out_dir).resolve()
    if not force and is_built(out, seed, size):
        return out
    preset = SIZES[size]
    problem = not_replaceable(out)
    if problem:
        raise NotReplaceableError(problem)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        # Every module the build uses, imported up front: LlamaForCausalLM loads transformers' modeling code,
        # where a broken stack dies (transformers' hub_kernels with kernels 0.17.2).
        import tokenizers
        import torch
        import transformers
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: F401
    except Exception as exc:
        raise StackImportError(f"{type(exc).__name__}: {exc}") from exc

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tokenizer = _build_tokenizer()
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)}
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            pad_token_id=ids[PAD_TOKEN],
            bos_token_id=ids[BOS_TOKEN],
            eos_token_id=ids[EOS_TOKEN],
            **preset["model_config"],
        )
        torch.manual_seed(seed)
        dtype = getattr(torch, preset["dtype"])
        model = LlamaForCausalLM(config).to(dtype).eval()
        with torch.no_grad():
            for name, param in sorted(model.named_parameters()):
                digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
                gen = torch.Generator(device="cpu").manual_seed(int.from_bytes(digest[:8], "little") >> 1)
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                else:
                    param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * preset["weight_std"])
            # See the module docstring: EOS logit is exactly 0, so greedy decoding practically never stops.
            model.lm_head.weight[ids[EOS_TOKEN]].zero_()
        model.generation_config = GenerationConfig(
            bos_token_id=ids[BOS_TOKEN],
            eos_token_id=ids[EOS_TOKEN],
            pad_token_id=ids[PAD_TOKEN],
            do_sample=False,
        )
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

        files = {p.name: _sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        marker = {
            "builder": "servematrix.engines.transformers.tinymodel",
            "builder_version": BUILDER_VERSION,
            "seed": seed,
            "size": size,
            "input_hash": input_hash(seed, size),
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
                "python": sys.version.split()[0],
            },
            "vocab_size": len(tokenizer),
            "special_token_ids": ids,
            "files": files,
        }
        put_in_place(tmp, out, marker, built=lambda: is_built(out, seed, size))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def put_in_place(tmp: Path, out: Path, marker: dict, *, built: Callable[[], bool]) -> None:
    """A model built in `tmp` beside `out`, with its marker, moved over `out` in one rename: never over what this
    builder did not make. `built` says whether a concurrent builder's identical result is already there."""
    (tmp / MARKER_NAME).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    # mkdtemp creates 0700 and safetensors 0600: make the model readable by a container's other user.
    tmp.chmod(0o755)
    for p in tmp.iterdir():
        p.chmod(0o644)
    if out.exists():
        # Checked again: the build took a while, and only our own output may be replaced.
        problem = not_replaceable(out)
        if problem:
            raise NotReplaceableError(problem)
        shutil.rmtree(out, ignore_errors=True)
    try:
        os.replace(tmp, out)
    except OSError:
        # A concurrent builder renamed its (identical) result into place first.
        if not built():
            raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tinymodel.py", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--force", action="store_true", help="rebuild even if the marker matches")
    parser.add_argument("--size", choices=sorted(SIZES), default=DEFAULT_SIZE, help="model size preset")
    args = parser.parse_args(argv)
    try:
        out = build(args.out_dir, args.seed, force=args.force, size=args.size)
    except NotReplaceableError as exc:
        print(f"tinymodel.py: error: {exc}", file=sys.stderr)
        return 2
    except StackImportError as exc:
        traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)  # the stack's own traceback, alone
        return STACK_IMPORT_EXIT
    print(json.dumps({"out_dir": str(out), "input_hash": input_hash(args.seed, args.size)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
