"""The layout shows the architecture, and the includes keep to it: base/ (what every layer uses)
includes nothing of ours above it; models/ and data/ include nothing from src/; inside data/,
formats < transforms < datasets < sources; inside src/, config/ < run/ < the top (main and the
seam); no two units (a header and its source) include each
other, however indirectly; README's layout table names the folder of every source file; a unit
includes MPI's, NCCL's, CUDA's or cuDNN's headers only when it talks to that library; and files
and functions stay small, the tests' files too, and the tops of src/, tests/ and scripts/ few."""
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
                  if p.suffix in (".h", ".cpp", ".cu", ".def"))


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


# src/'s own floors: the configuration below one run's steps, and both below src/'s top (`main`
# and the seam that makes each part's options), so that a room reads without the wiring above it.
SRC_ABOVE = {"src/config": {"src/run", "src/top"}, "src/run": {"src/top"}}


def src_room(path):
    """src/config, src/run, ... for a file of src/'s rooms; src/top for one at src/'s top."""
    parts = path.split("/")
    return "src/top" if len(parts) == 2 else "/".join(parts[:2])


def test_src_rooms_include_nothing_above_them():
    upward = []
    for f, incs in includes().items():
        if f.startswith("src/") and src_room(f) in SRC_ABOVE:
            above = SRC_ABOVE[src_room(f)]
            upward += [f"{f} includes {i}" for i in incs
                       if i.startswith("src/") and src_room(i) in above]
    assert upward == []


# What a reader sees first: the tops of src/, tests/ and scripts/ hold few entries, the rest in
# rooms named for what they hold.
MAX_SRC_TOP_SOURCES = 8
MAX_TOP_ENTRIES = {"tests": 25, "scripts": 16}


def test_the_tops_of_src_tests_and_scripts_stay_small():
    src_top = sorted(p.name for p in (ROOT / "src").glob("*.cpp"))
    assert len(src_top) <= MAX_SRC_TOP_SOURCES, src_top
    for folder, limit in MAX_TOP_ENTRIES.items():
        # The caches pytest and Python leave there are not the project's entries.
        entries = sorted(p.name for p in (ROOT / folder).iterdir()
                         if p.name != "__pycache__" and not p.name.startswith("."))
        assert len(entries) <= limit, f"{folder}/: {len(entries)} entries: {entries}"


# Small files and functions, so that each reads at once: no source file over 400 lines, no
# function over 60.
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def test_no_source_file_is_over_400_lines():
    long = [f"{rel(p)}: {n} lines" for p in sources()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert long == []


def suite_files():
    return sorted(p for p in (ROOT / "tests").rglob("*") if p.suffix in (".h", ".cpp", ".py"))


def test_no_test_file_is_over_400_lines():
    long = [f"{rel(p)}: {n} lines" for p in suite_files()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert long == []


def test_no_function_is_over_60_lines():
    long = [f"{rel(p)}:{fn.start_line} {fn.name}: {fn.length} lines"
            for p in sources() for fn in lizard.analyze_file(str(p)).function_list
            if fn.length > MAX_FUNCTION_LINES]
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


def test_each_config_key_is_declared_once():
    # src/config/keys.def is where a key is declared, with its default, limits and help: the
    # Config struct's only fields of its own are the ones the launcher sets, and the command line
    # binds no key by name.
    table = (ROOT / "src" / "config/keys.def").read_text()
    keys = re.findall(r'^CONFIG_KEY\(\s*"[^"]+",\s*[\w:<>]+,\s*(\w+),', table, re.M)
    assert len(keys) > 90 and len(keys) == len(set(keys))
    header = (ROOT / "src" / "config/config.h").read_text()
    struct = header[header.index("struct Config {"):]
    struct = struct[:struct.index("\n};")]
    assert set(re.findall(r"^  [\w:<>]+ (\w+) = ", struct, re.M)) == {
        "world_size", "restart_count", "elastic"}
    binding = (ROOT / "src" / "config/config.cpp").read_text()
    assert [k for k in keys if f'"{k}"' in binding or f'"--{k}"' in binding] == []


# The units that read Config: the configuration itself and the wiring that makes each part's
# options from it (src/part_options.h, src/sources.h), in `train` and in bench-step, which wires
# each trial as `train` does. The parts, the training loop and the checkpoints among them, get
# their own options instead.
CONFIG_READERS = {"src/config/config", "src/config/choices", "src/config/validate",
                  "src/data_classes", "src/device", "src/main_train", "src/part_options",
                  "src/run/plan", "src/sources", "src/tools/bench_step"}


def test_only_the_wiring_reads_the_configuration():
    readers = {unit(f) for f, incs in includes().items() if "src/config/config.h" in incs}
    assert readers - CONFIG_READERS == set()


# A Note (`// Note [Title]`, cited by its title where it applies) says one thing: as c10d's, short
# enough to read beside the code; a longer story is several Notes that cite each other.
MAX_NOTE_LINES = 20
NOTE = re.compile(r"^\s*// Note \[([^\]]+)\](:|\s*$)")  # its title alone, or then its text


def test_no_note_is_over_20_lines():
    long = []
    for p in sources():
        lines = p.read_text().splitlines()
        for start, line in enumerate(lines):
            if not (title := NOTE.match(line)):
                continue
            end = start + 1
            while end < len(lines) and lines[end].lstrip().startswith("//") and \
                    not NOTE.match(lines[end]):
                end += 1
            if end - start - 1 > MAX_NOTE_LINES:
                long.append(f"{rel(p)}:{start + 1} [{title.group(1)}]: {end - start - 1} lines")
    assert long == []


# A file's code starts within its first 20 lines of comments: the header says what it provides,
# and a Note stands beside the code it binds, not in a preface.
MAX_OPENING_COMMENT_LINES = 20
PREAMBLE = re.compile(r"^\s*$|^\s*//|^#include |^#pragma |^namespace \w+ \{$")


def test_no_file_opens_with_more_than_20_lines_of_comments():
    long = []
    for p in sources():
        comments = 0
        for line in p.read_text().splitlines():
            if not PREAMBLE.match(line):
                break
            comments += line.lstrip().startswith("//")
        if comments > MAX_OPENING_COMMENT_LINES:
            long.append(f"{rel(p)}: {comments} lines of comments before its first code")
    assert long == []


def test_every_cited_note_is_written():
    written = {m.group(1) for p in sources() for line in p.read_text().splitlines()
               if (m := NOTE.match(line))}
    citing = [p for p in sources() + suite_files() + sorted((ROOT / "docs").glob("*.md"))
              if p.name != "test_layout.py"]  # whose comments show the form
    # A citation may wrap: "Note [The\n  // last partial step]" cites "The last partial step".
    titles = {p: {" ".join(re.sub(r"\n\s*(//|#)?", " ", title).split())
                  for title in re.findall(r"Note \[([^\]]+)\]", p.read_text())} for p in citing}
    assert {f"{rel(p)}: {title}" for p, ts in titles.items() for title in ts - written} == set()


# A comment that cites a file of the project names one that exists: a header by its name
# (cuda_check.h) or any file by its path (tests/run/test_chaos.py). Files of other projects are
# cited with their project (torchvision's references/classification/train.py) and are not checked.
CITED_FILE = re.compile(r"(?<![\w<./-])([\w/.-]+\.(?:h|cpp|cu|cuh|def)|"
                        r"(?:base|models|data|src|tests|scripts|docs|configs)/[\w/.-]+"
                        r"\.(?:py|sh|md|toml|yaml))\b")


def test_every_file_a_comment_cites_exists():
    names = {p.name for d in SOURCE_DIRS + ["tests"] for p in (ROOT / d).rglob("*")}
    missing = set()
    for p in sources() + [ROOT / "CMakeLists.txt"]:
        for line in p.read_text().splitlines():
            comment = line.partition("//")[2] if p.suffix != ".txt" else line.partition("#")[2]
            for cited in CITED_FILE.findall(comment):
                if cited.endswith(".pb.h"):  # generated by the build
                    continue
                if not ((ROOT / cited).exists() if "/" in cited else cited in names):
                    missing.add(f"{rel(p)}: {cited}")
    assert sorted(missing) == [], sorted(missing)
