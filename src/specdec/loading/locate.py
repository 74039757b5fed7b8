"""Where a ``--target`` / ``--draft-model`` value points, checked before any weights are read; and ``--device``.

A value is the default pair (None), a GGUF file, a transformers model directory, a named model
(``specdec.loading.zoo``) or a cached model id: :func:`locate_model` resolves and checks each. Nothing is
downloaded: the default pair and the named models are assembled from PyPI packages
(``specdec.loading.defaults``), and hub look-ups are switched off unless the user allows them.
"""

from __future__ import annotations

import os

import torch

from . import zoo


class ModelSpecError(ValueError):
    """A --target / --draft-model / --device value that does not resolve; its text is one line
    naming the value and what is accepted (the CLI prints it and exits with status 2)."""


MODEL_FORMS = ("a GGUF file, a transformers model directory (with config.json), a directory holding one GGUF "
               f"file, the name of a model shipped on PyPI ({', '.join(zoo.NAMED_MODELS)}) or the id of a model "
               "already in the local model cache (nothing is downloaded)")
GGUF_MAGIC = b"GGUF"
ROLE_FLAGS = {"target": "--target", "draft": "--draft-model"}


def is_gguf_file(path: str) -> bool:
    """Whether ``path`` is a file starting with the GGUF magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def locate_model(spec: str | None, role: str = "target", *, progress: bool = True,
                 assemble: bool = True, tokenizer_only: bool = False) -> tuple[str, str | None]:
    """The one model locator: ``(kind, path)`` for a --target / --draft-model value, checked.

    kind is ``"gguf"`` (path: the GGUF file) or ``"transformers"`` (path: a model directory, or a
    model id found in the local cache). None is the default model of ``role`` (target or draft),
    assembled once from its PyPI packages (``assemble=False``: not assembled, path None); so is a named
    model (``specdec.loading.zoo``; ``assemble=False``: its packages checked, path None until assembled). Anything
    that does not resolve is a :class:`ModelSpecError` naming the value and the accepted forms,
    raised before any weights are read. ``tokenizer_only``: a directory holding just a tokenizer
    (tokenizer.json / tokenizer_config.json) is enough.
    """
    if role not in ROLE_FLAGS:
        raise ValueError(f"role={role!r} is invalid: choose target or draft")
    if spec is None:
        if not assemble:
            return "gguf", None
        return "gguf", str(zoo.ensure_gguf(zoo.DEFAULT_TARGET if role == "target" else zoo.DEFAULT_DRAFT,
                                           progress=progress))
    flag, value = ROLE_FLAGS[role], str(spec)
    named = zoo.named_model(value)
    if named is not None:
        try:
            return "gguf", zoo.named_path(named, assemble=assemble, progress=progress)
        except zoo.NamedModelMissing as err:
            raise ModelSpecError(f"{flag} {err}") from None
    path = os.path.expanduser(value)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return "transformers", path
        if tokenizer_only and any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
            return "transformers", path
        ggufs = sorted(name for name in os.listdir(path) if name.lower().endswith(".gguf"))
        if len(ggufs) == 1:
            return locate_model(os.path.join(path, ggufs[0]), role, tokenizer_only=tokenizer_only)
        if ggufs:
            raise ModelSpecError(f"{flag} {value!r} holds several GGUF files ({', '.join(ggufs)}): name one of them")
        raise ModelSpecError(f"{flag} {value!r} is a directory without a model (no config.json, no .gguf file); "
                             f"accepted: {MODEL_FORMS}")
    if os.path.isfile(path):
        if not is_gguf_file(path):
            raise ModelSpecError(f"{flag} {value!r} is not a GGUF file (it does not start with the bytes 'GGUF'); "
                                 f"accepted: {MODEL_FORMS}")
        return "gguf", path
    if _cached_model_id(value):
        return "transformers", value
    raise ModelSpecError(f"{flag} {value!r} does not exist (no such file or directory, nor a model id in the local "
                         f"model cache); accepted: {MODEL_FORMS}")


def _cached_model_id(value: str) -> bool:
    """Whether ``value`` names a model (its config.json) in the local model cache; never downloads."""
    if value.startswith((".", "/", "~")) or value.lower().endswith(".gguf") or value.count("/") > 1:
        return False
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(value, "config.json")
    except Exception:  # not a valid id, or no cache
        return False
    return isinstance(found, str) and os.path.isfile(found)


DEVICES = "cpu, cuda, cuda:N"


def check_device(device) -> str:
    """The device as given, when torch can use it here; otherwise a one-line ModelSpecError."""
    text = str(device).strip()
    kind, colon, index = text.partition(":")
    if kind == "cpu" and not colon:
        return text
    if kind == "cuda" and (not colon or index.isdigit()):
        if not torch.cuda.is_available():
            raise ModelSpecError(f"--device {text!r} is unavailable: torch sees no CUDA device on this machine; "
                                 f"accepted here: cpu")
        count = torch.cuda.device_count()
        if colon and int(index) >= count:
            raise ModelSpecError(f"--device {text!r} is unavailable: this machine has {count} CUDA device(s), "
                                 f"cuda:0..cuda:{count - 1}")
        return text
    raise ModelSpecError(f"--device {text!r} is unknown; accepted: {DEVICES}")


def model_source(spec: str | None, role: str = "target", *, progress: bool = True,
                 tokenizer_only: bool = False) -> tuple[str, str | None]:
    """(directory or model id, gguf file name or None) for a --target/--draft-model value."""
    kind, path = locate_model(spec, role, progress=progress, tokenizer_only=tokenizer_only)
    if kind == "gguf":
        return os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    return path, None


def names_gguf(spec: str | None) -> bool:
    """Whether a --target/--draft-model value names a GGUF file (None: the default, a GGUF file, as are the
    named models); no check that it exists (locate_model does that)."""
    if spec is None or str(spec).lower().endswith(".gguf") or zoo.named_model(spec) is not None:
        return True
    path = os.path.expanduser(str(spec))
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        return sum(name.lower().endswith(".gguf") for name in os.listdir(path)) == 1
    return False


def gguf_path(spec: str | None, role: str, *, progress: bool = True) -> str:
    """The GGUF file of a --target/--draft-model value (None: the default of that role, assembled once)."""
    kind, path = locate_model(spec, role, progress=progress)
    if kind != "gguf":
        raise ModelSpecError(f"{ROLE_FLAGS[role]} {spec!r} is not a GGUF file: llama.cpp runs GGUF files only")
    return path
