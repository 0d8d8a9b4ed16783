"""The CPU images built by ``scripts/build-images.sh`` (buildah, no Docker engine) and roles run
from them: a role's process is ``buildah run`` in a working container of its image, on this
host's network, so a test ``Stack`` starts and kills it by pid like any other role."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-images.sh"
IMAGES = ("control-plane", "worker-cpu")
# Where the deployment's model registry is mounted in a container.
MODELS_IN_CONTAINER = "/etc/batchserve/models.toml"
# What goes into the images (.dockerignore leaves the rest of the checkout out), and the base.
INPUTS = ("batchserve", "requirements", "docker", "pyproject.toml", "README.md")
BASE = "localhost/batchserve-python:3.11-bookworm"


def tools_missing() -> list[str]:
    return [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]


def torch_cpu_links() -> str | None:
    """A folder of pip's find-links that holds torch's CPU wheel, where this machine has one
    (no download then); None: the script's default, PyTorch's CPU index."""
    found = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    folders = [os.environ.get("PIP_FIND_LINKS", "")]
    for line in found.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            folders.extend(value.strip("'\"").split())
    for folder in filter(None, " ".join(folders).split()):
        path = Path(folder.removeprefix("file://"))
        if path.is_dir() and any(path.glob("torch-*+cpu-cp311-*.whl")):
            return str(path)
    return None


def names(tag: str) -> dict[str, str]:
    return {image: f"localhost/batchserve-{image}:{tag}" for image in IMAGES}


def inputs_digest() -> str:
    """A digest of every file the images are built from, the build script included."""
    digest = hashlib.sha256()
    for top in (*INPUTS, "scripts/build-images.sh"):
        path = ROOT / top
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for file in files:
            if file.is_file() and "__pycache__" not in file.parts:
                digest.update(f"{file.relative_to(ROOT)}\0".encode())
                digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def image_ids(tag: str) -> dict[str, str]:
    """The IDs of the base and of the images named for ``tag`` (those buildah has)."""
    ids = {}
    for name in (BASE, *names(tag).values()):
        found = subprocess.run(
            ["buildah", "images", "--no-trunc", "--format", "{{.ID}}", name],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if found:
            ids[name] = found[0]
    return ids


def stamp_path(tag: str) -> Path:
    return Path(tempfile.gettempdir()) / f"batchserve-image-layers-{tag}.json"


def prebuilt(tag: str) -> dict[str, str] | None:
    """The images ``make image-layers`` built for ``tag`` from this very tree (its stamp names
    the inputs' digest and the images' IDs, and both still hold), else None: the test then
    builds them itself. Saves the test a cached rebuild: buildah digests each image's venv
    (1.7 GB with torch) to find its layer in the cache, ~30 s of CPU."""
    try:
        stamp = json.loads(stamp_path(tag).read_text())
    except (OSError, ValueError):
        return None
    if stamp != {"inputs": inputs_digest(), "ids": image_ids(tag)}:
        return None
    return names(tag)


def build(tag: str, log: Path) -> dict[str, str]:
    """Build the images (buildah's layer cache makes a rebuild quick); their names by image."""
    # The names and the set this returns, whatever the caller's environment says.
    env = {**os.environ, "IMAGE_PREFIX": "localhost/", "IMAGES": " ".join(IMAGES)}
    env["BASE_IMAGE"] = BASE
    if (links := torch_cpu_links()) is not None:
        env["TORCH_CPU_LINKS"] = links
    with open(log, "ab") as out:
        subprocess.run(
            [str(SCRIPT), tag], env=env, stdout=out, stderr=subprocess.STDOUT, check=True
        )
    return names(tag)


@dataclass(frozen=True)
class Container:
    """A working container of an image; :meth:`run` and :meth:`launcher` run in it."""

    name: str
    mounts: tuple[tuple[str, str], ...] = ()

    def _prefix(self) -> list[str]:
        volumes = [f"--volume={host}:{inside}:ro" for host, inside in self.mounts]
        return ["buildah", "run", "--isolation=chroot", "--network=host", *volumes]

    def run(self, *command: str) -> str:
        """Run ``command`` in the container; its output (the test fails if it does)."""
        done = subprocess.run(
            [*self._prefix(), self.name, "--", *command],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, f"{command} in {self.name}: {done.stdout}{done.stderr}"
        return done.stdout

    def launcher(self, directory: Path) -> Path:
        """An executable that runs the image's Python with its arguments, in this container,
        with the caller's ``BATCHSERVE_*`` environment (the registry's path as mounted): what
        :meth:`Stack.start` takes as a role's ``python``."""
        path = directory / f"python-in-{self.name}"
        path.write_text(
            f"#!{sys.executable}\n"
            "# Generated by tests/support/images.py: a role's Python, in a container.\n"
            "import os, sys\n"
            "env = {k: v for k, v in os.environ.items() if k.startswith('BATCHSERVE_')}\n"
            f"env['BATCHSERVE_MODELS'] = {MODELS_IN_CONTAINER!r}\n"
            "variables = [f'--env={k}={v}' for k, v in env.items()]\n"
            f"command = [*{self._prefix()!r}, *variables, {self.name!r}, '--']\n"
            "os.execvp('buildah', [*command, '/opt/venv/bin/python', *sys.argv[1:]])\n"
        )
        path.chmod(0o755)
        return path


@contextlib.contextmanager
def container(
    image: str, name: str, mounts: tuple[tuple[str, str], ...] = ()
) -> Iterator[Container]:
    subprocess.run(["buildah", "rm", name], capture_output=True, check=False)  # a crashed run's
    subprocess.run(
        ["buildah", "from", "--quiet", "--name", name, image], check=True, stdout=subprocess.DEVNULL
    )
    try:
        yield Container(name, mounts)
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True, check=False)


def main() -> None:
    """``make image-layers``: build the images as the images' test does, ahead of it, so the
    test finds every layer in buildah's cache. Where buildah or mmdebstrap is missing there is
    nothing to build (the test skips)."""
    if tools_missing():
        return
    log = Path(tempfile.gettempdir()) / "batchserve-image-layers.log"
    stamp = stamp_path("test")
    stamp.unlink(missing_ok=True)
    inputs = inputs_digest()
    try:
        build("test", log)
    except subprocess.CalledProcessError:
        sys.stderr.write(log.read_text(errors="replace")[-5000:])
        raise
    if inputs_digest() == inputs:  # nothing changed while it built: the images are the tree's
        stamp.write_text(json.dumps({"inputs": inputs, "ids": image_ids("test")}))


if __name__ == "__main__":
    main()
