"""The layout shows the architecture, and the includes keep to it: base/ (what every layer uses)
includes nothing of ours above it; models/ and data/ include nothing from src/; inside data/,
formats < transforms < datasets < sources; no two units (a header and its source) include each
other, however indirectly; README's layout table names the folder of every source file; a unit
includes MPI's, NCCL's, CUDA's or cuDNN's headers only when it talks to that library; and files
and functions stay small, the tests' files too."""
import re
from collections import defaultdict

import lizard

from conftest import ROOT

SOURCE_DIRS = ["base", "models", "data", "src"]
# What each floor may include, besides itself; the longest matching folder decides. src/ and the
# tests may include anything below them.
MAY_INCLUDE = {
    "base": set(),
    "models": {"base"},
    "data/formats": {"base"},
    "data/transforms": {"base", "data/formats"},
    "data/datasets": {"base", "data/formats", "data/transforms"},
    "data/sources": {"base", "data/formats", "data/transforms", "data/datasets"},
}
INCLUDE = re.compile(r'^#include "((?:base|models|data|src)/[^"]+)"', re.M)


def sources():
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*")
                  if p.suffix in (".h", ".cpp", ".cu"))


def rel(path):
    return path.relative_to(ROOT).as_posix()


def floor(path):
    folders = [f for f in MAY_INCLUDE if path == f or path.startswith(f + "/")]
    return max(folders, key=len) if folders else None


def includes():
    return {rel(p): [i for i in INCLUDE.findall(p.read_text()) if not i.endswith(".pb.h")]
            for p in sources()}


def test_every_include_names_a_file_of_the_project():
    missing = [f"{f}: {i}" for f, incs in includes().items() for i in incs
               if not (ROOT / i).is_file()]
    assert missing == []


def test_no_include_runs_from_a_lower_floor_to_a_higher_one():
    upward = []
    for f, incs in includes().items():
        mine = floor(f)
        if mine is None:
            continue
        for i in incs:
            theirs = floor(i)
            if theirs != mine and theirs not in MAY_INCLUDE[mine]:
                upward.append(f"{f} ({mine}) includes {i} ({theirs or 'src'})")
    assert upward == []


def unit(path):
    """A header and its source are one unit: x.h, x.cpp, x.cu -> x."""
    return path.rsplit(".", 1)[0]


def test_no_two_units_include_each_other():
    edges = defaultdict(set)
    for f, incs in includes().items():
        for i in incs:
            if unit(i) != unit(f):
                edges[unit(f)].add(unit(i))
    cycles = []
    # Tarjan's strongly connected components: a component of two or more units is a cycle.
    index, low, stack, on_stack, counter = {}, {}, [], set(), [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
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
                cycles.append(sorted(component))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    assert cycles == []


def test_readme_layout_table_names_every_source_folder():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout"):]
    named = set(re.findall(r"^\| `([\w/]+)/`", table, re.M))
    folders = {rel(p.parent) for p in sources()}
    assert folders - named == set(), "folders the layout table does not name"
    assert {f for f in named if not (ROOT / f).is_dir()} == set(), "named folders that do not exist"


# Small files and functions, so that each reads at once: no source file over 400 lines, no
# function over 60. A declarative table (one entry per config key) may be longer.
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
DECLARATIVE_TABLES = {("src/config.cpp", "trainer::add_options")}


def test_no_source_file_is_over_400_lines():
    long = [f"{rel(p)}: {n} lines" for p in sources()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert long == []


def suite_files():
    return sorted(p for p in (ROOT / "tests").rglob("*") if p.suffix in (".h", ".cpp", ".py"))


# One test file is still over the rule, held at its length until it is split: the chaos test's
# scenario runner.
LONG_TESTS = {"tests/test_chaos.py": 1151}


def test_no_test_file_is_over_400_lines():
    long = [f"{rel(p)}: {n} lines" for p in suite_files()
            if (n := len(p.read_text().splitlines())) > LONG_TESTS.get(rel(p), MAX_FILE_LINES)]
    assert long == []


def test_no_function_is_over_60_lines():
    long = [f"{rel(p)}:{fn.start_line} {fn.name}: {fn.length} lines"
            for p in sources() for fn in lizard.analyze_file(str(p)).function_list
            if fn.length > MAX_FUNCTION_LINES and (rel(p), fn.name) not in DECLARATIVE_TABLES]
    assert long == []


# The libraries whose headers a unit includes only when it calls them: a header (the library's own
# or the project's check for it) and the names that show a call.
LIBRARIES = {
    "MPI": (re.compile(r'^#include (<mpi\.h>|"base/mpi_check\.h")', re.M), re.compile(r"\bMPI_")),
    "NCCL": (re.compile(r'^#include (<nccl\.h>|"base/nccl_check\.h")', re.M),
             re.compile(r"\bnccl|\bNCCL_CHECK\b")),
    "cuDNN": (re.compile(r'^#include (<cudnn\.h>|"base/cudnn_check\.h")', re.M),
              re.compile(r"\bcudnn[A-Z]|\bCUDNN_")),
    "CUDA": (re.compile(r'^#include (<cuda_runtime(_api)?\.h>|"base/cuda_check\.h")', re.M),
             re.compile(r"\bcuda[A-Z]|\bCUDA_CHECK\b")),
}


def test_a_unit_includes_a_librarys_headers_only_when_it_talks_to_it():
    # So that a unit that only wants USER_CHECK (base/user_error.h) compiles without MPI, NCCL or
    # CUDA, and a reader sees from the includes which units do.
    units = defaultdict(str)
    files = sources() + sorted(p for p in (ROOT / "tests").rglob("*") if p.suffix in (".h", ".cpp"))
    for p in files:
        units[unit(rel(p))] += p.read_text()
    idle = []
    for name, text in units.items():
        code = re.sub(r"^#include .*$", "", text, flags=re.M)
        for library, (header, call) in LIBRARIES.items():
            if header.search(text) and not call.search(code):
                idle.append(f"{name} includes {library}'s header but makes no {library} call")
    assert idle == []


def test_the_library_checks_stay_apart_from_user_errors():
    # base/user_error.h is what a unit includes for USER_CHECK: no library comes with it.
    text = (ROOT / "base" / "user_error.h").read_text()
    assert re.findall(r"^#include .*$", text, re.M) == [
        "#include <sstream>", "#include <stdexcept>", "#include <string>"]
