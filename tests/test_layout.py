"""The package's layout as a contract: the library's packages form layers, each importing
only the layers below it (imports inside functions count), so no import cycle can form;
the top of `astra_jax/` holds the commands only."""

import ast
import os

from child_env import REPO

PACKAGE = os.path.join(REPO, "astra_jax")
# Lowest first: a package may import itself and the packages before it. Each package's
# __init__.py says what it holds and repeats its line of this list.
LAYERS = (
  "runtime",
  "data",
  "model",
  "parallel",
  "xc",
  "ann",
  "negatives",
  "serving",
  "evaluation",
  "config",
  "training",
  "plan",
  "reproduce",
)
COMMANDS = {"__init__", "main", "evaluate", "predict", "prepare", "baselines", "extend"}
MAX_LINES = 500


def _modules() -> dict[str, str]:
  """Dotted module name -> path, for every module of the package."""
  out = {}
  for root, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(root, name)
        rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
        out[rel.removesuffix(".__init__")] = path
  return out


def _imports(modules: dict[str, str]) -> dict[str, set[str]]:
  """Module -> the package's modules it imports anywhere in its body."""

  def resolve(name: str) -> str | None:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
      if ".".join(parts[:i]) in modules:
        return ".".join(parts[:i])
    return None

  graph = {}
  for mod, path in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
          base = ".".join(up + ([base] if base else []))
        # `from pkg import sub` imports the submodule; `from pkg import name`, pkg itself.
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
      else:
        continue
      found |= {r for n in names if n.startswith("astra_jax") and (r := resolve(n))}
    found.discard(mod)
    found.discard("astra_jax")
    graph[mod] = found
  return graph


def _layer(mod: str) -> int | None:
  """The layer of a library module; None for a command at the top."""
  parts = mod.split(".")
  return LAYERS.index(parts[1]) if len(parts) > 2 or parts[-1] in LAYERS else None


def test_layers_import_only_downwards():
  graph = _imports(_modules())
  wrong = []
  for mod, deps in sorted(graph.items()):
    if (mine := _layer(mod)) is None:
      continue
    for dep in sorted(deps):
      theirs = _layer(dep)
      if theirs is None or theirs > mine:
        wrong.append(f"{mod} imports {dep}")
  assert not wrong, "imports against the layers (LAYERS above):\n" + "\n".join(wrong)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """A cycle of `graph` (its nodes in order, the first repeated last), or None."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done

  def visit(node: str, path: list[str]) -> list[str] | None:
    state[node] = 1
    for dep in sorted(graph.get(node, ())):
      if state.get(dep) == 1:
        return path[path.index(dep) :] + [dep]
      if dep not in state and (found := visit(dep, path + [dep])):
        return found
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (found := visit(node, [node])):
      return found
  return None


def test_the_checks_see_what_they_check():
  # The graph holds a top-level import and one made inside a function (reproduce/runs.py
  # imports the training code where it runs a Run) ...
  graph = _imports(_modules())
  assert "astra_jax.xc.classifier" in graph["astra_jax.training.steps"]
  assert "astra_jax.training.train" in graph["astra_jax.reproduce.runs"]
  # ... each module's layer (a package's __init__ is in its layer; a command in none) ...
  assert [
    _layer(m) for m in ("astra_jax.runtime.cli", "astra_jax.reproduce", "astra_jax.main")
  ] == [
    0,
    12,
    None,
  ]
  # ... and the cycle search finds a cycle drawn by hand, and none in a chain.
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle():
  cycle = _cycle(_imports(_modules()))
  assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_top_level_holds_the_commands_and_packages_the_layers():
  entries = {n.removesuffix(".py") for n in os.listdir(PACKAGE) if not n.startswith("__pycache")}
  modules = {n for n in entries if os.path.isfile(os.path.join(PACKAGE, n + ".py"))}
  packages = entries - modules
  assert modules == COMMANDS
  assert packages == set(LAYERS)
  for pkg in LAYERS:
    with open(os.path.join(PACKAGE, pkg, "__init__.py")) as f:
      doc = ast.get_docstring(ast.parse(f.read()))
    assert doc, f"astra_jax/{pkg}/__init__.py says nothing of what it holds"


def test_modules_stay_small():
  long = {
    os.path.relpath(path, REPO): n
    for path in _modules().values()
    if (n := sum(1 for _ in open(path))) > MAX_LINES
  }
  assert not long, f"modules over {MAX_LINES} lines: {long}"
