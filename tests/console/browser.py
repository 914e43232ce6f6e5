"""The operator console in headless chromium (driven by tests/system/console_browser.rs).

One JSON argument: the console's URL, the ids of the jobs the Rust side
made (the zombie story, two parked jobs, the one whose payload holds
<script>), chromium's and chromedriver's paths, and where screenshots go.

Every check waits for a condition in the page (bounded), never a fixed
sleep; the race is a fixed schedule: both sessions load the job, then
alice posts, then bob posts. Exits non-zero on the first failed check.
"""

import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ARGS = json.loads(sys.argv[1])
URL = ARGS["url"]
# Selenium wants files, not names on the PATH.
for tool in ("chromium", "chromedriver"):
    ARGS[tool] = shutil.which(ARGS[tool]) or ARGS[tool]
WAIT = 20  # seconds, for a condition to become true
WIDTH = 1360
DIRS = []


def say(msg):
    print(f"browser: {msg}", flush=True)


def chrome():
    profile = tempfile.mkdtemp(prefix="jf-chrome-")
    DIRS.append(profile)
    opts = webdriver.ChromeOptions()
    opts.binary_location = ARGS["chromium"]
    for a in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={WIDTH},900",
    ):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(executable_path=ARGS["chromedriver"]), options=opts)
    d.set_page_load_timeout(WAIT)
    return d


def until(d, what, cond):
    try:
        return WebDriverWait(d, WAIT).until(lambda _: cond())
    except Exception as e:
        raise AssertionError(f"timed out waiting until {what} (at {d.current_url})") from e


def text(d, css):
    return d.find_element(By.CSS_SELECTOR, css).text


def shot(d, name, most=2400):
    """A screenshot of the whole page (at most `most` pixels high) into
    the screenshot directory the driver gave (NAME.png)."""
    height = d.execute_script("return document.documentElement.scrollHeight")
    metrics = {"width": WIDTH, "height": max(700, min(height, most)), "deviceScaleFactor": 1, "mobile": False}
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    path = os.path.join(ARGS["shots"], f"{name}.png")
    d.save_screenshot(path)
    d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    say(f"screenshot {path}")


def notice(d, level):
    return until(d, f"a {level} notice", lambda: d.find_elements(By.CSS_SELECTOR, f".notice.{level}"))[0].text


def fill_resolution(d, job, resolution, name, reason, reference=""):
    form = d.find_element(By.CSS_SELECTOR, f'form.resolve[data-job-id="{job}"]')
    form.find_element(By.CSS_SELECTOR, f'input[name=resolution][value="{resolution}"]').click()
    if reference:
        form.find_element(By.NAME, "provider_reference").send_keys(reference)
    who = form.find_element(By.NAME, "operator")
    who.clear()
    who.send_keys(name)
    form.find_element(By.NAME, "reason").send_keys(reason)
    return form


def submit(d, form):
    old = d.find_element(By.TAG_NAME, "html")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(d, "the next page", lambda: _stale(old))


def _stale(el):
    try:
        el.is_enabled()
        return False
    except Exception:
        return True


def main():
    a = chrome()
    b = chrome()
    feed = chrome()
    try:
        # Queues: a card per queue, the takeover counted, refreshed live.
        a.get(URL + "/")
        until(a, "the refunds card", lambda: a.find_elements(By.CSS_SELECTOR, '.card[data-queue="refunds"]'))
        card = text(a, '.card[data-queue="refunds"]')
        assert "waiting for an operator" in card, card
        assert "Takeovers, last 1h\n1" in card, card
        assert "Stale writes refused, last 1h\n1" in card, card
        assert a.find_elements(By.CSS_SELECTOR, '.card[data-queue="payouts"]')
        until(a, "a live refresh", lambda: text(a, ".live-status").startswith("live ·"))
        # A queue with ready work and no live worker says so.
        banner = a.find_elements(By.CSS_SELECTOR, '.card[data-queue="chargebacks"] .no-worker')
        assert banner and "no live worker" in banner[0].text, text(a, '.card[data-queue="chargebacks"]')
        assert not a.find_elements(By.CSS_SELECTOR, '.card[data-queue="refunds"] .no-worker')
        shot(a, "queues")
        say("queues ok")

        # Workers: go-1 live while it holds a payout's lease, node-7 (silent
        # for ten minutes, holding nothing) stale.
        a.get(URL + "/workers")
        until(a, "the workers table", lambda: a.find_elements(By.CSS_SELECTOR, "table.workers"))
        live = a.find_element(By.CSS_SELECTOR, 'tr[data-worker="go-1"]')
        assert live.get_attribute("data-state") == "live", live.text
        assert "lease" in live.text and "left" in live.text, live.text
        dead = a.find_element(By.CSS_SELECTOR, 'tr[data-worker="node-7"]')
        assert dead.get_attribute("data-state") == "stale", dead.text
        assert "jobfence-node/0.1.0" in dead.text and "coordinator-2" in dead.text, dead.text
        until(a, "a live refresh", lambda: text(a, ".live-status").startswith("live ·"))
        shot(a, "workers")
        say("workers ok: go-1 live, node-7 stale")

        # Jobs: the list, filtered, and from a row to the job's story.
        a.get(URL + "/jobs?queue=refunds")
        rows = a.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")
        assert len(rows) == 30, len(rows)
        shot(a, "jobs")
        # Keyset paging: the next page starts after the last id shown.
        a.get(URL + "/jobs?queue=refunds&limit=10")
        first = [int(r.get_attribute("data-job-id")) for r in a.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")]
        a.find_element(By.CSS_SELECTOR, "nav.pager a.next").click()
        until(a, "the next page", lambda: f"after={first[-1]}" in a.current_url)
        second = [int(r.get_attribute("data-job-id")) for r in a.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")]
        assert len(first) == len(second) == 10 and second[0] > first[-1], (first, second)
        assert second == sorted(second), second
        a.get(URL + "/jobs?state=manual_review")
        ids = [r.get_attribute("data-job-id") for r in a.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")]
        assert str(ARGS["race"]) in ids and str(ARGS["zombie"]) not in ids, ids
        a.get(URL + "/jobs")
        a.find_element(By.NAME, "operation_key").send_keys(ARGS["zombie_key"][:-4])
        a.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
        until(a, "the filtered list", lambda: "operation_key=" in a.current_url)
        rows = a.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")
        assert [r.get_attribute("data-job-id") for r in rows] == [str(ARGS["zombie"])], [r.text for r in rows]
        rows[0].find_element(By.CSS_SELECTOR, "td.key a").click()
        until(a, "the job page", lambda: a.current_url.endswith(f"/jobs/{ARGS['zombie']}"))
        kinds = [li.get_attribute("data-kind") for li in a.find_elements(By.CSS_SELECTOR, "ol.timeline li")]
        story = ["enqueued", "claimed", "taken_over", "stale_write_rejected", "observation_recorded", "completed"]
        assert kinds == story, kinds
        timeline = text(a, "ol.timeline")
        for words in ("Claimed: attempt 1", "Taken over: attempt 2", "Stale write refused: attempt 1",
                      "Observation: worker saw succeeded", "kept as evidence", "Completed by attempt 2"):
            assert words in timeline, (words, timeline)
        assert "stale" in text(a, "table.obs"), "the late success is marked stale"
        shot(a, "job")
        say("jobs list -> job timeline ok")

        # Bad input: a message on the page, not an error page.
        a.get(URL + "/jobs?older_than=5%20parsecs&state=stuck")
        msg = notice(a, "error")
        assert "older than" in msg and "not a duration" in msg and '"stuck" is not a job state' in msg, msg
        assert a.find_elements(By.CSS_SELECTOR, "form.filters"), "the filter form stays"
        a.get(URL + "/jobs/999999999")
        assert "There is no job 999999999." in notice(a, "error")
        a.get(URL + "/jobs/abc")
        assert "not a job id" in notice(a, "error")
        a.get(URL + "/events?queue=no%20such!")
        assert "queue" in notice(a, "error")
        # No GET changes anything: the resolve URL answers GET with 405.
        try:
            urllib.request.urlopen(URL + f"/jobs/{ARGS['race']}/resolve")
            raise AssertionError("GET on the resolve URL was served")
        except urllib.error.HTTPError as e:
            assert e.code == 405, e.code
        say("bad input ok")

        # A payload and an observation body with <script> are text.
        a.get(URL + f"/jobs/{ARGS['script']}")
        assert text(a, "pre.payload") == ARGS["script_payload"], text(a, "pre.payload")
        assert "<script>window.__xss = 2</script><b>provider answered HTML</b>" in text(a, "table.obs")
        assert "<img src=x onerror=alert(1)>" in text(a, "main")
        assert a.execute_script("return typeof window.__xss") == "undefined"
        scripts = [s.get_attribute("src") for s in a.find_elements(By.TAG_NAME, "script")]
        assert scripts == [URL + "/static/console.js"], scripts
        assert not a.find_elements(By.CSS_SELECTOR, "main b, main img"), "no markup from the job"
        shot(a, "escaped")
        say("script shown as text ok")

        # Manual review: oldest first; resolve one.
        a.get(URL + "/review")
        parked = [c.get_attribute("data-job-id") for c in a.find_elements(By.CSS_SELECTOR, "section.parked")]
        assert parked == sorted(parked, key=int) and str(ARGS["resolve"]) in parked, parked
        shot(a, "review")
        form = fill_resolution(a, ARGS["resolve"], "failed", "carol", "no refund in the provider dashboard")
        submit(a, form)
        assert f"You resolved job {ARGS['resolve']}" in notice(a, "ok")
        last = a.find_elements(By.CSS_SELECTOR, "ol.timeline li")[-1]
        assert last.get_attribute("data-kind") == "manual_review_resolved", last.text
        assert "Resolved by carol: failed" in last.text, last.text
        say("resolve ok")

        # A parked job's page: the evidence that decides it beside the form
        # that resolves it, at the top.
        a.get(URL + f"/jobs/{ARGS['race']}")
        ev = a.find_element(By.CSS_SELECTOR, "div.decide section.evidence")
        rf = a.find_element(By.CSS_SELECTOR, "div.decide section.resolve-card")
        assert abs(ev.location["y"] - rf.location["y"]) < 5, (ev.location, rf.location)
        assert ev.location["x"] < rf.location["x"], (ev.location, rf.location)
        shot(a, "job-parked")
        say("evidence beside the resolve form ok")

        # A forged token is refused, and nothing is written.
        a.get(URL + f"/jobs/{ARGS['race']}")
        form = fill_resolution(a, ARGS["race"], "failed", "mallory", "forged")
        a.execute_script("arguments[0].querySelector('input[name=csrf]').value = '0'.repeat(32)", form)
        submit(a, form)
        msg = notice(a, "error")
        assert "Not applied" in msg and "security token" in msg, msg
        assert a.find_elements(By.CSS_SELECTOR, f'form.resolve[data-job-id="{ARGS["race"]}"]'), "still parked"
        say("csrf ok")

        # The live feed, opened before the race.
        feed.get(URL + "/events")
        until(feed, "the feed's rows", lambda: feed.find_elements(By.CSS_SELECTOR, "table.events tbody tr"))
        before = feed.find_elements(By.CSS_SELECTOR, "table.events tbody tr")[0].get_attribute("data-event-id")

        # The race: both load the parked job, then alice posts, then bob.
        a.get(URL + f"/jobs/{ARGS['race']}")
        b.get(URL + f"/jobs/{ARGS['race']}")
        fa = fill_resolution(a, ARGS["race"], "succeeded", "alice", "refund seen in the dashboard", "re_race")
        fb = fill_resolution(b, ARGS["race"], "failed", "bob", "no refund found")
        submit(a, fa)
        assert f"You resolved job {ARGS['race']}" in notice(a, "ok")
        submit(b, fb)
        msg = notice(b, "warn")
        assert f"Someone else resolved job {ARGS['race']} first: alice" in msg, msg
        assert "It is now succeeded" in msg and "Your resolution (failed) was not applied" in msg, msg
        assert not b.find_elements(By.CSS_SELECTOR, "form.resolve"), "no form on a resolved job"
        assert "Resolution by bob refused" in text(b, "ol.timeline")
        shot(b, "race")
        say("race ok: alice first, bob told")

        # The feed shows the race without a reload.
        until(feed, "the resolution in the live feed",
              lambda: "Resolved by alice" in text(feed, "table.events tbody"))
        top = feed.find_elements(By.CSS_SELECTOR, "table.events tbody tr")[0].get_attribute("data-event-id")
        assert int(top) > int(before), (top, before)
        shot(feed, "events", most=1300)
        say("events live ok")

        # Providers: an incident at the provider; pause its sends only.
        a.get(URL + "/providers")
        card = a.find_element(By.CSS_SELECTOR, 'section.provider[data-provider="stripe"]')
        assert "handing out within the budget" in card.text, card.text
        assert not card.find_elements(By.CSS_SELECTOR, "form.resume"), "nothing to resume"
        form = card.find_element(By.CSS_SELECTOR, "form.pause")
        form.find_element(By.CSS_SELECTOR, 'input[name=pause][value="sends"]').click()
        who = form.find_element(By.NAME, "operator")
        who.clear()
        who.send_keys("carol")
        form.find_element(By.NAME, "reason").send_keys("INC-42: refunds API answers 5xx")
        submit(a, form)
        assert "Provider stripe is paused for sends" in notice(a, "ok")
        card = a.find_element(By.CSS_SELECTOR, 'section.provider[data-provider="stripe"]')
        assert card.get_attribute("data-pause") == "sends", card.get_attribute("outerHTML")
        assert "PAUSED: sends held, reconciles go on" in card.text, card.text
        assert "Why paused: INC-42: refunds API answers 5xx" in card.text, card.text
        assert card.find_elements(By.CSS_SELECTOR, "form.resume"), "a paused provider can be resumed"
        other = a.find_element(By.CSS_SELECTOR, 'section.provider[data-provider="acquirer"]')
        assert other.get_attribute("data-pause") == "none"
        first = a.find_elements(By.CSS_SELECTOR, "table.changes tbody tr")[0]
        assert first.get_attribute("data-action") == "pause_provider" and "carol" in first.text, first.text
        shot(a, "providers")
        say("providers ok: stripe paused for sends by carol")

        # Repair in bulk: count first (nothing changed), then cancel the
        # one ready job never sent whose key starts refund-payX.
        a.get(URL + "/jobs/bulk?action=cancel&queue=refunds&key_prefix=refund-payX")
        count = a.find_element(By.CSS_SELECTOR, "section.bulk-count")
        assert count.get_attribute("data-selected") == "1", count.text
        form = a.find_element(By.CSS_SELECTOR, "form.bulk-apply")
        who = form.find_element(By.NAME, "operator")
        who.clear()
        who.send_keys("erin")
        form.find_element(By.NAME, "reason").send_keys("INC-42: withdrawn by the customer")
        shot(a, "bulk")
        submit(a, form)
        assert "1 selected: 1 applied, 0 skipped" in notice(a, "ok")
        say("bulk ok: one job cancelled by erin")

        # The queues page says where the work is held: stripe's queues
        # show its pause, by whom and why.
        a.get(URL + "/queues")
        until(a, "the refunds card", lambda: a.find_elements(By.CSS_SELECTOR, '.card[data-queue="payouts"] .held'))
        held = text(a, '.card[data-queue="payouts"] .held')
        assert "carol" in held and "provider stripe" in held, held
        shot(a, "queues-paused")
        say("queues ok: payouts held by stripe's pause")
        # Settlement: stripe's report found one key refunded twice; frank
        # acknowledges it from its row, with a note.
        a.get(URL + "/settlement")
        card = a.find_element(By.CSS_SELECTOR, 'section.settlement[data-provider="stripe"]')
        rows = card.find_elements(By.CSS_SELECTOR, "table.exceptions tbody tr")
        kinds = sorted(r.find_elements(By.TAG_NAME, "td")[1].text.split("\n")[0] for r in rows)
        assert kinds == ["DOUBLE_REFUND", "UNKNOWN_REFERENCE"], kinds
        double = next(r for r in rows if "DOUBLE_REFUND" in r.text)
        assert ARGS["refunded_twice"] in double.text, double.text
        assert "bad" in double.get_attribute("class"), "a critical exception is marked"
        form = double.find_element(By.CSS_SELECTOR, "form.exception-act")
        who = form.find_element(By.NAME, "operator")
        who.clear()
        who.send_keys("frank")
        form.find_element(By.NAME, "note").send_keys("INC-43: asked stripe to reverse re_second")
        shot(a, "settlement")
        old = a.find_element(By.TAG_NAME, "html")
        form.find_element(By.CSS_SELECTOR, 'button[value="acknowledged"]').click()
        until(a, "the next page", lambda: _stale(old))
        assert "is acknowledged now" in notice(a, "ok")
        double = next(r for r in a.find_elements(By.CSS_SELECTOR, "table.exceptions tbody tr")
                      if "DOUBLE_REFUND" in r.text)
        assert "acknowledged" in double.text, double.text
        assert not double.find_elements(By.CSS_SELECTOR, 'button[value="acknowledged"]'), \
            "an acknowledged exception can only be resolved"
        say("settlement ok: the double refund acknowledged by frank")
    finally:
        for d in (a, b, feed):
            d.quit()
        for p in DIRS:
            shutil.rmtree(p, ignore_errors=True)


if __name__ == "__main__":
    main()
    say("all checks passed")
