"""The code's layers, read from its imports (docs/development.md, "Layout").

Every ``.py`` file of the product packages is parsed with `ast` and every import it makes
is an edge: at module level, inside functions and under ``if TYPE_CHECKING`` alike, since
a function-local import still ties the two modules together, and ``importlib`` calls that
name their module in the text (`_dynamic_import`). The graph must have

* no cycle (two modules that import each other, directly or around a longer ring);
* no cycle between packages either (`package_graph`: every module counts as its package,
  but a module directly in a package that has subpackages, like `common.errors` or
  `ppre.columns`, is a layer of its own): `common.stats` and `common.metrics` may not use
  each other, even through modules that do not import each other;
* `common/` importing no party and not the CLI (`tester_service`, `client_service`, `ppre`);
* the parties importing not each other (`tester_service` <-> `client_service`), and the
  Tester's demographics importing only `common` and themselves;
* `common.crypto` (the hazmat fence: Paillier, the curve, AEAD, masking, fixed-point
  encoding) importing nothing of ours but `common.errors` and itself;
* `common.execution` (the executors and the process hardening) importing nothing of ours
  but `common.errors` and itself: an executor runs whatever task it is handed;
* `common.stats` (bootstrap, correction, second moments, quantiles, intervals, verdicts,
  results) importing nothing of ours but `common.errors`, itself and the generated
  `proto.ppre_pb2` envelope: no metric (the metrics use the statistics), protocol message
  layer, session, network, executor, cryptography or party;
* `common.net` (channels, TLS, peer streams, admission) importing nothing of ours but
  `common.errors`, itself, the message layer `common.protocol` and `proto.ppre_pb2`: no
  statistics, metrics, cryptography, executor or party;
* `common.protocol` (wire, validation, session: the message layer) importing nothing of
  ours but `common.errors`, itself, `common.logs`, the cryptography, the metrics, the
  statistics and `proto.ppre_pb2`: never the network that carries its messages, an
  executor, the tables reader or a party;
* no Tester-only module in `common/` (BISG, census names, clipping, randomized response
  live in `tester_service/demographics/`).

And no module imports a private name (``from a.b import _x``, `_x` not a dunder) of
another module of ours (`private_imports`): a name that other modules need is public
where it is defined. The tests are exempt: a test may pin a private step's behaviour
through the step itself (a white-box check that breaks only the test when the step
changes, which is what it is for), and no product module imports a test.

The checks are plain functions over a graph, so the tests below also feed them graphs
with a breach and show they report it.
"""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "tester_service", "client_service", "ppre", "proto")

#: (importer prefix, imported prefix): imports that break the layering
FORBIDDEN = (
    ("common", "tester_service"), ("common", "client_service"), ("common", "ppre"),
    ("tester_service", "client_service"), ("client_service", "tester_service"),
)
#: packages whose imports are confined: {package: the project packages it may import}
CONFINED = {"tester_service.demographics": ("common", "tester_service.demographics"),
            "common.crypto": ("common.errors", "common.crypto"),
            "common.execution": ("common.errors", "common.execution"),
            "common.stats": ("common.errors", "common.stats", "proto.ppre_pb2"),
            "common.net": ("common.errors", "common.net", "common.protocol", "proto.ppre_pb2"),
            "common.protocol": ("common.errors", "common.protocol", "common.logs", "common.crypto",
                                "common.metrics", "common.stats", "proto.ppre_pb2")}
#: module names that only the Tester runs: they may not sit in common/
TESTER_ONLY = ("bisg", "census_names", "clipping", "randomized_response")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module an ``from X import ...`` names (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, importer: str, modules: set[str]) -> set[str]:
    """The project modules `path` imports anywhere in its body (``from P import m`` names
    the module ``P.m`` when it is one, else the package ``P``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, importer, path.name == "__init__.py")
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        elif isinstance(node, ast.Call):
            names = _dynamic_import(node, modules)
        else:
            continue
        out.update(_nearest_module(name, modules) for name in names)
    out.discard(None)
    out.discard(importer)
    return out


def _dynamic_import(call: ast.Call, modules: set[str]) -> list[str]:
    """``importlib.import_module("a.b")``: the module; ``import_module(f"a.b.{name}")``:
    every module under ``a.b.`` (a registry loading its members). A name held in a
    variable is not followed."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called != "import_module" or not call.args:
        return []
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)
        return sorted(m for m in modules if m.startswith(prefix) and m != prefix.rstrip("."))
    return []


def _nearest_module(name: str, modules: set[str]) -> str | None:
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the project modules it imports} over `PACKAGES` under `root`."""
    files = {module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))
             if "__pycache__" not in p.parts}
    modules = set(files)
    return {name: imports_of(path, name, modules) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted:
    every import cycle lies within one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import that crosses a `FORBIDDEN` boundary or leaves a `CONFINED` package's
    allowance, as ``importer -> imported``."""
    crossing = {f"{a} -> {b}" for a, targets in graph.items() for b in targets
                for low, high in FORBIDDEN if _under(a, low) and _under(b, high)}
    confined = {f"{a} -> {b}" for a, targets in graph.items() for b in targets
                for package, allowed in CONFINED.items()
                if _under(a, package) and not any(_under(b, ok) for ok in allowed)}
    return sorted(crossing | confined)


def party_modules_in_common(graph: dict[str, set[str]]) -> list[str]:
    return sorted(m for m in graph if _under(m, "common") and m.rsplit(".", 1)[-1] in TESTER_ONLY)


def package_of(module: str, packages: set[str]) -> str:
    """The node of the package-level graph that `module` belongs to: a package itself; a
    module in a package without subpackages, that package; a module directly in a
    package with subpackages (`common.errors`, `common.tables`, `ppre.columns`), itself:
    such a package is a set of layers, each of one module or one subpackage."""
    if module in packages or "." not in module:
        return module
    parent = module.rsplit(".", 1)[0]
    return module if any(p.startswith(parent + ".") for p in packages) else parent


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """{package: the packages its modules import} (`package_of`), from the module graph; a
    package is a module some other module lies under."""
    packages = {m for m in graph if any(other.startswith(m + ".") for other in graph)}
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        pa = package_of(a, packages)
        out.setdefault(pa, set()).update(pb for pb in (package_of(b, packages) for b in targets) if pb != pa)
    return out


def name_imports(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(importer, module, name) for every ``from module import name`` of a project module
    in `PACKAGES` under `root`, anywhere in its body (relative levels resolved)."""
    files = {module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))
             if "__pycache__" not in p.parts}
    out = []
    for importer, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(node, importer, path.name == "__init__.py")
                if base.split(".")[0] in PACKAGES:
                    out.extend((importer, base, alias.name) for alias in node.names)
    return out


def private_imports(imports: list[tuple[str, str, str]]) -> list[str]:
    """Every private name (one leading underscore, not a dunder) a module imports from
    another module, as ``importer -> module._name``."""
    return sorted({f"{importer} -> {module}.{name}" for importer, module, name in imports
                   if name.startswith("_") and not name.startswith("__") and module != importer})


# --------------------------------------------------------------------------------------
# The tree as it is
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_sees_the_imports_the_code_makes(graph):
    # module level, function-local and relative imports all count
    assert "common.errors" in graph["common.tables"]
    assert "tester_service.demographics.bisg" in graph["tester_service.demographics.census_names"] \
        or "tester_service.demographics.census_names" in graph["tester_service.demographics.bisg"]
    assert "tester_service.server" in graph["ppre.commands.tester"]  # imported inside `run`
    assert "common.metrics.ero" in graph["common.metrics"]  # importlib.import_module(f"common.metrics.{m}")
    assert "common.crypto.encoding" in graph["common.crypto.paillier"]  # imported inside a method
    assert "common.errors" in graph["common.crypto.paillier"]
    assert "common.execution.memory" in graph["common.execution.parallel"]  # inside a function
    assert "common.stats.quantiles" in graph["common.stats.intervals"]
    assert "common.stats.correction" in graph["common.stats.moments"]
    assert "common.stats.correction" in graph["common.metrics.auc_placements"]  # inside a function
    assert {"common.net.tls", "common.protocol.wire"} <= graph["common.net.channels"]
    assert "common.protocol.session" in graph["common.protocol.validation"]
    assert len(graph) > 60


def test_no_import_cycle(graph):
    assert cycles(graph) == [], "modules that import each other (directly or in a ring)"


def test_no_import_cycle_between_packages(graph):
    assert cycles(package_graph(graph)) == [], "packages that import each other (directly or in a ring)"


def test_no_private_name_is_imported_from_another_module():
    assert private_imports(name_imports()) == []


def test_common_imports_no_party_and_the_parties_not_each_other(graph):
    assert breaches(graph) == []


def test_common_holds_no_tester_only_module(graph):
    assert party_modules_in_common(graph) == []


# --------------------------------------------------------------------------------------
# The checks report a breach
# --------------------------------------------------------------------------------------
def test_cycles_are_found_direct_and_in_a_ring():
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c", "f"}, "f": set(), "g": {"g"}}
    assert cycles(graph) == [["a", "b"], ["c", "d", "e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_breaches_are_found():
    graph = {"common.tables": {"ppre.config"}, "tester_service.server": {"client_service.results"},
             "client_service.server": {"common.tables"}, "ppre.cli": {"tester_service.server"},
             "tester_service.demographics.bisg": {"common.tables", "tester_service.demographics.census_names",
                                                  "tester_service.release"}}
    assert breaches(graph) == ["common.tables -> ppre.config",
                               "tester_service.demographics.bisg -> tester_service.release",
                               "tester_service.server -> client_service.results"]
    assert party_modules_in_common({"common.bisg": set(), "tester_service.demographics.bisg": set()}) \
        == ["common.bisg"]


def test_the_crypto_fence_admits_only_errors_and_itself():
    graph = {"common.crypto.paillier": {"common.errors", "common.crypto.encoding"},
             "common.crypto.masking": {"common.execution.parallel"},
             "common.crypto.symmetric": {"common.metrics.base", "common.crypto.commutative"},
             "common.crypto": set(), "common.metrics.base": {"common.crypto.paillier"}}
    assert breaches(graph) == ["common.crypto.masking -> common.execution.parallel",
                               "common.crypto.symmetric -> common.metrics.base"]


def test_a_crypto_import_of_the_executor_in_a_copy_of_the_tree_is_found(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    masking = tmp_path / "common" / "crypto" / "masking.py"
    masking.write_text(masking.read_text(encoding="utf-8")
                       + "\n\ndef _late():\n    from common.execution import parallel  # noqa\n    return parallel\n",
                       encoding="utf-8")
    assert "common.crypto.masking -> common.execution.parallel" in breaches(import_graph(tmp_path))


def test_a_function_local_import_cycle_in_a_copy_of_the_tree_is_found(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    assert cycles(import_graph(tmp_path)) == []
    errors = tmp_path / "common" / "errors.py"
    errors.write_text(errors.read_text(encoding="utf-8")
                      + "\n\ndef _late():\n    from .tables import ID_COLUMN  # noqa\n    return ID_COLUMN\n",
                      encoding="utf-8")
    graph = import_graph(tmp_path)
    assert "common.tables" in graph["common.errors"]
    assert any({"common.errors", "common.tables"} <= set(c) for c in cycles(graph))


def test_the_executors_admit_only_errors_and_themselves():
    graph = {"common.execution.executors": {"common.execution.dask_executor", "common.errors"},
             "common.execution.parallel": {"common.crypto.paillier", "common.execution.memory"},
             "common.execution.dask_executor": {"common.metrics.base"},
             "common.execution": set(), "tester_service.server": {"common.execution.parallel"}}
    assert breaches(graph) == ["common.execution.dask_executor -> common.metrics.base",
                               "common.execution.parallel -> common.crypto.paillier"]


def test_the_statistics_import_no_metric_protocol_executor_crypto_or_party():
    allowed = {"common.errors", "common.stats.correction", "proto.ppre_pb2"}
    graph = {"common.stats.results": set(allowed), "common.stats.intervals": {"common.metrics.scoring"},
             "common.stats.moments": {"common.stats.correction", "common.protocol.wire"},
             "common.stats.correction": {"common.protocol.validation", "common.net.channels"},
             "common.stats.bootstrap": {"common.execution.parallel", "common.crypto.paillier"},
             "common.stats": {"tester_service.protocol", "common.metrics.base", "proto.ppre_pb2_grpc"},
             "common.metrics.base": {"common.stats.correction"}}
    assert breaches(graph) == ["common.stats -> common.metrics.base",
                               "common.stats -> proto.ppre_pb2_grpc",
                               "common.stats -> tester_service.protocol",
                               "common.stats.bootstrap -> common.crypto.paillier",
                               "common.stats.bootstrap -> common.execution.parallel",
                               "common.stats.correction -> common.net.channels",
                               "common.stats.correction -> common.protocol.validation",
                               "common.stats.intervals -> common.metrics.scoring",
                               "common.stats.moments -> common.protocol.wire"]


def test_cycles_between_packages_are_found_where_no_modules_make_one():
    graph = {"common.stats.intervals": {"common.metrics.scoring", "common.errors"},
             "common.stats.results": {"common.stats.intervals"}, "common.stats": set(),
             "common.metrics.scoring": {"common.errors", "common.tables"},
             "common.metrics.pot": {"common.stats.results"}, "common.metrics": {"common.metrics.pot"},
             "common.errors": set(), "common.tables": {"common.errors"}, "common": set(),
             "ppre.columns": {"ppre.flags"}, "ppre.flags": set(), "ppre.commands": {"ppre.columns"},
             "ppre.commands.client": {"ppre.commands", "ppre.columns"}, "ppre.commands.runs": set(),
             "ppre.cli": {"ppre.commands.client"}, "ppre": set()}
    assert cycles(graph) == []
    assert package_graph(graph)["common.stats"] == {"common.metrics", "common.errors"}
    assert package_graph(graph)["common.tables"] == {"common.errors"}  # a layer of its own in `common`
    assert cycles(package_graph(graph)) == [["common.metrics", "common.stats"]]
    # a module directly in `ppre` that imports a command, when other commands import it
    graph["ppre.columns"] = {"ppre.commands.runs"}
    assert cycles(graph) == [] and cycles(package_graph(graph)) == [
        ["common.metrics", "common.stats"], ["ppre.columns", "ppre.commands"]]


def test_a_metric_import_in_the_statistics_of_a_copy_of_the_tree_is_found(tmp_path):
    root = _copy_of_the_tree(tmp_path)
    assert cycles(package_graph(import_graph(root))) == []
    intervals = root / "common" / "stats" / "intervals.py"
    intervals.write_text(intervals.read_text(encoding="utf-8")
                         + "\n\ndef _late():\n    from common.metrics.scoring import dense_score_rank  # noqa\n"
                           "    return dense_score_rank\n", encoding="utf-8")
    graph = import_graph(root)
    assert cycles(graph) == []  # scoring imports no statistics: no two modules import each other
    assert any({"common.metrics", "common.stats"} <= set(c) for c in cycles(package_graph(graph)))
    assert "common.stats.intervals -> common.metrics.scoring" in breaches(graph)


def test_private_imports_are_found():
    imports = [("ppre.columns", "ppre.commands", "_Names"), ("ppre.config.tester", "ppre.config.check", "_size"),
               ("ppre.columns", "ppre.flags", "RepeatedNames"), ("common.metrics", "common.metrics", "_load"),
               ("common.stats.results", "common.stats", "__doc__"), ("ppre.cli", "ppre", "__version__")]
    assert private_imports(imports) == ["ppre.columns -> ppre.commands._Names",
                                        "ppre.config.tester -> ppre.config.check._size"]


def test_a_private_import_in_a_copy_of_the_tree_is_found_relative_and_function_local(tmp_path):
    root = _copy_of_the_tree(tmp_path)
    assert private_imports(name_imports(root)) == []
    results = root / "common" / "stats" / "results.py"
    results.write_text(results.read_text(encoding="utf-8")
                       + "\n\ndef _late():\n    from .verdict import _detectable  # noqa\n    return _detectable\n",
                       encoding="utf-8")
    columns = root / "ppre" / "columns.py"
    columns.write_text(columns.read_text(encoding="utf-8") + "\nfrom ppre.report.model import _noisy  # noqa\n",
                       encoding="utf-8")
    assert private_imports(name_imports(root)) == ["common.stats.results -> common.stats.verdict._detectable",
                                                   "ppre.columns -> ppre.report.model._noisy"]


def _copy_of_the_tree(tmp_path: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tmp_path


def test_a_protocol_import_in_the_statistics_and_a_reader_import_in_an_executor_are_found(tmp_path):
    root = _copy_of_the_tree(tmp_path)
    late = "\n\ndef _late():\n    from {0} import {1}  # noqa\n    return {1}\n"
    for path, package, name in ((root / "common" / "stats" / "results.py", "common.protocol", "wire"),
                                (root / "common" / "execution" / "memory.py", "common", "errors"),
                                (root / "common" / "execution" / "parallel.py", "common", "tables")):
        path.write_text(path.read_text(encoding="utf-8") + late.format(package, name), encoding="utf-8")
    found = breaches(import_graph(root))
    assert found == ["common.execution.parallel -> common.tables", "common.stats.results -> common.protocol.wire"]


def test_the_network_sits_on_the_message_layer_and_neither_reaches_further():
    graph = {"common.net.channels": {"common.net.tls", "common.protocol.wire", "common.errors"},
             "common.net.peer_stream": {"common.protocol.validation", "proto.ppre_pb2", "common.stats.results"},
             "common.net.tls": {"common.crypto.symmetric", "common.metrics.base"},
             "common.net.admission": {"common.execution.parallel", "tester_service.server"},
             "common.protocol.validation": {"common.protocol.wire", "common.protocol.session", "common.logs",
                                            "common.crypto.paillier", "common.metrics", "common.stats.correction",
                                            "proto.ppre_pb2"},
             "common.protocol.wire": {"common.net.channels", "proto.ppre_pb2_grpc"},
             "common.protocol.session": {"common.execution.parallel", "common.tables"},
             "common.crypto.paillier": {"common.net.tls"},
             "tester_service.server": {"common.net.channels", "common.protocol.validation"}}
    assert breaches(graph) == ["common.crypto.paillier -> common.net.tls",
                               "common.net.admission -> common.execution.parallel",
                               "common.net.admission -> tester_service.server",
                               "common.net.peer_stream -> common.stats.results",
                               "common.net.tls -> common.crypto.symmetric",
                               "common.net.tls -> common.metrics.base",
                               "common.protocol.session -> common.execution.parallel",
                               "common.protocol.session -> common.tables",
                               "common.protocol.wire -> common.net.channels",
                               "common.protocol.wire -> proto.ppre_pb2_grpc"]


def test_a_network_import_in_the_message_layer_of_a_copy_of_the_tree_is_found(tmp_path):
    root = _copy_of_the_tree(tmp_path)
    validation = root / "common" / "protocol" / "validation.py"
    validation.write_text(validation.read_text(encoding="utf-8")
                          + "\n\ndef _late():\n    from common.net import channels  # noqa\n    return channels\n",
                          encoding="utf-8")
    assert breaches(import_graph(root)) == ["common.protocol.validation -> common.net.channels"]


#: the modules whose top-level functions the parties send to their worker processes in
#: every audit (LOT's blind path adds `*.blind_pairs`, which read its slot plan from
#: `common.metrics.lot`)
WORKER_TASK_MODULES = ("tester_service.join", "tester_service.aggregation", "common.crypto.commutative",
                       "common.crypto.paillier")


@pytest.mark.parametrize("module", WORKER_TASK_MODULES)
def test_a_worker_task_imports_no_metric_catalogue_no_pandas_and_no_protocol(module):
    """A worker process imports the module of each task it is sent; the modules of the
    parties' tasks stay clear of the metric catalogue, pandas and the session protocols,
    which cost a small audit's worker most of its first second (bench/RESULTS.md, "A
    small audit from a fresh process")."""
    import subprocess
    import sys
    heavy = ("pandas", "common.metrics", "tester_service.protocol", "client_service.protocol", "grpc")
    probe = (f"import sys, {module}; "
             f"print(','.join(m for m in sys.modules if m.split('.')[0] in {heavy!r} or m in {heavy!r}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
