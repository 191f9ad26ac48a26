"""Imports vLLM modules from its released wheel without running vLLM's package init.

`WheelImporter` is a `sys.meta_path` finder for the `vllm` package (and `torch`, which
vLLM's scheduling modules name only in annotations and isinstance checks). Each module
it is asked for is one of four kinds, chosen by the caller:

- verbatim: the wheel's own source file, executed unchanged as that module;
- partial (`Partial`): the wheel's source file with some top-level statements left out
  (imports of heavy packages, or definitions that need them), or only chosen
  definitions of it, executed unchanged after a prelude that puts the names the kept
  code needs in its globals;
- stand-in: a module built by a Python function of standins.py;
- package: an empty package (its `__init__.py` is not run), so that its children load.

Anything else under `vllm` raises ImportError naming the module and the importer that
asked for it, so a new vLLM import fails loudly instead of reading a stand-in.
"""

import ast
import importlib.abc
import importlib.machinery
import sys
import types
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


class WheelImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Loads `vllm.*` (and `torch.*`) modules as described in the module docstring.

    `verbatim`: module names run from the wheel's source. `partial`: module name ->
    `Partial`. `standins`:
    module name -> function(module) that fills it. Roots are `vllm` and `torch`.
    """

    ROOTS = ("vllm", "torch")

    def __init__(
        self,
        wheel: str,
        verbatim: Sequence[str],
        partial: Mapping[str, "Partial"],
        standins: Mapping[str, Callable[[types.ModuleType], None]],
    ):
        self.wheel = wheel
        self.zip = zipfile.ZipFile(wheel)
        self.files = set(self.zip.namelist())
        self.verbatim = set(verbatim)
        self.partial = dict(partial)
        self.standins = dict(standins)
        self.loaded: list[tuple[str, str]] = []  # (module, kind), in load order

    # importlib protocol ---------------------------------------------------------
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.ROOTS:
            return None
        is_pkg = f"{fullname.replace('.', '/')}/__init__.py" in self.files
        if fullname in self.standins:
            kind = "stand-in"
            is_pkg = is_pkg or any(s.startswith(fullname + ".") for s in self.standins)
        elif fullname in self.partial:
            kind = "partial"
        elif fullname in self.verbatim:
            kind = "verbatim"
        elif is_pkg or fullname in self.ROOTS:
            kind = "package"
            is_pkg = True
        else:
            raise ImportError(
                f"vLLM module {fullname} (imported by {_importer()}) is neither taken from "
                "the wheel nor stood in: add it to VERBATIM, PARTIAL or STANDINS in "
                "scripts/vllm/fidelity/vllm_core.py",
                name=fullname,
            )
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=is_pkg)
        spec.loader_state = kind
        if is_pkg:
            spec.submodule_search_locations = []
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        kind = module.__spec__.loader_state
        self.loaded.append((name, kind))
        if kind == "stand-in":
            self.standins[name](module)
        elif kind == "verbatim":
            path = self._source_path(name)
            module.__file__ = f"{self.wheel}/{path}"
            code = compile(self.zip.read(path).decode(), module.__file__, "exec")
            exec(code, module.__dict__)  # noqa: S102 - vLLM's own source
        elif kind == "partial":
            part = self.partial[name]
            path = self._source_path(name)
            module.__file__ = f"{self.wheel}/{path}"
            if part.prelude is not None:
                part.prelude(module)
            tree = ast.parse(self.zip.read(path).decode())
            body = part.select(tree.body, path)
            code = compile(ast.Module(body=body, type_ignores=[]), module.__file__, "exec")
            exec(code, module.__dict__)  # noqa: S102

    def get_source(self, fullname):
        """The wheel's source of `fullname` (tracebacks show vLLM's lines)."""
        try:
            return self.zip.read(self._source_path(fullname)).decode()
        except ImportError:
            return None

    # helpers --------------------------------------------------------------------
    def _source_path(self, name):
        base = name.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if path in self.files:
                return path
        raise ImportError(f"the wheel {self.wheel} has no source for {name}", name=name)

    def install(self):
        """Puts the importer first on `sys.meta_path` in place of any earlier
        WheelImporter and drops any `vllm`/`torch` modules already imported, so that
        the next import goes through it (objects taken from the earlier load keep
        working)."""
        for name in [m for m in sys.modules if m.split(".")[0] in self.ROOTS]:
            del sys.modules[name]
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, WheelImporter)]
        sys.meta_path.insert(0, self)
        return self


@dataclass(frozen=True)
class Partial:
    """Which top-level statements of a wheel source file run, and what runs first.

    With `keep` set, only the statements that bind a name in `keep` run, and, with
    `imports`, the file's imports except those of a module under `drop_imports`
    (without it `prelude` supplies what they need). Otherwise every statement runs
    except imports of a module under `drop_imports` and statements binding a name in
    `drop`.
    `prelude(module)` fills the module's globals before the kept statements run.
    """

    keep: frozenset[str] | None = None
    drop: frozenset[str] = frozenset()
    drop_imports: tuple[str, ...] = ()
    prelude: Callable[[types.ModuleType], None] | None = None
    imports: bool = False

    def select(self, body, path):
        if self.keep is not None:
            out = [n for n in body if _defines(n) & self.keep or (
                self.imports and isinstance(n, (ast.Import, ast.ImportFrom))
                and not self._dropped_import(n))]
            missing = self.keep - set().union(*(_defines(n) for n in out))
        else:
            out = [n for n in body if not (_defines(n) & self.drop) and not self._dropped_import(n)]
            missing = self.drop - set().union(*(_defines(n) for n in body))
        if missing:
            raise ImportError(f"vLLM 0.33.0's {path} lacks {sorted(missing)}")
        return out

    def _dropped_import(self, node):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            modules = [base, *(f"{base}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            return False
        return any(m == d or m.startswith(d + ".") for m in modules for d in self.drop_imports)


class _NoAnnotations(ast.NodeTransformer):
    """Drops function annotations (they name types the functions never call)."""

    def visit_FunctionDef(self, node):  # noqa: N802 - ast's name
        self.generic_visit(node)
        node.returns = None
        for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                  node.args.vararg, node.args.kwarg]:
            if a is not None:
                a.annotation = None
        return node


def class_methods(z, path, cls, names, globals_):
    """Name -> function for the methods `names` of class `cls` in the wheel's `path`
    (a ZipFile), run unchanged as plain functions (call them with any object as
    `self`) in `globals_`; their annotations are dropped, their decorators kept."""
    tree = ast.parse(z.read(path).decode())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    defs = [_NoAnnotations().visit(n) for n in node.body
            if isinstance(n, ast.FunctionDef) and n.name in names]
    ns = dict(globals_)
    module = ast.fix_missing_locations(ast.Module(body=defs, type_ignores=[]))
    exec(compile(module, f"{z.filename}/{path}", "exec"), ns)  # noqa: S102 - vLLM's source
    missing = set(names) - {d.name for d in defs}
    if missing:
        raise ImportError(f"vLLM 0.33.0's {path} lacks {cls}.{sorted(missing)}")
    return {n: ns[n] for n in names}


def _defines(node) -> set[str]:
    """Top-level names an AST statement binds (def, class, assignment)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _importer() -> str:
    """The first frame outside importlib: which file asked for the import."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if "importlib" not in filename and filename != __file__:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"
