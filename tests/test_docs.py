"""The documentation against what it describes: the configuration reference is what `train`
prints for its keys (every key of `train --help` is in it), every relative link in the README
and docs/ leads to a file that exists, and so does every path of the project's that the guides,
the manifests, the image's files and the tests name."""
import re
import subprocess
import sys

from conftest import ROOT, binary, run_train

DOCS = [ROOT / "README.md", ROOT / "k8s" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_configuration_reference_is_what_train_prints():
    result = subprocess.run([sys.executable, ROOT / "scripts/dev/config_reference.py", "--check",
                             "--train", binary("train")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_key_of_train_help_is_in_the_reference():
    keys = re.findall(r"^  --(\w+)", run_train("--help").stdout, re.MULTILINE)
    reference = (ROOT / "docs" / "configuration.md").read_text()
    # Options of `train` that are not keys.
    commands = ("config", "help_markdown", "plan_world_size", "plan_train_images")
    missing = [k for k in keys if k not in commands and f"| `{k}` |" not in reference]
    assert len(keys) > 50 and missing == []


def test_relative_links_lead_to_files():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if not re.match(r"[a-z]+://", target) and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []


# A path of the project's own: one of its top folders, then a file name with its extension.
# A name in capitals (configs/NAME.toml) stands for one the reader picks: no file of that name.
PROJECT_PATH = re.compile(r"(?<![\w/.$~{-])((?:scripts|tests|docs|configs|k8s|docker)/[\w./-]*"
                          r"\.(?:sh|py|cpp|h|md|toml|yaml|txt))\b")


def files_naming_paths():
    yield from DOCS
    yield ROOT / "scripts" / "README.md"
    for folder in ("k8s", "docker", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if path.is_file() and "upstream" not in parts and "corpus" not in parts and \
                    path.suffix in ("", ".md", ".yaml", ".py", ".sh", ".cpp", ".h", ".txt"):
                yield path


def test_every_path_named_exists():
    missing = set()
    for path in files_naming_paths():
        for named in PROJECT_PATH.findall(path.read_text(errors="replace")):
            if not re.search(r"[A-Z]{3,}", named) and not (ROOT / named).exists():
                missing.add(f"{path.relative_to(ROOT)}: {named}")
    assert sorted(missing) == [], sorted(missing)
