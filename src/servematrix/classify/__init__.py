"""Name the cause of a failed server run from its log, by the engine's failure signatures (data).

One module per job:
- `signatures.py`: the signature data's schema and loader (`data/signatures/<engine>.toml`);
- `literals.py`: the literal strings every match of a regex contains, read from its text;
- `prefilter.py`: which patterns a line can match, by substring tests of those literals;
- `lines.py`: a log's lines, split in bounded chunks, with terminal control sequences removed;
- `scanner.py`: the scan itself, of a whole log or of one being written (early abort), ranked by priority;
- `tracebacks.py`: the packages a Python traceback's frames ran in, for import-time conflicts;
- `frames.py`: traceback frames as evidence: a log's frames matched, in bounded memory, against the frame
  sequences of the signature data (`[[signature.traceback]]`, evidence `frames`);
- `fixes.py`: package pins the signature data says fix a failing cell (`[[signature.fix]]`), for the failure pages.

This module re-exports what the rest of servematrix uses, so `from servematrix.classify import ...` works.
"""

from __future__ import annotations

from servematrix.classify.lines import LINE_SCAN_MAX, LineSplitter, LogLine, printable
from servematrix.classify.literals import required_literals
from servematrix.classify.prefilter import MIN_LITERAL_LEN, Prefilter
from servematrix.classify.scanner import (
    EXCERPT_AFTER,
    EXCERPT_BEFORE,
    EXCERPT_LINE_MAX,
    NO_MATCH,
    READ_CHUNK,
    LogScanner,
    Match,
    classify_file,
    classify_text,
    match_file,
    pass_failure,
    scan_stream,
)
from servematrix.classify.signatures import (
    IMPORT_CONFLICT,
    SCHEMA,
    Evidence,
    Signature,
    SignatureDataError,
    SignatureFile,
    Signatures,
    load_signatures,
    parse_signatures,
)

__all__ = [
    "EXCERPT_AFTER",
    "EXCERPT_BEFORE",
    "EXCERPT_LINE_MAX",
    "IMPORT_CONFLICT",
    "LINE_SCAN_MAX",
    "MIN_LITERAL_LEN",
    "NO_MATCH",
    "READ_CHUNK",
    "SCHEMA",
    "Evidence",
    "LineSplitter",
    "LogLine",
    "LogScanner",
    "Match",
    "Prefilter",
    "Signature",
    "SignatureDataError",
    "SignatureFile",
    "Signatures",
    "classify_file",
    "classify_text",
    "load_signatures",
    "match_file",
    "parse_signatures",
    "pass_failure",
    "printable",
    "required_literals",
    "scan_stream",
]
