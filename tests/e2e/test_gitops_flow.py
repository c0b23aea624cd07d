"""The GitOps flow (docs/gitops.md): the real kubectl against the emulator, the controller as a process.

A model team's directory holds its InferenceService and its PromotionPolicy. ``kubectl apply -f`` of
the directory creates both; changing ``storageUri`` in that directory and applying again starts a
rollout the controller runs from the object; ``kubectl get promotionpolicies -A`` shows its columns;
the two-step ``kubectl wait`` of docs/gitops.md returns when *this* revision is promoted and not
before; an object with a typo reports its field in a condition while the other keeps running.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import Stack, inference_service, wait_until

NS = "team-a"
V1, V2 = "s3://models/fraud/v1", "s3://models/fraud/v2"
HEALTHY = RevisionBehaviour(median_ms=80)
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"

POLICY = f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: fraud, namespace: {NS}}}
spec:
  target: {{inferenceService: fraud}}
  steps: [10, 50, 100]
  window: 3s
  interval: 1s
  minRequests: 10
  progressDeadline: 20s
  checks:
    - {{name: p90, metric: latency, quantile: 0.9, max: 2s, maxIncrease: 50%}}
    - {{name: errors, metric: error-rate, max: 5%}}
  notify:
    - webhook: {{urlFrom: {{env: HOOK_URL}}}}
"""

# "windw" for "window": the CRD keeps unknown fields under spec so the controller can say which.
TYPO = f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: typo, namespace: {NS}}}
spec:
  target: {{inferenceService: other}}
  steps: [10, 100]
  windw: 3s
  checks:
    - {{name: errors, metric: error-rate, max: 5%}}
"""


def kubectl(stack: Stack, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(stack.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_model_directory(directory: Path, storage_uri: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "inferenceservice.yaml").write_text(
        yaml.safe_dump(inference_service(NS, "fraud", storage_uri))
    )
    (directory / "promotionpolicy.yaml").write_text(POLICY)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def test_a_policy_beside_its_model_in_git_runs_the_rollout_and_kubectl_wait_returns_on_this_promotion(
    tmp_path: Path,
) -> None:
    models = [ModelTraffic(NS, "fraud", 40.0, {V1: HEALTHY, V2: HEALTHY})]
    with Stack(models, {}, policy_objects=True, env={"HOOK_URL": "placeholder"}) as stack:
        stack.env = {"HOOK_URL": f"{stack.receiver.url}/hook"}
        repo = tmp_path / "git" / "fraud"
        write_model_directory(repo, V1)
        applied = kubectl(stack, "apply", "-f", str(repo))
        assert applied.returncode == 0, applied.stderr
        assert "promotionpolicy.kserve-canary.dev/fraud created" in applied.stdout
        assert wait_until(
            lambda: bool(stack.predictor_status(NS, "fraud").get("latestRolledoutRevision")), 30
        )
        controller = stack.start_controller("gitops")

        # v2, the GitOps way: only storageUri changes in the directory, which is applied again.
        write_model_directory(repo, V2)
        applied = kubectl(stack, "apply", "-f", str(repo), "-o", "json")
        assert applied.returncode == 0, applied.stderr
        items = json.loads(applied.stdout)["items"]
        generation = next(i for i in items if i["kind"] == "InferenceService")["metadata"]["generation"]
        assert generation == 2
        waited: dict[str, Any] = {}

        def wait_for_promotion() -> None:
            first = kubectl(
                stack, "-n", NS, "wait", "ppol/fraud", f"--for=jsonpath={{.status.targetGeneration}}={generation}",
                "--timeout=60s", timeout=70,
            )  # fmt: skip
            second = kubectl(
                stack,
                "-n",
                NS,
                "wait",
                "ppol/fraud",
                "--for=condition=Promoted",
                "--timeout=120s",
                timeout=130,
            )
            waited.update(first=first, second=second, at=time.time())

        waiter = threading.Thread(target=wait_for_promotion)
        waiter.start()
        assert wait_until(lambda: (stack.state(NS, "fraud") or {}).get("phase") == "Progressing", 30)
        assert "at" not in waited, "kubectl wait returned while the rollout was progressing"

        def listed_row() -> list[str]:
            listed = kubectl(stack, "get", "promotionpolicies", "-A")
            assert listed.returncode == 0, listed.stderr
            header, *rows = listed.stdout.splitlines()
            assert header.split() == [
                "NAMESPACE",
                "NAME",
                "TARGET",
                "PHASE",
                "WEIGHT",
                "STEP",
                "VERDICT",
                "AGE",
            ]
            return next(r.split() for r in rows if r.split()[:2] == [NS, "fraud"])

        # The status is projected from the state soon after it changes, not in the same write: on a
        # loaded machine the listing may still show the phase before, for a moment.
        assert wait_until(lambda: listed_row()[3] in {"Pending", "Progressing"}, 10), listed_row()
        assert listed_row()[2] == "fraud"
        verdict = [
            "-n",
            NS,
            "get",
            "ppol",
            "fraud",
            "-o",
            "jsonpath={.status.lastDecision.verdict}",
        ]
        assert wait_until(lambda: kubectl(stack, *verdict).stdout in {"pass", "inconclusive"}, 30), (
            "the Verdict column stays empty"
        )

        waiter.join(timeout=150)
        assert "at" in waited, "kubectl wait did not return"
        status = stack.policy_object(NS, "fraud").get("status")
        assert waited["first"].returncode == 0, (waited["first"].stderr, status, controller.log()[-3000:])
        assert waited["second"].returncode == 0, (
            waited["second"].stderr,
            status,
            stack.state(NS, "fraud"),
            controller.log()[-6000:],
        )
        state = stack.state(NS, "fraud") or {}
        promoted = next(h for h in state["history"] if h["action"] == "promote")
        # The wait returned on this promotion: after the controller wrote it, never before.
        assert waited["at"] >= datetime.fromisoformat(promoted["at"]).timestamp() - 0.5
        obj = stack.policy_object(NS, "fraud")
        assert condition(obj, "Promoted")["status"] == "True"
        assert state["revision"] in condition(obj, "Promoted")["message"]
        assert obj["status"]["canaryRevision"] == state["revision"]
        assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
        shown = kubectl(stack, "-n", NS, "get", "ppol", "fraud", "--no-headers").stdout.split()
        assert shown[:2] == ["fraud", "fraud"]
        assert shown[2] in {"Succeeded", "Promoted", "Baking"}, shown

        # A typo in another team member's object: the CRD's schema keeps no unknown fields, so kubectl's
        # strict field validation refuses it before it is stored, naming the field; fraud is untouched.
        (repo / "typo.yaml").write_text(TYPO)
        applied = kubectl(stack, "apply", "-f", str(repo / "typo.yaml"))
        assert applied.returncode == 1, applied.stdout
        assert 'unknown field "spec.windw"' in applied.stderr, applied.stderr
        assert kubectl(stack, "-n", NS, "get", "ppol", "typo").returncode == 1
        assert controller.alive
