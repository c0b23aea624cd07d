"""The KServe status model follows KServe's code, not a summary of it (issue #33, item 6).

Upstream, kserve/kserve:

* ``pkg/controller/v1beta1/inferenceservice/reconcilers/knative/ksvc_reconciler.go`` at 279fb1e5,
  ``createKnativeService``: line 104 routes the rest of the traffic to ``latestRolledoutRevision``
  as it is (the kfserving version at 00196962, lines 84-90, swapped in ``previousRolledoutRevision``
  there; PRs #2040/#2097 removed it);
* ``pkg/apis/serving/v1beta1/inference_service_status.go`` at 0217bdab, ``PropagateStatus``,
  lines 518-587: a promotion is recorded at 536-541; 542-553 roll ``latestRolledoutRevision`` back
  to ``previousRolledoutRevision`` when the latest ready revision, already rolled out and also the
  latest created (545), has less than 100% on its ``latestRevision`` entry (546) and 100% in total
  (548-549: the split "over the same revision").
"""

from __future__ import annotations

from canary.kserve.status_model import KServeSim

REV1, REV2, REV3 = "llama-predictor-00001", "llama-predictor-00002", "llama-predictor-00003"


def promoted() -> KServeSim:
    """REV1 was rolled out, then REV2 promoted (the field removed): REV2 rolled out, REV1 previous."""
    sim = KServeSim.serving()
    sim.change_model("s3://m/v2", percent=10)
    sim.reconcile()
    sim.make_ready()
    sim.reconcile()
    sim.set_percent(None)
    sim.reconcile()
    assert (sim.latest_rolledout, sim.previous_rolledout) == (REV2, REV1)
    assert sim.traffic == [{"latestRevision": True, "percent": 100, "revisionName": REV2}]
    return sim


def routes(sim: KServeSim) -> list[tuple[str, int, bool]]:
    return [(target["revisionName"], target["percent"], target["latestRevision"]) for target in sim.traffic]


def test_a_zero_after_a_promotion_rolls_latest_rolledout_back_to_the_previous_revision() -> None:
    # PropagateStatus 542-553: latestRolledoutRevision goes back to REV1; previous stays REV1.
    sim = promoted()
    sim.set_percent(0)
    sim.reconcile()
    assert (sim.latest_rolledout, sim.previous_rolledout) == (REV1, REV1)
    assert routes(sim) == [(REV2, 0, True), (REV1, 100, False)]
    assert sim.observe().latest_rolledout_revision == REV1


def test_the_first_pass_after_the_zero_still_routes_everything_to_the_promoted_revision() -> None:
    # ksvc_reconciler.go:104 routes "prev" to latestRolledoutRevision (REV2 itself); PropagateStatus
    # sees 0 + 100 on REV2 and rolls latestRolledout back; only the next pass routes REV1.
    sim = promoted()
    sim.set_percent(0)
    sim.reconcile_once()
    assert routes(sim) == [(REV2, 0, True), (REV2, 100, False)]
    assert (sim.latest_rolledout, sim.previous_rolledout) == (REV1, REV1)
    sim.reconcile_once()
    assert routes(sim) == [(REV2, 0, True), (REV1, 100, False)]


def test_a_gitops_percentage_after_a_promotion_splits_with_the_previous_revision_and_says_so() -> None:
    # Argo CD re-applying 10: the same split as before the promotion, and status names REV1 stable.
    sim = promoted()
    sim.set_percent(10)
    sim.reconcile()
    assert routes(sim) == [(REV2, 10, True), (REV1, 90, False)]
    assert sim.latest_rolledout == REV1


def test_no_roll_back_while_a_newer_revision_is_not_ready() -> None:
    # Line 545: latestReady (REV2) != latestCreated (REV3): latestRolledout stays REV2, which then
    # keeps the rest of the traffic ("prev" is latestRolledoutRevision, ksvc_reconciler.go:104).
    sim = promoted()
    sim.change_model("s3://m/v3", percent=0)
    sim.reconcile()
    assert sim.latest_created == REV3
    assert (sim.latest_rolledout, sim.previous_rolledout) == (REV2, REV1)
    assert routes(sim) == [(REV2, 0, True), (REV2, 100, False)]


def test_no_roll_back_without_a_previous_revision() -> None:
    # Line 549: PreviousRolledoutRevision is "" for the first revision ever rolled out.
    sim = KServeSim.serving()
    sim.set_percent(0)
    sim.reconcile()
    assert (sim.latest_rolledout, sim.previous_rolledout) == (REV1, None)
    assert routes(sim) == [(REV1, 0, True), (REV1, 100, False)]


def test_a_canary_rolled_back_before_its_promotion_leaves_the_rolled_out_revisions_alone() -> None:
    sim = KServeSim.serving()
    sim.change_model("s3://m/v2", percent=10)
    sim.reconcile()
    sim.make_ready()
    sim.reconcile()
    sim.set_percent(0)
    sim.reconcile()
    assert (sim.latest_rolledout, sim.previous_rolledout) == (REV1, None)
    assert routes(sim) == [(REV2, 0, True), (REV1, 100, False)]


def test_the_next_revision_after_a_roll_back_splits_with_the_revision_kserve_rolled_back_to() -> None:
    sim = promoted()
    sim.set_percent(0)
    sim.reconcile()
    sim.change_model("s3://m/v3", percent=10)
    sim.reconcile()
    sim.make_ready()
    sim.reconcile()
    assert routes(sim) == [(REV3, 10, True), (REV1, 90, False)]
    assert sim.observe().stable_for(REV3) == REV1
