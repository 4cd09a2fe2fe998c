"""Reading a package without running any of it: ``read_package`` checks every member against the
manifest (names, paths, sizes, hashes) and the versions, and gives the contents; the tensors are
rebuilt from their bytes (no pickle)."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import stat
import zipfile
from dataclasses import dataclass

import torch

from .format import FORMAT, MANIFEST, MAX_MANIFEST_BYTES, MAX_MEMBER_BYTES, PackageError
from .format import _release


# --------------------------------------------------------------------------- reading


@dataclass
class PackageContents:
    """A package's manifest and its members, every one checked against the manifest."""

    path: str
    manifest: dict
    members: dict[str, bytes | memoryview]
    # an uncompressed member (tensor bytes) -> the uint8 tensor holding it and its offset there:
    # the parts of one tensor lie one after another in one buffer
    buffers: dict[str, tuple[torch.Tensor, int]]


def read_package(path: str) -> PackageContents:
    """Read ``path`` and check it (module docstring): every member named by the manifest, inside
    the archive, no link, of the manifest's size and SHA-256.  Raises ``PackageError``."""
    try:
        return _read_package(path)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise PackageError(f"{path}: its manifest is malformed ({type(e).__name__}: {e}); the package is "
                           "refused") from e


def _read_package(path: str) -> PackageContents:
    if not os.path.isfile(path):
        raise PackageError(f"no such package file: {path}")
    try:
        z = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise PackageError(f"{path} is not an fxforge package ({type(e).__name__}: {e})") from e
    with z:
        infos = {}
        for info in z.infolist():
            why = _unsafe(info)
            if why is not None:
                raise PackageError(f"{path}: the member {info.filename!r} {why}; the package is refused")
            if info.filename in infos:
                raise PackageError(f"{path}: the member {info.filename!r} appears twice; the package is refused")
            infos[info.filename] = info
        if MANIFEST not in infos:
            raise PackageError(f"{path} has no {MANIFEST}: it is not an fxforge package")
        manifest = json.loads(_read(z, infos[MANIFEST], MAX_MANIFEST_BYTES, path))
        _check_versions(manifest, path)
        listed = manifest.get("members", {})
        extra = sorted(set(infos) - set(listed) - {MANIFEST})
        missing = sorted(set(listed) - set(infos))
        if extra or missing:
            raise PackageError(f"{path}: members {'not in its manifest: ' + ', '.join(extra) if extra else ''}"
                               f"{'; ' if extra and missing else ''}{'missing: ' + ', '.join(missing) if missing else ''}"
                               "; the package is refused")
        for name, meta in listed.items():
            if infos[name].file_size != meta["size"]:
                raise PackageError(f"{path}: the member {name} is {infos[name].file_size} bytes, its manifest says "
                                   f"{meta['size']}; the package is refused")
        members: dict[str, bytes | memoryview] = {
            name: _read(z, infos[name], int(meta["size"]), path)
            for name, meta in listed.items() if infos[name].compress_type != zipfile.ZIP_STORED}
    # stored members (tensor bytes) are read straight from the file into the buffers the tensors
    # will live in, each part checked by its SHA-256 (not the archive's CRC), side by side
    buffers = _buffers(manifest, listed, infos)
    stored = {name for name in listed if name not in members}
    for name in stored:
        buf, off = buffers[name]
        size = listed[name]["size"]
        members[name] = memoryview((ctypes.c_char * size).from_address(buf.data_ptr() + off)).cast("B") if size \
            else memoryview(bytearray())

    def check(name: str) -> bool:
        if name in stored:
            with open(path, "rb") as raw:
                _read_stored(raw, infos[name], members[name], path)
        return hashlib.sha256(members[name]).hexdigest() == listed[name]["sha256"]

    big = sum(listed[n]["size"] for n in stored) > 1 << 22
    if big:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # hashlib and reads release the GIL
            ok = list(pool.map(check, listed))
    else:
        ok = [check(n) for n in listed]
    bad = [name for name, good in zip(listed, ok) if not good]
    if bad:
        raise PackageError(f"{path}: the member {bad[0]} does not match its SHA-256 in the manifest (damaged or "
                           "altered); the package is refused")
    return PackageContents(path, manifest, members, buffers)


def _unsafe(info: zipfile.ZipInfo) -> str | None:
    name = info.filename
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts or "\\" in name:
        return "has a path leaving the package"
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if info.is_dir():
        return "is a directory"
    if info.file_size > MAX_MEMBER_BYTES:
        return f"is {info.file_size} bytes, over the {MAX_MEMBER_BYTES}-byte limit"
    return None


def _read(z: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, path: str) -> bytes:
    """A member's bytes, refusing one that holds more than ``limit`` bytes (read no further)."""
    if info.file_size > limit:
        raise PackageError(f"{path}: the member {info.filename} is {info.file_size} bytes, more than its manifest "
                           f"says ({limit}); the package is refused")
    with z.open(info) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise PackageError(f"{path}: the member {info.filename} holds more than {limit} bytes; the package is refused")
    return data


def _buffers(manifest: dict, listed: dict, infos: dict) -> dict[str, tuple[torch.Tensor, int]]:
    """Where each uncompressed member is read to: one uint8 buffer per tensor, its parts one
    after another; any other uncompressed member a buffer of its own."""
    out: dict[str, tuple[torch.Tensor, int]] = {}
    groups = [e["members"] for e in manifest.get("tensors", {}).values()]
    stored = {n for n in listed if infos[n].compress_type == zipfile.ZIP_STORED}
    for parts in groups + [[n] for n in sorted(stored)]:
        parts = [p for p in parts if p in stored and p not in out]
        if parts:
            buf = torch.empty(sum(listed[p]["size"] for p in parts), dtype=torch.uint8)
            off = 0
            for p in parts:
                out[p] = (buf, off)
                off += listed[p]["size"]
    return out


def _read_stored(raw, info: zipfile.ZipInfo, into: memoryview, path: str) -> None:
    """An uncompressed member's bytes, read from the archive file at its offset into ``into``."""
    import struct

    raw.seek(info.header_offset)
    head = raw.read(30)
    if len(head) != 30 or head[:4] != b"PK\x03\x04":
        raise PackageError(f"{path}: the member {info.filename} has no valid header; the package is refused")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    raw.seek(info.header_offset + 30 + name_len + extra_len)
    if raw.readinto(into) != info.file_size:
        raise PackageError(f"{path}: the member {info.filename} is truncated; the package is refused")


def _check_versions(manifest: dict, path: str) -> None:
    if manifest.get("format") != FORMAT:
        raise PackageError(f"{path} has package format {manifest.get('format')!r}; this fxforge reads format {FORMAT}: "
                           "package the program again with this fxforge")
    built, here = _release(str(manifest.get("torch"))), _release(torch.__version__)
    if built != here:
        raise PackageError(f"{path} was built with torch {manifest.get('torch')}; this process has torch "
                           f"{torch.__version__}: load it with torch {built}, or package the program again with "
                           f"torch {here}")


def _tensor(pkg: PackageContents, entry: dict) -> torch.Tensor:
    """The tensor a ``_tensor_members`` entry describes, over the bytes ``read_package`` read
    (not copied)."""
    dtype = getattr(torch, entry["dtype"])
    held = pkg.buffers.get(entry["members"][0])
    if held is None or held[1] != 0:
        raise PackageError(f"{pkg.path}: the tensor members {entry['members']} are not laid out as fxforge writes "
                           "them; the package is refused")
    data = held[0][:sum(pkg.manifest["members"][p]["size"] for p in entry["members"])]
    shape, stride = entry["shape"], entry["stride"]
    span = 0 if 0 in shape else 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    size = torch.empty((), dtype=dtype).element_size()
    if span * size > data.numel() or data.numel() % size or min(stride, default=0) < 0:
        raise PackageError(f"{pkg.path}: the tensor in {entry['members'][0]} does not fit its bytes; the package "
                           "is refused")
    t = data.view(dtype).as_strided(shape, stride)
    return t if entry.get("device", "cpu") == "cpu" else t.to(entry["device"])
