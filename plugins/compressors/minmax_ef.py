"""The feature-replay paper's compressor: min-max n-bit features with edge-side error feedback.

The edge (the sender of activations) keeps E = C(h) - h for every micro-batch it uploads, and
corrects the gradient that comes back for it: delta = delta_hat - E * delta_hat * delta_hat
(Alg. 1 line 5, the diagonal of Eq. 7-8). Only the uplink is compressed by default, as in the
paper; the gradient travels fp32.
"""

from __future__ import annotations

from framework.compression import Compressor
from framework.wire import Packet

from plugins.compressors.ef_codecs import minmax_error_feedback


class MinMaxEFCompressor(Compressor):
    """Min-max n-bit features up, fp32 gradients down, error feedback on the edge."""

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.error_feedback = bool(cfg.get("error_feedback", True)) if cfg is not None else True
        self._errors: dict = {}  # (edge, cloud, iteration, microbatch) -> E

    def encode_tensor(self, d, t, stream, *, src="", dst="", iteration=0, microbatch=0, **where):
        enc = super().encode_tensor(d, t, stream)
        if self.error_feedback and d is self.directions[self.forward_tag]:
            deq = d.codec.decode(enc.meta, memoryview(enc.payload), enc.shape, enc.dtype)
            self._errors[(src, dst, iteration, microbatch)] = deq - t.detach()
        return enc

    def decode(self, data, *, src: str = "", dst: str = "", tag: str = "", copy: bool = True) -> Packet:
        packet = super().decode(data, src=src, dst=dst, tag=tag, copy=copy)
        if self.error_feedback and tag == self.backward_tag:
            # the gradient comes back from the cloud (src) to the edge (dst) that stored E
            err = self._errors.pop((dst, src, packet.iteration, packet.microbatch), None)
            if err is not None and not packet.timing_only:
                packet.tensors = {k: minmax_error_feedback(v, err.to(v.dtype)) for k, v in packet.tensors.items()}
        return packet
