"""`npumem tlb validate --measured FILE`: a stored measurement re-fitted and re-predicted without
measuring, and the files it refuses."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from npumem.cli import main
from npumem.tlb import predict_chase
from npumem.tlb_validate import grid, revalidate

MiB = 1 << 20
COSTS = {"base_ns": 1.3, "l2_tlb_ns": 2.0, "near_ns": 4.0, "far_ns": 40.0}
FOOTPRINTS = grid(64 << 10, 32 * MiB, 2)


def stored(tmp_path, **changes):
    """A validation JSON whose points are the model's own (zen4, 4 KiB host) at COSTS."""
    series = {
        label: {
            "backing": f"synthetic {label}",
            "page_size": page,
            "measured_ns": predict_chase(FOOTPRINTS, page, host_page_size=4096, preset="zen4", costs=COSTS),
        }
        for label, page in (("4KiB", 4096), ("2MiB", 2 * MiB))
    }
    doc = {
        "preset": "zen4",
        "host_page_size": 4096,
        "rounds": 3,
        "seconds": 1.5,
        "load_average": {"before": [0.5, 0.4, 0.3], "after": [0.6, 0.4, 0.3]},
        "footprints": FOOTPRINTS,
        "series": series,
        **changes,
    }
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(doc))
    return path


def test_measured_file_is_refitted_and_every_point_predicted(tmp_path, capsys):
    out = tmp_path / "again.json"
    assert main(["tlb", "validate", "--measured", str(stored(tmp_path)), "--json", str(out), "--strict"]) == 0
    text = capsys.readouterr().out
    assert "not measured again" in text and "load average before 0.50" in text
    result = json.loads(out.read_text())
    assert result["preset"] == "zen4" and result["host_page_size"] == 4096 and result["rounds"] == 3
    assert result["costs"] == pytest.approx(COSTS, rel=1e-3)
    for s in result["series"].values():
        assert all(s["within"]) and s["predicted_ns"] == pytest.approx(s["measured_ns"], rel=1e-3)
    assert all(result["checks"].values()) and len(result["checks"]) == 5


def test_measured_file_held_against_another_model(tmp_path):
    # Native: the fitted model misses the guest's walk; the 2 MiB series then has no L2 knee.
    native = revalidate(stored(tmp_path), host_page_size=None)
    assert native["host_page_size"] is None and native["preset"] == "zen4"
    assert not all(native["checks"].values())
    assert native["series"]["2MiB"]["knees_predicted"] != native["series"]["2MiB"]["knees_measured"]


@pytest.mark.parametrize(
    "change, words",
    [
        ({"footprints": "64KiB"}, "'footprints' is '64KiB', expected a JSON list"),
        ({"footprints": FOOTPRINTS[::-1]}, "increasing"),
        ({"series": {"4KiB": {"page_size": 4096, "measured_ns": [1.0] * len(FOOTPRINTS)}}}, "checked on '2MiB'"),
        ({"series": {"4KiB": {"page_size": 8192, "measured_ns": []}}}, "8192 is not a guest page"),
        ({"series": {"4KiB": {"page_size": 4096, "measured_ns": [1.0]}}}, "one time per footprint"),
        ({"series": {"4KiB": {"page_size": 4096, "measured_ns": [-1.0] * len(FOOTPRINTS)}}}, "measured_ns[0]"),
    ],
)
def test_bad_measured_files_are_refused_with_the_reason(tmp_path, capsys, change, words):
    assert main(["tlb", "validate", "--measured", str(stored(tmp_path, **change))]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_measured_refuses_what_only_a_measurement_uses(tmp_path, capsys):
    path = str(stored(tmp_path))
    assert main(["tlb", "validate", "--measured", path, "--rounds", "3"]) == 2
    assert "--rounds set what is measured" in capsys.readouterr().err
    assert main(["tlb", "validate", "--measured", str(tmp_path / "absent.json")]) == 2
    assert "absent.json" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[1, 2]")
    assert main(["tlb", "validate", "--measured", str(tmp_path / "list.json")]) == 2
    assert "the document is a list" in capsys.readouterr().err
    assert main(["tlb", "validate", "--measured", path, "--preset", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_a_set_over_its_ways_misses_on_every_line_of_a_cyclic_order():
    from npumem.chase_model import _resident

    one_set = (8 * 64, 8)  # 8 lines, 8 ways: one set
    assert _resident(7, one_set) == pytest.approx(sum(np.exp(-7) * 7**k / math.factorial(k) for k in range(8)))
    # The L1 data cache's step on this project's machine: 512 random lines in 64 sets keep 45%.
    assert _resident(512, (32 << 10, 8)) == pytest.approx(0.453, abs=1e-3)
    assert _resident(1e-9, one_set) == pytest.approx(1.0)


def test_fit_leaves_a_constant_no_point_spends_time_on_at_zero():
    from npumem.tlb import fit_chase

    few = grid(256 << 10, 1 << 20, 1)
    ns = predict_chase(few, 4096, host_page_size=4096, preset="zen4", costs=COSTS)
    fitted = fit_chase(few, ns, page_size=4096, host_page_size=4096, preset="zen4")
    assert fitted["far_ns"] == 0.0 and fitted["l2_tlb_ns"] == pytest.approx(COSTS["l2_tlb_ns"], rel=0.05)
