"""JSON text for the wire and for `--json`: the standard library's own C codec, reached
without importing the `json` package.

`import json` also imports `re`, `enum`, `functools` and `collections` (its decoder's
whitespace regex): about as long as the interpreter takes to start, paid by every
`gpumemctl ls --json` a script runs in a loop (issue 12). `json.dumps(obj,
separators=(",", ":"))` and `json.loads(text)` end in `_json`'s C encoder and scanner
anyway; `dumps` and `loads` here call those directly, with the arguments `json` passes, so
the text is the same byte for byte (tests/unit/test_cli_plain.py compares them). Where
`_json` is missing or does not take these arguments (another Python), `json` does the work.
"""
from __future__ import annotations

WHITESPACE = " \t\n\r"          # JSON's whitespace: nothing else may surround a document

try:
    import _json

    class _DecoderSettings:
        """What json.JSONDecoder() hands the C scanner: the defaults of json.loads()."""
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"),
                          "NaN": float("nan")}.__getitem__

    def _not_serializable(obj):
        raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")

    def _encoder():
        """json.JSONEncoder(separators=(",", ":")).iterencode(obj, _one_shot=True): circular
        check on (a fresh marker dict per document, as json makes), ensure_ascii, no indent,
        keys unsorted, NaN allowed."""
        return _json.make_encoder({}, _not_serializable, _json.encode_basestring_ascii,
                                  None, ":", ",", False, False, True)

    # typeshed types the context as a make_scanner; the C scanner reads only these attributes
    _scan = _json.make_scanner(_DecoderSettings())  # type: ignore[arg-type]
    _encoder()(None, 0)         # a signature this Python does not take fails here, at import
    _C_CODEC = True
except (ImportError, AttributeError, TypeError):      # pragma: no cover - not CPython 3.11+
    _C_CODEC = False


def dumps(obj) -> str:
    """As json.dumps(obj, separators=(",", ":"))."""
    if not _C_CODEC:                                   # pragma: no cover
        import json
        return json.dumps(obj, separators=(",", ":"))
    return "".join(_encoder()(obj, 0))


def loads(text: str):
    """As json.loads(text) for a str: ValueError (json.JSONDecodeError where the C scanner
    finds the fault) for anything that is not exactly one JSON document."""
    if not _C_CODEC:                                   # pragma: no cover
        import json
        return json.loads(text)
    start = len(text) - len(text.lstrip(WHITESPACE))
    try:
        obj, end = _scan(text, start)
    except StopIteration as stop:
        raise ValueError(f"Expecting value: char {stop.value}") from None
    if text[end:].strip(WHITESPACE):
        raise ValueError(f"Extra data: char {end}")
    return obj
