"""Where view/explain write their report, and the device rule shared by every command."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwise import _device
from headwise.commands._common import REPORTS, parse_device, report_paths


def test_the_device_rule_is_the_one_in_headwise_device():
    assert parse_device is _device.parse_device


def test_html_file_folder_and_default_report_folder(tmp_path):
    assert report_paths(str(tmp_path / "v.HTML"), "view", "abc") == (tmp_path / "v.HTML", None)
    assert report_paths(str(tmp_path / "out"), "view", "abc") == (
        tmp_path / "out" / "head_view.html", tmp_path / "out" / "heatmaps.png")
    assert report_paths(None, "explain", "The cat sat.")[0] == (
        REPORTS / "explain-the-cat-sat" / "head_view.html")
    with pytest.raises(ValueError, match=r"-o a\.png: expected a folder or a \.html file"):
        report_paths("a.png", "view", "x")


@given(label=st.text(max_size=80))
def test_the_default_folder_name_is_a_short_safe_slug(label):
    html, png = report_paths(None, "view", label)
    folder = html.parent
    assert folder.parent == REPORTS and png == folder / "heatmaps.png"
    slug = folder.name.removeprefix("view-")
    assert slug and len(slug) <= 40 and set(slug) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert Path(folder.name).name == folder.name  # never climbs out of the report folder
