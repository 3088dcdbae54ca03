#!/usr/bin/env python3
"""Fails when an #include runs against the layer arrows of docs/architecture.md.

Each source file belongs to the first layer whose folder prefixes its path; it may include only
headers of the layers listed for it (its own included). A header of a layer not named here, or an
include from a folder no layer owns, is an error too, so a new folder has to be placed in the
table before it can be used. Run from anywhere: `python3 tools/check_layers.py [ROOT]` (ctest runs
it on the repository, and on a small tree with an arrow that runs back up, which must fail).
"""
import pathlib
import re
import sys

# Layer -> the layers it may include, bottom up. Longer prefixes are listed before the folders
# that contain them.
ALLOWED = {
    "common": [],
    "kernels": ["common"],
    "policies": ["kernels", "common"],
    "ipc": ["common"],
    "tier": ["common"],
    "controller/pool": ["kernels", "common"],
    "controller/config": ["controller/pool", "policies", "kernels", "common"],
    "controller/sequence": ["controller/config", "controller/pool", "policies", "kernels",
                            "common"],
    "controller/stats": ["common"],
    "controller/service": ["controller/sequence", "controller/stats", "controller/config",
                           "controller/pool", "ipc", "tier", "policies", "kernels", "common"],
    "controller/daemon": ["controller/service", "controller/sequence", "controller/stats",
                          "controller/config", "controller/pool", "ipc", "tier", "policies",
                          "kernels", "common"],
    "tests/support": ["common"],
    "bindings": ["ipc", "kernels", "common"],
    # kvbench ipc measures the daemon and the Controller in-process, so tools sit on top of all.
    "tools": ["controller/daemon", "controller/service", "controller/sequence",
              "controller/stats", "controller/config", "controller/pool", "ipc", "tier",
              "policies", "kernels", "common", "tests/support"],
    "tests": None,  # Tests may include anything.
}
SOURCE_SUFFIXES = {".h", ".cc", ".cu", ".cuh", ".inc"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path: str):
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if path == layer or path.startswith(layer + "/"):
            return layer
    return None


def main() -> int:
    default_root = pathlib.Path(__file__).resolve().parent.parent
    root = pathlib.Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else default_root
    errors = []
    checked = 0
    for file in sorted(root.rglob("*")):
        rel = file.relative_to(root).as_posix()
        if file.suffix not in SOURCE_SUFFIXES or rel.startswith(("build", ".")):
            continue
        layer = layer_of(rel)
        if layer is None:
            continue
        checked += 1
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = match.group(1)
            if "/" not in target:
                continue  # A sibling include (generated or local): same layer.
            target_layer = layer_of(target)
            if target_layer is None:
                errors.append(f"{rel}:{number}: includes \"{target}\", which no layer of "
                              "tools/check_layers.py owns")
            elif ALLOWED[layer] is not None and target_layer != layer and \
                    target_layer not in ALLOWED[layer]:
                errors.append(f"{rel}:{number}: {layer} includes \"{target}\" of "
                              f"{target_layer}; {layer} may use only "
                              f"{', '.join(ALLOWED[layer]) or 'itself'} (docs/architecture.md)")
    for error in errors:
        print(error)
    print(f"check_layers: {checked} files, {len(errors)} arrows against the layers")
    return 1 if errors or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
