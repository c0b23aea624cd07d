"""Microsoft Teams (Adaptive Card through a Workflows webhook) and Discord (content + embeds), and what
every chat message carries: the cluster, the dashboard link, no repeated sentence, counted samples."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from pydantic import ValidationError

from canary.notify.delivery import USER_AGENT, DeliveryError, TargetKind
from canary.notify.destinations import destination_for
from canary.notify.discord import discord_message
from canary.notify.message import CheckLine, CheckVerdict, MessageContext, samples_text
from canary.notify.secrets import MASK, Redactor, SecretResolver
from canary.notify.slack import slack_message
from canary.notify.teams import ADAPTIVE_CARD_CONTENT_TYPE, teams_message
from canary.policy import load_paths
from canary.policy.model import NotifyTarget
from canary.policy.scope import SecretScope
from tests.notify.support import Receiver, Reply, make_notification, rollback_notification
from tests.policy.support import valid_policy

CONTEXT = MessageContext(cluster="prod-eu", dashboard_url="https://canary.example.com/")
LINK = "https://canary.example.com/#/rollouts/ml/llama-chat"


def _target(kind: str, env: str = "HOOK_URL") -> NotifyTarget:
    return NotifyTarget.model_validate({kind: {"webhookUrlFrom": {"env": env}}})


def _facts(card: dict[str, Any]) -> dict[str, str]:
    return {
        fact["title"]: fact["value"]
        for block in card["body"]
        if block["type"] == "FactSet"
        for fact in block["facts"]
    }


def test_teams_gets_one_adaptive_card_over_real_http(receiver: Receiver) -> None:
    resolver = SecretResolver(
        Redactor(), {"HOOK_URL": receiver.url + "/workflows/abc/triggers/manual?sig=s3cr3t"}
    )
    destination = destination_for(_target("teams"), resolver=resolver, context=CONTEXT, ref="notify[0]")
    assert (destination.key, destination.kind, destination.durable) == (
        "teams env HOOK_URL",
        TargetKind.TEAMS,
        True,
    )
    destination.sender.send(rollback_notification())

    (request,) = receiver.wait_for(1)
    assert request.headers["User-Agent"] == USER_AGENT
    message = request.json()
    assert message["type"] == "message"
    (attachment,) = message["attachments"]
    assert (
        attachment["contentType"] == ADAPTIVE_CARD_CONTENT_TYPE == "application/vnd.microsoft.card.adaptive"
    )
    card = attachment["content"]
    assert (card["type"], card["version"]) == ("AdaptiveCard", "1.4")
    # Markdown escaped (shown as "⏪ [prod-eu] llama-chat: …"): nothing in a card's text is a link.
    assert card["body"][0]["text"] == "⏪ \\[prod-eu\\] llama-chat: canary rolled back 30% → 0%"
    facts = _facts(card)
    assert facts["Cluster"] == "prod-eu"
    assert facts["Model"] == "ml/llama-chat"
    assert facts["❌ oom (critical)"] == "2, not ≤ 0"
    assert facts["⚠️ kv-cache"] == "query failed: Prometheus timed out (limit ≤ 95%)"
    assert card["actions"] == [{"type": "Action.OpenUrl", "title": "Open in the dashboard", "url": LINK}]


def test_discord_gets_content_and_an_embed_within_its_limits(receiver: Receiver) -> None:
    resolver = SecretResolver(Redactor(), {"HOOK_URL": receiver.url + "/api/webhooks/123/discord-token-456"})
    destination = destination_for(_target("discord"), resolver=resolver, context=CONTEXT, ref="notify[0]")
    assert (destination.key, destination.kind) == ("discord env HOOK_URL", TargetKind.DISCORD)
    destination.sender.send(make_notification())

    (request,) = receiver.wait_for(1)
    message = request.json()
    assert message["content"] == f"⏩ \\[prod-eu\\] ml/llama-chat: canary advanced 10% → 30%\n{LINK}"
    assert message["allowed_mentions"] == {"parse": []}  # a model named @everyone pings nobody
    (embed,) = message["embeds"]
    assert embed["url"] == LINK
    assert embed["timestamp"] == "2025-03-14T09:26:53.000Z"
    fields = {item["name"]: item["value"] for item in embed["fields"]}
    assert fields["Cluster"] == "prod-eu"
    assert fields["✅ p99"] == "612ms ≤ 800ms and ≤ +20% vs stable (stable 540ms), 1840 requests"


def test_discord_keeps_to_25_fields_and_6000_characters() -> None:
    many = tuple(
        CheckLine(f"check-{i}", CheckVerdict.PASS, "1ms", "≤ 2ms " + "x" * 200, "1ms") for i in range(60)
    )
    message = discord_message(make_notification(checks=many), CONTEXT)
    (embed,) = message["embeds"]
    assert len(embed["fields"]) <= 25
    total = len(embed["title"]) + len(embed["description"]) + len(embed["footer"]["text"])
    total += sum(len(item["name"]) + len(item["value"]) for item in embed["fields"])
    assert total <= 6000
    assert embed["fields"][-1]["name"].startswith("… and ")


def test_teams_caps_the_checks_it_lists() -> None:
    many = tuple(CheckLine(f"check-{i}", CheckVerdict.FAIL, "3ms", "≤ 2ms") for i in range(60))
    card = teams_message(make_notification(checks=many))["attachments"][0]["content"]
    assert len(_facts(card)) == 7 + 40  # model, traffic, two revisions and what they serve, phase; 40 checks
    assert any(block.get("text") == "… and 20 more checks (20 not passing)" for block in card["body"])
    assert "actions" not in card  # no dashboard configured: no link


@pytest.mark.parametrize("status", [404, 400])
def test_a_refused_chat_message_is_final_and_names_only_the_reference(
    receiver: Receiver, status: int
) -> None:
    url = receiver.url + "/api/webhooks/123/discord-token-456"
    resolver = SecretResolver(Redactor(), {"HOOK_URL": url})
    receiver.reply(Reply(status, b'{"message": "Unknown Webhook"}'))
    sender = destination_for(_target("discord"), resolver=resolver).sender
    with pytest.raises(DeliveryError) as failure:
        sender.send(make_notification())
    assert not failure.value.retryable
    assert "discord webhook (env HOOK_URL)" in str(failure.value)
    assert "discord-token-456" not in str(failure.value)


def test_chat_webhook_urls_are_masked_even_if_never_registered() -> None:
    redactor = Redactor()
    assert redactor.scrub("POST https://discord.com/api/webhooks/1234/tok-en_99 failed") == (
        f"POST https://discord.com/api/webhooks/{MASK} failed"
    )
    assert redactor.scrub("https://acme.webhook.office.com/webhookb2/aaa@bbb/IncomingWebhook/ccc/ddd") == (
        f"https://acme.webhook.office.com/webhookb2/{MASK}"
    )
    teams = (
        "https://prod-01.westeurope.logic.azure.com/workflows/abc123/triggers/manual/paths/invoke?sig=xyz9"
    )
    scrubbed = redactor.scrub(teams)
    assert "abc123" not in scrubbed
    assert "xyz9" not in scrubbed


def test_a_notify_entry_is_exactly_one_kind_and_never_inline() -> None:
    assert _target("teams").teams is not None
    assert _target("discord").chat is not None
    with pytest.raises(ValidationError, match="exactly one of 'slack', 'teams', 'discord' or 'webhook'"):
        NotifyTarget.model_validate(
            {"teams": {"webhookUrlFrom": {"env": "A_URL"}}, "discord": {"webhookUrlFrom": {"env": "B_URL"}}}
        )
    with pytest.raises(ValidationError, match="would put a secret in the policy file"):
        NotifyTarget.model_validate({"discord": {"webhookUrl": "https://discord.com/api/webhooks/1/x"}})


def test_the_loader_scopes_teams_and_discord_references_like_slack(tmp_path: Path) -> None:
    (tmp_path / "ml").mkdir()
    notify = (
        "  notify:\n"
        "    - teams: {webhookUrlFrom: {env: TEAM_B_TEAMS}}\n"
        "    - discord: {webhookUrlFrom: {file: /etc/passwd}}\n"
        "    - discord: {webhookUrlFrom: {env: ML_DISCORD}}\n"
    )
    (tmp_path / "ml" / "a.yaml").write_text(valid_policy("a") + notify)
    scope = SecretScope(file_root=tmp_path / "secrets", env_allow={"ml": ("ML_*",)})
    result = load_paths([tmp_path], secrets=scope)
    assert [error.field for error in result.errors] == [
        "spec.notify[0].teams.webhookUrlFrom.env",
        "spec.notify[1].discord.webhookUrlFrom.file",
    ]


def test_no_chat_message_repeats_its_first_sentence() -> None:
    summary = "Step 10% held 10m with every check passing; advancing to 30%."
    notification = make_notification(summary=summary, reasons=(summary, "3 of 3 checks passed."))
    for text in (
        json.dumps(slack_message(notification, context=CONTEXT), ensure_ascii=False),
        json.dumps(teams_message(notification, CONTEXT), ensure_ascii=False),
        json.dumps(discord_message(notification, CONTEXT), ensure_ascii=False),
    ):
        assert text.count("held 10m with every check passing") <= 2, (
            text
        )  # the text fallback once, the blocks once
        assert "3 of 3 checks passed." in text
        assert "prod-eu" in text
        assert LINK in text


def test_slack_names_the_cluster_and_links_the_dashboard() -> None:
    message = slack_message(make_notification(), context=CONTEXT)
    assert message["blocks"][0]["text"]["text"] == "⏩ [prod-eu] llama-chat: canary advanced 10% → 30%"
    assert {"type": "mrkdwn", "text": "*Cluster*\n`prod-eu`", "verbatim": True} in message["blocks"][2][
        "fields"
    ]
    (button,) = next(block for block in message["blocks"] if block["type"] == "actions")["elements"]
    assert button["url"] == LINK
    assert message["text"].endswith(f"<{LINK}|Open in the dashboard>")


def test_bare_sample_counts_get_their_unit() -> None:
    assert samples_text("1") == "1 sample"
    assert samples_text("1840") == "1,840 samples"
    assert samples_text("1,840.0") == "1,840 samples"
    assert samples_text("1840 requests") == "1840 requests"
    oom = CheckLine("oom", CheckVerdict.PASS, value="0", limit="≤ 0", samples="1")
    assert oom.describe() == "0 ≤ 0, 1 sample"


def test_the_dashboard_link_quotes_names_and_ignores_a_trailing_slash() -> None:
    notification = dataclasses.replace(make_notification(), namespace="team a")
    assert MessageContext(dashboard_url="https://d.example/canary").link(notification) == (
        "https://d.example/canary/#/rollouts/team%20a/llama-chat"
    )
    assert MessageContext().link(notification) == ""


# What an error text from Prometheus (or a proxy at its URL) may say: a masked link, an autolink,
# a bare URL and emphasis, to be shown as text.
EVIL = "[click](https://evil.example) <https://evil.example/x> https://evil.example/y **urgent** ~~no~~"


def _teams_texts(card: dict[str, Any]) -> list[str]:
    texts = [block["text"] for block in card["body"] if block["type"] == "TextBlock"]
    return texts + [text for title, value in _facts(card).items() for text in (title, value)]


def _discord_texts(message: dict[str, Any]) -> list[str]:
    (embed,) = message["embeds"]
    content = message["content"].removesuffix(f"\n{LINK}")  # the dashboard's own link stays a link
    fields = [text for item in embed["fields"] for text in (item["name"], item["value"])]
    return [content, embed["title"], embed["description"], embed["footer"]["text"], *fields]


def test_prometheus_error_text_arrives_inert_in_teams_and_discord() -> None:
    """Finding 11: Prometheus' error text became Markdown links in Teams and Discord messages."""
    detail = f"HTTP 422 execution: {EVIL}"
    notification = rollback_notification(
        summary=f"Evidence for kv-cache could not be read: {detail}",
        reasons=(f"kv-cache: query failed: {detail}",),
        checks=(CheckLine("kv-cache", CheckVerdict.ERROR, limit="≤ 95%", detail=detail),),
    )
    teams = _teams_texts(teams_message(notification, CONTEXT)["attachments"][0]["content"])
    discord = _discord_texts(discord_message(notification, CONTEXT))
    markdown = MarkdownIt("commonmark").enable("strikethrough")
    for text in teams + discord:
        html = markdown.render(text)
        assert "<a " not in html and "<strong>urgent" not in html and "<s>" not in html, (text, html)
        assert "://" not in text, f"an autolinker would link: {text}"
    for texts in (teams, discord):
        shown = [markdown.render(text) for text in texts if "click" in text]
        assert shown and all("[click](https:" in html for html in shown), shown  # shown, as text


# What else an error text may carry: a code span to break out of, an image, a reference link, Discord
# mentions, and lines that make headings and lists of what comes before and after them.
HOSTILE = (
    "x ` [a](https://evil.example/a) ` y ![i](https://evil.example/p.png) [r]: https://evil.example/r [r] "
    "<@123> <@&456> <#789> @everyone @here\nerror\n===\n---\n- item\n1. one\r\n+ plus www.evil.example/login"
)


def test_hostile_error_text_makes_no_code_heading_list_or_link_in_teams_and_discord() -> None:
    notification = rollback_notification(
        summary=f"Evidence for kv-cache could not be read: {HOSTILE}",
        reasons=(f"kv-cache: query failed: {HOSTILE}",),
        checks=(CheckLine(f"kv-cache {HOSTILE}", CheckVerdict.ERROR, limit="≤ 95%", detail=HOSTILE),),
    )
    teams = _teams_texts(teams_message(notification, CONTEXT)["attachments"][0]["content"])
    message = discord_message(notification, CONTEXT)
    discord = _discord_texts(message)
    markdown = MarkdownIt("commonmark").enable("strikethrough")
    for text in teams + discord:
        html = markdown.render(text)
        for made in ("<a ", "<img", "<code", "<h1", "<h2", "<ul", "<ol", "<hr"):
            assert made not in html, (made, text, html)
        assert "://" not in text, f"an autolinker would link: {text}"
        # GitHub-flavoured Markdown's extended autolinks link www. without a scheme (GFM spec 6.9).
        assert "www." not in text.lower(), f"an autolinker would link: {text}"
        # Discord reads <@id>, <@&id>, <#id> as mentions of a user, a role, a channel; \<@id> as text.
        assert not re.search(r"(?<!\\)<\\?[@#]", text), text
    # The text is all there, as text: shown on the line it was put on.
    assert any("x ` [a](https://evil.example/a) `" in markdown.render(text) for text in discord)
    assert any("error === --- - item 1. one + plus www.evil.example" in markdown.render(t) for t in teams)
    assert message["allowed_mentions"] == {"parse": []}  # @everyone and @here ping no one
