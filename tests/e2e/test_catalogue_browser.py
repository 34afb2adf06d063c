"""``headwise heads catalogue`` end to end: the CLI writes both files and the page works in a
real headless Chromium (Debian's, offline): no JS error, no request but the file itself, rows
sort and filter as the JSON says."""

import json

import pytest

from headwise.cli import main
from tests.commands.test__heads_catalogue import rev_checkpoint  # noqa: F401  (fixture)
from tests.e2e.test_browser import browser_context  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def report(rev_checkpoint, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("catalogue") / "report"
    assert main(["heads", "catalogue", "--checkpoint", str(rev_checkpoint), "--examples", "24",
                 "-o", str(out)]) == 0
    return out


def test_cli_page_loads_sorts_and_filters_in_chromium(browser_context, report):  # noqa: F811
    data = json.loads((report / "catalogue.json").read_text())
    url = (report / "catalogue.html").resolve().as_uri()
    page = browser_context.new_page()
    console, requests = [], []
    page.on("console", lambda m: console.append((m.type, m.text)))
    page.on("pageerror", lambda e: console.append(("pageerror", str(e))))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url)
    page.evaluate("window.headwiseCatalogue.ready")
    assert page.locator(".hc-table tbody tr").count() == len(data["heads"]) == 12
    assert page.locator(".hc-grid td[data-cell]").count() == 12
    assert page.locator("canvas.hc-pattern").count() == 12

    def key(e):
        return f"{e['kind']}-L{e['layer']}-H{e['head']}"

    for score, desc in (("entropy", True), ("mirror", False)):
        got = page.evaluate(f"window.headwiseCatalogue.sortBy('{score}', {str(desc).lower()})")
        want = sorted(data["heads"], key=lambda e: e["scores"][score], reverse=desc)
        assert [g for g in got] == [key(e) for e in want] or \
            [data_score(data, g, score) for g in got] == [e["scores"][score] for e in want]
    cross = page.evaluate("window.headwiseCatalogue.filter({kind: 'cross', text: ''})")
    assert sorted(cross) == sorted(key(e) for e in data["heads"] if e["kind"] == "cross")
    one = page.evaluate("window.headwiseCatalogue.filter({kind: 'all', text: 'L1H0'})")
    assert sorted(one) == sorted(key(e) for e in data["heads"]
                                 if e["layer"] == 1 and e["head"] == 0)
    assert page.locator(".hc-table tbody tr").count() == 3
    page.locator('.hc-grid td[data-cell="cross-L0-H1"]').click()  # jump: filters cleared
    assert page.locator(".hc-table tbody tr").count() == 12
    errors = page.evaluate("window.headwiseCatalogue.errors")
    page.close()
    assert [m for m in console if m[0] in ("error", "pageerror", "warning")] == [] and errors == []
    assert requests == [url], f"unexpected requests: {requests}"


def data_score(data, name, score):
    kind, layer, head = name.rsplit("-", 2)
    return next(e["scores"][score] for e in data["heads"] if e["kind"] == kind
                and e["layer"] == int(layer[1:]) and e["head"] == int(head[1:]))
