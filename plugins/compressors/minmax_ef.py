"""The feature-replay paper's compressor: min-max n-bit features with edge-side error feedback.

The edge (the sender of activations) keeps E = C(h) - h for every micro-batch it uploads, and
corrects the gradient that comes back for it: delta = delta_hat - E * delta_hat * delta_hat
(Alg. 1 line 5, the diagonal of Eq. 7-8). Only the uplink is compressed by default, as in the
paper; the gradient travels fp32.
"""

from __future__ import annotations

from framework.compression import Compressor

from plugins.compressors.ef_codecs import minmax_error_feedback


class MinMaxEFCompressor(Compressor):
    """Min-max n-bit features up, fp32 gradients down, error feedback on the edge."""

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.error_feedback = bool(cfg.get("error_feedback", True)) if cfg is not None else True

    def remember(self, d, x, enc, stream):
        if not self.error_feedback:
            return None
        return d.codec.decode(enc.meta, memoryview(enc.payload), enc.shape, enc.dtype) - x  # E

    def on_gradient(self, g, err):
        # E was kept where the codec ran (the CPU); an uncompressed gradient may come back on
        # the GPU the roles' tensor work runs on (`runtime.torch_device`)
        return minmax_error_feedback(g, err.to(g.device, g.dtype))
