"""Compressors: how tensors become bytes on a link, per direction.

A compressor pairs a forward codec (activations, tag `act`) with a backward codec (gradients,
tag `grad`), each with a bit width that may follow an explicit epoch schedule
(`schedule: [[0, 2], [130, 3], [175, 4]]`, AccEPT section 2.2.6). Codecs keep per-stream state (one
stream per (src, dst, tag)); the compressor hands each its stream and resets streams whose codec
wants a fresh start at each epoch (MBQ re-initialises at batch 0 of every epoch).

Tensors with other tags, and integer tensors (labels) under any tag, travel raw. The base class with both directions off is
`compressor=none`.

Codec time: encoding is charged to the sending device and decoding to the receiving one (see
framework.runtime.sim). `time.model=linear` (the default, deterministic) prices a codec call at
`s_per_MB * fp32_MB + s` (the feature-replay paper's Raspberry Pi 4B fit, Fig. 11);
`time.model=measured` uses the host's wall time of the call times `time.scale`; raw tensors
cost nothing.

The compressor also keeps the numbers a run reports: bytes before (fp32 wire packets) and after
per direction, bit widths, codec seconds and the relative L2 quantization error.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from typing import Any

import torch

from framework.checkpoints.state import CheckpointError
from framework.codec import Encoded, codec_class
from framework.config import knobs
from framework.config.schemas import CodecTimeConfig, CompressionConfig, CompressorConfig, DirectionConfig  # noqa: F401  (re-exported)
from framework.errors import ConfigError
from framework.runtime import wire


class _Direction:
    def __init__(self, name: str, cfg: DirectionConfig | None):
        self.name = name
        cfg = cfg if cfg is not None else DirectionConfig()
        self.codec_name = cfg.codec
        try:
            self.schedule = {int(epoch): int(bits) for epoch, bits in (cfg.schedule or [])}
        except (TypeError, ValueError):
            raise ConfigError(f"compressor.{'forward' if name == 'fwd' else 'backward'}.schedule", f"{list(cfg.schedule)} is not a list of [epoch, bits] pairs, e.g. [[0, 2], [130, 3], [175, 4]]") from None
        self.base_bits = int(cfg.bits)
        self.codec = None
        if cfg.codec != "none":
            where = f"compressor.{'forward' if name == 'fwd' else 'backward'}"
            try:
                self.codec = codec_class(cfg.codec)(bits=self.bits_at(0), **dict(cfg.options or {}))
                for b in set(self.schedule.values()):  # fail now, not at epoch 130
                    codec_class(cfg.codec)(bits=b, **dict(cfg.options or {}))
            except ConfigError as e:  # the codec names its own key; say which direction
                raise ConfigError(f"{where}.{e.key.split('.')[-1]}", str(e).split(": ", 1)[-1]) from None
        self.raw_bytes = 0
        self.wire_bytes = 0
        self.encode_s = 0.0
        self.decode_s = 0.0
        self.err_sum = 0.0
        self.err_n = 0
        self.last_error: float | None = None

    def bits_at(self, epoch: int) -> int:
        bits = self.base_bits
        for start in sorted(self.schedule):
            if epoch >= start:
                bits = self.schedule[start]
        return bits

    @property
    def bits(self) -> int:
        return self.codec.bits if self.codec is not None else 32

    def take_error(self) -> float | None:
        """Mean relative L2 quantization error since the last call (None if nothing was coded)."""
        if not self.err_n:
            return None
        e = self.last_error = self.err_sum / self.err_n
        self.err_sum, self.err_n = 0.0, 0
        return e


def _sized(d: _Direction, t: torch.Tensor) -> tuple[Encoded, int]:
    """A timing-only stand-in for `t` through `d`'s codec: (its metadata, the payload bytes it stands for)."""
    meta_n, payload_n = d.codec.wire_size(tuple(t.shape))
    return Encoded(d.codec.codec_id, t.dtype, tuple(t.shape), b"\0" * meta_n, None), payload_n


class Compressor:
    """No compression: tensors cross links as raw wire packets (fp32 stays fp32)."""

    def __init__(self, cfg=None):
        self.cfg = cfg
        get = (lambda k, d=None: cfg.get(k, d)) if cfg is not None else (lambda k, d=None: d)  # None: no compression, its defaults
        self.forward_tag = get("forward_tag", "act")
        self.backward_tag = get("backward_tag", "grad")
        self.directions = {
            self.forward_tag: _Direction("fwd", get("forward")),
            self.backward_tag: _Direction("bwd", get("backward")),
        }
        tcfg = get("time")
        self.time_cfg = tcfg if tcfg is not None else CodecTimeConfig(model="none")
        knobs.check({"model": self.time_cfg.model}, CodecTimeConfig, "compressor.time")  # a compressor made in code too
        self.max_decoded_bytes = get("max_decoded_bytes", wire.MAX_DECODED_BYTES)
        if isinstance(self.max_decoded_bytes, bool) or not isinstance(self.max_decoded_bytes, int) or self.max_decoded_bytes <= 0:
            raise ConfigError("compressor.max_decoded_bytes", f"{self.max_decoded_bytes!r} is not a positive number of bytes (default {wire.MAX_DECODED_BYTES}, 2 GiB)")
        self.seed = 0
        self.epoch = 0
        self._streams: dict = defaultdict(dict)
        self._kept: dict = {}  # (sender, receiver, iteration, microbatch) -> what remember() kept

    # ---- configuration over time ---------------------------------------------------------

    def set_seed(self, seed: int) -> None:
        self.seed = int(seed)

    def set_epoch(self, epoch: int) -> None:
        """Apply the bit-width schedules and mark every stream for a fresh start."""
        self.epoch = epoch
        for d in self.directions.values():
            if d.codec is not None:
                d.codec.bits = d.bits_at(epoch)
        for stream in self._streams.values():
            stream["reset"] = True

    def prepare(self) -> None:
        """Codec.prepare for every codec this compressor may use (see there)."""
        for d in self.directions.values():
            if d.codec is not None:
                type(d.codec).prepare()

    def codec(self, tag: str):
        """The codec that codes `tag` (None where it travels raw): a role that quantizes on its
        own (AdaLearner's group owner re-quantizing the aggregate once for every worker) uses
        the run's codec and its options."""
        d = self.directions.get(tag)
        return None if d is None else d.codec

    def stream(self, src: str, dst: str, tag: str) -> dict:
        s = self._streams[(src, dst, tag)]
        if "seed" not in s:
            s["seed"] = zlib.crc32(f"{self.seed}:{src}->{dst}:{tag}".encode())
        return s

    # ---- the runtime's calls ----------------------------------------------------------------

    def encode(self, tensors: dict, *, src: str = "", dst: str = "", tag: str = "", iteration: int = 0, microbatch: int = 0) -> tuple[bytes, int, int]:
        """(packet, bytes it occupies on the link, bytes of the uncompressed packet). Timing-only
        packets carry no payloads but count the bytes they stand for."""
        raw_size = wire.encoded_size(tensors)
        d = self.directions.get(tag)
        if d is None or d.codec is None:
            data = wire.encode(tensors, iteration=iteration, microbatch=microbatch)
            if d is not None:
                d.raw_bytes += raw_size
                d.wire_bytes += raw_size
            return data, raw_size, raw_size
        out = {}
        missing_payload = 0
        for name, t in tensors.items():
            # one stream per tensor of the message: a codec's state (a residual, a scale) is per
            # tensor; a lone tensor ("x") keeps the stream its message always had (same seeds)
            stream = self.stream(src, dst, tag if name == "x" else f"{tag}.{name}")
            if not t.is_floating_point():  # labels, indices: never quantized
                out[name] = t
                if t.device.type == "meta":
                    missing_payload += t.numel() * t.element_size()
                continue
            if t.device.type == "meta":  # timing only: sizes, no math
                out[name], payload_n = _sized(d, t)
                missing_payload += payload_n
                continue
            out[name] = self.encode_tensor(d, t, stream, src=src, dst=dst, iteration=iteration, microbatch=microbatch)
            err = stream.get("rel_err")
            if err is not None:
                d.err_sum += float(err)
                d.err_n += 1
        data = wire.encode(out, iteration=iteration, microbatch=microbatch)
        size = len(data) + missing_payload
        d.raw_bytes += raw_size
        d.wire_bytes += size
        return data, size, raw_size

    def packet_bytes(self, tensors: dict, *, tag: str) -> int:
        """The bytes `encode` would put on the link for `tensors` (shapes suffice: meta tensors
        welcome) at the current bits, encoding and counting nothing: what planners price a
        message at."""
        tensors = {k: t.to("meta") for k, t in tensors.items()}
        d = self.directions.get(tag)
        if d is None or d.codec is None:
            return wire.encoded_size(tensors)
        out, payload = {}, 0
        for name, t in tensors.items():
            if t.is_floating_point():
                out[name], n = _sized(d, t)
            else:
                out[name], n = t, t.numel() * t.element_size()
            payload += n
        return len(wire.encode(out)) + payload

    def encode_tensor(self, d: _Direction, t: torch.Tensor, stream: dict, *, src="", dst="", iteration=0, microbatch=0) -> Encoded:
        """One tensor through the direction's codec. For forward tensors the sender may keep
        something (`remember`) to correct the gradient that comes back for them (`on_gradient`)."""
        enc = d.codec.encode(t.detach(), stream)
        if d is self.directions[self.forward_tag]:
            kept = self.remember(d, t.detach(), enc, stream)
            if kept is not None:
                self._kept[(src, dst, iteration, microbatch)] = kept
        return enc

    def decode(self, data, *, src: str = "", dst: str = "", tag: str = "", copy: bool = True) -> wire.Packet:
        packet = wire.decode(data, copy=copy, max_bytes=self.max_decoded_bytes)
        if not packet.timing_only:
            packet.tensors = self.received(packet.tensors, src=src, dst=dst, tag=tag, iteration=packet.iteration, microbatch=packet.microbatch)
        return packet

    def received(self, tensors: dict, *, src: str, dst: str, tag: str, iteration: int, microbatch: int) -> dict:
        """Decoded tensors as the receiver sees them: a gradient coming back from `src` for what
        `dst` sent it is corrected with what `remember` kept."""
        if tag == self.backward_tag and self._kept:
            kept = self._kept.pop((dst, src, iteration, microbatch), None)
            if kept is not None:
                return {k: self.on_gradient(g, kept) for k, g in tensors.items()}
        return tensors

    def carry(self, tensors: dict, *, tag: str, copy: bool = True) -> tuple[dict, int] | None:
        """The simulator's shortcut for a direction without a codec: (fresh contiguous copies of
        the tensors, the bytes their packet would take), counted as `encode` counts them; the
        receiver hands them to `received`. The same values arrive as through wire bytes, without
        building and parsing the packet (a decoded tensor views its packet at whatever offset the
        header left; a copy is aligned, so BLAS may sum in another order: float64 results can
        differ in the last bit). A timing-only (meta) tensor has no values to copy: the receiver
        gets its own meta tensor of the same shape, as `decode` would make. None where a codec
        codes `tag`. `copy=False`: the tensors themselves (detached), for a sender that keeps none
        of them (framework.runtime.base.Context.send's `moved`)."""
        size = self.carried_size(tensors, tag=tag)
        if size is None:
            return None
        if not copy:
            return {k: t.detach() for k, t in tensors.items()}, size
        return {k: t.detach() if t.device.type == "meta" else t.detach().clone(memory_format=torch.contiguous_format) for k, t in tensors.items()}, size

    def carried_size(self, tensors: dict, *, tag: str) -> int | None:
        """The bytes `carry` counts for `tensors` (shapes suffice: meta tensors stand for values
        computed later), counted as `encode` counts them; None where a codec codes `tag`."""
        d = self.directions.get(tag)
        if d is not None and d.codec is not None:
            return None
        size = wire.encoded_size(tensors)
        if d is not None:
            d.raw_bytes += size
            d.wire_bytes += size
        return size

    @property
    def codes_nothing(self) -> bool:
        """No direction has a codec: every message travels raw, and `received` changes nothing."""
        return all(d.codec is None for d in self.directions.values())

    def remember(self, d: _Direction, x: torch.Tensor, enc: Encoded, stream: dict):
        """What the sender keeps of a forward tensor for its returned gradient (None: nothing)."""
        return None

    def on_gradient(self, g: torch.Tensor, kept) -> torch.Tensor:
        """The returned gradient, corrected with what `remember` kept."""
        return g

    def codec_estimate(self, kind: str, tag: str, tensors: dict) -> float | None:
        """The modelled device seconds of `codec_seconds`, counting nothing (shapes suffice);
        None where the time model is `measured` (known only by running the codec)."""
        d = self.directions.get(tag)
        if d is None or d.codec is None or self.time_cfg.model == "none":
            return 0.0
        if not any(t.is_floating_point() for t in tensors.values()):
            return 0.0  # labels, indices and control values travel raw: nothing is coded
        if self.time_cfg.model == "measured":
            return None
        mb = sum(t.numel() for t in tensors.values() if t.is_floating_point()) * 4 / 1e6
        if kind == "encode":
            return self.time_cfg.encode_s_per_MB * mb + self.time_cfg.encode_s
        return self.time_cfg.decode_s_per_MB * mb + self.time_cfg.decode_s

    def codec_seconds(self, kind: str, tag: str, tensors: dict, wall_s: float) -> float:
        """Device seconds to encode (kind='encode') or decode one packet of `tag` holding
        `tensors` (the originals: the linear model is in their fp32 megabytes)."""
        d = self.directions.get(tag)
        s = self.codec_estimate(kind, tag, tensors)
        if s is None:
            s = wall_s * self.time_cfg.scale
        if not s:
            return 0.0
        if kind == "encode":
            d.encode_s += s
        else:
            d.decode_s += s
        return s

    # ---- checkpoints (framework.checkpoints.state) ----------------------------------------------------

    _COUNTERS = ("raw_bytes", "wire_bytes", "encode_s", "decode_s", "err_sum", "err_n", "last_error")

    def checkpoint(self, bag, prefix: str) -> dict:
        """The streams' state (residuals, scales, generators) and the byte and error counters.
        Taken at an epoch end, when every forward tensor's gradient has come back."""
        if self._kept:
            raise CheckpointError(f"the compressor still waits for the gradients of {len(self._kept)} forward tensors")
        streams = [{"key": list(key), "state": bag.put(f"{prefix}.stream{i}", st)} for i, (key, st) in enumerate(self._streams.items())]
        directions = {name: {c: getattr(d, c) for c in self._COUNTERS} for name, d in self.directions.items()}
        return {"seed": self.seed, "epoch": self.epoch, "streams": streams, "directions": directions}

    def restore(self, bag, desc: dict) -> None:
        self.set_seed(desc["seed"])
        self.set_epoch(int(desc["epoch"]))
        self._streams.clear()
        for st in desc["streams"]:
            self._streams[tuple(st["key"])] = bag.take(st["state"])
        for name, counters in desc["directions"].items():
            for c, v in counters.items():
                setattr(self.directions[name], c, v)

    # ---- what a run reports -----------------------------------------------------------------

    def coded_directions(self) -> set[str]:
        """The directions (`fwd`, `bwd`) a codec codes; the others travel raw."""
        return {d.name for d in self.directions.values() if d.codec is not None}

    def epoch_metrics(self) -> dict[str, float]:
        """Bit widths (where a schedule changes them: a fixed width is the run's param) and
        quantization error of the directions a codec codes (a raw direction's 32 bits and no
        error say nothing; `summary` keeps them all)."""
        out = {}
        for d in self.directions.values():
            if d.codec is None:
                continue
            if d.schedule:
                out[f"compression/bits_{d.name}"] = d.bits
            err = d.take_error()
            if err is not None:
                out[f"compression/rel_err_{d.name}"] = err
        return out

    def summary(self) -> dict:
        out: dict[str, Any] = {"name": self.cfg.name if self.cfg is not None else "none"}
        for d in self.directions.values():
            out[f"codec_{d.name}"] = d.codec_name
            out[f"bits_{d.name}"] = d.bits
            out[f"ratio_{d.name}"] = d.raw_bytes / d.wire_bytes if d.wire_bytes else 1.0
            out[f"raw_bytes_{d.name}"] = d.raw_bytes
            out[f"wire_bytes_{d.name}"] = d.wire_bytes
            out[f"encode_s_{d.name}"] = d.encode_s
            out[f"decode_s_{d.name}"] = d.decode_s
            out[f"rel_err_{d.name}"] = d.last_error if d.err_n == 0 else d.err_sum / d.err_n
        return out
