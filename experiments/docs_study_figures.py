"""The reproduction studies' figures (docs/reproductions/<study>/*.png), for
experiments/docs_figures.py: the study command that draws each, and for those whose numbers run
on the virtual clock without training, the part of the study that `--check --studies` runs again.

Every study writes each figure's data beside it (experiments/figure_data.py); the committed
docs/reproductions/<study>/<figure>.json is that of the committed PNG. A checked figure's part
runs as a user runs it, into a temporary `--out`, and its data are compared with the committed
file exactly as the docs' own figures are (6 significant digits). A figure drawn from training
(accuracy, loss, weight drift) is not run again: its committed data are those of the full run
that drew it, and `--list` says why and how long its study takes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StudyFigure:
    png: str  # under the repository root
    command: str  # the study's full form, as docs/reproductions.md shows it
    part: str | None  # the study command `--check --studies` runs (timing only, virtual clock), or None
    minutes: float  # the part's time on one idle core (its CPU time here), or (part None) the study's training runs'
    note: str = ""  # part None: why the check does not run it, and how the study redraws it; else a caveat

    @property
    def name(self) -> str:  # "pipar/speed"
        study, stem = self.png.split("/")[-2:]
        return f"{study}/{stem[:-4]}"

    @property
    def study(self) -> str:
        return self.png.split("/")[-2]

    @property
    def file(self) -> str:  # the PNG's name, as the study writes it into --out
        return self.png.split("/")[-1]


PIPAR = "python experiments/pipar_study.py --accuracy"
ACCEPT = "python experiments/accept_table5.py"
ADALEARNER = "python experiments/adalearner_study.py"
EDGEPIPE = "python experiments/edgepipe_study.py"
FEATURE_REPLAY = "python experiments/feature_replay_study.py"

EDGEPIPE_WHY = ("trained: 20 runs of 194 simulated minutes each with 100 lossy test passes (2.5-10 CPU minutes a run, about 35 minutes alone on 2 cores); "
                "redrawn from the full run's records with `python experiments/edgepipe_study.py --resume`")
FR_WHY = ("trained: VGG-5 on real Fashion-MNIST, 3 seeds x 3 epochs for each of 7 variants (21 runs, about 30 minutes of one core, needs Debian's dataset-fashion-mnist); "
          "redrawn from the full run's results with `python experiments/feature_replay_study.py --report`")

STUDY_FIGURES = (
    StudyFigure("docs/reproductions/pipar/speed.png", PIPAR, "python experiments/pipar_study.py --only speed", 2),
    StudyFigure("docs/reproductions/pipar/sensitivity.png", PIPAR, "python experiments/pipar_study.py --only sensitivity", 1.5),
    StudyFigure("docs/reproductions/pipar/selection.png", PIPAR, "python experiments/pipar_study.py --only selection", 2),
    StudyFigure("docs/reproductions/pipar/accuracy.png", PIPAR, None, 14,
                "trained: FL, SFL and PiPar on real Fashion-MNIST, K = 4, 10 epochs (about 14 minutes, needs Debian's dataset-fashion-mnist); "
                "redrawn from the full run's results with `python experiments/pipar_study.py --reuse`"),
    StudyFigure("docs/reproductions/accept/speedup_vs_bandwidth.png", ACCEPT, "python experiments/accept_table5.py --no-planning", 1,
                "a first run pre-trains AccEPT's predictor once, about 3.5 more minutes (cached in outputs/cache)"),
    StudyFigure("docs/reproductions/adalearner/scaling.png", ADALEARNER, "python experiments/adalearner_study.py --no-accuracy", 2.5),
    StudyFigure("docs/reproductions/adalearner/sensitivity.png", ADALEARNER, "python experiments/adalearner_study.py --no-accuracy", 2.5),
    StudyFigure("docs/reproductions/edgepipe/accuracy.png", EDGEPIPE, None, 35, EDGEPIPE_WHY),
    StudyFigure("docs/reproductions/edgepipe/cdf.png", EDGEPIPE, None, 35, EDGEPIPE_WHY),
    StudyFigure("docs/reproductions/edgepipe/placements.png", EDGEPIPE, None, 35, EDGEPIPE_WHY),
    StudyFigure("docs/reproductions/edgepipe/sensitivity.png", EDGEPIPE, None, 35, EDGEPIPE_WHY),
    StudyFigure("docs/reproductions/edgepipe/time_to_accuracy.png", EDGEPIPE, None, 35, EDGEPIPE_WHY),
    StudyFigure("docs/reproductions/feature_replay/sensitivity_k.png", FEATURE_REPLAY, "python experiments/feature_replay_study.py --only planner", 2),
    StudyFigure("docs/reproductions/feature_replay/planner.png", FEATURE_REPLAY, "python experiments/feature_replay_study.py --only planner", 2),
    StudyFigure("docs/reproductions/feature_replay/sensitivity_bandwidth.png", FEATURE_REPLAY, "python experiments/feature_replay_study.py --only bandwidth", 0.5),
    StudyFigure("docs/reproductions/feature_replay/adaptivity.png", FEATURE_REPLAY, "python experiments/feature_replay_study.py --only adaptivity", 0.2),
    StudyFigure("docs/reproductions/feature_replay/accuracy.png", FEATURE_REPLAY, None, 60, FR_WHY),
    StudyFigure("docs/reproductions/feature_replay/drift.png", FEATURE_REPLAY, None, 60, FR_WHY),
)


def parts(figures) -> dict[str, list[StudyFigure]]:
    """The commands to run, each with the figures it draws (one run serves them all)."""
    out: dict[str, list[StudyFigure]] = {}
    for f in figures:
        if f.part:
            out.setdefault(f.part, []).append(f)
    return out
