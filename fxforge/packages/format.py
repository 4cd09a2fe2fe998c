"""The package format: its version, the manifest's name, the size limits, ``PackageError``, the
CPU levels a package is built for and the host runs, and the versions a package records."""

from __future__ import annotations



from ..infra.host import arch as host_arch, cpu_field



FORMAT = 1
MANIFEST = "manifest.json"
# A member larger than this is refused before it is read (weights of larger models: split them,
# or package with weights=False and pass a state_dict at load).
MAX_MEMBER_BYTES = 64 << 30
MAX_MANIFEST_BYTES = 64 << 20
# A tensor's bytes are split into members of at most this size: their hashes are checked side by side.
PART_BYTES = 8 << 20

# x86-64 micro-architecture levels and the /proc/cpuinfo flags each one adds to the one before.
X86_LEVELS = {
    "x86-64": (),
    "x86-64-v2": ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"),
    "x86-64-v3": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
DEFAULT_CPU_ISAS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")
# Other host architectures: the one level a package builds for by default.
BASELINES = {"aarch64": "armv8-a"}


class PackageError(RuntimeError):
    """A package that cannot be written, or cannot be loaded here: the message says why and what to do."""


# --------------------------------------------------------------------------- CPU levels


def cpu_levels(arch: str) -> tuple[str, ...]:
    """The CPU levels a package can build for on ``arch``, lowest first."""
    if arch == "x86_64":
        return tuple(X86_LEVELS)
    if arch in BASELINES:
        return (BASELINES[arch],)
    return ()


def host_cpu_levels() -> tuple[str, ...]:
    """The levels this CPU runs, lowest first (x86-64: by the flags in /proc/cpuinfo, each level
    needing the ones below it)."""
    arch = host_arch()
    if arch != "x86_64":
        return cpu_levels(arch)
    have = set(cpu_field("flags").split())
    out = []
    for level, needs in X86_LEVELS.items():
        if not set(needs) <= have:
            break
        out.append(level)
    return tuple(out)


def _check_isas(cpu_isas) -> tuple[str, ...]:
    arch = host_arch()
    known = cpu_levels(arch)
    if cpu_isas is None:
        cpu_isas = DEFAULT_CPU_ISAS if arch == "x86_64" else known
    if isinstance(cpu_isas, str):
        cpu_isas = (cpu_isas,)
    if not known:
        raise PackageError(f"fxforge.package: no portable CPU level is known for this host's architecture ({arch}); "
                           "package the program on x86-64 or aarch64")
    bad = [i for i in cpu_isas if i not in known]
    if bad or not cpu_isas:
        raise PackageError(f"fxforge.package: cpu_isas={tuple(cpu_isas)!r}: {', '.join(bad) or 'none given'}; "
                           f"on {arch} the levels are {', '.join(known)}")
    return tuple(sorted(set(cpu_isas), key=known.index))


def _fxforge_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fxforge")
    except PackageNotFoundError:  # (run from a source tree)
        return "unknown"


def _release(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: the release a package's ops and ABI depend on."""
    return version.split("+", 1)[0]
