"""What the AccEPT paper reports (Chen et al.; ../shared/papers/accept.notes.md), in one place for the
studies' verdicts (experiments/verdicts.py): accept_table5.py (Tables 5, 2 and 4.2.2, Fig. 4),
accept_predictor.py (Figs. 7-8), accept_transfer.py (Table 3, Fig. 9), accept_accuracy.py (Table 4).
"""

from __future__ import annotations

BANDWIDTHS = (0.25, 0.5, 1.0, 2.0, 4.0)  # Mbit/s, Table 5's columns
BATCHES_PER_EPOCH = 60000 / 128  # MNIST at batch 128: 468 full mini-batches and one of 96 samples
TABLE5_EPOCHS = 100
METHOD_NAMES = {"ftpipehd": "FTPipeHD", "blc": "BLC only", "lp": "LP only", "accept": "AccEPT"}

# Table 5: training time of 100 epochs, minutes (notes 4.4)
TABLE5_MINUTES = {
    "accept_s1": {
        "ftpipehd": (3439.17, 1755.93, 894.41, 620.03, 488.85),
        "blc": (1212.64, 952.16, 546.26, 577.76, 466.341),
        "lp": (2326.17, 1280.96, 628.88, 455.57, 423.07),
        "accept": (1139.95, 711.25, 437.19, 423.59, 403.75),
    },
    "accept_s2": {
        "ftpipehd": (2295.11, 1235.48, 621.758, 484.66, 397.4),
        "blc": (1110.78, 721.68, 451.04, 442.07, 390.12),
        "lp": (2069.48, 1178.71, 584.86, 400.83, 360.69),
        "accept": (967.86, 639.66, 420.15, 364.24, 351.41),
    },
}
# the speed-ups the text quotes (§4.4): AccEPT at most 3.01; BLC 2.84 and 2.07 at low bandwidth; LP
# 1.15 and 1.10 at 4 Mbit/s
QUOTED = {
    ("accept_s1", 0.25, "accept"): 3.01,
    ("accept_s1", 0.25, "blc"): 2.84,
    ("accept_s2", 0.25, "blc"): 2.07,
    ("accept_s1", 4.0, "lp"): 1.15,
    ("accept_s2", 4.0, "lp"): 1.10,
}


def per_batch_s(minutes: float, epochs: int = TABLE5_EPOCHS) -> float:
    """Seconds per mini-batch of a run of `epochs` MNIST epochs that took `minutes`."""
    return minutes * 60 / (epochs * BATCHES_PER_EPOCH)


def speedups(scenario: str, method: str) -> tuple[float, ...]:
    """Table 5's FTPipeHD / method, per bandwidth (the notes' derived table)."""
    base = TABLE5_MINUTES[scenario]["ftpipehd"]
    return tuple(b / m for b, m in zip(base, TABLE5_MINUTES[scenario][method]))


# Table 4.2.2 (unnumbered, §4.2.2): the first 10 epochs, minutes; Table 2: the partition points
# (0-indexed last layer of every stage but the last) behind them
TABLE422_MINUTES = {
    "accept_s1": {"average": 44.44, "ftpipehd": 42.26, "lp": 38.69},
    "accept_s2": {"average": 41.72, "ftpipehd": 38.46, "lp": 35.42},
}
TABLE2_CUTS = {
    "accept_s1": {"average": (7, 14), "ftpipehd": (8, 14), "lp": (7, 13)},
    "accept_s2": {"average": (7, 14), "ftpipehd": (10, 13), "lp": (11, 15)},
}

# Fig. 4: FTPipeHD's layer-level estimate on d1, "most of the estimation errors exceed 20%", the
# largest 187.51 %
FIG4_MAX_ERROR = 1.8751

# Figs. 7-8: share of sub-models predicted within 5 % / 10 % on the unseen device
FIG7_PRETRAINED = (0.88, 0.95)  # "approximately 88%" and "over 95%"
FIG8_ADAPTED = (0.90, 0.96)  # after the adaptive update, converged at about 8 samples

# Table 3: transmission size (KB) and compression ratio, per tensor: MobileNetV2 at batch 128
# (largest: unit 0's 128x32x16x16; smallest: unit 14's 128x160x1x1), the HAR CNN at batch 64
# (largest: 64x64x126; smallest: 64x100)
TABLE3_CR = {
    "mbv2_largest": {"mbq2": 15.93, "mbq2_noenc": 2.00, "mbq3": 10.63, "mbq3_noenc": 1.33, "mbq4": 7.98, "mbq4_noenc": 1.00, "uniform4": 7.99, "uniform_noenc": 4.00},
    "cnn_largest": {"mbq2": 15.86, "mbq2_noenc": 2.00, "mbq3": 10.61, "mbq3_noenc": 1.33, "mbq4": 7.97, "mbq4_noenc": 1.00, "uniform4": 7.98, "uniform_noenc": 4.00},
    "mbv2_smallest": {"mbq2": 13.20, "mbq2_noenc": 1.96, "mbq3": 9.35, "mbq3_noenc": 1.32, "mbq4": 7.25, "mbq4_noenc": 0.99, "uniform4": 7.66, "uniform_noenc": 3.93},
    "cnn_smallest": {"mbq2": 9.62, "mbq2_noenc": 1.88, "mbq3": 7.41, "mbq3_noenc": 1.28, "mbq4": 6.03, "mbq4_noenc": 0.98, "uniform4": 7.02, "uniform_noenc": 3.78},
}
TABLE3_SHAPES = {"mbv2_largest": (128, 32, 16, 16), "cnn_largest": (64, 64, 126), "mbv2_smallest": (128, 160, 1, 1), "cnn_smallest": (64, 100)}

# Fig. 9 (real WiFi): the largest MobileNetV2 feature at 50 Mbit/s about 1300 ms uncompressed and
# about 100 ms at 2 bits ("up to 1/13"); the smallest 55 ms to about 25 ms
FIG9 = {"largest_ms": (1300.0, 100.0), "smallest_ms": (55.0, 25.0)}
MOTIVATION_4MB_AT_50MBPS_MS = 655.0  # §2.2: "about 655ms" for the 4 MB feature over 4G at 50 Mbit/s

# Table 4: test accuracy %, forward k in {2, 3, 4}, backward 8-bit
TABLE4 = {
    "cifar10": {"none": 85.72, "mbq": {2: 85.23, 3: 85.09, 4: 85.57}, "uniform": {2: 84.66, 3: 84.38, 4: 83.77}, "alq": {2: 81.67, 3: 82.01, 4: 77.93}},
    "har": {"none": 97.47, "mbq": {2: 94.93, 3: 96.04, 4: 96.79}, "uniform": {2: 80.85, 3: 78.67, 4: 94.30}, "alq": {2: 92.84, 3: 87.02, 4: 93.90}},
}
