"""kill -9 while specdec writes into its cache, then run again: the next run repairs or rebuilds, and never
uses a half-written file. Each case runs the writer in a subprocess that stops at a known point (a fake
compiler that has written half a library, a tokenizer save that has written half its files, an assembly
that has written part of a model) and tells the test so through a file; the test then kills the process
group with SIGKILL (no clean-up runs) and checks what a later run finds and does.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from specdec.native import build

WAIT_SECONDS = 60  # for the subprocess to reach its stopping point (imports take a few seconds on a busy machine)


def run_until_killed(script: str, ready, env: dict[str, str]) -> None:
    """Run ``python -c script`` in its own process group, wait until it creates ``ready``, then SIGKILL the group."""
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, **env}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + WAIT_SECONDS
    try:
        while not ready.exists():
            if proc.poll() is not None:
                pytest.fail(f"the writer exited ({proc.returncode}) before its stopping point:\n{proc.stdout.read()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the writer did not reach its stopping point in {WAIT_SECONDS} s")
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):  # already gone: the failure above says why
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


# --- the kernel build -------------------------------------------------------------------------------------

def test_a_build_killed_mid_compile_leaves_no_library_and_the_next_run_rebuilds(tmp_path, monkeypatch):
    ready = tmp_path / "ready"
    slow = tmp_path / "slow-g++"  # writes half an ELF file where g++ would write the library, then hangs
    slow.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = -o ] && out=$2; shift; done\n"
                    "printf '\\177ELF half a library' > \"$out\"\n"
                    f"touch '{ready}'\nsleep {WAIT_SECONDS * 2}\n")
    slow.chmod(0o755)
    env = {"SPECDEC_CACHE": str(tmp_path / "cache"), "CXX": str(slow)}
    run_until_killed("from specdec.native import build; build.build('f32', 'scalar')", ready, env)

    monkeypatch.setenv("SPECDEC_CACHE", env["SPECDEC_CACHE"])
    monkeypatch.delenv("CXX", raising=False)
    path = build.library_path("f32", "scalar")
    leftovers = list(path.parent.glob(f".{path.name}.*.tmp"))
    assert not path.exists() and [p.read_bytes() for p in leftovers] == [b"\x7fELF half a library"]
    assert build.build("f32", "scalar") == path  # rebuilt by the real compiler, not taken from the leftover
    assert not any(p.exists() for p in leftovers)
    assert hasattr(ctypes.CDLL(str(path)), "f32_gemm")


# --- the tokenizer cache -----------------------------------------------------------------------------------

HALF_SAVE = """
import pathlib, sys, time
from transformers import PreTrainedTokenizerBase
from specdec.loading.tokenizer import gguf_tokenizer

real_save = PreTrainedTokenizerBase.save_pretrained

def half_save(self, folder, *args, **kwargs):  # every file written, then the biggest cut in half: killed mid-write
    saved = real_save(self, folder, *args, **kwargs)
    biggest = max(pathlib.Path(folder).iterdir(), key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
    pathlib.Path(sys.argv[2]).touch()
    time.sleep(600)
    return saved

PreTrainedTokenizerBase.save_pretrained = half_save
gguf_tokenizer(sys.argv[1])
"""


def test_a_tokenizer_save_killed_midway_is_never_read_and_the_next_run_rebuilds_it_once(tmp_path, monkeypatch):
    from tiny_qwen2 import write_tiny_qwen2
    from transformers import AutoTokenizer

    from specdec.cache import derived_dir
    from specdec.loading.tokenizer import gguf_tokenizer

    model, ready = write_tiny_qwen2(tmp_path / "tiny.gguf", tokenizer=True), tmp_path / "ready"
    env = {"SPECDEC_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    script = f"import sys; sys.argv[1:] = [{model!r}, {str(ready)!r}]\n" + HALF_SAVE
    run_until_killed(script, ready, env)

    monkeypatch.setenv("SPECDEC_CACHE", env["SPECDEC_CACHE"])
    out = derived_dir(model, "tokenizers")
    leftovers = list(out.parent.glob(f".{out.name}.*.tmp"))
    assert not out.exists() and len(leftovers) == 1 and (leftovers[0] / "tokenizer_config.json").is_file()

    from_gguf = []  # the calls that build the tokenizer from the GGUF file (the slow path)
    real = AutoTokenizer.from_pretrained

    def counting(*args, **kwargs):
        if "gguf_file" in kwargs:
            from_gguf.append(kwargs["gguf_file"])
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", counting)
    text = "the cat sat on the mat"
    fresh = real(os.path.dirname(model), gguf_file="tiny.gguf", local_files_only=True)
    rebuilt = gguf_tokenizer(model)
    assert from_gguf == ["tiny.gguf"] and not leftovers[0].exists()
    assert (out / "tokenizer_config.json").is_file()
    cached = gguf_tokenizer(model)
    assert from_gguf == ["tiny.gguf"]  # read from the cache, not rebuilt
    assert rebuilt(text)["input_ids"] == cached(text)["input_ids"] == fresh(text)["input_ids"]


# --- the model assembly ------------------------------------------------------------------------------------

PARTS = [b"GGUF" + bytes(range(256)) * 40, b"second part" * 500, b"tail" * 9]
DATA = b"".join(PARTS)

ASSEMBLE = """
import json, pathlib, sys, time
sys.path.insert(0, sys.argv[1])
from specdec.loading import defaults as zoo

spec, ready, stop_at = zoo.GGUFSpec(**json.loads(sys.argv[2])), pathlib.Path(sys.argv[3]), sys.argv[4]
zoo._CHUNK = 1000  # several writes per part, so that a kill lands inside the file

def stop():
    ready.touch()
    time.sleep(600)

if stop_at == "mid-write":
    real_bar = zoo._progress_bar

    class StoppingBar:
        def __init__(self, *args):
            self.bar, self.written = real_bar(*args), 0
        def __enter__(self):
            self.bar.__enter__()
            return self
        def __exit__(self, *exc):
            return self.bar.__exit__(*exc)
        def update(self, n):
            self.written += n
            if self.written >= 3000:  # three chunks in
                stop()

    zoo._progress_bar = StoppingBar
else:  # renamed into place, killed before the marker that vouches for it is written
    zoo._write_marker = lambda *args: stop()
zoo.ensure_gguf(spec, progress=False)
"""


@pytest.mark.parametrize("stop_at", ["mid-write", "before-marker"])
def test_an_assembly_killed_midway_is_repaired_by_the_next_run(tmp_path, monkeypatch, stop_at):
    from specdec.loading import defaults as zoo

    prefix = f"faultpkg_{stop_at.replace('-', '_')}_part"
    site = tmp_path / "site"
    for i, content in enumerate(PARTS, start=1):
        (site / f"{prefix}{i}").mkdir(parents=True)
        (site / f"{prefix}{i}" / "part.bin").write_bytes(content)
        (site / f"{prefix}{i}" / "__init__.py").write_text(
            "import os\ndef get_part_path():\n    return os.path.join(os.path.dirname(__file__), 'part.bin')\n")
    fields = {"name": "Fault model", "package_prefix": prefix.replace("_", "-"), "num_parts": len(PARTS),
              "size": len(DATA), "sha256": hashlib.sha256(DATA).hexdigest(), "gguf_file": "fault.gguf"}
    spec, ready, cache = zoo.GGUFSpec(**fields), tmp_path / "ready", tmp_path / "cache"
    script = f"import sys; sys.argv[1:] = {[str(site), json.dumps(fields), str(ready), stop_at]!r}\n" + ASSEMBLE
    run_until_killed(script, ready, {"SPECDEC_CACHE": str(cache)})

    final = cache / "fault.gguf"
    if stop_at == "mid-write":
        (tmp,) = cache.glob(".fault.gguf.*.tmp")
        assert not final.exists() and tmp.stat().st_size < len(DATA)  # buffered: what reached the file
    else:
        assert final.read_bytes() == DATA and not (cache / "fault.gguf.sha256").exists()

    monkeypatch.setenv("SPECDEC_CACHE", str(cache))
    monkeypatch.syspath_prepend(str(site))
    hashed = []
    real_hash = zoo._hash_file
    monkeypatch.setattr(zoo, "_hash_file", lambda *args: hashed.append(args[1]) or real_hash(*args))
    try:
        assert zoo.ensure_gguf(spec, progress=False) == final
        assert final.read_bytes() == DATA
        assert sorted(p.name for p in cache.iterdir()) == ["fault.gguf", "fault.gguf.lock", "fault.gguf.sha256"]
        assert zoo.ensure_gguf(spec, progress=False) == final  # then trusted by its marker
    finally:
        for i in range(1, len(PARTS) + 1):
            sys.modules.pop(f"{prefix}{i}", None)
    assert hashed == ([] if stop_at == "mid-write" else [final])  # a file without its marker was verified once
