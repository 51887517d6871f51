"""Observability: the experiment trackers and the run browser, on one real run.

Trackers: what the recipe's `logger` section names receives every train step and
validation, read back from each tracker's own files and compared with the ledger;
`streamrl export` sends the same numbers from the ledger afterwards.

The run browser (`streamrl ui`) in a real headless chromium (Debian's, driven by
Playwright): the run page opened before the first step draws the steps as they land;
the runs list shows the run and its replayed child; the curves have one point per step;
the rollout browser shows a known trajectory's tokens with its loss mask; the SQL box
refuses a write and downloads CSV. Screenshots of each page go to test-artifacts/ui/.
"""

from __future__ import annotations

import contextlib
import csv
import http.server
import os
import re
import secrets
import shutil
import socketserver
import subprocess
import sys
import threading
import urllib.request
import uuid

import pytest

from streamrl.consumers.tracker import train_step_metrics, validation_metrics
from streamrl.runtime.recipe import RecipeError, load_recipe
from streamrl.schema.events import Evaluation, TrainStep, unpack_int32, unpack_mask
from tests.cli_zygote import cli_popen
from tests.conftest import REPO, free_port, run_cli, wait_for
from tests.helpers.tracker_files import mlflow_metrics, tensorboard_scalars, wandb_offline_history
from tests.test_rl_loop import RECIPE, small_run_env

ARTIFACTS = REPO / "test-artifacts" / "ui"
UI_PORT = free_port()
UI = f"http://127.0.0.1:{UI_PORT}"
UI_TOKEN = secrets.token_urlsafe(16)


def test_a_train_step_and_a_validation_become_these_numbers():
    step = TrainStep(
        run_id="r",
        step=7,
        weight_version=7,
        loss=0.5,
        kl=0.01,
        entropy=None,
        clip_fraction=0.25,
        grad_norm=2.0,
        lr=1e-4,
        tokens=1200,
        samples=64,
        dropped_ids=["a", "b"],
        staleness={"mean": 0.5, "max": 1.0},
        seconds=0.4,
        metrics={"reward_mean": 0.75, "response_length/mean": 12.5},
    )
    assert train_step_metrics(step) == {
        "train/loss": 0.5,
        "train/clip_fraction": 0.25,
        "train/grad_norm": 2.0,
        "train/lr": 1e-4,
        "train/tokens": 1200.0,
        "train/samples": 64.0,
        "train/seconds": 0.4,
        "train/weight_version": 7.0,
        "train/dropped": 2.0,
        "train/kl": 0.01,
        "train/tokens_per_s": 3000.0,
        "train/staleness_mean": 0.5,
        "train/staleness_max": 1.0,
        "train/reward_mean": 0.75,
        "response_length/mean": 12.5,  # verl's name, as verl logs it
    }  # no entropy: the step had none
    evaluations = [
        Evaluation(run_id="r", trajectory_id=f"t{i}", group_id=f"g{i}", reward=reward, metrics=metrics, is_val=True, step=3)
        for i, (reward, metrics) in enumerate([(1.0, {}), (0.2, {"accuracy": 0.0}), (0.0, {})])
    ]
    # accuracy: the evaluator's accuracy metric where there is one, else the reward: (1 + 0 + 0) / 3
    assert validation_metrics(evaluations) == {
        "val/accuracy": pytest.approx(1 / 3),
        "val/reward_mean": pytest.approx(0.4),
        "val/count": 3.0,
    }


def test_the_guides_logger_form_and_a_list_of_backends(tmp_path):
    guide = tmp_path / "guide.yaml"
    guide.write_text(
        "project_name: p\nlogger:\n  backend: wandb\n  wandb:\n    project: ${project_name}\n    tags: [my_task, grpo]\n"
    )
    logger = load_recipe(guide).logger
    assert (logger.trackers(), logger.wandb.project, logger.wandb.tags) == (["wandb"], "p", ["my_task", "grpo"])
    both = tmp_path / "both.yaml"
    both.write_text("logger:\n  backend: wandb\n  backends: [mlflow, tensorboard, wandb]\n")
    assert load_recipe(both).logger.trackers() == ["wandb", "tensorboard", "mlflow"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("logger:\n  backends: [wandb, neptune]\n  tensorbord: {}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(bad)
    assert any(p.startswith("logger.backends[1]: expected one of wandb, tensorboard, mlflow") for p in info.value.problems)
    assert any("logger.tensorbord: unknown key (did you mean logger.tensorboard?)" in p for p in info.value.problems)


def test_an_agent_episodes_tokens_split_by_turn_with_their_advantages():
    import numpy as np

    from streamrl.ui.tokens import advantage_colour, token_views, turn_views

    call = {"tool_calls": [{"name": "get", "arguments": {"key": "a"}}]}
    trajectory = {
        "tokens": np.arange(9, dtype="<i4").tobytes(),
        "loss_mask": np.array([0, 0, 0, 1, 1, 0, 0, 1, 1], dtype=np.uint8).tobytes(),
        "logprobs": np.array([0, 0, 0, -0.5, -1, 0, 0, -0.25, -2], dtype="<f4").tobytes(),
        "prompt_length": 3,
        "turns": [
            {"role": "prompt", "start": 0, "end": 3},
            {"role": "assistant", "start": 3, "end": 5, "trained": True, "meta": call},
            {"role": "tool", "start": 5, "end": 7},
            {"role": "assistant", "start": 7, "end": 9, "trained": True},
        ],
    }
    per_token = np.array([0, 0, 0, 1.0, 1.0, 0, 0, -0.25, -0.25], dtype="<f4").tobytes()
    tokens = token_views(trajectory, {"advantage": 0.25, "token_advantages": per_token}, None)
    turns = turn_views(trajectory, tokens)
    assert [(t.role, len(t.tokens), t.trained) for t in turns] == [
        ("prompt", 3, False),
        ("assistant", 2, True),
        ("tool", 2, False),
        ("assistant", 2, True),
    ]
    assert turns[1].meta == call and turns[1].tokens[0].text == "⟨3⟩"  # no tokenizer here: the ids
    assert [t.advantage for t in tokens] == [None, None, None, 1.0, 1.0, None, None, -0.25, -0.25]
    assert [t.logprob for t in tokens[7:]] == [-0.25, -2.0]
    # colour strength 0.1 + 0.65 * |advantage| / max |advantage|; grey where not trained
    assert (tokens[3].colour, tokens[7].colour, tokens[5].colour) == (
        "rgba(0,160,60,0.75)",
        "rgba(220,40,40,0.26)",
        "rgba(128,128,128,0.18)",
    )
    # a sequence-level estimator: its one advantage on every trained token
    scalar = token_views(trajectory, {"advantage": 0.25, "token_advantages": None}, None)
    assert [t.advantage for t in scalar if t.trained] == [0.25] * 4
    assert advantage_colour(None, True, 1.0) == "rgba(80,120,255,0.25)"  # trained, not (yet) a sample


def ledger_steps(ledger, run_id: str) -> dict[str, dict[int, float]]:
    """The ledger's loss and mean reward, each as {step: value}."""
    rows = ledger.execute(
        "select step, loss, (metrics->>'reward_mean')::float from train_steps where run_id = %s", (run_id,)
    ).fetchall()
    return {"train/loss": {step: loss for step, loss, _ in rows}, "train/reward_mean": {step: reward for step, _, reward in rows}}


def ledger_validation(ledger, run_id: str) -> dict[int, float]:
    return {
        version: accuracy
        for version, accuracy in ledger.execute(
            "select step, avg(coalesce((metrics->>'accuracy')::float, reward)) from evaluations "
            "where run_id = %s and is_val group by step",
            (run_id,),
        )
    }


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium (`make install` installs it) under Playwright."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (make install installs it with apt-get)")
        pytest.skip("chromium is not installed: make install installs it (apt-get install chromium)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        # evil.example resolves to loopback, as an attacker's DNS would in a rebinding attack
        chromium = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox", "--host-resolver-rules=MAP evil.example 127.0.0.1"]
        )
        yield TokenHolder(chromium)
        chromium.close()


class TokenHolder:
    """The browser of a user who opened the URL `streamrl ui` printed: each new page has
    the token's cookie (the login flow itself is tested on its own)."""

    def __init__(self, chromium):
        self.chromium = chromium

    def new_page(self, **options):
        context = self.chromium.new_context(**options)
        context.add_cookies([{"name": f"streamrl_ui_token_{UI_PORT}", "value": UI_TOKEN, "url": UI}])
        return patient(context.new_page())

    def new_stranger_page(self):
        return patient(self.chromium.new_page())


def patient(page):
    """A page's load waits for the server's answer and for headless chromium to parse
    plotly.js (4.8 MB): Playwright's 30 s default was too short with a second copy of the
    suite running beside this one (docs/benchmarks.md, 2026-11-29)."""
    page.set_default_navigation_timeout(180_000)
    return page


@pytest.fixture(scope="module")
def ui_server(stack, tmp_path_factory):
    log = tmp_path_factory.mktemp("ui") / "ui.log"
    server = cli_popen(
        [sys.executable, "-m", "streamrl.cli", "ui", "--port", str(UI_PORT)],
        cwd=REPO,
        env={**os.environ, "STREAMRL_UI_TOKEN": UI_TOKEN},
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )

    def answers() -> bool:
        assert server.poll() is None, log.read_text()
        try:
            return urllib.request.urlopen(f"{UI}/?token={UI_TOKEN}", timeout=2).status == 200
        except OSError:
            return False

    wait_for(answers, timeout=60, what="streamrl ui to answer")
    yield UI
    server.terminate()
    server.wait(30)


def chart_points(page, figure: str, trace: int = 0) -> int:
    return page.locator(f"#chart-{figure} .scatterlayer .trace").nth(trace).locator(".points path").count()


@pytest.fixture(scope="module")
def observed(stack, ui_server, browser, tmp_path_factory):
    """A 6-step run with all three trackers, watched on its run page from before its
    first step; then a replay of it (a child run, for lineage and the overlay)."""
    run_id, child = f"obs-{uuid.uuid4().hex[:10]}", f"obs-child-{uuid.uuid4().hex[:8]}"
    out = tmp_path_factory.mktemp("observed")
    env = {**os.environ, **small_run_env(ARITH_SYNC_MODE="sync")}  # sync: slower steps, time to open the page
    run = cli_popen(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "run",
            RECIPE,
            "logger.backends=[wandb,tensorboard,mlflow]",
            "logger.wandb.tags=[ci]",
            "--run",
            run_id,
            "--out",
            str(out / "out"),
        ],
        cwd=REPO,
        env=env,
        stdout=open(out / "run.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    from streamrl.runtime.db import connect

    with connect(stack.database_url, autocommit=True) as ledger:

        def steps() -> int:
            return ledger.execute("select count(*) from train_steps where run_id = %s", (run_id,)).fetchone()[0]

        def registered() -> bool:
            assert run.poll() is None, (out / "run.log").read_text()[-3000:]
            return ledger.execute("select count(*) from runs where run_id = %s", (run_id,)).fetchone()[0] == 1

        wait_for(registered, timeout=180, what="the run in the ledger")
        # the page's first redraw fails (as when the ledger's readers are all busy): it says
        # so and keeps refreshing
        failed = []

        def fail_first(route):
            if failed:
                route.continue_()
            else:
                failed.append(route.request.url)
                route.fulfill(status=503, body="busy")

        page.route("**/api/runs/*/figures*", fail_first)
        # The page is drawn while the ledger cannot gain a step: a SHARE lock lets the UI read
        # train_steps and holds the sink's inserts until the page has loaded. So the page is
        # opened before the last step however loaded the machine is (a sink that lags can
        # write all six steps between two redraws).
        with ledger.transaction():
            ledger.execute("lock table train_steps in share mode")
            steps_before_drawing = steps()
            page.goto(f"{UI}/runs/{run_id}?refresh=1")
            drawn = re.match(r"(\d+) steps", page.locator("h2 + p").inner_text())
        assert drawn, page.locator("h2 + p").inner_text()
        live = {"steps_before_drawing": steps_before_drawing, "steps_when_drawn": int(drawn.group(1))}
        assert run.wait(420) == 0, (out / "run.log").read_text()[-3000:]
        wait_for(lambda: chart_points(page, "reward") == 6, timeout=30, what="the open page to draw all 6 steps")
        live |= {"points_at_end": chart_points(page, "reward"), "failed_redraws": len(failed)}
        page.screenshot(path=str(ARTIFACTS / "run-live.png"), full_page=True)
        page.close()
    result = run_cli("replay", run_id, "--into", child, "--out", str(out / "child"), timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"run": run_id, "child": child, "out": out, "live": live}


def test_a_run_feeds_wandb_tensorboard_and_mlflow_and_export_resends_the_ledger(stack, ledger, observed, tmp_path):
    run_id = observed["run"]
    steps, validation = ledger_steps(ledger, run_id), ledger_validation(ledger, run_id)
    assert sorted(steps["train/loss"]) == [1, 2, 3, 4, 5, 6] and sorted(validation) == [0, 3, 6]

    def check(wandb_dir, tensorboard_dir, mlflow_uri):
        rows, config = wandb_offline_history(next(wandb_dir.glob(f"wandb/*-{run_id}")))
        for key, expected in steps.items():
            assert {row["step"]: row[key] for row in rows if key in row} == pytest.approx(expected)
        by_version = {row["weight_version"]: row["val/accuracy"] for row in rows if "val/accuracy" in row}
        assert by_version == pytest.approx(validation)
        assert config["trainer"]["total_train_steps"] == 6  # the run's resolved config
        scalars = tensorboard_scalars(tensorboard_dir)
        for key, expected in steps.items():
            assert scalars[key] == pytest.approx(expected)
        assert scalars["val/accuracy"] == pytest.approx(validation)
        metrics = mlflow_metrics(mlflow_uri, run_id)
        for key, expected in steps.items():
            assert metrics[key] == pytest.approx(expected)
        assert metrics["val/accuracy"] == pytest.approx(validation)

    live = stack.home / "trackers" / run_id
    check(live, live / "tensorboard", f"sqlite:///{live / 'mlflow.db'}")
    assert "tracker stopped: 6 steps, 3 validations logged" in (observed["out"] / "out" / "logs" / "tracker.log").read_text()

    exported = tmp_path / "exported"
    result = run_cli(
        "export", run_id, "--to", "wandb", "--to", "tensorboard", "--to", "mlflow", "--out", str(exported), timeout=180
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"exported 6 steps and 3 validations of {run_id}" in result.stdout
    check(exported, exported / "tensorboard", f"sqlite:///{exported / 'mlflow.db'}")
    refused = run_cli("export", run_id, "--to", "neptune", timeout=60)
    assert refused.returncode != 0 and "--to neptune: expected one of wandb, tensorboard, mlflow" in refused.stderr


def test_the_run_page_draws_the_steps_as_they_land(observed):
    live = observed["live"]
    # drawn with the steps the ledger held then, fewer than six; the same page, never
    # reloaded, ends with all six
    assert live["steps_when_drawn"] == live["steps_before_drawing"] < 6, live
    assert live["points_at_end"] == 6
    assert live["failed_redraws"] == 1  # the first redraw got a 503, and the page went on


def test_the_runs_list_and_the_curves_of_two_runs(ledger, observed, browser):
    run_id, child = observed["run"], observed["child"]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(UI + "/")
    row = page.locator("#runs tr", has=page.locator(f"a[href='/runs/{child}']"))
    assert row.locator("td").nth(2).inner_text() == "finished"
    assert row.locator(f"a[href='/runs/{run_id}']").count() == 1  # the child names its parent
    page.screenshot(path=str(ARTIFACTS / "runs.png"), full_page=True)

    child_steps = ledger.execute("select count(*) from train_steps where run_id = %s", (child,)).fetchone()[0]
    page.goto(f"{UI}/runs/{run_id}?compare={child}")
    page.wait_for_selector("#chart-reward .scatterlayer .trace")
    assert page.locator("#chart-reward .scatterlayer .trace").count() == 2
    assert (chart_points(page, "reward", 0), chart_points(page, "reward", 1)) == (6, child_steps)
    assert chart_points(page, "val_accuracy", 0) == 3  # versions 0, 3 and 6
    assert page.locator(f"a[href='/runs/{child}']").count() >= 1  # lineage: the child is listed
    page.screenshot(path=str(ARTIFACTS / "curves.png"), full_page=True)
    page.goto(f"{UI}/runs/{run_id}?x=version")
    page.wait_for_selector("#chart-loss .scatterlayer .trace")
    assert "weight version" in page.locator("#chart-loss").inner_text()
    page.close()


def test_the_rollout_browser_shows_a_trajectorys_tokens_with_its_mask(ledger, observed, browser):
    run_id = observed["run"]
    trajectory_id, group_id, tokens, mask = ledger.execute(
        "select t.trajectory_id, t.group_id, t.tokens, t.loss_mask from trajectories t join samples s using (run_id, trajectory_id) "
        "where t.run_id = %s and t.step = 3 and s.advantage <> 0 order by t.trajectory_id limit 1",
        (run_id,),
    ).fetchone()
    advantage = ledger.execute(
        "select advantage from samples where run_id = %s and trajectory_id = %s", (run_id, trajectory_id)
    ).fetchone()[0]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{UI}/runs/{run_id}/rollouts?step=3&group={group_id}")
    assert page.locator("#rollouts tr").count() == 1 + 8  # header + the group's 8 rollouts
    page.locator(f"#rollouts a[href$='/{trajectory_id}']").click()
    page.wait_for_selector("#tokens")
    spans = page.locator("#tokens .tok")
    assert spans.count() == len(unpack_int32(bytes(tokens)))
    assert [int(m) for m in spans.evaluate_all("nodes => nodes.map(n => n.dataset.mask)")] == list(unpack_mask(bytes(mask)))
    shown = spans.evaluate_all("nodes => nodes.filter(n => n.dataset.mask === '1').map(n => parseFloat(n.dataset.advantage))")
    assert shown and all(value == pytest.approx(advantage, abs=1e-4) for value in shown)
    page.screenshot(path=str(ARTIFACTS / "trajectory.png"), full_page=True)
    page.goto(f"{UI}/runs/{run_id}/rollouts?where=no_such_column%20%3E%201")
    assert "no_such_column" in page.locator(".error").inner_text()
    page.close()


def test_the_sql_box_refuses_a_write_and_downloads_csv(observed, browser, tmp_path):
    run_id = observed["run"]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(UI + "/sql")
    page.fill("#query", "delete from runs")
    page.click("#run-query")
    assert "read-only" in page.locator("#sql-error").inner_text()
    page.fill("#query", f"select step, loss from train_steps where run_id = '{run_id}' order by step")
    page.click("#run-query")
    assert page.locator("#result tr").count() == 7  # header + 6 steps
    page.screenshot(path=str(ARTIFACTS / "sql.png"), full_page=True)
    with page.expect_download() as download:
        page.click("#csv")
    saved = tmp_path / "result.csv"
    download.value.save_as(saved)
    rows = list(csv.reader(saved.open()))
    assert rows[0] == ["step", "loss"] and [int(r[0]) for r in rows[1:]] == [1, 2, 3, 4, 5, 6]
    page.close()


def test_an_out_of_range_refresh_is_a_400_class_answer_not_a_500():
    from fastapi.testclient import TestClient

    from streamrl.ui.app import make_app

    client = TestClient(
        make_app("postgresql://nobody@127.0.0.1:1/none"),  # refused before the ledger is asked
        base_url="http://127.0.0.1",
    )
    for value in ("1e400", "nan", "0.1"):
        assert client.get(f"/runs/any?refresh={value}").status_code == 422, value


def test_the_browser_answers_only_its_own_host_names_and_with_a_token_only_to_its_holder():
    """DNS rebinding: a page on evil.example that resolves its name to 127.0.0.1 sends
    Host: evil.example, and gets nothing. Bound beyond loopback, a token is required."""
    from fastapi.testclient import TestClient

    from streamrl.ui.app import make_app

    asset = "/static/plotly.min.js"  # a page that needs no ledger
    local = TestClient(make_app("postgresql://nobody@127.0.0.1:1/none"), base_url="http://127.0.0.1:8765")
    assert local.get(asset).status_code == 200
    assert local.get(asset, headers={"host": "evil.example:8765"}).status_code == 400
    shared = TestClient(
        make_app("postgresql://nobody@127.0.0.1:1/none", ("10.0.0.5",), token="s3cret"), base_url="http://10.0.0.5:8765"
    )
    assert shared.get(asset).status_code == 401
    assert shared.get(asset + "?token=wrong").status_code == 401
    assert shared.get(asset + "?token=s3cret").status_code == 200
    assert shared.get(asset).status_code == 200  # the cookie the first visit set
    assert (
        TestClient(shared.app, base_url="http://10.0.0.5:8765").get(asset, headers={"authorization": "Bearer s3cret"}).status_code
        == 200
    )


def test_in_a_real_browser_a_rebound_name_gets_nothing_and_the_filter_cannot_escape(observed, ui_server, browser):
    """DNS rebinding as a browser does it: chromium resolves evil.example to 127.0.0.1
    (as an attacker's DNS would) and the page's request carries Host: evil.example. And
    the rollout browser's filter box, given a condition that closes its parenthesis to
    read the API keys' digests, shows the refusal and no rows."""
    from urllib.parse import quote

    page = browser.new_page()
    response = page.goto(f"http://evil.example:{UI_PORT}/runs")
    assert response.status == 400 and "Invalid host header" in page.content()
    assert page.goto(f"http://127.0.0.1:{UI_PORT}/").status == 200  # its own name still works
    page.close()
    page = browser.new_page()
    attack = "true) union all select key_sha256 from service_api_keys --"
    page.goto(f"{ui_server}/runs/{observed['run']}/rollouts?where={quote(attack)}")
    assert "filter" in page.locator(".error").inner_text().lower()
    assert page.locator("#rollouts a[href*='/rollouts/']").count() == 0  # no trajectory rows
    assert "no trajectories match" in page.locator("#rollouts").inner_text()
    page.close()


def test_a_step_that_is_not_a_number_is_said_beside_the_form_not_a_500(observed, ui_server):
    url = f"{ui_server}/runs/{observed['run']}/rollouts?step=abc&token={UI_TOKEN}"
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read().decode()
    assert response.status == 200 and "step: expected a step number, got &#39;abc&#39;" in body


def test_a_page_of_another_site_or_port_cannot_make_the_browser_query_the_ledger():
    """A page elsewhere loads /sql?q=...pg_sleep... as an image and times it: the browser
    marks such a request cross-site (another port: same-site), and it is refused before
    any query runs. The user's own navigation and the browser's pages pass."""
    from fastapi.testclient import TestClient

    from streamrl.ui.app import make_app

    client = TestClient(make_app("postgresql://nobody@127.0.0.1:1/none"), base_url="http://127.0.0.1:8765")
    asset = "/static/plotly.min.js"
    for site in ("cross-site", "same-site"):
        refused = client.get("/sql?q=select+pg_sleep(1)", headers={"sec-fetch-site": site})
        assert refused.status_code == 403 and "another site or port" in refused.text
    for site in ("same-origin", "none"):
        assert client.get(asset, headers={"sec-fetch-site": site}).status_code == 200
    assert client.get(asset).status_code == 200  # curl and scripts send no such header


def test_in_a_real_browser_the_token_logs_in_once_and_another_ports_page_cannot_use_it(ui_server, browser):
    """The printed URL's token becomes a cookie; a page served from another port of the
    same host (same-site, so the browser sends the cookie with its requests) loads
    `/sql?q=...pg_sleep...` as an image to time it, and is refused before any query runs."""
    stranger = browser.new_stranger_page()
    assert stranger.goto(f"{UI}/sql").status == 401
    assert stranger.goto(f"{UI}/?token={UI_TOKEN}").status == 200
    assert stranger.goto(f"{UI}/sql?q=select%201").status == 200  # the cookie, no token in the URL
    probe = f"{UI}/sql?q=select%20pg_sleep(0.6)"
    with serving(f'<img src="{probe}">') as attacker, stranger.expect_response(probe) as answer:
        stranger.goto(attacker)
    assert answer.value.status == 403
    stranger.close()


@contextlib.contextmanager
def serving(html: str):
    """A page on another port of this host, as any local program could serve one."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(html.encode())

        def log_message(self, *args):
            pass

    with socketserver.TCPServer(("127.0.0.1", 0), Page) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}/"
        server.shutdown()
