"""The config schema of EdgePipe's super neurons (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from framework.config.knobs import Range, knob, knob_factory
from framework.config.schemas import SchedulerConfig


@dataclass
class PRRConfig:
    """Where the links' packet reception ratios come from (EdgePipe, notes 2.11). The channel's
    defaults are the paper's Table I and Sec. V ("six edge devices randomly distributed over
    50 x 50 m2 ... a path-loss exponent of 3.1, a reference loss of 46.68 dB, and an additive white
    Gaussian noise N(0, 8^2), resulting in an average PRR of 80.9 %")."""

    source: str = knob(
        "channel",
        "channel (path loss + shadowing, random placement) | given (the matrix below) | cluster (1 - the links' configured loss)",
        choices=("channel", "given", "cluster"),
    )
    matrix: Optional[List[List[float]]] = knob(None, "source=given: PRR[i][j] from device i to j (the diagonal is ignored)")
    # 0 is a choice; experiment=edgepipe sets the first seed whose mean PRR is the paper's 80.9 %
    # (docs/calibration.md)
    topology_seed: int = knob(0, "source=channel: the placement and probe seed")
    roi_m: float = knob(50.0, "side of the square region the devices are placed in (Table I: 25-100 m, mainly 50)")
    pathloss_exp: float = knob(3.1, "path-loss exponent (Table I: 2.9-3.7, mainly 3.1)")
    sigma_db: float = knob(8.0, "log-normal shadowing (Table I: N(0, 8^2) dB)")
    # the paper gives no transmit power and no receiver threshold: fitted to the one link
    # property it reports, the average PRR of 80.9 % on six devices in 50 x 50 m (Sec. V): the
    # notes' Monte Carlo; over 2000 random placements of six devices (seeds 0-1999) 51.8 dB gives
    # a mean PRR of 0.8086 (edgepipe.channel)
    k_margin_db: float = knob(51.8, "P_tx - threshold - PL(d0), in dB")
    probe_packets: int = knob(50, "the PRR the mapper sees is measured with this many packets per link (Sec. V: \"by sending 50 packets\")")


@dataclass
class SuperNeuronConfig(SchedulerConfig):
    """EdgePipe (Yoon et al.; notes 2). Defaults are the paper's mechanism where it gives one; the
    rest are the notes' proposals (section 8) or choices, said as such."""

    name: str = "super_neuron"
    partition_class: str = knob(
        "hybrid",
        "hybrid (EdgePipe, Alg. 1, M from Eq. 1) | vertical (PipeDream core; 1 device = Naive) | horizontal",
        choices=("vertical", "hybrid", "horizontal"),
    )
    m_layers: Optional[int] = knob(None, "hybrid: layers per group, overriding Eq. 1 (the Fig. 6 sweep)")
    rounding: str = knob(
        "hamilton",
        "devices per group: hamilton (the notes' repair, 8 item 7) | half_up | half_even (the paper's literal round)",
        choices=("hamilton", "half_up", "half_even"),
    )
    n_devices: Optional[int] = knob(None, "use dev0..dev{n-1}; null = every devK of the cluster")
    mapping: str = knob("ga", "ga (Alg. 2) | random | upper (brute force) | identity", choices=("ga", "random", "upper", "identity"))
    mapping_seed: int = knob(0, "the GA's random reorderings (a choice: the paper gives none)")
    generations: Optional[int] = knob(None, "ga: null = 1000 for N <= 6, else 10000 (Sec. V)")
    prr: PRRConfig = knob_factory(PRRConfig, "the links' packet reception ratios")
    pipeline: bool = knob(True, "false: the Model baseline (2L - 1 slots per minibatch, no pipelining)")
    weight_stashing: bool = knob(True, "Eq. 3: backward at the forward's weights, applied to the latest")
    bwd_mode: str = knob(
        "masked",
        "masked (true gradient of the zero-filled graph; notes 8 item 2) | phantom (as if every input had arrived)",
        choices=("masked", "phantom"),
    )
    share_missing: str = knob(
        "abort",
        "an output holder missing a logit share: abort (no update, nothing sent back: the paper's all-or-nothing backward, Sec. IV-D, applied to the output layer, whose loss needs every logit) | zero_fill (the notes' proposal, 2.10: train on the view with the share zero)",
        choices=("abort", "zero_fill"),
    )
    slot_s: Optional[float] = knob(None, "null: worst op compute + worst message transfer + slot_margin_s, from the cluster's models (Eq. 4's structure)", range=Range(0, low_open=True, null=True, note="seconds; null: from the cluster's models"))
    slot_margin_s: float = knob(0.1, "Eq. 4's margin (Sec. V: \"a margin of 100 ms\")", range=Range(0, note="seconds"))
    init: str = knob(
        "glorot",
        "glorot (Glorot-uniform weights, zero biases: TF 1.15's default, notes 8 item 17) | model (the model plugin's init)",
        choices=("glorot", "model"),
    )
    recovery: str = knob(
        "none",
        "none (the paper's EdgePipe) | rtx (every message sent rtx_copies times back to back) | ack (retransmit until ACKed, within the slot; Fig. 9(f))",
        choices=("none", "rtx", "ack"),
    )
    rtx_copies: int = knob(2, "Fig. 9(f): \"a simple redundant transmission scheme with two consecutive times\"", range=Range(1, integer=True))
    ack_max_retries: int = knob(3, "ack: retransmissions per message at most (the notes' default, 2.11; the paper gives no cap)", range=Range(0, integer=True))
    budget_min: Optional[float] = knob(
        None,
        "train the minibatches that fit in this many simulated minutes (Table III: 194), one pipeline across data epochs, instead of train.epochs; null = train.epochs",
        range=Range(0, low_open=True, null=True, note="minutes; null: train.epochs"),
    )
    # 10 is a choice for a quick run; the paper ran 100 (Sec. V), as the study does
    lossy_test_passes: int = knob(10, "after training: test passes through the lossy forward (one draw per link and layer per pass); 0 = none", range=Range(0, integer=True))
    lossy_test_seed: int = knob(0, "the lossy test's draws")
    eval_every_min: Optional[float] = knob(
        None,
        "test accuracy over time (edgepipe.curve): a snapshot each this many simulated minutes of the slot clock; null: no curve",
        range=Range(0, low_open=True, null=True, note="simulated minutes; null: no curve"),
    )
    eval_passes: int = knob(5, "lossy passes per curve point, averaged (the final test has its own count)", range=Range(1, integer=True))  # a choice
