"""Three counts over the shipped packages (training/, evidence/, infra/, orchestrate/) of a tree, for #56:

    python bench/code_counts.py [TREE]

- imports inside a function (read from the syntax tree: an `import` or `from … import` whose enclosing
  scope is a function), per package;
- occurrences of `dict[str, Any]` (untyped dicts in signatures and fields);
- occurrences of `netns` (test machinery named in product code), any case.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGES = ("training", "evidence", "infra", "orchestrate")


def function_imports(tree: ast.AST) -> int:
    count = 0

    def walk(node: ast.AST, in_function: bool) -> None:
        nonlocal count
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                count += 1
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    walk(tree, False)
    return count


def main(root: Path) -> None:
    per: dict[str, int] = {}
    dicts = netns = 0
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            src = f.read_text()
            per[pkg] = per.get(pkg, 0) + function_imports(ast.parse(src))
            dicts += src.count("dict[str, Any]")
            netns += len(re.findall("netns", src, re.I))
    print(f"function-level imports {sum(per.values())} {per}; dict[str, Any] {dicts}; netns {netns}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
