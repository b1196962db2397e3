"""deploy/kubernetes/ as `kubectl kustomize` renders it: a Deployment whose pods run the
daemon on the ConfigMap's conduit.toml, probed on the daemon's own /ready and /live,
confined as the systemd unit confines it; a Service; an autoscaler on a metric the
daemon serves. The ConfigMap's configuration runs a real daemon here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from conduit.daemon.config import load_config, parse_tcp_address
from conduit.daemon.metrics_endpoint import LIVE_PATH, READY_PATH
from conduit.daemon.server import Daemon
from tests.conftest import WAIT_S
from tests.daemon.test_metrics import http, scrape

DEPLOY = Path(__file__).parent.parent / "deploy"
KUBECTL = shutil.which("kubectl")
SECRETS = {
    "CONDUIT_TOKEN": "cdt_pod-master-token-0123456789abcdef",
    "CONDUIT_AUDIT_URL": "postgresql://conduit:secret@postgres/conduit",
}

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    """The rendered objects, by kind."""
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(DEPLOY / "kubernetes")],
        capture_output=True,
        check=False,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, done.stderr.decode()
    objects = [o for o in yaml.safe_load_all(done.stdout) if o]
    by_kind = {o["kind"]: o for o in objects}
    assert len(by_kind) == len(objects), "one object of each kind"
    return by_kind


def _container(rendered: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (container,) = rendered["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def _conduit_toml(rendered: dict[str, dict[str, Any]], directory: Path) -> Path:
    path = directory / "conduit.toml"
    path.write_text(rendered["ConfigMap"]["data"]["conduit.toml"])
    return path


def test_it_renders_a_deployment_a_service_an_autoscaler_and_the_config(
    rendered: dict[str, dict[str, Any]],
) -> None:
    assert set(rendered) == {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"}
    labels = rendered["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert rendered["Service"]["spec"]["selector"] == labels
    assert rendered["Deployment"]["spec"]["selector"]["matchLabels"] == labels
    target = rendered["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (
        "Deployment",
        rendered["Deployment"]["metadata"]["name"],
    )
    volumes = rendered["Deployment"]["spec"]["template"]["spec"]["volumes"]
    config = next(v for v in volumes if "configMap" in v)
    assert config["configMap"]["name"] == rendered["ConfigMap"]["metadata"]["name"]


def test_the_pod_runs_the_daemon_on_the_configmaps_config_with_the_secrets(
    rendered: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    container = _container(rendered)
    command = container["command"]
    assert command[:2] == ["conduit", "serve"]
    config_path = Path(command[command.index("--config") + 1])
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[str(config_path.parent)]["readOnly"] is True
    secret_env = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e
    }
    assert set(secret_env) == set(SECRETS)  # no secret in the ConfigMap or the image
    config = load_config(_conduit_toml(rendered, tmp_path), environ=SECRETS)
    assert config.auth.token == SECRETS["CONDUIT_TOKEN"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert parse_tcp_address(config.server.tcp)[1] == ports["rpc"]
    assert parse_tcp_address(config.metrics.listen)[1] == ports["metrics"]
    service_ports = {p["targetPort"] for p in rendered["Service"]["spec"]["ports"]}
    assert service_ports == {"rpc", "metrics"}
    # Everything the daemon writes is in a volume: the root file system is read-only.
    written = [config.server.state_dir, config.server.socket, "/tmp"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    written.append(env["XDG_CACHE_HOME"])
    for path in written:
        assert any(Path(path).is_relative_to(mount) for mount in mounts), path
    grace = rendered["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > config.server.grace_period_s


def test_the_probes_ask_the_daemons_own_endpoints(rendered: dict[str, dict[str, Any]]) -> None:
    container = _container(rendered)
    probes = {name: container[name]["httpGet"] for name in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"] == {"path": READY_PATH, "port": "metrics"}
    assert probes["livenessProbe"] == {"path": LIVE_PATH, "port": "metrics"}
    startup = container["startupProbe"]
    # A first start builds the components for about a minute.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


# What the systemd unit says, and how the pod says the same.
CONFINEMENT = {
    "NoNewPrivileges=yes": ("container", "allowPrivilegeEscalation", False),
    "CapabilityBoundingSet=": ("container", "capabilities", {"drop": ["ALL"]}),
    "ProtectSystem=strict": ("container", "readOnlyRootFilesystem", True),
    "SystemCallFilter=@system-service": ("pod", "seccompProfile", {"type": "RuntimeDefault"}),
    "User=conduit": ("pod", "runAsNonRoot", True),
}


@pytest.mark.parametrize("directive", sorted(CONFINEMENT))
def test_the_units_confinement_is_carried_over(
    rendered: dict[str, dict[str, Any]], directive: str
) -> None:
    assert directive in (DEPLOY / "conduit.service").read_text().splitlines()
    where, key, value = CONFINEMENT[directive]
    spec = rendered["Deployment"]["spec"]["template"]["spec"]
    context = spec["securityContext"] if where == "pod" else _container(rendered)["securityContext"]
    assert context[key] == value


async def test_the_configmaps_config_serves_ready_and_the_autoscalers_metric(
    rendered: dict[str, dict[str, Any]],
    tmp_path: Path,
    short_dir: Path,
    nursery: trio.Nursery,
    postgres_url: str,
) -> None:
    # As in a pod, with a real shared store, but on loopback ports of its own and in
    # this test's directories.
    secrets = {**SECRETS, "CONDUIT_AUDIT_URL": postgres_url}
    overrides = {
        "server.tcp": "127.0.0.1:0",
        "server.socket": str(short_dir / "c.sock"),
        "server.state_dir": str(tmp_path / "state"),
        "metrics.listen": "127.0.0.1:0",
        "executors.deno.pool_size": 1,
    }
    path = _conduit_toml(rendered, tmp_path)
    config = load_config(path, environ=secrets, overrides=overrides)
    daemon = Daemon(config, reload=lambda: config)
    with trio.fail_after(WAIT_S):
        info = await nursery.start(daemon.serve)
        await daemon.registry.wait_ready()
    assert info.metrics_address is not None
    status, _, body = await http(
        info.metrics_address, f"GET {READY_PATH} HTTP/1.1\r\n\r\n".encode()
    )
    assert (status, body) == ("HTTP/1.1 200 OK", b"ready\n")
    (metric,) = rendered["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] in await scrape(info.metrics_address)
    daemon.shutdown()
