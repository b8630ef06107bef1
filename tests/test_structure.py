"""The package's shape: no module imports another module's private names, no import cycle
among the package's modules (every import that runs counts, inside functions too; a package
module is imported inside a function only when it is one of `LAZY_MODULES`), and no module or
class too long to hold in the head."""

from __future__ import annotations

import ast
from collections.abc import Container, Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rlx_onnx_amp"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlx_onnx_amp"):
                offenders += [
                    f"{name}: from {node.module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.endswith("__")  # a dunder (__version__) is public
                ]
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in {"text", "compare", "cli", "batch", "exits", "stops", "api", "repair", "cost"}:
                    offenders.append(f"{name}: {owner.id}.{node.attr}")
    assert offenders == []


#: A module a maintainer can read through, a class whose methods fit in the head (issue 23).
MAX_MODULE_LINES, MAX_CLASS_LINES = 800, 250


def test_no_module_over_800_lines_and_no_class_over_250() -> None:
    too_long = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(PACKAGE)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                too_long.append(f"{path.relative_to(PACKAGE)}: class {node.name}, {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []


#: Package modules imported inside functions, on purpose: each loads onnxruntime's sessions,
#: matplotlib or Olive, which a conversion without verification, `--help` or `inspect` does
#: not need (and `cli`, which `__main__` imports once its signal handlers are in; `commands`,
#: the commands' work with onnx behind it, which `cli` imports only when a command runs, so that
#: `--help` loads no onnx).
LAZY_MODULES = frozenset({
    "rlx_onnx_amp.cli",
    "rlx_onnx_amp.commands",
    "rlx_onnx_amp.olive",
    "rlx_onnx_amp.repair",
    "rlx_onnx_amp.reports.html",
    "rlx_onnx_amp.sessions",  # onnxruntime: the proof needs it only where onnx.checker refuses a model
    "rlx_onnx_amp.verification",
    "rlx_onnx_amp.verification.core",
    "rlx_onnx_amp.verification.reference",
})


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import a module runs, with whether it is at module level; those under
    `if TYPE_CHECKING:` are left out (they never run)."""
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in typing_only:
            yield node, id(node) in top


def _package_imports(node: ast.Import | ast.ImportFrom, modules: Container[str]) -> set[str]:
    if isinstance(node, ast.ImportFrom):
        if not (node.module or "").startswith("rlx_onnx_amp"):
            return set()
        assert node.module is not None
        return {node.module} | {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
    return {a.name for a in node.names if a.name.startswith("rlx_onnx_amp")}


def import_graph(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the package modules it imports, at module level or inside a function."""
    graph: dict[str, set[str]] = {}
    for name, tree in modules.items():
        deps: set[str] = set()
        for node, _ in _imports(tree):
            deps |= _package_imports(node, modules)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep):], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_import_cycle_in_the_package_counting_imports_inside_functions() -> None:
    # A package's __init__ re-exporting its submodules, which import siblings, is not a cycle
    # of ours unless a submodule imports the package __init__ back.
    assert import_cycles(import_graph(_modules())) == []


def test_the_cycle_check_sees_an_import_inside_a_function() -> None:
    """The check above fails on a circle closed by an import inside a function, the way two
    were hidden before: rewrite.emit importing rewrite.convert (which imports emit) in a method."""
    modules = _modules()
    emit = modules["rlx_onnx_amp.rewrite.emit"]
    hidden = ast.parse("def ensures():\n    from rlx_onnx_amp.rewrite.convert import convert_model\n")
    modules["rlx_onnx_amp.rewrite.emit"] = ast.Module(body=[*emit.body, *hidden.body], type_ignores=[])
    cycles = import_cycles(import_graph(modules))
    assert ["rlx_onnx_amp.rewrite.convert", "rlx_onnx_amp.rewrite.emit", "rlx_onnx_amp.rewrite.convert"] in cycles


def test_package_modules_are_imported_inside_functions_only_when_lazy_on_purpose() -> None:
    modules = _modules()
    lazy = set()
    for name, tree in modules.items():
        for node, at_top in _imports(tree):
            if not at_top:
                lazy |= {f"{name} -> {dep}" for dep in _package_imports(node, modules) if dep not in LAZY_MODULES}
    assert sorted(lazy) == []


def _design_table(after: str) -> list[list[str]]:
    """The rows of the first table after `after` in docs/design.md: the code, then the other
    cells (backticks removed from all but the last, the example)."""
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    section = design[design.index(after) :]
    section = section[: section.index("\n\n", section.index("| code |"))]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.strip().startswith("| `"):
            rows.append([c.replace("`", "") for c in cells[:-1]] + cells[-1:])
    return rows


def test_reason_codes_match_the_design_table() -> None:
    """docs/design.md's table of keep rules is REASON_CODES, in order, with the same words,
    each rule's effect and an example each."""
    from rlx_onnx_amp.rewrite import RULES_BY_CODE
    from rlx_onnx_amp.rewrite.rules import REASON_CODES

    table = _design_table("**Keep rules**")
    for code, text in REASON_CODES.items():
        print(f"{code:26s} {RULES_BY_CODE[code].effect.value:18s} {text}")
    assert [code for code, _, _, _ in table] == list(REASON_CODES)
    assert {code: text for code, _, text, _ in table} == REASON_CODES
    assert {code: effect for code, effect, _, _ in table} == {c: r.effect.value for c, r in RULES_BY_CODE.items()}
    assert all(len(example) > 10 for *_, example in table)


def test_variable_rules_match_the_design_table() -> None:
    """rewrite.VARIABLE_RULES, in order, is docs/design.md's table of variable rules, each
    with its docstring's words (its example in parentheses aside) and an example."""
    import re

    from rlx_onnx_amp.rewrite import VARIABLE_RULES

    table = _design_table("**Variable rules**")
    for rule in VARIABLE_RULES:
        print(f"{rule.code:18s} {rule.check.__doc__}")
    assert [code for code, _, _ in table] == [r.code for r in VARIABLE_RULES]
    for (_, text, example), rule in zip(table, VARIABLE_RULES):
        doc = re.sub(r" \(.*\)", "", (rule.check.__doc__ or "").strip()).rstrip(".")
        assert doc.lower() == text.lower(), rule.code
        assert len(example) > 10


def test_every_rule_has_its_own_code_and_a_one_line_docstring() -> None:
    """rewrite.KEEP_RULES: no two rules share a code (REASON_CODES and RULES_BY_CODE, built
    from it, would silently keep one), and every rule says in one line what it checks."""
    from rlx_onnx_amp.rewrite import KEEP_RULES

    for rule in KEEP_RULES:
        print(f"{rule.code:26s} {rule.effect.value}{', per node' if rule.per_node else ''}: {rule.check.__doc__}")
    codes = [r.code for r in KEEP_RULES]
    assert len(set(codes)) == len(codes)
    assert all(r.check.__doc__ and "\n" not in r.check.__doc__.strip() for r in KEEP_RULES)  # one line each
