"""File output: the one place that writes result files, always atomically (temp file + rename),
so an interrupted run never leaves a half-written result behind."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | Path, content: bytes) -> Path:
    """Write `content` to `path` via a temporary file in the same folder and a rename; the file
    gets the usual 0666 & ~umask permissions (mkstemp alone would leave it 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(content)
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, document) -> Path:
    return write_text_atomic(path, json.dumps(document, indent=1) + "\n")


def write_figure_atomic(path: str | Path, figure, **savefig_options) -> Path:
    """Save a matplotlib figure atomically; the format follows the file's suffix."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **savefig_options)
    return write_bytes_atomic(path, buffer.getvalue())
