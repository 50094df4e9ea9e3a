"""What a plain loop's source says before it runs: which packages it imports, whether ``import
torch`` binds the name its patch's lines use, and where it is written for DDP."""
from __future__ import annotations

import ast


def imports(tree: ast.AST, package: str) -> bool:
    return any((isinstance(n, ast.Import) and any(a.name.split(".")[0] == package for a in n.names))
               or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == package)
               for n in ast.walk(tree))


def ddp_line(tree: ast.AST) -> int | None:
    """The first line where the script joins a process group (``init_process_group``) or reads
    ``LOCAL_RANK``, as a script written for torchrun does; None where it does neither."""
    lines = [n.lineno for n in ast.walk(tree)
             if (isinstance(n, ast.Call) and "init_process_group" in (
                 n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")))
             or (isinstance(n, ast.Constant) and n.value == "LOCAL_RANK")]
    return min(lines) if lines else None


def imports_torch_name(tree: ast.Module) -> bool:
    """``import torch`` binds ``torch`` (what the patch's lines name)."""
    return any(isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None for a in n.names)
               for n in ast.walk(tree))
