"""The deployment examples under ``deploy/``, checked without running them: the Kubernetes manifest against
the ``kubernetes`` client's models (every field known, of its type, the required ones given; readiness from
/health), the Ray Serve config against Serve's own schema and builder; the Ray options' errors; the
prefix-cache gauges."""

import pathlib
import re

import pytest
import yaml

from specdec.cli import build_parser, main
from specdec.models.prefix import PrefixCache
from specdec.server.metrics import Metrics

DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "deploy"
KINDS = {("apps/v1", "Deployment"): "V1Deployment", ("v1", "Service"): "V1Service"}


def check_model(data, type_name: str, where: str) -> None:
    """``data`` has only fields ``type_name`` (a kubernetes client type string) knows, each of its type."""
    import kubernetes.client as k8s

    if type_name.lower().startswith("list["):  # the client spells them List[...] and Dict[str, ...]
        assert isinstance(data, list), f"{where}: a list expected, not {data!r}"
        for i, item in enumerate(data):
            check_model(item, type_name[5:-1], f"{where}[{i}]")
        return
    if (found := re.fullmatch(r"(?:dict\(str, (.*)\)|Dict\[str, (.*)\])", type_name)) is not None:
        assert isinstance(data, dict), f"{where}: a mapping expected"
        inner = found.group(1) or found.group(2)
        for key, value in data.items():
            check_model(value, inner, f"{where}.{key}")
        return
    simple = {"str": str, "int": int, "bool": bool, "float": (int, float)}
    if type_name in simple:
        assert isinstance(data, simple[type_name]) and not (type_name == "int" and isinstance(data, bool)), \
            f"{where}: {type_name} expected, not {data!r}"
        return
    if type_name == "object":  # IntOrString and free-form fields
        return
    model = getattr(k8s, type_name)
    assert isinstance(data, dict), f"{where}: a {type_name} mapping expected"
    names = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, value in data.items():
        assert key in names, f"{where}: {type_name} has no field {key!r}"
        check_model(value, model.openapi_types[names[key]], f"{where}.{key}")


def manifests() -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()) if doc]


def test_kubernetes_manifest_is_valid_against_the_client_models():
    k8s = pytest.importorskip("kubernetes.client")
    docs = manifests()
    assert {(d["apiVersion"], d["kind"]) for d in docs} == set(KINDS)
    for doc in docs:
        type_name = KINDS[(doc["apiVersion"], doc["kind"])]
        check_model(doc, type_name, doc["kind"])
        k8s.ApiClient()._ApiClient__deserialize(doc, type_name)  # the required fields (ValueError if missing)


def test_check_model_refuses_a_misspelt_field_and_a_wrong_type():
    pytest.importorskip("kubernetes.client")
    deployment = manifests()[0]
    spec = deployment["spec"]
    with pytest.raises(AssertionError, match="no field 'replica'"):
        check_model({**deployment, "spec": {**spec, "replica": 2}}, "V1Deployment", "Deployment")
    with pytest.raises(AssertionError, match="int expected"):
        check_model({**deployment, "spec": {**spec, "replicas": "2"}}, "V1Deployment", "Deployment")
    k8s = pytest.importorskip("kubernetes.client")
    service = manifests()[1]
    portless = {**service, "spec": {**service["spec"], "ports": [{"name": "http", "targetPort": "http"}]}}
    with pytest.raises(Exception, match="port"):  # a required field left out
        k8s.ApiClient()._ApiClient__deserialize(portless, "V1Service")


def test_kubernetes_pods_are_ready_from_health_and_the_service_selects_them():
    deployment, service = manifests()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert "http" in {p["name"] for p in container["ports"]}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    args = build_parser().parse_args(container["command"][1:])  # the pod's command is a valid specdec serve
    assert args.command == "serve" and args.host == "0.0.0.0"


def test_ray_serve_config_matches_serves_schema_and_builds():
    pytest.importorskip("ray.serve")
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load((DEPLOY / "ray-serve.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config)
    (app,) = schema.applications
    assert app.import_path == "specdec.ray_serve:build"
    from specdec.ray_serve import build

    argv = app.args["argv"]
    assert argv[argv.index("--replicas") + 1] == "2"
    built = build({"argv": ["--toy", *argv]})  # --toy: the application, without the pair's files
    assert type(built).__name__ == "Application"
    with pytest.raises(ValueError, match="argv="):
        build({"argv": "--replicas 2"})


@pytest.mark.parametrize("argv, message", [
    (["--replicas", "-1"], "--replicas -1 is invalid: must be an integer >= 0"),
    (["--replicas", "2", "--imbalance", "-3"], "--imbalance -3 is invalid: must be an integer >= 0"),
    (["--replicas", "2", "--cpus-per-replica", "-1"], "--cpus-per-replica -1.0 is invalid: must be a number >= 0"),
])
def test_bad_ray_options_are_named(argv, message, capsys):
    assert main(["serve", "--toy", *argv]) == 2
    assert message in capsys.readouterr().err


def test_ray_settings_name_a_bad_value():
    pytest.importorskip("ray.serve")
    from specdec.server.replicas import RaySettings

    with pytest.raises(ValueError, match="router='random' is invalid: must be one of prefix, pow2"):
        RaySettings(router="random").validate()
    with pytest.raises(ValueError, match="replicas=0 is invalid"):
        RaySettings(replicas=0).validate()


def test_prefix_cache_gauges():
    metrics, cache = Metrics(), PrefixCache(1000)
    metrics.sample_prefix_cache(None)
    assert "specdec_prefix_cache_usage_perc 0.0" in metrics.exposition().decode()
    cache.add("owner", [1, 2, 3], rows=None, nbytes=250)
    metrics.sample_prefix_cache(cache)
    text = metrics.exposition().decode()
    for line in ("specdec_prefix_cache_usage_perc 0.25", "specdec_prefix_cache_bytes 250.0",
                 "specdec_prefix_cache_entries 1.0"):
        assert line in text, line
