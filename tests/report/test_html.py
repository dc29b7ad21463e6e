"""The report file (JSON) and the HTML page, from real worlds (those past 8 ranks recorded from real worlds:
tests/support/recorded.py); the page checked in headless Chromium."""

import json
import os
import socket
import subprocess
import time
import urllib.request
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

import rankfns
import recorded
from ddpfaults import DDPFaultsError, Outcome, WorldResult, run_world
from ddpfaults.__main__ import main as cli
from ddpfaults.expect import Expect, Expectation
from ddpfaults.faults import RankCrash, SkippedCollective
from ddpfaults.judge.verdict import first_divergence
from ddpfaults.report.document import SCHEMA, ReportFileError, build_document, read_document, write_document
from ddpfaults.report.html import render_html, write_html
from processes import EVENT_GUARD, WORLD_GUARD

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"  # the repository root's artifacts/
needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"headless Chromium is not installed at {CHROMIUM} (Debian: apt-get install -y chromium "
    f"chromium-driver); the real-browser checks of the HTML report cannot run",
)


def empty_batch_naive(ctx, steps=4, empty_rank=2, empty_step=2):
    """Report 000's trainer, naive: the rank whose batch has no valid instances skips the step (``continue``).

    It skips the criterion's all_reduce(num_masks) and DDP's gradient all_reduce for that step, so from
    then on it is one step ahead of its peers: the ranks desynchronise and the world hangs.
    """
    from ddpfaults.toy.data import make_batch, stack_point2segment
    from ddpfaults.toy.models import SetCriterion, SetPredictionModel

    model = ctx.ddp(SetPredictionModel(seed=ctx.seed), find_unused_parameters=True)
    criterion, optimizer = SetCriterion(), torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        ctx.step(step)
        empty = ctx.rank == empty_rank and step == empty_step
        points, targets = make_batch(seed=ctx.seed, rank=ctx.rank, step=step, empty=empty)
        outputs = model(points, stack_point2segment(targets))
        if all(len(t["labels"]) == 0 for t in targets):
            ctx.log(f"Batch {step}: All samples have no valid instances")
            continue
        loss = criterion(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step


# -- real worlds, run once per module ---------------------------------------------------------------
@pytest.fixture(scope="module")
def hung4():
    """The empty-batch naive scenario at 4 ranks: hung, rank 2 one step ahead."""
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(empty_batch_naive, world_size=4, stall=1.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG and result.root_rank == 2, result.report()
    return result


@pytest.fixture(scope="module")
def crashed4():
    """Rank 1 raises KeyError at step 2; its peers fail with collateral connection errors."""
    result = run_world(
        rankfns.all_reduce_steps, world_size=4, faults=[RankCrash(rank=1, step=2, exc=KeyError("segment_mask"))]
    )
    assert result.outcome == Outcome.CRASHED and result.root_rank == 1, result.report()
    return result


@pytest.fixture(scope="module")
def completed3():
    """A world where nothing goes wrong."""
    result = run_world(rankfns.all_reduce_steps, world_size=3, args=(3,))
    assert result.outcome == Outcome.COMPLETED, result.report()
    return result


@pytest.fixture(scope="module")
def hung16():
    """16 ranks (recorded: tests/support/recorded.py); rank 9 skipped its step-2 all_reduce, so it was one collective
    ahead and the others hung."""
    result = recorded.load("hung16")
    assert result.outcome == Outcome.HUNG and result.root_rank == 9, result.report()
    return result


@pytest.fixture(scope="module")
def skipped_last():
    """Rank 2 skips the all_reduce of the last step and finishes: it never calls collective #4."""
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(rankfns.all_reduce_steps, world_size=4, stall=1.0, faults=[SkippedCollective(rank=2, step=3)])
    assert result.outcome == Outcome.HUNG and "rank 2 never called it (finished)" in result.divergence.describe(), (
        result.report()
    )
    return result


@pytest.fixture(scope="module")
def hung64():
    """64 ranks (recorded: tests/support/recorded.py); rank 33 skipped its step-2 all_reduce."""
    result = recorded.load("hung64")
    assert result.outcome == Outcome.HUNG and result.root_rank == 33, result.report()
    return result


# -- parsing the page ----------------------------------------------------------------------------
class _Elements(HTMLParser):
    """Every start tag as (tag, attrs, world index, lane rank) of where it sits."""

    def __init__(self, page: str):
        super().__init__()
        self.items, self.world, self.rank = [], None, None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        if tag == "section" and "data-world" in attrs:
            self.world, self.rank = int(attrs["data-world"]), None
        if "lane" in attrs.get("class", "").split():
            self.rank = int(attrs["data-rank"])
        self.items.append((tag, attrs, self.world, self.rank))

    def having(self, cls=None, attr=None, world=None):
        """Start tags with the CSS class ``cls`` and/or the attribute ``attr`` (in ``world`` if given)."""
        return [
            a
            for _, a, w, _ in self.items
            if (cls is None or cls in a.get("class", "").split())
            and (attr is None or attr in a)
            and (world is None or w == world)
        ]

    def ranks_having(self, cls, world=0) -> list[int]:
        """The lanes (ranks) holding an element of class ``cls``, in order, once per element."""
        return [r for _, a, w, r in self.items if cls in a.get("class", "").split() and w == world and r is not None]


def _lanes(elements, world=0) -> list[int]:
    return [int(a["data-rank"]) for a in elements.having("lane", "data-rank", world)]


def _check_world_page(elements, world: WorldResult, index=0) -> None:
    """One lane per rank; the first divergent collective outlined on each rank that called it; the hang point."""
    assert _lanes(elements, index) == list(range(world.world_size))
    divergence = first_divergence(world.ranks)
    assert divergence is not None and f"collective #{divergence.index}" in world.divergence.describe()
    callers = [r.rank for r in world.ranks if len(r.collectives) >= divergence.index]
    assert elements.ranks_having("divergence", index) == callers
    assert all(f"#{divergence.index} " in b["title"] for b in elements.having("divergence", world=index))
    odd_blocks, absent = elements.ranks_having("odd", index), elements.ranks_having("divergence-absent", index)
    assert set(odd_blocks) <= set(divergence.odd_ranks) <= set(odd_blocks + absent), "the ranks at fault stand out"
    assert len(elements.having("hang-point", world=index)) == (1 if world.outcome == Outcome.HUNG else 0)


# -- the JSON document -----------------------------------------------------------------------------
def test_document_round_trips_real_worlds(tmp_path, hung4, crashed4):
    path = write_document(tmp_path / "report.json", [hung4, crashed4], nodeids=["tests/t.py::test_hang", None])
    assert os.listdir(tmp_path) == ["report.json"], "the write is atomic: no temp file left"
    document = read_document(path)
    assert document["schema"] == SCHEMA == "ddpfaults.report/4"
    first, second = document["worlds"]
    assert first["nodeid"] == "tests/t.py::test_hang" and "nodeid" not in second
    for original, loaded in zip((hung4, crashed4), (first, second), strict=True):
        assert WorldResult.from_dict(loaded).to_dict() == json.loads(original.to_json())
    kinds = {e["k"] for r in first["ranks"] for e in r["events"]}
    assert {"start", "step", "enter", "exit", "log", "finished", "killed"} <= kinds
    assert [e["k"] for e in first["events"]] == ["deadlock", "verdict"]  # a skipped collective: proved at once
    # not "exited": a rank that fails exits right after its "failed" event, and the world has ended (the verdict)
    # once every rank's end is read, so under load a crashed world can be judged before any exit is seen (1 run in
    # 10 of the fresh-clone suite); the round trip above covers whatever events the world has
    assert {"fault", "failed"} <= {e["k"] for r in second["ranks"] for e in r["events"]}


def test_build_document_takes_dicts_and_checks_nodeids(hung4):
    document = build_document([hung4.to_dict()], nodeids=["a::b"])
    assert document == {"schema": SCHEMA, "worlds": [{**hung4.to_dict(), "nodeid": "a::b", "expectation": None}]}
    with pytest.raises(ReportFileError, match="nodeids has 2 entries for 1 worlds"):
        build_document([hung4], nodeids=["a", "b"])


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ('{"schema": "ddpfaults.report/2", ', "is not valid JSON"),
        ("[1, 2]", "holds a JSON list"),
        ('{"outcome": "hung", "ranks": []}', 'has no "schema" key'),
        (
            '{"schema": "ddpfaults.report/1", "worlds": []}',
            "has schema 'ddpfaults.report/1'; this version of ddpfaults reads 'ddpfaults.report/2', "
            "'ddpfaults.report/3' and 'ddpfaults.report/4' only",
        ),
        ('{"schema": "ddpfaults.report/2", "worlds": {}}', '"worlds" must be a list'),
        ('{"schema": "ddpfaults.report/2", "worlds": [{"outcome": "hung"}]}', "worlds[0] is not a world"),
        (
            '{"schema": "ddpfaults.report/2", "worlds": [{"outcome": "hung", "ranks": [], "expectation": "hung"}]}',
            'worlds[0]["expectation"] must be null or an object',
        ),
    ],
    ids=["missing", "bad-json", "not-object", "no-schema", "other-version", "worlds-not-list", "not-a-world", "expect"],
)
def test_read_document_names_the_file_it_rejects(tmp_path, content, message):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ReportFileError) as info:
        read_document(path)
    assert isinstance(info.value, DDPFaultsError)
    assert repr(str(path)) in str(info.value) and message in str(info.value)


# -- the HTML page -----------------------------------------------------------------------------
def test_page_escapes_every_text(hung4):
    document = build_document([hung4], nodeids=["tests/t.py::test_x[<module>]"])
    world = document["worlds"][0]
    world["ranks"][0]["error"] = "<script>alert('x')</script> raised in <module>"
    world["ranks"][1]["output"] += "\n</pre><b>boom</b>"
    world["root_cause"] += " <img src=x onerror=alert(1)>"
    page = render_html(document)
    for raw in ("<module>", "<script>alert", "</pre><b>boom", "<img", "onerror=alert(1)>"):
        assert raw not in page
    assert "test_x[&lt;module&gt;]" in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert escape(hung4.ranks[0].stack.rstrip()) in page  # the real faulthandler stack, quotes and all
    assert page.count("<script") == 1, "only the page's own inline script"
    tags = _Elements(page).items
    assert not [a for _, a, _, _ in tags if "src" in a or not a.get("href", "#").startswith("#")], "nothing to fetch"
    assert not [t for t, _, _, _ in tags if t in ("link", "img", "iframe", "object")]
    assert "@import" not in page and "url(" not in page


def test_page_has_one_lane_per_rank_and_the_divergence(hung4):
    elements = _Elements(render_html(build_document([hung4])))
    _check_world_page(elements, hung4)
    assert [a["id"] for a in elements.having(attr="id")][:2] == ["tally", "summary"], "what failed comes first"
    details = elements.having("rank-detail", "data-detail-rank")
    assert [d["data-detail-rank"] for d in details] == ["0", "1", "2", "3"]
    assert [d["data-detail-rank"] for d in details if "hidden" not in d] == ["2"], "the root rank's details shown first"
    assert elements.having("divergence-absent") == [], "rank 2 did call collective #5, one step ahead"
    assert elements.ranks_having("open") == [0, 1, 3], "ranks 0, 1, 3 never left their last collective"


def test_page_marks_the_rank_that_never_called_the_divergent_collective(skipped_last):
    elements = _Elements(render_html(build_document([skipped_last])))
    _check_world_page(elements, skipped_last)
    assert elements.ranks_having("divergence") == [0, 1, 3] and elements.ranks_having("divergence-absent") == [2]
    assert elements.ranks_having("fault") == [2] and elements.ranks_having("killed") == [0, 1, 2, 3]


def test_page_for_sixteen_ranks(hung16):
    page = render_html(build_document([hung16]))
    elements = _Elements(page)
    _check_world_page(elements, hung16)
    odd = [b for b in elements.having("divergence") if "odd" in b["class"].split()]
    assert elements.ranks_having("odd") == [9] and "(step 3)" in odd[0]["title"]
    assert "compact" in elements.having("tl")[0]["class"] or "dense" in elements.having("tl")[0]["class"]


def test_page_marks_a_crash_with_its_error(crashed4):
    elements = _Elements(render_html(build_document([crashed4])))
    assert _lanes(elements) == [0, 1, 2, 3]
    failed = [(a["title"], a["class"]) for a in elements.having("failed")]
    assert ("raised: KeyError: 'segment_mask'", "mk failed") in failed, "the root failure, not collateral"
    assert elements.ranks_having("collateral") == [0, 0, 2, 2, 3, 3], "marker and error text of each peer"
    assert not elements.having("hang-point", world=0) and not elements.having("divergence", world=0)
    root = elements.having("root", "data-rank")
    assert [a["data-rank"] for a in root] == ["1"]


def test_summary_lists_failed_expectations_first_not_bad_verdicts(hung4, crashed4, completed3):
    """The crash was expected (a pass); the completed world was expected to hang (a failure); the hang had no
    expectation: the failure comes first, the rest in the order they ran."""
    expectations = [Expectation.of(Expect.parse("hung"), completed3), None, Expectation.of(Expect("crashed"), crashed4)]
    page = render_html(build_document([completed3, hung4, crashed4], expectations=expectations))
    elements = _Elements(page)
    rows = [(a["data-world"], a["data-status"]) for a in elements.having(attr="data-status") if "data-world" in a]
    assert rows[:3] == [("0", "failed"), ("1", "unchecked"), ("2", "passed")], "summary rows"
    assert rows[3:] == rows[:3], "then the world sections, in the same order"
    tally = elements.having(attr="data-failed")[0]
    assert (tally["data-failed"], tally["data-checked"], tally["data-worlds"]) == ("1", "2", "3")
    assert "<b class=tally-head>1 of 3 failed</b> · 1 passed · 1 without an expectation" in page
    assert "<title>ddpfaults report: 1 of 3 failed</title>" in page


def test_plain_ddp_lanes_draw_the_collectives_only_the_flight_recorder_saw():
    """Plain DDP: the tracing sees no DDP collective, the flight recorder every one. Each rank's lane has one block
    per collective of its record: DDP's construction broadcasts and its gradient buckets' all_reduces, placed in
    the step the recorder says they were made in."""
    result = run_world(rankfns.ddp_steps, world_size=2, kwargs={"wrap": "plain", "steps": 3}, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.COMPLETED and {r.recorder for r in result.ranks} == {"flight recorder"}
    elements = _Elements(render_html(build_document([result])))
    for r in result.ranks:
        blocks = [a for _, a, _, rank in elements.items if rank == r.rank and "coll" in a.get("class", "").split()]
        numbered = sorted(int(a["title"].split(" ", 1)[0][1:]) for a in blocks if not a["title"].startswith("#0 "))
        assert numbered == list(range(1, len(r.collectives) + 1)), "every collective of the record, once"
        buckets = [a for a in blocks if "[DDP gradient bucket]" in a["title"]]
        assert len(buckets) == 3 and all({"ddp", "fr", "noend"} <= set(a["class"].split()) for a in buckets)
        assert [f"(step {step})" in a["title"] for step, a in enumerate(buckets)] == [True] * 3
        assert any("[DDP construction]" in a["title"] for a in blocks)
        steps = [a for _, a, _, rank in elements.items if rank == r.rank and "step" in a.get("class", "").split()]
        for step, bucket in enumerate(buckets):  # drawn inside its step's band, on the compressed axis
            start = float(steps[step]["style"].split("--cl:")[1].split("%")[0])
            width = float(steps[step]["style"].split("--cw:")[1].split("%")[0])
            at = float(bucket["style"].split("--cl:")[1].split("%")[0])
            assert start <= at <= start + width, (step, bucket["style"], steps[step]["style"])


def test_cli_html_writes_the_page(tmp_path, hung4, capsys):
    report = write_document(tmp_path / "report.json", [hung4])
    assert cli(["html", report]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "report.html")
    assert "id=summary" in (tmp_path / "report.html").read_text()
    assert cli(["html", report, "-o", str(tmp_path / "out" / "page.html")]) == 0
    assert (tmp_path / "out" / "page.html").exists()
    (tmp_path / "bare.json").write_text(hung4.to_json())
    assert cli(["html", str(tmp_path / "bare.json")]) == 2
    assert "bare.json" in capsys.readouterr().err


# -- a real browser ------------------------------------------------------------------------------
def _chromium(tmp_path, *args) -> str:
    profile = tmp_path / "chromium-profile"
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=EVENT_GUARD)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _render_in_browser(tmp_path, worlds, labels, artifact: str):
    """Write the page, dump its DOM after the scripts ran, and save a 1400x900 screenshot as an artifact (one
    browser run does both)."""
    page = write_html(tmp_path / "report.html", worlds, nodeids=labels)
    ARTIFACTS.mkdir(exist_ok=True)
    png = ARTIFACTS / f"{artifact}.png"
    png.unlink(missing_ok=True)
    dom = _chromium(
        tmp_path,
        "--dump-dom",
        f"--screenshot={png}",
        "--window-size=1400,900",
        "--hide-scrollbars",
        Path(page).as_uri(),
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    print(f"screenshot: {png}")
    return _Elements(dom)


@needs_chromium
def test_browser_renders_every_lane_and_the_divergence(tmp_path, hung4, crashed4):
    elements = _render_in_browser(
        tmp_path,
        [hung4, crashed4],
        [
            "empty-batch naive: the empty rank skips its step (continue)",
            "RankCrash(rank=1, step=2) with peer_failure=exit",
        ],
        "html-4ranks",
    )
    assert elements.having(attr="data-ready")[0].get("data-ready") == "1", "the page's script ran to its end"
    _check_world_page(elements, hung4, index=0)
    assert _lanes(elements, 1) == [0, 1, 2, 3]
    assert [a["data-rank"] for a in elements.having("selected")] == ["2", "1"], "root lanes preselected by the script"


@needs_chromium
def test_browser_renders_sixteen_ranks(tmp_path, hung16):
    elements = _render_in_browser(tmp_path, [hung16], ["16 ranks: SkippedCollective(rank=9, step=2)"], "html-16ranks")
    _check_world_page(elements, hung16)


@needs_chromium
def test_browser_renders_sixty_four_ranks(tmp_path, hung64):
    elements = _render_in_browser(tmp_path, [hung64], ["64 ranks: SkippedCollective(rank=33, step=2)"], "html-64ranks")
    _check_world_page(elements, hung64)
    assert "compact" in elements.having("tl")[0]["class"].split()
    assert (tmp_path / "report.html").stat().st_size < 2_000_000


class _WebDriver:
    """Just enough of the W3C WebDriver protocol to click in a page (chromedriver, headless, local only)."""

    ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C web element identifier

    def __init__(self, tmp_path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.base = f"http://127.0.0.1:{port}"
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + EVENT_GUARD
        while True:
            try:
                if self._call("GET", "/status").get("ready"):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("chromedriver did not start")
            # fixed: the poll interval: the event ends the wait, this only spaces the looks
            time.sleep(0.1)
        options = {
            "binary": CHROMIUM,
            "args": [
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-sync",
                "--disable-component-update",
                "--window-size=1400,900",
                f"--user-data-dir={tmp_path / 'driver-profile'}",
            ],
        }
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}}
        self.session = f"/session/{self._call('POST', '/session', caps)['sessionId']}"

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with self.opener.open(request, timeout=EVENT_GUARD) as response:
            return json.loads(response.read())["value"]

    def open(self, url):
        self._call("POST", self.session + "/url", {"url": url})

    def click(self, css):
        element = self._call("POST", self.session + "/element", {"using": "css selector", "value": css})
        self._call("POST", f"{self.session}/element/{element[self.ELEMENT]}/click", {})

    def js(self, script):
        return self._call("POST", self.session + "/execute/sync", {"script": script, "args": []})

    def close(self):
        try:
            self._call("DELETE", self.session)
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=EVENT_GUARD)


@needs_chromium
@pytest.mark.skipif(
    not os.path.exists(CHROMEDRIVER), reason=f"{CHROMEDRIVER} (Debian package chromium-driver) is not installed"
)
def test_browser_click_on_a_lane_shows_that_ranks_stack(tmp_path, hung4):
    page = write_html(tmp_path / "report.html", [hung4])
    driver = _WebDriver(tmp_path)
    try:
        driver.open(Path(page).as_uri())
        shown = (
            "return [...document.querySelectorAll('.rank-detail')]"
            ".filter(d => !d.hidden).map(d => d.dataset.detailRank)"
        )
        assert driver.js(shown) == ["2"]
        driver.click(".lane[data-rank='0'] .tl-label")
        assert driver.js(shown) == ["0"]
        text = driver.js("return document.querySelector(\".rank-detail[data-detail-rank='0']\").innerText")
        assert "blocked" in text and "all_reduce" in text and "distributed_c10d.py" in text, text
        assert driver.js("return document.querySelector('.lane.selected').dataset.rank") == "0"
        before = driver.js("return document.querySelector('.tl .divergence').getBoundingClientRect().left")
        driver.click("button[data-axis='linear']")
        assert driver.js("return document.querySelector('.tl').classList.contains('linear')") is True
        assert driver.js("return document.querySelector('.tl .divergence').getBoundingClientRect().left") != before
        driver.click("button[data-zoom='in']")
        assert (
            driver.js("return getComputedStyle(document.querySelector('.tl')).getPropertyValue('--zoom').trim()") == "2"
        )
    finally:
        driver.close()


def test_a_world_whose_test_failed_counts_as_failed_as_pytest_counts_it(hung4, crashed4, completed3):
    """A plain assert on a world without an expectation failed its test: the page counts it failed, not
    "no expectation"; a test that failed though its world's expectation held is failed too."""
    held = Expectation.of(Expect("crashed"), crashed4)
    document = build_document([completed3, hung4, crashed4], None, [None, None, held], ["failed", "passed", "failed"])
    assert [w.get("test") for w in document["worlds"]] == ["failed", "passed", "failed"]
    page = render_html(document)
    assert "<b class=tally-head>2 of 3 failed</b> · 0 passed · 1 without an expectation" in page
    assert "<b class=tally-head>0 of 3 failed</b>" in render_html(
        build_document([completed3, hung4, crashed4], None, [None, None, held])
    )


def test_fsdp_dtensor_and_dcp_collectives_are_not_drawn_in_ddp_s_colour(tmp_path):
    """The legend has a colour for DDP's buckets, one for FSDP's all-gathers and reduce-scatters, one for DTensor's
    and DCP's collectives; each block takes its maker's."""
    result = run_world(rankfns.fsdp_dcp_round_trip, world_size=2, kwargs={"checkpoint_dir": str(tmp_path / "c")})
    assert result.outcome == Outcome.COMPLETED, result.report()
    page = render_html(build_document([result]))
    elements = _Elements(page)
    blocks = [a for _, a, _, _ in elements.items if "coll" in a.get("class", "").split() and "it" in a["class"].split()]
    kinds = {
        (c, "[FSDP" in a["title"], "[DCP" in a["title"])
        for a in blocks
        for c in a["class"].split()
        if c in ("ddp", "fsdp", "lib")
    }
    assert ("fsdp", True, False) in kinds and ("lib", False, True) in kinds, kinds
    assert not any(c == "ddp" for c, _, _ in kinds), kinds
    assert "<i class='sw coll fsdp'></i>FSDP all-gather / reduce-scatter" in page


def test_a_call_of_a_document_older_than_makers_gets_its_maker_from_its_note_once_at_load():
    """Documents written before calls named their maker labelled DDP's calls only in the note: the loader gives
    such a call its maker, so the lanes colour it by its maker alone."""
    from ddpfaults.report.document import _call
    from ddpfaults.report.lanes import _maker_class

    old = _call({"op": "all_reduce", "note": "DDP gradient bucket 0"}, t0=0.0, left=True, number=1)
    mine = _call({"op": "all_reduce", "note": "loss"}, t0=0.0, left=True, number=2)
    new = _call(
        {"op": "all_reduce", "note": "DDP gradient bucket 0", "maker": "ddp_bucket"}, t0=0.0, left=True, number=3
    )
    assert (old.maker, mine.maker, new.maker) == ("ddp_bucket", "user", "ddp_bucket")
    assert (_maker_class(old), _maker_class(mine)) == (" ddp", "")
