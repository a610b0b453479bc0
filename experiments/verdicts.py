"""Two-sided verdicts: each claim of a paper beside our number, hit or miss against a stated band.

A study collects `Claim`s (a number the paper reports, or a range it reports) and `Ordering`s (a
statement such as "PiPar is the fastest of FL, SFL and PiPar at 4G", which holds or not), then
prints them and writes them into its report:

    from experiments.verdicts import Claim, NotRun, Ordering, print_verdicts, verdict_table
    claims = [
        Claim("VGG-5, CIFAR-10, WiFi: T_FL / T_PiPar", paper=(1.4, 3.4), ours=fl / pipar, source="Sec. V-B"),
        Claim("search cost S / T", paper=0.27, ours=s / t, source="Sec. V-D"),
        Ordering("PiPar fastest at 4G", paper="PiPar < SFL, FL", ours=f"{pp:.1f} < {sfl:.1f}, {fl:.1f}", holds=pp < min(sfl, fl)),
        NotRun("VGG-16 on CIFAR-100: T_SFL / T_PiPar", paper="1.12-2.2", why="no VGG-16 model here"),
    ]
    print_verdicts("PiPar", claims)            # stdout, one line per claim
    lines += verdict_table(claims)             # Markdown for report.md

The rule (issue 43): a point value hits when ours is within `band` (default 20 %) of the paper's,
on either side, so an overshoot misses as a shortfall does; a range hits when ours lies inside
it (a paper's "1.4-3.4x" means the cases it measured spread that far, so a case of ours outside
it is a miss). An `at_least` / `at_most` claim is one-sided only where the paper's own statement
is ("up to 64.1x" is not one: it is the largest case, compared as a point). Verdicts are data:
a study must never adjust a constant until one hits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

BAND = 0.20  # a point claim hits within +-20 % of the paper's value


@dataclass
class Claim:
    """One number of the paper (`paper`: a value, or a (low, high) range it reports) and ours."""

    what: str
    paper: float | tuple[float, float]
    ours: float
    band: float = BAND
    source: str = ""  # where the paper says it: "Table VII", "Fig. 4", "Sec. V-B"
    note: str = ""  # why a miss misses, when we know
    command: str = ""  # what reproduces our number
    kind: str = field(default="claim", init=False)

    @property
    def ratio(self) -> float | None:
        """ours / paper for a point claim (None for a range, or a paper value of 0)."""
        if isinstance(self.paper, tuple) or self.paper == 0:
            return None
        return self.ours / self.paper

    @property
    def hit(self) -> bool:
        if not math.isfinite(self.ours):
            return False
        if isinstance(self.paper, tuple):
            lo, hi = self.paper
            return lo <= self.ours <= hi
        if self.paper == 0:
            return abs(self.ours) <= self.band
        return abs(self.ours / self.paper - 1.0) <= self.band

    @property
    def band_text(self) -> str:
        if isinstance(self.paper, tuple):
            return f"in [{_num(self.paper[0])}, {_num(self.paper[1])}]"
        return f"within {self.band:.0%}"

    @property
    def paper_text(self) -> str:
        if isinstance(self.paper, tuple):
            return f"{_num(self.paper[0])}-{_num(self.paper[1])}"
        return _num(self.paper)


@dataclass
class Ordering:
    """A statement the paper makes that holds or not in our runs (which beats which, where a curve
    peaks): `paper` says what the paper states, `ours` what we measured, `holds` the verdict."""

    what: str
    paper: str
    ours: str
    holds: bool
    source: str = ""
    note: str = ""
    command: str = ""
    kind: str = field(default="ordering", init=False)

    @property
    def hit(self) -> bool:
        return bool(self.holds)


@dataclass
class NotRun:
    """A claim of the paper this study does not check, and why (a model we do not have, a
    setting out of reach): listed, never counted as a hit or a miss."""

    what: str
    paper: str
    why: str
    source: str = ""
    kind: str = field(default="not_run", init=False)
    hit: bool = field(default=False, init=False)


def _num(x: float) -> str:
    if isinstance(x, int):
        return str(x)
    if x == 0 or 0.01 <= abs(x) < 1e5:
        return f"{x:.3g}" if abs(x) < 100 else f"{x:.1f}"
    return f"{x:.3g}"


def verdict_word(c) -> str:
    return "hit" if c.hit else "**miss**"


def verdict_table(claims: list, with_command: bool = False) -> list[str]:
    """Markdown lines: one row per claim (paper, ours, ours/paper, band, verdict, source, note)."""
    head = "| claim | paper | ours | ours / paper | band | verdict | source | note |" + (" command |" if with_command else "")
    rule = "|---|---|---|---|---|---|---|---|" + ("---|" if with_command else "")
    lines = [head, rule]
    for c in claims:
        if c.kind == "not_run":
            row = f"| {c.what} | {c.paper} | not run | | | not run | {c.source} | {c.why} |"
        elif c.kind == "ordering":
            row = f"| {c.what} | {c.paper} | {c.ours} | | holds | {verdict_word(c)} | {c.source} | {c.note} |"
        else:
            r = c.ratio
            row = f"| {c.what} | {c.paper_text} | {_num(c.ours)} | {'' if r is None else f'{r:.2f}'} | {c.band_text} | {verdict_word(c)} | {c.source} | {c.note} |"
        lines.append(row + (f" `{c.command}` |" if with_command else ""))
    checked = [c for c in claims if c.kind != "not_run"]
    hits = sum(c.hit for c in checked)
    lines += ["", f"{hits} of {len(checked)} claims hit, {len(checked) - hits} miss" + (f"; {len(claims) - len(checked)} not run." if len(checked) < len(claims) else ".")]
    return lines


def print_verdicts(title: str, claims: list) -> None:
    print(f"verdicts: {title}")
    for c in claims:
        if c.kind == "not_run":
            print(f"  --    {c.what}: paper {c.paper}; not run: {c.why}")
        elif c.kind == "ordering":
            print(f"  {'hit ' if c.hit else 'MISS'}  {c.what}: paper {c.paper}; ours {c.ours}")
        else:
            r = c.ratio
            print(f"  {'hit ' if c.hit else 'MISS'}  {c.what}: paper {c.paper_text}, ours {_num(c.ours)}" + ("" if r is None else f" ({r:.2f}x)") + f", {c.band_text}")
    checked = [c for c in claims if c.kind != "not_run"]
    print(f"  {sum(c.hit for c in checked)}/{len(checked)} hit" + (f", {len(claims) - len(checked)} not run" if len(checked) < len(claims) else ""), flush=True)


def as_json(claims: list) -> list[dict]:
    """The verdicts for results.json."""
    out = []
    for c in claims:
        if c.kind == "not_run":
            out.append({"what": c.what, "kind": c.kind, "paper": c.paper, "why": c.why, "source": c.source})
            continue
        d = {"what": c.what, "kind": c.kind, "paper": list(c.paper) if isinstance(c.paper, tuple) else c.paper, "ours": c.ours, "hit": c.hit, "source": c.source, "note": c.note}
        if c.kind == "claim":
            d["ratio"] = c.ratio
            d["band"] = c.band_text
        out.append(d)
    return out
