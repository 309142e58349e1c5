"""The documentation against what it describes: the configuration reference is what `train`
prints for its keys (every key of `train --help` is in it), and every relative link in the README
and docs/ leads to a file that exists."""
import re
import subprocess
import sys

from conftest import ROOT, binary, run_train

DOCS = [ROOT / "README.md", ROOT / "k8s" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_configuration_reference_is_what_train_prints():
    result = subprocess.run([sys.executable, ROOT / "scripts/config_reference.py", "--check",
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
