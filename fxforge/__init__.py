"""fxforge: FX-based graph-transformation compiler passes for PyTorch.

Public API:
    torch.compile(model, backend="fxforge")           # entry point, default Config
    fxforge.backend(fxforge.Config(...))              # a backend whose .compiled lists every graph
    fxforge.compile_exported(ep, fxforge.Config())    # torch.export programs
    fxforge.apply_passes(ep_or_gm, [pass1, pass2])    # run passes by hand, verified in debug mode
    fxforge.partition(ep, mesh, {"fc1.weight": [Shard(0)]})  # this rank's part of a program (DTensor placements)
    fxforge.register_backend(CodegenBackend(...))     # plug in a codegen backend
    fxforge.register_out_variant(op, out_op)          # an out form living in another packet
    fxforge.register_custom_op_autotuning(op, [fxforge.CustomOpConfig(impl)])  # custom ops: fastest correct impl
    fxforge.package(ep, "model.fxpkg")                # compile once into one deployable file
    fxforge.load_package("model.fxpkg")               # run it: no compiler, no tracing
"""

from .entry.dynamo import Backend, backend
from .codegen.api import CodegenBackend, Kernel, KernelContext
from .codegen.registry import register_backend
from .artifact.compiled import Compiled, GeneratedCodeError, KernelInfo
from .core.config import Config
from .entry.export import apply_passes, compile_exported
from .artifact.inputs import InputError
from .custom_ops import CustomOpConfig, register_custom_op_autotuning
from .lowering.out_variant import register_out_variant
from .packages import PackageError, load_package, package
from .entry.spmd import Partitioned, partition
from .infra.pass_manager import PassError, PassManager, PassResult, verify_graph
from .passes.memory_budget import MemoryBudgetError

__all__ = [
    "Backend",
    "CodegenBackend",
    "Compiled",
    "Config",
    "CustomOpConfig",
    "GeneratedCodeError",
    "InputError",
    "Kernel",
    "KernelContext",
    "KernelInfo",
    "MemoryBudgetError",
    "PackageError",
    "PassError",
    "PassManager",
    "PassResult",
    "Partitioned",
    "apply_passes",
    "backend",
    "compile_exported",
    "load_package",
    "package",
    "partition",
    "register_backend",
    "register_custom_op_autotuning",
    "register_out_variant",
    "verify_graph",
]
__version__ = "0.1.0"

from .infra.moved import install as _install_moved  # noqa: E402

_install_moved()  # the old import paths of moved modules (fxforge.graph, fxforge.backend, ...)
