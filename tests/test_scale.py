"""What keeps hundreds to thousands of simulated devices linear: links built on first use, a
Gantt chart that sums up what it cannot draw, a busy profile and a trace written in one pass."""

from __future__ import annotations

import json
import random

import pytest
from omegaconf import OmegaConf

from framework.cluster import Cluster
from framework.errors import ConfigError
from framework.gantt import COLORS, ROW, busy_profile, gantt_rows, gantt_spec, render_gantt
from framework.timeline import Interval, Timeline


def cluster_cfg(n, **extra):
    base = {"name": "t", "num_devices": n, "shared_medium": False, "device": {}, "devices": {}, "link": {"bandwidth_bps": 1e6},
            "links": {"dev*->dev0": {"bandwidth_bps": 5e6, "loss": 0.1}}}
    base.update(extra)
    return OmegaConf.create(base)


def test_links_are_built_on_first_use_with_their_patterns_applied():
    c = Cluster(cluster_cfg(2000))
    assert c.links == {}  # not 2000 x 1999 of them
    a, b = c.link("dev5", "dev0"), c.link("dev0", "dev5")
    assert (a.cfg.bandwidth_bps, a.cfg.loss) == (5e6, 0.1) and (b.cfg.bandwidth_bps, b.cfg.loss) == (1e6, 0.0)
    assert c.link("dev5", "dev0") is a and len(c.links) == 2 and len(c.channels) == 2
    # a link's loss draws depend on its name and the seed, never on which links came first
    other = Cluster(cluster_cfg(2000))
    other.link("dev7", "dev0")
    assert [other.link("dev5", "dev0").rng.random() for _ in range(5)] == [a.rng.random() for _ in range(5)]
    with pytest.raises(ConfigError, match="no device 'dev9999'"):
        c.link("dev1", "dev9999")


def test_a_bad_link_value_still_fails_before_the_run():
    with pytest.raises(ConfigError, match=r"cluster.links.dev\*->dev0.loss: must be a number in \[0, 1\)"):
        Cluster(cluster_cfg(3, links={"dev*->dev0": {"loss": 1.5}}))
    with pytest.raises(ConfigError, match=r"cluster.link.bandwidth_bps"):
        Cluster(cluster_cfg(3, link={"bandwidth_bps": 0}))


def test_busy_profile_equals_the_overlap_of_every_interval_with_every_bin():
    rng = random.Random(1)
    ivs = []
    for _ in range(300):
        s = rng.uniform(-0.5, 9.5)
        ivs.append(Interval("r", "fwd", s, s + rng.uniform(0, 3)))
    t, frac = busy_profile(ivs, 50, 10.0, bins=40)
    w = 10.0 / 40
    brute = [sum(max(0.0, min(iv.end, (b + 1) * w) - max(iv.start, b * w)) for iv in ivs) / w / 50 for b in range(40)]
    assert list(t) == pytest.approx([b * w for b in range(40)])
    assert list(frac) == pytest.approx([min(1.0, x) for x in brute], abs=1e-9)


def test_a_chart_of_many_roles_draws_the_singletons_and_a_share_of_each_family():
    roles = [f"dev{i}" for i in range(1000)] + [f"srv{i}" for i in range(1000)] + ["fed"]
    by = {r: [Interval(r, "fwd", 0.0, 2.0 if r == "dev500" else 1.0)] for r in roles}
    links = [f"dev{i}->server" for i in range(1000)]
    shown, shown_links, rest, rest_links = gantt_rows(roles, links, by, max_rows=40)
    assert "fed" in shown and "dev0" in shown and "dev500" in shown and "srv0" in shown  # first, busiest, alone
    assert len(shown) + len(shown_links) <= 40 and len(shown) + len(rest) == len(roles) and len(shown_links) + len(rest_links) == len(links)
    assert set(shown_links) <= {f"{d}->server" for d in shown}
    few = gantt_rows(roles[:5], links[:5], by, max_rows=40)
    assert few == (roles[:5], links[:5], [], [])


def test_the_trace_is_written_as_one_json_document_event_by_event(tmp_path):
    tl = Timeline()
    tl.add_role("dev0")
    tl.compute("dev0", "fwd", 0.0, 1.0, 0, 0, 0)
    tl.transfer("dev0->dev1", 1.0, 1.5, 1000, 0, 0)
    tl.add_role('odd "role" \u00e9')  # names are JSON-quoted
    tl.compute('odd "role" \u00e9', 'st"ep', 1.5, 1.75)
    tl.compute("dev0", "bwd", 2, 3, 1, 2, 1)  # int times, as a runtime might give
    tl.save_chrome_trace(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == json.loads(json.dumps(tl.chrome_trace()))
    tl.save_chrome_trace(tmp_path / "t1.json", max_events=1)
    assert json.loads((tmp_path / "t1.json").read_text())["otherData"] == {"truncated": True}


def test_the_chart_draws_each_bar_where_its_interval_is(tmp_path):
    from PIL import Image, ImageColor

    tl = Timeline()
    for r in ("dev0", "dev1"):
        tl.add_role(r)
    tl.compute("dev0", "fwd", 0.0, 0.5, 0, 0, 0)
    tl.compute("dev0", "bwd", 0.5, 1.0, 0, 0, 0)
    tl.compute("dev1", "step", 0.25, 0.25 + 1e-6, 0, -1, 0)  # far shorter than a pixel
    tl.transfer("dev0->dev1", 0.5, 0.75, 100, 0, 0)
    spec = gantt_spec(tl, title="t")
    assert spec["rows"] == ["dev0", "dev1", "dev0->dev1"]
    render_gantt(spec, tmp_path / "g.png")
    img = Image.open(tmp_path / "g.png").convert("RGB")
    rgb = {k: ImageColor.getrgb(c) for k, c in COLORS.items()}

    def colors_in_row(row: int) -> set:
        top = next(y for y in range(img.height) if sum(img.getpixel((x, y)) == (0, 0, 0) for x in range(img.width)) > img.width // 2)  # the frame
        y = top + row * ROW + ROW // 2
        return {img.getpixel((x, y)) for x in range(img.width)}

    assert {rgb["fwd"], rgb["bwd"]} <= colors_in_row(0) and rgb["send"] not in colors_in_row(0)
    assert rgb["step"] in colors_in_row(1)  # still one pixel wide
    assert rgb["send"] in colors_in_row(2) and rgb["fwd"] not in colors_in_row(2)
    # fwd is drawn left of bwd, as its interval is
    y0 = next(y for y in range(img.height) if rgb["fwd"] in {img.getpixel((x, y)) for x in range(img.width)})
    xs = {k: [x for x in range(img.width) if img.getpixel((x, y0)) == rgb[k]] for k in ("fwd", "bwd")}
    assert max(xs["fwd"]) < min(xs["bwd"]) and abs(len(xs["fwd"]) - len(xs["bwd"])) <= 2


def test_each_epochs_idle_time_scans_only_what_overlaps_it(monkeypatch):
    """`first_overlapping(t)`: every interval before it ends by t, whatever order intervals were
    added in; idle times over a window from that index equal a scan of every interval."""
    import framework.timeline as timeline_module
    from plugins.schedulers.pipar import idle

    monkeypatch.setattr(timeline_module, "_BLOCK", 8)
    rng = random.Random(3)
    tl = Timeline()
    roles = ["dev0", "dev1", "srv0", "fed"]
    for epoch in range(6):  # each epoch's intervals after the one before's, a little out of order within it
        for _ in range(40):
            s = epoch * 10 + rng.uniform(0, 9)
            tl.compute(rng.choice(roles), "fwd", s, s + rng.uniform(0, 1))
        for t in (epoch * 10.0, epoch * 10 + 4.5, rng.uniform(0, 60)):
            i = tl.first_overlapping(t)
            assert i % 8 == 0 and all(iv.end <= t for iv in tl.intervals[:i])
            window = (t, t + rng.uniform(1, 12))
            fast = idle.idle_times(tl, *window, ["dev0", "dev1"], {"srv0", "fed"})
            with monkeypatch.context() as m:
                m.setattr(Timeline, "first_overlapping", lambda self, t: 0)
                every = idle.idle_times(tl, *window, ["dev0", "dev1"], {"srv0", "fed"})
            assert fast == every
    assert tl.first_overlapping(50.0) == 5 * 40  # the first five epochs end by 50: skipped whole
    busy = tl.busy()
    tl.compute("dev0", "fwd", 70.0, 71.0)  # an interval added after: busy() counts it
    assert tl.busy()["dev0"] == pytest.approx(busy["dev0"] + 1.0)


def test_the_timelines_checkpoint_converts_only_the_intervals_added_since_the_last():
    """Each epoch's checkpoint extends the columns of the one before (not the whole run's
    intervals again), and stores what converting every interval at once stores, with the names
    sorted however late each appeared; a restored timeline goes on the same way."""
    import torch

    from framework.checkpoints.state import Bag

    def stored(tl):
        bag = Bag()
        desc = tl.checkpoint(bag, "t")
        return desc["names"], bag.take(desc["columns"]), bag, desc

    rng = random.Random(5)
    tl = Timeline()
    for epoch in range(4):
        for _ in range(30):
            res = rng.choice(["zeta", "alpha", f"dev{epoch}", "dev9->fed"])
            if rng.random() < 0.5:
                tl.compute(res, rng.choice(["fwd", "bwd", f"kind{3 - epoch}"]), rng.random(), 1 + rng.random(), rng.randint(-1, 9), rng.randint(-1, 3), rng.randint(-1, 2))
            else:
                tl.transfer(res, rng.random(), 2.0, rng.randint(0, 10**6), rng.randint(0, 5), -1, rng.choice(["send", "lost"]))
        names, cols, bag, desc = stored(tl)
        fresh = Timeline()
        fresh.intervals = list(tl.intervals)
        want_names, want, _, _ = stored(fresh)
        assert names == want_names == sorted(names)
        assert all(torch.equal(cols[k], want[k]) for k in ("times", "ints"))
    back = Timeline()
    back.restore(bag, desc)
    assert back.intervals == tl.intervals
    back.compute("late", "fwd", 3.0, 4.0)
    tl.compute("late", "fwd", 3.0, 4.0)
    (n1, c1, _, _), (n2, c2, _, _) = stored(back), stored(tl)
    assert n1 == n2 and all(torch.equal(c1[k], c2[k]) for k in ("times", "ints"))
