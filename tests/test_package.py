"""Packages (``fxforge.package`` / ``fxforge.load_package``): one file, loaded and run with no
compiler, checked member by member."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

import fxforge
from fxforge import InputError, PackageError, load_package, package
from fxforge.packages import MANIFEST, host_cpu_levels


class Block(torch.nn.Module):
    """A residual MLP block with a layer norm, a softmax head and a buffer it counts calls in."""

    def __init__(self, d: int = 48):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)
        self.head = torch.nn.Linear(d, 10)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x, *, temperature: float = 1.0):
        self.calls.add_(1)
        h = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return {"probs": torch.softmax(self.head(h) / temperature, -1), "h": h}


def _program(dynamic: bool = True):
    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(4, 16, 48)
    shapes = ({0: torch.export.Dim("batch", min=1, max=64)},) if dynamic else None
    return m, torch.export.export(m, (x,), dynamic_shapes=shapes)


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    m, ep = _program()
    path = str(tmp_path_factory.mktemp("pkg") / "block.fxpkg")
    package(ep, path)
    return m, ep, path


def _close(got, want):
    torch.testing.assert_close(got["probs"], want["probs"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got["h"], want["h"], rtol=1e-4, atol=1e-5)


def _rewrite(src: str, dst: str, *, manifest=None, members=None, extra=()):
    """A copy of package ``src`` with its manifest edited (``manifest(dict)``), members replaced
    (name -> bytes) and ``extra`` ZipInfo members added."""
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as out:
        for info in z.infolist():
            data = z.read(info)
            if info.filename == MANIFEST and manifest is not None:
                m = json.loads(data)
                manifest(m)
                data = json.dumps(m).encode()
            elif members and info.filename in members:
                data = members[info.filename]
            out.writestr(info.filename, data)
        for info, data in extra:
            out.writestr(info, data)
    return dst


def test_package_holds_every_level_and_matches_eager(packaged):
    m, ep, path = packaged
    f = load_package(path)
    built = f.manifest["c"]["isas"]
    assert built == ["x86-64-v2", "x86-64-v3", "x86-64-v4"] or f.manifest["arch"] != "x86_64"
    assert f.cpu_isa == [i for i in built if i in host_cpu_levels()][-1]
    for batch in (1, 4, 9):  # dynamic batch: one package serves every size in range
        x = torch.randn(batch, 16, 48)
        _close(f(x), m(x))


def test_every_cpu_level_this_machine_runs(packaged):
    m, ep, path = packaged
    levels = [i for i in load_package(path).manifest["c"]["isas"] if i in host_cpu_levels()]
    assert levels, "this machine runs none of the package's levels"
    for isa in levels:
        f = load_package(path, cpu_isa=isa)
        assert f.cpu_isa == isa
        x = torch.randn(3, 16, 48)
        _close(f(x), m(x))


def test_buffer_mutation_and_input_checks(packaged):
    m, ep, path = packaged
    f = load_package(path)
    before = int(f.state["calls"])
    f(torch.randn(2, 16, 48))
    assert int(f.state["calls"]) == before + 1
    with pytest.raises(InputError, match="size\\(2\\) is 47, expected 48"):
        f(torch.randn(2, 16, 47))
    with pytest.raises(InputError, match="dtype"):
        f(torch.randn(2, 16, 48, dtype=torch.float64))
    with pytest.raises(InputError, match="outside the range"):
        f(torch.randn(65, 16, 48))


def test_loads_and_runs_in_a_process_with_no_compiler(packaged, tmp_path):
    m, ep, path = packaged
    x = torch.randn(5, 16, 48)
    torch.save({"x": x, "want": m(x)}, tmp_path / "io.pt")
    cache = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import os, shutil, torch
        assert shutil.which("cc") is None and shutil.which("gcc") is None, "a compiler is reachable"
        import fxforge
        io = torch.load({str(tmp_path / 'io.pt')!r})
        f = fxforge.load_package({path!r})
        got = f(io["x"])
        for k in ("probs", "h"):
            torch.testing.assert_close(got[k], io["want"][k], rtol=1e-4, atol=1e-5)
        assert not os.path.exists(os.path.join({str(cache)!r}, "c")), "something was compiled"
        print("ok", f.cpu_isa)
    """)
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "CC": "/bin/false", "PATH": str(empty), "FXFORGE_CACHE_DIR": str(cache)}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok x86-64") or "ok " in r.stdout


def test_tampered_member_is_refused(packaged, tmp_path):
    _, _, path = packaged
    with zipfile.ZipFile(path) as z:
        so = next(n for n in z.namelist() if n.endswith(".so") and "/unit" in n)
        data = bytearray(z.read(so))
    data[len(data) // 2] ^= 0xFF
    bad = _rewrite(path, str(tmp_path / "bad.fxpkg"), members={so: bytes(data)})
    with pytest.raises(PackageError, match=f"{so} does not match its SHA-256"):
        load_package(bad)
    with zipfile.ZipFile(path) as z:
        source = z.read("wrapper.py")
    evil = b"import os; os.system('true')\n"  # same size as the original: only the hash tells
    wrapper = _rewrite(path, str(tmp_path / "bad2.fxpkg"), members={"wrapper.py": evil + source[len(evil):]})
    with pytest.raises(PackageError, match="wrapper.py does not match"):
        load_package(wrapper)


def test_unsafe_members_are_refused(packaged, tmp_path):
    _, _, path = packaged
    escape = _rewrite(path, str(tmp_path / "escape.fxpkg"), extra=[(zipfile.ZipInfo("../evil.py"), b"x")])
    with pytest.raises(PackageError, match="leaving the package"):
        load_package(escape)
    link = zipfile.ZipInfo("c/link.so")
    link.external_attr = (0o120777 << 16)
    linked = _rewrite(path, str(tmp_path / "link.fxpkg"), extra=[(link, b"/etc/passwd")])
    with pytest.raises(PackageError, match="symbolic link"):
        load_package(linked)
    unlisted = _rewrite(path, str(tmp_path / "unlisted.fxpkg"), extra=[(zipfile.ZipInfo("extra.py"), b"x")])
    with pytest.raises(PackageError, match="not in its manifest: extra.py"):
        load_package(unlisted)

    def shrink(m):  # the manifest says the wrapper is smaller than it is
        m["members"]["wrapper.py"]["size"] = 10

    oversized = _rewrite(path, str(tmp_path / "big.fxpkg"), manifest=shrink)
    with pytest.raises(PackageError, match="wrapper.py is .* bytes, its manifest says 10"):
        load_package(oversized)


def test_wrong_torch_version_and_format_are_clear_errors(packaged, tmp_path):
    _, _, path = packaged
    old = _rewrite(path, str(tmp_path / "old.fxpkg"), manifest=lambda m: m.update(torch="2.9.1+cpu"))
    with pytest.raises(
        PackageError, match=f"built with torch 2.9.1\\+cpu; this process has torch {re.escape(torch.__version__)}"
    ):
        load_package(old)
    future = _rewrite(path, str(tmp_path / "future.fxpkg"), manifest=lambda m: m.update(format=99))
    with pytest.raises(PackageError, match="format 99; this fxforge reads format 1"):
        load_package(future)


def test_no_build_for_this_host_is_a_clear_error(packaged, tmp_path, monkeypatch):
    _, _, path = packaged
    arm = _rewrite(path, str(tmp_path / "arm.fxpkg"), manifest=lambda m: m.update(arch="aarch64"))
    with pytest.raises(PackageError, match="built for aarch64 \\(x86-64-v2, x86-64-v3, x86-64-v4\\); this host is"):
        load_package(arm)
    import fxforge.packages.load as packages  # where load_package reads the host's levels

    monkeypatch.setattr(packages, "host_cpu_levels", lambda: ("x86-64",))
    with pytest.raises(PackageError, match="built for x86-64-v2, x86-64-v3, x86-64-v4; this CPU runs x86-64"):
        load_package(path)
    with pytest.raises(PackageError, match="this CPU cannot run x86-64-v3"):
        load_package(path, cpu_isa="x86-64-v3")


def test_weights_passed_at_load(tmp_path):
    m, ep = _program(dynamic=False)
    path = package(ep, str(tmp_path / "light.fxpkg"), cpu_isas=("x86-64-v2",), weights=False)
    with zipfile.ZipFile(path) as z:
        tensors = json.loads(z.read(MANIFEST))["tensors"]
    assert not [t for t in tensors if t.startswith("weight.")] and "state.calls" not in tensors
    with pytest.raises(PackageError, match="weights=False: pass the parameters"):
        load_package(path)
    other = Block()  # other weights, same shapes: the package computes with what it is given
    f = load_package(path, state_dict=other.state_dict())
    x = torch.randn(4, 16, 48)
    _close(f(x), other(x))
    bad = dict(other.state_dict(), **{"up.weight": torch.randn(3, 3)})
    with pytest.raises(PackageError, match="state_dict\\['up.weight'\\] is \\(3, 3\\)"):
        load_package(path, state_dict=bad)


def test_bad_arguments(tmp_path):
    _, ep = _program(dynamic=False)
    with pytest.raises(PackageError, match="cpu_isas=\\('x86-64-v9',\\)"):
        package(ep, str(tmp_path / "x.fxpkg"), cpu_isas=("x86-64-v9",))
    with pytest.raises(TypeError, match="expects a torch.export.ExportedProgram"):
        package(torch.nn.Linear(2, 2), str(tmp_path / "x.fxpkg"))
    (tmp_path / "junk.fxpkg").write_bytes(b"not a zip")
    with pytest.raises(PackageError, match="is not an fxforge package"):
        load_package(str(tmp_path / "junk.fxpkg"))


def test_a_program_without_c_kernels(tmp_path):
    m, ep = _program(dynamic=False)
    path = package(ep, str(tmp_path / "torch.fxpkg"), fxforge.Config(codegen="torch"))
    f = load_package(path)
    assert f.cpu_isa is None and f.manifest["c"] is None
    x = torch.randn(4, 16, 48)
    _close(f(x), m(x))


def test_cli_package_run_and_report(tmp_path, capsys):
    from fxforge.entry.cli import main

    m, ep = _program()
    torch.export.save(ep, str(tmp_path / "block.pt2"))
    pkg = str(tmp_path / "block.fxpkg")
    assert main(["package", str(tmp_path / "block.pt2"), "-o", pkg, "--cpu-isa", "x86-64-v2"]) == 0
    assert "wrote" in capsys.readouterr().out
    torch.save((torch.randn(3, 16, 48),), tmp_path / "in.pt")
    assert main(["run", pkg, "--inputs", str(tmp_path / "in.pt"), "--calls", "3"]) == 0
    out = capsys.readouterr().out
    assert "output['probs']: (3, 16, 10) float32" in out and "output['h']: (3, 16, 48) float32" in out
    assert "C kernels for x86-64-v2" in out and "median of 3 calls" in out
    html = str(tmp_path / "r.html")
    assert main(["report", pkg, "-o", html]) == 0
    out = capsys.readouterr().out
    assert "c/x86-64-v2/unit0.so" in out and "memory plan:" in out and "x86-64-v2" in out
    assert open(html).read().lstrip().lower().startswith("<!doctype html")
    torch.save((torch.randn(3, 16, 5),), tmp_path / "bad.pt")
    assert main(["run", pkg, "--inputs", str(tmp_path / "bad.pt")]) == 2
    assert "do not fit the package" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "none.fxpkg"), "--inputs", str(tmp_path / "in.pt")]) == 2


def test_triton_kernels_of_a_cpu_program_are_refused_with_the_reason(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _, ep = _program(dynamic=False)
    with pytest.raises(PackageError, match="has triton kernels; packages hold C kernels, Triton kernels of CUDA programs"):
        package(ep, str(tmp_path / "t.fxpkg"), fxforge.Config(codegen="triton"))


class Odd(torch.nn.Module):
    """State a package must keep as it is: a transposed parameter (its strides, not a copy's),
    weights tied to each other, an int64 buffer and an empty one, a bool mask constant."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 24).t())  # (24, 16), strides (1, 24)
        self.emb = torch.nn.Embedding(50, 16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("steps", torch.tensor([3, 4], dtype=torch.int64))
        self.register_buffer("nothing", torch.zeros(0))
        self.register_buffer("mask", torch.rand(24) > 0.5, persistent=False)

    def forward(self, ids, x, n: int):
        h = self.emb(ids) + (x * self.mask) @ self.w
        return self.head(h).softmax(-1) * self.steps.sum() + self.nothing.sum() + n


def test_odd_state_round_trips(tmp_path):
    torch.manual_seed(0)
    m = Odd()
    assert m.w.stride() == (1, 24)
    ids, x = torch.randint(0, 50, (4, 7)), torch.randn(4, 7, 24)
    batch = torch.export.Dim("batch", min=1, max=32)
    ep = torch.export.export(m, (ids, x, 2), dynamic_shapes=({0: batch}, {0: batch}, None))
    path = package(ep, str(tmp_path / "odd.fxpkg"), cpu_isas=("x86-64-v2",))
    f = load_package(path)
    tensors = f.manifest["tensors"]
    assert tensors["weight.w"]["stride"] == [1, 24]
    assert tensors["weight.emb.weight"]["members"] == tensors.get("weight.head.weight", tensors["weight.emb.weight"])["members"]
    assert f.state["w"].stride() == (1, 24) and f.state["steps"].dtype == torch.int64 and f.state["mask"].dtype == torch.bool
    for b in (1, 5):
        ids, x = torch.randint(0, 50, (b, 7)), torch.randn(b, 7, 24)
        torch.testing.assert_close(f(ids, x, 2), m(ids, x, 2))
    with pytest.raises(InputError, match="expected 2"):
        f(ids, x, 3)


def test_triton_kernels_become_cubins_for_sm80_and_sm90_without_a_gpu(monkeypatch):
    """What a CUDA program's package holds for its Triton kernels, built here with no GPU: a cubin
    per architecture with its entry, warps and PTX parameter types (the launch itself needs a
    GPU: test_cuda_package_loads_and_runs_without_a_compiler)."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from fxforge.spine import compile_graph
    from fxforge.packages.write import _cuda_members
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x, y: (x * 2 + y).softmax(-1), tracing_mode="fake")(torch.randn(8, 64), torch.randn(8, 64))
    c = compile_graph(gm, fxforge.Config(codegen="triton"), kind="inference")
    members = {}
    info, names = _cuda_members(c.artifact, (80, 90), members)
    assert info["archs"] == [80, 90] and names == {f"{k.name}_triton" for k in c.kernels if k.backend == "triton"}
    assert names and all(n in c.source for n in names)
    for name, builds in info["kernels"]:
        assert set(builds) == {"80", "90"}
        for arch, b in builds.items():
            data, built_for = members[b["member"]]
            assert data[:4] == b"\x7fELF" and built_for == f"sm_{arch}"
            assert b["num_warps"] >= 1 and all(t in ("u64", "u32", "s32", "s64", "f32", "u8") for t in b["param_types"])


def test_cubin_arguments_are_packed_by_their_ptx_types():
    from fxforge.codegen.triton.cubin import pack

    t = torch.zeros(64)
    values = pack(["u64", "u32", "s64", "f32", "u64", "u64"], (t, 7, -3, 0.5))
    assert [v.value for v in values] == [t.data_ptr(), 7, -3, 0.5, 0, 0]  # Triton's scratch pointers: null
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        pack(["u64"], (t[1:],))
    with pytest.raises(TypeError, match="takes 1 parameters, got 2"):
        pack(["u64"], (t, t))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="launching a package's cubins needs a CUDA GPU")
def test_cuda_package_loads_and_runs_without_a_compiler(tmp_path):
    torch.manual_seed(0)
    m = Block().cuda().eval()
    x = torch.randn(4, 16, 48, device="cuda")
    ep = torch.export.export(m, (x,))
    path = package(ep, str(tmp_path / "gpu.fxpkg"), fxforge.Config(codegen="triton"))
    torch.save({"x": x.cpu(), "want": {k: v.cpu() for k, v in m(x).items()}}, tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import os, torch, fxforge
        io = torch.load({str(tmp_path / 'io.pt')!r})
        f = fxforge.load_package({path!r})
        got = f(io["x"].cuda())
        for k in ("probs", "h"):
            torch.testing.assert_close(got[k].cpu(), io["want"][k], rtol=1e-4, atol=1e-5)
        assert not os.listdir({str(tmp_path / 'triton')!r}), "Triton compiled something"
        print("ok", f.cuda_arch)
    """)
    (tmp_path / "triton").mkdir()
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "CC": "/bin/false", "PATH": str(empty), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "FXFORGE_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok ")


def test_gpu_build_choice(monkeypatch):
    """Which cubins a GPU runs: its own compute capability, else the nearest below within its
    major version; none is a clear error naming the builds (checked without a GPU)."""
    from fxforge.packages.load import _choose_arch

    m = {"device": "cuda:0", "cuda": {"archs": [80, 90]}}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PackageError, match="kernels for sm_80, sm_90\\); this process has no GPU"):
        _choose_arch(m, "p.fxpkg")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for cc, want in (((8, 0), 80), ((8, 6), 80), ((8, 9), 80), ((9, 0), 90)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cc=cc: cc)
        assert _choose_arch(m, "p.fxpkg") == want
    for cc in ((7, 5), (10, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cc=cc: cc)
        with pytest.raises(PackageError, match=f"has kernels for sm_80, sm_90; this GPU is sm_{cc[0]}{cc[1]}"):
            _choose_arch(m, "p.fxpkg")
