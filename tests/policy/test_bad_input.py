"""Every kind of bad policy input gets one clear, located message; the valid policy beside it still loads.

Each test drops a broken file next to a valid one (the ``policy_dir`` fixture), runs the real
``kserve-canary validate`` command and checks the exit code, the ``path:line: field: message``
line and that ``good.yaml`` was still loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from typer.testing import CliRunner

from canary.cli import app
from canary.policy import load_paths
from tests.policy.support import policy_with, valid_policy


def validate(directory: Path, *options: str) -> tuple[int, list[dict[str, object]], list[str]]:
    """``kserve-canary validate`` on the policy root of the namespace directory ``directory``."""
    result = CliRunner().invoke(app, ["validate", "--format", "json", *options, str(directory.parent)])
    assert "Traceback" not in result.output
    document = json.loads(result.output)
    return result.exit_code, document["errors"], [p["name"] for p in document["policies"]]


def single_error(directory: Path, name: str) -> dict[str, object]:
    """Validate, insist on exactly one error located in ``name``, and that the good policy loaded."""
    code, errors, loaded = validate(directory)
    assert code == 1
    assert "good" in loaded
    assert len(errors) == 1, errors
    error = errors[0]
    assert str(error["path"]).endswith(name)
    return error


def test_empty_file(policy_dir: Path) -> None:
    (policy_dir / "empty.yaml").write_text("")
    error = single_error(policy_dir, "empty.yaml")
    assert "empty" in str(error["message"])


def test_file_with_only_comments_is_empty(policy_dir: Path) -> None:
    (policy_dir / "comments.yaml").write_text("# nothing here yet\n---\n")
    assert "empty" in str(single_error(policy_dir, "comments.yaml")["message"])


def test_yaml_syntax_error(policy_dir: Path) -> None:
    (policy_dir / "syntax.yaml").write_text(valid_policy("syntax") + "  steps: [10, 30\n    bad: :\n")
    error = single_error(policy_dir, "syntax.yaml")
    assert "YAML syntax error" in str(error["message"])
    assert error["line"] == 13


def test_list_at_top_level(policy_dir: Path) -> None:
    (policy_dir / "list.yaml").write_text(
        "- apiVersion: kserve-canary.dev/v1alpha1\n- kind: PromotionPolicy\n"
    )
    error = single_error(policy_dir, "list.yaml")
    assert error["line"] == 1
    assert "got a list" in str(error["message"])


def test_wrong_api_version(policy_dir: Path) -> None:
    text = valid_policy("apiv").replace("kserve-canary.dev/v1alpha1", "kserve-canary.dev/v1")
    (policy_dir / "apiv.yaml").write_text(text)
    error = single_error(policy_dir, "apiv.yaml")
    assert (error["line"], error["field"]) == (1, "apiVersion")
    assert "kserve-canary.dev/v1alpha1" in str(error["message"])


def test_wrong_kind(policy_dir: Path) -> None:
    (policy_dir / "kind.yaml").write_text(valid_policy("kind").replace("PromotionPolicy", "Canary"))
    error = single_error(policy_dir, "kind.yaml")
    assert (error["line"], error["field"]) == (2, "kind")
    assert "'Canary'" in str(error["message"])


def test_missing_spec(policy_dir: Path) -> None:
    text = "apiVersion: kserve-canary.dev/v1alpha1\nkind: PromotionPolicy\nmetadata: {name: nospec, namespace: ml}\n"
    (policy_dir / "nospec.yaml").write_text(text)
    error = single_error(policy_dir, "nospec.yaml")
    assert error["field"] == "spec"
    assert "required" in str(error["message"])


def test_missing_namespace_is_the_directory_s(policy_dir: Path) -> None:
    (policy_dir / "nons.yaml").write_text(valid_policy("nons").replace("  namespace: ml\n", ""))
    code, errors, loaded = validate(policy_dir)
    assert (code, errors, sorted(loaded)) == (0, [], ["good", "nons"])


def test_missing_namespace_with_namespaces_from_metadata(policy_dir: Path) -> None:
    (policy_dir / "nons.yaml").write_text(valid_policy("nons").replace("  namespace: ml\n", ""))
    code, errors, loaded = validate(policy_dir, "--policy-namespaces", "metadata")
    assert code == 1 and "good" in loaded
    assert [(e["field"], e["line"]) for e in errors] == [("metadata.namespace", 3)]


SPEC = """\
target: {inferenceService: broken}
checks:
  - {name: p99, metric: latency, max: 800ms}
"""


def test_steps_decreasing(policy_dir: Path) -> None:
    (policy_dir / "steps.yaml").write_text(policy_with(SPEC + "steps: [30, 10]\n"))
    error = single_error(policy_dir, "steps.yaml")
    assert (error["field"], error["line"]) == ("spec.steps", 10)
    assert "strictly increasing" in str(error["message"])


def test_steps_zero(policy_dir: Path) -> None:
    (policy_dir / "zero.yaml").write_text(policy_with(SPEC + "steps: [0]\n"))
    error = single_error(policy_dir, "zero.yaml")
    assert error["field"] == "spec.steps[0]"
    assert "greater than or equal to 1" in str(error["message"])


def test_steps_above_100(policy_dir: Path) -> None:
    (policy_dir / "big.yaml").write_text(policy_with(SPEC + "steps: [10, 150]\n"))
    error = single_error(policy_dir, "big.yaml")
    assert error["field"] == "spec.steps[1]"
    assert "less than or equal to 100" in str(error["message"])


def test_window_in_words(policy_dir: Path) -> None:
    (policy_dir / "window.yaml").write_text(policy_with(SPEC + 'window: "10 minutes"\n'))
    error = single_error(policy_dir, "window.yaml")
    assert (error["field"], error["line"]) == ("spec.window", 10)
    assert '"10m"' in str(error["message"])


def test_negative_interval(policy_dir: Path) -> None:
    (policy_dir / "interval.yaml").write_text(policy_with(SPEC + "interval: -1m\n"))
    error = single_error(policy_dir, "interval.yaml")
    assert (error["field"], error["line"]) == ("spec.interval", 10)
    assert "negative" in str(error["message"])


def test_window_shorter_than_interval(policy_dir: Path) -> None:
    (policy_dir / "short.yaml").write_text(policy_with(SPEC + "window: 30s\ninterval: 1m\n"))
    error = single_error(policy_dir, "short.yaml")
    assert error["field"] == "spec"
    assert "at least interval" in str(error["message"])


def test_check_with_both_metric_and_promql(policy_dir: Path) -> None:
    spec = "target: {inferenceService: broken}\nchecks:\n  - name: both\n    metric: latency\n    promql: up\n    max: 1s\n"
    (policy_dir / "both.yaml").write_text(policy_with(spec))
    error = single_error(policy_dir, "both.yaml")
    assert (error["field"], error["line"]) == ("spec.checks[0]", 9)
    assert "not both" in str(error["message"])


def test_check_with_neither_metric_nor_promql(policy_dir: Path) -> None:
    spec = "target: {inferenceService: broken}\nchecks:\n  - {name: neither, max: 1}\n"
    (policy_dir / "neither.yaml").write_text(policy_with(spec))
    assert "exactly one of 'metric'" in str(single_error(policy_dir, "neither.yaml")["message"])


def test_unknown_metric_kind(policy_dir: Path) -> None:
    spec = "target: {inferenceService: broken}\nchecks:\n  - {name: x, metric: latncy, max: 1s}\n"
    (policy_dir / "metric.yaml").write_text(policy_with(spec))
    error = single_error(policy_dir, "metric.yaml")
    assert error["field"] == "spec.checks[0].metric"
    assert "'latency'" in str(error["message"]) and "'latncy'" in str(error["message"])


def test_quantile_above_one(policy_dir: Path) -> None:
    spec = "target: {inferenceService: broken}\nchecks:\n  - {name: x, metric: latency, quantile: 1.5, max: 1s}\n"
    (policy_dir / "quantile.yaml").write_text(policy_with(spec))
    error = single_error(policy_dir, "quantile.yaml")
    assert (error["field"], error["line"]) == ("spec.checks[0].quantile", 9)


def test_max_fraction_above_one(policy_dir: Path) -> None:
    spec = "target: {inferenceService: broken}\nchecks:\n  - {name: gpu, metric: gpu-memory-peak, maxFraction: 2}\n"
    (policy_dir / "fraction.yaml").write_text(policy_with(spec))
    error = single_error(policy_dir, "fraction.yaml")
    assert error["field"] == "spec.checks[0].maxFraction"
    assert "at most 100%" in str(error["message"])


def test_duplicate_check_names(policy_dir: Path) -> None:
    spec = (
        "target: {inferenceService: broken}\nchecks:\n"
        "  - {name: p99, metric: latency, max: 1s}\n  - {name: p99, metric: error-rate, max: 1%}\n"
    )
    (policy_dir / "dupes.yaml").write_text(policy_with(spec))
    error = single_error(policy_dir, "dupes.yaml")
    assert "used twice" in str(error["message"])


def test_unknown_field_is_an_error_with_a_suggestion(policy_dir: Path) -> None:
    spec = "target: {inferenceService: broken}\nchecks:\n  - {name: p99, metric: latency, max: 1s, maxIncrase: 20%}\n"
    (policy_dir / "typo.yaml").write_text(policy_with(spec))
    error = single_error(policy_dir, "typo.yaml")
    assert (error["field"], error["line"]) == ("spec.checks[0].maxIncrase", 9)
    assert "did you mean 'maxIncrease'" in str(error["message"])


def test_inline_secret_is_refused(policy_dir: Path) -> None:
    spec = SPEC + "notify:\n  - slack: {webhookUrl: 'https://hooks.slack.example/T000/B000/XXXX'}\n"
    (policy_dir / "secret.yaml").write_text(policy_with(spec))
    code, errors, _ = validate(policy_dir)
    assert code == 1
    assert any("webhookUrlFrom" in str(e["message"]) for e in errors)
    assert all("XXXX" not in str(e["message"]) for e in errors), "the secret must not be echoed"


def test_two_policies_for_one_inference_service(policy_dir: Path) -> None:
    """Neither governs (the controller holds the rollout); both files are told; validate fails."""
    (policy_dir / "first.yaml").write_text(valid_policy("first", target="shared"))
    (policy_dir / "second.yaml").write_text(valid_policy("second", target="shared"))
    code, errors, loaded = validate(policy_dir)
    assert code == 1
    assert sorted(loaded) == ["good"]
    messages = {Path(str(e["path"])).name: str(e["message"]) for e in errors}
    assert sorted(messages) == ["first.yaml", "second.yaml"]
    for error in errors:
        assert (error["field"], error["line"]) == ("spec.target.inferenceService", 8)
        assert "ml/shared" in str(error["message"])
    assert "also claimed by 'second'" in messages["first.yaml"]
    assert "also claimed by 'first'" in messages["second.yaml"]
    assert all("neither governs it" in message for message in messages.values())


def test_five_megabyte_file(policy_dir: Path) -> None:
    (policy_dir / "huge.yaml").write_text("# padding\n" * (5 * 1024 * 1024 // 10))
    assert "larger than 1024 KiB" in str(single_error(policy_dir, "huge.yaml")["message"])


def test_binary_garbage(policy_dir: Path) -> None:
    (policy_dir / "garbage.yaml").write_bytes(bytes(range(256)) * 64)
    assert "binary" in str(single_error(policy_dir, "garbage.yaml")["message"])


def test_invalid_utf8(policy_dir: Path) -> None:
    (policy_dir / "latin1.yaml").write_bytes(valid_policy("latin").encode() + b"# caf\xe9\n")
    error = single_error(policy_dir, "latin1.yaml")
    assert "not UTF-8" in str(error["message"])
    assert error["line"] == 12


def test_symlink_loop_in_the_directory(policy_dir: Path) -> None:
    (policy_dir / "nested").mkdir()
    (policy_dir / "nested" / "back").symlink_to(policy_dir)
    (policy_dir / "loop.yaml").symlink_to(policy_dir / "loop.yaml")
    code, errors, loaded = validate(policy_dir)
    assert code == 1
    assert loaded == ["good"], "the good policy is read once, not again through the loop"
    messages = {Path(str(e["path"])).name: str(e["message"]) for e in errors}
    assert "symlink loop" in messages["back"]
    assert "symlink loop" in messages["loop.yaml"]


def test_unreadable_file(tmp_path: Path) -> None:
    # The unprivileged reader must be able to reach the directory: pytest's tmp root is private.
    root = Path(tempfile.mkdtemp(prefix="kserve-canary-unreadable-"))
    root.chmod(0o755)
    policy_dir = root / "ml"
    policy_dir.mkdir(mode=0o755)
    (policy_dir / "good.yaml").write_text(valid_policy())
    unreadable = policy_dir / "secret-ish.yaml"
    unreadable.write_text(valid_policy("unreadable"))
    unreadable.chmod(0)
    try:
        result = _load_without_privileges(root)
    finally:
        shutil.rmtree(root)
    assert result["loaded"] == ["good"]
    assert result["errors"] == [f"{unreadable}: cannot read the file: permission denied"]


def _load_without_privileges(directory: Path) -> dict[str, list[str]]:
    """Root reads every file, so load in a forked child that dropped to ``nobody``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            result = load_paths([directory])
            payload = {
                "loaded": [p.policy.metadata.name for p in result.policies],
                "errors": [str(e) for e in result.errors],
            }
            os.write(write_end, json.dumps(payload).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        data = reader.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def test_policy_name_not_a_kubernetes_name(policy_dir: Path) -> None:
    (policy_dir / "name.yaml").write_text(valid_policy("Llama_Chat", target="llama"))
    error = single_error(policy_dir, "name.yaml")
    assert (error["field"], error["line"]) == ("metadata.name", 4)
    assert "not a valid Kubernetes name" in str(error["message"])


def test_duplicate_yaml_keys_are_errors(policy_dir: Path) -> None:
    (policy_dir / "dupkey.yaml").write_text(valid_policy("dupkey") + "  steps: [5, 100]\n")
    error = single_error(policy_dir, "dupkey.yaml")
    assert (error["field"], error["line"]) == ("spec.steps", 12)


def test_yaml_alias_bomb_is_refused(policy_dir: Path) -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)]
    (policy_dir / "bomb.yaml").write_text("\n".join(lines) + "\n")
    assert "more than 100000 YAML nodes" in str(single_error(policy_dir, "bomb.yaml")["message"])


# -- hostile input: nothing a policy author writes stops the loader (issue 17) -------------------


def test_deeply_nested_yaml_is_an_error_not_a_crash(policy_dir: Path) -> None:
    # 6 KB of "[[[..." used to raise RecursionError out of the loader and kill the controller.
    (policy_dir / "nested.yaml").write_text("[" * 3000 + "]" * 3000)
    error = single_error(policy_dir, "nested.yaml")
    assert "nested deeper than 64 levels" in str(error["message"])


def test_nested_mappings_are_capped_too(policy_dir: Path) -> None:
    (policy_dir / "deep.yaml").write_text("{a: " * 2000 + "}" * 2000)
    assert "nested deeper than 64 levels" in str(single_error(policy_dir, "deep.yaml")["message"])


def test_an_integer_too_long_to_convert_is_an_error_not_a_crash(policy_dir: Path) -> None:
    (policy_dir / "digits.yaml").write_text("spec: " + "9" * 6000 + "\n")
    assert "cannot read this file as YAML: a value cannot be constructed (a number too large" in str(
        single_error(policy_dir, "digits.yaml")["message"]
    )


def test_a_fifo_named_yaml_does_not_hang_validate(policy_dir: Path) -> None:
    os.mkfifo(policy_dir / "pipe.yaml")
    # In a child process: on a blocking open the test would hang instead of failing.
    completed = subprocess.run(
        [sys.executable, "-m", "canary", "validate", "--format", "json", str(policy_dir.parent)],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert completed.returncode == 1, completed.stderr
    document = json.loads(completed.stdout)
    assert [p["name"] for p in document["policies"]] == ["good"]
    [error] = document["errors"]
    assert str(error["path"]).endswith("pipe.yaml")
    assert "not a regular file" in error["message"]


def test_a_file_with_one_invalid_document_is_rejected_whole(policy_dir: Path) -> None:
    # A bare URL first and a valid policy second: the file was half-loaded (and could be named as a
    # urlFrom file, turning the controller into an HTTP client for the author).
    (policy_dir / "twofaced.yaml").write_text(
        "http://169.254.169.254/latest/meta-data/\n---\n" + valid_policy("twin")
    )
    error = single_error(policy_dir, "twofaced.yaml")
    assert "rejected whole" in str(error["message"])


def test_a_policy_for_another_namespace_than_its_directory_is_refused(policy_dir: Path) -> None:
    """Team ml writes only policies/ml/: it cannot govern team-b's InferenceService."""
    (policy_dir / "takeover.yaml").write_text(
        valid_policy("takeover").replace("namespace: ml", "namespace: team-b")
    )
    error = single_error(policy_dir, "takeover.yaml")
    assert (error["field"], error["line"]) == ("metadata.namespace", 5)
    assert "'team-b' but the file lives in" in str(error["message"])


def test_a_policy_file_directly_in_the_root_is_told_where_to_live(policy_dir: Path) -> None:
    (policy_dir.parent / "stray.yaml").write_text(valid_policy("stray"))
    error = single_error(policy_dir, "stray.yaml")
    assert f"move it to {policy_dir.parent / '<namespace>' / 'stray.yaml'}" in str(error["message"])
    code, errors, loaded = validate(policy_dir, "--policy-namespaces", "metadata")
    assert (code, errors, sorted(loaded)) == (0, [], ["good", "stray"])


def test_a_namespace_directory_must_be_a_namespace_name(policy_dir: Path) -> None:
    (policy_dir.parent / "Not_A_Namespace").mkdir()
    (policy_dir.parent / "Not_A_Namespace" / "x.yaml").write_text(valid_policy("x"))
    assert "is not a namespace name" in str(single_error(policy_dir, "x.yaml")["message"])


def test_a_symlink_out_of_the_namespace_directory_is_not_read(policy_dir: Path, tmp_path: Path) -> None:
    # A team syncing its Git directory could point x.yaml at a file only the controller may read; its
    # parts would come back in the errors (``(got 'the-secret-value')``).
    outside = tmp_path / "controller-secret.yaml"
    outside.write_text("kind: the-secret-value\n")
    (policy_dir / "x.yaml").symlink_to(outside)
    (policy_dir.parent / "team-b").mkdir()
    (policy_dir.parent / "team-b" / "own.yaml").write_text(valid_policy("own").replace("namespace: ml", ""))
    (policy_dir / "borrowed.yaml").symlink_to(policy_dir.parent / "team-b" / "own.yaml")
    code, errors, loaded = validate(policy_dir)
    assert code == 1 and sorted(loaded) == ["good", "own"]
    messages = {Path(str(e["path"])).name: str(e["message"]) for e in errors}
    assert sorted(messages) == ["borrowed.yaml", "x.yaml"]
    assert all("a symlink leading out of" in message for message in messages.values())
    assert "the-secret-value" not in json.dumps(errors)


def test_a_label_name_with_dots_is_refused_with_the_name_to_write(policy_dir: Path) -> None:
    """Label names stand outside quotes in PromQL: only identifiers, and an OpenTelemetry attribute
    name gets the Prometheus name it is stored under."""
    spec = (
        SPEC + "metrics:\n  requestLabels: otlp\n  labels:\n    requests: {namespace: k8s.namespace.name}\n"
    )
    (policy_dir / "broken.yaml").write_text(policy_with(spec))
    code, errors, loaded = validate(policy_dir)
    assert code == 1 and "broken" not in loaded
    [error] = errors
    assert error["field"] == "spec.metrics.labels.requests.namespace"
    assert "is not a Prometheus label name" in error["message"]
    assert "'k8s_namespace_name'" in error["message"]
