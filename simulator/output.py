"""File output: the one place that writes result files, always atomically (temp file + rename),
so an interrupted run never leaves a half-written result behind."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from simulator.errors import ScenarioError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | Path, content: bytes) -> Path:
    """Write `content` to `path` via a temporary file in the same folder and a rename
    (`write_files_atomic` of the one file)."""
    return write_files_atomic({path: content})[0]


def write_files_atomic(files: dict, options: dict | None = None) -> list[Path]:
    """Write several result files all or none: each is first written to a temporary file in its
    folder, then all are renamed over their targets; where any step before the renames fails,
    the temporary files (and the folders made for them) are removed and nothing was replaced. A
    rename failing (rare: each temporary file sits beside its target) keeps the files renamed
    before it, whole, and removes the rest. `files`: path -> bytes; `options`: path -> the option that named it, for the error
    (ScenarioError "--trace x.json: ..."), else the OSError names the path."""
    staged: list[tuple[str, Path]] = []  # (temporary file, its target)
    made: list[Path] = []
    try:
        for path, content in files.items():
            target = _target(Path(path))
            try:
                if target.is_dir() or (target.exists() and not target.is_file()):
                    raise OSError(errno.EISDIR if target.is_dir() else errno.EEXIST,
                                  "is a directory" if target.is_dir() else "exists and is not a regular file")
                made.extend(_missing_folders(target.parent))
                target.parent.mkdir(parents=True, exist_ok=True)
                handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
                staged.append((temporary, target))
                with os.fdopen(handle, "wb") as stream:
                    stream.write(content)
                os.chmod(temporary, 0o666 & ~_umask())  # mkstemp alone would leave it 0600
            except OSError as error:
                option = (options or {}).get(path)
                if option:
                    raise ScenarioError(f"{option} {path}: {error.strerror or error}") from None
                raise OSError(error.errno, error.strerror, str(path)) from None
    except BaseException:
        for temporary, _ in staged:
            Path(temporary).unlink(missing_ok=True)
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
        raise
    for index, (temporary, target) in enumerate(staged):
        try:
            os.replace(temporary, target)
        except OSError as error:  # rare (the temporary file is beside its target): drop the rest
            for rest, _ in staged[index:]:
                Path(rest).unlink(missing_ok=True)
            raise OSError(error.errno, error.strerror, str(target)) from None
    return [target for _, target in staged]


def _missing_folders(folder: Path) -> list[Path]:
    """The folders above and including `folder` that do not exist yet, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def _target(path: Path) -> Path:
    """The file a write to `path` should replace: a symbolic link's target (the link is kept)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, document) -> Path:
    return write_text_atomic(path, json.dumps(document, indent=1) + "\n")


def write_figure_atomic(path: str | Path, figure, **savefig_options) -> Path:
    """Save a matplotlib figure atomically; the format follows the file's suffix."""
    return write_bytes_atomic(path, figure_bytes(path, figure, **savefig_options))


def figure_bytes(path: str | Path, figure, **savefig_options) -> bytes:
    """A matplotlib figure saved in memory, in the format of `path`'s suffix."""
    buffer = io.BytesIO()
    postscript_log = logging.getLogger("matplotlib.backends.backend_ps")
    level = postscript_log.level
    postscript_log.setLevel(logging.ERROR)  # "does not support transparency": the file is fine, drawn opaque
    try:
        figure.savefig(buffer, format=figure_format(path), **savefig_options)
    finally:
        postscript_log.setLevel(level)
    return buffer.getvalue()


def figure_format(path: str | Path) -> str:
    """The image format of `path`: its suffix, lower case (no suffix: png)."""
    return Path(path).suffix.lstrip(".").lower() or "png"


MAX_STEM_CHARS = 200
"""Longest scenario name used as a file name (`file_stem`): room for a suffix within 255 bytes."""


def file_stem(name: str, field: str = "name") -> str:
    """`name` (a scenario's) as the stem of files written inside an output folder; ScenarioError
    naming `field` when it would leave the folder or is no file name (a path separator, '.' or
    '..', empty, NUL, or longer than `MAX_STEM_CHARS` bytes)."""
    if (not name or name in (".", "..") or any(char in name for char in "/\\\0")
            or len(name.encode("utf-8", "surrogatepass")) > MAX_STEM_CHARS):
        raise ScenarioError(f"{field}: {name[:80]!r} names the result files, so it must be a file name: no '/' or "
                            f"'\\', not '.' or '..', at most {MAX_STEM_CHARS} bytes")
    return name


def check_output_file(path: str | Path, option: str) -> None:
    """ScenarioError naming `option` unless `path` can be written as a file: a name, not a folder nor
    a device, FIFO or socket (a write replaces the file by a rename), and no existing part of its
    folder is a file. A symbolic link is checked, and later written, as its target."""
    if str(path) == "":
        raise ScenarioError(f"{option}: needs a file name (got '')")
    if str(path).endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)):
        raise ScenarioError(f"{option} {path}: ends with a path separator (a folder), where one file is written")
    given, path = path, _target(Path(path))
    if path.is_dir():
        raise ScenarioError(f"{option} {path}: is a directory")
    if path.exists() and not path.is_file():
        raise ScenarioError(f"{option} {path}: exists and is not a regular file (a device, FIFO or socket)")
    if path.is_file():
        _check_replaceable(path, option)
    _check_parents(path, option)
    _check_writable(path.parent, option, given)


def _check_replaceable(path: Path, option: str) -> None:
    """ScenarioError naming `option` when an existing file may not be replaced whoever asks: an
    immutable or append-only file (EPERM on opening it for writing; nothing is written). A file
    only its mode protects (EACCES) is replaced by the rename, as the folder allows."""
    try:
        os.close(os.open(path, os.O_WRONLY))
    except PermissionError as error:
        if error.errno == errno.EPERM:
            raise ScenarioError(f"{option} {path}: cannot be replaced ({error.strerror})") from None
    except OSError:
        pass  # anything else shows when the file is written


def same_file(first: str | Path, second: str | Path) -> bool:
    """Whether two paths name one file: equal resolved paths (links followed), or, when both
    exist, `os.path.samefile` (a hard link or another mount of the same file)."""
    if os.path.realpath(first) == os.path.realpath(second):
        return True
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them does not exist (yet)
        return False


def check_distinct_files(outputs: dict, inputs: dict | None = None) -> None:
    """ScenarioError naming both when an output file (`outputs`: option -> path, None if not given)
    is an input file (`inputs`: its option or name -> path) or another output's file (`same_file`):
    the write would replace the input, or one output the other. Call it before anything is written."""
    given = [(option, path) for option, path in outputs.items() if path]
    sources = [(name, path) for name, path in (inputs or {}).items() if path]
    for index, (option, path) in enumerate(given):
        for name, source in sources:
            if same_file(path, source):
                raise ScenarioError(f"{option} {path}: the same file as {name} {source}; it would be overwritten")
        for other, earlier in given[:index]:
            if same_file(path, earlier):
                raise ScenarioError(f"{option} {path}: the same file as {other} {earlier}; each output needs its "
                                    "own file")


def model_files(scenario) -> dict:
    """The files a scenario's model is read from (`model.file`, `model.hf_config`), by key: inputs
    for `check_distinct_files`."""
    model = scenario.model
    return {f"model.{key}": Path(scenario.base_dir) / getattr(model, key)
            for key in ("file", "hf_config") if getattr(model, key)}


def check_output_folder(path: str | Path, option: str) -> None:
    """ScenarioError naming `option` unless `path` is (or can be made) a folder; '' is no name (it
    would write into the current folder)."""
    if str(path) == "":
        raise ScenarioError(f"{option}: needs a folder name (got '')")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ScenarioError(f"{option} {path}: exists and is not a directory")
    _check_parents(path, option)
    _check_writable(path, option, path)


def _check_parents(path: Path, option: str) -> None:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ScenarioError(f"{option} {path}: {parent} is not a directory")
            return


def _check_writable(folder: Path, option: str, given: str | Path) -> None:
    """ScenarioError naming `option` and the path the user gave unless a write into `folder` can
    start: a file made in it where it exists, else a folder made in its nearest existing folder
    (the first step of `write_files_atomic`). A probe, made and removed at once, asks the file
    system itself: /proc passes `os.access` but takes nothing new, and root passes every
    `os.access`. So an output that cannot be written is refused before any work, not after."""
    place = next((folder for folder in (folder, *folder.parents) if folder.is_dir()), None)
    if place is None:
        return  # nothing exists above it: `_check_parents` or the write itself says why
    probe = place / f".ghpsim.{os.getpid()}.{secrets.token_hex(4)}.probe"
    try:
        if place == folder:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
        else:
            probe.mkdir()
            probe.rmdir()
    except OSError as error:
        what = "a file" if place == folder else "a folder"
        raise ScenarioError(f"{option} {given}: cannot make {what} in {place} ({error.strerror or error})") from None


def check_figure_file(path: str | Path, option: str) -> None:
    """`check_output_file`, and ScenarioError unless matplotlib can write the suffix's format here
    (pgf only where the TeX program of matplotlib's `pgf.texsystem` is installed)."""
    import matplotlib  # only when a figure is asked for
    from matplotlib.backend_bases import FigureCanvasBase
    supported = set(FigureCanvasBase.get_supported_filetypes())
    tex = matplotlib.rcParams["pgf.texsystem"]
    if shutil.which(tex) is None:
        supported.discard("pgf")
        if figure_format(path) == "pgf":
            raise ScenarioError(f"{option} {path}: format 'pgf' needs {tex}, which is not installed")
    if figure_format(path) not in supported:
        raise ScenarioError(f"{option} {path}: format {figure_format(path)!r} is not supported "
                            f"(use one of {', '.join(sorted(supported))})")
    check_output_file(path, option)
