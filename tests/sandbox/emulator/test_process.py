"""``python -m canary_sandbox.emulator`` as a separate process, the way the demo and end-to-end tests run it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from canary_sandbox.emulator import EmulatorAdminClient
from kubernetes import client, config

from tests.sandbox.emulator.support import GROUP, NAMESPACE, PLURAL, VERSION

SEED = textwrap.dedent(
    f"""
    apiVersion: serving.kserve.io/v1beta1
    kind: InferenceService
    metadata: {{name: llama, namespace: {NAMESPACE}}}
    spec:
      predictor:
        model: {{modelFormat: {{name: huggingface}}, storageUri: "hf://meta/llama-3-8b"}}
    ---
    apiVersion: v1
    kind: Namespace
    metadata: {{name: {NAMESPACE}}}
    """
)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_emulator_process_writes_a_kubeconfig_prints_its_url_and_stops_cleanly_on_a_signal(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text(SEED)
    kubeconfig = tmp_path / "kubeconfig.yaml"
    process = subprocess.Popen(
        [sys.executable, "-m", "canary_sandbox.emulator", "--port", "0", "--kubeconfig-out", str(kubeconfig),
         "--manual-clock", "--reconcile-delay", "0.5", "--seed-file", str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        custom = client.CustomObjectsApi(api)
        EmulatorAdminClient(url).advance(1.5)
        isvc = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "llama")
        assert isvc["status"]["components"]["predictor"]["latestReadyRevision"] == "llama-predictor-00001"
        api.close()
        process.send_signal(stop_signal)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
