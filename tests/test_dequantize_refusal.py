"""Never silently in float32 (issue 28): a GGUF file with matrices of a type the native kernels do not read is one
line naming the type(s), the file, the types read natively and the float32 memory, exit status 2, before anything
loads; ``--dequantize`` (``dequantize=True``) runs it with that line as a warning; ``auto`` never picks it alone.

The files are tiny random Qwen2 models (``tiny_qwen2``) with some matrices re-written in a type that has no kernel
here. Which type is chosen when the test runs, from ``has_kernel`` (``specdec.native.kernels.KERNELS``), so the
tests stay valid as kernels are added: the first of :data:`CANDIDATES` without one that ``gguf`` can write.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tiny_qwen2
from gguf import GGMLQuantizationType, quants

from specdec import NativeModel, NativeSettings, cli, load_model, session
from specdec.loading import backend
from specdec.loading.settings import LoadSettings
from specdec.models import kernel_types
from specdec.models.kernel_types import NoKernelError, float32_matrices, native_types
from specdec.native.gguf_file import GGUFFile
from specdec.native.kernels import KERNELS, has_kernel

# types gguf.quants can write, ternary ones first (no kernel is planned for them); F16 is written as float16 values
CANDIDATES = ("TQ2_0", "TQ1_0", "Q4_1", "Q5_1", "BF16", "F16", "Q4_0", "Q5_K", "Q3_K", "Q2_K")
REWRITTEN = ("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.1.attn_q.weight")


def _encode(weights: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    if qtype == GGMLQuantizationType.F16:
        return weights.astype(np.float16)
    return quants.quantize(weights, qtype)


def _writable(name: str) -> GGMLQuantizationType | None:
    qtype = getattr(GGMLQuantizationType, name, None)
    if qtype is None or has_kernel(qtype):
        return None
    try:
        _encode(np.zeros((1, 256), dtype=np.float32), qtype)
    except Exception:  # gguf cannot quantize to it (NotImplementedError, QuantError, ...)
        return None
    return qtype


UNREAD = next((q for q in map(_writable, CANDIDATES) if q is not None), None)
pytestmark = pytest.mark.skipif(UNREAD is None, reason=f"every one of {', '.join(CANDIDATES)} has a native kernel")


def write_file(path, *, names=REWRITTEN, tied: bool = False, embed: bool = False) -> str:
    """A tiny Qwen2 file (with a tokenizer) whose matrices ``names`` are re-written in :data:`UNREAD` (their
    de-quantized weights encoded again); ``tied``: no output.weight; ``embed``: the token embedding re-written too."""
    original = tiny_qwen2.write_tensors

    def rewrite(writer, tensors, out):
        tensors = dict(tensors)
        if tied:
            del tensors["output.weight"]
        for name in (*names, *(("token_embd.weight",) if embed else ())):
            blocks, qtype = tensors[name]
            weights = np.array(quants.dequantize(blocks, qtype), dtype=np.float32)
            tensors[name] = (_encode(weights, UNREAD), None if UNREAD == GGMLQuantizationType.F16 else UNREAD)
        return original(writer, tensors, out)

    tiny_qwen2.write_tensors = rewrite
    try:
        return tiny_qwen2.write_tiny_qwen2(path, tokenizer=True)
    finally:
        tiny_qwen2.write_tensors = original


@pytest.fixture(scope="module")
def unread(tmp_path_factory) -> str:
    return write_file(tmp_path_factory.mktemp("unread") / "unread.gguf")


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if weights (or the tokenizer) start loading."""
    def fail(*args, **kwargs):
        pytest.fail("weights were about to load")

    monkeypatch.setattr(session, "load", fail)
    monkeypatch.setattr(NativeModel, "__init__", fail)
    monkeypatch.setattr("specdec.loading.native_pair.gguf_tokenizer", fail)
    monkeypatch.setattr("specdec.cli.serve.listen_or_explain", fail)
    monkeypatch.setattr("specdec.cli.explore.listen_or_explain", fail)
    monkeypatch.setattr("specdec.bench.suite.load_pairs", fail)


def expected_gb(path: str, names=REWRITTEN) -> float:
    tensors = GGUFFile(path).tensors
    return sum(int(np.prod(tensors[n].shape)) for n in names) * 4 / 1e9


def check_line(line: str, path: str) -> None:
    assert "\n" not in line
    assert path in line and UNREAD.name in line
    assert f"(they read {', '.join(native_types())})" in line
    gb = expected_gb(path)
    assert (f"{gb:.2f} GB" if gb >= 0.01 else "under 0.01 GB") in line


def test_the_refusal_names_type_file_supported_types_and_float32_memory(unread):
    found = float32_matrices(unread)
    assert found.types == (UNREAD.name,) and found.count == len(REWRITTEN)
    assert found.elements * 4 / 1e9 == pytest.approx(expected_gb(unread))
    check_line(found.message(), unread)
    assert "--dequantize" in found.message() and "dequantize=True" in found.message()
    assert set(native_types()) == {q.name for q in KERNELS if has_kernel(q)}
    assert UNREAD.name not in native_types()


COMMANDS = {
    "generate": ["generate", "hi", "--draft", "lookup"],
    "serve": ["serve", "--draft", "lookup", "--port", "0"],
    "measure": ["measure"],
    "bench": ["bench", "--backends", "native", "--dry-run"],
    "explore": ["explore", "--port", "0"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_exits_2_with_one_line_before_anything_loads(command, unread, nothing_loads, capsys):
    assert cli.main([*COMMANDS[command], "--target", unread]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"specdec {command}: error: {unread}: ")
    check_line(err, unread)


def test_a_draft_model_file_is_refused_too(unread, nothing_loads, capsys):
    assert cli.main(["generate", "hi", "--draft-model", unread]) == 2
    check_line(capsys.readouterr().err.strip(), unread)


def test_backends_that_do_not_use_the_kernels_are_not_refused(unread, nothing_loads, capsys):
    """bench on transformers only: the native kernels' types are not the question (its --dry-run plans)."""
    assert cli.main(["bench", "--backends", "transformers", "--dry-run", "--target", unread]) == 0
    assert backend.resolve_backend("transformers", unread) == "transformers"


def test_dequantize_runs_the_file_with_the_same_line_as_a_warning(unread, capsys):
    import json

    argv = ["generate", "ab", "--no-chat", "--target", unread, "--draft", "lookup", "--max-new-tokens", "4",
            "--threads", "1", "--json", "--dequantize"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["backend"] == "native" and result["new_tokens"] >= 1
    warnings = [line for line in err.splitlines() if line.startswith("specdec: warning: ")]
    assert len(warnings) == 1 and "de-quantizing them to float32 (--dequantize)" in warnings[0]
    check_line(warnings[0], unread)


def test_the_library_raises_a_typed_error_unless_dequantize(unread, capsys):
    for call in (lambda: load_model(unread), lambda: NativeModel(unread),
                 lambda: session.load(LoadSettings(target=unread, with_draft=False)),
                 lambda: backend.resolve_backend("native", unread), lambda: backend.resolve_backend("auto", unread)):
        with pytest.raises(NoKernelError) as info:
            call()
        assert isinstance(info.value, ValueError)
        assert str(info.value) == float32_matrices(unread).message()
    assert backend.resolve_backend("auto", unread, dequantize=True) == "native"  # auto: native, never transformers
    model = load_model(unread, threads=1, dequantize=True)
    assert capsys.readouterr().err.count("specdec: warning: ") == 1
    quiet = NativeModel(unread, NativeSettings(threads=1, dequantize=True), tokenizer=model.tokenizer)
    assert quiet.layers[0].gate.matrix.qtype == GGMLQuantizationType.F32  # the float32 copy
    assert quiet.layers[0].down.matrix.qtype != GGMLQuantizationType.F32  # the rest as stored
    model.prefill([1, 2, 3])
    assert model.score([4, 5]).isfinite().all()
    with pytest.raises(ValueError, match=r"dequantize='yes' is invalid: must be True or False"):
        LoadSettings(dequantize="yes")


def test_a_tied_head_counts_and_an_untied_embedding_does_not(tmp_path):
    """The embedding is looked up row by row (no float32 copy); as a tied output head it is a matrix."""
    untied = write_file(tmp_path / "untied.gguf", names=(), embed=True)
    assert float32_matrices(untied) is None
    NativeModel(untied, NativeSettings(threads=1))  # runs: its embedding rows are de-quantized per lookup
    tied = write_file(tmp_path / "tied.gguf", names=(), tied=True, embed=True)
    found = float32_matrices(tied)
    assert found.count == 1 and found.elements == tiny_qwen2.VOCAB * tiny_qwen2.HIDDEN


def test_a_kernel_added_to_the_table_is_read_natively_from_then_on(unread, monkeypatch):
    monkeypatch.setitem(KERNELS, UNREAD, ("added", 1))
    monkeypatch.setattr(kernel_types, "has_kernel", lambda qtype: qtype in KERNELS)
    assert UNREAD.name in native_types() and float32_matrices(unread) is None


def test_auto_says_so_when_it_leaves_a_gguf_file_to_transformers(tmp_path, capsys):
    from tiny_archs import write_other_arch

    other = write_other_arch(tmp_path / "mamba.gguf")
    assert backend.resolve_backend("auto", other) == "transformers"
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"specdec: --backend auto runs {other} on transformers, de-quantized to float32 (")
    assert "architecture 'mamba'" in err and "\n" not in err


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m"])
def test_the_files_we_ship_are_read_natively_throughout(name):
    from specdec.loading import zoo

    model = zoo.NAMED_MODELS[name]
    if zoo.missing_packages(model.spec):
        if os.environ.get("SPECDEC_REQUIRE_REAL"):
            pytest.fail(f"SPECDEC_REQUIRE_REAL is set but {name} is not installed ({model.spec.install})")
        pytest.skip(f"{name} is not installed ({model.spec.install})")
    assert float32_matrices(zoo.named_path(model, progress=False)) is None
