#!/usr/bin/env python3
"""Stages the `torch` Python package beside the torch wheel's libraries that `cmake --install`
put in LIB_DIR (laid out like the wheel's site-packages: torch/lib, nvidia/*/lib), so that
torchrun (docker/torchrun) and `train` load one copy of LibTorch, CUDA and NCCL: its Python
files and libtorch_python, and the pure-Python packages torch requires. Not the GPU packages
(cuda-toolkit, cuda-bindings, nvidia-*: their libraries are already there, and a launcher needs
no others) nor triton (the compiler of torch.compile, which nothing in the image runs).
Run with the Python whose environment holds the wheel (the build's venv).
Usage: python docker/stage-torch-python.py LIB_DIR"""
import shutil
import sys
from importlib import metadata
from pathlib import Path, PurePosixPath

from pip._vendor.packaging.requirements import Requirement

NOT_STAGED = ("cuda-toolkit", "cuda-bindings", "nvidia-", "triton")
# Files of torch no launcher reads: headers, CMake files, static archives.
SKIPPED_DIRS = {"include", "share"}


def wanted(name):
    return not any(name.lower().replace("_", "-").startswith(p) for p in NOT_STAGED)


def distributions(root):
    """root and every distribution it requires (no extras, markers evaluated here), by name."""
    found, todo = {}, [root]
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in found:
            continue
        dist = metadata.distribution(name)
        found[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if wanted(req.name) and (req.marker is None or req.marker.evaluate({"extra": ""})):
                todo.append(req.name)
    return found


def staged(dist, path):
    """Whether a file of a distribution goes in: torch's libraries only where cmake --install
    left one out that Python loads (libtorch_python, libshm), nothing under include/ or share/."""
    parts = PurePosixPath(path).parts
    if parts[0] == "..":  # scripts such as bin/torchrun: docker/torchrun replaces them
        return False
    if parts[0] == "torch" and len(parts) > 1 and parts[1] in SKIPPED_DIRS:
        return False
    if path.suffix == ".a":
        return False
    if parts[:2] == ("torch", "lib"):
        return PurePosixPath(path).name.startswith(("libtorch_python", "libshm"))
    return True


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.splitlines()[-1])
    lib = Path(sys.argv[1])
    if not (lib / "torch" / "lib").is_dir():
        sys.exit(f"stage-torch-python: {lib}/torch/lib does not exist. HINT: run cmake --install "
                 "of a build against the torch wheel first (docker/stage-runtime.sh)")
    total = 0
    for key, dist in sorted(distributions("torch").items()):
        count = 0
        for path in dist.files or []:
            source = Path(dist.locate_file(path))
            target = lib / path
            if not staged(dist, path) or not source.is_file() or target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            count += 1
            total += source.stat().st_size
        print(f"+ {dist.metadata['Name']} {dist.version}: {count} files")
    print(f"+ staged {total / 2**20:.0f} MiB of Python packages in {lib}")


if __name__ == "__main__":
    main()
