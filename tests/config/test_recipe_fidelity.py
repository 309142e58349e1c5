"""configs/recipes/sources/table.toml: every key each recipe sets is the value its source sets
(at a file and line of the repository and commit the recipe cites), a declared deviation the
recipe's Deviations comment describes, or a setting of this deployment. No binaries needed."""
import math
import re
import tomllib

import pytest

from conftest import ROOT

RECIPE_DIR = ROOT / "configs" / "recipes"
TABLE_PATH = RECIPE_DIR / "sources" / "table.toml"
RECIPES = sorted(RECIPE_DIR.glob("*.toml"))
TABLE = tomllib.loads(TABLE_PATH.read_text())
KINDS = ("value", "deviation", "deployment")
RESERVED = ("cites", "missing")  # the table's own fields beside the recipe's keys
FIX = f"update {TABLE_PATH.relative_to(ROOT)} with the source's file and line, or declare the deviation"


def recipe_id(path):
    return path.stem


def same_value(want, got):
    if isinstance(want, bool) or isinstance(got, bool):
        return type(want) is type(got) and want == got
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(want, got, rel_tol=1e-9)
    return want == got


def header_of(text):
    return text.split("\narch = ", 1)[0]


def deviations_comment(text):
    """The recipe's "# Deviations" bullets, each as one line of plain words."""
    header = header_of(text)
    if "# Deviations" not in header:
        return []
    block = header.split("# Deviations", 1)[1].splitlines()[1:]
    bullets = []
    for line in block:
        if not line.startswith("#"):
            break
        words = line[1:].strip()
        if words.startswith("- "):
            bullets.append(words[2:])
        elif bullets:
            bullets[-1] += " " + words
    return bullets


def plain(text):
    return re.sub(r"\s+", " ", text)


def entry_problems(name, key, entry):
    """What is wrong with one table entry on its own."""
    where = f"{name}: {key}"
    if not isinstance(entry, dict):
        return [f"{where}: the entry is not a table; {FIX}"]
    kinds = [k for k in KINDS if k in entry]
    if len(kinds) != 1:
        return [f"{where}: the entry has {kinds or 'none'} of value/deviation/deployment; "
                f"exactly one is needed; {FIX}"]
    problems = []
    if kinds == ["value"]:
        source = entry.get("source", "")
        if not source:
            problems.append(f"{where}: the value entry names no source; {FIX}")
        # A file needs its line; a command posted in a comment (an address) has none.
        elif not source.startswith("https://") and not isinstance(entry.get("line"), int):
            problems.append(f"{where}: the value entry names no line of {source}; {FIX}")
        if not entry.get("says"):
            problems.append(f"{where}: the value entry quotes nothing of the source (says); {FIX}")
    if kinds == ["deviation"] and not entry.get("recipe_says"):
        problems.append(f"{where}: the deviation names no phrase of the recipe's Deviations "
                        f"comment (recipe_says); {FIX}")
    return problems


def compare(name, recipe, table, deviations=None):
    """Every difference between a recipe's keys and its table, as messages naming the recipe, the
    key and the fix. `deviations`: the recipe's Deviations bullets (None: not checked)."""
    problems = []
    for key, got in recipe.items():
        if key not in table:
            problems.append(f"{name}: {key} = {got!r} has no entry in the table; {FIX}")
            continue
        entry = table[key]
        found = entry_problems(name, key, entry)
        problems += found
        if not found and "value" in entry and not same_value(entry["value"], got):
            problems.append(f"{name}: {key} = {got!r} in the recipe, but the table's source value "
                            f"is {entry['value']!r}; {FIX}")
    for key in table:
        if key not in RESERVED and key not in recipe:
            problems.append(f"{name}: the table has an entry for {key}, which the recipe does not "
                            f"set; remove it from the table or list it under [{name}.missing]")
    missing = table.get("missing", {})
    for key, entry in missing.items():
        found = entry_problems(name, f"missing.{key}", entry)
        if not found and "deviation" not in entry:
            found = [f"{name}: missing.{key} is not a deviation; {FIX}"]
        problems += found
    if deviations is not None:
        entries = [(k, e) for k, e in list(table.items()) + [(f"missing.{k}", e) for k, e in
                   missing.items()] if isinstance(e, dict) and "recipe_says" in e]
        text = [plain(b) for b in deviations]
        for key, entry in entries:
            if not any(plain(entry["recipe_says"]) in b for b in text):
                problems.append(f"{name}: {key}'s recipe_says {entry['recipe_says']!r} is in no "
                                f"bullet of the recipe's Deviations comment; describe the "
                                f"deviation there or {FIX}")
        for bullet in text:
            if not any(plain(e["recipe_says"]) in bullet for _, e in entries):
                problems.append(f"{name}: the Deviations bullet {bullet[:60]!r}... has no "
                                f"deviation entry in the table; {FIX}")
    return problems


def test_every_recipe_has_a_table():
    stems = {p.stem for p in RECIPES}
    assert len(stems) >= 8, sorted(stems)
    assert not stems - set(TABLE), f"recipes without a table in {TABLE_PATH.name}: " \
        f"{sorted(stems - set(TABLE))}; {FIX}"
    assert not set(TABLE) - stems, f"tables without a recipe: {sorted(set(TABLE) - stems)}"


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_recipe_matches_its_sources(recipe):
    text = recipe.read_text()
    table = TABLE.get(recipe.stem, {})
    problems = compare(recipe.stem, tomllib.loads(text), table, deviations_comment(text))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_the_table_cites_the_recipes_commits(recipe):
    """The repository and commits the table reads are the ones the recipe's header cites."""
    header = header_of(recipe.read_text())
    table = TABLE.get(recipe.stem, {})
    cites = table.get("cites", {})
    assert cites.get("repo") and cites.get("commit"), f"{recipe.stem}: no cites = {{ repo, commit }}"
    commits = {cites["commit"]} | {e["commit"] for e in list(table.values()) +
                                   list(table.get("missing", {}).values())
                                   if isinstance(e, dict) and "commit" in e}
    assert cites["repo"] in header, f"{recipe.stem}: the header does not cite {cites['repo']}"
    for commit in commits:
        assert commit[:8] in header, f"{recipe.stem}: the header does not cite commit {commit[:8]}"


def test_a_changed_value_is_reported():
    recipe_path = RECIPE_DIR / "dle-90-epochs.toml"
    recipe = tomllib.loads(recipe_path.read_text())
    table = TABLE["dle-90-epochs"]
    assert compare("dle-90-epochs", recipe, table) == []
    recipe["base_lr"] = 0.1
    problems = compare("dle-90-epochs", recipe, table)
    assert len(problems) == 1 and "base_lr" in problems[0] and "0.256" in problems[0], problems
    assert FIX in problems[0]


def test_unlisted_keys_and_malformed_entries_are_reported():
    recipe = {"epochs": 90, "momentum": 0.875}
    table = {
        "epochs": {"value": 90, "deployment": "both kinds"},
        "stale": {"deployment": "a key the recipe no longer sets"},
    }
    problems = compare("example", recipe, table)
    joined = "\n".join(problems)
    assert "momentum = 0.875 has no entry" in joined
    assert "exactly one is needed" in joined
    assert "stale, which the recipe does not set" in joined
    assert all(p.startswith("example: ") for p in problems), problems
    no_line = {"momentum": {"value": 0.875, "source": "configs.yml", "says": "momentum: 0.875"}}
    assert any("names no line" in p for p in compare("example", {"momentum": 0.875}, no_line))


def test_deviations_comment_and_table_agree_both_ways():
    bullets = ["The warmup starts from 0, not from 1e-4 x the peak LR."]
    table = {"missing": {"warmup": {"deviation": "x", "recipe_says": "warmup starts from 0"}}}
    assert compare("example", {}, table, bullets) == []
    assert any("no deviation entry" in p for p in compare("example", {}, {}, bullets))
    table["missing"]["other"] = {"deviation": "y", "recipe_says": "not in the comment"}
    assert any("in no bullet" in p for p in compare("example", {}, table, bullets))


# Keys that change which images a step or a GPU trains: never a mere deployment setting.
SAMPLING_KEYS = ("epoch_order", "drop_last", "repeated_augmentation", "global_batch",
                 "batch_size", "shuffle_buffer")
# The sources whose training loader drops the epoch's last partial batch (the table cites each).
DROP_LAST = ("ffcv-", "dle-", "mlperf-")


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_what_each_rank_trains_is_the_sources_or_declared(recipe):
    """A sampling key is the source's value or a deviation; the last partial batch is dropped
    exactly where the source drops it; the resize kernel's difference is declared."""
    settings = tomllib.loads(recipe.read_text())
    table = TABLE[recipe.stem]
    for key in SAMPLING_KEYS:
        if key in settings:
            assert "deployment" not in table[key], f"{recipe.stem}: {key} changes what is " \
                "trained: the source's value or a deviation, not a deployment setting"
    drops = recipe.stem.startswith(DROP_LAST)
    assert settings.get("drop_last", False) is drops, \
        f"{recipe.stem}: drop_last must be {drops}, as the source's training loader"
    assert "resize" in table.get("missing", {}), f"{recipe.stem}: the resize kernel is not declared"
