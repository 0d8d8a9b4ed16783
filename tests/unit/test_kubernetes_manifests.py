"""The Kubernetes manifests (deploy/kubernetes/), rendered by `kubectl kustomize` and checked
without a cluster: the core objects against Kubernetes' schemas (kubernetes-validate, strict),
the CRDs (KEDA, Prometheus Operator) against the fields they use, every command line against
the CLI, every setting against Settings, and the sizing against the capacity planner and the
numbers docs/deploy.md gives."""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer.main
import yaml

from batchserve.batching.batcher import time_limit_s
from batchserve.core.settings import Settings
from batchserve.models.plugins import plugin_for
from batchserve.models.registry import ModelSpec, parse_registry

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
DOC = ROOT / "docs" / "deploy.md"
# The Kubernetes release whose schemas the core objects are held to.
KUBERNETES_VERSION = "1.30.0"
CRD_GROUPS = ("keda.sh/", "monitoring.coreos.com/")
CONTROL_PLANE = "batchserve-control-plane"
WORKER_IMAGES = ("batchserve-worker-cpu", "batchserve-worker-cuda", "batchserve-worker-vllm")
# The Secret the roles and KEDA read; docs/deploy.md creates it with exactly these keys.
SECRET = "batchserve"
SECRET_KEYS = {
    "BATCHSERVE_DATABASE_URL",
    "BATCHSERVE_BROKER_URL",
    "BATCHSERVE_REDIS_URL",
    "BATCHSERVE_SECRET_KEY",
    "KEDA_POSTGRES_CONNECTION",
}
# Set on every role (docs/deploy.md).
EVERY_ROLE_ENV = {
    "BATCHSERVE_ENV": "production",
    "BATCHSERVE_LOG_FORMAT": "json",
    "BATCHSERVE_MODELS": "/etc/batchserve/models.toml",
    "BATCHSERVE_METRICS_PORT": "9100",
    "BATCHSERVE_METRICS_HOST": "0.0.0.0",
    "BATCHSERVE_SCHEMA_WAIT_S": "300",
}
# The fixed overlay's sizing: the planner's command line (docs/deploy.md shows its output).
PLAN_ARGS = ["--rate", "1000", "--max-batch", "32", "--batch-time-ms", "100"]

Doc = dict[str, Any]


# -- rendering ---------------------------------------------------------------------------------


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl on the PATH (`make test` installs Debian's kubernetes-client)")
    return kubectl


@functools.cache
def _rendered(path: str) -> tuple[Doc, ...]:
    done = subprocess.run(
        [_kubectl(), "kustomize", path], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def render(overlay: str) -> list[Doc]:
    return list(_rendered(str(KUBERNETES / "overlays" / overlay)))


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    (found,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


def workloads(docs: list[Doc]) -> Iterator[tuple[Doc, Doc, Doc]]:
    """(object, pod spec, container) of every Deployment and Job."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            pod = doc["spec"]["template"]["spec"]
            for container in pod["containers"]:
                yield doc, pod, container


def role_of(container: Doc) -> str:
    return str(container["args"][0])


def worker(docs: list[Doc]) -> tuple[Doc, Doc, Doc]:
    (found,) = [w for w in workloads(docs) if role_of(w[2]) == "worker"]
    return found


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def config_maps(docs: list[Doc]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d.get("data", {}) for d in of_kind(docs, "ConfigMap")}


def environment(docs: list[Doc], container: Doc) -> dict[str, str | None]:
    """A container's variables: values from its ConfigMaps, None for those from a Secret."""
    maps = config_maps(docs)
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        assert set(source) == {"configMapRef"}, source  # Secrets only key by key
        env.update(maps[source["configMapRef"]["name"]])
    for variable in container.get("env", []):
        env[variable["name"]] = variable.get("value")
    return env


def registry_of(docs: list[Doc]) -> dict[str, ModelSpec]:
    (models,) = [
        d["data"]["models.toml"]
        for d in of_kind(docs, "ConfigMap")
        if "models.toml" in d.get("data", {})
    ]
    registry = parse_registry(models)
    return {name: spec for name in registry.names() if (spec := registry.get(name)) is not None}


def served_model(docs: list[Doc]) -> ModelSpec:
    _, _, container = worker(docs)
    return registry_of(docs)[option(container["args"], "--model")]


@functools.cache
def plan() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "batchserve.cli", "capacity", *PLAN_ARGS, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# -- core objects ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_core_object_is_valid_kubernetes(overlay: str) -> None:
    docs = render(overlay)
    core = [d for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)]
    assert {d["kind"] for d in core} >= {
        "ConfigMap",
        "Deployment",
        "Job",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    }
    for doc in core:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {error.message}")
    assert not of_kind(docs, "Secret")  # created by hand (docs/deploy.md), never rendered


def test_the_base_renders_and_overlays_use_only_kustomize_v2_fields() -> None:
    assert set(OVERLAYS) == {"fixed-1000rps", "gpu-vllm"}
    assert _rendered(str(KUBERNETES / "base"))
    v2_fields = {
        "apiVersion",
        "kind",
        "bases",
        "resources",
        "commonLabels",
        "configMapGenerator",
        "images",
        "patchesStrategicMerge",
        "patchesJson6902",
    }
    for kustomization in KUBERNETES.rglob("kustomization.yaml"):
        fields = set(yaml.safe_load(kustomization.read_text()))
        assert fields <= v2_fields, (kustomization, fields - v2_fields)
        # v2.0.3 reads directories only from `bases`.
        for entry in yaml.safe_load(kustomization.read_text()).get("resources", []):
            assert (kustomization.parent / entry).is_file(), entry


# -- CRDs: a schema of the fields used, and their references -----------------------------------

# A schema: a type; a list of one schema (every item); or a dict of field -> schema with the
# required fields marked by a trailing "!".
SCALED_OBJECT = {
    "apiVersion!": str,
    "kind!": str,
    "metadata!": {"name!": str, "labels": dict},
    "spec!": {
        "scaleTargetRef!": {"apiVersion": str, "kind": str, "name!": str},
        "minReplicaCount": int,
        "maxReplicaCount": int,
        "pollingInterval": int,
        "cooldownPeriod": int,
        "triggers!": [
            {
                "type!": str,
                "metadata!": {
                    "query!": str,
                    "targetQueryValue!": str,
                    "activationTargetQueryValue": str,
                },
                "authenticationRef!": {"name!": str},
            }
        ],
    },
}
TRIGGER_AUTHENTICATION = {
    "apiVersion!": str,
    "kind!": str,
    "metadata!": {"name!": str, "labels": dict},
    "spec!": {"secretTargetRef!": [{"parameter!": str, "name!": str, "key!": str}]},
}
SERVICE_MONITOR = {
    "apiVersion!": str,
    "kind!": str,
    "metadata!": {"name!": str, "labels": dict},
    "spec!": {
        "selector!": {"matchLabels!": dict},
        "podTargetLabels": [str],
        "endpoints!": [{"port!": str, "path": str, "interval": str}],
    },
}
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
    ("keda.sh/v1alpha1", "TriggerAuthentication"): TRIGGER_AUTHENTICATION,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
}


def conforms(value: Any, schema: Any, where: str) -> list[str]:
    if isinstance(schema, list):
        if not isinstance(value, list) or not value:
            return [f"{where}: a non-empty list expected"]
        return [
            e for n, item in enumerate(value) for e in conforms(item, schema[0], f"{where}[{n}]")
        ]
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{where}: a mapping expected"]
        fields = {k.rstrip("!"): s for k, s in schema.items()}
        errors = [f"{where}.{k}: unknown field" for k in value if k not in fields]
        errors += [
            f"{where}.{k[:-1]}: missing" for k in schema if k.endswith("!") and k[:-1] not in value
        ]
        return errors + [
            e
            for k, v in value.items()
            if k in fields
            for e in conforms(v, fields[k], f"{where}.{k}")
        ]
    if not isinstance(value, schema) or (isinstance(value, bool) and schema is not bool):
        return [f"{where}: {schema.__name__} expected, not {value!r}"]
    return []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_crds_use_known_fields_and_reference_what_exists(overlay: str) -> None:
    docs = render(overlay)
    crds = [d for d in docs if d["apiVersion"].startswith(CRD_GROUPS)]
    assert {(d["apiVersion"], d["kind"]) for d in crds} == set(CRDS)
    for doc in crds:
        assert conforms(doc, CRDS[doc["apiVersion"], doc["kind"]], doc["kind"]) == []

    deployments = {d["metadata"]["name"] for d in of_kind(docs, "Deployment")}
    authentications = {d["metadata"]["name"]: d for d in of_kind(docs, "TriggerAuthentication")}
    for scaled in of_kind(docs, "ScaledObject"):
        target = scaled["spec"]["scaleTargetRef"]
        assert target.get("kind", "Deployment") == "Deployment" and target["name"] in deployments
        for trigger in scaled["spec"]["triggers"]:
            assert trigger["type"] == "postgresql"
            assert int(trigger["metadata"]["targetQueryValue"]) > 0
            assert trigger["authenticationRef"]["name"] in authentications
    for authentication in authentications.values():
        refs = authentication["spec"]["secretTargetRef"]
        assert [r["parameter"] for r in refs] == ["connection"]
        assert all(r["name"] == SECRET and r["key"] in SECRET_KEYS for r in refs)

    # The ServiceMonitor selects the metrics Service, whose port `metrics` reaches every role.
    (monitor,) = of_kind(docs, "ServiceMonitor")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    services = [
        s for s in of_kind(docs, "Service") if wanted.items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in services] == ["batchserve-metrics"]
    (service,) = services
    assert service["spec"]["clusterIP"] == "None"
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert ports["metrics"]["port"] == 9100 and ports["metrics"]["targetPort"] == "metrics"
    for doc, _, container in workloads(docs):
        if doc["kind"] != "Deployment":
            continue
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items(), doc["metadata"]["name"]
        assert {"name": "metrics", "containerPort": 9100} in container["ports"]


# -- commands, settings, probes ----------------------------------------------------------------


def _cli() -> Any:
    """The CLI as `batchserve` runs it: typer's click command (typer ships its own click)."""
    from batchserve.cli.main import app

    return typer.main.get_command(app)


def _command(name: str) -> tuple[Any, Any]:
    """The subcommand ``name`` and its parent's context, parsed as the CLI would."""
    cli = _cli()
    parent = cli.make_context("batchserve", [name], resilient_parsing=False)
    command = cli.get_command(parent, name)
    assert command is not None, f"no command {name!r}"
    return command, parent


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_command_line_is_a_batchserve_command_it_accepts(overlay: str) -> None:
    roles = []
    for doc, _, container in workloads(render(overlay)):
        assert container["command"] == ["batchserve"], doc["metadata"]["name"]
        name, *rest = container["args"]
        command, parent = _command(name)
        # Parses the options as the CLI would (an unknown option or a bad value raises).
        command.make_context(name, list(rest), parent=parent, resilient_parsing=False)
        roles.append(name)
    assert sorted(roles) == sorted(
        ["api", "batcher", "maintenance", "webhooks", "worker", "migrate"]
    )


def test_a_bad_command_line_would_fail_the_check() -> None:
    from typer._click.exceptions import UsageError

    command, parent = _command("worker")
    with pytest.raises(UsageError, match="--slot"):
        command.make_context("worker", ["--model", "m", "--slot", "2"], parent=parent)
    with pytest.raises(UsageError, match="integer"):
        command.make_context("worker", ["--model", "m", "--slots", "two"], parent=parent)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_batchserve_variable_is_a_setting_and_every_role_has_its_settings(
    overlay: str,
) -> None:
    docs = render(overlay)
    fields = set(Settings.model_fields)
    prefix = str(Settings.model_config.get("env_prefix"))
    for doc, _, container in workloads(docs):
        env = environment(docs, container)
        where = f"{doc['metadata']['name']}"
        for name in env:
            if name.startswith(prefix):
                setting = name.removeprefix(prefix).lower()
                assert setting in fields, f"{where}: {name}"
        for name, value in EVERY_ROLE_ENV.items():
            assert env.get(name) == value, f"{where}: {name}={env.get(name)!r}"
        secrets = {
            v["name"]: v["valueFrom"]["secretKeyRef"]
            for v in container["env"]
            if "secretKeyRef" in v.get("valueFrom", {})
        }
        assert set(secrets) == SECRET_KEYS - {"KEDA_POSTGRES_CONNECTION"}, where
        assert all(ref == {"name": SECRET, "key": name} for name, ref in secrets.items())
    # What the ConfigMap says, the settings accept (production needs the servers and a key).
    (config,) = [m for n, m in config_maps(docs).items() if n.startswith("batchserve-config")]
    values = {k.removeprefix(prefix).lower(): v for k, v in config.items()}
    accepted: dict[str, Any] = {k: v for k, v in values.items() if k in fields}
    accepted["database_url"] = "postgresql+psycopg://h/d"
    accepted["broker_url"] = "amqp://h"
    accepted["redis_url"] = "redis://h"
    accepted["secret_key"] = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # a Fernet key
    Settings.model_validate(accepted)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_ports_security_resources_and_images(overlay: str) -> None:
    docs = render(overlay)
    for doc, pod, container in workloads(docs):
        where = doc["metadata"]["name"]
        role = role_of(container)
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        probes = {
            k: container[k]
            for k in ("startupProbe", "livenessProbe", "readinessProbe")
            if k in container
        }
        for probe in probes.values():
            assert probe["httpGet"]["port"] in ports, where
        if role == "migrate":
            assert not probes and doc["kind"] == "Job"
        else:
            port = "http" if role == "api" else "metrics"
            assert probes["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
            assert probes["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
            assert ports["metrics"] == 9100
        if role == "api":
            assert ports["http"] == 8000
            assert option(container["args"], "--port") == "8000"
            assert option(container["args"], "--host") == "0.0.0.0"

        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == 10001
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], where
        home = environment(docs, container).get("BATCHSERVE_HOME")
        assert home and "emptyDir" in volumes[mounts[home]], where
        if role != "migrate":
            models = volumes[mounts["/etc/batchserve"]]["configMap"]["name"]
            assert "models.toml" in config_maps(docs)[models]
        assert set(container["resources"]) == {"requests", "limits"}, where

        image = container["image"].rsplit("/", 1)[-1].split(":")[0]
        assert image == (
            WORKER_IMAGES[2 if overlay == "gpu-vllm" else 0] if role == "worker" else CONTROL_PLANE
        )


def test_the_migrate_job_is_a_presync_hook_that_cleans_up() -> None:
    for overlay in OVERLAYS:
        (job,) = of_kind(render(overlay), "Job")
        assert job["metadata"]["annotations"]["argocd.argoproj.io/hook"] == "PreSync"
        assert job["spec"]["ttlSecondsAfterFinished"] > 0
        assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_roles_replicas_budgets_and_autoscalers(overlay: str) -> None:
    docs = render(overlay)
    deployments = {d["metadata"]["name"]: d for d in of_kind(docs, "Deployment")}
    assert deployments["batchserve-batcher"]["spec"]["replicas"] == 2  # active + hot standby
    budgets = of_kind(docs, "PodDisruptionBudget")
    covered = set()
    for budget in budgets:
        selector = budget["spec"]["selector"]["matchLabels"]
        matching = [
            n
            for n, d in deployments.items()
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matching) == 1, budget["metadata"]["name"]
        covered.update(matching)
    assert covered == {"batchserve-api", "batchserve-batcher", "batchserve-worker"}
    (hpa,) = of_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "batchserve-api"
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    api = next(c for d, _, c in workloads(docs) if d["metadata"]["name"] == "batchserve-api")
    (service,) = [s for s in of_kind(docs, "Service") if s["metadata"]["name"] == "batchserve-api"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http"}]
    assert (
        service["spec"]["selector"].items()
        <= deployments["batchserve-api"]["spec"]["template"]["metadata"]["labels"].items()
    )
    assert api["ports"][0]["name"] == "http"


# -- the worker: its model, grace period, KEDA trigger -----------------------------------------


def batch_limit_s(spec: ModelSpec, env: dict[str, str | None]) -> float:
    """How long a worker's SIGTERM may take: an engine drains for BATCHSERVE_ENGINE_DRAIN_S; a
    batch is killed past its time limit (the registry's, else the batcher's rule)."""
    if plugin_for(spec).kind == "engine":
        drain = env.get("BATCHSERVE_ENGINE_DRAIN_S")
        return float(drain) if drain else Settings.model_fields["engine_drain_s"].default
    return spec.time_limit_s or time_limit_s(spec.batch_time_ms / 1000.0)


def scaled_object(docs: list[Doc]) -> Doc:
    (scaled,) = of_kind(docs, "ScaledObject")
    return scaled


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_worker_serves_a_registered_model_and_outlasts_its_batches(overlay: str) -> None:
    docs = render(overlay)
    doc, pod, container = worker(docs)
    spec = served_model(docs)
    assert pod["terminationGracePeriodSeconds"] > batch_limit_s(spec, environment(docs, container))
    # The KEDA query counts the queued requests of that model.
    (trigger,) = scaled_object(docs)["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert re.fullmatch(
        r"SELECT count\(\*\) FROM requests"
        rf" WHERE state = 'queued' AND model = '{re.escape(spec.name)}'",
        query,
    ), query
    assert scaled_object(docs)["spec"]["minReplicaCount"] == 0  # scale to zero
    assert scaled_object(docs)["spec"]["scaleTargetRef"]["name"] == doc["metadata"]["name"]
    # The target from the capacity arithmetic: a replica of S slots carries (1 - h) x S x B.
    slots = int(option(container["args"], "--slots"))
    target = int(trigger["metadata"]["targetQueryValue"])
    assert target == (1 - plan()["headroom"]) * slots * spec.max_batch_size


def test_the_fixed_overlay_is_sized_by_the_planner() -> None:
    docs = render("fixed-1000rps")
    planned = plan()
    doc, _, container = worker(docs)
    spec = served_model(docs)
    assert spec.backend == "fixed" and spec.name == "echo-100ms"
    assert (spec.max_batch_size, spec.batch_time_ms) == (
        planned["max_batch"],
        planned["batch_time_ms"],
    )
    slots = int(option(container["args"], "--slots"))
    assert slots * spec.max_batch_size / (spec.batch_time_ms / 1000) == planned["per_worker_rps"]
    assert doc["spec"]["replicas"] == planned["recommended_workers"]
    scaled = scaled_object(docs)["spec"]
    target = int(scaled["triggers"][0]["metadata"]["targetQueryValue"])
    # A queue of one batch time at the planned rate asks KEDA for the recommended count.
    batch_s = planned["batch_time_ms"] / 1000
    assert math.ceil(planned["rate_rps"] * batch_s / target) == planned["recommended_workers"]
    assert scaled["maxReplicaCount"] == 2 * planned["recommended_workers"]


def test_the_gpu_overlay_runs_vllm_on_gpu_nodes() -> None:
    docs = render("gpu-vllm")
    _, pod, container = worker(docs)
    spec = served_model(docs)
    assert spec.backend == "vllm" and plugin_for(spec).kind == "engine"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    shm = {v["name"]: v for v in pod["volumes"]}[mounts["/dev/shm"]]
    assert shm["emptyDir"]["medium"] == "Memory"
    # The image holds no weights: the model's folder lies on a mounted volume.
    model_dir = Path(spec.options["model_dir"])
    (mount,) = [m for m in mounts if model_dir.is_relative_to(m) and m != "/"]
    volume = {v["name"]: v for v in pod["volumes"]}[mounts[mount]]
    assert "persistentVolumeClaim" in volume


# -- docs/deploy.md ----------------------------------------------------------------------------


def _json_block(text: str) -> Any:
    (block,) = re.findall(r"```json\n(.*?)```", text, re.S)
    return json.loads(block)


def test_the_doc_shows_the_planner_output_and_the_secret_keys() -> None:
    text = DOC.read_text()
    assert f"batchserve capacity {' '.join(PLAN_ARGS)} --json" in text
    assert _json_block(text) == plan()
    assert set(re.findall(r"--from-literal=(\w+)=", text)) == SECRET_KEYS
    for overlay in OVERLAYS:
        assert f"deploy/kubernetes/overlays/{overlay}" in text


def _facts() -> set[float]:
    """Every number docs/deploy.md may state, each read from where it comes from."""
    planned = plan()
    facts: set[float] = {planned["rate_rps"], planned["max_batch"], planned["batch_time_ms"]}
    facts |= {planned["per_worker_rps"], planned["min_workers"], planned["recommended_workers"]}
    facts |= {
        planned["headroom"],
        planned["headroom"] * 100,
        round(planned["min_utilization"] * 100),
    }
    facts.add(float(KUBERNETES_VERSION.rsplit(".", 1)[0]))
    facts.add(2)  # kustomize v2 (the one Debian's kubectl holds)
    for overlay in OVERLAYS:
        docs = render(overlay)
        deployments = {d["metadata"]["name"]: d for d in of_kind(docs, "Deployment")}
        facts |= {d["spec"]["replicas"] for d in deployments.values()}
        _, pod, container = worker(docs)
        spec = served_model(docs)
        facts |= {spec.max_batch_size, spec.batch_time_ms, spec.batch_time_ms / 1000}
        facts.add(int(option(container["args"], "--slots")))
        facts.add(pod["terminationGracePeriodSeconds"])
        facts.add(batch_limit_s(spec, environment(docs, container)))
        startup = container["startupProbe"]
        facts.add(startup["periodSeconds"] * startup["failureThreshold"])
        scaled = scaled_object(docs)["spec"]
        trigger = scaled["triggers"][0]["metadata"]
        target = int(trigger["targetQueryValue"])
        facts |= {scaled["minReplicaCount"], scaled["maxReplicaCount"], scaled["cooldownPeriod"]}
        facts |= {target, int(trigger["activationTargetQueryValue"])}
        facts.add(round(planned["rate_rps"] * planned["batch_time_ms"] / 1000 / target, 2))
        (hpa,) = of_kind(docs, "HorizontalPodAutoscaler")
        facts |= {hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]}
        facts.add(hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"])
        (job,) = of_kind(docs, "Job")
        facts.add(job["spec"]["ttlSecondsAfterFinished"])
        facts.add(job["spec"]["template"]["spec"]["securityContext"]["runAsUser"])
        for _, _, c in workloads(docs):
            facts |= {p["containerPort"] for p in c.get("ports", [])}
            facts |= {float(v) for k, v in environment(docs, c).items() if k.endswith("_S") and v}
    # The batcher's time-limit rule, max(10 x batch time, batch time + 10 s).
    facts |= {time_limit_s(1000.0) / 1000.0, time_limit_s(0.0)}
    return facts


def test_every_number_in_the_doc_is_checked() -> None:
    text = re.sub(r"```json\n.*?```", "", DOC.read_text(), flags=re.S)  # compared whole above
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 1,000
    text = re.sub(r"^\d+\. ", "", text, flags=re.M)  # the steps' numbers
    # Numbers standing alone, not inside a name (`-v2`, `gpu-vllm`, an anchor).
    numbers = {float(n) for n in re.findall(r"(?<![\w.-])(\d+(?:\.\d+)?)(?![\w-])", text)}
    facts = _facts()
    unchecked = sorted(n for n in numbers if not any(math.isclose(n, f) for f in facts))
    assert unchecked == [], f"numbers in {DOC.name} no test derives: {unchecked}"
    # And the sentences that carry the sizing say what the render holds.
    planned = plan()
    fixed = render("fixed-1000rps")
    doc, _, container = worker(fixed)
    replicas, slots = doc["spec"]["replicas"], int(option(container["args"], "--slots"))
    assert replicas == planned["recommended_workers"]
    assert f"{replicas} replicas of {slots} slot" in text
    h, batch, rate = planned["headroom"], planned["max_batch"], planned["rate_rps"]
    target = int(scaled_object(fixed)["spec"]["triggers"][0]["metadata"]["targetQueryValue"])
    times, minus = "\u00d7", "\u2212"
    assert f"(1 {minus} {h:g}) {times} {slots} {times} {batch:g} = {target}" in text
    batch_s = planned["batch_time_ms"] / 1000
    asked = f"{rate:g} {times} {batch_s:g} / {target} = {rate * batch_s / target:.2f}"
    assert f"{asked}, so {replicas} replicas" in text
    assert f"twice the plan, {scaled_object(fixed)['spec']['maxReplicaCount']}" in text
    gpu = scaled_object(render("gpu-vllm"))["spec"]
    assert f"up to {gpu['maxReplicaCount']} GPUs" in text
    assert f"{gpu['cooldownPeriod']} s after the queue empties" in text
