"""An exported program's calling signature: a call's arguments flattened in its order, where the
caller passes each user input, and ``InputError``, the error a call whose inputs do not match
what was compiled raises (``artifact.inputs`` checks them)."""

from __future__ import annotations


class InputError(RuntimeError):
    """A call's inputs do not match what the graph was compiled for (the compiled code stays
    valid: call it again with matching inputs)."""


def flatten_call(in_spec, args: tuple, kwargs: dict, what: str) -> list:
    """A call's ``(args, kwargs)`` flattened in the order of an exported program's signature
    (``in_spec``: ``ep.call_spec.in_spec``; keyword arguments in the exported order), or
    ``TypeError`` naming what does not match; ``what`` names the callable for the message
    ("compiled program")."""
    import torch.utils._pytree as pytree

    if in_spec is not None and kwargs:
        kw_spec = in_spec.children()[1] if hasattr(in_spec, "children") else in_spec.children_specs[1]
        order = list(kw_spec.context) if kw_spec.context else []
        if set(order) != set(kwargs):
            raise TypeError(f"{what} takes keyword arguments {order}, got {sorted(kwargs)}")
        kwargs = {k: kwargs[k] for k in order}
    flat, spec = pytree.tree_flatten((args, kwargs))
    if in_spec is not None and spec != in_spec:
        raise TypeError(f"inputs do not match the exported program's signature.\nexpected: {in_spec}\ngot:      {spec}")
    return flat


def user_input_paths(in_spec, names: list[str]) -> list[str]:
    """Where the caller passes each of an exported program's user inputs ``names`` (``in_spec``:
    ``ep.call_spec.in_spec``): ``args[0]``, ``kwargs['mask']``..."""
    import torch.utils._pytree as pytree

    paths = [f"args[{i}]" for i in range(len(names))]
    if in_spec is not None and in_spec.num_leaves == len(names):
        tree = pytree.tree_unflatten(list(range(len(names))), in_spec)
        for kp, i in pytree.tree_flatten_with_path(tree)[0]:
            head, rest = kp[0], kp[1:]
            paths[i] = ("args" if getattr(head, "idx", 0) == 0 else "kwargs") + pytree.keystr(rest)
    return paths
