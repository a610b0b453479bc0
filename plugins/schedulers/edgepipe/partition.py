"""EdgePipe's partitioning layer (Yoon et al., IEEE IoT-J 2022; notes sections 2.2-2.6), as pure
functions:

- layer groups and devices per group for the three classes: `vertical` (M = 1), `hybrid`
  (Algorithm 1, M from Eq. 1) and `horizontal` (M = L), or an explicit M (the Fig. 6 sweep);
- neuron chunks per device (task division) into super neurons SN[w][h];
- the coordinator election by closeness centrality over ETX distances;
- the ownership model (destination partitioning, activation broadcast, backward partial
  products) as the list of messages one minibatch sends, its per-pair counts (the super-neuron
  topology SNNet) and the widest message (Eq. 4's M_pkt).

Layers are numbered 1..L with layer 1 the input (the paper counts it). A super neuron's index s
runs over groups, input side first, then over h within a group; s is also the device the
identity mapping puts it on ("Dev s+1" in the paper's Fig. 2(b)). A partition is JSON data
(framework.specs.Data): every super neuron's role spec carries it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from framework.config.knobs import choices
from framework.specs import Data
from plugins.schedulers.edgepipe.schema import SuperNeuronConfig

log = logging.getLogger(__name__)

CLASSES = choices(SuperNeuronConfig, "partition_class")
ROUNDINGS = choices(SuperNeuronConfig, "rounding")


@dataclass(frozen=True)
class SuperNeuron(Data):
    index: int  # s, 0-based
    group: int  # w, 1-based, input side first
    h: int  # 1-based position within the group
    chunks: tuple[tuple[int, int, int], ...]  # (layer, lo, hi): neurons lo..hi-1 (0-based) of that layer

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(layer for layer, _, _ in self.chunks)


@dataclass(frozen=True)
class Partition(Data):
    kind: str  # the class asked for
    sizes: tuple[int, ...]  # neurons per layer, input layer first
    n_devices: int
    groups: tuple[tuple[int, ...], ...]  # allocatedLayer: contiguous 1-based layer indices
    devices: tuple[int, ...]  # allocatedDevice: super neurons per group
    super_neurons: tuple[SuperNeuron, ...]
    notes: tuple[str, ...] = ()  # every repair of the paper's rule that fired (for plan.json)

    @property
    def L(self) -> int:
        return len(self.sizes)

    @property
    def P(self) -> int:  # pipeline stages = layer groups
        return len(self.groups)

    @property
    def m_layers(self) -> int:
        return max(len(g) for g in self.groups)

    @property
    def effective_class(self) -> str:
        """What the partition is, whatever was asked: the paper's edge cases turn Hybrid into
        Vertical (N >= 2L) or Horizontal (N = 2, 3)."""
        if self.P == 1:
            return "horizontal"
        return "vertical" if self.m_layers == 1 else "hybrid"

    def holders(self, layer: int) -> list[tuple[int, int, int]]:
        """(s, lo, hi) of every super neuron holding a slice of `layer`."""
        return [(sn.index, lo, hi) for sn in self.super_neurons for l, lo, hi in sn.chunks if l == layer]


def _round(x: float, rounding: str) -> int:
    if rounding == "half_even":
        return round(x)
    return math.floor(x + 0.5)


def paper_groups(L: int, n_devices: int) -> list[list[int]]:
    """Algorithm 1 part I literally: G = floor(N/2) groups of M = floor(L/G) layers (Eq. 1), the
    remaining r < G layers one each to the last r (output-side) groups. No repair: M can be 0."""
    G = n_devices // 2
    if G < 1:
        raise ValueError(f"Eq. (1) needs at least 2 devices, got {n_devices}")
    M = L // G
    sizes = [M] * G
    for w in range(G - (L - M * G), G):
        sizes[w] += 1
    return _expand(sizes)


def hybrid_groups(L: int, n_devices: int, m_layers: int | None = None) -> tuple[list[list[int]], list[str]]:
    """Layer groups for Hybrid, with the notes' repair (section 2.4): G = min(floor(N/2), L) so
    that M >= 1. With `m_layers` given (the Fig. 6 sweep, overriding Eq. 1): ceil(L/M) groups of M
    layers, the short remainder group on the output side (the notes' reading; it keeps every
    group at most M layers, which is what M means)."""
    notes: list[str] = []
    if m_layers is not None:
        if not 1 <= m_layers <= L:
            raise ValueError(f"m_layers must be in 1..L={L}, got {m_layers}")
        G = math.ceil(L / m_layers)
        return _expand([m_layers] * (G - 1) + [L - m_layers * (G - 1)]), notes
    if n_devices < 2:
        raise ValueError(f"hybrid needs at least 2 devices, got {n_devices}")
    if n_devices // 2 > L:
        notes.append(f"Eq. (1) gives floor(N/2) = {n_devices // 2} > L = {L} groups (M = 0); using G = L (M = 1)")
        return _expand([1] * L), notes
    return paper_groups(L, n_devices), notes


def devices_per_group(groups: Sequence[Sequence[int]], n_devices: int, rounding: str = "hamilton") -> list[int]:
    """Algorithm 1 part II: devices per group in proportion to its layers, quota N * m_w / L.

    `half_up` / `half_even` are the paper's round() literally (the sum can miss N; the notes'
    list of bad (L, N) was computed with half_even). `hamilton` (default) is the notes' repair:
    largest remainder so that the sum is N, every group at least min(2, N // G) devices; equal
    remainders go to the output side, as Algorithm 1 gives spare layers to it."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    L = sum(len(g) for g in groups)
    quotas = [n_devices * len(g) / L for g in groups]
    if rounding != "hamilton":
        return [_round(q, rounding) for q in quotas]
    G = len(groups)
    if n_devices < G:
        raise ValueError(f"{G} layer groups need at least {G} devices, got {n_devices}")
    floor_min = min(2, n_devices // G)
    alloc = [max(floor_min, math.floor(q)) for q in quotas]
    while sum(alloc) < n_devices:  # the largest shortfall gets one; ties to the output side
        w = max(range(G), key=lambda i: (quotas[i] - alloc[i], i))
        alloc[w] += 1
    while sum(alloc) > n_devices:  # only when minimums overshoot: take from the most over-served
        w = min((i for i in range(G) if alloc[i] > floor_min), key=lambda i: (quotas[i] - alloc[i], i))
        alloc[w] -= 1
    return alloc


def neuron_chunks(n: int, k: int) -> list[tuple[int, int]]:
    """Task division into k contiguous balanced chunks, sizes differing by at most one, the first
    ones larger (numpy.array_split; the notes' choice: the paper's task-division is undefined
    for n/k non-integral, and 784/6 -> 131 is the paper's own M_pkt). 0-based half-open."""
    if k < 1 or n < k:
        raise ValueError(f"cannot split {n} neurons into {k} non-empty chunks")
    q, r = divmod(n, k)
    bounds = [0]
    for i in range(k):
        bounds.append(bounds[-1] + q + (1 if i < r else 0))
    return [(bounds[i], bounds[i + 1]) for i in range(k)]


def _expand(sizes: Sequence[int]) -> list[list[int]]:
    out, first = [], 1
    for m in sizes:
        out.append(list(range(first, first + m)))
        first += m
    return out


def _apportion_equal(total: int, parts: int) -> list[int]:
    """`total` split into `parts` integers as equal as possible, the larger ones on the output side."""
    q, r = divmod(total, parts)
    return [q + (1 if i >= parts - r else 0) for i in range(parts)]


def partition(sizes: Sequence[int], n_devices: int, kind: str = "hybrid", *, m_layers: int | None = None,
              rounding: str = "hamilton") -> Partition:
    """The super neurons of an L-layer MLP (`sizes` includes the input layer) over N devices.

    - hybrid: Algorithm 1 (groups by Eq. 1 or `m_layers`, devices per group, equal neuron chunks);
    - vertical: M = 1. N = L: one device per layer; N < L: contiguous whole-layer blocks (sizes as
      equal as possible, larger on the output side); N > L: devices per layer apportioned (notes
      section 8 item 14). N = 1 is the Naive baseline;
    - horizontal: one group, every layer split over all N devices.
    A literal rounding whose device count misses N raises: it has no device-per-super-neuron map."""
    sizes = tuple(int(s) for s in sizes)
    L = len(sizes)
    if kind not in CLASSES:
        raise ValueError(f"kind must be one of {CLASSES}, got {kind!r}")
    if L < 2 or min(sizes) < 1:
        raise ValueError(f"need at least 2 layers of >= 1 neuron, got {sizes}")
    if n_devices < 1:
        raise ValueError(f"need at least one device, got {n_devices}")
    notes: list[str] = []
    if kind == "horizontal":
        groups, devices = [list(range(1, L + 1))], [n_devices]
    elif kind == "vertical":
        if n_devices <= L:
            groups, devices = _expand(_apportion_equal(L, n_devices)), [1] * n_devices
        else:
            groups, devices = _expand([1] * L), _apportion_equal(n_devices, L)
    else:
        groups, notes = hybrid_groups(L, n_devices, m_layers)
        devices = devices_per_group(groups, n_devices, rounding)
        if rounding == "hamilton" and m_layers is None:
            literal = devices_per_group(groups, n_devices, "half_up")
            if literal != devices:
                notes.append(f"Algorithm 1 rounding gives devices {literal} (sum {sum(literal)}) for N = {n_devices}; "
                             f"largest-remainder gives {devices}")
    if sum(devices) != n_devices:
        raise ValueError(f"the paper's rule ({rounding}) gives {sum(devices)} super neurons {devices} for "
                         f"{n_devices} devices (groups {groups}); use rounding='hamilton'")
    for note in notes:
        log.warning("edgepipe partition (L=%d, N=%d): %s", L, n_devices, note)
    sns = []
    for w, (layers, k) in enumerate(zip(groups, devices), start=1):
        per_layer = {l: neuron_chunks(sizes[l - 1], k) for l in layers}
        for h in range(k):
            chunks = tuple((l, *per_layer[l][h]) for l in layers)
            sns.append(SuperNeuron(len(sns), w, h + 1, chunks))
    return Partition(kind, sizes, n_devices, tuple(tuple(g) for g in groups), tuple(devices), tuple(sns), tuple(notes))


# --- the ownership model and the super-neuron topology (notes 2.5, 2.6) -----------------------------

@dataclass(frozen=True)
class Message:
    """One directed message per minibatch. fw: src's activation slice of layer src_layer to a
    holder of src_layer + 1; bw: src's partial product dL/da (for dst's slice of dst_layer) from
    layer dst_layer + 1; share: output logits between output holders. `width` = values per sample."""

    kind: str  # "fw" | "bw" | "share"
    src: int
    dst: int
    src_layer: int
    dst_layer: int
    width: int


def messages(p: Partition) -> list[Message]:
    """Every message of one minibatch under destination partitioning with activation broadcast
    (notes 2.5): forward l -> l+1 from every holder of l to every other holder of l+1; output
    sharing among the output holders; backward l+1 -> l for l >= 2 (the input gets no gradient).
    Slices a device holds of both layers stay local."""
    out: list[Message] = []
    for l in range(1, p.L):
        for a, lo, hi in p.holders(l):
            out += [Message("fw", a, b, l, l + 1, hi - lo) for b, _, _ in p.holders(l + 1) if b != a]
    outs = p.holders(p.L)
    for a, lo, hi in outs:
        out += [Message("share", a, b, p.L, p.L, hi - lo) for b, _, _ in outs if b != a]
    for l in range(p.L - 1, 1, -1):
        for b, _, _ in p.holders(l + 1):
            out += [Message("bw", b, a, l + 1, l, hi - lo) for a, lo, hi in p.holders(l) if a != b]
    return out


def message_counts(p: Partition, kinds: Sequence[str] = ("fw", "bw", "share"), perm: Sequence[int] | None = None) -> np.ndarray:
    """Messages per minibatch from row to column (an N x N int matrix). Indices are super
    neurons, or devices when `perm` (super neuron s on device perm[s]) is given."""
    n = len(p.super_neurons)
    where = list(range(n)) if perm is None else list(perm)
    counts = np.zeros((n, n), dtype=np.int64)
    for m in messages(p):
        if m.kind in kinds:
            counts[where[m.src], where[m.dst]] += 1
    return counts


def snnet(p: Partition) -> np.ndarray:
    """The super-neuron topology: training passes per minibatch per directed pair, normalised by
    the largest (weights in [0, 1], zero diagonal). All zeros for a single device."""
    counts = message_counts(p).astype(float)
    top = counts.max()
    return counts / top if top > 0 else counts


def max_message_width(p: Partition) -> int:
    """Eq. (4)'s M_pkt: the most values one message carries per sample (0 without messages)."""
    return max((m.width for m in messages(p)), default=0)


# --- coordinator election (notes 2.3) ---------------------------------------------------------------

def etx_distances(prr: np.ndarray, etx: str = "forward") -> np.ndarray:
    """All-pairs shortest paths (Floyd-Warshall; N is small) over ETX edge weights: `forward` is
    1/PRR(i, j) (the notes' first choice), `bidirectional` the classic 1/(PRR(i, j) PRR(j, i)).
    A zero-PRR link is no edge (inf)."""
    if etx not in ("forward", "bidirectional"):
        raise ValueError(f"etx must be 'forward' or 'bidirectional', got {etx!r}")
    prr = np.asarray(prr, dtype=float)
    q = prr * prr.T if etx == "bidirectional" else prr
    with np.errstate(divide="ignore"):
        d = np.where(q > 0, 1.0 / np.where(q > 0, q, 1.0), np.inf)
    np.fill_diagonal(d, 0.0)
    for k in range(len(d)):
        d = np.minimum(d, d[:, k:k + 1] + d[k:k + 1, :])
    return d


def closeness(prr: np.ndarray, etx: str = "forward") -> np.ndarray:
    """Closeness centrality (Bavelas) of each device from its distances to the others, the
    direction a coordinator's decision spreads. Unreachable devices are left out and the score
    scaled by the reachable fraction (Wasserman-Faust, as networkx does)."""
    d = etx_distances(prr, etx)
    n = len(d)
    out = np.zeros(n)
    for i in range(n):
        reach = np.isfinite(d[i]) & (np.arange(n) != i)
        k, total = int(reach.sum()), float(d[i][reach].sum())
        if k and total > 0 and n > 1:
            out[i] = (k / total) * (k / (n - 1))
    return out


def elect_coordinator(prr: np.ndarray, etx: str = "forward") -> int:
    """The device of highest closeness centrality; ties go to the lowest index (deterministic).
    It runs Algorithms 1-2; in simulation it changes nothing else, so it is logged only."""
    c = closeness(prr, etx)
    return int(np.flatnonzero(c >= c.max() - 1e-12)[0])
